# %% [markdown] id="c002"
# # Lab 00 · Measuring inference: metrics and sampling
#
# In this lab you implement, from scratch, the two small toolkits every later module relies on:
#
# * **Part A–B (5 points): latency metrics.** From the timestamps a generation loop records, compute
#   TTFT, TPOT, end-to-end latency, tokens/s, and percentiles over many requests. Part B is specified by
#   its contract only: you design the interpolation.
# * **Part C–E (5 points): sampling.** Top-k and top-p (nucleus) filtering, temperature, and drawing a token
#   (notebook 00, section 10). Part D is a contract part too.
# * **Part F (2 points): predict, then measure.** From a request's TTFT and TPOT alone, predict what every user
#   sees when requests queue for a server that handles one at a time (a contract part); a later cell runs such
#   a queue of real generations and shows the two side by side.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, the grader also calls your functions on inputs of its
#   own (drawn for you, and a grid of edge cases) and compares them with the course's reference
#   implementation, so make them correct in general, not only on the examples.
# * Use plain Python, `math`, `numpy` and `torch`. Do not import the answers from `course_lib.perf`,
#   `course_lib.sampling` or `course_lib.generation`: the grader flags an answer that does, and while it
#   grades, the course's metrics and sampling functions are not in the library at all.
# * Parts marked **contract** give what the function takes, returns and refuses, not the steps: the steps are
#   in hints you open on purpose (the ▸ lines). Try without them first.
# * Everything runs on a CPU in seconds. Total: 14 points, 2 of them a written analysis your
#   instructor grades (Part G).

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os

import numpy as np
import torch

from course_lib.checks import check_close, check_equal, check_raises

# Known misconceptions: when a test finds one of these in your answer, its message names it.
MISTAKES = {
    "tpot_n": "TPOT divides by the number of tokens n; there are n - 1 gaps between n tokens, and the first "
              "token's time is already TTFT (see notebook 00, section '4. One generation, measured')",
    "percentile_n": "the percentile's position is q/100 * n; with n sorted values the positions run from 0 to "
                    "n - 1, so it is q/100 * (n - 1) (see notebook 00, section '6. Many requests: percentiles')",
    "top_p_drop": "top-p drops the token that crosses p (it keeps the tokens whose cumulative probability, "
                  "their own included, is at most p); the token that crosses p is kept: a token is kept while "
                  "the probability before it is below p (see notebook 00, section '10. Choosing the next "
                  "token: temperature, top-k and top-p')",
    "e2e_n_gaps": "a request's last token counted n TPOT gaps after its first; n tokens have n - 1 gaps, so a "
                  "request keeps the server busy for its TTFT and (n - 1) TPOTs (see notebook 00, section '4. One "
                  "generation, measured')",
    "queue_ignored": "a request's TTFT taken as its own prefill even when it arrived while another request ran: it "
                     "waits until the server is free, and its user's clock runs from the arrival (see notebook 00, "
                     "section '4. One generation, measured': TTFT holds the time spent queueing)",
    "queue_prefills_only": "a request waits only for the prefills of the requests ahead of it; a server that handles "
                           "one request at a time is busy with each until its last token is out, decode included",
    "latency_from_first_arrival": "latencies read from time 0 (the first arrival) instead of from each request's own "
                                  "arrival; a user who arrives later starts their clock when they arrive",
}


# %% [markdown] id="c004"
# ## Part A · Metrics of one request (3 points)
#
# A request starts at time `start` and produces tokens `0 .. n-1` at times `times[0] <= ... <= times[n-1]`
# (seconds, one clock). Implement:
#
# | function | definition |
# |---|---|
# | `ttft(start, times)` | time to first token: `times[0] - start` |
# | `e2e_latency(start, times)` | end-to-end latency: `times[-1] - start` |
# | `tpot(times)` | time per output token after the first: `(times[-1] - times[0]) / (n - 1)` (the mean gap between consecutive tokens; there are n - 1 gaps) |
# | `tokens_per_second(start, times)` | `n / e2e_latency(start, times)` (what one user sees, prefill included) |
#
# Raise a `ValueError` when `times` is empty (no token: nothing to measure), and in `tpot` when there
# are fewer than 2 times. `times` may be a list or a numpy array.

# %% id="c005" nbgrader={"grade": false, "grade_id": "metrics", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ttft(start, times):
    """Time to first token (seconds)."""
    ### BEGIN SOLUTION
    if len(times) == 0:
        raise ValueError("times is empty: no token was produced")
    return float(times[0]) - float(start)
    ### END SOLUTION


def e2e_latency(start, times):
    """End-to-end latency (seconds): from the start to the last token."""
    ### BEGIN SOLUTION
    if len(times) == 0:
        raise ValueError("times is empty: no token was produced")
    return float(times[-1]) - float(start)
    ### END SOLUTION


def tpot(times):
    """Time per output token after the first (seconds per token)."""
    ### BEGIN SOLUTION
    if len(times) < 2:
        raise ValueError(f"TPOT needs at least 2 token times, got {len(times)}")
    return (float(times[-1]) - float(times[0])) / (len(times) - 1)
    ### END SOLUTION


