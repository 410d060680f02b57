"""Attention forward: the course's Triton FlashAttention kernel vs PyTorch SDPA's backends (flash,
memory-efficient, cuDNN, math) vs the tiled PyTorch loop, in time, TFLOP/s and share of the device's peak.

    python bench/attention.py                  (or: course bench attention)
    python bench/attention.py --seq 1024 4096 8192 --no-causal

Default size on CUDA: B=4, H=32 heads, head dim 128, bf16 (fp16 on a GPU without hardware bf16, a T4),
causal, sequences 1024/2048/4096 (the Module 07 goal: the Triton kernel at 4096 at >= 50% of the dense
bf16 peak and within 1.3x of SDPA flash). On CPU a small fp32 case that runs in seconds; the Triton rows
are skipped there (the interpreter checks correctness in the tests, its times mean nothing) and on a GPU
Triton does not support (compute capability < 8.0), and the SDPA rows are whatever this torch has.

FLOPs = 4 B H N^2 d (two N x N x d matmuls, 2 FLOPs per multiply-add), halved when causal. ``peak_%`` =
TFLOP/s / the dense peak of this dtype in ``course_lib.perf.hardware`` (GPUs it lists; none on a CPU).
``vs_flash`` = SDPA flash time / row time (> 1: faster than SDPA flash). ``max_err`` = max |row -
reference| with the reference in fp32 (computed once per length, up to 2048; beyond, against SDPA math).

Writes bench/results/attention-<cpu|cuda>.json with the device named.
"""
import argparse

import torch
from _common import default_dtype, print_table, save, triton_skip_reason

from course_lib.attention import reference_attention, tiled_attention
from course_lib.attention.backends import BACKEND_NAMES, run_backend
from course_lib.perf.hardware import get_gpu
from course_lib.perf.timing import benchmark

COLS = ["seq", "impl", "time_ms", "TFLOP/s", "peak_%", "vs_flash", "max_err"]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def device_peak(dtype_name: str):
    """(FLOP/s, label) of this GPU's dense peak for the dtype, from the hardware table; (None, why) else."""
    if not torch.cuda.is_available():
        return None, "CPU: no peak in the hardware table"
    try:
        spec = get_gpu(torch.cuda.get_device_name())
        return (spec.peak_flops(dtype_name),
                f"{spec.name} datasheet, {spec.peak_tflops[dtype_name]:.0f} TFLOP/s {dtype_name}")
    except (ValueError, KeyError) as e:
        return None, f"{torch.cuda.get_device_name()}: {e}"


def main(argv=None):
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4 if cuda else 1)
    ap.add_argument("--heads", type=int, default=32 if cuda else 4)
    ap.add_argument("--head-dim", type=int, default=128 if cuda else 64)
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096] if cuda else [128, 256])
    ap.add_argument("--dtype", choices=list(DTYPES), default=default_dtype())
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--tiled-max", type=int, default=2048 if cuda else 256,
                    help="time the tiled PyTorch loop up to this length (it is slow)")
    ap.add_argument("--repeats", type=int, default=30 if cuda else 3)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if cuda else "cpu")
    dtype, causal = DTYPES[args.dtype], not args.no_causal
    B, H, Dh = args.batch, args.heads, args.head_dim
    peak, peak_source = device_peak(args.dtype)
    why_not = triton_skip_reason("tests/test_flash_attention.py")
    triton_ok = why_not is None
    skipped = {} if triton_ok else {"triton": why_not}
    if triton_ok:
        from course_lib.attention.triton_flash import flash_attention_triton

    rows = []
    for N in args.seq:
        g = torch.Generator(device=dev).manual_seed(N)
        q, k, v = (torch.randn(B, H, N, Dh, generator=g, device=dev).to(dtype) for _ in range(3))
        flops = 4 * B * H * N * N * Dh / (2 if causal else 1)
        if N <= 2048:
            ref = reference_attention(q, k, v, causal=causal).float()
        else:
            ref = run_backend("math", q.float(), k.float(), v.float(), causal).float()
        runs = []
        if triton_ok:
            runs.append(("triton (course)", lambda: flash_attention_triton(q, k, v, causal=causal)))
        for name in BACKEND_NAMES:
            try:
                run_backend(name, q, k, v, causal)
            except RuntimeError as e:
                skipped[f"sdpa {name}"] = ("a CUDA-only kernel" if not cuda and name in ("efficient", "cudnn")
                                           else str(e).strip().splitlines()[0][:160])
                continue
            runs.append((f"sdpa {name}", lambda name=name: run_backend(name, q, k, v, causal)))
        if N <= args.tiled_max:
            runs.append(("tiled (PyTorch loop)", lambda: tiled_attention(q, k, v, causal=causal, block_q=128,
                                                                         block_k=128)))
        found = []
        for name, fn in runs:
            out = fn()                                                     # warm up, autotune
            err = (out.float() - ref).abs().max().item()
            t = benchmark(fn, warmup=2, repeats=args.repeats, device=dev).median
            tf = flops / t / 1e12
            found.append({"seq": N, "impl": name, "time_ms": round(t * 1e3, 3), "TFLOP/s": float(f"{tf:.3g}"),
                          "peak_%": None if peak is None else round(100 * flops / t / peak, 1),
                          "vs_flash": None, "max_err": f"{err:.1e}"})
        flash = next((r for r in found if r["impl"] == "sdpa flash"), None)
        for r in found:
            r["vs_flash"] = None if flash is None else round(flash["time_ms"] / r["time_ms"], 2)
        rows += found
    print(f"B={B} H={H} Dh={Dh} {args.dtype} {'causal' if causal else 'non-causal'}; peak: {peak_source}")
    print_table(rows, COLS)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print("saved", save("attention", rows, batch=B, heads=H, head_dim=Dh, seq=args.seq, dtype=args.dtype,
                        causal=causal, peak_tflops=None if peak is None else peak / 1e12, peak_source=peak_source,
                        skipped=skipped, repeats=args.repeats, threads=torch.get_num_threads()))


if __name__ == "__main__":
    main()
