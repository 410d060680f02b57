# %% [markdown] id="c002"
# # Lab 12 · A step that compiles once, read in a trace, and what a step should cost
#
# Four skills from Module 12, and one written analysis:
#
# * **Part A (5 points, contract): a decode step that compiles once.** You write one decode step of the
#   course's model over a static KV cache, with the position as a tensor and no Python value that depends on
#   data, so that `torch.compile` traces it once for every position (and CUDA graphs can replay it). The
#   recompilations are counted, and the step is exported as one graph that the grader runs itself.
# * **Part B (3 points, contract): read a profiler trace.** From a `torch.profiler` trace given as plain
#   data: the top-level operators per token, the kernels per token, and the operator that takes the time.
# * **Part C (4 points): the attribution table.** From a list of `(step, tokens/s)` measurements, each
#   step's speed-up over the previous one, its share of the total speed-up on a log scale, and the cost per
#   1M tokens.
# * **Part D (2 points): predict a decode step on another machine.** Module 01's roofline and Module 12's
#   launch overhead combined, for a model shape and a card the notebooks did not compute; then your own step,
#   measured, beside the prediction.
# * **Part E (2 points, written): what your trace and your measurement show**, graded by the instructor.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, the grader also calls your
#   functions on inputs of its own (models it draws for you, traces it records, random machines, and an edge
#   grid), so meet the specification exactly. Part A's step is judged on the graph it exports: the grader
#   runs that graph, op by op, in its own process, at every position.
# * Do not call `course_lib.compile_tools.static_decode_step` in Part A, `course_lib.compile_tools.read_trace`
#   in Part B, `course_lib.capstone.attribution_table` in Part C or `course_lib.perf.roofline` in Part D: the
#   grader compares your results with them, flags an answer that imports them, and while it grades, they are
#   not in the library. Everything runs on a CPU in seconds. Total: 16 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from course_lib import device_bench
from course_lib.attention import attention
from course_lib.attention.rope import apply_rope, rope_cos_sin
from course_lib.compile_tools import count_compiles, export_step, graph_report, static_caches, trace_events
from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config
from course_lib.perf.hardware import get_gpu
from course_lib.perf.timing import benchmark

import course_lib.env

QUICK = course_lib.env.quick()         # small and on one thread on a shared CPU; real sizes on a GPU
if QUICK and not torch.cuda.is_available():
    torch.set_num_threads(1)           # two threads on a busy 2-core machine time out of step by 100x


def tiny_model(seed=0, vocab=128):
    """A two-layer model with grouped-query attention (4 query heads, 2 KV heads), small enough for dynamo
    to trace it in a second."""
    torch.manual_seed(seed)
    cfg = as_config(dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64))
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


model = tiny_model()

# Known misconceptions: a test that recognises one names it (public text, pointing to the notebooks)
MISTAKES = {
    "int_position": "the position was read on the host (int(pos), pos.item(), a slice up to pos): dynamo "
                    "then guards on its value or traces a data-dependent shape, so the step recompiles (or "
                    "cannot be one static graph) at every position; keep the position a tensor and mask with "
                    "it; see notebook 12, section '3. Recompiles'",
    "unmasked_slots": "attention read every slot of the static cache, the unwritten ones too: what a slot after "
                      "the position holds (zeros, an old sequence's K/V) changes the logits; mask the slots "
                      "after the position; see notebook 05, section '5. The static (preallocated) cache'",
    "nested_ops": "every aten event was counted, the ones an operator calls inside itself too (aten::linear "
                  "runs aten::t and aten::addmm): count the top-level operators, those with no aten op above "
                  "them; see notebook 12, section '1. The kernels of one decode step'",
    "inclusive_time": "operators were ranked by their total time, which includes what they call (aten::linear "
                      "contains its matmul): the time an operator takes itself is its self time; see notebook "
                      "12, section '1. The kernels of one decode step'",
    "linear_shares": "speed-ups multiply, so each step's share is taken on a log scale, log(speedup) / log(S); "
                     "linear shares (speedup - 1) / (S - 1) do not add up to 1; see notebook 12, section "
                     "'6. The capstone: every optimization on one model'",
    "sum_not_max": "the roofline's time is the larger of the memory time and the compute time (the device reads "
                   "and computes at the same time), not their sum; see notebook 01, section '5. Rooflines: T4, "
                   "L4, A100, H100, H200 and this machine'",
    "kv_query_heads": "the KV cache holds the key/value heads only (num_key_value_heads): with grouped-query "
                      "attention the query heads share them, so counting num_attention_heads overstates the "
                      "bytes read; see notebook 05, section '4. How much memory the cache takes'",
    "launch_added": "the CPU launches kernels while the GPU runs the earlier ones: the step takes the longer of "
                    "the launches and the device's work, not their sum; see notebook 12, section '4. Is the "
                    "compile worth it here? Launch overhead and CUDA graphs'",
}


