"""Paged decode attention: the Triton kernel (split-KV and not) vs the torch backend vs the reference loop
vs SDPA on contiguous K/V, in time, GB/s and share of the device's memory bandwidth.

    python bench/paged_attention.py            (or: course bench paged_attention)
    python bench/paged_attention.py --batch 8 --tokens 8192 --splits 1 auto 8 16

One decode step: q [B, H, Dh], K/V of B sequences of --tokens tokens each in shuffled blocks of
--block-size (``contiguous_to_paged``). Default size on CUDA: B=32, H=32 query heads, K=8 KV heads,
Dh=128, 2048 tokens, bf16 (fp16 on a GPU without hardware bf16, a T4), block 16; on CPU a small fp32
case that runs in seconds.

* ``triton``: ``paged_attention_triton`` with --splits (1 = no split; ``auto`` = its heuristic), on a GPU
  Triton supports (compute capability >= 8.0). Elsewhere the Triton rows are skipped, the reason recorded
  (on CPU the interpreter checks correctness, its times mean nothing).
* ``torch``: ``paged_attention(backend="torch")``, the vectorized gather + one batched SDPA.
* ``reference``: ``paged_attention_reference``, one sequence at a time (a host sync per row).
* ``sdpa-contiguous``: ``F.scaled_dot_product_attention`` on contiguous K/V [B, K, L, Dh] with
  ``enable_gqa=True`` (K/V not repeated; where the installed torch lacks it, K/V repeated per query
  head, and the row says so). No paging, no mask: the bar to reach.

GB/s = useful bytes / time, useful bytes = the K and V of every token (read once) + q + out (the block
tables, 4 bytes per block, are left out). The same bytes for every row, so GB/s compares rows; the
torch and reference rows really move more (they copy the gathered K/V). ``bandwidth_%`` = GB/s / the
device's memory bandwidth (``_common.memory_bandwidth``: the HBM datasheet figure of a GPU in
``course_lib.perf.hardware``, else a measured copy). ``max_err`` =
max |row - reference| (fp32 math in the reference).

Writes bench/results/paged_attention-<cpu|cuda>.json with the device named.
"""
import argparse
import math

import torch
import torch.nn.functional as F
from _common import default_dtype, memory_bandwidth, print_table, save, triton_skip_reason

from course_lib.paged import contiguous_to_paged, paged_attention, paged_attention_reference
from course_lib.perf.timing import benchmark

COLS = ["backend", "num_splits", "time_us", "GB/s", "bandwidth_%", "vs_sdpa", "max_err"]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def sdpa_contiguous(q, k, v, scale):
    """Decode SDPA on contiguous K/V [B, K, L, Dh] for q [B, H, Dh] -> [B, H, Dh]."""
    try:
        return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)[:, :, 0], "enable_gqa"
    except TypeError:                     # torch < 2.5
        G = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q[:, :, None], k.repeat_interleave(G, 1), v.repeat_interleave(G, 1),
                                              scale=scale)[:, :, 0], "repeat_interleave"


def main(argv=None):
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32 if cuda else 4)
    ap.add_argument("--heads", type=int, default=32 if cuda else 8)
    ap.add_argument("--kv-heads", type=int, default=8 if cuda else 2)
    ap.add_argument("--head-dim", type=int, default=128 if cuda else 64)
    ap.add_argument("--tokens", type=int, default=2048 if cuda else 512, help="context length of every sequence")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", choices=list(DTYPES), default=default_dtype())
    ap.add_argument("--splits", nargs="+", default=["1", "auto", "4"], help="triton rows: num_splits values")
    ap.add_argument("--repeats", type=int, default=50 if cuda else 5)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = DTYPES[args.dtype]
    B, H, K, Dh, L, bs = args.batch, args.heads, args.kv_heads, args.head_dim, args.tokens, args.block_size

    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, H, Dh, generator=g, device=dev).to(dtype)
    k = torch.randn(B, K, L, Dh, generator=g, device=dev).to(dtype)
    v = torch.randn(B, K, L, Dh, generator=g, device=dev).to(dtype)
    kp, vp, tables, lens = contiguous_to_paged(k, v, [L] * B, bs, generator=torch.Generator().manual_seed(0))
    scale = 1.0 / math.sqrt(Dh)
    esize = q.element_size()
    nbytes = 2 * B * K * L * Dh * esize + 2 * B * H * Dh * esize          # K + V + q + out
    bw, bw_source = memory_bandwidth()          # datasheet HBM for a known GPU, else a measured copy
    ref = paged_attention_reference(q, kp, vp, tables, lens, scale).float()

    runs, skipped = [], {}                    # (backend, num_splits, fn)
    why_not = triton_skip_reason("tests/test_paged_attention.py")
    if why_not is None:
        from course_lib.paged.triton_paged import _sm_count, choose_num_splits, paged_attention_triton
        auto = choose_num_splits(B, K, tables.shape[1] * bs, _sm_count(dev))
        splits = []
        for s in args.splits:
            s = auto if s == "auto" else int(s)
            if s not in splits:
                splits.append(s)
        for s in splits:
            label = f"{s}" + (" (auto)" if s == auto else "")
            runs.append(("triton", label, lambda s=s: paged_attention_triton(q, kp, vp, tables, lens, scale,
                                                                           num_splits=s)))
    else:
        skipped["triton"] = why_not
    runs.append(("torch", "-", lambda: paged_attention(q, kp, vp, tables, lens, scale, backend="torch")))
    runs.append(("reference", "-", lambda: paged_attention_reference(q, kp, vp, tables, lens, scale)))
    sdpa_mode = sdpa_contiguous(q, k, v, scale)[1]
    runs.append((f"sdpa-contiguous ({sdpa_mode})", "-", lambda: sdpa_contiguous(q, k, v, scale)[0]))

    rows = []
    for name, splits, fn in runs:
        out = fn()                                                       # compile / autotune / warm up
        err = (out.float() - ref).abs().max().item()
        t = benchmark(fn, warmup=3, repeats=args.repeats, device=dev).median
        gbs = nbytes / t / 1e9
        rows.append({"backend": name, "num_splits": splits, "time_us": round(t * 1e6, 1), "GB/s": round(gbs, 1),
                     "bandwidth_%": round(100 * gbs * 1e9 / bw, 1), "vs_sdpa": None,
                     "max_err": f"{err:.1e}"})
    sdpa_t = rows[-1]["time_us"]
    for r in rows:
        r["vs_sdpa"] = round(sdpa_t / r["time_us"], 2)                  # > 1: faster than SDPA
    print(f"B={B} H={H} K={K} Dh={Dh} tokens={L} block={bs} {args.dtype}; {nbytes / 1e6:.1f} MB per call; "
          + f"memory bandwidth: {bw_source}")
    print_table(rows, COLS)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print("saved", save("paged_attention", rows, batch=B, heads=H, kv_heads=K, head_dim=Dh, tokens=L,
                        block_size=bs, dtype=args.dtype, bytes_per_call=nbytes, sdpa=sdpa_mode,
                        bandwidth_gbs=bw / 1e9, bandwidth_source=bw_source,
                        skipped=skipped, repeats=args.repeats, threads=torch.get_num_threads()))


if __name__ == "__main__":
    main()
