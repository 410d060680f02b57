# %% [markdown] id="c002"
# # Lab 10 — Wanda with 2:4 sparsity, and mixture-of-experts dispatch
#
# In this lab you write two pieces of module 10: the Wanda pruning mask under the 2:4 pattern that sparse
# tensor cores run, and the dispatch of a mixture-of-experts layer with a capacity per expert.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, more tests run on random inputs of random shapes, compared with
#   `course_lib.sparsity`, so write the general code, not the examples' answers.
#
# 3 exercises: 4 + 2 + 4 = 10 points.

# %% id="c003"
import math
import time

import torch

from course_lib.checks import check_close, check_equal, check_shape


# %% [markdown] id="c004"
# ## Exercise 1 — Wanda with a 2:4 constraint (4 points)
#
# Wanda scores weight `W[i, j]` (output row i, input feature j) by `|W[i, j]| * ||X[:, j]||_2`: its
# magnitude times the L2 norm of input feature j over the calibration tokens `X` `[tokens, in_features]`.
#
# The 2:4 pattern: in each row, cut the inputs into consecutive groups of 4 (`j = 0..3`, `4..7`, ...) and
# keep the **2 highest-scoring** weights of each group.
#
# Write `wanda_24_mask(W, X)` returning a **bool** mask shaped like `W` (`True` = kept). Raise `ValueError`
# if `in_features` is not a multiple of 4 or if `X` has the wrong number of features. Hint: reshape the
# scores to `[out, in // 4, 4]` and use `topk` on the last dimension.

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
            "wanda_24_mask: a small weight on a loud feature (column 2) is kept, |-0.5| is not")
_m = wanda_24_mask(torch.randn(6, 16), torch.randn(5, 16))
check_equal(_m.reshape(6, 4, 4).sum(-1), torch.full((6, 4), 2), "wanda_24_mask: kept per group of 4 (exactly 2)")
try:
    wanda_24_mask(torch.randn(2, 6), torch.randn(3, 6))
    raise AssertionError("wanda_24_mask(W [2, 6], ...): expected ValueError (6 is not a multiple of 4)")
except ValueError:
    pass
