# %% [markdown] id="c002"
# # Lab 12 · A graph break, where the speed-up comes from, and what a step should cost
#
# Three skills from Module 12:
#
# * **Part A (4 points, contract): remove a graph break.** A decode step that `torch.compile` cannot trace
#   in one piece: you find the break with `torch._dynamo.explain` and design a step, specified by its
#   contract, that has none and returns exactly what the original returns.
# * **Part B (4 points): the attribution table.** From a list of `(step, tokens/s)` measurements, compute
#   each step's speed-up over the previous one, its share of the total speed-up on a log scale, and the cost
#   per 1M tokens.
# * **Part C (2 points): predict a decode step's time.** From the roofline of Module 01, before you time one;
#   then the measured step shows what the roofline leaves out (the per-operator overhead, launch overhead on
#   a GPU).
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, the grader also calls your
#   functions on inputs of its own (models it draws for you, random timings and devices, and an edge grid),
#   so meet the specification exactly.
# * Do not call `course_lib.capstone.attribution_table` in Part B or `course_lib.perf.roofline` in Part C:
#   the grader compares your results with them, flags an answer that imports them, and while it grades, they
#   are not in the library. Everything runs on a CPU in seconds. Total: 10 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os
import time

import torch

from course_lib import device_bench
from course_lib.compile_tools import explain_breaks
from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config
from course_lib.perf.hardware import get_gpu
from course_lib.perf.timing import benchmark


def tiny_model(seed=0, vocab=128):
    """A one-layer model, small enough for explain to take a second."""
    torch.manual_seed(seed)
    cfg = as_config(dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64))
    return LlamaForCausalLM(cfg).eval()


@torch.inference_mode()
def prefilled(model, prompts):
    """A StaticCache holding `prompts` ([B, T] token ids) and the last token of each, [B, 1]: the inputs of
    the next decode step."""
    cache = StaticCache.for_model(model, prompts.shape[0], 48)
    model(prompts, cache=cache)
    return prompts[:, -1:], cache


model = tiny_model()

# Known misconceptions: a test that recognises one names it (public text, pointing to the notebooks)
MISTAKES = {
    "host_sync": "a conversion of a tensor to Python values (.tolist(), int(), .item(), .cpu().numpy()) needs "
                 "the value on the host, so dynamo ends the graph there wherever in the function it happens: "
                 "moving it is not removing it, stay in tensors up to the result; see notebook 12, section "
                 "'2. Graph breaks'",
    "linear_shares": "speed-ups multiply, so each step's share is taken on a log scale, log(speedup) / log(S); "
                     "linear shares (speedup - 1) / (S - 1) do not add up to 1; see notebook 12, section "
                     "'6. The capstone: every optimization on one model'",
    "sum_not_max": "the roofline's time is the larger of the memory time and the compute time (the device reads "
                   "and computes at the same time), not their sum; see notebook 01, section '5. Rooflines: T4, "
                   "L4, A100, H100, H200 and this machine'",
}


def _moved_break(model, tok, cache):
    """A known wrong answer to Part A: the argmax stays a tensor, then .tolist() leaves the graph."""
    logits = model(tok, cache=cache)[:, -1, :]
    return torch.tensor(logits.argmax(dim=-1).tolist(), device=tok.device).unsqueeze(-1)


# %% [markdown] id="c004"
# ## Part A · Remove a graph break (4 points, contract)
#
# Here is a greedy decode step as one might write it first. It takes the last token of each sequence
# `tok` ([B, 1]) and a `StaticCache` holding the sequences so far, runs the model for one position (which
# also writes the new K/V into the cache), and returns the next token of each sequence, [B, 1], int64:

# %% id="c005" nbgrader={"grade": false, "grade_id": "provided_step", "locked": true, "schema_version": 3, "solution": false, "task": false}
def decode_step_with_break(model, tok, cache):
    logits = model(tok, cache=cache)[:, -1, :]            # [B, V]: the logits of the last position
    next_ids = []
    for row in logits:                                   # one sequence at a time
        next_ids.append(int(row.argmax()))               # its best token as a Python int
    return torch.tensor(next_ids, device=tok.device).unsqueeze(-1)     # [B, 1]


