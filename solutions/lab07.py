# %% [markdown] id="c002"
# # Lab 07 · Online softmax and tiled attention
#
# In this lab you write the two ideas FlashAttention is made of (Module 07):
#
# * **Part A (4 points): online softmax.** Softmax of a row read in pieces, with a running max and a
#   running sum.
# * **Part B (3 points): tiled attention.** Exact attention computed tile by tile, never building the
#   N x N score matrix.
# * **Part C (3 points): causal tiles.** The same function with a causal mask: skip the tiles in the
#   future, mask the diagonal ones.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, **hidden tests** run your code
#   on random shapes and lengths that are not multiples of the tile size, against the course's reference.
# * PyTorch only; do not import `course_lib.attention` (the hidden tests check that the code is your own).
# * Everything runs on a CPU in seconds. Total: 10 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import time

import torch
from torch.overrides import TorchFunctionMode

from course_lib.checks import check_close, check_raises, check_shape


class _LargestScores(TorchFunctionMode):
    """Records the widest last dimension of any matmul / exp / softmax result (the tests use it to see
    that attention really went tile by tile)."""

    OPS = {"matmul", "__matmul__", "bmm", "einsum", "exp", "softmax", "mm"}

    def __init__(self):
        super().__init__()
        self.widest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in self.OPS and isinstance(out, torch.Tensor) and out.dim() >= 1:
            self.widest = max(self.widest, out.shape[-1])
        return out


# %% [markdown] id="c004"
# ## Part A · Online softmax (4 points)
#
# softmax(x)_i = exp(x_i - m) / l, with m = max_j x_j (for stability) and l = sum_j exp(x_j - m). To
# compute it while reading x in pieces, keep the max `m` and the sum `l` of what you have seen. When a
# new piece arrives with a larger maximum, the sum so far was computed against the old max and must be
# **rescaled** by exp(m_old - m_new).
#
# 1. `online_softmax_update(m, l, piece)`: `m`, `l` are tensors of shape `[rows]` (the running max and
#    sum), `piece` is `[rows, n]`, the next `n` values of each row. Return the new `(m, l)`. At the start
#    `m` is `-inf` and `l` is 0: make sure that first step gives no NaN (`exp(-inf - (-inf))` is NaN;
#    `exp(-inf)` is 0).
# 2. `online_softmax(x, block_size)`: softmax over the last axis of `x` `[rows, N]`, reading the row in
#    pieces of `block_size` columns (the last piece may be shorter) with `online_softmax_update`, then
#    normalizing: `exp(x - m) / l`. Raise `ValueError` when `block_size < 1`.

# %% id="c005" nbgrader={"grade": false, "grade_id": "online_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def online_softmax_update(m, l, piece):
    """Fold piece [rows, n] into the running max m [rows] and sum l [rows]; return (m_new, l_new)."""
    ### BEGIN SOLUTION
    m_new = torch.maximum(m, piece.max(dim=-1).values)
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    l_new = l * torch.exp(m - m_safe) + torch.exp(piece - m_safe[:, None]).sum(dim=-1)
    return m_new, l_new
    ### END SOLUTION


def online_softmax(x, block_size):
    """softmax(x, dim=-1) for x [rows, N], read in pieces of block_size columns."""
    ### BEGIN SOLUTION
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    m = torch.full(x.shape[:-1], float("-inf"))
    l = torch.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block_size):
        m, l = online_softmax_update(m, l, x[:, start:start + block_size])
    return torch.exp(x - m[:, None]) / l[:, None]
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "online_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
_x = torch.tensor([[1.0, 3.0, 0.5, 2.0, 6.0, 1.5, 4.0]])
_m, _l = online_softmax_update(torch.tensor([-math.inf]), torch.tensor([0.0]), _x[:, :3])
check_close(_m, [3.0], "online_softmax_update from the start, piece [1, 3, 0.5]: m")
check_close(_l, [math.exp(-2) + 1 + math.exp(-2.5)], "online_softmax_update from the start, piece [1, 3, 0.5]: l")
_m, _l = online_softmax_update(_m, _l, _x[:, 3:6])       # the max grows from 3 to 6: l must be rescaled
check_close(_m, [6.0], "second piece [2, 6, 1.5]: m")
check_close(_l, torch.exp(_x[:, :6] - 6).sum(-1), "second piece [2, 6, 1.5]: l (did you rescale the old sum "
            "by exp(m_old - m_new)?)", rtol=1e-5)
