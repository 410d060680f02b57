"""Module 12: what ``torch.compile`` does to a decode step, measured.

    from course_lib.compile_tools import (count_decode_kernels, fused_kernels, explain_breaks, count_compiles,
                                          launch_overhead, time_decode_steps)
    kc = count_decode_kernels(model)        # one decode step: eager aten ops vs the compiled step's kernels
    kc.fused                                # inductor's fused kernels, e.g. cpp_fused_..._mean_mul_pow_rsqrt_3
    explain_breaks(step, model, tok, cache) # torch._dynamo.explain: graphs, graph breaks and why
    count_compiles(fn, [(x1,), (x2,)])      # how many graphs dynamo compiled (recompiles on new shapes)

**Kernels of one decode step.** Eager PyTorch dispatches every operator separately: each top-level
``aten::`` call of the step is at least one kernel (a launch on a GPU, a loop over memory on a CPU).
``torch.compile`` (dynamo traces the step into one FX graph; inductor generates code for it) fuses the
pointwise and reduction ops between matmuls into a few kernels and calls the matmuls as library ("extern")
kernels. What is countable:

* on a GPU, ``torch.profiler`` sees every kernel launch (``DeviceType.CUDA`` events): count them eager and
  compiled;
* on a CPU there are no launches; the profiler sees the eager step's aten ops, but inductor's C++ kernels
  are plain function calls it does not record (unless ``torch._inductor.config.cpp.enable_kernel_profile``).
  So the compiled count is read from the generated code itself: the kernel calls in its ``call()``
  function (``cpp_fused_*`` / ``triton_*`` kernels, ``extern_kernels.*`` matmuls, aten fallbacks). The
  code is captured with ``torch._inductor.utils.run_and_get_code`` (what ``TORCH_LOGS=output_code`` prints).

**Graph breaks** (``explain_breaks``): where dynamo cannot trace (a ``.item()`` / ``int(tensor)``, a
data-dependent ``if``, a print, an unsupported call) it ends the graph, runs that bit in Python and starts a
new graph: more, smaller graphs, less fusion, a host sync. ``fullgraph=True`` turns a break into an error.
**Recompiles** (``count_compiles``): a compiled graph is guarded on shapes, dtypes, devices, some Python
values; a new shape fails the guards and compiles again (with ``dynamic=False`` every new shape; with the
default, the second shape compiles one dynamic-shape graph). A static KV cache keeps the decode step's shapes
fixed: one compile for the whole generation.

**Launch overhead** (GPU): a small model's decode step is hundreds of tiny kernels, each costing a few
microseconds of CPU-side launch; ``launch_overhead`` measures one launch, ``time_decode_steps`` a step eager,
compiled, and compiled with CUDA graphs (``mode="reduce-overhead"``: the whole step recorded once and
replayed as one launch). Needs CUDA; on a CPU only eager vs compiled is measured.
"""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

import torch

from course_lib.generation import decode_step
from course_lib.kvcache import StaticCache
from course_lib.perf.timing import benchmark
from course_lib.validate import integer

__all__ = ["KernelCount", "profile_ops", "generated_code", "kernel_calls", "fused_kernels", "count_decode_kernels",
           "explain_breaks", "count_compiles", "launch_overhead", "time_decode_steps", "rms_norm", "silu_gate"]


# --------------------------------------------------------------------------------------------------
# Small functions whose fusion the notebook shows
# --------------------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm as the model writes it: pow, mean, add, rsqrt, mul, mul: six eager kernels, one fused."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def silu_gate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU gate between the MLP's matmuls: silu(gate) * up (two eager kernels, one fused)."""
    return torch.nn.functional.silu(gate) * up