def tokens_per_second(start, times):
    """Tokens per second of the request, prefill included."""
    ### BEGIN SOLUTION
    return len(times) / e2e_latency(start, times)
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "ttft_e2e_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
start, times = 100.0, [100.25, 100.30, 100.45, 100.50]
check_close(ttft(start, times), 0.25, "ttft(100.0, [100.25, 100.30, 100.45, 100.50])")
check_close(e2e_latency(start, times), 0.50, "e2e_latency(100.0, [100.25, 100.30, 100.45, 100.50])")
check_close(ttft(2.0, np.array([2.5])), 0.5, "ttft(2.0, np.array([2.5])) (a numpy array, one token)")
check_raises(lambda: ttft(0.0, []), ValueError, "ttft(0.0, []) (no tokens)")
check_raises(lambda: e2e_latency(0.0, []), ValueError, "e2e_latency(0.0, []) (no tokens)")
print("Part A (TTFT, E2E): visible tests passed")

# %% id="c007" nbgrader={"grade": true, "grade_id": "tpot_tps_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
start, times = 100.0, [100.25, 100.30, 100.45, 100.50]
check_close(tpot(times), 0.25 / 3, "tpot([100.25, 100.30, 100.45, 100.50]) (4 tokens: 3 gaps)",
            mistakes={MISTAKES["tpot_n"]: 0.25 / 4})
check_close(tokens_per_second(start, times), 8.0, "tokens_per_second(100.0, [100.25, 100.30, 100.45, 100.50])")
check_close(tpot(np.array([1.0, 1.5])), 0.5, "tpot(np.array([1.0, 1.5]))")
check_close(tokens_per_second(0.0, [0.25]), 4.0, "tokens_per_second(0.0, [0.25]) (one token)")
check_raises(lambda: tpot([1.0]), ValueError, "tpot([1.0]) (one token: no gap)")
check_raises(lambda: tpot([]), ValueError, "tpot([]) (no tokens)")
check_raises(lambda: tokens_per_second(0.0, []), ValueError, "tokens_per_second(0.0, []) (no tokens)")
print("Part A (TPOT, tokens/s): visible tests passed")

# %% [markdown] id="c008"
# ## Part B · Percentiles over requests (2 points, contract)
#
# A service is judged by its slow requests, so latencies are reported as percentiles: p50 (the median),
# p90, p99 (notebook 00, section 6).
#
# **Contract.** `percentile(values, q)`:
#
# * takes `values`, a non-empty list or 1-D numpy array of numbers in any order, and `q`, a number in
#   `[0, 100]`; returns a Python float;
# * equals `numpy.percentile(values, q)` (its default, **linear interpolation**) to 1e-9 relative, on
#   any input: the sorted values are points at evenly spaced positions from q = 0 (the minimum) to
#   q = 100 (the maximum), and between two neighbours the percentile moves on the straight line joining them;
# * invariants: `percentile(v, 0) == min(v)`, `percentile(v, 100) == max(v)`, non-decreasing in `q`, the
#   median of an odd number of values is the middle one; `values` is not modified;
# * cost: one sort, O(n log n);
# * raises `ValueError` for empty `values` or `q` outside `[0, 100]`;
# * does not call `np.percentile`, `np.quantile` or their `nan` versions (the tests compare against them).
#
# Example: `[15, 20, 35, 40, 50]`, q = 40 gives 29 (the visible tests have more).
#
# <details><summary>Hint 1: where does the percentile sit?</summary>
#
# With `n` sorted values `v[0] <= ... <= v[n-1]`, value `v[j]` sits at q = 100 · j / (n − 1). So the
# percentile q sits at the fractional position `r = q / 100 * (n - 1)`: for the example, r = 0.4 · 4 = 1.6.
# </details>
#
# <details><summary>Hint 2: the recipe</summary>
#
# 1. sort the values: `v[0] <= v[1] <= ... <= v[n-1]`;
# 2. the percentile sits at the fractional position `r = q / 100 * (n - 1)`;
# 3. with `i = floor(r)` and `f = r - i`, the answer is `v[i] + f * (v[i+1] - v[i])` (just `v[n-1]` when
#    `i = n - 1`). Example: r = 1.6, so 20 + 0.6 × (35 − 20) = 29.
# </details>

# %% id="c009" nbgrader={"grade": false, "grade_id": "percentile", "locked": false, "schema_version": 3, "solution": true, "task": false}
def percentile(values, q):
    """q-th percentile (q in [0, 100]) of values, numpy's linear interpolation."""
    ### BEGIN SOLUTION
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("values is empty")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    r = q / 100 * (len(v) - 1)
    i = math.floor(r)
    if i >= len(v) - 1:
        return v[-1]
    return v[i] + (r - i) * (v[i + 1] - v[i])
    ### END SOLUTION


# %% id="c010" nbgrader={"grade": true, "grade_id": "percentile_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
v = [15, 20, 35, 40, 50]
for q, want, at_n in [(0, 15, 15), (40, 29.0, 35), (50, 35, 37.5), (90, 46.0, 50), (99, 49.6, 50), (100, 50, 50)]:
    check_close(percentile(v, q), want, f"percentile([15, 20, 35, 40, 50], {q})",
                mistakes={MISTAKES["percentile_n"]: at_n} if at_n != want else None)
