"""Batch-1 decode: the course model's eager and compiled paths against transformers, on the roofline.

    python bench/decode.py [--quick] [--no-compile]       (or: course bench decode)

On a GPU: SmolLM2-1.7B's shape with random bf16 weights (fp16 on a GPU without hardware bf16, a T4), a
128-token prompt, 256 new tokens. On a CPU (or --quick): a small random model in float32, so it finishes
in seconds (compiled rows: about a minute more each on a CPU, the C++ compile; --no-compile skips them).

ms/token is decode only: (time of N new tokens - time of 1) / (N - 1), the median of a few runs, for
every row alike. The roofline is the bytes one decode step must read (the weights once, plus the KV
cache at the mean context) over the memory bandwidth. Writes bench/results/decode-<cpu|cuda>.json.
"""
import argparse
import time

import torch
from _common import memory_bandwidth, print_table, save

from course_lib.env import half_dtype
from course_lib.env import quick as quick_mode
from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache, StaticCache
from course_lib.models import LlamaConfig, LlamaForCausalLM

SMOLLM2_1_7B = dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192,
                    rope_theta=130000.0, tie_word_embeddings=True)
SMALL = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def decode_ms(run, dev, n_new: int, repeats: int) -> float:
    """Median over `repeats` of (run(n_new) - run(1)) / (n_new - 1), in ms: decode without the prefill."""
    def timed(n):
        sync(dev)
        t0 = time.perf_counter()
        run(n)
        sync(dev)
        return time.perf_counter() - t0
    run(n_new)                                               # warm-up (and compile)
    run(1)
    per = sorted((timed(n_new) - timed(1)) / (n_new - 1) for _ in range(repeats))
    return 1e3 * per[len(per) // 2]


def step_bytes(cfg: LlamaConfig, dtype, context: float) -> float:
    """Bytes one decode step reads: every weight once (the embedding table only through a tied
    lm_head) plus K and V of `context` tokens in every layer."""
    size = torch.finfo(dtype).bits // 8
    weights = cfg.num_parameters() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * context
    return (weights + kv) * size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small CPU-sized run (default on a CPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled rows")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers rows")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quick = args.quick or dev.type == "cpu" or quick_mode()
    # on a GPU its hardware 16-bit type (bf16, or fp16 on a T4: course_lib.env.half_dtype)
    shape, dtype = (SMALL, torch.float32) if quick else (SMOLLM2_1_7B, half_dtype(dev))
    prompt_len, n_new, repeats = (32, 32, 3) if quick else (128, 256, 3)
    cfg = LlamaConfig(**shape)
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype).eval()      # random weights: speed does not need trained ones
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), device="cpu")
    bw, bw_source = memory_bandwidth()
    roofline_ms = 1e3 * step_bytes(cfg, dtype, prompt_len + n_new / 2) / bw
    compile_note = "" if not args.no_compile else " (compiled rows skipped: --no-compile)"

    # One static cache, reset between calls (as transformers keeps its own): CUDA graphs read its
    # buffers at fixed addresses, and a new cache per call would be recorded again.
    static = StaticCache.for_model(model, 1, prompt_len + n_new)

    def course_static(n, compile=False):
        static.reset()
        return generate(model, prompt, n, cache=static, compile=compile)
    runs = {
        "course eager, ContiguousCache": lambda n: generate(model, prompt, n, cache=ContiguousCache()),
        "course eager, StaticCache": course_static,
    }
    if not args.no_compile:
        runs["course StaticCache + compile"] = lambda n: course_static(n, compile=True)
    if not args.no_hf:
        import transformers
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.to_hf())).to(dev, dtype).eval()
        hf.load_state_dict(model.state_dict(), strict=False)
        hf.generation_config.pad_token_id = 0
        hf_ids = prompt.to(dev)[None]

        def hf_run(n, **kw):
            with torch.inference_mode():
                hf.generate(hf_ids, attention_mask=torch.ones_like(hf_ids), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, **kw)
        runs[f"transformers {transformers.__version__} eager, dynamic cache"] = \
            lambda n: hf_run(n, disable_compile=True)
        if not args.no_compile:
            # transformers compiles its forward itself with a static cache on a GPU (reduce-overhead);
            # compile_config makes it do so on a CPU too.
            cc = transformers.CompileConfig(fullgraph=True, dynamic=False)
            cc._compile_all_devices = True
            runs["transformers static cache + compile"] = \
                lambda n: hf_run(n, cache_implementation="static", compile_config=cc)

    rows = []
    for name, run in runs.items():
        ms = decode_ms(run, dev, n_new, repeats)
        rows.append({"implementation": name, "ms/token": round(ms, 3),
                     "share of roofline": f"{roofline_ms / ms:.1%}"})
        print(f"{name}: {ms:.3f} ms/token", flush=True)
    base = rows[0]["ms/token"]
    for r in rows:
        r["speed-up vs course eager"] = round(base / r["ms/token"], 2)
    print(f"\nbatch-1 decode, {'small random model' if quick else 'SmolLM2-1.7B shape, random weights'}, "
          f"{str(dtype).removeprefix('torch.')}, prompt {prompt_len}, {n_new} new tokens{compile_note}")
    print(f"roofline {roofline_ms:.3f} ms/token = {step_bytes(cfg, dtype, prompt_len + n_new / 2) / 1e6:,.1f} MB "
          f"per step / {bw_source}")
    print_table(rows, list(rows[0]))
    print("saved", save("decode", rows, shape="small" if quick else "SmolLM2-1.7B", dtype=str(dtype),
                        prompt_tokens=prompt_len, new_tokens=n_new, roofline_ms=roofline_ms,
                        bandwidth=bw_source, params=cfg.num_parameters()))


if __name__ == "__main__":
    main()