# --------------------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------------------
def profile_ops(fn, *args, **kwargs) -> tuple[collections.Counter, collections.Counter]:
    """Run fn(*args, **kwargs) once under torch.profiler. Returns (top-level aten ops: Counter of names of
    the ``aten::`` events not nested in another aten op, i.e. the operators dispatched from Python or from
    compiled code; device kernels: Counter of the CUDA kernel names, empty on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    ops, kernels = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += 1
        elif e.name.startswith("aten::"):
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            if parent is None:
                ops[e.name] += 1
    return ops, kernels


def generated_code(fn, *args, **kwargs) -> tuple[object, list[str]]:
    """(result, [source of each graph inductor generated]) of a call that compiles: the output code that
    ``TORCH_LOGS=output_code`` prints. Empty list if nothing was compiled (already compiled before)."""
    from torch._inductor.utils import run_and_get_code
    return run_and_get_code(fn, *args, **kwargs)


_KERNEL_CALL = re.compile(r"^\s*(?:buf\w*\s*=\s*)?((?:cpp_fused|triton)_\w+|extern_kernels\.\w+|"
                          r"torch\.ops\.aten\.\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?)\s*[(.]", re.M)


def _call_body(code: str) -> str:
    """The body of the generated ``call`` function (the code that runs per step), else the whole source."""
    m = re.search(r"\n(\s*)def call\(self, args\):|\ndef call\(args\):", code)
    if not m:
        return code
    rest = code[m.end():]
    end = re.search(r"\n(?:def |class |async_compile\.wait|if __name__)", rest)
    return rest[:end.start()] if end else rest


def kernel_calls(code: str) -> list[str]:
    """The kernels one run of a generated graph calls, in order: fused kernels (``cpp_fused_*`` on a CPU,
    ``triton_*`` on a GPU; ``.run`` launches counted once), ``extern_kernels.*`` library calls (matmuls) and
    aten fallbacks."""
    calls = []
    for m in _KERNEL_CALL.finditer(_call_body(code)):
        calls.append(m.group(1))
    return calls


def fused_kernels(code: str) -> list[str]:
    """Names of the kernels inductor generated (each one fuses the ops its name lists)."""
    names = re.findall(r"^(?:(cpp_fused_\w+)\s*=\s*async_compile|def (triton_\w+)\()", code, re.M)
    return sorted({a or b for a, b in names})


@dataclass
class KernelCount:
    """One decode step, eager and compiled (see the module docstring for what is counted where)."""
    eager_ops: collections.Counter                 # top-level aten ops of the eager step
    eager_kernels: collections.Counter             # CUDA kernel launches of the eager step (empty on a CPU)
    compiled_calls: list                           # kernel calls in the compiled step's generated code
    compiled_kernels: collections.Counter          # CUDA kernel launches of the compiled step (empty on a CPU)
    fused: list                                    # the generated (fused) kernels
    code: str = field(repr=False, default="")

    @property
    def eager(self) -> int:
        """Kernels of the eager step: launches on a GPU, top-level aten ops on a CPU."""
        return sum(self.eager_kernels.values()) or sum(self.eager_ops.values())

    @property
    def compiled(self) -> int:
        """Kernels of the compiled step: launches on a GPU, calls in the generated code on a CPU."""
        return sum(self.compiled_kernels.values()) or len(self.compiled_calls)

    def table(self) -> list[dict]:
        return [{"step": "eager", "kernels": self.eager, "what is counted":
                 "CUDA launches" if self.eager_kernels else "top-level aten ops (profiler)"},
                {"step": "compiled", "kernels": self.compiled, "what is counted":
                 "CUDA launches" if self.compiled_kernels else "kernel calls in inductor's code"}]


def _static_cache_after_prompt(model, prompt, max_len: int, step=None):
    cache = StaticCache.for_model(model, 1, max_len)
    ids = torch.as_tensor([prompt], dtype=torch.long, device=model.device)
    model(ids, cache=cache)
    return cache


@torch.inference_mode()
def count_decode_kernels(model, prompt=(1, 2, 3, 4), max_len: int = 256) -> KernelCount:
    """Count the kernels of one decode step of `model` (batch 1, a StaticCache of `max_len` slots), eager
    and compiled with ``course_lib.generation.decode_step(model, True)`` (the step ``generate(compile=True)``
    uses: with the same max_len, generate reuses this compile). Compiles here if the step was not compiled
    yet, and keeps the generated code on the model (``model._decode_step_code``) for later calls."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= len(prompt) + 2:
        raise ValueError(f"max_len must be an int > len(prompt) + 2, got {max_len!r}")
    tok = torch.tensor([[int(prompt[-1])]], device=model.device)
    cache = _static_cache_after_prompt(model, list(prompt), max_len)
    model(tok, cache=cache)                                   # warm-up (allocator, lazy init)
    eager_ops, eager_k = profile_ops(model, tok, cache=cache)

    step = decode_step(model, True)
    key = (max_len, model.device.type)
    codes = model.__dict__.setdefault("_decode_step_code", {})
    if key not in codes:
        _, code = generated_code(step, tok, cache=cache)
        if not code:
            raise RuntimeError("the decode step was compiled before count_decode_kernels could capture its code "
                               "(call count_decode_kernels before generate(compile=True))")
        codes[key] = code[-1]
    step(tok, cache=cache)                                   # compiled warm-up (CUDA graphs record here)
    comp_ops, comp_k = profile_ops(step, tok, cache=cache)
    code = codes[key]
    return KernelCount(eager_ops, eager_k, kernel_calls(code), comp_k, fused_kernels(code), code)