for _bs in (1, 2, 3, 7, 10):
    check_close(online_softmax(_x, _bs), _x.softmax(-1), f"online_softmax(x, block_size={_bs})", rtol=1e-5,
                atol=1e-7)
check_raises(lambda: online_softmax(_x, 0), ValueError, "online_softmax with block_size=0")
### BEGIN HIDDEN TESTS
from course_lib.attention import online_softmax_stats as _ref_stats

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _rows, _n = int(torch.randint(1, 6, (1,), generator=_g)), int(torch.randint(1, 90, (1,), generator=_g))
    _bs = int(torch.randint(1, 40, (1,), generator=_g))
    _x = torch.randn(_rows, _n, generator=_g) * float(torch.rand(1, generator=_g) * 20 + 0.1)
    _what = f"online_softmax(x [{_rows}, {_n}], block_size={_bs}) (random test, seed {_seed})"
    check_close(online_softmax(_x, _bs), _x.softmax(-1), _what, rtol=1e-4, atol=1e-6)
    _m, _l = torch.full((_rows,), -math.inf), torch.zeros(_rows)
    for _s in range(0, _n, _bs):
        _m, _l = online_softmax_update(_m, _l, _x[:, _s:_s + _bs])
    _rm, _rl = _ref_stats(_x, _bs)
    check_close(_m, _rm, _what + ": final running max")
    check_close(_l, _rl, _what + ": final running sum", rtol=1e-4)
### END HIDDEN TESTS

# %% [markdown] id="c007"
# ## Part B · Tiled attention (3 points)
#
# `tiled_attention(q, k, v, block_size, causal=False)` for one head: `q`, `k`, `v` are `[N, d]`, the
# result is softmax(q k^T / sqrt(d)) v, `[N, d]`. Compute it the FlashAttention way:
#
# * for each tile of `block_size` queries (rows `i0:i1`), keep per row a running max `m`, a running sum
#   `l` and an unnormalized output `acc` `[rows, d]` (all start at -inf, 0, 0);
# * for each tile of `block_size` keys (`j0:j1`): scores `s = q_tile @ k_tile.T / sqrt(d)`
#   (`[rows, cols]`), new max, the factor `alpha = exp(m_old - m_new)`, `p = exp(s - m_new)`, then
#   `l = alpha * l + p.sum(-1)` and `acc = alpha[:, None] * acc + p @ v_tile`;
# * at the end of the key loop, the tile's output is `acc / l[:, None]`.
#
# Never build the `[N, N]` scores: the tests watch the width of every matmul, exp and softmax result,
# which must stay at most `max(block_size, d)`. `N` need not be a multiple of `block_size`. Raise
# `ValueError` for `block_size < 1`.
#
# ## Part C · Causal (3 points)
#
# With `causal=True`, query `i` may only read keys `j <= i`. In tile terms: a key tile that starts after
# the query tile's last row is entirely in the future - **skip it** (do not even compute its scores); a
# tile that crosses the diagonal needs an element-wise mask (`-inf` where `j > i`); the others are full.
# Part C's tests check the causal results.

