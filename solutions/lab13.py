# %% [markdown] id="c002"
# # Lab 13 · The final project: make generation fast without changing it
#
# Module 12's capstone stacked the course's optimizations on one model. Now it is your turn, graded and on a
# leaderboard: make greedy generation on the course's model **as fast as you can, without changing its
# output**.
#
# * **Part A (6 points, contract): a fast `build(model)`.** You write one function; the grader checks its
#   tokens on prompts you have never seen and times it against the course's baseline, which runs in a clean
#   process of the grader's, round by round, each call timed from outside both. The points come from the
#   speed-up by a fixed scale; the leaderboard ranks everyone by the same number.
# * **Part B (2 points): predict the attention work a KV cache saves**, with and without a sliding window.
# * **The report (ungraded, shown on the leaderboard):** one line saying what you did, then what you
#   measured and what did not work.
#
# On a CPU the model is the bundled `tiny` (the course's hub switch loads SmolLM2-135M on a GPU), prompts
# of 64 tokens, 16 new tokens. Write your code between the `# YOUR CODE HERE` markers (delete the
# `raise NotImplementedError()`). Total: 10 points, 2 of them your report, which your instructor grades
# (Part C).

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

import torch

import course_lib
from course_lib.capstone import (BPB_BOUND, PROJECT_POINTS, RATIO_FLOOR, RATIO_FULL, baseline_build,
                                 evaluate_project, project_prompts, speed_points)
from course_lib.checks import check_equal, check_raises
from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache, StaticCache
from course_lib.models import LlamaForCausalLM, as_config, load

QUICK = course_lib.env.quick()
MODEL = "tiny" if QUICK else "smollm2-135m"     # the bundled model on a CPU, SmolLM2-135M on a GPU
PROMPT_LEN = 64 if QUICK else 256               # tokens per prompt
NEW_TOKENS = 16 if QUICK else 64                # tokens generated per prompt
VISIBLE_ROUNDS = 4                              # timed rounds of the visible test (the grader runs 6 to 30)
if QUICK:
    torch.set_num_threads(1)                    # one thread: less noise on a shared CPU (the same for both sides)
model, tokenizer = load(MODEL, device=course_lib.env.device())
model.eval()
VISIBLE_PROMPTS = project_prompts(tokenizer, 1 + VISIBLE_ROUNDS, PROMPT_LEN, seed=0, split="train")

# Known misconceptions: a test that recognises one names it (public text, pointing to the notebooks)
MISTAKES = {
    "state_between_calls": "generate_fn kept per-prompt state (a KV cache holding the last prompt's keys and "
                           "values) from one call to the next, so the next prompt attends to the previous one: "
                           "keep between calls only what depends on the model alone (weights, compiled code, "
                           "buffers you reset), make a fresh cache per prompt; see notebook 05, section "
                           "'2. A KV cache from scratch'",
    "last_token_fed": "the last new token is never fed back to the model (nothing comes after it), so a cached "
                      "loop feeds the prompt once and then new_tokens - 1 single tokens; see notebook 05, section "
                      "'3. What one token costs, with and without the cache'",
    "no_causal_mask": "every query scored against every key of its forward, the later ones too: causal attention "
                      "scores a query at position j against keys 0..j only (the mask removes the rest); see "
                      "notebook 05, section '3. What one token costs, with and without the cache'",
    "window_ignored": "the window left out: with a sliding window of W, a query scores at most its W most recent "
                      "keys (itself included), in the recompute loop as in the cached one; see notebook 05, "
                      "section '6.2 Sliding window'",
}


def _stale_cache_build(model):
    """A known wrong answer to Part A: one KV cache for every call, never emptied."""
    cache = ContiguousCache()

    def generate_fn(prompt_ids, max_new_tokens):
        x, out = prompt_ids.to(next(model.parameters()).device).view(1, -1), []
        for _ in range(max_new_tokens):
            tok = model(x, cache=cache)[0, -1].argmax()
            out.append(tok)
            x = tok.view(1, 1)
        return torch.stack(out).cpu()
    return generate_fn


def _stale_outputs(model, prompts):
    """What `_stale_cache_build` gives on `prompts`, called in order (None where it fails: its cache outgrows
    the model's context)."""
    fn, outs = _stale_cache_build(model), []
    with torch.inference_mode():
        for p in prompts:
            try:
                outs.append(fn(p.clone(), NEW_TOKENS).tolist())
            except Exception:  # noqa: BLE001 - evaluate_project records such a call as None too
                outs.append(None)
    return outs


# The template's entry: the course's baseline, correct and as slow as the baseline (no speed points).
# Redefine build in the answer cell below.
build = baseline_build


