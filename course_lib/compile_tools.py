"""Module 12: what ``torch.compile`` does to a decode step, measured.

    from course_lib.compile_tools import (count_decode_kernels, fused_kernels, explain_breaks, count_compiles,
                                          launch_overhead, time_decode_steps)
    kc = count_decode_kernels(model)        # one decode step: eager aten ops vs the compiled step's kernels
    kc.fused                                # inductor's fused kernels, e.g. cpp_fused_..._mean_mul_pow_rsqrt_3
    explain_breaks(step, model, tok, cache) # torch._dynamo.explain: graphs, graph breaks and why
    count_compiles(fn, [(x1,), (x2,)])      # how many graphs dynamo compiled (recompiles on new shapes)
    g = export_step(step, model, batch, max_len)   # a static-cache step as one graph, plain data
    run_exported(g, model, tok, pos, k, v)  # that graph run op by op (aten ops only), here
    trace_events(prof)                      # a torch.profiler trace as plain data; read_trace reads it

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
import math
import operator
import re
from dataclasses import dataclass, field

import torch

from course_lib.attention import attention
from course_lib.attention.rope import apply_rope, rope_cos_sin
from course_lib.generation import decode_step
from course_lib.kvcache import StaticCache
from course_lib.perf.timing import benchmark
from course_lib.validate import integer

__all__ = ["KernelCount", "profile_ops", "generated_code", "kernel_calls", "fused_kernels", "count_decode_kernels",
           "explain_breaks", "count_compiles", "launch_overhead", "time_decode_steps", "rms_norm", "silu_gate",
           "static_caches", "static_decode_step",
           "export_step", "run_exported", "graph_report", "trace_events", "read_trace"]


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


# --------------------------------------------------------------------------------------------------
# A decode step over a static cache, as one graph (Lab 12 Part A's reference and the judge's tools)
# --------------------------------------------------------------------------------------------------
def static_caches(model, batch: int, max_len: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches for ``static_decode_step``: [layers, batch, kv_heads, max_len, head_dim] each, in the
    model's dtype and on its device, every slot `fill` (what an unwritten slot holds must not matter)."""
    batch, max_len = integer(batch, "batch", low=1), integer(max_len, "max_len", low=1)
    c = model.config
    shape = (c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim)
    k = torch.full(shape, float(fill), dtype=model.dtype, device=model.device)
    return k, k.clone()


def static_decode_step(model, tok: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       masked: bool = True):
    """One decode step of a course model over functional static caches, with nothing that depends on the
    position's value on the host: every shape is fixed by (batch, max_len), the position is a 0-d tensor,
    the new K/V go into slot `pos` with ``torch.where`` and attention masks the slots after `pos`. So
    ``torch.compile`` traces it once for every position (and CUDA graphs can replay it).

    tok [B, 1] int64, pos 0-d int64 (tok's position), k_cache/v_cache [L, B, KV, S, Dh].
    Returns (logits [B, V] of the next token, k_cache', v_cache'): the caches with slot `pos` of every layer
    holding tok's K (after RoPE) and V, every other slot as given. ``masked=False`` is the known wrong
    answer that attends over every slot, written or not."""
    c = model.config
    L, KV, Dh = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    if not isinstance(tok, torch.Tensor) or tok.dim() != 2 or tok.shape[1] != 1:
        raise ValueError(f"tok must be a [B, 1] tensor of token ids, got {getattr(tok, 'shape', tok)!r}")
    if not isinstance(pos, torch.Tensor) or pos.dim() != 0:
        raise ValueError(f"pos must be a 0-d tensor (the position as data), got {getattr(pos, 'shape', pos)!r}")
    B = tok.shape[0]
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (not isinstance(cache, torch.Tensor) or cache.dim() != 5 or tuple(cache.shape[:3]) != (L, B, KV)
                or cache.shape[4] != Dh):
            raise ValueError(f"{name} must be [{L}, {B}, {KV}, max_len, {Dh}] (layers, batch, kv_heads, slots, "
                             f"head_dim), got {tuple(getattr(cache, 'shape', ()))}")
    S = k_cache.shape[3]
    slots = torch.arange(S, device=tok.device)                               # [S]
    here = (slots == pos).view(1, 1, S, 1)                                   # the slot this token fills
    mask = (slots <= pos).view(1, 1, 1, S) if masked else None               # written slots only
    x = model.model.embed_tokens(tok)                                        # [B, 1, D]
    cos, sin = rope_cos_sin(pos.view(1, 1).expand(B, 1), Dh, c.rope_theta, x.dtype)
    ks, vs = [], []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(B, 1, c.num_attention_heads, Dh).transpose(1, 2)          # [B, H, 1, Dh]
        k = a.k_proj(h).view(B, 1, KV, Dh).transpose(1, 2)                             # [B, KV, 1, Dh]
        v = a.v_proj(h).view(B, 1, KV, Dh).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ks.append(torch.where(here, k, k_cache[i]))                                    # [B, KV, S, Dh]
        vs.append(torch.where(here, v, v_cache[i]))
        o = attention(q, ks[-1], vs[-1], mask)                                         # [B, H, 1, Dh]
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x))[:, -1], torch.stack(ks), torch.stack(vs)


