"""Memory footprint: bytes of parameters by dtype, the weight bytes of a real model, peak memory of a call,
and the bytes autograd keeps alive for a backward pass that inference never runs.

    parameter_bytes(7e9, "fp16")        -> 14e9      arithmetic: parameters x bits / 8
    model_weight_bytes(model)           -> bytes of the model's parameters as stored (tied weights once)
    peak_memory(fn)                     -> (result, MemoryMeasurement): CUDA peak on a GPU, process RSS on a CPU
    autograd_saved_bytes(fn)            -> bytes of activations autograd saved while fn ran
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import torch

from course_lib.env import device as best_device
from course_lib.env import sync
from course_lib.validate import number

__all__ = ["BITS_PER_PARAM", "bits_per_param", "parameter_bytes", "model_weight_bytes",
           "MemoryMeasurement", "peak_memory", "process_rss", "process_peak_rss", "autograd_saved_bytes",
           "format_bytes"]

# Storage bits per parameter. int4 packs two parameters per byte; real formats add scales
# (e.g. one fp16 scale per group of 32-128 weights: +0.125-0.5 bit), which Module 02 counts.
BITS_PER_PARAM = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
_TORCH_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                torch.int8: "int8", torch.uint8: "int8"}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _TORCH_NAMES[getattr(torch, _name)] = "fp8"
_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
            "float8": "fp8", "uint8": "int8"}


def bits_per_param(dtype) -> int:
    """Storage bits of one parameter for 'fp32', 'fp16', 'bf16', 'fp8', 'int8', 'int4' or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_NAMES:
            raise ValueError(f"dtype {dtype} is not one of the course's weight formats {list(BITS_PER_PARAM)}")
        return BITS_PER_PARAM[_TORCH_NAMES[dtype]]
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string like 'fp16' or a torch.dtype, got {type(dtype).__name__}")
    key = dtype.lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in BITS_PER_PARAM:
        raise ValueError(f"dtype must be one of {list(BITS_PER_PARAM)} (or a torch dtype), got {dtype!r}")
    return BITS_PER_PARAM[key]


def parameter_bytes(num_params: float, dtype="fp16") -> int:
    """Bytes to store `num_params` parameters in `dtype`: ceil(num_params * bits / 8).
    Weights only: no quantization scales, no KV cache, no activations, no framework overhead."""
    num_params = number(num_params, "num_params", 0)
    return math.ceil(num_params * bits_per_param(dtype) / 8)


def model_weight_bytes(model: torch.nn.Module, include_buffers: bool = False) -> int:
    """Bytes of a module's parameters as they are stored now (their real dtypes); a parameter shared by
    two modules (tied embeddings) counts once. With include_buffers, registered buffers count too."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    seen, total = set(), 0
    tensors = list(model.parameters())
    if include_buffers:
        tensors += list(model.buffers())
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'; binary units, as memory is reported by drivers and allocators."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


# --------------------------------------------------------------------------------------------------
# Peak memory of a call
# --------------------------------------------------------------------------------------------------
def process_rss() -> int | None:
    """Resident set size of this process in bytes, or None where it cannot be read."""
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except Exception:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


def process_peak_rss() -> int | None:
    """The process's high-water mark of resident memory in bytes (getrusage ru_maxrss), or None."""
    try:
        import resource
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r) if sys.platform == "darwin" else int(r) * 1024  # macOS: bytes, Linux: KiB
    except Exception:
        return None


@dataclass
class MemoryMeasurement:
    """Extra memory a call needed, above what was in use when it started.

    method:
      'cuda_max_allocated'  exact peak of PyTorch's CUDA allocator during the call;
      'rss_peak'            the process's resident-memory high-water mark rose during the call: the peak
                            is that mark minus the RSS before (approximate: whole pages, allocator caching);
      'rss_delta'           the high-water mark did not move (the process had used more memory earlier),
                            so only RSS after minus RSS before is known: a lower bound of the peak;
      'unavailable'         nothing can be read here (peak_bytes is None).
    """
    peak_bytes: int | None
    method: str
    note: str = ""

    def __repr__(self):
        extra = f", {self.note}" if self.note else ""
        return f"MemoryMeasurement(peak={format_bytes(self.peak_bytes)}, method={self.method}{extra})"


def peak_memory(fn, *args, device=None, **kwargs):
    """Run ``fn(*args, **kwargs)`` and measure the extra memory it needed at its peak.

    Returns (result, MemoryMeasurement). On CUDA: ``torch.cuda.max_memory_allocated`` minus the
    allocated bytes before the call (exact for PyTorch tensors). On a CPU there is no allocator
    statistic; the process's resident memory (RSS) is read before and after, with its high-water mark
    (``getrusage``): if the mark rose during the call, the peak is known (approximately); otherwise only
    the RSS growth, a lower bound, is (see ``MemoryMeasurement.method``). Nothing runs beside fn, so
    its timing is not disturbed. Where RSS cannot be read, peak_bytes is None.
    """
    dev = torch.device(device) if device is not None else best_device()
    if dev.type == "cuda":
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        out = fn(*args, **kwargs)
        sync(dev)
        peak = torch.cuda.max_memory_allocated(dev) - before
        return out, MemoryMeasurement(int(peak), "cuda_max_allocated")
    where = "" if dev.type == "cpu" else f"no allocator statistics on {dev.type}; "
    before, mark_before = process_rss(), process_peak_rss()
    out = fn(*args, **kwargs)
    sync(dev)
    after, mark_after = process_rss(), process_peak_rss()
    if before is None or after is None:
        return out, MemoryMeasurement(None, "unavailable", where + "the process RSS cannot be read here")
    if mark_before is not None and mark_after is not None and mark_after > mark_before:
        return out, MemoryMeasurement(int(mark_after - before), "rss_peak",
                                      where + "approximate: process RSS high-water mark")
    return out, MemoryMeasurement(max(int(after - before), 0), "rss_delta",
                                  where + "lower bound: RSS growth (the process peaked higher earlier)")


def autograd_saved_bytes(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` and count the bytes of tensors autograd saved for a backward pass.

    Returns (result, bytes). Parameters and their views (leaf tensors that require grad: they exist
    anyway) are not counted, and a storage saved twice counts once, so the number is the activation
    memory that recording the graph keeps alive for as long as the output lives. Under
    ``torch.no_grad()`` or ``torch.inference_mode()`` nothing is saved and it is 0.
    """
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if not (base.is_leaf and base.requires_grad):
            try:
                st = t.untyped_storage()
                key, nbytes = st.data_ptr(), st.nbytes()
            except Exception:  # a tensor without a plain storage: count its elements
                key, nbytes = id(t), t.numel() * t.element_size()
            storages[key] = max(storages.get(key, 0), nbytes)
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = fn(*args, **kwargs)
    return out, int(sum(storages.values()))