# %% [markdown] id="c004"
# ## Part A · A fast generate (6 points, contract)
#
# The course's baseline, `baseline_build(model)`, returns `generate(model, prompt_ids, n).tokens`: greedy,
# and with no KV cache, so every step runs the model over the whole sequence so far. Beat it.
#
# **Contract.** `build(model) -> generate_fn`, and `generate_fn(prompt_ids, max_new_tokens) -> tokens`:
#
# * *inputs*: `model`, the course model `load(MODEL)` gives, in eval mode on its device (a CPU here, a GPU
#   with SmolLM2); `prompt_ids`, a 1-D `int64` tensor of token ids on the CPU (64 of them here);
#   `max_new_tokens`, an int >= 1 (16 here). Calls are made under `torch.inference_mode()`;
# * *output*: exactly `max_new_tokens` token ids, a 1-D integer tensor (on any device) or a list of ints:
#   **the tokens the baseline gives for that prompt**, token for token (greedy, no early stop at EOS, the
#   prompt not included);
# * *what may be kept between calls*: whatever depends on the model alone and is made in `build` (a copy of
#   the weights in another layout, compiled code, preallocated buffers that you reset before each prompt);
#   never anything that depends on an earlier prompt. Every timed prompt is new to `generate_fn`, so a
#   cache of outputs gains nothing;
# * *forbidden*: changing `model` (its weights, buffers or modules: copy it first) and reading the grader's
#   files: each makes the entry incorrect. Torch's global settings (threads, grad mode, default dtype) stay
#   as they are too: the visible test runs the baseline in your process and refuses an entry that changes them
#   (the grader's baseline runs elsewhere and does not care). Work left running in the background gains
#   nothing: it is charged to you (below);
# * *lossy entries* (int8 weights, a pruned model, ...): give `generate_fn` an attribute `lossy_model`, the
#   model it decodes greedily (a model whose call on token ids of shape [1, T] returns logits [1, T, vocab]).
#   Its tokens are then checked against `lossy_model`'s greedy ones (the grader asks your kernel for
#   `lossy_model`'s logits on each prompt followed by your tokens and takes the argmax itself), and
#   `lossy_model`'s bits per byte on held-out text, within the model's context, computed by the grader from
#   the logits `lossy_model` gives, may exceed `model`'s by at most `BPB_BOUND` (0.05). The speed-up is still
#   against the baseline on `model`;
# * *how it is graded*: your notebook runs in a sandboxed kernel; the course's baseline runs in a second,
#   clean kernel of the grader's (another user, none of your code: nothing your process does to itself
#   reaches it). After `build` returned, the grader cuts each prompt from held-out text only when it sends it,
#   new to both kernels, and checks every output against the baseline's tokens and the rules above. It times
#   rounds: in each, one new prompt to the baseline and to you, the order alternating. The clock is each
#   kernel's **CPU time**, read from outside it (its cgroup's counter) over the whole round, so CPU your
#   kernel spends while the baseline runs counts as yours, and waiting for a busy core counts for no one.
#   The speed-up is the geometric mean of the per-round ratios (baseline CPU / yours) with its 90%
#   confidence interval; rounds go on (6 to 30) until that interval is about +-5%. The points are
#   `speed_points` of the interval's **lower end**: none at or below 1.2x, all 6 at 2x or more, linear in
#   log(speed-up) between, rounded down to half points. An entry that is not correct scores no points at all,
#   however fast. The leaderboard ranks by the same interval (entries whose intervals overlap tie) and marks
#   for review an entry whose measurement looks wrong (a call that did no work, CPU used in the background,
#   rounds spread far beyond the noise, a wall-clock speed-up far below the CPU one);
#
# The visible test below runs a rough copy of the evaluation in your kernel (`evaluate_project`: the baseline
# in your own process, CPU time, one check and four timed rounds on fixed prompts, the same statistic).
#
# <details><summary>Hint 1: where the baseline's time goes</summary>
#
# Step i of the baseline runs the model on 64 + i positions to use the last one. Module 05's KV cache
# (`generate(..., cache="contiguous")`, or your own loop over a `ContiguousCache`) runs each step on one.
#
# </details>
# <details><summary>Hint 2: what else the course taught</summary>
#
# * a static cache and `torch.compile` of the decode step (Module 12: `generate(..., compile=True)`): worth
#   it on a GPU, where launch overhead dominates. On a CPU, mind the cost: the first compiled call compiles
#   (tens of seconds with an empty compile cache, which is how the grader's kernel starts), each call the
#   grader makes has a limit of 60 s, and the compiled step gains little over a lean eager loop on this small
#   model. If you use it, compile in `build` (one call on a dummy prompt) and measure both;
# * the per-step overhead of `generate` itself (its trace, its checks): a lean loop of your own;
# * speculative decoding [@leviathan2023fast; @chen2023accelerating] with the bundled `tiny-draft`, or prompt
#   lookup [@saxena2023prompt] (Module 08: exact at temperature 0);
# * int8 weights (Module 03) is lossy: declare it with `lossy_model`.
#
# </details>

