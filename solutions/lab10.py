# %% [markdown] id="c002"
# # Lab 10 — Wanda with 2:4 sparsity, and mixture-of-experts dispatch
#
# In this lab you design two pieces of module 10 from their contracts: the Wanda pruning mask under the
# 2:4 pattern that sparse tensor cores run, and the batched dispatch of a mixture-of-experts layer with a
# capacity per expert. Then you predict how many assignments a capacity drops, and let your dispatch
# measure it.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, the grader calls your functions on inputs of its own (drawn for you, of random
#   shapes, and an edge grid: a full expert, a capacity of 0, an expert nobody picks, the bad inputs of each
#   contract) and compares the results with `course_lib.sparsity`, so write the general code, not the
#   examples' answers. Do not import that reference: the grader flags an answer that does, and while it
#   grades, the reference is not in the library.
# * The two contract parts state what the function must take, give, keep and refuse; how is up to you.
#   The steps are in hints you can open.
#
# 5 exercises: 4 (contract) + 2 + 4 (contract) + 2 (prediction) + 2 (written, graded by your instructor)
# = 14 points.

# %% id="c003"
import math
import os

import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape

# Known misconceptions: a test that recognises one names it (public text, pointing to notebook 10)
MISTAKES = {
    "magnitude_only": "the mask ranks the weights by |W| alone: Wanda's score is |W[i, j]| times the L2 norm of "
                      "input feature j over the calibration tokens, so a small weight on a loud feature can matter "
                      "more than a large weight on a quiet one; see notebook 10, section '2. Wanda and the 2:4 "
                      "pattern'",
    "capacity_floor": "the capacity was rounded down: a fraction of a slot still needs a whole one, so the "
                      "capacity is the ceiling of capacity_factor * N * k / E (at most N); see notebook 10, "
                      "section '5. Mixture of experts'",
    "no_capacity": "the dispatch never drops an assignment: an expert that already holds `capacity` assignments "
                   "must drop the next ones (first choices are placed before second choices); see notebook 10, "
                   "section '5. Mixture of experts'",
    "pooled_capacity": "the capacity is pooled over the experts (max(0, N*k - E*capacity)): it is per expert, an "
                       "idle slot of one expert cannot take another expert's token, so the dropped count is "
                       "the sum over experts of what each one's load exceeds its capacity by; see notebook 10, "
                       "section '5. Mixture of experts'",
    "drops_at_mean_load": "the drops of the MEAN load, max(0, N * r - capacity) per expert: a batch's load scatters "
                          "around its mean, and the batches above the capacity drop while those below save "
                          "nothing, so the expected drops are more (an even router at capacity factor 1 drops "
                          "on most batches, though its mean load fits exactly); see notebook 10, section "
                          "'5. Mixture of experts'",
    "assignments_independent": "each of the N * k assignments treated as an independent draw (a load of "
                               "Binomial(N * k, r / k)): a token's k choices are k DIFFERENT experts, so an "
                               "expert gets at most one assignment per token and its load counts tokens: "
                               "Binomial(N, r), whose spread is smaller; see notebook 10, section '5. Mixture of "
                               "experts'",
}