class _StepModule(torch.nn.Module):
    def __init__(self, step, model):
        super().__init__()
        self.step, self.model = step, model

    def forward(self, tok, pos, k_cache, v_cache):
        return self.step(self.model, tok, pos, k_cache, v_cache)


_SAFE_OPERATORS = {f"operator.{f.__name__}": f for f in (
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod, operator.neg,
    operator.getitem, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
    operator.and_, operator.or_)}
# an op whose result is a tensor's value on the host: the graph depends on data there (a sync, a guard)
DATA_DEPENDENT = ("aten.item", "aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique",
                  "aten._assert_scalar")


def _target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else f"{target.namespace}.{target.__name__}"
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        return f"operator.{target.__name__}"
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__name__', repr(target))}"


def _encode_arg(a):
    if isinstance(a, torch.fx.Node):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        return [_encode_arg(x) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise TypeError(f"the exported graph holds an argument of type {type(a).__name__} ({a!r:.80})")


def _shape_of(val):
    """A node's output shape as ints, or None; 'symbolic' where a size depends on data or is dynamic."""
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    return [int(d) if isinstance(d, int) else "symbolic" for d in shape]


@torch.no_grad()
def export_step(step, model, batch: int = 2, max_len: int = 16, strict: bool = True) -> dict:
    """``torch.export`` (dynamo's tracer with ``strict=True``, as ``torch.compile`` traces) of
    ``step(model, tok, pos, k_cache, v_cache)`` at one example input, as plain data: inputs (the user's four,
    the model's parameters by state-dict name, lifted constants), nodes (target, args, output shape) and
    outputs. An exported program is one graph by construction; `graph_report` says whether its shapes are
    static and its ops data-free, `run_exported` runs it op by op at any position, here or in another process."""
    batch, max_len = integer(batch, "batch", low=1), integer(max_len, "max_len", low=2)
    tok = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    k, v = static_caches(model, batch, max_len)
    ep = torch.export.export(_StepModule(step, model), (tok, torch.tensor(1, device=model.device), k, v),
                             strict=strict)
    kinds = {"USER_INPUT": "user", "PARAMETER": "param", "BUFFER": "param", "CONSTANT_TENSOR": "constant"}
    inputs, constants = [], {}
    for spec in ep.graph_signature.input_specs:
        kind = kinds.get(spec.kind.name)
        if kind is None:
            raise TypeError(f"the exported step has an input of kind {spec.kind.name}, which run_exported cannot feed")
        inputs.append({"name": spec.arg.name, "kind": kind, "target": spec.target})
        if kind == "constant":
            constants[spec.target] = ep.constants[spec.target].detach().cpu()
    nodes, outputs = [], None
    for n in ep.graph.nodes:
        if n.op == "call_function":
            nodes.append({"name": n.name, "target": _target_name(n.target), "args": _encode_arg(list(n.args)),
                          "kwargs": {k_: _encode_arg(x) for k_, x in n.kwargs.items()},
                          "shape": _shape_of(n.meta.get("val"))})
        elif n.op == "output":
            outs = n.args[0]
            user = [s.arg.name for s in ep.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
            outputs = [_encode_arg(o) for o in outs if isinstance(o, torch.fx.Node) and o.name in user]
        elif n.op != "placeholder":
            raise TypeError(f"the exported graph holds a {n.op} node ({n.name}), which run_exported cannot run")
    return {"format": "course-graph-1", "inputs": inputs, "constants": constants, "nodes": nodes,
            "outputs": outputs}


def graph_report(graph: dict) -> dict:
    """What a graph from `export_step` shows about its step: ops (the call nodes), data_dependent (the nodes
    that read a tensor's value on the host, `DATA_DEPENDENT`), symbolic (nodes whose output shape is not fixed)
    and static (neither: one graph that CUDA graphs can replay at every position)."""
    nodes = _graph_nodes(graph)
    dd = [n["name"] for n in nodes if str(n.get("target", "")).startswith(DATA_DEPENDENT)]
    sym = [n["name"] for n in nodes if "symbolic" in (n.get("shape") or [])
           or n.get("target") == "aten.sym_size.int"]
    return {"ops": len(nodes), "data_dependent": dd, "symbolic": sym, "static": not dd and not sym}


def _graph_nodes(graph) -> list:
    if not isinstance(graph, dict) or graph.get("format") != "course-graph-1":
        raise ValueError("graph must be the dict export_step returns (format 'course-graph-1')")
    nodes = graph.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise ValueError("graph['nodes'] must be a list of dicts")
    return nodes


# aten ops a graph from elsewhere may not run: they read memory out of bounds or uninitialized (as_strided, the
# unchecked index, empty), change a tensor's storage, or reach outside tensors (a file, stdout)
_REFUSED_OPS = ("as_strided", "empty", "new_empty", "set_", "resize", "from_file", "_print", "_nested", "storage")
_MAX_ELEMENTS = 2 ** 26          # a size, a repeat or a range past this is refused before the op allocates it


def _resolve(target):
    """The callable of a node: an aten op overload or a safe `operator` function; nothing else runs."""
    if not isinstance(target, str):
        raise ValueError(f"a node's target must be a string, got {target!r:.80}")
    if target in _SAFE_OPERATORS:
        return _SAFE_OPERATORS[target]
    parts = target.split(".")
    if len(parts) == 3 and parts[0] == "aten" and (parts[1].startswith(_REFUSED_OPS) or "unsafe" in parts[1]):
        raise ValueError(f"the graph calls {target!r}, which run_exported refuses (memory it does not own, or "
                         "outside tensors)")
    if len(parts) == 3 and parts[0] == "aten" and all(p.isidentifier() for p in parts[1:]):
        packet = getattr(torch.ops.aten, parts[1], None)
        op = getattr(packet, parts[2], None) if packet is not None else None
        if isinstance(op, torch._ops.OpOverload):
            return op
    raise ValueError(f"the graph calls {target!r}: run_exported runs aten ops and arithmetic only")


_ENUMS = {"dtype": lambda s: getattr(torch, s), "device": torch.device, "layout": lambda s: getattr(torch, s),
          "memory_format": lambda s: getattr(torch, s)}


@torch.no_grad()
def run_exported(graph: dict, model, tok, pos, k_cache, v_cache):
    """Run a graph from `export_step` op by op on these inputs, with `model`'s parameters (taken by name from
    the model given here, not from the graph) and the graph's constants. Returns its outputs (a list). Only
    aten ops and arithmetic on sizes run (`ValueError` on anything else), and of the aten ops not those that
    reach memory a tensor does not own or the world outside tensors (`_REFUSED_OPS`), nor a size past
    `_MAX_ELEMENTS`: the graph may come from a student's process. A node that reads an unknown name or an input
    the graph does not declare is refused."""
    nodes = _graph_nodes(graph)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    user = iter([tok, pos, k_cache, v_cache])
    env = {}
    for spec in graph.get("inputs", []):
        name, kind, target = spec.get("name"), spec.get("kind"), spec.get("target")
        if kind == "user":
            env[name] = next(user, None)
        elif kind == "param" and target in state:
            env[name] = state[target]
        elif kind == "constant" and isinstance(graph.get("constants", {}).get(target), torch.Tensor):
            env[name] = graph["constants"][target].to(model.device)
        else:
            raise ValueError(f"the graph's input {name!r} ({kind} {target!r}) is not the model's and not given")

    def arg(a):
        if isinstance(a, list):
            return [arg(x) for x in a]
        if isinstance(a, dict):
            if set(a) == {"node"}:
                if a["node"] not in env:
                    raise ValueError(f"the graph reads {a['node']!r} before computing it")
                return env[a["node"]]
            if len(a) == 1 and next(iter(a)) in _ENUMS:
                key, val = next(iter(a.items()))
                return _ENUMS[key](val)
            raise ValueError(f"the graph holds an argument it cannot decode: {a!r:.80}")
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        raise ValueError(f"the graph holds an argument it cannot decode: {a!r:.80}")

    def bounded(a, where):
        """Sizes and ranges within _MAX_ELEMENTS, before an op allocates them."""
        if isinstance(a, list) and a and all(isinstance(x, int) and not isinstance(x, bool) for x in a):
            if math.prod(abs(x) for x in a) > _MAX_ELEMENTS:
                raise ValueError(f"{where}: a size of {a} elements is past run_exported's limit")
        elif isinstance(a, list):
            for x in a:
                bounded(x, where)
        elif isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) and abs(a) > _MAX_ELEMENTS \
                and where.split(".")[1] in ("arange", "full", "repeat", "expand", "new_full", "zeros", "ones"):
            raise ValueError(f"{where}: an argument of {a} is past run_exported's limit")

    for n in nodes:
        fn = _resolve(n.get("target"))
        args, kwargs = n.get("args", []), n.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError(f"node {n.get('name')!r}: args must be a list and kwargs a dict")
        bounded(args, str(n.get("target")))
        bounded(list(kwargs.values()), str(n.get("target")))
        values = arg(args)
        if n.get("target") in _SAFE_OPERATORS and n.get("target") != "operator.getitem" and not all(
                isinstance(v, (int, float, torch.Tensor)) for v in values):
            raise ValueError(f"node {n.get('name')!r}: {n.get('target')} on something else than numbers and tensors")
        env[n.get("name")] = fn(*values, **{k: arg(v) for k, v in kwargs.items()})
    return [arg(o) for o in graph.get("outputs") or []]


# --------------------------------------------------------------------------------------------------
# A profiler trace as plain data (Lab 12 Part B)
# --------------------------------------------------------------------------------------------------
def trace_events(prof) -> list[dict]:
    """The events of a finished ``torch.profiler.profile`` as plain data, one dict each, parents before
    children: id, name, parent (the id of the enclosing CPU event, or None), device ("cpu", or "cuda" for a
    kernel), self_us (time in the event itself, its children's taken out; a kernel's device time) and
    total_us (with its children)."""
    events = list(prof.events())
    ids = {id(e): i for i, e in enumerate(events)}
    out = []
    for i, e in enumerate(events):
        kernel = e.device_type == torch.autograd.DeviceType.CUDA
        parent = None if kernel or e.cpu_parent is None else ids.get(id(e.cpu_parent))
        self_us = float(getattr(e, "self_device_time_total", 0.0) if kernel else e.self_cpu_time_total)
        total_us = float(getattr(e, "device_time_total", 0.0) if kernel else e.cpu_time_total)
        out.append({"id": i, "name": e.name, "parent": parent, "device": "cuda" if kernel else "cpu",
                    "self_us": self_us, "total_us": total_us})
    order = sorted(range(len(out)), key=lambda i: _depth(out, i))        # parents first
    return [out[i] for i in order]


def _depth(events, i):
    d, p = 0, events[i]["parent"]
    while p is not None:
        d, p = d + 1, events[p]["parent"]
    return d


def read_trace(events, tokens: int) -> dict:
    """Read a decode trace from `trace_events` (Lab 12 Part B's reference): ops_per_token (top-level aten ops,
    those with no aten op among their ancestors, per token), kernels_per_token (device kernels per token; 0 on
    a CPU), top_op (the aten op with the largest self time summed over its calls; None without one) and
    top_share (that sum over the self time of every aten event)."""
    tokens = integer(tokens, "tokens", low=1)
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError("events must be a list of dicts (trace_events' format)")
    by_id = {e.get("id"): e for e in events}
    if len(by_id) != len(events):
        raise ValueError("events must have distinct ids")
    for e in events:
        if e.get("parent") is not None and e["parent"] not in by_id:
            raise ValueError(f"event {e.get('id')!r} names a parent {e['parent']!r} that is not in events")
        if not (isinstance(e.get("self_us"), (int, float)) and math.isfinite(e["self_us"]) and e["self_us"] >= 0):
            raise ValueError(f"event {e.get('id')!r}: self_us must be a finite number >= 0, got {e.get('self_us')!r}")

    def top_level(e):
        p = e.get("parent")
        for _ in range(len(events)):
            if p is None:
                return True
            if str(by_id[p]["name"]).startswith("aten::"):
                return False
            p = by_id[p].get("parent")
        raise ValueError("events' parents form a cycle")

    aten = [e for e in events if str(e.get("name")).startswith("aten::") and e.get("device") != "cuda"]
    self_time = collections.Counter()
    for e in aten:
        self_time[e["name"]] += e["self_us"]
    total = sum(self_time.values())
    top = max(self_time, key=lambda n: self_time[n]) if self_time else None
    return {"ops_per_token": sum(top_level(e) for e in aten) / tokens,
            "kernels_per_token": sum(e.get("device") == "cuda" for e in events) / tokens,
            "top_op": top, "top_share": self_time[top] / total if top is not None and total > 0 else 0.0}