# %% id="c008" nbgrader={"grade": false, "grade_id": "tiled_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def tiled_attention(q, k, v, block_size, causal=False):
    """Exact attention tile by tile: q, k, v [N, d] -> [N, d]."""
    ### BEGIN SOLUTION
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    N, d = q.shape
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    for i0 in range(0, N, block_size):
        i1 = min(i0 + block_size, N)
        qi = q[i0:i1]
        m = torch.full((i1 - i0,), float("-inf"))
        l = torch.zeros(i1 - i0)
        acc = torch.zeros(i1 - i0, d)
        for j0 in range(0, N, block_size):
            if causal and j0 > i1 - 1:
                break                                      # this tile and all later ones are in the future
            j1 = min(j0 + block_size, N)
            s = qi @ k[j0:j1].T * scale                     # [rows, cols]
            if causal and j1 - 1 > i0:                      # crosses the diagonal
                rows = torch.arange(i0, i1)[:, None]
                cols = torch.arange(j0, j1)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.max(dim=-1).values)
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[:, None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[:, None] * acc + p @ v[j0:j1]
            m = m_new
        out[i0:i1] = acc / l[:, None]
    return out
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "tiled_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _attention(q, k, v, causal):
    """The plain N x N version, for the tests."""
    s = q @ k.T / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def _tiled_checked(q, k, v, block_size, causal, what):
    with _LargestScores() as _mode:
        got = tiled_attention(q, k, v, block_size, causal=causal)
    check_shape(got, tuple(q.shape), what)
    limit = max(block_size, q.shape[-1])
    if _mode.widest > limit:
        raise AssertionError(f"{what}: a matmul / exp / softmax result {_mode.widest} wide, more than "
                             f"max(block_size, d) = {limit}: attention must go tile by tile, not build N x N scores")
    return got


_gen = torch.Generator().manual_seed(7)
_q, _k, _v = (torch.randn(37, 8, generator=_gen) for _ in range(3))
for _bs in (16, 5, 37, 64):
    _what = f"tiled_attention(q, k, v [37, 8], block_size={_bs})"
    check_close(_tiled_checked(_q, _k, _v, _bs, False, _what), _attention(_q, _k, _v, False), _what, rtol=1e-4,
                atol=1e-5)
check_raises(lambda: tiled_attention(_q, _k, _v, 0), ValueError, "tiled_attention with block_size=0")
### BEGIN HIDDEN TESTS
from course_lib.attention import reference_attention as _ref_attention

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(12):
    _n, _d = int(torch.randint(1, 80, (1,), generator=_g)), int(torch.randint(1, 12, (1,), generator=_g))
    _bs = int(torch.randint(max(2, _d), 24, (1,), generator=_g))
    _q, _k, _v = (torch.randn(_n, _d, generator=_g) * 2 for _ in range(3))
    _what = f"tiled_attention(q, k, v [{_n}, {_d}], block_size={_bs}) (random test, seed {_seed})"
    _want = _ref_attention(_q[None, None], _k[None, None], _v[None, None])[0, 0]
    check_close(_tiled_checked(_q, _k, _v, _bs, False, _what), _want, _what, rtol=1e-4, atol=1e-5)
### END HIDDEN TESTS

# %% id="c010" nbgrader={"grade": true, "grade_id": "causal_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_q, _k, _v = (torch.randn(37, 8, generator=_gen) for _ in range(3))
for _bs in (16, 5, 37):
    _what = f"tiled_attention(q, k, v [37, 8], block_size={_bs}, causal=True)"
    check_close(_tiled_checked(_q, _k, _v, _bs, True, _what), _attention(_q, _k, _v, True),
                _what + " (are the diagonal tiles masked?)", rtol=1e-4, atol=1e-5)
_x = torch.eye(4)
check_close(tiled_attention(_x, _x, _x * 5, 2, causal=True)[0], _x[0] * 5,
            "causal: the first query sees only the first key")
### BEGIN HIDDEN TESTS
from course_lib.attention import reference_attention as _ref_attention

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(12):
    _n, _d = int(torch.randint(1, 80, (1,), generator=_g)), int(torch.randint(1, 12, (1,), generator=_g))
    _bs = int(torch.randint(max(2, _d), 24, (1,), generator=_g))
    _q, _k, _v = (torch.randn(_n, _d, generator=_g) * 2 for _ in range(3))
    _what = f"tiled_attention(q, k, v [{_n}, {_d}], block_size={_bs}, causal=True) (random test, seed {_seed})"
    _want = _ref_attention(_q[None, None], _k[None, None], _v[None, None], causal=True)[0, 0]
    check_close(_tiled_checked(_q, _k, _v, _bs, True, _what), _want, _what, rtol=1e-4, atol=1e-5)
### END HIDDEN TESTS

# %% [markdown] id="c011"
# ## Going further (not graded)
#
# * `course_lib.attention.tiled_attention` adds batches, GQA, a padding mask and an `IOCounter`; compare
#   its counted loads with `course_lib.attention.flash_attention_io`.
# * On a GPU, `course_lib.attention.triton_flash.flash_attention_triton` is the same loop as one Triton
#   kernel; `bench/attention.py` times it against PyTorch's SDPA backends. The step inside its key loop,
#   `online_softmax_tile` in `course_lib/attention/triton_online_softmax.py`, is your Part B step in log2
#   units (`exp2`, with log2(e) folded into the scale), and flash-decoding and Module 06's paged decode
#   kernel call the same step.
