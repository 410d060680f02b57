# %% [markdown] id="c002"
# # Lab 08 · Speculative decoding
#
# In this lab you write the heart of Module 08 yourself:
#
# * **Part A (6 points): the acceptance step.** Given the target's probabilities `p`, the draft's `q` and
#   the drafted tokens, decide which drafts to keep and which token comes next, so that the output follows
#   the target's distribution **exactly**.
# * **Part B (4 points): the speed-up model.** How many tokens one draft-then-verify pass emits on average,
#   and what that buys in time.
#
# Notation (the same as the notebook and `course_lib.speculative`): `p` = TARGET probabilities, `q` = DRAFT
# probabilities, `g` = draft length, `a` = acceptance rate, `c` = draft/target cost ratio per token.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, **hidden tests** also check your code on fresh random
#   inputs (statistically, for the random parts), so make it correct in general.
# * Use plain Python and `torch`. Do not import the answers from `course_lib.speculative`: the hidden
#   tests check that the code is your own.
# * Everything runs on a CPU in seconds. Total: 10 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import time

import torch

from course_lib.checks import check_close, check_equal, check_raises


def _own_work(fn, name):
    """The grader's check that `fn` is the student's own function, not course_lib's."""
    if getattr(fn, "__module__", None) != "__main__":
        raise AssertionError(f"{name} must be defined in this notebook, not imported "
                             f"(it comes from {getattr(fn, '__module__', '?')})")
    for ref in fn.__code__.co_names:
        val = fn.__globals__.get(ref)
        mod = getattr(val, "__module__", None) or getattr(val, "__name__", "")
        if isinstance(mod, str) and mod.startswith("course_lib.speculative"):
            raise AssertionError(f"{name} uses {ref} from {mod}: write it yourself")


def chi2_pvalue(counts, probs):
    """Pearson's chi-square test that `counts` [V] were drawn from `probs` [V]: the p-value.

    Small p-values (say < 0.001) mean the counts are very unlikely under `probs`.
    """
    counts, probs = torch.as_tensor(counts, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64)
    keep = probs > 0
    expected = counts.sum() * probs[keep]
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))    # the chi-square survival function


def first_token_counts(accept, p, q, trials, generator):
    """Run the acceptance step `trials` times with fresh drafts t_i ~ q[i]; count the FIRST emitted token."""
    g, V = q.shape
    drafts = torch.stack([torch.multinomial(q[i], trials, replacement=True, generator=generator)
                          for i in range(g)], dim=1)                      # [trials, g]
    counts = torch.zeros(V, dtype=torch.long)
    for t in range(trials):
        out = accept(p, q, drafts[t], generator)
        counts[int(out[0])] += 1
    return counts


# %% [markdown] id="c004"
# ## Part A · The acceptance step (6 points)
#
# The draft proposed `g` tokens `draft_tokens[0..g-1]`, token `i` sampled from the draft distribution
# `q[i]`. The target scored them in one forward pass, giving `p[i]` at each drafted position **and one more
# row**, `p[g]`: the target's distribution for the token after the last draft. Implement
#
# `accept_step(p, q, draft_tokens, generator=None)` with `p` of shape `[g+1, V]`, `q` of shape `[g, V]`,
# `draft_tokens` of shape `[g]` (int64), returning **the list of emitted tokens** (Python ints):
#
# 1. for `i = 0, 1, ..., g-1`: draw `u` uniform in [0, 1) (`torch.rand((), generator=generator)`), and with
#    `t = draft_tokens[i]` **accept** it if `u < min(1, p[i, t] / q[i, t])`: append `t` and go on;
# 2. at the **first rejection**: append one token sampled from the residual distribution
#    `max(0, p[i] - q[i])`, normalized to sum to 1, and stop (`torch.multinomial(..., 1, generator=generator)`);
# 3. if all `g` drafts are accepted: append a **bonus** token sampled from `p[g]`.
#
# So the list always has `num_accepted + 1` tokens. Raise a `ValueError` if `q[i, t] == 0` for a drafted
# token `t` (the draft cannot have sampled a token it gives probability 0).
#
# Two classic mistakes the tests catch: sampling the replacement from `p[i]` instead of the residual (the
# output then over-weights the tokens the draft likes), and forgetting the bonus token.

