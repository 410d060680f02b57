# %% [markdown] id="c002"
# # Lab 07 · Online softmax and tiled attention
#
# In this lab you write the two ideas FlashAttention [@dao2022flashattention] is made of (Module 07), from
# their contracts:
#
# * **Part A (4 points): online softmax.** Softmax of a row read in pieces, with a running max and a
#   running sum.
# * **Part B (4 points, contract): tiled attention.** Exact attention with batches and grouped-query heads,
#   computed tile by tile, never holding more than a tile of scores. You design the loop.
# * **Part C (3 points, contract): causal tiles.** The same function with a causal mask when there are
#   fewer queries than keys (a KV cache): skip the tiles in the future, mask the ones that cross it.
# * **Part D (4 points, 2 of them written): predict the memory traffic.** How many elements your causal
#   loop moves when a chunk of new queries attends to a cache, from the IO model; a cell counts what your
#   function really reads, and you explain the numbers in words.
# * **Part E (4 points, contract): a FlashAttention kernel in Triton.** The same loop as one GPU kernel,
#   written from its specification; graded in Triton's CPU interpreter, timed against PyTorch's SDPA when
#   there is a GPU.
# * **Part F (4 points, contract): the backward pass in Triton.** The gradients of attention from the
#   forward's output and log-sum-exp, recomputing the probabilities tile by tile; graded in the interpreter.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell with fixed examples. When grading, the grader runs your code on
#   shapes of its own (drawn for you, and a grid of edge cases: lengths that are not multiples of the tile
#   sizes, every residue of the causal offset) and compares the results with the course's reference.
# * PyTorch only (and Triton in Parts E and F); do not import `course_lib.attention`: the grader flags an answer
#   that does, and while it grades, the course's reference attention and kernels are not in the library.
# * Everything runs on a CPU in seconds (Parts E and F in Triton's interpreter, on small shapes). Total: 23
#   points, 21 graded automatically and 2 for a written answer your instructor grades.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from course_lib.checks import check_close, check_raises, check_shape
from course_lib.env import TRITON_FLOOR_CAPABILITY, compute_capability, has_package, triton_interpreting

# Part E's kernel runs compiled on a CUDA GPU Triton builds for (compute capability 7.0 and up: a T4 is 7.5,
# see Part E), else in Triton's interpreter on the CPU: a CPU runtime, a laptop, and always while grading, so
# that every submission is graded alike. TRITON_INTERPRET=1 chooses the interpreter; triton reads it when it
# is first imported, so it is set here, before any cell imports triton.
KERNEL_ON_GPU = (not os.environ.get("NBGRADER_EXECUTION") and has_package("triton")
                 and (compute_capability() or (0, 0)) >= TRITON_FLOOR_CAPABILITY)
if not KERNEL_ON_GPU:
    if "triton" in sys.modules and not triton_interpreting():
        print("triton was imported before this cell without its interpreter: restart the runtime and run the "
              "lab from the top, or Part E's kernel cannot run on the CPU")
    os.environ["TRITON_INTERPRET"] = "1"
KERNEL_DEVICE = "cuda" if KERNEL_ON_GPU else "cpu"

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
    "io_kv_once": "the traffic counts K and V once: with query tiles outside, every query tile reads the key "
                  "tiles it visits again, so K and V are read about once per query tile; see notebook 07, "
                  "section '2. Counting the bytes: the IO model'",
    "io_causal_no_skip": "the causal traffic is the non-causal one: a query tile stops at the key tile holding "
                         "the last key its last row may see, and never loads the tiles after it",
    "io_causal_top_left": "the causal traffic places the queries at positions 0 .. T-1: after S - T cached keys, "
                          "query t sits at position S - T + t and sees S - T + t + 1 keys",
    "io_keys_not_tiles": "the traffic counts only the visible keys: a key tile is loaded whole even when only "
                         "some of its keys are visible (only the sequence's last tile is cut, at S)",
    "kernel_causal_top_left": "your kernel's causal mask is aligned top-left: with T queries after S - T cached "
                              "keys, query row t sits at position S - T + t and sees the keys j <= t + S - T "
                              "(bottom-right, as in Part C), not only j <= t; the offset S - T belongs in the "
                              "mask and in the last key tile the loop visits; see this lab's Part C and notebook "
                              "07, section '4. Tiled exact attention'",
    "kernel_padding_unmasked": "your kernel does not mask the keys past S in the last key tile: loaded as zeros "
                               "they score 0 and still get the weight exp(0 - m) in the softmax (with a value of 0), "
                               "so the output is too small; set their scores to -inf with tl.where, as the padded "
                               "rows are masked on load and store; see notebook 07, section '5. A Triton kernel'",
    "kernel_acc_not_rescaled": "your kernel rescales the running sum l when the running max grows but not the "
                               "accumulator acc: acc holds sums of exp(s - m_old) v and needs the same factor "
                               "exp(m_old - m_new) before the new tile's p @ v is added; see notebook 07, "
                               "sections '3. Online softmax, step by step' and '5. A Triton kernel'",
    "bwd_no_delta": "your backward computes dS = P * dP without subtracting D = rowsum(dO * O): softmax's "
                    "backward is dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik), and that row sum equals rowsum(dO * O) "
                    "because O = P V; dv comes out right, dq and dk do not; see this lab's Part F, Hint 1",
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


def _kernel_checked(q, k, v, causal, what, block_m=16, block_n=16):
    """flash_attention (Part E) on KERNEL_DEVICE, under watch: the shape and dtype of the contract, the
    attention done by the kernel (no matmul in PyTorch), and no host tensor larger than q or k (GQA by index,
    no copy of K and V per query head). Returns the result on the CPU."""
    q, k, v = (x.to(KERNEL_DEVICE) for x in (q, k, v))
    with _Watch() as watch:
        got = flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)
    check_shape(got, tuple(q.shape), what)
    if got.dtype != q.dtype:
        raise AssertionError(f"{what}: the output must have q's dtype {q.dtype}, got {got.dtype}")
    if watch.matmul_elements:
        raise AssertionError(f"{what}: PyTorch matmuls produced {watch.matmul_elements} elements: the attention "
                             "must be computed by your Triton kernel, not by torch in the launcher")
    limit = max(q.numel(), k.numel())
    if watch.largest > limit:
        raise AssertionError(f"{what}: a tensor of {watch.largest} elements (shape {watch.largest_shape}) was "
                             f"created, more than the contract's bound {limit}: read KV head h // G in the "
                             "kernel instead of copying K and V for every query head")
    return got.cpu()


