"""A Triton decode kernel for paged attention: K/V read in place through the block table.

One program per (sequence, query head). It walks the sequence's blocks in order: loads the physical
block number from the table, loads that block's keys [block_size, Dh] for the query head's KV head,
scores them, and folds them into a running (max, sum, weighted V) - the online softmax - so no gathered
copy of K/V is ever made. Tokens past the sequence length in its last block are masked.

Runs on CUDA, and on CPU tensors under the interpreter (set ``TRITON_INTERPRET=1`` before importing
triton); block_size must be a power of two, head_dim any size (padded to a power of two and masked).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .attention import _check_paged_args


@triton.jit
def _paged_decode_kernel(Q, KP, VP, TBL, LENS, OUT, scale,
                         s_qb, s_qh, s_kn, s_kh, s_ks, s_vn, s_vh, s_vs, s_tb, s_ob, s_oh,
                         GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP                                   # GQA: the KV head this query head reads
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    q = tl.load(Q + b * s_qb + h * s_qh + d, mask=dmask, other=0.0).to(tl.float32)
    L = tl.load(LENS + b)
    offs = tl.arange(0, BLOCK_SIZE)
    m_i = tl.full([1], float("-inf"), tl.float32)     # running max of the scores
    l_i = tl.zeros([1], tl.float32)                    # running sum of exp(score - max)
    acc = tl.zeros([BLOCK_D], tl.float32)              # running sum of exp(score - max) * v
    num_blocks = tl.cdiv(L, BLOCK_SIZE)
    for i in range(0, num_blocks):
        blk = tl.load(TBL + b * s_tb + i).to(tl.int64)  # logical block i -> physical block
        tok = i * BLOCK_SIZE + offs
        tmask = tok < L
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(KP + blk * s_kn + kvh * s_kh + offs[:, None] * s_ks + d[None, :], mask=kv_mask, other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale       # [BLOCK_SIZE]
        s = tl.where(tmask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(VP + blk * s_vn + kvh * s_vh + offs[:, None] * s_vs + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(OUT + b * s_ob + h * s_oh + d, out.to(OUT.dtype.element_ty), mask=dmask)


def paged_attention_triton(q, k_pool, v_pool, block_tables, context_lens, scale: float | None = None):
    """Same contract as ``paged_attention_reference``: q [B, H, Dh] -> out [B, H, Dh]."""
    _check_paged_args(q, k_pool, v_pool, block_tables, context_lens)
    B, H, Dh = q.shape
    N, K, bs, _ = k_pool.shape
    if bs & (bs - 1):
        raise ValueError(f"the Triton kernel needs a power-of-two block_size, got {bs}")
    q, k_pool, v_pool = q.contiguous(), k_pool.contiguous(), v_pool.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    _paged_decode_kernel[(B, H)](
        q, k_pool, v_pool, tables, lens, out, scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), tables.stride(0), out.stride(0), out.stride(1),
        GROUP=H // K, BLOCK_SIZE=bs, HEAD_DIM=Dh, BLOCK_D=triton.next_power_of_2(Dh))
    return out