# %% id="c005" nbgrader={"grade": false, "grade_id": "build_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
def build(model):
    """The reference entry: a KV cache (Module 05), a fresh one per prompt, in a lean greedy loop (no trace,
    no per-call checks); the prefill runs once, then one position per step."""
    device = next(model.parameters()).device

    def generate_fn(prompt_ids, max_new_tokens):
        cache = ContiguousCache()                          # per prompt: nothing carries over between calls
        x, out = prompt_ids.to(device).view(1, -1), []
        for _ in range(max_new_tokens):
            tok = model(x, cache=cache)[0, -1].argmax()    # greedy, stays on the device
            out.append(tok)
            x = tok.view(1, 1)
        return torch.stack(out).cpu()                      # one copy to the host, at the end
    return generate_fn
### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "speed_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
_result = evaluate_project(build, model, VISIBLE_PROMPTS, NEW_TOKENS, rounds=VISIBLE_ROUNDS, tokenizer=tokenizer)
print(_result.describe())
_evaluated = [(_result, VISIBLE_PROMPTS, "the visible prompts")]   # checked below, after every evaluation
for _res, _prompts, _which in _evaluated:
    _known = {MISTAKES["state_between_calls"]: _stale_outputs(model, _prompts)} if _res.outputs != _res.expected else {}
    check_equal(_res.outputs, _res.expected, f"your tokens on {_which} ({_res.problem or 'ok'})", mistakes=_known)
    if not _res.correct:
        raise AssertionError(f"on {_which}: {_res.problem}")
_evaluated[-1][0].points   # the speed points of the visible evaluation (the grader measures its own)


# %% [markdown] id="c007"
# ## Part B · Predict the attention work a KV cache saves (2 points)
#
# Notebook 05 counts what a KV cache saves per token of the whole model. Here you count one part of it, the
# attention scores, where the saving is largest, and under a sliding window (notebook 05, section 6.2),
# where it is not what it seems. Count **(query, key) pairs**: one score of one query against one key in
# one layer and head. A query at position `j` (0-based) scores the keys at positions `j - W + 1` to `j` that
# exist (itself included), where `W` is the window; without a window (`window=None`), keys 0 to `j`.
#
# To generate `new_tokens` greedily after a prompt of `prompt_len` tokens:
#
# * the **recompute loop** (no cache) runs the model on the whole sequence so far at every step (the prompt,
#   then the prompt and one generated token, ...), and every position of every step is a query;
# * a **KV-cached loop** feeds the prompt once, then each generated token once (the last one is never fed:
#   nothing comes after it); only the tokens it feeds are queries, against the keys in the cache and their own.
#
# Write `predict_attention_pairs(prompt_len, new_tokens, window=None) -> (recompute_pairs, cached_pairs)`,
# two ints. Raise `ValueError` unless `prompt_len` and `new_tokens` are integers >= 1 and `window` is
# `None` or an integer >= 1. The grader draws its own lengths and windows and counts the pairs of both loops
# score by score.
#
# <details><summary>Hint 1: one query at a time</summary>
#
# What a query costs depends only on its position and the window, not on which loop fed it. So count, for
# each loop, how many times a query at each position is computed. Pitfall: a query is never scored against
# the keys after it, even when they are in the same forward.
# </details>
#
# <details><summary>Hint 2: the window</summary>
#
# A window caps the cost of a query, so the cached loop's cost per token stops growing; the recompute loop's
# cost per step still grows. Check your sums on a window of 1 and on a window longer than the sequence.
# </details>

