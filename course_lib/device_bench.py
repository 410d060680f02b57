"""Measure this machine: achieved copy bandwidth and matmul throughput (CPU or GPU), and the time of
one decode step of a model (over a ``kvcache.FixedPrefixCache``, hence this module's layer, above the caches).

    from course_lib.device_bench import measure_device
    local = measure_device()          # a DeviceSpec with measured=True; a few seconds on a CPU
    local.bandwidth_gbs, local.peak_tflops

The numbers are *achieved*, not datasheet peaks: a copy reaches 70-90% of a GPU's HBM bandwidth, a
big fp16 matmul 60-80% of its tensor-core peak; a CPU's single-threaded copy reaches a fraction of
its DRAM bandwidth. Each is the median over repeated runs after warm-up (course_lib.perf.timing).
"""
from __future__ import annotations

import os
import platform

import torch

from course_lib.env import device as best_device
from course_lib.env import quick as quick_mode
from course_lib.env import real_bf16
from course_lib.kvcache import FixedPrefixCache
from course_lib.perf.hardware import DeviceSpec
from course_lib.perf.timing import benchmark
from course_lib.validate import integer, number, one_of

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def measure_copy_bandwidth(device=None, nbytes: int = 64 * 2**20, repeats: int = 5, warmup: int = 2) -> float:
    """Achieved bandwidth in GB/s of dst.copy_(src) on `nbytes`: each copy reads and writes nbytes,
    so 2 * nbytes bytes move per copy. Use a buffer well above the caches (64 MB+)."""
    dev = torch.device(device) if device is not None else best_device()
    n = max(1, int(number(nbytes, "nbytes", 0, low_open=True)) // 4)
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    t = benchmark(dst.copy_, src, warmup=warmup, repeats=repeats, device=dev)
    return 2 * n * 4 / t.median / 1e9


def measure_matmul_tflops(device=None, n: int = 512, dtype="fp32", repeats: int = 5, warmup: int = 2) -> float:
    """Achieved TFLOP/s of an n x n x n matmul (2 n^3 FLOPs) in `dtype` ('fp32', 'fp16', 'bf16')."""
    dev = torch.device(device) if device is not None else best_device()
    one_of(dtype, "dtype", _TORCH_DTYPES)
    n = integer(n, "n", low=1)
    a = torch.randn(n, n, device=dev).to(_TORCH_DTYPES[dtype])
    b = torch.randn(n, n, device=dev).to(_TORCH_DTYPES[dtype])
    out = torch.empty(n, n, device=dev, dtype=a.dtype)
    t = benchmark(torch.matmul, a, b, out=out, warmup=warmup, repeats=repeats, device=dev)
    return 2 * n**3 / t.median / 1e12


def _cpu_name() -> str:
    name = platform.processor() or platform.machine() or "cpu"
    try:  # Linux: the model name is nicer than 'x86_64'
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return name


def measure_device(device=None, quick: bool | None = None, repeats: int | None = None) -> DeviceSpec:
    """A DeviceSpec for this machine from measurements (measured=True).

    CPU: fp32 copy and matmul (quick: 64 MB buffer, 512^3 matmul; about a second).
    GPU: 1 GB copy, 4096^3 fp32 and fp16 matmuls (and bf16 where the hardware has it).
    quick defaults to course_lib.env.quick() on a CPU.
    """
    dev = torch.device(device) if device is not None else best_device()
    if quick is None:
        quick = quick_mode()
    if dev.type == "cuda":
        nbytes, n, reps = 2**30, 4096, repeats or 10
        dtypes = ["fp32", "fp16"] + (["bf16"] if real_bf16() else [])
        props = torch.cuda.get_device_properties(dev)
        name = torch.cuda.get_device_name(dev)
        extra = dict(memory_gb=round(props.total_memory / 1e9, 1), sms=props.multi_processor_count,
                     compute_capability=f"{props.major}.{props.minor}", architecture="measured GPU")
        smem = getattr(props, "shared_memory_per_multiprocessor", None)
        if smem:
            extra["smem_per_sm_kb"] = int(smem) // 1024
    else:
        nbytes, n, reps = (64 * 2**20, 512, repeats or 5) if quick else (256 * 2**20, 1024, repeats or 10)
        dtypes = ["fp32"]
        name = f"{_cpu_name()}, {torch.get_num_threads()} thread(s)"
        extra = dict(architecture=dev.type)
        try:
            extra["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
        except (ValueError, OSError, AttributeError):
            pass
    bw = measure_copy_bandwidth(dev, nbytes, repeats=reps)
    peaks = {dt: measure_matmul_tflops(dev, n, dt, repeats=reps) for dt in dtypes}
    src = (f"measured with torch {torch.__version__}: copy of {nbytes / 2**20:.0f} MiB, "
           f"{n}x{n}x{n} matmul ({', '.join(dtypes)}), median of {reps} runs")
    return DeviceSpec(name=f"this machine ({name})", bandwidth_gbs=bw, peak_tflops=peaks, source=src,
                      measured=True, **extra)


# --- one decode step ------------------------------------------------------------------------------
def decode_step_call(model, context: int = 64, batch: int = 1, seed: int = 0):
    """A callable (no arguments) that runs one decode step: a one-token forward per sequence with a KV cache
    of `context` tokens (model(new_ids, cache=...)), the same step at every call. For ``benchmark`` or an
    interleaved ``compare`` of several steps."""
    context, batch = integer(context, "context", low=1), integer(batch, "batch", low=1)
    cfg = model.config
    if context + 1 > cfg.max_position_embeddings:
        raise ValueError(f"context={context}: the model's context is {cfg.max_position_embeddings} tokens")
    dev = model.device
    g = torch.Generator(device=dev).manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (batch, context), generator=g, device=dev)
    new = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g, device=dev)
    cache = FixedPrefixCache.from_prompt(model, prompt)

    @torch.no_grad()
    def step():
        return model(new, cache=cache)
    return step