# %% [markdown] id="c004"
# ## Part A · Online softmax (4 points)
#
# softmax(x)_i = exp(x_i - m) / l, with m = max_j x_j (for stability) and l = sum_j exp(x_j - m). To
# compute it while reading x in pieces (the online softmax [@milakov2018online]), keep the max `m` and the
# sum `l` of what you have seen. When a
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
print("Part A: visible tests passed")


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
# * **raises** `ValueError` when `block_q` or `block_k` is not a positive int (a `bool` is not one, though
#   Python counts `True` as 1), when the shapes do not fit
#   (`q` not 4-D, `k` and `v` not the same shape, a different `B` or `d`, `H` not a multiple of `Hkv`).
#
# `causal` is Part C's: for now only `causal=False` is tested (leave the argument in the signature). Part C
# has no answer cell of its own: it grades this same function with `causal=True`.
#
# <details><summary>Hint 1: the loop structure</summary>
#
# Loop over query tiles `i0:i1` outside and key tiles `j0:j1` inside (FlashAttention-2's order
# [@dao2024flashattention2]; the first FlashAttention put the key tiles outside). Per query
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

# %% [markdown] id="c012"
# ## Part D · Predict the memory traffic of a causal chunk (4 points)
#
# Two points for the prediction, graded automatically; two for the written answer after it, graded by your
# instructor.
#
# Notebook 07, section 2, counts the elements attention moves between main memory and the chip (the IO
# analysis of FlashAttention [@dao2022flashattention]) for one sequence attending to itself (`T = S`). A
# serving engine rarely runs that shape: chunked prefill and speculative verification run `T` new queries
# against `S >= T` keys, the first `S - T` of them already cached, causally (Part C's alignment: query `t`
# sits at position `S - T + t`). Predict that traffic.
#
# Your loop of Parts B and C has the query tiles outside and the key tiles inside (FlashAttention-2's order)
# and behaves like a kernel with one program per query tile of `block_q` rows (the last one shorter): it
# loads its query tile once and writes its output tile once; it loads, for K and for V, every key tile
# of `block_k` keys it visits, each tile whole (only the last tile of the sequence is cut, at `S`); with
# `causal`, it visits the key tiles from the first up to the one that holds the last key its last row may
# see, and none after. Nothing else goes through main memory (the scores and the running statistics stay
# on chip).
#
# Implement `predict_flash_io(q_len, kv_len, head_dim, block_q, block_k, causal)`: the elements read plus
# written per (batch, query head), an `int`. Work it out on paper first for a small case (say `T = 5`,
# `S = 12`, tiles of 4), then write it for any shape. The tests check properties any correct count has and
# the grader checks the value on shapes of its own; the cell after the tests counts what your
# `tiled_attention` really reads, so you can compare.
#
# <details><summary>Hint 1: the idea</summary>
#
# Add up per query tile: what it loads of Q, what it writes of O, and what it loads of K and V. Only the
# last of these depends on `causal`, and only through one number per query tile: how far into the keys
# its last row may look.
# </details>
#
# <details><summary>Hint 2: the pitfalls</summary>
#
# With a cache in front, the queries are not at positions `0 .. T-1`; a tile is loaded whole even when
# only some of its keys are visible; and the number of key tiles a query tile visits is a ceiling, not a
# fraction. Check your formula by hand on the small case, tile by tile, before trusting it.
# </details>