with torch.inference_mode():
    _tok, _cache = prefilled(model, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    report = explain_breaks(decode_step_with_break, model, _tok, _cache)
print(f"graphs: {report['graph_count']}, graph breaks: {report['graph_break_count']}")
for _r in report["break_reasons"]:
    print("  ", _r)


# %% [markdown] id="c006"
# `torch._dynamo.explain` (wrapped here by `explain_breaks`) ran the step under dynamo and found the
# break(s) printed above, with the line that causes each. Read the reason: which call needs the tensor's
# value in Python?
#
# **Contract.** `decode_step(model, tok, cache)`:
#
# * *inputs*: a course model, `tok` `[B, 1]` int64 (the last token of each of `B` sequences, any `B >= 1`), a
#   `StaticCache` holding the sequences so far;
# * *output*: the next token of each sequence, **exactly the tensor** `decode_step_with_break` returns: the
#   same values, shape `[B, 1]`, dtype int64, on `tok`'s device;
# * *side effect*: the cache advances exactly as the provided step advances it (the model is called once,
#   through the cache);
# * *the point*: `explain` reports `graph_break_count == 0`: the whole step is one graph, with no host
#   sync inside;
# * *errors*: `ValueError` if `tok` is not 2-D with one column, before the model runs (the cache unchanged).
#
# <details><summary>Hint</summary>
#
# Stay in tensors from the logits to the result: `argmax` works on a whole batch at once, and `keepdim`
# keeps the last axis. Moving the conversion somewhere else in the function (`.tolist()`,
# `.cpu().numpy()`, `int(...)`) is still a break. A shape check (`tok.dim()`, `tok.shape[1]`) is not: shapes
# are known while tracing.
#
# </details>

# %% id="c007" nbgrader={"grade": false, "grade_id": "step_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def decode_step(model, tok, cache):
    ### BEGIN SOLUTION
    if tok.dim() != 2 or tok.shape[1] != 1:
        raise ValueError(f"tok must be [B, 1] (the last token of each sequence), got {tuple(tok.shape)}")
    logits = model(tok, cache=cache)[:, -1, :]            # [B, V]
    return logits.argmax(dim=-1, keepdim=True)            # [B, 1] int64, stays on the device
    ### END SOLUTION


# %% id="c008" nbgrader={"grade": true, "grade_id": "step_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _compare_steps(m, prompts, what):
    with torch.inference_mode():
        tok_a, cache_a = prefilled(m, prompts)
        tok_b, cache_b = prefilled(m, prompts)
        want = decode_step_with_break(m, tok_a, cache_a)
        got = decode_step(m, tok_b, cache_b)
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: decode_step must return a tensor, got {type(got).__name__}")
    check_shape(got, tuple(want.shape), f"{what}: the shape of decode_step's result")
    check_equal(got.dtype, want.dtype, f"{what}: the dtype of decode_step's result")
    check_equal(got, want, f"{what}: the next tokens")
    # the cache must have advanced exactly as the provided step advanced it
    with torch.inference_mode():
        check_equal(decode_step_with_break(m, want, cache_b), decode_step_with_break(m, want, cache_a),
                    f"{what}: the step after yours (did decode_step call the model once, through the cache?)")


def _breaks(m, prompts):
    with torch.inference_mode():
        tok, cache = prefilled(m, prompts)
        return explain_breaks(decode_step, m, tok, cache)


_compare_steps(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), "batch of 2 on the fixed model")
_compare_steps(model, torch.tensor([[7, 8, 9, 10, 11]]), "batch of 1 on the fixed model")
_rep = _breaks(model, torch.tensor([[1, 2, 3], [4, 5, 6]]))
with torch.inference_mode():
    _tok, _cache = prefilled(model, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    _moved = explain_breaks(_moved_break, model, _tok, _cache)["graph_break_count"]
check_equal(_rep["graph_break_count"], 0, "graph breaks in decode_step (" + "; ".join(_rep["break_reasons"]) + ")",
            mistakes={MISTAKES["host_sync"]: _moved})
with torch.inference_mode():
    _tok, _cache = prefilled(model, torch.tensor([[1, 2, 3]]))
    check_raises(lambda: decode_step(model, _tok.view(-1), _cache), ValueError, "decode_step with tok of shape [1]")
print(f"Part A: visible tests passed (1 graph, {_rep['op_count']} ops, no break)")

# %% [markdown] id="c009"
# Why it matters: each break is a host sync (the CPU waits for the device to produce the value) and splits
# the step into smaller graphs, so inductor fuses less and CUDA graphs cannot capture the step as a whole.
#
# ## Part B · The attribution table (4 points)
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
print("Part B: visible tests passed")

# %% [markdown] id="c015"
# ## Part C · Predict a decode step's time (2 points)
#
# Module 01's roofline, applied to one decode step of `batch` sequences: the step reads every weight once
# (`params * bytes_per_param` bytes) and the sequences' KV caches once (`kv_bytes`), and does one
# multiply-add (2 FLOPs) per weight per sequence. A device that streams `bandwidth` bytes/s and computes
# `peak_flops` FLOP/s does both at once, so the step takes the time of whichever side is slower.
#
# Write `predict_decode_step_s(params, bytes_per_param, batch, kv_bytes, bandwidth, peak_flops)`: that time
# in seconds. Raise `ValueError` if `params`, `bytes_per_param`, `bandwidth` or `peak_flops` is not
# positive, `batch` is not an integer >= 1, or `kv_bytes` is negative.
#
# Example: a 7B model (6.74e9 parameters) in fp16 at batch 1 on an A100 80 GB (2.039e12 B/s) reads 13.5 GB
# per step: 6.6 ms, whatever the FLOP rate.

# %% id="c016" nbgrader={"grade": false, "grade_id": "predict_step_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_decode_step_s(params, bytes_per_param, batch, kv_bytes, bandwidth, peak_flops):
    ### BEGIN SOLUTION
    for name, v in (("params", params), ("bytes_per_param", bytes_per_param), ("bandwidth", bandwidth),
                    ("peak_flops", peak_flops)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    if not kv_bytes >= 0:
        raise ValueError(f"kv_bytes must be >= 0, got {kv_bytes!r}")
    memory_s = (params * bytes_per_param + kv_bytes) / bandwidth
    compute_s = 2 * params * batch / peak_flops
    return max(memory_s, compute_s)                       # the two overlap: the slower side is the step
    ### END SOLUTION


# %% id="c017" nbgrader={"grade": true, "grade_id": "predict_step_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# an A100 80 GB: 2.039e12 B/s, 312e12 FLOP/s in fp16
check_close(predict_decode_step_s(6.74e9, 2, 1, 0, 2.039e12, 312e12), 6.74e9 * 2 / 2.039e12,
            "predict_decode_step_s: 7B in fp16, batch 1, A100 (memory-bound)",
            mistakes={MISTAKES["sum_not_max"]: 6.74e9 * 2 / 2.039e12 + 2 * 6.74e9 / 312e12})
check_close(predict_decode_step_s(6.74e9, 2, 512, 0, 2.039e12, 312e12), 2 * 6.74e9 * 512 / 312e12,
            "predict_decode_step_s: 7B in fp16, batch 512, A100 (compute-bound)",
            mistakes={MISTAKES["sum_not_max"]: 6.74e9 * 2 / 2.039e12 + 2 * 6.74e9 * 512 / 312e12})
check_close(predict_decode_step_s(6.74e9, 2, 8, 8 * 2**30, 2.039e12, 312e12), (6.74e9 * 2 + 8 * 2**30) / 2.039e12,
            "predict_decode_step_s: batch 8 with 8 GiB of KV cache to read")
for _bad in ((0, 2, 1, 0, 1e12, 1e14), (1e9, 2, 0, 0, 1e12, 1e14), (1e9, 2, 1, -1, 1e12, 1e14),
             (1e9, 2, 1, 0, 0, 1e14), (1e9, 2, 1.5, 0, 1e12, 1e14)):
    check_raises(lambda: predict_decode_step_s(*_bad), ValueError, f"predict_decode_step_s{_bad}")
print("Part C: visible tests passed")

# %% [markdown] id="c018"
# Now measure: your `decode_step` on the fixed tiny model of Part A (fp32 weights, 4 bytes each), timed on
# this machine, beside the roofline's prediction. On a GPU the cell takes the card's numbers from the
# course's table; on a CPU it assumes 20 GB/s and 200 GFLOP/s (a laptop; put in yours). A timing: shown,
# never asserted. The gap is what the roofline leaves out: the fixed cost of each operator (Python, the
# dispatcher, on a GPU each kernel's launch), which dominates a model this small.

# %% id="c019"
try:
    if os.environ.get("NBGRADER_EXECUTION"):   # a measurement, not a test: the grader skips it
        raise RuntimeError("the measurement is skipped while grading")
    _params = sum(p.numel() for p in model.parameters())
    try:                                       # a GPU's datasheet where the course's table has it ...
        _dev = get_gpu(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    except ValueError:
        _dev = None
    if _dev is None:                           # ... else this machine, measured (as in lab 01)
        _dev = device_bench.measure_device(quick=True)
    _bw, _peak, _where = _dev.bandwidth, _dev.peak_flops("fp32"), _dev.name
    _preds = {_B: predict_decode_step_s(_params, 4, _B, 0, _bw, _peak) for _B in (1, 8)}
    with torch.inference_mode():
        _measured = {}
        for _B in _preds:
            _tok, _cache = prefilled(model, torch.randint(0, 128, (_B, 4)))
            _measured[_B] = benchmark(decode_step, model, _tok, _cache, warmup=2, repeats=15)
        _ops = _breaks(model, torch.tensor([[1, 2, 3]]))["op_count"]
    for _B, _pred in _preds.items():
        _t = _measured[_B]
        print(f"batch {_B}: roofline {_pred * 1e6:8.2f} us, measured {_t.median * 1e6:8.1f} us "
              f"(x{_t.median / _pred:,.0f}; {(_t.median - _pred) / _ops * 1e6:.1f} us for each of {_ops} ops "
              f"if the gap is per-operator overhead) on {_where}")
except NotImplementedError:
    print("finish the exercises first")
except RuntimeError as e:
    print(e)

# %% [markdown] id="c012"
# ## Putting it together (not graded)
#
# Your step and your table on a small measurement: the provided step and yours, timed eager on the fixed
# model, then the table of a stack like the capstone's (numbers from a CPU run of Module 12, rounded).

# %% id="c013"
try:
    with torch.inference_mode():
        _times = {}
        for _fn in (decode_step_with_break, decode_step):
            _tok, _cache = prefilled(model, torch.randint(0, 128, (8, 4)))
            _t0 = time.perf_counter()
            for _ in range(20):
                _tok = _fn(model, _tok, _cache)
            _times[_fn.__name__] = (time.perf_counter() - _t0) / 20
    for _k, _v in _times.items():
        print(f"{_k:24s} {_v * 1e3:6.2f} ms per step (batch 8, eager)")
    for _r in attribution([("no cache", 80.0), ("KV cache", 175.0), ("static cache + compile", 320.0),
                           ("speculative (tiny-draft)", 200.0), ("continuous batching", 560.0)], 0.10):
        print(f"{_r['step']:26s} {_r['tokens_per_s']:7.1f} tok/s  x{_r['speedup']:5.2f}  share {_r['share']:6.1%}  "
              f"${_r['usd_per_1M']:.3f}/1M")
except NotImplementedError:
    print("finish the exercises first")

# %% [markdown] id="c014"
# ## Going further (not graded)
#
# * Compile your `decode_step` with `torch.compile(decode_step, fullgraph=True)` and time it against eager
#   (the first call compiles: time the later ones).
# * Put the steps of the table in another order (batching before speculative decoding): do the shares
#   change? Which numbers would you need to measure again?
# * Compute the shares linearly, `(speedup - 1) / (S - 1)`: why do they not add up to 1?

# %% [markdown] id="c021" tags=["answer-key"]
# ### Answer key
#
# * **Compile and time.** `step = torch.compile(decode_step, fullgraph=True)` succeeds because the step has
#   no break (`fullgraph=True` raises at the first break: the original step fails there). The first call
#   compiles (seconds); time the later ones through a fresh prefilled cache, e.g. with
#   `course_lib.perf.timing.compare`. On a CPU the compiled step of this one-layer model is faster by
#   roughly the per-operator overhead that fusion removes (notebook 12, section 4: most of an eager step of a
#   small model is dispatch overhead, a few us per op); the gain is well under a millisecond per step, so
#   the compile pays back only after thousands of tokens. On a GPU with `mode="reduce-overhead"` (CUDA
#   graphs) the gain is several-fold, because the eager step is a chain of launches.
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