check_close(percentile([40, 15, 50, 35, 20], 40), 29.0, "percentile([40, 15, 50, 35, 20], 40) (unsorted input)")
check_close(percentile([7.0], 99), 7.0, "percentile([7.0], 99) (one value)")
check_close(percentile(np.array([1.0, 2.0]), 25), 1.25, "percentile(np.array([1.0, 2.0]), 25)")
check_raises(lambda: percentile([], 50), ValueError, "percentile([], 50)")
check_raises(lambda: percentile([1, 2], 101), ValueError, "percentile([1, 2], 101)")
check_raises(lambda: percentile([1, 2], -1), ValueError, "percentile([1, 2], -1)")
print("Part B: visible tests passed")

# %% [markdown] id="c011"
# ## Part C · Top-k filtering (1 point)
#
# Sampling turns the model's **logits** (one score per vocabulary token, shape `[..., V]`) into a token.
# Top-k [@fan2018hierarchical] keeps only the k most likely tokens: `top_k_filter(logits, k)` returns a new tensor of the same
# shape where every logit smaller than the row's k-th largest is set to `-inf` (so its probability
# becomes 0). Rules:
#
# * work on any shape `[..., V]` (each row along the last dimension separately); do not modify the input;
# * tokens **tied** with the k-th largest logit are kept too (Hugging Face does the same);
# * `k >= V` keeps everything; `k < 1` (or not an int) raises a `ValueError`.
#
# Hint: `torch.topk(logits, k, dim=-1).values[..., -1:]` is the k-th largest value of each row.

# %% id="c012" nbgrader={"grade": false, "grade_id": "top_k", "locked": false, "schema_version": 3, "solution": true, "task": false}
def top_k_filter(logits, k):
    """Keep the k largest logits per row (ties with the k-th kept); the others become -inf."""
    ### BEGIN SOLUTION
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))
    ### END SOLUTION


# %% id="c013" nbgrader={"grade": true, "grade_id": "top_k_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
inf = float("inf")
x = torch.tensor([0.1, 2.0, -1.0, 0.5])
check_equal(top_k_filter(x, 2), torch.tensor([-inf, 2.0, -inf, 0.5]), "top_k_filter([0.1, 2.0, -1.0, 0.5], k=2)")
check_equal(top_k_filter(x, 1), torch.tensor([-inf, 2.0, -inf, -inf]), "top_k_filter([0.1, 2.0, -1.0, 0.5], k=1)")
check_equal(top_k_filter(x, 10), x, "top_k_filter([0.1, 2.0, -1.0, 0.5], k=10) (k >= V keeps all)")
check_equal(top_k_filter(torch.tensor([1.0, 3.0, 3.0, 2.0]), 1), torch.tensor([-inf, 3.0, 3.0, -inf]),
            "top_k_filter([1.0, 3.0, 3.0, 2.0], k=1) (ties with the k-th largest are kept)")
xb = torch.tensor([[0.0, 1.0, 2.0], [5.0, 4.0, 3.0]])
check_equal(top_k_filter(xb, 2), torch.tensor([[-inf, 1.0, 2.0], [5.0, 4.0, -inf]]),
            "top_k_filter on a batch [[0, 1, 2], [5, 4, 3]], k=2 (each row separately)")
check_equal(x, torch.tensor([0.1, 2.0, -1.0, 0.5]), "the input logits after top_k_filter (must not change)")
check_raises(lambda: top_k_filter(x, 0), ValueError, "top_k_filter(x, k=0)")
print("Part C: visible tests passed")

# %% [markdown] id="c014"
# ## Part D · Top-p (nucleus) filtering (2 points, contract)
#
# Top-p (Holtzman et al., "The Curious Case of Neural Text Degeneration" [@holtzman2020curious]; notebook 00,
# section 10) keeps the **smallest set of most likely tokens whose total probability reaches p**.
#
# **Contract.** `top_p_filter(logits, p)`:
#
# * takes `logits`, a float tensor of any shape `[..., V]` (each row along the last dimension on its own,
#   tokens in any order in the vocabulary), and `p`, a number in `(0, 1]`;
# * returns a new tensor of the same shape and dtype: the kept logits unchanged, the others `-inf`;
# * keeps, per row, the smallest set of most likely tokens whose probabilities (`softmax` of the row)
#   add up to at least `p`. So the token that crosses p is **kept** (with probabilities 0.5, 0.3, 0.15, 0.05
#   and p = 0.55, the first two are kept: 0.5 alone does not reach 0.55), the most likely token is always
#   kept, and `p = 1` keeps everything;
# * does not modify its input; no Python loop over rows or tokens (a vocabulary has 32k–256k tokens): one
#   sort per row, O(V log V);
# * raises `ValueError` for `p` outside `(0, 1]` (or not a number).
#
# The grader calls your function on logits and values of p of its own (drawn away from ties, and an edge
# grid), and compares with the course's `top_p_filter`.
#
# <details><summary>Hint 1: the rule, token by token</summary>
#
# With the probabilities sorted in decreasing order, a token is kept when the probability of the tokens
# *before* it is still below p. "Before it" is the cumulative sum minus the token's own probability.
# Pitfall: in float32 a long row's cumulative sum can reach 1.0 before its last tokens, so at `p = 1` this
# rule alone drops tokens the contract keeps.
# </details>
#
# <details><summary>Hint 2: the tools</summary>
#
# `torch.sort(logits, dim=-1, descending=True)` gives the sorted values and the original positions;
# `torch.cumsum`; put a boolean mask back in vocabulary order with `Tensor.scatter`, then `masked_fill`.
# </details>