print("wanda_24_mask: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.sparsity import is_nm as _is_nm
from course_lib.sparsity import wanda_mask as _ref_wanda_mask

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(10):
    _o = int(torch.randint(1, 24, (1,), generator=_g))
    _i = 4 * int(torch.randint(1, 16, (1,), generator=_g))
    _W = torch.randn(_o, _i, generator=_g)
    _X = torch.randn(int(torch.randint(1, 32, (1,), generator=_g)), _i, generator=_g) * (torch.rand(_i, generator=_g) * 20)
    _what = f"wanda_24_mask(W {tuple(_W.shape)}, X {tuple(_X.shape)}) (random test, seed {_seed})"
    _got = wanda_24_mask(_W, _X)
    check_equal(bool(_is_nm(_got, 2, 4, exact=True)), True, _what + ": exactly 2 of every 4")
    check_equal(_got, _ref_wanda_mask(_W, _X.norm(dim=0), n=2, m=4), _what)
### END HIDDEN TESTS

# %% [markdown] id="c007"
# ## Exercise 2 — Capacity (2 points)
#
# Each of `E` experts takes at most `capacity = ceil(capacity_factor * N * k / E)` assignments from a batch
# of `N` tokens that each go to `k` experts (never more than `N`). `capacity_factor=None` means no limit
# (`N`). Write `expert_capacity(N, E, k, capacity_factor)`.

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
### BEGIN HIDDEN TESTS
from course_lib.sparsity import expert_capacity as _ref_cap

_g = torch.Generator().manual_seed(time.time_ns() % 2 ** 31)
for _ in range(20):
    _n, _e = int(torch.randint(1, 500, (1,), generator=_g)), int(torch.randint(1, 64, (1,), generator=_g))
    _k = int(torch.randint(1, _e + 1, (1,), generator=_g))
    _cf = float(torch.rand(1, generator=_g) * 3 + 0.1)
    check_equal(expert_capacity(_n, _e, _k, _cf), _ref_cap(_n, _e, _k, _cf), f"expert_capacity({_n}, {_e}, {_k}, {_cf})")
### END HIDDEN TESTS

# %% [markdown] id="c010"
# ## Exercise 3 — Batched MoE dispatch with capacity (4 points)
#
# The router gave each of the `N` tokens of `x` `[N, D]` its `k` experts `indices` `[N, k]` (column 0 the
# first choice) and their mixing `weights` `[N, k]`. `experts` is a list of `E` modules, each mapping
# `[n, D] -> [n, D]`. The output is `y[t] = sum_j weights[t, j] * experts[indices[t, j]](x[t])` over the
# assignments that are **kept**:
#
# * priority: every token's first choice comes before any second choice; within a choice, tokens in order
#   (token 0, 1, 2, ...). An expert that already holds `capacity` assignments **drops** the next ones
#   (they add nothing to `y`);
# * `capacity=None`: nothing is dropped.
#
# Return `(y, dropped)`, `dropped` the number of dropped assignments (an int). Do it batched: call each
# expert **once** on all of its kept tokens (sort the assignments by expert with a stable sort; the
# position of an assignment within its expert tells whether it fits), then add the weighted outputs
# back (`index_add_`).

# %% id="c011" nbgrader={"grade": false, "grade_id": "dispatch", "locked": false, "schema_version": 3, "solution": true, "task": false}
def moe_dispatch(x, experts, weights, indices, capacity=None):
    ### BEGIN SOLUTION
    N, k = indices.shape
    E = len(experts)
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
check_close(_y, torch.tensor([[7.75], [15.5], [0.0]]), "moe_dispatch with capacity 2")
check_equal(_d, 2, "moe_dispatch with capacity 2: dropped assignments")
_idx = torch.tensor([[0, 1], [1, 0], [0, 1]])
_y, _d = moe_dispatch(_x, _experts, _w, _idx, 2)
# first choices first: t0->0, t1->1, t2->0 (expert 0 full); then t0->1 (expert 1 full); t1->0, t2->1 dropped
check_close(_y, torch.tensor([[0.75 + 2.5], [15.0], [2.25]]),
            "moe_dispatch, capacity 2: all first choices are placed before any second choice")
check_equal(_d, 2, "moe_dispatch, capacity 2 (second example): dropped")
print("moe_dispatch: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.sparsity import Expert as _Expert
from course_lib.sparsity import dispatch_loop as _ref_loop
from course_lib.sparsity import expert_capacity as _ref_capacity

_g = torch.Generator().manual_seed(time.time_ns() % 2 ** 31)
for _ in range(6):
    _N, _D = int(torch.randint(1, 60, (1,), generator=_g)), int(torch.randint(2, 12, (1,), generator=_g))
    _E = int(torch.randint(1, 7, (1,), generator=_g))
    _k = int(torch.randint(1, _E + 1, (1,), generator=_g))
    torch.manual_seed(int(torch.randint(0, 10**6, (1,), generator=_g)))
    _experts = [_Expert(_D, 8) for _ in range(_E)]
    _x = torch.randn(_N, _D, generator=_g)
    _idx = torch.stack([torch.randperm(_E, generator=_g)[:_k] for _ in range(_N)])
    for _t in range(_N // 2):                                     # crowd expert 0: first choice of half
        _row = _idx[_t]
        _j = (_row == 0).nonzero()
        if len(_j):
            _row[int(_j[0])] = _row[0].clone()
        _row[0] = 0
    _w = torch.softmax(torch.randn(_N, _k, generator=_g), -1)
    for _cf in (None, 0.5, 1.0):
        _cap = None if _cf is None else _ref_capacity(_N, _E, _k, _cf)
        _what = f"moe_dispatch(N={_N}, D={_D}, E={_E}, k={_k}, capacity={_cap}) (random test)"
        with torch.no_grad():
            _ry, _rload, _rd = _ref_loop(_x, _experts, _w, _idx, _cap)
            _y, _d = moe_dispatch(_x, _experts, _w, _idx, _cap)
        check_close(_y, _ry, _what + ": y", rtol=1e-4, atol=1e-5)
        check_equal(int(_d), _rd, _what + ": dropped")
### END HIDDEN TESTS

# %% [markdown] id="c013"
# That is the dispatch of `course_lib.sparsity.MoEMLP`. Notebook 10 trains one and shows the load per
# expert with and without the balancing loss.