# %% id="c008" nbgrader={"grade": false, "grade_id": "predict_positions_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_attention_pairs(prompt_len, new_tokens, window=None):
    ### BEGIN SOLUTION
    for name, v in (("prompt_len", prompt_len), ("new_tokens", new_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an integer >= 1, got {window!r}")

    def pairs(n):                 # the queries at positions 0..n-1, each against min(j + 1, window) keys
        if window is None or window >= n:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window

    recompute = sum(pairs(prompt_len + i) for i in range(new_tokens))    # step i: the first prompt_len + i
    cached = pairs(prompt_len + new_tokens - 1)                           # each position once; not the last
    return recompute, cached
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "predict_positions_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _pairs(T, n, w=None):
    got = predict_attention_pairs(T, n, w)
    what = f"predict_attention_pairs({T}, {n}, window={w})"
    check_equal(isinstance(got, (tuple, list)) and len(got) == 2 and all(type(x) is int for x in got), True,
                f"{what} = {got!r}: two ints (recompute_pairs, cached_pairs)")
    check_equal(0 < got[1] <= got[0], True, f"{what} = {tuple(got)}: the cached loop never scores more pairs")
    return tuple(got)


_one = _pairs(9, 1)
check_equal(_one[0], _one[1], "predict_attention_pairs(9, 1): one new token, both loops run one forward of the prompt")
check_equal(_pairs(40, 30, 70), _pairs(40, 30), "a window of 70 over at most 69 positions never binds: the same "
            "pairs as no window")
_ws = [_pairs(40, 30, w) for w in (1, 4, 16, 64)]
check_equal(all(x[0] < y[0] and x[1] < y[1] for x, y in zip(_ws, _ws[1:])), True,
            f"a wider window scores more pairs in both loops: {_ws} for windows 1, 4, 16, 64")
_ratios = [_pairs(64, n)[0] / _pairs(64, n)[1] for n in (2, 8, 32, 128)]
check_equal(all(x < y for x, y in zip(_ratios, _ratios[1:])), True, f"the longer the generation, the more the cache "
            f"saves: recompute / cached {[round(r, 2) for r in _ratios]} for 2, 8, 32, 128 new tokens")
for _bad in ((0, 3), (4, 0), (4.0, 3), (4, True), (4, 3, 0), (4, 3, 2.0)):
    check_raises(lambda: predict_attention_pairs(*_bad), ValueError, f"predict_attention_pairs{_bad}")
print("Part B: visible tests passed")

# %% [markdown] id="c010"
# Now compare your prediction with the measurement of Part A (not graded). The ratio of attention pairs is
# the speed-up a KV cache would give if a step cost only its attention scores; the ratio of positions (each
# token through the model once), the speed-up if it cost only its per-token work (the projections and the
# MLP, most of the FLOPs at this length). The measured one is smaller than both, because each step also pays
# a fixed cost (Python, every operator's dispatch: notebook 12, section '1. The kernels of one decode step')
# that the cache does not remove.

# %% id="c011" nbgrader={"grade": false, "grade_id": "compare_prediction", "locked": true, "schema_version": 3, "solution": false, "task": false}
try:
    _base, _cached = predict_attention_pairs(PROMPT_LEN, NEW_TOKENS)
    _pos = (sum(PROMPT_LEN + i for i in range(NEW_TOKENS)), PROMPT_LEN + NEW_TOKENS - 1)   # positions fed
    print(f"attention pairs: recompute {_base}, KV cache {_cached}: {_base / _cached:.1f}x less; positions: "
          f"{_pos[0]} and {_pos[1]}: {_pos[0] / _pos[1]:.1f}x less")
    if "_result" in globals():     # Part A's visible test measured it (a grading run does not run test cells)
        print(f"measured (the visible test, on this run): {_result.ratio:.2f}x (geometric mean of "
              f"{len(_result.ratios)} rounds)")
    else:
        print("run Part A's test cell to measure the speed-up beside the prediction")
except NotImplementedError:
    print("finish Part B first")

# %% [markdown] id="cw13p"
# ## Part C · Report (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Fill in the cell below: keep its three bold
# labels (the grader reads the first line that starts with the Method label for the leaderboard; your
# instructor reads all three), 100 to 250 words in all:
#
# * *Method*: one line, what your `build` does;
# * *What I measured*: your speed-up on this machine with its spread (Part A's visible test prints both), what
#   each change you made gave on its own, and why your speed-up is what it is: compare it with Part B's
#   prediction of the positions saved, and name what the cache does not remove;
# * *What did not work*: what you tried that was slower or changed the output, and why, from what you measured.
#
# A full answer (2 points) reports your own numbers and explains them; a report without numbers earns at most 1.

# %% [markdown] id="cw13" nbgrader={"grade": true, "grade_id": "written_report", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# **Method:** the course's baseline (replace this with one line: what your `build` does)
#
# **What I measured:** (your speed-up on this machine with its spread, and what each change gave)
#
# **What did not work:** (what you tried that was slower, or changed the output, and why)
#
# ### BEGIN SOLUTION
# *(The reference entry's report: the numbers in brackets are what a student quotes from their own run.)*
#
# Method: a KV cache (Module 05), a fresh one per prompt, in a lean greedy loop: no trace, no per-call checks,
# one copy to the host at the end.
#
# What I measured: [x]x over the baseline ([lo] to [hi], geometric mean of [n] rounds). The cache alone gave
# most of it; dropping `generate`'s trace and checks added [y]%. Part B predicts [r]x fewer positions for a
# 64-token prompt and its new tokens; the measured speed-up is smaller because a step also pays a
# fixed cost the cache does not remove: every operator's dispatch and Python, about the same for one position
# as for seventy, so at one position per step the step is overhead-bound.
#
# What did not work: [what the student tried and measured; for example `torch.compile` of the decode step with
# a growing cache, which recompiles as the cache's length changes (Module 12) and on short generations can cost
# more than it saves: the times with and without it, and the recompilations counted].
# ### END SOLUTION