# %% id="c005" nbgrader={"grade": false, "grade_id": "accept_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def accept_step(p, q, draft_tokens, generator=None):
    """Verify g drafted tokens against the target; return the emitted tokens (a list of ints)."""
    ### BEGIN SOLUTION
    g = draft_tokens.shape[0]
    p, q = p.double(), q.double()
    out = []
    for i in range(g):
        t = int(draft_tokens[i])
        if q[i, t] <= 0:
            raise ValueError(f"q[{i}, {t}] = 0 but the draft proposed token {t}")
        u = float(torch.rand((), generator=generator))
        if u < min(1.0, float(p[i, t] / q[i, t])):
            out.append(t)
            continue
        residual = torch.clamp(p[i] - q[i], min=0)
        if residual.sum() <= 0:          # p == q up to rounding: a rejection is (almost) impossible
            residual = p[i]
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[g], 1, generator=generator)))
    return out
    ### END SOLUTION


# %% [markdown] id="c006"
# ### The rules on fixed examples (2 points)
#
# Cases where the answer does not depend on the random draws: `p == q` (every draft passes), a draft the
# target gives probability 0 (it never passes), and a rejection whose residual has a single token.

# %% id="c007" nbgrader={"grade": true, "grade_id": "accept_rules_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_gen = torch.Generator().manual_seed(0)
# p == q: min(1, p/q) = 1, every draft passes, and the bonus comes from p[g] (one-hot here: token 3)
_q = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4]])
_p = torch.cat([_q, torch.tensor([[0.0, 0.0, 0.0, 1.0]])])
for _ in range(20):
    _out = accept_step(_p, _q, torch.tensor([1, 2]), _gen)
    check_equal([int(t) for t in _out], [1, 2, 3],
                "accept_step with p == q on the 2 drafts [1, 2] and p[2] one-hot on token 3 (all pass + bonus)")
# the target gives draft token 0 probability 0: always rejected; the residual max(0, p - q) = [0, 0, 0.5]
_p = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
_q = torch.tensor([[0.5, 0.5, 0.0]])
for _ in range(20):
    check_equal([int(t) for t in accept_step(_p, _q, torch.tensor([0]), _gen)], [2],
                "p[0] = [0, .5, .5], q[0] = [.5, .5, 0], draft [0]: rejected, the residual max(0, p - q) is "
                "all on token 2 (sampling from p instead would sometimes give 1)")
# first draft passes for sure (p = q there), second never does; residual on token 0
_p = torch.tensor([[0.2, 0.8, 0.0], [0.6, 0.0, 0.4], [0.0, 0.0, 1.0]])
_q = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])
for _ in range(20):
    check_equal([int(t) for t in accept_step(_p, _q, torch.tensor([1, 1]), _gen)], [1, 0],
                "drafts [1, 1]: the first passes (p = q), the second has p = 0 so it is replaced by the "
                "residual max(0, p[1] - q[1]) = [.6, 0, 0] -> token 0")
# temperature 0: one-hot p and q is greedy verification
_V = 5
_oh = lambda ts: torch.nn.functional.one_hot(torch.tensor(ts), _V).double()
check_equal([int(t) for t in accept_step(_oh([1, 4, 2, 0]), _oh([1, 4, 3]), torch.tensor([1, 4, 3]), _gen)],
            [1, 4, 2], "one-hot p = [1, 4, 2, 0], drafts [1, 4, 3]: accept 1 and 4, then the target's 2")
check_equal([int(t) for t in accept_step(_oh([1, 4, 2, 0]), _oh([1, 4, 2]), torch.tensor([1, 4, 2]), _gen)],
            [1, 4, 2, 0], "one-hot p = [1, 4, 2, 0], drafts [1, 4, 2]: all accepted plus the bonus token 0")