# %% id="c015" nbgrader={"grade": false, "grade_id": "top_p", "locked": false, "schema_version": 3, "solution": true, "task": false}
def top_p_filter(logits, p):
    """Keep the smallest set of most likely tokens whose probability reaches p; the others become -inf."""
    ### BEGIN SOLUTION
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    if p == 1:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens before each one
    remove_sorted = before >= p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    ### END SOLUTION


# %% id="c016" nbgrader={"grade": true, "grade_id": "top_p_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
inf = float("inf")
x = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()


def kept(out):
    return (~torch.isinf(out)).nonzero().flatten().tolist()


for p, want, dropped in [(0.45, [0], [0]), (0.55, [0, 1], [0]), (0.7, [0, 1], [0]), (0.9, [0, 1, 2], [0, 1]),
                         (0.97, [0, 1, 2, 3], [0, 1, 2]), (1.0, [0, 1, 2, 3], [0, 1, 2, 3]), (1e-6, [0], [0])]:
    check_equal(kept(top_p_filter(x, p)), want, f"kept tokens of top_p_filter(log([0.5, 0.3, 0.15, 0.05]), p={p})",
                mistakes={MISTAKES["top_p_drop"]: dropped} if dropped != want else None)
out = top_p_filter(x, 0.7)
check_close(out[:2], x[:2], "the kept logits of top_p_filter (they must keep their values)")
xp = x[torch.tensor([2, 0, 3, 1])]  # the same probabilities in another vocabulary order
check_equal(kept(top_p_filter(xp, 0.55)), [1, 3], "kept tokens of top_p_filter(log([0.15, 0.5, 0.05, 0.3]), p=0.55)")
xb = torch.stack([x, x.flip(0)])
check_equal(kept(top_p_filter(xb, 0.55)[1]), [2, 3], "row 2 of top_p_filter on a batch (each row separately)")
check_equal(x, torch.tensor([0.5, 0.3, 0.15, 0.05]).log(), "the input logits after top_p_filter (must not change)")
_long = torch.randn(8, 32000, generator=torch.Generator().manual_seed(0)) * 3   # 8 rows of a real vocabulary's size
check_equal(int(torch.isinf(top_p_filter(_long, 1.0)).sum()), 0, "tokens dropped by top_p_filter(8 rows of 32,000 "
            "logits, p=1) (p = 1 keeps everything, whatever float32's cumulative sum says)")
check_raises(lambda: top_p_filter(x, 0.0), ValueError, "top_p_filter(x, p=0.0)")
check_raises(lambda: top_p_filter(x, 1.5), ValueError, "top_p_filter(x, p=1.5)")
print("Part D: visible tests passed")

# %% [markdown] id="c017"
# ## Part E · Temperature and sampling (2 points)
#
# Put it together. `sampling_probs(logits, temperature=1.0, top_k=None, top_p=None)` returns the
# probabilities the next token is drawn from, shape `[..., V]`, in this order (the order Hugging Face uses):
#
# 1. **temperature**: divide the logits by `temperature` (below 1 sharpens, above 1 flattens). Temperature
#    **0 means greedy**: return a one-hot distribution at the argmax (first index among equal maxima);
#    a negative temperature raises a `ValueError`;
# 2. **top-k** with your `top_k_filter` (if `top_k` is not None);
# 3. **top-p** with your `top_p_filter` (if `top_p` is not None), on the *temperature-scaled* logits;
# 4. softmax over the last dimension.
#
# `sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None)` draws one token id per row
# (`[..., V] -> [...]`, dtype int64) from `sampling_probs`, with `torch.multinomial(..., generator=generator)`;
# for temperature 0 it returns the argmax.