# --------------------------------------------------------------------------------------------------
# Graph breaks and recompiles
# --------------------------------------------------------------------------------------------------
def explain_breaks(fn, *args, **kwargs) -> dict:
    """``torch._dynamo.explain(fn)(*args, **kwargs)`` as a dict: graph_count, graph_break_count, op_count and
    break_reasons (one line each: the reason and where in the user's code). Runs fn (no code generation)."""
    ex = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = []
    for br in ex.break_reasons:
        where = br.user_stack[-1] if getattr(br, "user_stack", None) else None
        loc = f" ({where.filename.rsplit('/', 1)[-1]}:{where.lineno} {where.line})" if where is not None else ""
        reasons.append(f"{br.reason.splitlines()[0]}{loc}")
    return {"graph_count": ex.graph_count, "graph_break_count": ex.graph_break_count, "op_count": ex.op_count,
            "break_reasons": reasons}


def count_compiles(fn, calls, dynamic=None) -> int:
    """How many graphs dynamo compiles for ``torch.compile(fn, dynamic=dynamic)`` over the calls (a list of
    argument tuples), with a backend that only counts (no code generation). One per call on new shapes
    with dynamic=False; with the default, two (static first; the second shape marks the changing dimension
    dynamic and compiles one graph for all sizes). Dynamo remembers that per function (code object): a later
    default compile of the same function starts dynamic and compiles once."""
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(fn, backend=counting_backend, dynamic=dynamic)
    for args in calls:
        compiled(*args)
    return len(graphs)


# --------------------------------------------------------------------------------------------------
# Launch overhead and CUDA graphs
# --------------------------------------------------------------------------------------------------
def launch_overhead(device="cuda", n: int = 2000) -> float:
    """Seconds per launch of an (almost) empty kernel: `n` in-place adds on one element back to back, timed
    as one sample. The GPU finishes each add in far less than the CPU takes to launch the next, so it waits
    between them and the time is the CPU-side launch cost. Needs CUDA."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"launch_overhead measures CUDA kernel launches: device must be cuda, got {device!r}")
    x = torch.zeros(1, device=dev)
    return benchmark(x.add_, 1, warmup=50, repeats=1, inner=n, device=dev).min


@torch.inference_mode()
def time_decode_steps(model, modes=("eager", "compiled"), steps: int = 20, max_len: int = 256,
                      prompt=(1, 2, 3, 4)) -> dict:
    """Seconds per decode step (median of `steps`, batch 1, a StaticCache), per mode: "eager" (the model),
    "compiled" (``decode_step(model, True)``: inductor; on CUDA that is with CUDA graphs, "reduce-overhead"),
    "compiled-no-graphs" (CUDA only: inductor without CUDA graphs). Each step feeds the same token at an
    advancing position, as decoding does."""
    steps = integer(steps, "steps", low=1)
    if max_len < len(prompt) + steps + 8:
        raise ValueError(f"max_len must be >= len(prompt) + steps + 8 = {len(prompt) + steps + 8}, got {max_len}")
    out = {}
    for mode in modes:
        if mode == "eager":
            fn = model
        elif mode == "compiled":
            fn = decode_step(model, True)
        elif mode == "compiled-no-graphs":
            if model.device.type != "cuda":
                raise ValueError("compiled-no-graphs is a CUDA mode (on a CPU 'compiled' has no graphs)")
            steps_cache = model.__dict__.setdefault("_compiled_decode_steps", {})
            fn = steps_cache.setdefault(("inductor", None), torch.compile(model.forward, fullgraph=True,
                                                                           dynamic=False))
        else:
            raise ValueError(f"mode must be eager, compiled or compiled-no-graphs, got {mode!r}")
        cache = _static_cache_after_prompt(model, list(prompt), max_len)
        tok = torch.tensor([[int(prompt[-1])]], device=model.device)
        # each call writes the next position of the static cache: warm-up and timed steps advance it alike
        out[mode] = benchmark(fn, tok, cache=cache, warmup=3, repeats=steps, device=model.device).median
    return out