check_raises(lambda: accept_step(torch.full((2, 3), 1 / 3), torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([2]), _gen),
             ValueError, "accept_step with q[0, 2] = 0 for the drafted token 2")
print("Part A (rules): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.speculative import accept_step as _ref_accept

_own_work(accept_step, "accept_step")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _trial in range(200):          # one-hot p and q: the step is deterministic, compare with the reference
    _V, _G = int(torch.randint(2, 9, (1,), generator=_g)), int(torch.randint(1, 6, (1,), generator=_g))
    _pt = torch.randint(0, _V, (_G + 1,), generator=_g)
    _dt = torch.where(torch.rand(_G, generator=_g) < 0.7, _pt[:_G], torch.randint(0, _V, (_G,), generator=_g))
    _P = torch.nn.functional.one_hot(_pt, _V).double()
    _Q = torch.nn.functional.one_hot(_dt, _V).double()
    check_equal([int(t) for t in accept_step(_P, _Q, _dt, _g)], _ref_accept(_P, _Q, _dt, _g).tokens,
                f"accept_step on one-hot p (argmax {_pt.tolist()}) and drafts {_dt.tolist()} (seed {_seed})")
for _trial in range(50):           # p = q on the drafts: everything passes; bonus row one-hot
    _V, _G = int(torch.randint(2, 9, (1,), generator=_g)), int(torch.randint(1, 6, (1,), generator=_g))
    _Q = torch.softmax(torch.randn(_G, _V, generator=_g, dtype=torch.float64), -1)
    _dt = torch.stack([torch.multinomial(_Q[i], 1, generator=_g)[0] for i in range(_G)])
    _b = int(torch.randint(0, _V, (1,), generator=_g))
    _P = torch.cat([_Q, torch.nn.functional.one_hot(torch.tensor([_b]), _V).double()])
    check_equal([int(t) for t in accept_step(_P, _Q, _dt, _g)], _dt.tolist() + [_b],
                f"accept_step with p == q on drafts {_dt.tolist()}, bonus row one-hot on {_b} (seed {_seed})")
### END HIDDEN TESTS

# %% [markdown] id="c008"
# ### The output follows the target (2 points)
#
# The rule's promise: whatever the draft, the first emitted token is distributed exactly as `p[0]` (and so
# on for the next ones). The test below draws fresh drafts from `q`, runs your step many times and compares
# the histogram of the first emitted token with `p[0]` by a chi-square test. The hidden tests do the same
# on 10 random small vocabularies, each test at level 0.001, and fail only if at least 5 of the 10 reject:
# a correct function fails that with probability below 1e-10 (even if each test's real level were 3 times
# the nominal one: C(10,5) 0.003^5 = 6e-11), while the classic mistakes fail it almost surely.

# %% id="c009" nbgrader={"grade": true, "grade_id": "accept_stat_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_gen = torch.Generator().manual_seed(8)
_p = torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.25, 0.25, 0.25, 0.25], [0.4, 0.3, 0.2, 0.1]])
_q = torch.tensor([[0.40, 0.30, 0.20, 0.10], [0.70, 0.10, 0.10, 0.10]])
_counts = first_token_counts(accept_step, _p, _q, 2000, _gen)
_pv = chi2_pvalue(_counts, _p[0])
print("first emitted token: counts", _counts.tolist(), "expected", (2000 * _p[0]).tolist(), f"p-value {_pv:.3g}")
assert _pv > 1e-4, (f"the first emitted token does not follow p[0]: counts {_counts.tolist()}, expected about "
                    f"{(2000 * _p[0]).tolist()} (chi-square p-value {_pv:.2g}); is the replacement drawn "
                    "from normalize(max(0, p - q))?")
print("Part A (distribution): visible tests passed")
### BEGIN HIDDEN TESTS
_own_work(accept_step, "accept_step")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)