# %% [markdown] id="c004"
# ## Part A · A decode step that compiles once (5 points, contract)
#
# The course's `StaticCache` (Module 05) allocates every slot up front, so a decode step has the same shapes
# at every position; notebook 12 showed that a Python-int position still recompiles at every token, and a
# host read (`.item()`, `int(...)`) breaks the graph. Here you write the whole step yourself, as a pure
# function of tensors, so that nothing in it depends on the position's *value* on the host: one graph for
# every position, which CUDA graphs can record once and replay.
#
# The model's pieces (a course `LlamaForCausalLM`, `model.config` its shape): `model.model.embed_tokens`;
# for each `layer` of `model.model.layers`: `layer.input_layernorm`, `layer.self_attn.{q,k,v,o}_proj`,
# `layer.post_attention_layernorm`, `layer.mlp`; then `model.model.norm` and `model.lm_head`. RoPE is
# `rope_cos_sin(positions, head_dim, config.rope_theta, dtype)` and `apply_rope(x, cos, sin)`;
# `attention(q, k, v, attn_mask)` is the course's grouped-query attention (a boolean `attn_mask`, True where
# a query may attend, of shape `[T, S]` or `[B, 1, T, S]`: one mask for every head, since grouped heads take
# no per-head mask; for one new token, `[1, S]` or `[B, 1, 1, S]`). A layer is
# `x + o_proj(attention(rope(q), rope(k), v))` on the normed `x`, then `x + mlp(post_attention_layernorm(x))`.
#
# **Contract.** `static_step(model, tok, pos, k_cache, v_cache)`:
#
# * *inputs*: a course model; `tok` `[B, 1]` int64, the current token of each of `B` sequences; `pos` a 0-d
#   int64 tensor, the position of `tok` (the same for every row; `0 <= pos < S`); `k_cache`, `v_cache`
#   `[L, B, KV, S, head_dim]` in the model's dtype (`L` layers, `KV` key/value heads, `S` slots): slots
#   `0 .. pos-1` hold the earlier tokens' K (after RoPE) and V, **slots `pos .. S-1` hold any finite
#   values**;
# * *output*: a tuple `(logits, k_cache, v_cache)`: `logits` `[B, V]`, the next-token logits at `tok`, equal
#   (to float rounding) to the model's logits at that position over the whole sequence; the two caches, same
#   shapes, equal to the inputs except slot `pos` of every layer, which holds `tok`'s K (after RoPE) and V.
#   Return new tensors or update in place, as you like;
# * *the point*: the step is one graph for every position: `count_compiles` compiles it once over many
#   positions, and `export_step` gives a graph with no data-dependent op (`graph_report(...)["static"]`).
#   The grader exports your step at a batch and a cache size it draws and runs that graph itself, at every
#   position of prompts it draws, with garbage in the unwritten slots;
# * *errors*: `ValueError` if `tok` is not `[B, 1]`, `pos` is not a 0-d tensor, or a cache's shape is not
#   `[L, B, KV, S, head_dim]` for this model and `tok` (shapes are known while tracing: checking them costs
#   no graph break).
#
# <details><summary>Hint 1: where the new K/V go</summary>
#
# Writing "slot `pos`" with `pos` as a Python number is exactly the host read to avoid. Compare the slot
# indices, a tensor of `S` numbers, with `pos`: the comparison is a tensor too, and it says where to put the
# new entry and which slots are already written. The pitfall: an index or a slice built from `pos.item()`.
#
# </details>
#
# <details><summary>Hint 2: the unwritten slots</summary>
#
# Attention over all `S` slots keeps the shapes static; what keeps the answer right is that the slots after
# the position never count. The grader fills them with large numbers, so a step that forgets them is far off.
#
# </details>
#
# <details><summary>Hint 3: shapes of grouped-query attention</summary>
#
# The cache holds `KV` heads, the queries `heads`; the course's `attention` takes care of the grouping, so
# do not repeat the K/V heads. RoPE goes on q and k at the token's position (positions `[B, 1]`), before the
# new k is stored.
#
# </details>

# %% id="c007" nbgrader={"grade": false, "grade_id": "static_step_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def static_step(model, tok, pos, k_cache, v_cache):
    ### BEGIN SOLUTION
    c = model.config
    L, KV, Dh = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    if not isinstance(tok, torch.Tensor) or tok.dim() != 2 or tok.shape[1] != 1:
        raise ValueError(f"tok must be [B, 1], got {tuple(getattr(tok, 'shape', ()))}")
    if not isinstance(pos, torch.Tensor) or pos.dim() != 0:
        raise ValueError(f"pos must be a 0-d tensor, got {pos!r}")
    B = tok.shape[0]
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 5 or tuple(cache.shape[:3]) != (L, B, KV) or cache.shape[4] != Dh:
            raise ValueError(f"{name} must be [{L}, {B}, {KV}, S, {Dh}], got {tuple(cache.shape)}")
    S = k_cache.shape[3]
    slots = torch.arange(S, device=tok.device)
    here = (slots == pos).view(1, 1, S, 1)               # the slot this token fills
    mask = (slots <= pos).view(1, 1, 1, S)               # the slots written so far, this one included
    x = model.model.embed_tokens(tok)                    # [B, 1, D]
    cos, sin = rope_cos_sin(pos.view(1, 1).expand(B, 1), Dh, c.rope_theta, x.dtype)
    ks, vs = [], []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rope(a.q_proj(h).view(B, 1, c.num_attention_heads, Dh).transpose(1, 2), cos, sin)
        k = apply_rope(a.k_proj(h).view(B, 1, KV, Dh).transpose(1, 2), cos, sin)
        v = a.v_proj(h).view(B, 1, KV, Dh).transpose(1, 2)
        ks.append(torch.where(here, k, k_cache[i]))      # [B, KV, S, Dh]: slot pos replaced, no host read
        vs.append(torch.where(here, v, v_cache[i]))
        x = x + a.o_proj(attention(q, ks[-1], vs[-1], mask).transpose(1, 2).reshape(B, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x))[:, -1], torch.stack(ks), torch.stack(vs)
    ### END SOLUTION