# %% [markdown] id="c004"
# ## Exercise 1 — Wanda with a 2:4 constraint (4 points, contract)
#
# Wanda [@sun2024simple] scores weight `W[i, j]` (output row i, input feature j) by `|W[i, j]| * ||X[:, j]||_2`:
# its magnitude times the L2 norm of input feature j over the calibration tokens. The 2:4 pattern that sparse
# tensor cores run [@mishra2021accelerating]: in each row, every group of 4 consecutive inputs (`j = 0..3`,
# `4..7`, ...) keeps 2.
#
# **Contract.** `wanda_24_mask(W, X)`:
#
# * *inputs*: `W` `[out_features, in_features]` (float), `X` `[tokens, in_features]` (the calibration
#   activations that enter this layer, float);
# * *output*: a `torch.bool` mask shaped like `W`, `True` = kept;
# * *invariants*: exactly 2 `True` in every group of 4 consecutive inputs of every row, and they are the 2
#   highest Wanda scores of that group (scores differ on random inputs: ties are not tested); the mask
#   does not depend on the scale of `X` (multiplying `X` by 10 changes nothing);
# * *cost*: vectorised, `O(out * in)` work and memory beyond `X` (no Python loop over rows or groups);
# * *errors*: `ValueError` if `in_features` is not a multiple of 4, or `X` is not 2-D with `in_features`
#   columns.
#
# <details><summary>Hint: one way with tensors</summary>
#
# 1. The norms of the input features: `X.norm(dim=0)`, shape `[in]`; broadcast them over the rows of `|W|`.
# 2. Reshape the scores to `[out, in // 4, 4]`; `topk(2, dim=-1).indices` are the kept positions of each group.
# 3. `scatter_` `True` at those positions into a bool tensor of zeros, and reshape back to `[out, in]`.
#
# </details>