def _random_pair(g):
    """Random small p, q whose first rows differ enough that resampling from p would be visible."""
    for _ in range(10000):
        V, G = int(torch.randint(3, 7, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        P = torch.softmax(1.5 * torch.randn(G + 1, V, generator=g, dtype=torch.float64), -1)
        Q = torch.softmax(1.5 * torch.randn(G, V, generator=g, dtype=torch.float64), -1)
        a = torch.minimum(P[0], Q[0]).sum()
        wrong = torch.minimum(P[0], Q[0]) + (1 - a) * P[0]          # the law of "resample from p"
        if float(P[0].min()) >= 0.02 and float(((wrong - P[0]) ** 2 / P[0]).sum()) >= 0.06:
            return P, Q
    raise RuntimeError("no random pair found")


_rejections, _report = 0, []
for _trial in range(10):
    _P, _Q = _random_pair(_g)
    _c = first_token_counts(accept_step, _P, _Q, 1000, _g)
    _pv = chi2_pvalue(_c, _P[0])
    _rejections += _pv < 1e-3
    _report.append(f"V={_P.shape[1]} g={_Q.shape[0]}: counts {_c.tolist()} vs expected "
                   f"{[round(x, 1) for x in (1000 * _P[0]).tolist()]}, p-value {_pv:.2g}")
assert _rejections < 5, (f"the first emitted token does not follow p[0] in {_rejections} of 10 random tests "
                         f"(seed {_seed}):\n" + "\n".join(_report))
### END HIDDEN TESTS

# %% [markdown] id="c010"
# ### Temperature 0 is greedy, and the bonus token pays (2 points)
#
# With one-hot `p` and `q` (temperature 0) your step is greedy verification. The loop below builds a whole
# greedy speculative decoder on it and checks it produces **exactly** the target's greedy output. The two
# "models" here are fixed bigram tables (the next-token logits depend only on the last token); the hidden
# tests also use the course's real `tiny` target and `tiny-draft` draft. With the target as its own draft
# every draft passes, so each pass must emit `g + 1` tokens (that is the bonus token).

# %% id="c011" nbgrader={"grade": true, "grade_id": "accept_greedy_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def greedy_decode(target_fn, prompt, n):
    """Plain greedy decoding. target_fn(ids: list) -> logits [len(ids), V] for the token after each prefix."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(target_fn(ids)[-1].argmax()))
    return ids


def greedy_speculative(accept, target_fn, draft_fn, prompt, n, g, generator=None):
    """Greedy speculative decoding built on `accept`: returns (ids, number of target passes)."""
    ids, passes = list(prompt), 0
    while len(ids) < len(prompt) + n:
        drafts, q_rows = [], []
        for _ in range(g):                          # the draft proposes g tokens, one at a time
            logits = draft_fn(ids + drafts)[-1]
            q_rows.append(torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).double())
            drafts.append(int(logits.argmax()))
        logits = target_fn(ids + drafts)[-(g + 1):]   # one target pass scores them all (+ the bonus row)
        p = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
        ids += [int(t) for t in accept(p, torch.stack(q_rows), torch.tensor(drafts), generator)]
        passes += 1
    return ids[:len(prompt) + n], passes


_tg = torch.Generator().manual_seed(3)
_T = torch.randn(50, 50, generator=_tg)                      # target bigram logits
_D = _T + 0.7 * torch.randn(50, 50, generator=_tg)            # a draft that often agrees
_target = lambda ids: _T[torch.tensor(ids)]
_draft = lambda ids: _D[torch.tensor(ids)]
_ref = greedy_decode(_target, [7], 40)
for _gl in (1, 3, 5):
    _ids, _passes = greedy_speculative(accept_step, _target, _draft, [7], 40, _gl)
    check_equal(_ids, _ref, f"greedy speculative decoding (g={_gl}) vs the target's greedy output")
    _ids, _passes = greedy_speculative(accept_step, _target, _target, [7], 40, _gl)
    check_equal(_ids, _ref, f"greedy speculative decoding with the target as its own draft (g={_gl})")
    check_equal(_passes, math.ceil(40 / (_gl + 1)), f"target passes for 40 tokens with a perfect draft, g={_gl} "
                f"(each pass must emit g + 1 = {_gl + 1} tokens: the accepted drafts and the bonus token)")
print("Part A (greedy): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.models import load as _load

_own_work(accept_step, "accept_step")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _trial in range(3):
    _V = int(torch.randint(5, 60, (1,), generator=_g))
    _T = torch.randn(_V, _V, generator=_g)
    _D = _T + float(torch.rand(1, generator=_g)) * torch.randn(_V, _V, generator=_g)
    _target = lambda ids: _T[torch.tensor(ids)]
    _draft = lambda ids: _D[torch.tensor(ids)]
    _p0 = [int(torch.randint(0, _V, (1,), generator=_g))]
    _gl = int(torch.randint(1, 7, (1,), generator=_g))
    check_equal(greedy_speculative(accept_step, _target, _draft, _p0, 30, _gl, _g)[0],
                greedy_decode(_target, _p0, 30), f"greedy speculative (random {_V}x{_V} tables, g={_gl}, seed {_seed})")
    check_equal(greedy_speculative(accept_step, _target, _target, _p0, 30, _gl, _g)[1], math.ceil(30 / (_gl + 1)),
                f"passes with a perfect draft (random tables, g={_gl}, seed {_seed})")
_tm, _ = _load("tiny", device="cpu")
_dm, _ = _load("tiny-draft", device="cpu")
with torch.no_grad():
    _target = lambda ids: _tm(torch.tensor([ids]))[0]
    _draft = lambda ids: _dm(torch.tensor([ids]))[0]
    _prompt = torch.randint(0, _tm.config.vocab_size, (6,), generator=_g).tolist()
    _gl = int(torch.randint(2, 6, (1,), generator=_g))
    check_equal(greedy_speculative(accept_step, _target, _draft, _prompt, 16, _gl, _g)[0],
                greedy_decode(_target, _prompt, 16),
                f"greedy speculative with the course's tiny + tiny-draft (prompt {_prompt}, g={_gl}, seed {_seed})")
### END HIDDEN TESTS

# %% [markdown] id="c012"
# ## Part B · The speed-up model (4 points)
#
# Assume every draft passes independently with probability `a`. A pass emits the accepted drafts plus one
# target token, so it emits `k + 1` tokens when exactly the first `k` drafts pass. Implement
#
# * `expected_tokens_per_pass(a, g)`: the expected number of tokens one pass emits,
#   `1 + a + a^2 + ... + a^g = (1 - a^(g+1)) / (1 - a)`, which is `g + 1` at `a = 1` (do not divide by
#   zero). Raise a `ValueError` if `a` is not in [0, 1] or `g` is negative.
# * `speedup(a, g, c, verify_cost=1.0)`: a pass costs `g` draft steps (`c` each, in units of one target
#   decode step) plus one target verification pass (`verify_cost`; 1 on a GPU at batch 1, where scoring
#   g + 1 tokens costs about as much as one). Plain decoding costs 1 per token, so the speed-up is
#   `expected_tokens_per_pass(a, g) / (g * c + verify_cost)`.

# %% id="c013" nbgrader={"grade": false, "grade_id": "theory_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expected_tokens_per_pass(a, g):
    """Expected tokens emitted by one draft-then-verify pass."""
    ### BEGIN SOLUTION
    if not 0 <= a <= 1:
        raise ValueError(f"a must be in [0, 1], got {a}")
    if g < 0:
        raise ValueError(f"g must be >= 0, got {g}")
    if a == 1:
        return float(g + 1)
    return (1 - a ** (g + 1)) / (1 - a)
    ### END SOLUTION


def speedup(a, g, c, verify_cost=1.0):
    """Predicted speed-up of speculative decoding over plain decoding."""
    ### BEGIN SOLUTION
    return expected_tokens_per_pass(a, g) / (g * c + verify_cost)
    ### END SOLUTION


# %% id="c014" nbgrader={"grade": true, "grade_id": "tokens_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(expected_tokens_per_pass(0.8, 4), (1 - 0.8 ** 5) / 0.2, "expected_tokens_per_pass(0.8, 4)")
check_close(expected_tokens_per_pass(0.5, 1), 1.5, "expected_tokens_per_pass(0.5, 1)")
check_close(expected_tokens_per_pass(1.0, 4), 5.0, "expected_tokens_per_pass(1.0, 4) (every draft passes)")
check_close(expected_tokens_per_pass(0.0, 7), 1.0, "expected_tokens_per_pass(0.0, 7) (nothing passes: 1 token)")
check_close(expected_tokens_per_pass(0.9, 0), 1.0, "expected_tokens_per_pass(0.9, 0) (no draft: plain decoding)")
check_raises(lambda: expected_tokens_per_pass(1.5, 3), ValueError, "expected_tokens_per_pass(1.5, 3)")
check_raises(lambda: expected_tokens_per_pass(0.5, -1), ValueError, "expected_tokens_per_pass(0.5, -1)")
print("Part B (tokens per pass): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.speculative.theory import expected_tokens_per_pass as _ref_tokens

_own_work(expected_tokens_per_pass, "expected_tokens_per_pass")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _trial in range(200):
    _a = float(torch.rand(1, generator=_g)) if _trial > 20 else [0.0, 1.0][_trial % 2]
    _G = int(torch.randint(0, 33, (1,), generator=_g))
    check_close(expected_tokens_per_pass(_a, _G), _ref_tokens(_a, _G), f"expected_tokens_per_pass({_a!r}, {_G}) "
                f"(seed {_seed})", rtol=1e-9)
### END HIDDEN TESTS

# %% id="c015" nbgrader={"grade": true, "grade_id": "speedup_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(speedup(0.8, 4, 0.05), (1 - 0.8 ** 5) / 0.2 / 1.2, "speedup(0.8, 4, 0.05)")
check_close(speedup(0.8, 4, 0.05, verify_cost=1.6), (1 - 0.8 ** 5) / 0.2 / 1.8,
            "speedup(0.8, 4, 0.05, verify_cost=1.6) (a CPU, where verifying 5 tokens costs 1.6 decode steps)")
check_close(speedup(0.0, 3, 0.1), 1 / 1.3, "speedup(0.0, 3, 0.1) (a useless draft slows decoding down)")
check_close(speedup(1.0, 4, 0.0), 5.0, "speedup(1.0, 4, 0.0) (perfect, free draft: g + 1)")
print("Part B (speed-up): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.speculative.theory import speedup as _ref_speedup

_own_work(speedup, "speedup")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _trial in range(200):
    _a = float(torch.rand(1, generator=_g))
    _G = int(torch.randint(0, 17, (1,), generator=_g))
    _c = float(torch.rand(1, generator=_g)) * 0.5
    _vc = 1.0 + 2 * float(torch.rand(1, generator=_g))
    check_close(speedup(_a, _G, _c, _vc), _ref_speedup(_a, _G, _c, _vc),
                f"speedup({_a!r}, {_G}, {_c!r}, verify_cost={_vc!r}) (seed {_seed})", rtol=1e-9)
    check_close(speedup(_a, _G, _c), _ref_speedup(_a, _G, _c), f"speedup({_a!r}, {_G}, {_c!r}) (seed {_seed})",
                rtol=1e-9)
### END HIDDEN TESTS

# %% [markdown] id="c016"
# ## Going further (not graded)
#
# * With `a = 0.8` and `c = 0.05`, which `g` maximizes `speedup`? And with `verify_cost = 1 + 0.15 g` (a
#   CPU, where scoring more tokens costs more)? Compare with `course_lib.speculative.optimal_draft_length`.
# * Run `greedy_speculative` above with the real `tiny` / `tiny-draft` pair and count the passes: what is
#   the measured tokens per pass, and which `a` does the formula of Part B need to predict it?