# %% id="c008" nbgrader={"grade": true, "grade_id": "static_step_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
def _run_positions(step, m, prompts, max_len, fill):
    """The step at every position of `prompts` from empty caches whose slots hold `fill`: logits [B, T, V]."""
    k, v = static_caches(m, prompts.shape[0], max_len, fill=fill)
    out = []
    with torch.no_grad():
        for p in range(prompts.shape[1]):
            got = step(m, prompts[:, p:p + 1], torch.tensor(p), k, v)
            if not (isinstance(got, tuple) and len(got) == 3):
                raise AssertionError(f"static_step must return (logits, k_cache, v_cache), got {type(got).__name__}")
            logits, k, v = got
            out.append(logits)
    return torch.stack(out, 1), k, v


_prompts = torch.tensor([[1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4]])
with torch.no_grad():
    _want = model(_prompts)
    _cache = StaticCache.for_model(model, 2, 8)
    model(_prompts, cache=_cache)
for _fill in (0.0, 1e3):
    _got, _k, _v = _run_positions(static_step, model, _prompts, 8, _fill)
    check_shape(_got, tuple(_want.shape), "the logits of static_step at every position")
    check_close(_got, _want, f"static_step's logits at every position (unwritten slots holding {_fill:g})",
                rtol=1e-4, atol=1e-4)
    check_close(_k[:, :, :, :6], torch.stack(_cache.k)[:, :, :, :6], "the K written into slots 0..5", rtol=1e-4,
                atol=1e-4)
    check_close(_v[:, :, :, :6], torch.stack(_cache.v)[:, :, :, :6], "the V written into slots 0..5", rtol=1e-4,
                atol=1e-4)
    check_equal(bool((_k[:, :, :, 6:] == _fill).all() and (_v[:, :, :, 6:] == _fill).all()), True,
                "slots after the last position are left as they were")
# one graph for every position: dynamo traces the step once (a backend that only counts: no code generated)
_k, _v = static_caches(model, 1, 8)
_calls = [(model, torch.tensor([[3]]), torch.tensor(p), _k, _v) for p in range(5)]
check_equal(count_compiles(static_step, _calls, dynamic=False), 1, "graphs compiled for 5 positions",
            mistakes={MISTAKES["int_position"]: len(_calls)})
_report = graph_report(export_step(static_step, model, batch=2, max_len=8))
check_equal(_report["static"], True, f"the exported step is static (data-dependent ops: {_report['data_dependent']})",
            mistakes={MISTAKES["int_position"]: False})
_k, _v = static_caches(model, 2, 8)
for _args, _what in [((torch.tensor([3, 4]), torch.tensor(0), _k, _v), "tok of shape [2]"),
                     ((torch.tensor([[3], [4]]), 0, _k, _v), "pos a Python int"),
                     ((torch.tensor([[3], [4]]), torch.tensor([0]), _k, _v), "pos of shape [1]"),
                     ((torch.tensor([[3], [4]]), torch.tensor(0), _k[:1], _v), "k_cache with 1 layer of 2")]:
    check_raises(lambda: static_step(model, *_args), ValueError, f"static_step with {_what}")
print(f"Part A: visible tests passed (one graph of {_report['ops']} ops for every position)")

# %% [markdown] id="c005"
# Recompilations, counted: the course's model called through a cache that grows (`ContiguousCache`, a new
# length every token) against your step, both under `torch.compile` with `dynamic=False` and a backend that
# only counts the graphs dynamo hands it. Then, on a GPU, the real thing: your step compiled with
# `mode="reduce-overhead"` (inductor plus CUDA graphs), timed against eager. On a CPU that compile takes about
# a minute, so it runs only on a GPU outside the quick mode.

# %% id="c006"
try:
    from course_lib.kvcache import ContiguousCache

    def _grow(m, tok, cache):
        return m(tok, cache=cache)

    _steps = 6
    _dyn = ContiguousCache()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=_dyn)
    _graphs_growing = count_compiles(_grow, [(model, torch.tensor([[4]]), _dyn) for _ in range(_steps)],
                                     dynamic=False)
    _k, _v = static_caches(model, 1, 16)
    _graphs_static = count_compiles(static_step, [(model, torch.tensor([[4]]), torch.tensor(p), _k, _v)
                                                  for p in range(_steps)], dynamic=False)
    print(f"{_steps} decode steps: growing cache {_graphs_growing} graphs, your static step {_graphs_static}")
    if torch.cuda.is_available() and not QUICK and not os.environ.get("NBGRADER_EXECUTION"):
        _m = tiny_model().cuda()
        _k, _v = static_caches(_m, 1, 256)
        _tok, _pos = torch.tensor([[4]], device="cuda"), torch.tensor(3, device="cuda")
        _compiled = torch.compile(static_step, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):                               # compile, record the CUDA graph, replay
            _compiled(_m, _tok, _pos, _k, _v)
        _eager_s = benchmark(static_step, _m, _tok, _pos, _k, _v, warmup=3, repeats=20).median
        _graph_s = benchmark(_compiled, _m, _tok, _pos, _k, _v, warmup=3, repeats=20).median
        print(f"eager {_eager_s * 1e6:.0f} us, compiled with CUDA graphs {_graph_s * 1e6:.0f} us per step (this run)")
    else:
        print("the inductor compile and CUDA graphs run on a GPU outside the quick mode")
