# %% [markdown] id="c002"
# # Lab 07 · Online softmax and tiled attention
#
# In this lab you write the two ideas FlashAttention is made of (Module 07), from their contracts:
#
# * **Part A (4 points): online softmax.** Softmax of a row read in pieces, with a running max and a
#   running sum.
# * **Part B (4 points, contract): tiled attention.** Exact attention with batches and grouped-query heads,
#   computed tile by tile, never holding more than a tile of scores. You design the loop.
# * **Part C (3 points, contract): causal tiles.** The same function with a causal mask when there are
#   fewer queries than keys (a KV cache): skip the tiles in the future, mask the ones that cross it.
# * **Part D (1 point): predict the memory traffic.** How many elements your loop moves, from the IO model;
#   then a cell counts what your function really reads.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, **hidden tests** run your code
#   on random shapes and lengths that are not multiples of the tile sizes, against the course's reference.
# * PyTorch only; do not import `course_lib.attention` (the hidden tests check that the code is your own).
# * Everything runs on a CPU in seconds. Total: 12 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import time

import torch
from torch.overrides import TorchFunctionMode

from course_lib.checks import check_close, check_raises, check_shape

# The misconceptions the tests recognize: when your result matches one, the message names it.
MISTAKES = {
    "sum_not_rescaled": "the running sum l was not rescaled by exp(m_old - m_new) when the running max grew: "
                        "it adds terms taken against different maxima; see notebook 07, section '3. Online "
                        "softmax, step by step'",
    "acc_not_rescaled": "the running sum l was rescaled when the max grew but the output accumulator was not: "
                        "acc holds sums of exp(s - m) v taken against the old max and needs the same factor "
                        "exp(m_old - m_new) as l; see notebook 07, section '4. Tiled exact attention'",
    "causal_top_left": "the causal mask is aligned top-left: with Tq queries after Tk - Tq cached keys, query t "
                       "sits at position Tk - Tq + t and sees keys up to Tk - Tq + t (bottom-right alignment), "
                       "not only keys up to t; see this lab's Part C and notebook 07, section '4. Tiled exact "
                       "attention'",
    "io_kv_once": "the traffic counts K and V once: with query tiles outside, every query tile reads all of K "
                  "and V again, so they are read ceil(N / block_q) times; see notebook 07, section "
                  "'2. Counting the bytes: the IO model'",
}


class _Watch(TorchFunctionMode):
    """What a call creates, for the tests: the largest tensor (elements) any torch operation returned, and
    the elements of all matmul results (the scores and p @ v products: the work done)."""

    MATMULS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "mm", "baddbmm", "addmm"}

    def __init__(self):
        super().__init__()
        self.largest, self.largest_shape, self.matmul_elements = 0, (), 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                if t.numel() > self.largest:
                    self.largest, self.largest_shape = t.numel(), tuple(t.shape)
                if getattr(func, "__name__", "") in self.MATMULS:
                    self.matmul_elements += t.numel()
        return out