# %% id="c013" nbgrader={"grade": false, "grade_id": "predict_flash_io", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_flash_io(q_len, kv_len, head_dim, block_q, block_k, causal):
    """Elements read + written per (batch, query head) by tiled attention, query tiles outside."""
    ### BEGIN SOLUTION
    keys = 0
    for i0 in range(0, q_len, block_q):
        i1 = min(i0 + block_q, q_len)
        last = min(kv_len, kv_len - q_len + i1) if causal else kv_len   # keys [0, last) are visible to the tile
        keys += min(kv_len, -(-last // block_k) * block_k)               # whole key tiles, cut at S
    return 2 * q_len * head_dim + 2 * keys * head_dim                     # Q in, O out; K and V per tile
    ### END SOLUTION


# %% id="c014" nbgrader={"grade": true, "grade_id": "predict_flash_io_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_shapes = [(5, 12, 8, 4, 4), (100, 100, 16, 32, 16), (7, 300, 64, 16, 32), (1, 50, 32, 16, 16)]
for _T, _S, _d, _bq, _bk in _shapes:
    _both = {}
    for _causal in (False, True):
        _what = f"predict_flash_io({_T}, {_S}, {_d}, {_bq}, {_bk}, causal={_causal})"
        _got = predict_flash_io(_T, _S, _d, _bq, _bk, _causal)
        assert isinstance(_got, int) and not isinstance(_got, bool), f"{_what} must return an int, got {_got!r}"
        # every query is read and every output written once; the last query sees every key, K and V
        assert _got >= 2 * _T * _d + 2 * _S * _d, f"{_what} = {_got}: less than reading Q, K, V and writing O once"
        _both[_causal] = _got
    assert _both[True] <= _both[False], f"causal {_both[True]} > non-causal {_both[False]} for {(_T, _S, _d, _bq, _bk)}"
    # scaling: every term counts head_dim elements per row
    assert predict_flash_io(_T, _S, 2 * _d, _bq, _bk, True) == 2 * _both[True], "doubling head_dim must double it"
# more, smaller query tiles can only read K and V more often
_io = [predict_flash_io(200, 200, 16, _bq, 16, False) for _bq in (200, 64, 16)]
assert _io[0] <= _io[1] <= _io[2], f"non-causal traffic for block_q 200, 64, 16: {_io}, expected non-decreasing"
print("Part D: visible tests passed (the grader checks the values on its own shapes)")

# %% [markdown] id="c015"
# ### Your prediction against your function (not graded)
#
# The cell below runs your `tiled_attention` on one head and counts what it touches: the elements of every
# slice it takes of `q`, `k` and `v` (what a kernel would load) and of every assignment into a tensor (what
# it would store). The count assumes each slice is loaded once: a loop that re-slices its slices counts
# more. Beside it, standard attention's traffic for the same shapes (section 2's count with `T` queries and
# `S` keys: Q, K, V read, O written, and the `T x S` scores written and read back).

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


_T, _S, _d, _bk = 48, 256, 16, 32                  # a chunk of 48 new queries after 208 cached keys
_q = torch.randn(1, 1, _T, _d)
_k, _v = (torch.randn(1, 1, _S, _d) for _ in range(2))
for _causal in (False, True):
    for _bq in (16, 48):
        try:
            _pred = predict_flash_io(_T, _S, _d, _bq, _bk, _causal)
            with _Traffic(_q, _k, _v) as _t:
                tiled_attention(_q, _k, _v, _bq, _bk, causal=_causal)
        except NotImplementedError:
            print("finish Parts B, C and D first")
            break
        print(f"T={_T}, S={_S}, d={_d}, block_q={_bq:2d}, block_k={_bk}, causal={_causal!s:5}: predicted "
              f"{_pred:6d} elements; counted in your function {_t.reads + _t.writes:6d} ({_t.reads} read, "
              f"{_t.writes} written); standard attention {2 * _T * _d + 2 * _S * _d + 2 * _T * _S}")

# %% [markdown] id="cw07a"
# ### Part D, in words (2 of the part's points, graded by your instructor)
#
# Answer from the numbers the cell above printed on your machine, in a few sentences each:
#
# 1. Do your prediction and the count of your function agree? If not, which term differs, and is it your
#    loop or your model that is off?
# 2. By what factor does causal skipping cut the traffic of this chunk (48 queries after 208 cached keys)?
#    Why so little, when causal attention over one whole sequence (`T = S`) skips almost half the tiles?
# 3. With `block_q = 16` the tiled loop moves most of what standard attention moves here. Which term grows
#    as the query tiles shrink, and what does that say about choosing `block_q` on a GPU with a fixed SRAM?
#
# A full answer quotes your numbers and explains each with the IO model (which tensor is read how often).

# %% [markdown] id="cw07b" nbgrader={"grade": true, "grade_id": "written_flash_io", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# 1. They agree exactly (9,728 and 26,112 elements non-causal, 9,728 and 25,088 causal): my loop loads each
#    query tile once, each visited key and value tile once per query tile, and writes each output tile once,
#    which is the model.
# 2. Only 26,112 / 25,088 = 1.04x at `block_q = 16`, and nothing at `block_q = 48`. The 208 cached keys are
#    in every query's past, so every query tile must read them; skipping only saves key tiles of the chunk's
#    own 48-key triangle, at most about a quarter of them, against a prefix four times larger. With `T = S`
#    there is no prefix, and the skipped triangle is about half of all tiles.
# 3. The K and V term: each query tile rereads all the keys it sees, so it grows as `T / block_q` (48 / 16 =
#    3 passes over K and V). Larger query tiles read K and V fewer times, so a kernel makes `block_q` as large
#    as its SRAM allows (the tile of Q, the accumulator and a score tile must fit), which is the `M / 4d` of
#    FlashAttention's tile sizes; past that the traffic is bounded by the SRAM, not by the loop.

# %% [markdown] id="c019"
# ## Part E · A FlashAttention kernel in Triton (4 points, contract)
#
# On a GPU the loop of Parts B and C is one kernel, FlashAttention's [@dao2022flashattention] in
# FlashAttention-2's work partitioning [@dao2024flashattention2]: a **program** (a block of threads) per
# query tile and (batch, head) loads its Q tile once, walks the keys in tiles with the running (m, l, acc) in registers,
# and writes only its output tile. Notebook 07, section '5. A Triton kernel', describes the course's own
# (`course_lib/attention/triton_flash.py`, autotuned, with fp16/bf16 tensor-core paths); here you write
# yours, short and plain, in [Triton](https://triton-lang.org): Python functions decorated with
# `@triton.jit` that work on whole tiles (`tl.load` a tile of pointers, `tl.dot` two tiles, `tl.store`).
#
# **Where it runs.** On a CPU (a Colab CPU runtime, a laptop) the setup cell set `TRITON_INTERPRET=1`
# before triton was imported: Triton then runs your kernel in its **interpreter**, in NumPy, tile by tile:
# exact, and slow (seconds for a few thousand elements). Grading always runs there, on CPU tensors. On a
# CUDA GPU, Triton compiles it. Triton's README lists NVIDIA GPUs of compute capability 8.0 and newer
# (Ampere and newer: A100, RTX 30xx, L4, H100), and its maintainers decline fixes for older ones
# (triton-lang/triton issue 10918, 2026: "sm75 is not currently supported. It may work at times"). On
# Colab's **T4**
# (compute capability 7.5, Turing), with the triton 3.x that PyTorch installs: the setup cell lets Triton
# compile your kernel there (unsupported, not refused: PyTorch's own `torch.compile` generates Triton
# kernels for these GPUs), the visible tests run it on the T4 and say whether it is right; it compiles
# (the course's `tests/test_triton_targets.py` builds this lab's answer kernel for sm_75, with triton 3.9)
# with its `tl.dot`s on the ordinary FMA units, no tensor-core instruction, so expect it well behind SDPA
# there; and **no bf16**: ptxas rejects bf16 code for sm_75 ("Feature '.bf16' requires .target sm_80 or
# higher", triton-lang/triton issue 1941). That is why the contract asks for fp32 and fp16 only. A GPU
# below compute capability 7.0 runs the interpreter, as a CPU does. (Notebook 07, section 5, says the course
# does not launch *its own* Triton kernels on a T4: that is the library's choice for its fast paths; your
# kernel here is compiled there, unsupported, as above.)
#
# **Contract.** `flash_attention(q, k, v, causal=False, block_m=16, block_n=16)`, a launcher in Python
# that runs **one** `@triton.jit` kernel of yours (its name and arguments are yours):
#
# * **takes** `q` `[B, H, T, D]` and `k`, `v` `[B, Hkv, S, D]`, all float32 or all float16, on one device
#   (`KERNEL_DEVICE`: `cuda` where the kernel compiles, else `cpu`), with `H` a multiple of `Hkv` (query
#   head `h` reads KV head `h // (H // Hkv)`, as in Part B), `D` one of 16, 32, 64, 128, `S >= 1`; tile
#   sizes `block_m` (query rows per program) and `block_n` (keys per step), powers of two `>= 16` (the
#   smallest `tl.dot`) that need **not** divide `T` or `S`;
# * **returns** `O` `[B, H, T, D]` in `q`'s dtype: `softmax(q k^T / sqrt(D)) v` per head, with, when
#   `causal`, query `t` at position `S - T + t` seeing the keys `j <= t + S - T` (bottom-right, Part C's
#   alignment and `course_lib.attention.reference_attention`'s); within `1e-4` (relative, fp32) or `2e-3`
#   (fp16) of the reference on inputs of magnitude a few units;
# * **memory bound**: the scores exist only as one `[block_m, block_n]` tile inside a program; the
#   launcher creates no tensor larger than `q` or `k` (the tests watch every torch operation it calls) and
#   does no matmul in PyTorch: K and V are read from their KV head in the kernel, never copied per query
#   head;
# * **raises** `ValueError` when the shapes do not fit (as Part B), `D` or a tile size is not allowed, the
#   dtypes are not all float32 or all float16, or `causal` with `T > S`.
#
# The tests run it on small shapes with tiles of 16 (the interpreter is slow), lengths that are not
# multiples of the tiles, GQA, causal with `T != S` and a decode step (`T = 1`), against the reference.
#
# <details><summary>Hint 1: what one program owns</summary>
#
# Decide first what a program computes: one tile of query rows of one (batch, query head), and from that
# which KV head it reads (Part B's rule). The grid then follows from the number of such tiles. Anything a
# `tl.arange` or a tile shape depends on must be a compile-time constant (`tl.constexpr`); lengths and the
# scale can stay ordinary arguments. Work out where row `r` of head `h` of batch `b` starts in memory from
# the tensors' strides, and build a tile of pointers from a column of row offsets and a row of column
# offsets (broadcasting, as in NumPy).
# </details>
#
# <details><summary>Hint 2: the loop is Part B's</summary>
#
# The key loop inside a program is the online softmax of Part B, on tiles instead of slices: the same
# three running quantities per row, the same rescaling when the running max grows, the same division at
# the end. The pitfalls are the ones Part B's tests named: both the running sum and the accumulator must
# be rescaled, and the statistics are kept in fp32 whatever the input dtype. In fp32, Triton's `tl.dot`
# may use tf32 on an Ampere or newer GPU (about `1e-3` off, more than the tolerance): its
# `input_precision` argument says how to ask for full fp32 (the interpreter computes in full fp32 either way).
# </details>
#
# <details><summary>Hint 3: the edges</summary>
#
# * Tiles stick out of `T` and `S` unless the lengths are multiples: nothing may be read or written out of
#   bounds, and a padded key must get weight exactly 0 (think about what its score must be before `exp`).
# * Causal: Part C's rule and Part C's skipping, with the same bottom-right alignment; a program need not
#   visit the key tiles entirely in its rows' future.
# * NaN: ask yourself what `exp(m_old - m_new)` is on the first tile, and whether any row (a padded one too)
#   can see no key at all in the first tile.
# * Under the interpreter of triton older than 3.9 with NumPy 2.4 or newer, a loop bound that is not a
#   constexpr fails ("only 0-dimensional arrays can be converted to Python scalars"): loop to a constexpr
#   bound and let the masks do the rest, or upgrade triton.
# </details>

# %% id="c020" nbgrader={"grade": false, "grade_id": "flash_kernel_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
import triton
import triton.language as tl

# Your @triton.jit kernel here (its name and arguments are yours), then the launcher below it.
### BEGIN SOLUTION
@triton.jit
def _flash_fwd(Q, K, V, O, T, S, scale, s_qb, s_qh, s_kb, s_kh,
               H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
               PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, head) against every key they may see."""
    i, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    q_base = Q + b * s_qb + h * s_qh                   # q and O: [B, H, T, D], contiguous
    k_base = K + b * s_kb + (h // GROUP) * s_kh        # GQA: the KV head of this query head, read in place
    v_base = V + b * s_kb + (h // GROUP) * s_kh        # k and v: [B, Hkv, S, D], contiguous
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)         # the last tile sticks out of T: masked
    d = tl.arange(0, D)
    q = tl.load(q_base + rows[:, None] * D + d[None, :], mask=rows[:, None] < T, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of each row's scores
    l = tl.zeros([BLOCK_M], tl.float32)                # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)           # running sum of exp(score - m) * v, unnormalized
    pos = rows + S - T                                 # query t sits at position S - T + t (bottom-right)
    hi = S
    if CAUSAL:                                         # keys after the tile's last query: never loaded
        hi = tl.minimum(S, (i + 1) * BLOCK_M + S - T)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + cols[:, None] * D + d[None, :], mask=cols[:, None] < S, other=0.0)
        v = tl.load(v_base + cols[:, None] * D + d[None, :], mask=cols[:, None] < S, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale       # [BLOCK_M, BLOCK_N]
        valid = cols[None, :] < S
        if CAUSAL:
            valid = valid & (cols[None, :] <= pos[:, None])
        s = tl.where(valid, s, float("-inf"))          # weight exp(-inf) = 0
        m_new = tl.maximum(m, tl.max(s, axis=1))       # finite: every row sees key 0 in the first tile
        alpha = tl.exp(m - m_new)                      # l and acc were summed against m: rescale both
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    tl.store(O + b * s_qb + h * s_qh + rows[:, None] * D + d[None, :], (acc / l[:, None]).to(O.dtype.element_ty),
             mask=rows[:, None] < T)
### END SOLUTION


def flash_attention(q, k, v, causal=False, block_m=16, block_n=16):
    """FlashAttention's forward pass as one Triton kernel: q [B, H, T, D], k/v [B, Hkv, S, D] -> [B, H, T, D]."""
    ### BEGIN SOLUTION
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.arange, tl.dot), got {size!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be [B, H, T, D] and k, v the same [B, Hkv, S, D], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or Hkv < 1 or H % Hkv or S < 1:
        raise ValueError(f"k, v must be [B={B}, Hkv, S>=1, D={D}] with H={H} a multiple of Hkv, got {tuple(k.shape)}")
    if D not in (16, 32, 64, 128):
        raise ValueError(f"the head dim D must be 16, 32, 64 or 128, got {D}")
    if q.dtype not in (torch.float32, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must be all float32 or all float16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if causal and T > S:
        raise ValueError(f"causal attention needs T <= S (the queries are the last T positions), got T={T}, S={S}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    grid = (triton.cdiv(T, block_m), B * H)            # one program per (query tile, batch and head)
    _flash_fwd[grid](q, k, v, out, T, S, 1.0 / math.sqrt(D), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                     H=H, GROUP=H // Hkv, D=D, CAUSAL=bool(causal),
                     PRECISION="ieee" if q.dtype == torch.float32 else None, BLOCK_M=block_m, BLOCK_N=block_n)
    return out
    ### END SOLUTION


# %% id="c021" nbgrader={"grade": true, "grade_id": "flash_kernel_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# One query, two key tiles of 16: 16 keys of score 0 (value 1), then one of score 2 (value 0). The second
# tile raises the max from 0 to 2, so the first tile's terms must be rescaled by exp(-2) in l AND in acc.
_q1 = torch.zeros(1, 1, 1, 16)
_q1[..., 0] = 1.0
_k1, _v1 = torch.zeros(1, 1, 17, 16), torch.zeros(1, 1, 17, 16)
_k1[0, 0, 16, 0] = 8.0                                  # score 8 / sqrt(16) = 2
_v1[0, 0, :16, 0] = 1.0
_what = "flash_attention: one query, 16 keys of score 0 and value 1, then one of score 2 and value 0"
check_close(_kernel_checked(_q1, _k1, _v1, False, _what)[0, 0, 0, 0], 16 / (16 + math.exp(2)), _what, rtol=1e-5,
            mistakes={MISTAKES["kernel_acc_not_rescaled"]: 16 / (16 * math.exp(-2) + 1)})
_gen = torch.Generator().manual_seed(9)
_q = torch.randn(1, 4, 37, 16, generator=_gen)                  # 4 query heads, 37 rows: not a multiple of 16
_k, _v = (torch.randn(1, 2, 37, 16, generator=_gen) for _ in range(2))   # read 2 KV heads
for _causal in (False, True):
    _what = f"flash_attention(q [1, 4, 37, 16], k/v [1, 2, 37, 16], causal={_causal})"
    check_close(_kernel_checked(_q, _k, _v, _causal, _what), _attention(_q, _k, _v, causal=_causal), _what, rtol=1e-4,
                atol=1e-5)
_k, _v = (torch.randn(1, 2, 40, 16, generator=_gen) for _ in range(2))
for _T in (5, 1):
    _what = f"flash_attention(q [1, 4, {_T}, 16], k/v [1, 2, 40, 16], causal=True): {_T} new queries after {40 - _T} cached keys"
    check_close(_kernel_checked(_q[:, :, :_T], _k, _v, True, _what), _attention(_q[:, :, :_T], _k, _v, True), _what,
                rtol=1e-4, atol=1e-5,
                mistakes={MISTAKES["kernel_causal_top_left"]: _attention(_q[:, :, :_T], _k, _v, True, top_left=True)})
_what = "flash_attention in float16, q [1, 4, 5, 16], k/v [1, 2, 40, 16], causal=True"
check_close(_kernel_checked(_q[:, :, :5].half(), _k.half(), _v.half(), True, _what),
            _attention(_q[:, :, :5].half().float(), _k.half().float(), _v.half().float(), True), _what, rtol=2e-3,
            atol=2e-3)
_qd, _kd = _q.to(KERNEL_DEVICE), _k.to(KERNEL_DEVICE)
check_raises(lambda: flash_attention(_qd[:, :3], _kd, _kd), ValueError, "flash_attention with 3 query heads over 2 KV heads")
check_raises(lambda: flash_attention(_qd, _kd[:, :, :4], _kd[:, :, :4], causal=True), ValueError,
             "flash_attention, causal with 37 queries and 4 keys")
check_raises(lambda: flash_attention(_qd, _kd, _kd, block_m=24), ValueError, "flash_attention with block_m=24")
print("Part E: visible tests passed" + ("" if KERNEL_ON_GPU else " (in Triton's interpreter, on the CPU)"))

# %% [markdown] id="c022"
# ### Your kernel against SDPA (not graded)
#
# On a CUDA GPU the cell below times your kernel against PyTorch's `scaled_dot_product_attention` (SDPA,
# which picks its fastest backend: FlashAttention-2 from compute capability 8.0, the memory-efficient
# kernel on a T4), interleaved (`course_lib.perf.timing.compare`), causal, float16 (the 16-bit type every
# GPU Triton builds for computes, the T4 included), tiles of 64. A plain kernel like the solution's
# reaches a fraction of SDPA's speed on an A100 or H100 (no autotuning, no software-pipelining choices,
# the key loop masked everywhere); on a T4 expect several times slower: a T4 has tensor cores, but the
# code Triton generates for its compute capability 7.5 does not use them (`tl.dot` becomes ordinary FMA
# instructions; `tests/test_triton_targets.py` checks the compiled code for that), while SDPA's kernels
# do. On a CPU
# your kernel ran in Triton's interpreter: there a timing measures NumPy, not the kernel, and the cell says
# so instead of timing anything.

# %% id="c023"
if os.environ.get("NBGRADER_EXECUTION"):        # a measurement, not a test: the grader skips it
    print("the measurement is skipped while grading")
elif not KERNEL_ON_GPU:
    print("Your kernel ran in Triton's interpreter on the CPU (TRITON_INTERPRET=1): each tile is a NumPy "
          "operation in Python, so a timing here would measure the interpreter, not the kernel, and is "
          "meaningless. On a CUDA GPU (compute capability 7.0 or more, e.g. Colab's T4) this cell times your "
          "compiled kernel against SDPA.")
else:
    import torch.nn.functional as F

    from course_lib.perf.claims import timing_claim
    from course_lib.perf.timing import compare

    _B, _H, _N, _D = 4, 16, 2048, 64
    _q, _k, _v = (torch.randn(_B, _H, _N, _D, device="cuda", dtype=torch.float16) for _ in range(3))
    try:
        _mine = flash_attention(_q, _k, _v, causal=True, block_m=64, block_n=64)
    except (NotImplementedError, NameError):
        _mine = None
        print("finish Part E first: this cell times your flash_attention")
    if _mine is not None:
        _sdpa = F.scaled_dot_product_attention(_q, _k, _v, is_causal=True)
        _err = (_mine.float() - _sdpa.float()).abs().max().item()
        print(f"{torch.cuda.get_device_name()} (compute capability {compute_capability()}): max |yours - SDPA| "
              f"= {_err:.1e} at B={_B}, H={_H}, N={_N}, D={_D}, float16, causal")
        _cmp = compare({"your kernel": lambda: flash_attention(_q, _k, _v, causal=True, block_m=64, block_n=64),
                        "SDPA": lambda: F.scaled_dot_product_attention(_q, _k, _v, is_causal=True)},
                       warmup=2, repeats=10, device="cuda")
        _ratio = _cmp.ratio("your kernel", "SDPA")
        timing_claim("your kernel is within 2x of SDPA's time on this GPU", held=_ratio <= 2.0,
                     measured=f"yours takes {_ratio:.2f}x SDPA's time; {_cmp.describe()}",
                     advice="a plain kernel is expected to lose here (see above); on a T4 Triton's code does not "
                            "use the tensor cores; try block_n=32 or 128, and see notebook 07, section '5. A Triton kernel'")

# %% [markdown] id="c023a"
# ## Part F · FlashAttention's backward pass in Triton (4 points, contract)
#
# Training needs the gradients of attention. Autograd through the plain version keeps the `T x S`
# probabilities for the backward pass; FlashAttention's forward keeps only the output `O` and one number
# per row, the natural log-sum-exp `L` of its scaled scores (the third item of "Going further" below), and
# its backward **recomputes** each tile's probabilities from it, `P = exp(q k^T / sqrt(D) - L)`, exactly
# [@dao2022flashattention, Appendix B]. With `dO` the gradient of the output, per query tile `i` and key
# tile `j`: `dV_j += P^T dO_i`, `dP = dO_i V_j^T`, `dS = P * (dP - delta_i)`, `dQ_i += dS K_j / sqrt(D)`,
# `dK_j += dS^T Q_i / sqrt(D)`, where `delta = rowsum(dO * O)` is one number per query row (the paper's `D`;
# here `D` is the head dim). FlashAttention-2
# [@dao2024flashattention2, Algorithm 2] saves `L` alone, as here, and gives each program a key tile.
#
# **Contract.** `flash_attention_backward(q, k, v, out, lse, dout, causal=False, block_m=16, block_n=16)`, a
# launcher in Python that runs `@triton.jit` kernels of yours (one or more; names and arguments yours):
#
# * **takes** `q`, `out`, `dout` `[B, H, T, D]` and `k`, `v` `[B, Hkv, S, D]`, float32, and `lse` `[B, H, T]`
#   float32 (the natural log-sum-exp of each row's scores `q k^T / sqrt(D)`, what the forward saved), all
#   on `KERNEL_DEVICE`; `H` a multiple of `Hkv` (query head `h` reads KV head `h // (H // Hkv)`), `D` one of
#   16, 32, 64, `S >= 1`, and, when `causal`, `T <= S` with query `t` seeing the keys `j <= t + S - T`
#   (Part E's rule); `block_m`, `block_n` powers of two `>= 16` that need not divide `T` or `S`;
# * **returns** `(dq, dk, dv)`, float32, shaped like `q`, `k`, `v`: the gradients of `sum(O * dout)` with
#   respect to `q`, `k`, `v`, what `torch.autograd` gives through the plain attention, within `1e-4`
#   (relative and absolute) on inputs of magnitude a few units. With GQA, a KV head's `dk` and `dv` sum the
#   contributions of all its query heads;
# * **memory bound**: the scores and probabilities exist only as tiles inside a program; the launcher
#   creates no tensor larger than `q` or `k` and does no matmul in PyTorch (per-row quantities such as
#   `delta` may be computed there);
# * **raises** `ValueError` when the shapes do not fit (as Part E, and `out`, `dout`, `lse` not matching
#   `q`), `D` or a tile size is not allowed, an input is not float32, or `causal` with `T > S`.
#
# The tests run it in the interpreter on small shapes, causal and not, with GQA, `T < S` and lengths that are
# not multiples of the tiles, against autograd through the plain attention.
#
# <details><summary>Hint 1: where delta comes from</summary>
#
# Softmax's backward is `dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)`: the sum runs over a whole row of keys,
# which no key tile has. Since `O = P V`, that sum equals `rowsum(dO * O)`, which needs no `P` at all:
# compute it once per row before the tiles (forgetting it, `dS = P * dP`, leaves `dv` right and `dq`, `dk`
# wrong).
# </details>
#
# <details><summary>Hint 2: who writes what</summary>
#
# `dk` and `dv` of a key tile sum over every query; `dq` of a query tile sums over every key. A program
# that owns a key tile (of one KV head) and walks the query tiles can keep `dk`, `dv` in registers and
# write them once; `dq` then needs either atomic adds from every key tile or a second kernel that owns a
# query tile and walks the keys, recomputing `P` once more (deterministic, no atomics, and what the
# interpreter runs plainly). With GQA, the program of a KV head walks the query tiles of each head of its
# group, so that no two programs write the same rows of `dk`, `dv`.
# </details>
#
# <details><summary>Hint 3: masks and scales</summary>
#
# * Rows past `T` and keys past `S` load as zeros, and a zero score still gives a weight: set the padded and
#   causally hidden entries of `P` itself to 0 (not only the scores), and load `lse` and `delta` with the
#   same row mask.
# * The scale `1 / sqrt(D)` is inside `P` and multiplies `dq` and `dk` once more (the chain rule through the
#   scores); `dv` has none.
# * Causal: a key tile that starts at key `j0` is seen only by the query rows `t >= j0 - (S - T)` (the row
#   index in `q`, 0 to `T - 1`, not the absolute position `S - T + t` of Parts C and D); the loop over query
#   tiles may start at the tile that holds that row.
# * Precision: as in Part E, an fp32 `tl.dot` may use tf32 on an Ampere or newer GPU, about `1e-3` off,
#   beyond this part's `1e-4`: ask every `tl.dot` for full fp32 (`input_precision`).
# </details>

# %% id="c023b" nbgrader={"grade": false, "grade_id": "flash_backward_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Your @triton.jit kernel(s) here, then the launcher below them.
### BEGIN SOLUTION
@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, T, S, scale,
              H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: a key tile of one (batch, KV head); dK, dV summed over the queries of its G heads."""
    j, bkv = tl.program_id(0), tl.program_id(1)        # bkv = b * Hkv + KV head
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    kv_ptrs = bkv * S * D + cols[:, None] * D + d[None, :]
    k = tl.load(K + kv_ptrs, mask=cols[:, None] < S, other=0.0)
    v = tl.load(V + kv_ptrs, mask=cols[:, None] < S, other=0.0)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    lo = 0
    if CAUSAL:                                         # the first query that sees key j * BLOCK_N, its tile
        lo = (tl.maximum(j * BLOCK_N - (S - T), 0) // BLOCK_M) * BLOCK_M
    for g in range(GROUP):
        bh = bkv * GROUP + g                           # = b * H + h, h = kv head * GROUP + g
        for start in range(lo, T, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            q_ptrs = bh * T * D + rows[:, None] * D + d[None, :]
            q = tl.load(Q + q_ptrs, mask=rows[:, None] < T, other=0.0)
            do = tl.load(DO + q_ptrs, mask=rows[:, None] < T, other=0.0)
            lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)
            delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)
            valid = (cols[:, None] < S) & (rows[None, :] < T)             # [BLOCK_N, BLOCK_M]: transposed
            if CAUSAL:
                valid = valid & (cols[:, None] <= rows[None, :] + S - T)
            s_t = tl.dot(k, tl.trans(q), input_precision="ieee") * scale
            p_t = tl.where(valid, tl.exp(s_t - lse[None, :]), 0.0)         # P^T, recomputed
            dv += tl.dot(p_t, do, input_precision="ieee")
            dp_t = tl.dot(v, tl.trans(do), input_precision="ieee")
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t, q, input_precision="ieee")
    tl.store(DK + kv_ptrs, dk * scale, mask=cols[:, None] < S)
    tl.store(DV + kv_ptrs, dv, mask=cols[:, None] < S)


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, T, S, scale,
            H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: a query tile of one (batch, head); dQ summed over the keys it sees."""
    i, bh = tl.program_id(0), tl.program_id(1)
    bkv = bh // GROUP                                  # = b * Hkv + (h // GROUP)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q_ptrs = bh * T * D + rows[:, None] * D + d[None, :]
    q = tl.load(Q + q_ptrs, mask=rows[:, None] < T, other=0.0)
    do = tl.load(DO + q_ptrs, mask=rows[:, None] < T, other=0.0)
    lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)
    delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (i + 1) * BLOCK_M + S - T)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kv_ptrs = bkv * S * D + cols[:, None] * D + d[None, :]
        k = tl.load(K + kv_ptrs, mask=cols[:, None] < S, other=0.0)
        v = tl.load(V + kv_ptrs, mask=cols[:, None] < S, other=0.0)
        valid = (rows[:, None] < T) & (cols[None, :] < S)
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None] + S - T)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds, k, input_precision="ieee")
    tl.store(DQ + q_ptrs, dq * scale, mask=rows[:, None] < T)
