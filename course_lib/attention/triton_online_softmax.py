"""The online-softmax tile step, in Triton: the one loop body of the course's three attention kernels.

``online_softmax_tile`` folds one tile of keys and values into the running state of a tile of query rows.
The FlashAttention forward (``triton_flash._fwd_tiles``), flash-decoding (``triton_flash``) and the paged
decode kernel (``course_lib.paged.triton_paged``) all call it; they differ only in where a tile's K/V rows
live (a contiguous cache, or blocks found through a block table) and which scores a tile may keep (causal,
length, the end of a split), so each builds the pointers and masks and the step does the math. It is
``online_softmax.py``'s update (the PyTorch version) with two changes for the GPU:

* log2 units: the launchers fold log2(e) into the scale (``qk_scale = scale * LOG2E``), so the kernels use
  ``exp2`` (one instruction) and every running max and partial is in log2 units;
* fp32 state whatever the input dtype: m (running max), l (running sum of 2^(s - m)), acc (running sum of
  2^(s - m) v, unnormalized).

A row that has seen no key yet (m = -inf) takes 0 as its max for the update (2^(-inf - 0) = 0, no
-inf - -inf = NaN), so a fully masked tile, an empty split or a sequence of length 0 leaves (m, l, acc) =
(-inf, 0, 0): the epilogues turn l = 0 into a zero row, and the split merge weighs such a split 0
(``triton_splitkv``).

**The interpreter's loop bounds.** In triton 3.6's interpreter every scalar is a 1-element 1-D NumPy array
(``program_id`` returns ``np.array([i])`` and every assignment goes through ``to_tensor``), and a tensor
used as a ``range`` bound is converted with ``int(array)``, which NumPy >= 2.4 refuses for ndim > 0
("only 0-dimensional arrays can be converted to Python scalars"; triton 3.9's interpreter squeezes first).
So each kernel takes ``STATIC_TOKENS`` (``static_tokens(n)`` on the host): under the interpreter the keys a
program could read, and its tile loop then runs a count written inline from constexprs, with every mask on
(the extra tiles are fully masked and change nothing); 0 in a compiled kernel, which keeps its runtime,
per-program trip count (no wasted tiles, and a ``for`` the software pipeliner can stage). Tests set
``STATIC_LOOP_IN_INTERPRETER = False`` to run the compiled path's loops in an interpreter that allows it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from course_lib.env import triton_interpreting

LOG2E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) = exp2(x * LOG2E); the host reads LOG2E.value
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
STATIC_LOOP_IN_INTERPRETER = True          # see the module docstring; tests turn it off


def interpreting() -> bool:
    """True when triton runs kernels in its interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return triton_interpreting()


def static_tokens(n_keys: int) -> int:
    """The ``STATIC_TOKENS`` constexpr of a launch: ``n_keys`` (the most keys a program may read) under the
    interpreter, where loop bounds must be host-known (see the module docstring); 0, a runtime trip count,
    in a compiled kernel."""
    return int(n_keys) if interpreting() and STATIC_LOOP_IN_INTERPRETER else 0


def decode_configs():
    """The autotune space of the decode kernels (flash-decoding, paged): TILE_N keys per tile, warps, stages.
    One small config under the interpreter (nothing to time there)."""
    if interpreting():
        return [triton.Config({"TILE_N": 16}, num_warps=4, num_stages=1)]
    return [triton.Config({"TILE_N": n}, num_warps=w, num_stages=s)
            for n, w, s in ((32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 2))]


@triton.jit
def online_softmax_tile(q, m_i, l_i, acc, k_ptrs, v_ptrs, kv_mask, valid, qk_scale,
                        MASK_KV: tl.constexpr, MASK_SCORES: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        UPCAST_DOT: tl.constexpr):
    """Fold one tile of N keys into the running (m_i, l_i, acc) of M query rows; returns the new three.

    q [M, D] (scores are q @ k^T * qk_scale, log2 units); k_ptrs, v_ptrs [N, D] point at the tile's K and V
    rows; kv_mask (broadcast to [N, D]) says which to load when MASK_KV (others read 0); valid (broadcast
    to [M, N]) says which scores count when MASK_SCORES (others are -inf). m_i, l_i [M], acc [M, D]: fp32.
    DOT_PRECISION: "ieee" for fp32 inputs (no tf32), None otherwise; UPCAST_DOT: do both dots in fp32 (the
    interpreter's tl.dot multiplies bf16 bit patterns)."""
    if MASK_KV:
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
    else:
        k = tl.load(k_ptrs)
    if UPCAST_DOT:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    s = s * qk_scale                                                   # [M, N], log2 units
    if MASK_SCORES:
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)              # a row with nothing seen yet: no NaN
    alpha = tl.exp2(m_i - m_use)                                       # rescales the old sums
    p = tl.exp2(s - m_use[:, None])
    if MASK_KV:
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    else:
        v = tl.load(v_ptrs)
    if UPCAST_DOT:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv
    # l after acc (the decode kernels' order before this step was shared): l first adds a bar.sync to every
    # tile of flash-decoding's sm_80/sm_90 build
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, acc


__all__ = ["LOG2E", "SUPPORTED_DTYPES", "decode_configs", "interpreting", "online_softmax_tile", "static_tokens"]