except NotImplementedError:
    print("finish Part A first")

# %% [markdown] id="c020"
# ## Part B · Read a profiler trace (3 points, contract)
#
# `torch.profiler` records every operator a step dispatches (`aten::...` events on the CPU, nested: an
# operator that calls others is their parent) and, on a GPU, every kernel the device ran. `trace_events(prof)`
# gives a finished trace as plain data, a list of dicts, parents before their children:
#
# * `"id"` (an int), `"name"` (`"aten::addmm"`, a `record_function` label such as `"## decode ##"`, a CUDA
#   kernel's name), `"parent"` (the id of the enclosing CPU event, or `None`), `"device"` (`"cpu"`, or
#   `"cuda"` for a kernel), `"self_us"` (time in the event itself, its children's time taken out; a kernel's
#   device time) and `"total_us"` (with its children).
#
# **Contract.** `read_trace(events, tokens)`, for a trace of `tokens` decoded tokens, returns a dict:
#
# * `"ops_per_token"`: the **top-level** aten operators (CPU events named `aten::...` with no `aten::` event
#   among their ancestors; a `record_function` label between them does not count as one) per token: what the
#   step dispatches from Python, each at least one kernel;
# * `"kernels_per_token"`: the events with `"device" == "cuda"` per token (0 on a CPU);
# * `"top_op"`: the name of the aten operator whose **self** time, summed over all its events (nested or
#   not), is the largest (a tie goes to the name whose first event comes first in the list); `None` if the
#   trace has no aten event. Here and below, an aten event is a CPU one: an event on `"cuda"` is a kernel,
#   whatever its name;
# * `"top_share"`: that sum over the self time of every aten event (0.0 without one, or if that total is 0).
#
# Raise `ValueError` if `tokens` is not an integer >= 1, if an event's `"parent"` is not the id of an event in
# the list, or if a `"self_us"` is negative. The grader records traces of its own (a decode step of a model
# it draws) and draws trees of events, and reads each with the course's reader.
#
# <details><summary>Hint: what "top-level" means</summary>
#
# Walk up from an event through its parents: it is top-level if none of them is an aten operator. A
# `## decode ##` label above it is not an operator. The pitfall: counting every `aten::` event, which counts
# `aten::linear` and the `aten::t`, `aten::addmm` it runs inside itself.
#
# </details>

# %% id="c027" nbgrader={"grade": false, "grade_id": "trace_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def read_trace(events, tokens):
    ### BEGIN SOLUTION
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an integer >= 1, got {tokens!r}")
    by_id = {e["id"]: e for e in events}
    for e in events:
        if e["parent"] is not None and e["parent"] not in by_id:
            raise ValueError(f"event {e['id']} names a parent {e['parent']!r} that is not in the trace")
        if not e["self_us"] >= 0:
            raise ValueError(f"event {e['id']}: self_us must be >= 0, got {e['self_us']!r}")

    def is_aten(e):
        return e["name"].startswith("aten::") and e["device"] != "cuda"

    def top_level(e):
        p = e["parent"]
        while p is not None:
            if is_aten(by_id[p]):
                return False
            p = by_id[p]["parent"]
        return True

    aten = [e for e in events if is_aten(e)]
    self_us = {}
    for e in aten:
        self_us[e["name"]] = self_us.get(e["name"], 0.0) + e["self_us"]
    top = max(self_us, key=self_us.get) if self_us else None
    total = sum(self_us.values())
    return {"ops_per_token": sum(top_level(e) for e in aten) / tokens,
            "kernels_per_token": sum(e["device"] == "cuda" for e in events) / tokens,
            "top_op": top, "top_share": self_us[top] / total if top is not None and total > 0 else 0.0}
    ### END SOLUTION


# %% id="c022" nbgrader={"grade": true, "grade_id": "trace_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _event(i, name, parent, self_us, total_us=None, device="cpu"):
    return {"id": i, "name": name, "parent": parent, "device": device, "self_us": self_us,
            "total_us": self_us if total_us is None else total_us}


# a hand-made trace of one token: a label, a linear (its transpose and matmul inside), an add, a kernel
_hand = [_event(0, "## decode ##", None, 2.0, 60.0), _event(1, "aten::linear", 0, 6.0, 50.0),
         _event(2, "aten::t", 1, 4.0), _event(3, "aten::addmm", 1, 40.0), _event(4, "aten::add", 0, 8.0),
         _event(5, "gemm_kernel", None, 30.0, device="cuda")]
_r = read_trace(_hand, 1)
check_equal(sorted(_r), ["kernels_per_token", "ops_per_token", "top_op", "top_share"], "read_trace's keys")
check_close(_r["ops_per_token"], 2.0, "top-level operators of the hand-made trace (linear and add; the label is "
            "not an operator)", mistakes={MISTAKES["nested_ops"]: 4.0})
check_close(_r["kernels_per_token"], 1.0, "kernels of the hand-made trace")
check_equal(_r["top_op"], "aten::addmm", "the operator with the most self time",
            mistakes={MISTAKES["inclusive_time"]: "aten::linear"})