# %% id="c018" nbgrader={"grade": false, "grade_id": "sampling", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """The distribution of the next token: temperature, then top-k, then top-p, then softmax."""
    ### BEGIN SOLUTION
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        idx = torch.argmax(logits, dim=-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter(-1, idx, 1.0)
    x = logits.float() / temperature
    if top_k is not None:
        x = top_k_filter(x, top_k)
    if top_p is not None:
        x = top_p_filter(x, top_p)
    return torch.softmax(x, dim=-1)
    ### END SOLUTION


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """One token id per row, drawn from sampling_probs (argmax for temperature 0)."""
    ### BEGIN SOLUTION
    probs = sampling_probs(logits, temperature, top_k, top_p)
    if temperature == 0:
        return torch.argmax(logits, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
    ### END SOLUTION


# %% id="c019" nbgrader={"grade": true, "grade_id": "sampling_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
x = torch.tensor([2.0, 1.0, 0.5, -1.0])
check_close(sampling_probs(x), torch.softmax(x, -1), "sampling_probs([2, 1, 0.5, -1]) (temperature 1)", atol=1e-7)
check_close(sampling_probs(x, temperature=0.0), torch.tensor([1.0, 0, 0, 0]),
            "sampling_probs([2, 1, 0.5, -1], temperature=0) (greedy: one-hot at the argmax)")
check_close(sampling_probs(x, 0.5, top_k=2), torch.tensor([0.880797, 0.119203, 0, 0]),
            "sampling_probs([2, 1, 0.5, -1], temperature=0.5, top_k=2)", atol=1e-5)
check_close(sampling_probs(x, 2.0, top_p=0.8), torch.tensor([0.481024, 0.291756, 0.227220, 0]),
            "sampling_probs([2, 1, 0.5, -1], temperature=2, top_p=0.8) (top-p after the temperature)", atol=1e-5)
check_raises(lambda: sampling_probs(x, temperature=-1.0), ValueError, "sampling_probs(x, temperature=-1)")
xb = torch.tensor([[0.0, 3.0, 1.0], [2.0, 2.0, 1.0], [5.0, -1.0, 5.5]])
check_equal(sample(xb, temperature=0.0), torch.tensor([1, 0, 2]), "sample(batch, temperature=0) (argmax per row)")
draws = sample(x.expand(4000, -1), 1.0, top_k=3, generator=torch.Generator().manual_seed(0))
check_equal(tuple(draws.shape), (4000,), "the shape of sample(logits of shape [4000, 4])")
check_equal(draws.dtype, torch.int64, "the dtype of sample(...)")
check_equal(int((draws == 3).sum()), 0, "how often sample(..., top_k=3) drew the filtered token 3")
check_equal(tuple(sample(torch.randn(3, 2, 5), 1.0, generator=torch.Generator().manual_seed(0)).shape), (3, 2),
            "the shape of sample(logits of shape [3, 2, 5]) (one token per row, whatever the leading dimensions)")
check_equal(tuple(sample(x, 1.0, generator=torch.Generator().manual_seed(0)).shape), (),
            "the shape of sample(logits of shape [4]) (one row: a 0-d tensor)")
freq = torch.bincount(draws, minlength=4).double() / 4000
check_close(freq[:3], sampling_probs(x, 1.0, top_k=3)[:3].double(),
            "the sampled frequencies of tokens 0-2 (4000 draws, top_k=3)", atol=0.035)
print("Part E: visible tests passed")

# %% [markdown] id="c019a"
# ## Part F · Predict, then measure: a queue of requests (2 points, contract)
#
# Notebook 00 sent its requests one after another, each the moment the previous one ended, so nobody ever
# waited (section 6: "no queueing"), and its TTFT was the prefill alone. Users do not wait their turn: they
# arrive while the server is busy. Take the simplest server, which handles **one request at a time, first come
# first served**, and use the request model of section 4 for what a request costs once the server takes it:
# its first token comes `ttft_s` seconds later (the prefill), then one token every `tpot` seconds. Predict
# what each user sees.
#
# **Contract.** `predict_queue(requests, tpot)`:
#
# * takes `requests`, a non-empty list of `(arrival_s, ttft_s, n_tokens)` tuples in order of arrival: when the
#   request arrives (seconds on the server's clock, >= 0, never earlier than the request before it), its TTFT
#   when it runs alone (seconds, >= 0) and the number of tokens it generates (an int >= 1); and `tpot`, the
#   seconds per output token after the first (>= 0), the same for every request;
# * the server takes a request when it arrives or when the previous request's last token is out, whichever is
#   later, and serves it alone, as the request model says;
# * returns `(ttfts, e2es)`: two lists of floats, one entry per request in the order given, the TTFT and the
#   E2E latency (seconds) that request's user sees, both counted from **that request's arrival** (Part A's
#   definitions);
# * invariants: every TTFT is at least the request's own `ttft_s`, every E2E at least its TTFT; the time from a
#   request's first token to its last does not depend on the other requests; a request that finds the server
#   idle sees what it would see alone;
# * raises `ValueError` for an empty `requests`, an `n_tokens` that is not an int >= 1 (a `bool` or a float
#   such as `3.0` is refused too), a negative `ttft_s`,
#   `arrival_s` or `tpot`, or arrivals out of order.
#
# The grader draws its own queues (bursts, idle gaps, one-token answers, hundreds of tokens) and compares with
# the course's model. The visible tests check the units and what must hold whatever the formula; the cell after
# "Putting it together" measures a queue of real generations and puts your prediction beside it.
#
# <details><summary>Hint 1: follow the server's clock</summary>
#
# Keep one number as you go down the list: the time at which the server becomes free. When does it take the
# next request, and when is it free again? A user reads both latencies on that clock, from their own arrival.
# Pitfall: a request that arrives while the server is idle does not wait at all.
# </details>
#
# <details><summary>Hint 2: what keeps the server busy</summary>
#
# A request occupies the server from its prefill to its last token, so the next one waits for both. Pitfalls:
# counting only the prefills ahead of a request, and counting n TPOT gaps for n tokens (Part A).
# </details>

# %% id="c019b" nbgrader={"grade": false, "grade_id": "predict_queue", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_queue(requests, tpot):
    """(TTFTs, E2Es) in seconds, from each arrival, of requests served one at a time in order of arrival."""
    ### BEGIN SOLUTION
    if isinstance(tpot, bool) or not isinstance(tpot, (int, float)) or not tpot >= 0:
        raise ValueError(f"tpot must be a number >= 0, got {tpot!r}")
    requests = list(requests)
    if not requests:
        raise ValueError("requests is empty")
    ttfts, e2es = [], []
    free = previous = 0.0
    for arrival, first_s, n in requests:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n_tokens must be an int >= 1, got {n!r}")
        if not first_s >= 0:
            raise ValueError(f"ttft_s must be >= 0, got {first_s!r}")
        if not arrival >= previous:
            raise ValueError(f"arrival_s must be >= 0 and in order of arrival, got {arrival!r} after {previous!r}")
        start = max(arrival, free)              # taken on arrival, or once the server is free
        first = start + first_s
        free = first + (n - 1) * tpot           # busy until its last token: n - 1 gaps after the first
        ttfts.append(first - arrival)
        e2es.append(free - arrival)
        previous = arrival
    return ttfts, e2es
    ### END SOLUTION


# %% id="c019c" nbgrader={"grade": true, "grade_id": "predict_queue_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _queue(requests, tpot):
    got = predict_queue(requests, tpot)
    check_equal(len(got) if isinstance(got, (tuple, list)) else type(got).__name__, 2,
                "predict_queue returns a pair (ttfts, e2es)")
    ttfts, e2es = [float(x) for x in got[0]], [float(x) for x in got[1]]
    check_equal((len(ttfts), len(e2es)), (len(requests), len(requests)),
                f"predict_queue({requests}, {tpot}): one TTFT and one E2E per request")
    for i, ((_, own, _), f, e) in enumerate(zip(requests, ttfts, e2es)):
        check_equal(own - 1e-12 <= f <= e + 1e-12, True, f"predict_queue({requests}, {tpot}), request {i}: "
                    f"seconds, with its own prefill {own} <= its TTFT {f:.4g} <= its E2E {e:.4g}")
    return ttfts, e2es


_burst = [(0.0, 0.3, 12), (0.0, 0.3, 4), (0.0, 0.3, 20), (0.0, 0.3, 8)]      # four users press enter at once
_ttfts, _e2es = _queue(_burst, 0.04)
check_close(_ttfts[0], 0.3, "the first request of a burst waits for nobody: its TTFT is its own prefill")
check_equal(all(b > a for a, b in zip(_ttfts, _ttfts[1:])), True,
            f"in a burst, each request waits longer than the one before it (TTFTs {[round(x, 4) for x in _ttfts]})")
check_equal(_ttfts[1] > _e2es[0], True, f"one request at a time: the second user's first token ({_ttfts[1]:.4g} s) "
            f"comes after the first user's last ({_e2es[0]:.4g} s); if not: {MISTAKES['queue_prefills_only']}")
_alone = [_queue([(0.0, own, n)], 0.04) for _, own, n in _burst]             # each request with the server to itself
check_close([e - f for f, e in zip(_ttfts, _e2es)], [a[1][0] - a[0][0] for a in _alone],
            "each request's time from first to last token, in the burst and alone (decoding is its own)")
_reversed = _queue(_burst[::-1], 0.04)
check_close(max(_reversed[1]), max(_e2es), "the last user of a burst finishes at the same time in any order "
            "(the server never idles)")
_spread = [(10.0 * k, own, n) for k, (_, own, n) in enumerate(_burst)]      # the same requests, 10 s apart
check_close(_queue(_spread, 0.04), ([a[0][0] for a in _alone], [a[1][0] for a in _alone]),
            "requests 10 s apart find the server idle: each sees what it sees alone",
            mistakes={MISTAKES["latency_from_first_arrival"]: ([a[0][0] + 10.0 * k for k, a in enumerate(_alone)],
                                                               [a[1][0] + 10.0 * k for k, a in enumerate(_alone)])})
_one = _queue([(2.0, 0.5, 1)], 0.04)
check_close(_one[1][0], _one[0][0], "a one-token answer: its last token is its first (E2E = TTFT)")
check_raises(lambda: predict_queue([], 0.04), ValueError, "predict_queue([], 0.04) (no request)")
check_raises(lambda: predict_queue([(0.0, 0.3, 0)], 0.04), ValueError, "predict_queue([(0.0, 0.3, 0)], 0.04)")
check_raises(lambda: predict_queue([(1.0, 0.3, 5), (0.5, 0.3, 5)], 0.04), ValueError,
             "predict_queue with the second request arriving before the first")
check_raises(lambda: predict_queue([(0.0, 0.3, 5)], -0.04), ValueError, "predict_queue(..., tpot=-0.04)")
print("Part F: visible tests passed")

# %% [markdown] id="c020"
# ## Putting it together (not graded)
#
# Your metrics on a real generation: `course_lib.generation.generate` runs the course's bundled model
# and records when each token was ready. Compare your numbers with the trace's own.

# %% id="c021"
from course_lib.generation import generate
from course_lib.models import load

try:
    if os.environ.get("NBGRADER_EXECUTION"):
        raise RuntimeError("skipped while grading (the course's metrics are not in the library then)")
    model, tok = load("tiny", device="cpu", verbose=False)
    prompt = tok("def fibonacci(n):\n", add_special_tokens=False)["input_ids"]
    tokens, trace = generate(model, prompt, 12)
    print(f"ref:  TTFT {trace.ttft * 1e3:.2f} ms, TPOT {trace.tpot * 1e3:.2f} ms, "
          f"{trace.tokens_per_second:.1f} tokens/s")
    print(f"mine: TTFT {ttft(trace.start, trace.times) * 1e3:.2f} ms, TPOT {tpot(trace.times) * 1e3:.2f} ms, "
          f"{tokens_per_second(trace.start, trace.times):.1f} tokens/s")
    logits = model(torch.tensor([prompt]))[0, -1].detach()
    print("tokens kept by top-p 0.9:", int((sampling_probs(logits, 1.0, top_p=0.9) > 0).sum()), "of", logits.numel())
except NotImplementedError:
    print("Finish the exercises above first: then your numbers appear here beside the reference's.")
except RuntimeError as e:
    print(e)

# %% [markdown] id="c021a"
# **Predicted, then measured.** Eight requests with the same prompt and different output lengths arrive on a
# schedule: some while the server is busy, some after it fell idle. This notebook is the server: it serves them
# one at a time, in order, with `generate` through a KV cache (module 05), so every decode step does about the
# same work, as the request model assumes. First a request alone gives TTFT and TPOT (the fastest of five short
# runs: a burst of another program only ever slows a run down); your `predict_queue` predicts every user's
# latencies from them; then the queue runs three times and the cell keeps the run that finished first. Your
# `percentile` summarizes both. (Timings vary from run to run and from machine to machine: read the gap, do not
# expect it to be zero.)

# %% id="c021b"
import time

from course_lib.perf.claims import timing_claim

QUEUE = [16, 4, 24, 8, 12, 2, 20, 6]            # output tokens of the 8 requests, in order of arrival
ARRIVE = [0, 0, 0.5, 1.5, 1.5, 4, 4.2, 4.4]     # arrivals, in units of a 10-token request's time alone


def _serve(arrivals):
    """Serve the queue one request at a time; each user's (TTFT, E2E) from their own arrival."""
    t0, seen = time.perf_counter(), []
    for a, n in zip(arrivals, QUEUE):
        time.sleep(max(0.0, t0 + a - time.perf_counter()))       # idle until the next arrival
        times = generate(model, prompt, n, eos_token_id=None, cache="contiguous")[1].times
        seen.append((times[0] - (t0 + a), times[-1] - (t0 + a)))
    return seen


try:
    if os.environ.get("NBGRADER_EXECUTION"):
        raise RuntimeError("skipped while grading (a measurement, not a test)")
    for _ in range(2):
        generate(model, prompt, 4, eos_token_id=None, cache="contiguous")  # warm-up
    solo = [generate(model, prompt, 6, eos_token_id=None, cache="contiguous")[1] for _ in range(5)]
    solo_ttft, solo_tpot = min(tr.ttft for tr in solo), min(tr.tpot for tr in solo)
    arrivals = [a * (solo_ttft + 9 * solo_tpot) for a in ARRIVE]
    runs = [_serve(arrivals) for _ in range(3)]
    measured = min(runs, key=lambda run: max(a + e2e for a, (_, e2e) in zip(arrivals, run)))
    pred_ttft, pred_e2e = predict_queue([(a, solo_ttft, n) for a, n in zip(arrivals, QUEUE)], solo_tpot)
    print(f"alone: TTFT {solo_ttft * 1e3:.2f} ms, TPOT {solo_tpot * 1e3:.2f} ms")
    print(f"{'request':>8}{'arrives':>10}{'tokens':>8}{'TTFT pred':>12}{'measured':>10}{'E2E pred':>11}{'measured':>10}")
    for i, (a, n, pf, pe, (mf, me)) in enumerate(zip(arrivals, QUEUE, pred_ttft, pred_e2e, measured)):
        print(f"{i:>8}{a * 1e3:>8.1f}ms{n:>8}{pf * 1e3:>10.1f}ms{mf * 1e3:>8.1f}ms{pe * 1e3:>9.1f}ms{me * 1e3:>8.1f}ms")
    meas_ttft, meas_e2e = [m[0] for m in measured], [m[1] for m in measured]
    for name, pred, meas in (("TTFT", pred_ttft, meas_ttft), ("E2E", pred_e2e, meas_e2e)):
        print(f"{name:>4}: p50 predicted {percentile(pred, 50) * 1e3:7.1f} ms, measured {percentile(meas, 50) * 1e3:7.1f} "
              f"ms; p90 predicted {percentile(pred, 90) * 1e3:7.1f} ms, measured {percentile(meas, 90) * 1e3:7.1f} ms")
    p90_pred, p90_meas = percentile(pred_e2e, 90), percentile(meas_e2e, 90)
    timing_claim("one server, one request at a time: the request model predicts the queue's p90 E2E within 25%",
                 abs(p90_meas / p90_pred - 1) < 0.25,
                 f"p90 E2E predicted {p90_pred * 1e3:.1f} ms, measured {p90_meas * 1e3:.1f} ms (measured / predicted "
                 f"= {p90_meas / p90_pred:.2f}); the queue that finished first of 3",
                 advice="a busy machine slows the queue, or the short runs it was predicted from: re-run the cell")
except NotImplementedError:
    print("Finish Parts A, B and F first: then your prediction appears here beside the measurement.")
except RuntimeError as e:
    print(e)

# %% [markdown] id="c022"
# ## Going further
#
# * A request has TTFT 0.4 s and TPOT 25 ms. From which number of output tokens on does its decode phase
#   take longer than its prefill? What tokens/s does its user see at 100 tokens, and what decode rate?
# * You report p99 latency from 20 requests. With linear interpolation, which of the 20 values decide it,
#   and how many requests do you need before p99 is not simply set by the slowest one or two?
# * `sampling_probs` applies the temperature before top-p. With logits `[2, 1, 0.5, -1]`, temperature 2 and
#   p = 0.8, how many tokens does top-p keep, and how many if it ran on the unscaled logits?
# * A GPU rented at $2.00/h serves 1,500 tokens/s in total over its batch. What does 1M output tokens cost?
#   Batching more requests doubles the total throughput but makes each user's TPOT 30% longer: the cost now?
# * Part F's measurement decodes through a KV cache. Served with `cache=None` (the recompute baseline), every
#   step re-reads the whole sequence. Which way would `predict_queue`, fed a short run's TTFT and TPOT, miss the
#   queue then, and which users would it miss most?

# %% [markdown] id="cw00p"
# ## Part G · Written analysis: your queue, predicted and measured (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run the "Predicted, then measured" cell
# first (it is skipped while grading), then answer in 100 to 200 words in the cell below, about **your** numbers:
#
# 1. quote the predicted and measured p50 and p90 of TTFT and of E2E, and the measured / predicted ratio of the
#    p90 E2E;
# 2. say which requests have the longest TTFTs in your table and why (their own prefill, or what was ahead of
#    them?), and what in the measurement moves the ratio away from 1 (what the TTFT and TPOT it was predicted
#    from are, and what the server does between one request's last token and the next one's start);
# 3. requests 0 and 1 arrive together: which of the two orders gives the lower mean E2E for the pair, and what
#    does the order change for the requests after them? Generalize to a burst of many requests.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw00" nbgrader={"grade": true, "grade_id": "written_queue", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on this course's 2-core CPU
# machine (AMD EPYC, 2 threads), torch 2.13; your numbers will differ: what matters is how you explain them.)*
#
# Alone, a request took TTFT 6.70 ms and TPOT 4.67 ms. Over the 8 requests, TTFT p50 was predicted 121.6 ms and
# measured 108.9 ms, p90 191.5 against 178.2 ms; E2E p50 182.5 against 170.3 ms, p90 232.7 against 217.9 ms:
# measured / predicted = 0.94 for the p90 E2E.
#
# The longest TTFTs are requests 4 (predicted 184.5 ms, measured 172.0) and 7 (208.0 and 192.5 ms): their
# prefill is the same 6.7 ms as everyone's; the rest is waiting for the end of request 1 and all of requests 2
# and 3 (request 4), or for the end of request 4 and all of 5 and 6 (request 7). The prediction runs 4 to 10%
# high: its TPOT is the fastest mean of 5 gaps of a short run, the long requests decoded a little faster per
# token, and every later user inherits that error through the wait. The server's own work between requests
# (returning a trace, starting the next `generate`) pushes the other way, but is smaller here.
#
# Serving the 4-token request 1 first ends it at 6.7 + 3 × 4.67 = 20.7 ms and request 0 at 97.4 ms: a mean of
# 59 ms instead of 87 ms. The pair finishes at 97.4 ms either way, so the requests after them see no change.
# In a burst, shortest first minimizes the mean E2E; the last finish does not move.

# %% [markdown] id="c023" tags=["answer-key"]
# ### Answer key
#
# * The decode phase of n tokens takes (n − 1) × 25 ms; it exceeds 0.4 s when n − 1 > 16, so from
#   **n = 18** tokens on (at 17 tokens both are 0.4 s). At 100 tokens: E2E = 0.4 + 99 × 0.025 = 2.875 s, so
#   100 / 2.875 = **34.8 tokens/s** seen by the user, against a decode rate 1 / TPOT = **40 tokens/s**.
# * The position is r = 0.99 × 19 = 18.81, so p99 = v[18] + 0.81 (v[19] − v[18]): **the two slowest**
#   requests decide it, 81% of the way to the maximum. p99 starts to describe "1 request in 100" when
#   there are well over 100 requests (with 1000, r = 989.01: the 10 slowest lie above it), so report p99
#   from hundreds to thousands of requests, or report p90 with a small sample.
# * softmax([2, 1, 0.5, −1]) = [0.610, 0.224, 0.136, 0.030]: the probability before token 3 is 0.834 ≥ 0.8,
#   so top-p on the unscaled logits keeps **2** tokens. At temperature 2, softmax([1, 0.5, 0.25, −0.5]) =
#   [0.434, 0.263, 0.205, 0.097]: before token 3 is 0.698 < 0.8, so it keeps **3** (renormalized over those
#   three, [0.481, 0.292, 0.227, 0]: the visible test of Part E).
#   A warmer temperature flattens the distribution, so the nucleus widens: applying the temperature after
#   top-p would let it reweight the kept tokens but never bring back a token top-p removed.
# * Cost per 1M tokens = price per hour / (tokens/s × 3600) × 10⁶ (notebook 00, section 7) = 2.00 /
#   (1500 × 3600) × 10⁶ = **$0.370**. Doubling the throughput halves it to **$0.185**; the longer TPOT
#   does not enter the cost (it is paid in each user's latency, which is why services cap the batch by a
#   latency target, not only by memory).
# * It would underestimate. Without a cache, the step that makes token i processes the prompt and the i tokens
#   before it, so its cost grows with i (linearly in the matmuls, quadratically in attention), and a TPOT timed
#   over a short run's first few steps is too small for a long request's later steps. The miss is largest for
#   the long requests and for every request queued behind them: a user's wait is the sum of the underestimated
#   service times ahead, so the error accumulates down the queue, and the p90 E2E, set by the late and long
#   requests, is missed by more than the p50.