### END SOLUTION


def flash_attention_backward(q, k, v, out, lse, dout, causal=False, block_m=16, block_n=16):
    """FlashAttention's backward: the forward's out [B, H, T, D] and lse [B, H, T], dout -> (dq, dk, dv)."""
    ### BEGIN SOLUTION
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.arange, tl.dot), got {size!r}")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be [B, H, T, D] and k, v the same [B, Hkv, S, D], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or Hkv < 1 or H % Hkv or S < 1:
        raise ValueError(f"k, v must be [B={B}, Hkv, S>=1, D={D}] with H={H} a multiple of Hkv, got {tuple(k.shape)}")
    if out.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"out and dout must be shaped like q {tuple(q.shape)} and lse [B, H, T] = "
                         f"{tuple(q.shape[:3])}, got {tuple(out.shape)}, {tuple(dout.shape)}, {tuple(lse.shape)}")
    if D not in (16, 32, 64):
        raise ValueError(f"the head dim D must be 16, 32 or 64, got {D}")
    if any(x.dtype != torch.float32 for x in (q, k, v, out, lse, dout)):
        raise ValueError("q, k, v, out, lse, dout must all be float32")
    if causal and T > S:
        raise ValueError(f"causal attention needs T <= S (the queries are the last T positions), got T={T}, S={S}")
    q, k, v, dout = q.contiguous(), k.contiguous(), v.contiguous(), dout.contiguous()
    lse = lse.contiguous()
    delta = (dout * out).sum(-1)                       # D = rowsum(dO * O): one number per query row
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    meta = dict(H=H, GROUP=H // Hkv, D=D, CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n)
    scale = 1.0 / math.sqrt(D)
    _bwd_dkdv[(triton.cdiv(S, block_n), B * Hkv)](q, k, v, dout, lse, delta, dk, dv, T, S, scale, **meta)
    _bwd_dq[(triton.cdiv(T, block_m), B * H)](q, k, v, dout, lse, delta, dq, T, S, scale, **meta)
    return dq, dk, dv
    ### END SOLUTION


# %% id="c023c" nbgrader={"grade": true, "grade_id": "flash_backward_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _backward_case(B, H, Hkv, T, S, D, causal, seed):
    """Inputs, the forward's out and lse, and autograd's gradients through the plain attention."""
    gen = torch.Generator().manual_seed(seed)
    q, do = torch.randn(B, H, T, D, generator=gen), torch.randn(B, H, T, D, generator=gen)
    k, v = torch.randn(B, Hkv, S, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = _attention(*leaves, causal=causal)
    grads = torch.autograd.grad(out, leaves, do)
    G = H // Hkv
    s = q @ k.repeat_interleave(G, 1).transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(T)[:, None] + S - T, float("-inf"))
    p, dp = s.softmax(-1), do @ v.repeat_interleave(G, 1).transpose(-1, -2)
    no_delta_dq = (p * dp) @ k.repeat_interleave(G, 1) / math.sqrt(D)     # the mistake of Hint 1
    return (q, k, v, out.detach(), torch.logsumexp(s, -1), do), grads, no_delta_dq


def _backward_checked(inputs, causal, what):
    """flash_attention_backward on KERNEL_DEVICE, under watch: three gradients shaped like q, k, v, no
    PyTorch matmul, no tensor larger than q or k. Returns them on the CPU."""
    inputs = [x.to(KERNEL_DEVICE) for x in inputs]
    with _Watch() as watch:
        got = flash_attention_backward(*inputs, causal=causal)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError(f"{what}: flash_attention_backward must return (dq, dk, dv), got {type(got).__name__}")
    for name, g, x in zip(("dq", "dk", "dv"), got, inputs[:3]):
        check_shape(g, tuple(x.shape), f"{what}: {name}")
    if watch.matmul_elements:
        raise AssertionError(f"{what}: PyTorch matmuls produced {watch.matmul_elements} elements: the gradients "
                             "must be computed by your Triton kernels, not by torch in the launcher")
    limit = max(inputs[0].numel(), inputs[1].numel())
    if watch.largest > limit:
        raise AssertionError(f"{what}: a tensor of {watch.largest} elements (shape {watch.largest_shape}) was "
                             f"created, more than the contract's bound {limit}")
    return [g.cpu() for g in got]


for _shape, _causal in (((1, 2, 2, 20, 20, 16), False), ((1, 4, 2, 20, 20, 16), True),
                        ((2, 2, 1, 5, 37, 16), True), ((1, 2, 1, 1, 18, 32), True)):
    _inputs, _want, _no_delta = _backward_case(*_shape, _causal, seed=sum(_shape))
    _what = (f"flash_attention_backward(q [{_shape[0]}, {_shape[1]}, {_shape[3]}, {_shape[5]}], k/v [{_shape[0]}, "
             f"{_shape[2]}, {_shape[4]}, {_shape[5]}], causal={_causal})")
    _got = _backward_checked(_inputs, _causal, _what)
    check_close(_got[0], _want[0], _what + ": dq", rtol=1e-4, atol=1e-4,
                mistakes={MISTAKES["bwd_no_delta"]: _no_delta})
    for _name, _g, _w in zip(("dk", "dv"), _got[1:], _want[1:]):
        check_close(_g, _w, f"{_what}: {_name}", rtol=1e-4, atol=1e-4)
_inputs = [x.to(KERNEL_DEVICE) for x in _backward_case(1, 4, 2, 6, 6, 16, False, seed=3)[0]]
check_raises(lambda: flash_attention_backward(*_inputs[:4], _inputs[4][:, :, :5], _inputs[5]), ValueError,
             "flash_attention_backward with lse of 5 rows for 6 queries")
check_raises(lambda: flash_attention_backward(_inputs[0][:, :3], *_inputs[1:]), ValueError,
             "flash_attention_backward with 3 query heads over 2 KV heads")
check_raises(lambda: flash_attention_backward(*_inputs, block_n=8), ValueError,
             "flash_attention_backward with block_n=8")
print("Part F: visible tests passed" + ("" if KERNEL_ON_GPU else " (in Triton's interpreter, on the CPU)"))

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
# * Give your Part E kernel a second output, the log-sum-exp of each row's scores, `LSE [B, H, T]` (fp32):
#   what is it in terms of the kernel's final `m` and `l`, and why do FlashAttention's backward pass
#   [@dao2022flashattention] and flash-decoding's split merge [@dao2023flashdecoding] (notebook 07, section '7. Flash-decoding: splitting the keys') need it?

# %% [markdown] id="c018" tags=["answer-key"]
# ### Answer key
#
# * Non-causal: Q read once (1024 x 64 = 65,536), K and V read once per query tile (8 tiles: 2 x 8 x 65,536
#   = 1,048,576), O written once (65,536): 1,179,648 elements, exactly `flash_attention_io(1024, 64, 128)`
#   and the `IOCounter` total. Causal: query tile i (0-based) visits key tiles 0..i, so K and V are read
#   128 x (1 + 2 + ... + 8) = 4,608 rows each instead of 8 x 1,024 = 8,192: 65,536 + 2 x 4,608 x 64 + 65,536
#   = 720,896 elements (the counter also reports 36 tiles visited, 28 skipped). Standard attention moves
#   4Nd + 4N^2 = 4,456,448: 3.8x more than tiled, 6.2x more than causal tiled. (A 128-row query tile at
#   d = 64 is within what notebook 07's IO model gives this loop order, B_r = ceil(M / 4d) rows: 128 rows on
#   a T4's 64 KB SM, 328 on an A100's 164 KB; with 328-row tiles the non-causal saving is 6.8x at
#   N = 1024.) The causal count is 61% of the non-causal one, not 50%: Q and O are moved whole anyway, and
#   the diagonal tiles (8 of the 36 visited) are loaded whole although half their keys are masked, so K/V
#   traffic is (n + 1) / 2n of the full one for n tiles (9/16 here), which tends to one half only for many
#   tiles.
# * `exp(x) = 2^(x log2 e)`: scaling the scores by `scale * log2(e)` and using `exp2` gives the same
#   weights, and every step of the online softmax is unchanged because the rescaling factor is
#   `2^(m_old - m_new)` in the same units. There `m` is the running max of the scores in log2 units
#   (`log2(e)` times the natural one), `l` the running sum of `2^(s - m)` (the same number as the natural
#   `sum exp(s_nat - m_nat)`), and `acc` the unnormalized output, so `acc / l` is unchanged; a log-sum-exp
#   read from the kernel must be multiplied by `ln 2` (`m + log2(l)` is in log2 units). `exp2` is one
#   hardware instruction, `exp` a multiply more.
# * With the kernel's natural-log scores, after the last tile `m` is the row's max score and `l` the sum of
#   `exp(s - m)`, so `LSE = m + log(l)` = `log sum_j exp(s_j)`; one more `tl.store` of `m + tl.log(l)` with
#   the mask `rows < T` (one fp32 per row, `T` of them per head: nothing next to the output). The backward
#   pass recomputes each tile's probabilities as `exp(s - LSE)` instead of storing the `T x S` matrix
#   (FlashAttention's recomputation); flash-decoding merges the partial outputs of key splits weighted by
#   `exp(LSE_split - LSE_total)`, which needs each split's LSE (`combine_splits` in notebook 07, section 7).
#   In the course's kernel (log2 units) the stored value is `(m + log2(l)) / log2(e)`.