check_close(read_trace(_hand, 4)["ops_per_token"], 0.5, "the same trace read as 4 tokens")
check_equal(read_trace([_event(0, "## idle ##", None, 1.0)], 1)["top_op"], None, "a trace with no aten event")
# a real trace: your Part A step over 3 positions, recorded here on the CPU
with profile(activities=[ProfilerActivity.CPU]) as _prof, torch.no_grad():
    _k, _v = static_caches(model, 1, 8)
    for _p in range(3):
        _, _k, _v = static_step(model, torch.tensor([[5]]), torch.tensor(_p), _k, _v)
_r = read_trace(trace_events(_prof), 3)
_linears = 7 * model.config.num_hidden_layers + 1        # q, k, v, o, gate, up, down per layer, and the head
if not (_linears <= _r["ops_per_token"] < sum(e["name"].startswith("aten::") for e in trace_events(_prof)) / 3):
    raise AssertionError(f"ops_per_token of a real trace: {_r['ops_per_token']} is not between the {_linears} "
                         "linears every token runs and the count of every aten event (nested ones included)")
check_equal(isinstance(_r["top_op"], str) and _r["top_op"].startswith("aten::"), True, "top_op of a real trace")
for _bad, _n, _what in [(_hand, 0, "tokens 0"), (_hand, 1.5, "tokens 1.5"), (_hand[1:], 1, "a missing parent"),
                        ([_event(0, "aten::add", None, -1.0)], 1, "a negative self time")]:
    check_raises(lambda: read_trace(_bad, _n), ValueError, f"read_trace with {_what}")
print("Part B: visible tests passed")

# %% [markdown] id="c023"
# Your own trace: four decode steps of your Part A step on the course's bundled model (`tiny`, 4 layers),
# recorded on this machine (with the CUDA kernels on a GPU). The table is the profiler's own summary, sorted
# by self time; below it, your reading. Part E asks about these numbers.

# %% id="c024"
try:
    from course_lib.models import load

    _tiny, _ = load("tiny", device="cuda" if torch.cuda.is_available() else "cpu")
    _tiny.eval().requires_grad_(False)
    _acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    _k, _v = static_caches(_tiny, 1, 32)
    _tok = torch.tensor([[5]], device=_tiny.device)
    with torch.no_grad():
        static_step(_tiny, _tok, torch.tensor(0, device=_tiny.device), _k, _v)      # warm-up, outside the trace
        with profile(activities=_acts) as my_prof:
            for _p in range(1, 5):
                _logits, _k, _v = static_step(_tiny, _tok, torch.tensor(_p, device=_tiny.device), _k, _v)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    print(my_prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    my_reading = read_trace(trace_events(my_prof), 4)
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in my_reading.items()})
except NotImplementedError:
    print("finish Parts A and B first")

# %% [markdown] id="c009"
# ## Part C · The attribution table (4 points)
#
# You measured a stack of optimizations, each added on top of the previous ones, as a list of
# `(step name, tokens per second)` in the order they were applied. Write
# `attribution(timings, price_per_hour)` returning one dict per step, in order, with the keys:
#
# * `"step"`: the name; `"tokens_per_s"`: the measurement;
# * `"speedup"`: tokens/s of this step divided by tokens/s of the **previous** step (1.0 for the first);
# * `"share"`: this step's share of the total speed-up, **on a log scale**: `log(speedup) / log(S)`, with `S`
#   the total speed-up (last tokens/s / first tokens/s). Speed-ups multiply, so their logs add up: the
#   shares sum to 1, a step that slows things down has a negative share. The first step's share is 0; if
#   `S` is exactly 1 every share is 0;
# * `"usd_per_1M"`: the cost of 1M tokens at that step on a machine rented at `price_per_hour`
#   (Module 00: price per hour / tokens per hour, times 1M).
#
# Raise `ValueError` if `timings` is empty, if a tokens/s is not a positive finite number, or if
# `price_per_hour` is negative.

# %% id="c010" nbgrader={"grade": false, "grade_id": "attribution_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attribution(timings, price_per_hour):
    ### BEGIN SOLUTION
    timings = list(timings)
    if not timings:
        raise ValueError("timings must not be empty")
    if not price_per_hour >= 0:
        raise ValueError(f"price_per_hour must be >= 0, got {price_per_hour!r}")
    for name, tps in timings:
        if not (isinstance(tps, (int, float)) and math.isfinite(tps) and tps > 0):
            raise ValueError(f"tokens/s of {name!r} must be a positive finite number, got {tps!r}")
    total = timings[-1][1] / timings[0][1]
    rows, prev = [], None
    for name, tps in timings:
        speedup = 1.0 if prev is None else tps / prev
        share = 0.0 if prev is None or total == 1 else math.log(speedup) / math.log(total)
        rows.append({"step": name, "tokens_per_s": tps, "speedup": speedup, "share": share,
                     "usd_per_1M": price_per_hour / (tps * 3600) * 1e6})
        prev = tps
    return rows
    ### END SOLUTION


# %% id="c011" nbgrader={"grade": true, "grade_id": "attribution_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
_t = [("no cache", 10.0), ("KV cache", 40.0), ("compile", 50.0), ("speculative", 40.0), ("batching", 400.0)]
_rows = attribution(_t, 2.0)
if not isinstance(_rows, list) or len(_rows) != 5 or not all(isinstance(r, dict) for r in _rows):
    raise AssertionError(f"attribution must return a list of 5 dicts, got {_rows!r}")