def _attention(q, k, v, causal=False, top_left=False):
    """The plain version, with the [Tq, Tk] scores materialized, for the tests (GQA by repeating K/V).
    top_left=True aligns the causal mask the wrong way (query t sees keys up to t): a known mistake."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = s.shape[-2:]
        pos = torch.arange(Tq)[:, None] + (0 if top_left else Tk - Tq)
        s = s.masked_fill(torch.arange(Tk)[None, :] > pos, float("-inf"))
    return s.softmax(-1) @ v


def _tiled_checked(q, k, v, block_q, block_k, causal, what):
    """tiled_attention under watch: the shape, and the memory bound of the contract."""
    with _Watch() as watch:
        got = tiled_attention(q, k, v, block_q, block_k, causal=causal)
    check_shape(got, tuple(q.shape), what)
    B, H = q.shape[:2]
    limit = max(q.numel(), k.numel() * (H // k.shape[1]), B * H * block_q * block_k)
    if watch.largest > limit:
        raise AssertionError(f"{what}: a tensor of {watch.largest} elements (shape {watch.largest_shape}) was "
                             f"created, more than the contract's bound {limit}: attention must go tile by tile, "
                             "never holding the Tq x Tk scores or a mask of that size")
    return got, watch


def _causal_work(B, H, Tq, Tk, d, block_q, block_k):
    """The matmul elements of the tiles some query may read: their scores and their p @ v products."""
    total = 0
    for i0 in range(0, Tq, block_q):
        rows, last = min(block_q, Tq - i0), Tk - Tq + min(i0 + block_q, Tq) - 1
        for j0 in range(0, last + 1, block_k):
            total += B * H * rows * (min(block_k, Tk - j0) + d)
    return total


def _causal_checked(q, k, v, block_q, block_k, what):
    got, watch = _tiled_checked(q, k, v, block_q, block_k, True, what)
    B, H, Tq, d = q.shape
    allowed = _causal_work(B, H, Tq, k.shape[2], d, block_q, block_k)
    if watch.matmul_elements > allowed:
        raise AssertionError(f"{what}: your matmuls produced {watch.matmul_elements} elements, more than the "
                             f"{allowed} of the tiles a query may read: skip the key tiles wholly in the future")
    return got


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
check_close(_l, torch.exp(_x[:, :6] - 6).sum(-1), "second piece [2, 6, 1.5]: l", rtol=1e-5,
            mistakes={MISTAKES["sum_not_rescaled"]: torch.exp(_x[:, :3] - 3).sum(-1) + torch.exp(_x[:, 3:6] - 6).sum(-1)})
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
    _rm, _rl = _ref_stats(_x, _bs)
    # the planted mistake: each piece summed against the running max at that piece, never rescaled
    _wl = sum(torch.exp(_x[:, _s:_s + _bs] - _x[:, :_s + _bs].max(-1).values[:, None]).sum(-1)
              for _s in range(0, _n, _bs))
    check_close(online_softmax(_x, _bs), _x.softmax(-1), _what, rtol=1e-4, atol=1e-6,
                mistakes={MISTAKES["sum_not_rescaled"]: torch.exp(_x - _rm[:, None]) / _wl[:, None]})
    _m, _l = torch.full((_rows,), -math.inf), torch.zeros(_rows)
    for _s in range(0, _n, _bs):
        _m, _l = online_softmax_update(_m, _l, _x[:, _s:_s + _bs])
    check_close(_m, _rm, _what + ": final running max")
    check_close(_l, _rl, _what + ": final running sum", rtol=1e-4, mistakes={MISTAKES["sum_not_rescaled"]: _wl})
### END HIDDEN TESTS


# %% [markdown] id="c007"
# ## Part B · Tiled attention (4 points, contract)
#
# Attention for a batch of sequences with grouped-query heads, computed the FlashAttention way: the scores
# exist one tile at a time, and a running softmax (Part A) makes the result exact.
#
# **Contract.** `tiled_attention(q, k, v, block_q, block_k, causal=False)`:
#
# * **takes** `q` `[B, H, Tq, d]` and `k`, `v` `[B, Hkv, Tk, d]` (float32), with `H` a multiple of `Hkv`:
#   query head `h` reads KV head `h // (H // Hkv)` (grouped-query attention, the Hugging Face layout);
#   tile sizes `block_q` (query rows per tile) and `block_k` (keys per tile), positive ints that need
#   **not** divide `Tq` or `Tk` (the last tiles are shorter);
# * **returns** `[B, H, Tq, d]`: `softmax(q k^T / sqrt(d)) v` per head, equal to the plain attention within
#   `1e-4` (relative) on inputs of magnitude a few units;
# * **memory bound**: no tensor the function creates holds more than
#   `max(q.numel(), k.numel() * H // Hkv, B * H * block_q * block_k)` elements: never the `Tq x Tk` scores,
#   nor a mask of that size (the tests watch the size of every tensor any torch operation returns);
# * **raises** `ValueError` when `block_q` or `block_k` is not a positive int, when the shapes do not fit
#   (`q` not 4-D, `k` and `v` not the same shape, a different `B` or `d`, `H` not a multiple of `Hkv`).
#
# `causal` is Part C's: for now only `causal=False` is tested (leave the argument in the signature).
#
# <details><summary>Hint 1: the loop structure</summary>
#
# Loop over query tiles `i0:i1` outside and key tiles `j0:j1` inside (FlashAttention-2's order). Per query
# tile keep, per row, a running max `m`, a running sum `l` and an unnormalized output `acc` `[..., rows, d]`,
# starting at `-inf`, `0`, `0`. At the end of the key loop the tile's output is `acc / l`.
# </details>
#
# <details><summary>Hint 2: one key tile, line by line</summary>
#
# 1. `s = q_tile @ k_tile^T / sqrt(d)`, `[..., rows, cols]`;
# 2. `m_new = max(m, s.max(-1))` and the factor `alpha = exp(m - m_new)`;
# 3. `p = exp(s - m_new[..., None])`;
# 4. `l = alpha * l + p.sum(-1)` and `acc = alpha[..., None] * acc + p @ v_tile`: **both** running
#    quantities were summed against the old max, so both are rescaled;
# 5. `m = m_new`.
# </details>
#
# <details><summary>Hint 3: GQA without copying K and V</summary>
#
# `q.reshape(B, Hkv, G, Tq, d)` (G = H // Hkv) puts the G query heads of a KV head side by side; a key tile
# `k[:, :, None, j0:j1]` `[B, Hkv, 1, cols, d]` then broadcasts over them in the matmul.
# `k.repeat_interleave(G, dim=1)` also works (a copy, allowed by the bound).
# </details>

# %% id="c008" nbgrader={"grade": false, "grade_id": "tiled_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def tiled_attention(q, k, v, block_q, block_k, causal=False):
    """Exact attention tile by tile: q [B, H, Tq, d], k/v [B, Hkv, Tk, d] -> [B, H, Tq, d]."""
    ### BEGIN SOLUTION
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be [B, H, Tq, d] and k, v the same [B, Hkv, Tk, d], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, H, Tq, d = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != d or Hkv < 1 or H % Hkv:
        raise ValueError(f"k, v must be [B={B}, Hkv, Tk, d={d}] with H={H} a multiple of Hkv, got {tuple(k.shape)}")
    if causal and Tq > Tk:
        raise ValueError(f"causal attention needs Tq <= Tk (the queries are the last Tq positions), got "
                         f"Tq={Tq}, Tk={Tk}")
    G = H // Hkv
    scale = 1.0 / math.sqrt(d)
    qg = q.reshape(B, Hkv, G, Tq, d)                      # the G query heads of one KV head, side by side
    out = torch.empty(B, Hkv, G, Tq, d, dtype=q.dtype)
    offset = Tk - Tq                                      # query t sits at position offset + t
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = qg[:, :, :, i0:i1]
        m = torch.full((B, Hkv, G, i1 - i0), float("-inf"))
        l = torch.zeros(B, Hkv, G, i1 - i0)
        acc = torch.zeros(B, Hkv, G, i1 - i0, d)
        k_end = min(Tk, offset + i1) if causal else Tk    # keys from here on are in every row's future
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Tk)
            s = qi @ k[:, :, None, j0:j1].transpose(-1, -2) * scale          # [B, Hkv, G, rows, cols]
            if causal and j1 - 1 > offset + i0:                              # crosses the diagonal
                rows = torch.arange(i0, i1)[:, None] + offset
                cols = torch.arange(j0, j1)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.max(dim=-1).values)
            alpha = torch.exp(m - m_new)                  # every row sees key 0 first: m_new is finite
            p = torch.exp(s - m_new[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, None, j0:j1]
            m = m_new
        out[:, :, :, i0:i1] = acc / l[..., None]
    return out.reshape(B, H, Tq, d)
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "tiled_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# One query, two key tiles of one key each: the second tile has the larger score, so the first tile's
# contribution must be rescaled by exp(0 - 2) in l AND in the accumulator.
_one = _tiled_checked(torch.ones(1, 1, 1, 1), torch.tensor([0.0, 2.0]).reshape(1, 1, 2, 1),
                      torch.tensor([1.0, 0.0]).reshape(1, 1, 2, 1), 1, 1, False, "one query, keys [0, 2]")[0]
check_close(_one.flatten(), [1 / (1 + math.exp(2))], "tiled_attention: one query q = 1, keys [0, 2], values [1, 0], "
            "one key per tile (softmax weights e^0, e^2)", rtol=1e-5,
            mistakes={MISTAKES["acc_not_rescaled"]: [1 / (1 + math.exp(-2))]})
_gen = torch.Generator().manual_seed(7)
_q = torch.randn(1, 4, 40, 4, generator=_gen)                   # 4 query heads ...
_k, _v = (torch.randn(1, 2, 50, 4, generator=_gen) for _ in range(2))     # ... read 2 KV heads; Tq != Tk
for _bq, _bk in ((16, 5), (5, 16), (7, 50), (40, 64), (64, 64)):
    _what = f"tiled_attention(q [1, 4, 40, 4], k/v [1, 2, 50, 4], block_q={_bq}, block_k={_bk})"
    check_close(_tiled_checked(_q, _k, _v, _bq, _bk, False, _what)[0], _attention(_q, _k, _v), _what, rtol=1e-4,
                atol=1e-5)
check_raises(lambda: tiled_attention(_q, _k, _v, 0, 4), ValueError, "tiled_attention with block_q=0")
check_raises(lambda: tiled_attention(_q, _k, _v, 4, 2.5), ValueError, "tiled_attention with block_k=2.5")
check_raises(lambda: tiled_attention(_q[:, :3], _k, _v, 4, 4), ValueError, "3 query heads over 2 KV heads")
check_raises(lambda: tiled_attention(_q, _k, _v[:, :, :49], 4, 4), ValueError, "k and v of different lengths")
print("Part B: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.attention import reference_attention as _ref_attention


def _planted_acc_not_rescaled(q, k, v, bq, bk):
    """The planted mistake: l rescaled when the max grows, acc not (non-causal)."""
    G, d = q.shape[1] // k.shape[1], q.shape[-1]
    kr, vr = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    out = torch.empty_like(q)
    for i0 in range(0, q.shape[2], bq):
        qi = q[:, :, i0:i0 + bq]
        m, l, acc = torch.full(qi.shape[:-1], -math.inf), torch.zeros(qi.shape[:-1]), torch.zeros_like(qi)
        for j0 in range(0, k.shape[2], bk):
            s = qi @ kr[:, :, j0:j0 + bk].transpose(-1, -2) / math.sqrt(d)
            m_new = torch.maximum(m, s.max(-1).values)
            p = torch.exp(s - m_new[..., None])
            l, acc, m = torch.exp(m - m_new) * l + p.sum(-1), acc + p @ vr[:, :, j0:j0 + bk], m_new
        out[:, :, i0:i0 + bq] = acc / l[..., None]
    return out


_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
_ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=_g))
for _ in range(12):
    _B, _Hkv, _G, _d = _ri(1, 2), _ri(1, 3), _ri(1, 3), _ri(1, 8)
    _Tq, _Tk, _bq, _bk = _ri(1, 70), _ri(1, 70), _ri(2, 24), _ri(2, 24)
    _q = torch.randn(_B, _Hkv * _G, _Tq, _d, generator=_g) * 2
    _k, _v = (torch.randn(_B, _Hkv, _Tk, _d, generator=_g) * 2 for _ in range(2))
    _what = (f"tiled_attention(q {list(_q.shape)}, k/v {list(_k.shape)}, block_q={_bq}, block_k={_bk}) "
             f"(random test, seed {_seed})")
    check_close(_tiled_checked(_q, _k, _v, _bq, _bk, False, _what)[0], _ref_attention(_q, _k, _v), _what, rtol=1e-4,
                atol=1e-5, mistakes={MISTAKES["acc_not_rescaled"]: _planted_acc_not_rescaled(_q, _k, _v, _bq, _bk)})
for _bad in ((1, 0), (0, 3), (True, 3), (3, -1)):
    check_raises(lambda: tiled_attention(_q, _k, _v, *_bad), ValueError, f"tiled_attention with block sizes {_bad}")
check_raises(lambda: tiled_attention(_q, torch.randn(_B, _Hkv, _Tk, _d + 1), torch.randn(_B, _Hkv, _Tk, _d + 1), 4, 4),
             ValueError, "k and v with a head dim other than q's")
check_raises(lambda: tiled_attention(torch.randn(1, 3, 4, 2), torch.randn(1, 2, 4, 2), torch.randn(1, 2, 4, 2), 2, 2),
             ValueError, "3 query heads over 2 KV heads")
### END HIDDEN TESTS

# %% [markdown] id="c010"
# ## Part C · Causal, with a cache (3 points, contract)
#
# With a KV cache, a forward pass brings `Tq` new queries while the keys include the `Tk - Tq` tokens
# already cached: the queries are the **last** `Tq` positions of the sequence (a decode step is `Tq = 1`;
# a prefill without cache is `Tq = Tk`).
#
# **Contract.** `tiled_attention(q, k, v, block_q, block_k, causal=True)`, the same function and
# contract as Part B, plus:
#
# * **mask**: query `t` sits at position `Tk - Tq + t` and reads the keys `j <= Tk - Tq + t`
#   (bottom-right alignment); the result equals the plain causal attention within `1e-4`;
# * **work bound**: take the query tiles as rows `i0 .. i0 + block_q - 1` and the key tiles as keys
#   `j0 .. j0 + block_k - 1`, with `i0`, `j0` multiples of the tile sizes. A key tile wholly in the future
#   of every query of a query tile is never computed: the tests add up the elements of all your matmul
#   results and allow only the tiles that some query of the tile may read (their scores and `p @ v`);
# * **raises** `ValueError` when `Tq > Tk` (more queries than keys cannot be the last positions).
#
# <details><summary>Hint 1: which tiles</summary>
#
# 1. The last query of the tile `i0:i1` sits at `Tk - Tq + i1 - 1`: key tiles starting after it are
#    skipped (stop the key loop there).
# 2. A key tile whose last key `j1 - 1` is after the tile's first query position `Tk - Tq + i0` crosses
#    the diagonal: set its scores to `-inf` where `j > Tk - Tq + i` (row by row).
# 3. The other visited tiles are entirely visible: no mask.
# </details>
#
# <details><summary>Hint 2: no NaN</summary>
#
# With `Tq <= Tk` every query sees key 0, and the first key tile always starts there, so after it every
# row's running max is finite. A row whose part of a later diagonal tile is all `-inf` just adds zeros.
# </details>

# %% id="c011" nbgrader={"grade": true, "grade_id": "causal_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_gen = torch.Generator().manual_seed(8)
_q = torch.randn(1, 4, 40, 4, generator=_gen)
_k, _v = (torch.randn(1, 2, 40, 4, generator=_gen) for _ in range(2))
for _bq, _bk in ((16, 16), (5, 7), (40, 40)):
    _what = f"tiled_attention(q [1, 4, 40, 4], k/v [1, 2, 40, 4], block_q={_bq}, block_k={_bk}, causal=True)"
    check_close(_causal_checked(_q, _k, _v, _bq, _bk, _what), _attention(_q, _k, _v, causal=True),
                _what + " (are the diagonal tiles masked?)", rtol=1e-4, atol=1e-5)
_k, _v = (torch.randn(1, 2, 50, 4, generator=_gen) for _ in range(2))
for _Tq, _bq, _bk in ((12, 8, 16), (40, 16, 5), (1, 4, 16)):
    _what = (f"tiled_attention(q [1, 4, {_Tq}, 4], k/v [1, 2, 50, 4], block_q={_bq}, block_k={_bk}, causal=True): "
             f"{_Tq} new queries after {50 - _Tq} cached keys")
    check_close(_causal_checked(_q[:, :, :_Tq], _k, _v, _bq, _bk, _what), _attention(_q[:, :, :_Tq], _k, _v, True),
                _what, rtol=1e-4, atol=1e-5,
                mistakes={MISTAKES["causal_top_left"]: _attention(_q[:, :, :_Tq], _k, _v, True, top_left=True)})
_x = torch.eye(4)[None, None]
check_close(tiled_attention(_x, _x, _x * 5, 2, 2, causal=True)[0, 0, 0], [5.0, 0, 0, 0],
            "causal: the first query sees only the first key", atol=1e-6)
check_raises(lambda: tiled_attention(_q, _k[:, :, :39], _v[:, :, :39], 8, 8, causal=True), ValueError,
             "causal with 40 queries and 39 keys")
print("Part C: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.attention import reference_attention as _ref_attention

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
_ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=_g))
for _trial in range(14):
    _B, _Hkv, _G, _d = _ri(1, 2), _ri(1, 3), _ri(1, 3), _ri(1, 8)
    _Tk, _bq, _bk = _ri(1, 70), _ri(2, 24), _ri(2, 24)
    _Tq = _Tk if _trial % 3 == 0 else _ri(1, _Tk)
    _q = torch.randn(_B, _Hkv * _G, _Tq, _d, generator=_g) * 2
    _k, _v = (torch.randn(_B, _Hkv, _Tk, _d, generator=_g) * 2 for _ in range(2))
    _what = (f"tiled_attention(q {list(_q.shape)}, k/v {list(_k.shape)}, block_q={_bq}, block_k={_bk}, "
             f"causal=True) (random test, seed {_seed})")
    check_close(_causal_checked(_q, _k, _v, _bq, _bk, _what), _ref_attention(_q, _k, _v, causal=True), _what,
                rtol=1e-4, atol=1e-5,
                mistakes={MISTAKES["causal_top_left"]: _attention(_q, _k, _v, True, top_left=True)})
    if _Tk > 1:
        check_raises(lambda: tiled_attention(torch.randn(_B, _Hkv, _Tk, _d), _k[:, :, 1:], _v[:, :, 1:], _bq, _bk,
                                             causal=True), ValueError,
                     f"causal with {_Tk} queries and {_Tk - 1} keys (seed {_seed})")
### END HIDDEN TESTS

# %% [markdown] id="c012"
# ## Part D · Predict the memory traffic (1 point)
#
# Notebook 07, section 2, counts the elements attention moves between main memory and the chip. Your loop
# of Part B (query tiles outside, key tiles inside) behaves like a kernel with one program per query
# tile: it loads its query tile once, loads every key tile and value tile it visits, and writes its output
# tile once; nothing else goes through main memory (the scores stay on chip).
#
# Implement `predict_flash_io(seq_len, head_dim, block_q)`: the elements read plus written, per (batch,
# query head), by non-causal tiled attention with `Tq = Tk = seq_len`. The tests grade it against the IO
# model on their own inputs; the cell after them counts what your `tiled_attention` really reads.

# %% id="c013" nbgrader={"grade": false, "grade_id": "predict_flash_io", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_flash_io(seq_len, head_dim, block_q):
    """Elements read + written per (batch, head) by non-causal tiled attention, query tiles outside."""
    ### BEGIN SOLUTION
    tiles = -(-seq_len // block_q)
    return seq_len * head_dim + 2 * seq_len * head_dim * tiles + seq_len * head_dim
    ### END SOLUTION


# %% id="c014" nbgrader={"grade": true, "grade_id": "predict_flash_io_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_close(predict_flash_io(1024, 64, 128), 1024 * 64 * (1 + 2 * 8 + 1), "predict_flash_io(1024, 64, 128)",
            mistakes={MISTAKES["io_kv_once"]: 4 * 1024 * 64})
check_close(predict_flash_io(100, 16, 32), 100 * 16 * (1 + 2 * 4 + 1),
            "predict_flash_io(100, 16, 32): 4 query tiles, the last one shorter")
print("Part D: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.attention import flash_attention_io as _flash_io

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(100):
    _N, _d, _bq = (int(torch.randint(1, hi, (1,), generator=_g)) for hi in (5000, 257, 600))
    check_close(predict_flash_io(_N, _d, _bq), _flash_io(_N, _d, block_q=_bq)["total"],
                f"predict_flash_io({_N}, {_d}, {_bq}) (seed {_seed})", rtol=1e-9,
                mistakes={MISTAKES["io_kv_once"]: 4 * _N * _d})
### END HIDDEN TESTS

# %% [markdown] id="c015"
# ### Your prediction against your function (not graded)
#
# The cell below runs your `tiled_attention` on one head and counts what it touches: the elements of every
# slice it takes of `q`, `k` and `v` (what a kernel would load) and of every assignment into a tensor (what
# it would store). The count assumes each slice is loaded once: a loop that re-slices its slices counts
# more. Beside it, standard attention's traffic (section 2: `4 N d + 4 N^2`, the scores written and read
# back).

# %% id="c016"
class _Traffic(TorchFunctionMode):
    """Counts the elements of the slices taken from the storage of the given tensors, and of assignments."""

    def __init__(self, *sources):
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in sources}
        self.reads = self.writes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name == "__getitem__" and isinstance(args[0], torch.Tensor) and \
                args[0].untyped_storage().data_ptr() in self.storages:
            self.reads += out.numel()
        elif name == "__setitem__" and isinstance(args[2], torch.Tensor):
            self.writes += args[2].numel()
        return out


_N, _d = 256, 16
_q, _k, _v = (torch.randn(1, 1, _N, _d) for _ in range(3))
for _bq in (16, 64, 256):
    try:
        _pred = predict_flash_io(_N, _d, _bq)
        with _Traffic(_q, _k, _v) as _t:
            tiled_attention(_q, _k, _v, _bq, 32)
    except NotImplementedError:
        print("finish Parts B and D first")
        break
    print(f"N={_N}, d={_d}, block_q={_bq:3d}: predicted {_pred:7d} elements; counted in your function "
          f"{_t.reads + _t.writes:7d} ({_t.reads} read, {_t.writes} written); standard attention "
          f"{4 * _N * _d + 4 * _N * _N}")

# %% [markdown] id="c017"
# ## Going further (not graded)
#
# * `course_lib.attention.tiled_attention` has an `IOCounter`: for `N = 1024`, `d = 64` and tiles of 128,
#   count its traffic non-causal and causal, compare with `course_lib.attention.flash_attention_io`, and
#   with standard attention. Why does the causal count not halve exactly?
# * On a GPU, `course_lib.attention.triton_flash.flash_attention_triton` runs the same loop as one Triton
#   kernel, and its key-loop step (`online_softmax_tile` in `course_lib/attention/triton_online_softmax.py`)
#   works in log2 units: `exp2`, with `log2(e)` folded into the scale. Why is the result the same, and what
#   do `m` and `l` hold there?

# %% [markdown] id="c018" tags=["answer-key"]
# ### Answer key
#
# * Non-causal: Q read once (1024 x 64 = 65,536), K and V read once per query tile (8 tiles: 2 x 8 x 65,536
#   = 1,048,576), O written once (65,536): 1,179,648 elements, exactly `flash_attention_io(1024, 64, 128)`
#   and the `IOCounter` total. Causal: query tile i (0-based) visits key tiles 0..i, so K and V are read
#   128 x (1 + 2 + ... + 8) = 4,608 rows each instead of 8 x 1,024 = 8,192: 65,536 + 2 x 4,608 x 64 + 65,536
#   = 720,896 elements (the counter also reports 36 tiles visited, 28 skipped). Standard attention moves
#   4Nd + 4N^2 = 4,456,448: 3.8x more than tiled, 6.2x more than causal tiled. The causal count is 61% of
#   the non-causal one, not 50%: Q and O are moved whole anyway, and the diagonal tiles (8 of the 36
#   visited) are loaded whole although half their keys are masked, so K/V traffic is (n + 1) / 2n of the
#   full one for n tiles (9/16 here), which tends to one half only for many tiles.
# * `exp(x) = 2^(x log2 e)`: scaling the scores by `scale * log2(e)` and using `exp2` gives the same
#   weights, and every step of the online softmax is unchanged because the rescaling factor is
#   `2^(m_old - m_new)` in the same units. There `m` is the running max of the scores in log2 units
#   (`log2(e)` times the natural one), `l` the running sum of `2^(s - m)` (the same number as the natural
#   `sum exp(s_nat - m_nat)`), and `acc` the unnormalized output, so `acc / l` is unchanged; a log-sum-exp
#   read from the kernel must be multiplied by `ln 2` (`m + log2(l)` is in log2 units). `exp2` is one
#   hardware instruction, `exp` a multiply more.
