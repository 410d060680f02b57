"""Continuous batching (course_lib.serving.Engine) vs static batching vs HF batched generate.

    python bench/serving.py                 (or: course bench serving)
    python bench/serving.py --requests 96 --rate 6 --repeats 3 --no-hf

One workload of requests whose prompt lengths (8-192 tokens) and output lengths (lognormal, 4-128
tokens) vary a lot, served greedily by every system on the same machine in the same run, alternating:
offline (everything arrives at t=0) and a replay of Poisson arrivals at --rate requests/s (the engine
only sees requests that have arrived; a static group starts with the requests that have arrived by
then). Throughput = generated tokens / wall seconds; latency = arrival to last token of a request (for
static batching, when its own last token came out: the kindest reading). ``speedup`` is relative to
the best static batching row.

Every system runs on the model's device (``course_lib.env.device()``: CUDA where there is one; the engine
then decodes with the Triton paged-attention kernel, transformers' model is moved to the same GPU).
Writes bench/results/serving-<cpu|cuda>.json with the device named.
"""
import argparse
import time

import torch
from _common import print_table, save

from course_lib.models import load
from course_lib.serving import compare_with_static, synthetic_workload

COLS = ["mode", "system", "requests", "tokens", "wall_s", "tokens_per_s", "speedup", "p50_latency_s",
        "p90_latency_s", "p50_ttft_s", "preemptions"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=16.0, help="replay arrivals per second (above both capacities)")
    ap.add_argument("--max-batch", type=int, default=32, help="engine: most running requests")
    ap.add_argument("--num-blocks", type=int, default=None, help="engine: KV blocks of 16 (default: enough)")
    ap.add_argument("--max-prefill-tokens", type=int, default=512, help="engine: prompt tokens per step")
    ap.add_argument("--static-batch", type=int, nargs="+", default=[8])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load("tiny")                     # the best device here (CUDA where there is one)
    model.eval()
    print(f"device: {model.device}")
    kw = {"max_batch": args.max_batch, "max_prefill_tokens": args.max_prefill_tokens}
    if args.num_blocks:
        kw["num_blocks"] = args.num_blocks
    rows, t = [], time.perf_counter()
    for replay in (False, True):
        wl = synthetic_workload(args.requests, seed=0, rate=args.rate if replay else None)
        rows += compare_with_static(model, wl, batch_size=tuple(args.static_batch), replay=replay,
                                    hf=not args.no_hf and not replay, repeats=args.repeats, **kw)
    print_table(rows, COLS)
    print(f"({time.perf_counter() - t:.0f} s)")
    print("saved", save("serving", rows, requests=args.requests, rate=args.rate, repeats=args.repeats,
                        engine=kw, threads=torch.get_num_threads(), model_device=str(model.device)))


if __name__ == "__main__":
    main()