check_equal([r["step"] for r in _rows], [n for n, _ in _t], "the step names, in order")
check_close([r["speedup"] for r in _rows], [1.0, 4.0, 1.25, 0.8, 10.0], "speedup of each step over the previous")
check_close([r["share"] for r in _rows], [0.0, math.log(4) / math.log(40), math.log(1.25) / math.log(40),
                                          math.log(0.8) / math.log(40), math.log(10) / math.log(40)],
            "share of each step: log(speedup) / log(total speed-up), total = 400 / 10 = 40",
            mistakes={MISTAKES["linear_shares"]: [0.0, 3 / 39, 0.25 / 39, -0.2 / 39, 9 / 39]})
check_close(sum(r["share"] for r in _rows), 1.0, "the shares' sum")
check_close([r["usd_per_1M"] for r in _rows], [2.0 / (x * 3600) * 1e6 for _, x in _t],
            "cost per 1M tokens at $2/hour")
check_close([r["share"] for r in attribution([("a", 5.0), ("b", 10.0), ("c", 5.0)], 1.0)], [0.0, 0.0, 0.0],
            "shares when the total speed-up is exactly 1")
check_raises(lambda: attribution([], 1.0), ValueError, "attribution([], 1.0)")
check_raises(lambda: attribution([("a", 1.0), ("b", 0.0)], 1.0), ValueError, "a step with 0 tokens/s")
check_raises(lambda: attribution([("a", 1.0)], -1.0), ValueError, "a negative price")
print("Part C: visible tests passed")

# %% [markdown] id="c015"
# ## Part D · Predict a decode step on another machine (2 points)
#
# Two models of the course meet here. Module 01's roofline: a decode step of `batch` sequences reads every
# weight once and each sequence's KV cache once, does one multiply-add (2 FLOPs) per weight per sequence, and
# a device that streams and computes at the same time takes the time of the slower side. Module 12's launch
# overhead: the CPU launches the step's kernels one after another, each costing `launch_s` of CPU time, while
# the GPU runs the ones already launched; with CUDA graphs the whole step is one launch.
#
# Write `predict_step_s(config, gpu, batch, context, bytes_per_element, kernels, launch_s, cuda_graphs)`: the
# seconds of one decode step of the model `config` on the card `gpu`, where
#
# * `config` is a dict of the model's shape, Hugging Face's names (`"num_hidden_layers"`,
#   `"num_attention_heads"`, `"num_key_value_heads"`, `"head_dim"`, `"hidden_size"`, ...) and `"params"`, its
#   parameter count;
# * `gpu` is a dict `{"bandwidth": bytes/s, "peak_flops": FLOP/s}` (the rate for `bytes_per_element`);
# * each of the `batch` sequences has `context` tokens in its KV cache; weights and KV cache use
#   `bytes_per_element` bytes per number;
# * the step is `kernels` kernels; `cuda_graphs` says whether they are replayed as one graph;
# * the CPU's launches overlap the device's work: the step takes the longest of the memory time, the compute
#   time and the launch time (`kernels` launches of `launch_s` each, or one with CUDA graphs).
#
# The notebooks computed the roofline of one model at a time and the launches of the tiny model; here you
# combine them, for shapes and cards the grader draws. Raise `ValueError` if `batch` or `kernels` is not an
# integer >= 1, `context` not an integer >= 0, `launch_s` negative, or `bandwidth`, `peak_flops` or
# `bytes_per_element` not positive.
#
# <details><summary>Hint 1: the bytes of the KV cache</summary>
#
# Module 05's KV bytes count what the cache holds: keys and values, per layer, per key/value head. With
# grouped-query attention several query heads share one key/value head. The pitfall: the query heads.
#
# </details>
#
# <details><summary>Hint 2: two things at once, twice</summary>
#
# Reading and computing overlap on the device; launching overlaps with the device running what was
# launched. Each overlap gives the slower of two, not their sum.
#
# </details>