def forward_call(model, seq_len: int, batch: int = 1, seed: int = 0):
    """A callable (no arguments) that runs a full forward over [batch, seq_len] random tokens without a
    cache (a prefill), the same tokens at every call."""
    cfg = model.config
    seq_len = integer(seq_len, "seq_len", 1, cfg.max_position_embeddings)
    batch = integer(batch, "batch", low=1)
    g = torch.Generator(device=model.device).manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=g, device=model.device)

    @torch.no_grad()
    def forward():
        return model(ids)
    return forward


def time_decode_step(model, context: int = 64, batch: int = 1, warmup: int = 3, repeats: int = 10,
                     seed: int = 0):
    """Time one decode step (``decode_step_call``). Returns course_lib.perf.timing.Timing (use .median)."""
    return benchmark(decode_step_call(model, context, batch, seed), warmup=warmup, repeats=repeats,
                     device=model.device)


def time_forward(model, seq_len: int, batch: int = 1, warmup: int = 2, repeats: int = 5, seed: int = 0):
    """Time a full forward over [batch, seq_len] tokens without a cache (``forward_call``). Returns Timing."""
    return benchmark(forward_call(model, seq_len, batch, seed), warmup=warmup, repeats=repeats, device=model.device)


def count_ops(fn, *args, **kwargs) -> int | None:
    """How many ATen operations (roughly: kernel launches) fn(*args) dispatches; None if this torch
    cannot tell. On a CPU each costs a few microseconds of Python and dispatcher time, whatever its size."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:  # pragma: no cover
        return None

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _Count.n += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Count():
        fn(*args, **kwargs)
    return _Count.n


def op_overhead(device=None, ops: int = 200, repeats: int = 5) -> float:
    """Seconds per tiny op (a 16-element add): the fixed cost every op pays, whatever it computes."""
    dev = torch.device(device) if device is not None else best_device()
    x = torch.ones(16, device=dev)
    out = torch.empty_like(x)
    # `ops` back-to-back adds per sample, one sync at its end: the per-op cost, not a sync's
    return benchmark(torch.add, x, x, out=out, warmup=1, repeats=repeats, inner=ops, device=dev).median


__all__ = ["measure_copy_bandwidth", "measure_matmul_tflops", "measure_device", "decode_step_call", "forward_call",
           "time_decode_step", "time_forward", "count_ops", "op_overhead"]