# %% id="c005" nbgrader={"grade": false, "grade_id": "wanda", "locked": false, "schema_version": 3, "solution": true, "task": false}
def wanda_24_mask(W, X):
    """Bool mask [out, in]: the 2 highest |W| * ||X_j|| of every 4 consecutive inputs of each row."""
    ### BEGIN SOLUTION
    out_f, in_f = W.shape
    if in_f % 4:
        raise ValueError(f"in_features must be a multiple of 4, got {in_f}")
    if X.dim() != 2 or X.shape[1] != in_f:
        raise ValueError(f"X must be [tokens, {in_f}], got {tuple(X.shape)}")
    scores = W.abs() * X.float().norm(dim=0)[None, :]                       # [out, in]
    groups = scores.reshape(out_f, in_f // 4, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return keep.reshape(out_f, in_f)
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "wanda_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
_W = torch.tensor([[0.9, -0.5, 0.1, 0.2, 1.0, 2.0, -3.0, 4.0]])
_X = torch.tensor([[1.0, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                   [1.0, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
_m = wanda_24_mask(_W, _X)
check_equal(_m.dtype, torch.bool, "wanda_24_mask: dtype of the mask")
check_shape(_m, (1, 8), "wanda_24_mask(W [1, 8], X [2, 8])")
# ||X_j|| = sqrt(2) except feature 2 (sqrt(200)): 0.1 * 14.1 = 1.41 beats 0.5 * 1.41 = 0.71
check_equal(_m, torch.tensor([[True, False, True, False, False, False, True, True]]),
            "wanda_24_mask: a small weight on a loud feature (column 2) is kept, |-0.5| is not",
            mistakes={MISTAKES["magnitude_only"]: torch.tensor([[True, True, False, False, False, False, True, True]])})
_m = wanda_24_mask(torch.randn(6, 16), torch.randn(5, 16))
check_equal(_m.reshape(6, 4, 4).sum(-1), torch.full((6, 4), 2), "wanda_24_mask: kept per group of 4 (exactly 2)")
_W, _X = torch.randn(3, 8), torch.randn(4, 8)
check_equal(wanda_24_mask(_W, 10 * _X), wanda_24_mask(_W, _X), "wanda_24_mask(W, 10 * X) vs wanda_24_mask(W, X)")
check_raises(lambda: wanda_24_mask(torch.randn(2, 6), torch.randn(3, 6)), ValueError,
             "wanda_24_mask(W [2, 6], X [3, 6]) (6 is not a multiple of 4)")
check_raises(lambda: wanda_24_mask(torch.randn(2, 8), torch.randn(3, 4)), ValueError,
             "wanda_24_mask(W [2, 8], X [3, 4]) (X has 4 features, W 8 inputs)")
print("wanda_24_mask: visible tests passed")

# %% [markdown] id="c007"
# ## Exercise 2 — Capacity (2 points)
#
# Each of `E` experts takes at most `capacity = ceil(capacity_factor * N * k / E)` assignments from a batch
# of `N` tokens that each go to `k` experts (never more than `N`; the capacity factor of the Switch
# Transformer [@fedus2022switch], for `k` choices). `capacity_factor=None` means no limit
# (`N`). Write `expert_capacity(N, E, k, capacity_factor)`, computing the expression in floating point as it
# is written (the grader's reference does: `1.1 * 100 * 1 / 11` is 10.000000000000002, so that capacity is 11).

# %% id="c008" nbgrader={"grade": false, "grade_id": "capacity", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_capacity(N, E, k, capacity_factor):
    ### BEGIN SOLUTION
    if capacity_factor is None:
        return N
    return min(N, math.ceil(capacity_factor * N * k / E))
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "capacity_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_equal(expert_capacity(100, 8, 2, 1.0), 25, "expert_capacity(100 tokens, 8 experts, k=2, cf=1.0)")
check_equal(expert_capacity(100, 8, 2, 1.25), 32, "expert_capacity(100, 8, 2, 1.25): ceil(31.25)")
check_equal(expert_capacity(10, 2, 2, 4.0), 10, "expert_capacity(10, 2, 2, 4.0): never more than N")
check_equal(expert_capacity(10, 4, 1, None), 10, "expert_capacity(..., None): no limit")
print("expert_capacity: visible tests passed")

# %% [markdown] id="c010"
# ## Exercise 3 — Batched MoE dispatch with capacity (4 points, contract)
#
# The router gave each of the `N` tokens of `x` its `k` experts and their mixing weights. Write
# `moe_dispatch(x, experts, weights, indices, capacity=None)`.
#
# **Contract.**
#
# * *inputs*: `x` `[N, D]`; `experts`, a list of `E` modules, each mapping `[n, D] -> [n, D]`; `indices`
#   `[N, k]` integer expert numbers in `[0, E)` (column 0 the first choice); `weights` `[N, k]`;
#   `capacity`, an int >= 0 (assignments each expert keeps) or `None` (no limit);
# * *output*: `(y, dropped)`: `y` `[N, D]`, `y[t] = sum_j weights[t, j] * experts[indices[t, j]](x[t])` over
#   the **kept** assignments only; `dropped` (an int), the number of assignments not kept;
# * *priority (which are kept)*: every token's first choice comes before any second choice; within a
#   choice, tokens in order (token 0, 1, 2, ...); an expert that already holds `capacity` assignments
#   drops the next ones;
# * *cost*: each expert is called **at most once** per dispatch, on all of its kept tokens together (a
#   per-token loop is `N * k` small calls: the slow reference this replaces); no expert is called on an
#   empty batch;
# * *errors*: `ValueError` if `indices` and `weights` are not both `[N, k]`, an index is outside
#   `[0, E)`, or `capacity` is negative.
#
# <details><summary>Hint 1: the order of the assignments</summary>
#
# Flatten the `N * k` assignments *choice-major* (`indices.t().reshape(-1)`: all first choices, then all
# second choices), with the token and the weight of each. That order is the priority order.
#
# </details>
#
# <details><summary>Hint 2: which assignments fit</summary>
#
# 1. Sort the flat assignments by expert with a **stable** sort: inside each expert they stay in priority order.
# 2. `torch.bincount` gives the assignments per expert; their cumulative sum, where each expert's run starts.
# 3. An assignment's position within its expert's run (its index in the sorted order minus its expert's
#    start) is `< capacity` exactly when it is kept.
# 4. For each expert, run it once on the tokens of its kept assignments and `index_add_` the weighted
#    outputs into `y`.
#
# </details>

# %% id="c011" nbgrader={"grade": false, "grade_id": "dispatch", "locked": false, "schema_version": 3, "solution": true, "task": false}
def moe_dispatch(x, experts, weights, indices, capacity=None):
    ### BEGIN SOLUTION
    N, k = indices.shape
    E = len(experts)
    if weights.shape != indices.shape or indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices and weights must both be [N={x.shape[0]}, k], got {tuple(indices.shape)} "
                         f"and {tuple(weights.shape)}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= E):
        raise ValueError(f"indices must be expert numbers in [0, {E})")
    if capacity is not None and capacity < 0:
        raise ValueError(f"capacity must be None or >= 0, got {capacity!r}")
    cap = N * k if capacity is None else capacity
    flat_e = indices.t().reshape(-1)                                       # choice-major [k*N]
    flat_tok = torch.arange(N).repeat(k)
    flat_w = weights.t().reshape(-1)
    order = torch.sort(flat_e, stable=True).indices
    counts = torch.bincount(flat_e, minlength=E)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(k * N) - starts[flat_e[order]]
    kept = order[rank < cap]
    kept_counts = torch.clamp(counts, max=cap)
    y = torch.zeros_like(x)
    offset = 0
    for e, c in enumerate(kept_counts.tolist()):
        if c:
            sel = kept[offset:offset + c]
            y.index_add_(0, flat_tok[sel], flat_w[sel, None] * experts[e](x[flat_tok[sel]]))
        offset += c
    return y, int(k * N - kept_counts.sum())
    ### END SOLUTION


# %% id="c012" nbgrader={"grade": true, "grade_id": "dispatch_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
class _Scale(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x):
        return self.c * x


_experts = [_Scale(1.0), _Scale(10.0)]
_x = torch.tensor([[1.0], [2.0], [3.0]])
_idx = torch.tensor([[1, 0], [1, 0], [1, 0]])          # everyone's first choice is expert 1
_w = torch.tensor([[0.75, 0.25], [0.75, 0.25], [0.75, 0.25]])
_y, _d = moe_dispatch(_x, _experts, _w, _idx, None)
check_close(_y, torch.tensor([[7.75], [15.5], [23.25]]), "moe_dispatch without capacity")
check_equal(_d, 0, "moe_dispatch without capacity: dropped")
_y, _d = moe_dispatch(_x, _experts, _w, _idx, 2)
# expert 1 takes tokens 0 and 1 (first choices); then expert 0 takes tokens 0 and 1 (second choices): token 2
# loses both of its assignments
check_close(_y, torch.tensor([[7.75], [15.5], [0.0]]), "moe_dispatch with capacity 2",
            mistakes={MISTAKES["no_capacity"]: torch.tensor([[7.75], [15.5], [23.25]])})
check_equal(_d, 2, "moe_dispatch with capacity 2: dropped assignments")
_idx = torch.tensor([[0, 1], [1, 0], [0, 1]])
_y, _d = moe_dispatch(_x, _experts, _w, _idx, 2)
# first choices first: t0->0, t1->1, t2->0 (expert 0 full); then t0->1 (expert 1 full); t1->0, t2->1 dropped
check_close(_y, torch.tensor([[0.75 + 2.5], [15.0], [2.25]]),
            "moe_dispatch, capacity 2: all first choices are placed before any second choice")
check_equal(_d, 2, "moe_dispatch, capacity 2 (second example): dropped")


class _Counted(torch.nn.Module):
    """An expert that counts its calls."""
    def __init__(self, c):
        super().__init__()
        self.c, self.calls = c, 0

    def forward(self, x):
        self.calls += 1
        if x.shape[0] == 0:
            raise AssertionError("an expert was called on an empty batch")
        return self.c * x


_experts = [_Counted(1.0), _Counted(2.0), _Counted(3.0)]
_idx = torch.tensor([[0, 1]] * 6)
moe_dispatch(torch.randn(6, 2), _experts, torch.full((6, 2), 0.5), _idx, 4)
check_equal([e.calls for e in _experts], [1, 1, 0], "calls of each expert in one dispatch of 6 tokens "
            "(experts 0 and 1 get tokens, expert 2 none)")
check_raises(lambda: moe_dispatch(_x, [_Scale(1.0)] * 2, _w[:, :1], _idx[:3], 2), ValueError,
             "moe_dispatch with weights [3, 1] and indices [3, 2]")
check_raises(lambda: moe_dispatch(_x, [_Scale(1.0)] * 2, _w, torch.tensor([[0, 2]] * 3), 2), ValueError,
             "moe_dispatch with expert 2 of 2 experts")
check_raises(lambda: moe_dispatch(_x, [_Scale(1.0)] * 2, _w, torch.tensor([[0, 1]] * 3), -1), ValueError,
             "moe_dispatch with capacity -1")
print("moe_dispatch: visible tests passed")

# %% [markdown] id="c014"
# ## Exercise 4 — Predict the dropped assignments (2 points)
#
# Notebook 10 counts the drops of one batch whose router has already chosen. Before a batch arrives, all
# you know is the router's habit: how often each expert is among a token's choices. Predict what a batch
# drops on average:
#
# * `route_probs[e]` is the probability that expert `e` is one of a token's `k` choices (each in [0, 1];
#   they add up to `k`, since a token chooses `k` different experts); the `N` tokens of a batch choose
#   independently of each other (how a token's `k` choices depend on each other is not given: it is not
#   needed);
# * the dispatch keeps at most `expert_capacity(N, E, k, capacity_factor)` assignments per expert (your
#   Exercise 2; `E = len(route_probs)`) and drops the rest.
#
# Write `predict_dropped(route_probs, N, k, capacity_factor)`: the **expected** number of dropped
# assignments in a batch of `N` tokens, a float (0 with `capacity_factor=None`, once the arguments have been
# checked: bad arguments are refused with `capacity_factor=None` too). Raise `ValueError` if `N`
# or `k` is not an integer >= 1, if `k > E`, if a probability is outside [0, 1], or if they do not add up
# to `k` (within 1e-6). The grader draws its own routers and batches (`N` up to a few hundred) and compares
# with the exact expectation, within `1e-6` relative.
#
# The visible tests check units, limits and what must hold whatever the formula; the cell after them runs a
# router many times through your dispatch and puts the average beside your prediction.
#
# <details><summary>Hint 1: one expert at a time</summary>
#
# The drops add up over the experts, and an expectation of a sum is the sum of the expectations, however
# the experts' loads depend on each other. So what you need is one expert's load in a batch: how is it
# distributed? Pitfall: a token cannot choose the same expert twice.
# </details>
#
# <details><summary>Hint 2: the mean is not enough</summary>
#
# The drops of a batch are a function of its loads that is flat below the capacity and rises above it.
# Pitfall: putting the mean load into that function; the batches above the capacity count, those below do
# not give anything back. A router that is even on average is the case to check your reasoning on.
# </details>

# %% id="c015" nbgrader={"grade": false, "grade_id": "predict_dropped", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_dropped(route_probs, N, k, capacity_factor):
    ### BEGIN SOLUTION
    probs = [float(r) for r in route_probs]
    for name, v in (("N", N), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if k > len(probs):
        raise ValueError(f"k must be <= the number of experts {len(probs)}, got {k}")
    if any(not 0 <= r <= 1 for r in probs):
        raise ValueError(f"route_probs must each be in [0, 1], got {probs}")
    if abs(sum(probs) - k) > 1e-6:
        raise ValueError(f"route_probs must add up to k = {k}, got {sum(probs)}")
    cap = expert_capacity(N, len(probs), k, capacity_factor)
    expected = 0.0
    for r in probs:               # linearity: expert by expert, whatever ties the experts' loads together
        if r in (0.0, 1.0):       # a load of exactly N * r
            expected += max(0.0, N * r - cap)
            continue
        for x in range(cap + 1, N + 1):   # the load counts tokens: Binomial(N, r)
            log_pmf = (math.lgamma(N + 1) - math.lgamma(x + 1) - math.lgamma(N - x + 1)
                       + x * math.log(r) + (N - x) * math.log1p(-r))
            expected += (x - cap) * math.exp(log_pmf)
    return expected
    ### END SOLUTION


# %% id="c016" nbgrader={"grade": true, "grade_id": "predict_dropped_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _dropped(probs, N, k, cf):
    got = predict_dropped(probs, N, k, cf)
    what = f"predict_dropped({probs}, N={N}, k={k}, capacity_factor={cf})"
    check_equal(isinstance(got, float) and 0 <= got <= N * k, True,
                f"{what} = {got!r}: an expected count of assignments, a float in [0, N * k]")
    return got


_even, _skew = [0.25] * 8, [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.55]       # top-2 of 8 experts
check_close(_dropped(_skew, 256, 2, None), 0.0, "capacity_factor=None drops nothing")
check_close(_dropped([1.0, 1.0, 0.0, 0.0], 40, 2, 0.5), _dropped([1.0, 1.0, 0.0, 0.0], 40, 2, 0.75) + 10.0,
            "a router that always picks experts 0 and 1 (every load fixed at N = 40): capacity 10 at factor 0.5, 15 "
            "at 0.75, so 2 x 5 more drops at 0.5")
for _probs in (_even, _skew):
    _curve = [_dropped(_probs, 256, 2, _cf) for _cf in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)]
    check_equal(all(x >= y for x, y in zip(_curve, _curve[1:])), True, f"a larger capacity factor never drops "
                f"more: {[round(x, 3) for x in _curve]} for factors 0.5 to 2.0 (route_probs {_probs})")
check_equal(_dropped(_even, 256, 2, 1.0) > 1.0, True, "an even router at capacity factor 1: every expert's MEAN "
            "load is exactly its capacity, yet a batch's loads scatter around their means: the expected drops are "
            "well above 0 (is your prediction the drops of the mean load?)")
check_equal(_dropped(_skew, 256, 2, 1.0) > _dropped(_even, 256, 2, 1.0), True,
            "a skewed router drops more than an even one at the same capacity")
for _bad in (([0.5, 0.5], 10, 2, 1.0), ([1.2, -0.2], 10, 1, 1.0), ([1.0], 10, 2, 1.0), ([0.5, 0.5], 0, 1, 1.0),
             ([0.5, 0.5], 10.0, 1, 1.0)):
    check_raises(lambda: predict_dropped(*_bad), ValueError, f"predict_dropped{_bad}")
print("predict_dropped: visible tests passed")

# %% [markdown] id="c017"
# Now measure: two routers send each of 512 tokens to its top-2 of 8 experts, one with a fixed bias towards
# some experts, one even. Each router's `route_probs` come from a long run of it (100,000 tokens); then 100
# batches of 512 fresh tokens go through your dispatch at each capacity factor, and the average drops stand
# beside your prediction (and beside the drops of the mean load).

# %% id="c018"
if os.environ.get("NBGRADER_EXECUTION"):        # a measurement, not a test: the grader skips it
    print("the measurement is skipped while grading")
else:
    try:
        torch.manual_seed(1)
        _N, _E, _k = 512, 8, 2
        _bias = torch.linspace(0, 1.5, _E)
        _routers = {"skewed": lambda n: (torch.randn(n, _E) + _bias).topk(_k, dim=-1).indices,
                    "even": lambda n: torch.rand(n, _E).topk(_k, dim=-1).indices}
        _experts = [torch.nn.Linear(16, 16) for _ in range(_E)]
        for _name, _route in _routers.items():
            _probs = (torch.bincount(_route(100_000).reshape(-1), minlength=_E) / 100_000).tolist()
            _probs = [r * _k / sum(_probs) for r in _probs]                          # exactly k in all
            print(f"{_name} router, route_probs {[round(r, 3) for r in _probs]} (even: {_k / _E})")
            _batches = [(torch.randn(_N, 16), torch.softmax(torch.randn(_N, _k), -1), _route(_N)) for _ in range(100)]
            for _cf in (1.0, 1.25, 1.5, 2.0, 2.25):
                _cap = expert_capacity(_N, _E, _k, _cf)
                with torch.no_grad():
                    _d = [int(moe_dispatch(_x, _experts, _w, _i, _cap)[1]) for _x, _w, _i in _batches]
                _mean_load = sum(max(0.0, _N * r - _cap) for r in _probs)
                print(f"  capacity factor {_cf:4.2f}: capacity {_cap:4d}, predicted "
                      f"{predict_dropped(_probs, _N, _k, _cf):7.2f} dropped, measured {sum(_d) / len(_d):7.2f} on "
                      f"average over {len(_d)} batches ({min(_d)} to {max(_d)}); the drops of the mean load: "
                      f"{_mean_load:6.2f}")
    except NotImplementedError:
        print("finish the exercises first")

# %% [markdown] id="c013"
# That is the dispatch of `course_lib.sparsity.MoEMLP`. Notebook 10 trains one and shows the load per
# expert with and without the balancing loss.

# %% [markdown] id="c019"
# ## Going further (not graded)
#
# * From the skewed router's `route_probs` that the measurement printed, which capacity factor brings the
#   expected drops under one assignment per batch? Compare it with the factor at which the busiest expert's
#   mean load just fits, and say why the two differ.
# * How many bytes does a 4096 x 4096 fp16 weight take dense, and in the 2:4 compressed format of sparse
#   tensor cores (the kept values plus a 2-bit position for each)? What is the most a 2:4 matmul can gain?

# %% [markdown] id="cw10p"
# ## Exercise 5 — Written analysis: dropped assignments and the capacity factor (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Answer in 100 to 200 words, about the
# output of the cell after Exercise 4 (it is skipped while grading):
#
# 1. quote the skewed router's `route_probs` and, for two capacity factors, the predicted drops, the measured
#    average (and its range over the batches) and the drops of the mean load; explain why prediction and
#    measurement agree only on average, and why your dispatch's priority order, which decides which
#    assignments are dropped, cannot change how many;
# 2. explain why the drops of the mean load are close to the prediction for the skewed router at factor 1.0
#    but far from it for the even router, and why the skewed router's drops fall fast at first, then slowly,
#    as the factor grows;
# 3. say what a dropped assignment costs the model's output, and what each of the two remedies (a larger
#    capacity factor, a balancing loss on the router) costs instead.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw10" nbgrader={"grade": true, "grade_id": "written_capacity", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on a 2-core CPU, torch 2.13; your
# numbers will differ: what matters is how you explain them.)*
#
# The skewed router's `route_probs` were [0.067, 0.098, 0.136, 0.19, 0.256, 0.329, 0.417, 0.507] (even would be
# 0.25 each, a mean load of 128 of 512 tokens x 2 / 8). At capacity factor 1.0 (capacity 128) I predicted 263.26
# drops per batch and measured 264.89 on average (232 to 291); the drops of the mean load were 260.70. At 1.25
# (capacity 160): 162.86, 163.96 (130 to 196) and 161.58. The prediction is an expectation: each batch's loads
# are random, so single batches scatter by tens and the average of 100 agrees within its own noise (and
# `route_probs` are themselves estimated). The priority order cannot move the count: an expert keeps
# min(load, capacity) of its assignments whatever the order, which picks which ones are dropped, never how
# many, so a batch drops exactly the sum over experts of max(0, load - capacity).
#
# For the skewed router at 1.0 the mean load's drops are close (260.70 against 263.26) because the three busiest
# experts' loads (about 168, 213 and 260) sit far above 128 in every batch, where drops are linear in the load;
# only the expert near its capacity (0.256, about 131) adds the difference. The even router's experts all sit at
# the capacity: the batches above it drop, those below give nothing back, so it expects 31.26 (measured 32.94)
# where its mean loads drop 1.03. Each step of 32 in capacity removes 32 drops for every expert still above it:
# drops fall fast while several overflow (263 to 163 to 89), then slowly, when only the busiest, whose mean load
# just fits at factor 2.03, overflows by its spread (6.65 at 2.0, 0.02 at 2.25).
#
# A dropped assignment contributes nothing: the token gets its other expert's output only, or passes through
# the residual connection alone if both were dropped, a silent change of the model's function. A larger
# capacity factor reserves capacity x experts slots of compute and memory per batch, padding mostly empty
# buffers when the load is even. A balancing loss spreads the load so a small factor suffices, but it pulls the
# router away from the experts it would otherwise prefer, a possible cost in quality.

# %% [markdown] id="c020" tags=["answer-key"]
# ### Answer key
#
# * **No drops.** The skewed router's busiest expert is among a token's two choices with probability about
#   0.51, a mean load of about 260 of 512 tokens, so its mean fits from `cf = 260 / 128 = 2.03`. The expected
#   drops are still about 6.6 per batch at `cf = 2.0` (capacity 256) and 3.1 at 2.05 (capacity 263); they fall
#   under one at `cf = 2.15` (capacity 276: 0.38) and to 0.02 at 2.25. The gap is the spread of a batch's
#   load: Binomial(512, 0.51) has a standard deviation of about 11 tokens, so a capacity one or two standard
#   deviations above the mean load is what makes drops rare, not the mean itself. Balancing (notebook 10,
#   section 5, the Switch Transformer's loss [@fedus2022switch]) lowers the busiest expert's share; the spread
#   of an even router remains, which is why even then a capacity factor a little above 1 is used.
# * **2:4 storage.** Dense: 4096 * 4096 * 2 bytes = 32 MiB. 2:4 keeps 8,388,608 values (16 MiB) plus 2 bits
#   of position for each (2 MiB): 18 MiB, 1.78x smaller. A sparse tensor core skips the zero half of the
#   multiply-adds, so the matmul itself gains at most 2x; a whole model gains less, because attention, the
#   norms and the activations are unchanged (and a memory-bound decode step gains at most the 1.78x of the
#   bytes read).
#
# #### Exercise 4's prediction, the reasoning behind the solution
#
# The dropped assignments of a batch are `sum_e max(0, X_e - c)`, with `X_e` expert `e`'s load and `c` the
# capacity. The loads are not independent (they add up to `N k`), but an expectation of a sum is the sum of
# the expectations whatever the dependence, so each expert can be taken alone. A token chooses `k`
# different experts, so it gives expert `e` one assignment with probability `r_e` and none otherwise; the
# tokens choose independently, so `X_e` is Binomial(`N`, `r_e`), and `E[max(0, X_e - c)]` is the sum over
# `x > c` of `(x - c) P(X_e = x)`. The function `max(0, x - c)` is convex: by Jensen's inequality the
# expectation is at least the drops of the mean load, `max(0, N r_e - c)`, and much more near the capacity.
# An even router (`r_e = k / E`) at `cf = 1` has a mean load equal to its capacity: the mean says 0 drops,
# while the loads' spread (a standard deviation of `sqrt(N r (1 - r))`, 9.8 tokens for `N = 512`,
# `r = 0.25`) gives 31.2 expected drops per batch (the measurement: 32.9 over 100 batches, from 13 to 57).
# Treating the `N k` assignments as independent draws gives Binomial(`N k`, `r_e / k`), a larger spread
# (10.6 tokens here) and too many drops; pooling the capacity over the experts gives `max(0, N k - E c)`,
# 0 at any `cf >= 1`.