# %% id="c016" nbgrader={"grade": false, "grade_id": "predict_step_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_step_s(config, gpu, batch, context, bytes_per_element, kernels, launch_s, cuda_graphs):
    ### BEGIN SOLUTION
    for name, v in (("batch", batch), ("kernels", kernels)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be an integer >= 0, got {context!r}")
    if not launch_s >= 0:
        raise ValueError(f"launch_s must be >= 0, got {launch_s!r}")
    for name, v in (("gpu['bandwidth']", gpu["bandwidth"]), ("gpu['peak_flops']", gpu["peak_flops"]),
                    ("bytes_per_element", bytes_per_element)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
    params = config["params"]
    kv = (2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"]  # K and V
          * context * batch * bytes_per_element)
    memory_s = (params * bytes_per_element + kv) / gpu["bandwidth"]
    compute_s = 2 * params * batch / gpu["peak_flops"]
    launches_s = (1 if cuda_graphs else kernels) * launch_s
    return max(memory_s, compute_s, launches_s)          # three things that overlap: the slowest is the step
    ### END SOLUTION


# %% id="c017" nbgrader={"grade": true, "grade_id": "predict_step_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# a 70B-class model with grouped-query attention (8 KV heads for 64 query heads), an H100 SXM's datasheet row
_big = dict(params=70.6e9, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
            hidden_size=8192)
_h100 = dict(bandwidth=3.35e12, peak_flops=989e12)


def _p(cfg=_big, gpu=_h100, batch=1, context=4096, bpe=2, kernels=1500, launch_s=4e-6, graphs=False):
    return predict_step_s(cfg, gpu, batch, context, bpe, kernels, launch_s, graphs)


_t = _p()
check_equal(isinstance(_t, float) and math.isfinite(_t) and _t > 0, True, f"a positive number of seconds ({_t!r})")
if not _big["params"] * 2 / _h100["bandwidth"] <= _t < 1.0:
    raise AssertionError(f"70B in 16 bits at batch 1 on an H100: {_t} s is not between the time to read its weights "
                         "once and a second")
if not (_p(context=8192) > _t and _p(batch=8) > _t and _p(bpe=1) < _t):
    raise AssertionError("a longer context or a bigger batch must cost more, 8-bit numbers less")
check_close(_p(cfg=dict(_big, num_attention_heads=128)), _t,
            "the same model with twice the query heads and the same KV heads: the KV cache it reads is the same")
check_close(_p(gpu=dict(_h100, peak_flops=2 * 989e12)), _t,
            "a memory-bound step on a card with twice the FLOP/s: as long as before")
check_close(_p(launch_s=1e-6, kernels=10), _t, "ten launches of 1 us each, hidden behind a 70B model's step")
_small = dict(params=135e6, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
              hidden_size=576)
if not _p(cfg=_small, graphs=True) < _p(cfg=_small):
    raise AssertionError("a 135M model's 1500 launches of 4 us: CUDA graphs must make the step shorter")
for _bad in (dict(batch=0), dict(batch=1.5), dict(context=-1), dict(kernels=0), dict(launch_s=-1e-6),
             dict(gpu=dict(_h100, bandwidth=0.0)), dict(bpe=0)):
    check_raises(lambda: _p(**_bad), ValueError, f"predict_step_s with {_bad}")
print("Part D: visible tests passed")

# %% [markdown] id="c018"
# Now measure: your Part A step on the fixed tiny model (fp32 weights, 4 bytes each), timed eager on this
# machine, beside your prediction for it. On a GPU the cell takes the card's numbers from the course's table;
# on a CPU it measures this machine (bandwidth, a matmul's FLOP/s, as in lab 01). It uses the measured cost of
# one tiny operator as `launch_s` (a launch on a GPU; on a CPU an operator's fixed cost plays that part) and
# your Part B count of top-level operators as `kernels`. A timing: shown, never asserted.

# %% id="c019"
try:
    if os.environ.get("NBGRADER_EXECUTION"):   # a measurement, not a test: the grader skips it
        raise RuntimeError("the measurement is skipped while grading")
    _cfg = dict(vars(model.config), params=sum(p.numel() for p in model.parameters()))
    try:                                       # a GPU's datasheet where the course's table has it ...
        _dev = get_gpu(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    except ValueError:
        _dev = None
    if _dev is None:                           # ... else this machine, measured (as in lab 01)
        _dev = device_bench.measure_device(quick=True)
    _gpu = {"bandwidth": _dev.bandwidth, "peak_flops": _dev.peak_flops("fp32")}
    _where = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _m = tiny_model().to(_where)               # the fixed model, on the device the roofline describes
    _launch = device_bench.op_overhead(_where)  # one tiny op: a launch on a GPU, a dispatch on a CPU
    with profile(activities=[ProfilerActivity.CPU]) as _prof, torch.no_grad():
        _k, _v = static_caches(model, 1, 16)
        static_step(model, torch.tensor([[5]]), torch.tensor(0), _k, _v)
    _ops = round(read_trace(trace_events(_prof), 1)["ops_per_token"])
    for _B in (1, 8):
        _pred = predict_step_s(_cfg, _gpu, _B, 4, 4, _ops, _launch, False)
        _roof = predict_step_s(_cfg, _gpu, _B, 4, 4, 1, 0.0, True)       # the roofline alone
        _k, _v = static_caches(_m, _B, 16)
        _tok, _pos = torch.randint(0, 128, (_B, 1), device=_where), torch.tensor(4, device=_where)
        with torch.no_grad():
            _t = benchmark(static_step, _m, _tok, _pos, _k, _v, warmup=2, repeats=15, device=_where)
        print(f"batch {_B}: roofline {_roof * 1e6:7.2f} us, with {_ops} ops x {_launch * 1e6:.2f} us "
              f"{_pred * 1e6:7.1f} us, measured {_t.median * 1e6:7.1f} us (x{_t.median / _pred:.1f} of the "
              f"prediction) on {_dev.name}")
except NotImplementedError:
    print("finish the exercises first")
except RuntimeError as e:
    print(e)

# %% [markdown] id="c025"
# ## Part E · Written: what your trace and your measurement show (2 points)
#
# Answer in the cell below, in a short paragraph (about 150 words), from **your own** numbers: the trace of
# Part B's last cell and the measurement above. (They are of two models: Part B traces the bundled `tiny`,
# 4 layers; the measurement times your step on the lab's fixed 2-layer model. Compare each with its own.)
#
# * Which operator takes the most self time in your trace, what share, and how many top-level operators (and,
#   on a GPU, kernels) one token costs; what that says about where a step of a model this size spends its
#   time. (1 point)
# * By what factor your measured step differs from your Part D prediction, and why: what the model leaves
#   out or gets wrong on this machine, and what, from Module 12, would close the gap (say which of these
#   your numbers support). (1 point)
#
# Graded by the instructor; quote your numbers.

# %% [markdown] id="c026" nbgrader={"grade": true, "grade_id": "written_trace", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# On this CPU run (one thread) the trace of four steps of `tiny` puts `aten::mm` first, at 56% of the aten
# self time (172 calls: the linears, 7 per layer and the head), and the other 44% is spread over dozens of
# small operators (`cat` and `mul` of RoPE, `where` of the cache update, `transpose`, `view`, the attention),
# 403 top-level operators per token and no kernels (a CPU). So even on a model whose matmuls are real work,
# almost half of the step is the fixed cost of hundreds of operators that compute almost nothing; on a GPU the
# same 403 would be 403 kernel launches per token.
#
# The measured step of the lab's 2-layer model was 585 us against my prediction of 157 us (165 operators at
# the 0.95 us a tiny add costs): 3.7x, and about 80x the roofline alone (7 us: a few hundred kilobytes of
# weights). The roofline counts bytes and FLOPs, which are tiny here; what dominates is the per-operator cost,
# and my prediction undercounts it because a matmul or the attention costs several microseconds of fixed work,
# not the 0.95 us of an add (585 / 165 = 3.5 us per operator). Fewer operators would close the gap: fusing
# them with `torch.compile` (notebook 12 counts several times fewer kernels) and, on a GPU, CUDA graphs, one
# launch per step, which my Part A step allows because it is one static graph.

# %% [markdown] id="c012"
# ## Putting it together (not graded)
#
# Your step, timed eager through a whole decode of the fixed model, and the table of a stack like the
# capstone's (numbers from a CPU run of Module 12, rounded).

# %% id="c013"
try:
    with torch.no_grad():
        _k, _v = static_caches(model, 8, 24)
        _tok = torch.randint(0, 128, (8, 1))
        _t0 = time.perf_counter()
        for _p in range(20):
            _logits, _k, _v = static_step(model, _tok, torch.tensor(_p), _k, _v)
            _tok = _logits.argmax(-1, keepdim=True)
        print(f"static_step: {(time.perf_counter() - _t0) / 20 * 1e3:6.2f} ms per step (batch 8, eager)")
    for _r in attribution([("no cache", 80.0), ("KV cache", 175.0), ("static cache + compile", 320.0),
                           ("speculative (tiny-draft)", 200.0), ("continuous batching", 560.0)], 0.10):
        print(f"{_r['step']:26s} {_r['tokens_per_s']:7.1f} tok/s  x{_r['speedup']:5.2f}  share {_r['share']:6.1%}  "
              f"${_r['usd_per_1M']:.3f}/1M")
except NotImplementedError:
    print("finish the exercises first")

# %% [markdown] id="c014"
# ## Going further (not graded)
#
# * Compile your `static_step` with `torch.compile(static_step, fullgraph=True)` and time it against eager
#   (the first call compiles: time the later ones). On a GPU, add `mode="reduce-overhead"`.
# * Put the steps of the table in another order (batching before speculative decoding): do the shares
#   change? Which numbers would you need to measure again?
# * Compute the shares linearly, `(speedup - 1) / (S - 1)`: why do they not add up to 1?

# %% [markdown] id="c021" tags=["answer-key"]
# ### Answer key
#
# * **Compile and time.** `step = torch.compile(static_step, fullgraph=True)` succeeds because the step is one
#   graph (`fullgraph=True` raises at the first break). The first call compiles (about a minute on two CPU
#   cores); the later ones reuse it at every position, since the position is a tensor. Time them with
#   `course_lib.perf.timing.compare`. On a CPU the compiled step of this tiny model is faster by roughly the
#   per-operator overhead that fusion removes (Part B counts the operators; notebook 12, section 4: most of an
#   eager step of a small model is dispatch overhead, a few us per op); the gain is well under a millisecond
#   per step, so the compile pays back only after thousands of tokens. On a GPU with `mode="reduce-overhead"`
#   (CUDA graphs) the gain is several-fold, because the eager step is a chain of launches and the graph is
#   one.
# * **Another order.** The shares change, because a step's speed-up depends on what is already in the
#   stack: speculative decoding pays off when a step is memory-bound (batch 1: verifying several tokens costs
#   about one step), and batching makes the step more compute-bound, so speculative decoding placed after
#   batching gains less (or loses more: in the table it is already below 1, x0.63) and batching placed before
#   it gains more. Only the total, last over first, stays the same if the final configuration is the same.
#   You must measure again every configuration that did not exist before: each prefix of the new order
#   after the first moved step (here "KV cache + compile + batching"); the shares cannot be computed from
#   the old measurements, because speed-ups do not commute in general.
# * **Linear shares.** Speed-ups multiply: the total is the product S = s1 * s2 * ... * sn, and
#   log S = sum of log si, so log-scale shares add up to 1 exactly. Linear shares add the si - 1, and
#   sum(si - 1) != prod(si) - 1 unless at most one step changes anything: for the speed-ups of Part B's
#   visible test, 4, 1.25, 0.8 and 10 (S = 40) they are 3/39, 0.25/39, -0.2/39 and 9/39, which sum to 12.05/39 = 0.31, not 1. They
#   also make the order matter more: the same factor 10 counts as 9/39 here, but as 9/(S - 1) of a smaller
#   total elsewhere.
