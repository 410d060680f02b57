"""FlashAttention's backward pass as Triton kernels, and an autograd function whose forward is the Triton
forward (``triton_flash.flash_attention_triton``) and whose backward is this.

Same math as the PyTorch reference ``backward.tiled_attention_backward`` (read that first): the forward
saves the output O and the natural log-sum-exp L of every row; the backward recomputes each tile's
probabilities P = exp(Q K^T * scale - L), never storing a T x S matrix (Dao et al. 2022, Appendix B.4,
Algorithm 4; with L alone saved and one program per key tile, FlashAttention-2's backward, Dao 2024,
Section 3.1.2, Algorithm 2). Three steps:

1. D = rowsum(dO * O) [B, H, T], fp32, in PyTorch (one elementwise product and a sum: nothing to tile);
2. ``_bwd_dkdv_kernel``, one program per (key tile of BLOCK_N, batch * KV head): it loads its K and V tiles
   once and walks the query tiles of every query head of its group (GQA: the G heads' contributions meet in
   the program's registers, no atomics), accumulating dK = scale * sum dS^T Q and dV = sum P^T dO in fp32,
   written once;
3. ``_bwd_dq_kernel``, one program per (query tile of BLOCK_M, batch * query head): it walks the key tiles
   and accumulates dQ = scale * sum dS K, written once.

FlashAttention-2 folds step 3 into step 2 with atomic adds on dQ; a second kernel recomputes P and dP once
more (7 tile matmuls instead of 5: 40% more FLOPs) but needs no atomics, so dQ is deterministic and the kernel runs
as is under
the interpreter. Both kernels work in log2 units (``exp2``, the scale folded with log2(e), as the forward).
Causal (query t at position S - T + t sees keys <= there, T <= S): each kernel skips the tiles wholly in
the future. Unlike the forward, every visited tile is masked (rows past T, keys past S, the diagonal):
simpler, at some cost on a GPU. Under the interpreter each loop runs a host-known trip count with every
mask on (``STATIC_ROWS``/``STATIC_TOKENS``, see ``triton_online_softmax``).

Runs on CUDA tensors, or on CPU tensors with ``TRITON_INTERPRET=1`` set before triton was imported.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from course_lib.env import use_triton
from course_lib.validate import power_of_two

from .backward import check_backward_inputs
from .triton_flash import flash_attention_triton
from .triton_online_softmax import LOG2E, SUPPORTED_DTYPES, interpreting, static_tokens


@triton.jit
def _bwd_dot(a, b, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """a @ b in fp32, a cast to b's dtype first (P and dS are fp32, the tensor cores take 16-bit inputs);
    UPCAST_DOT: both in fp32 (the interpreter's tl.dot multiplies bf16 bit patterns)."""
    if UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a.to(b.dtype), b, input_precision=DOT_PRECISION)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, scale, qk_scale, T, S,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                     STATIC_ROWS: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    bk = tl.program_id(1)                                      # b * K + kvh: every tensor is contiguous
    start_n = pid_n * BLOCK_N
    n = start_n + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    dmask = d[None, :] < HEAD_DIM
    kv_off = bk.to(tl.int64) * S * HEAD_DIM + n[:, None] * HEAD_DIM + d[None, :]
    kv_mask = (n[:, None] < S) & dmask
    k = tl.load(K + kv_off, mask=kv_mask, other=0.0)          # [BLOCK_N, BLOCK_D], read once
    v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    offset = S - T                                             # query t sits at position offset + t
    if CAUSAL:   # the first query that sees key start_n is start_n - offset: start at its tile
        lo = (tl.maximum(start_n - offset, 0) // BLOCK_M) * BLOCK_M
    else:
        lo = 0
    for g in range(GROUP):                                     # GQA: the query heads that read this KV head
        bh = bk * GROUP + g                                    # = b * H + h with h = kvh * GROUP + g
        if STATIC_ROWS > 0:     # interpreter: host-known bounds, every tile (see triton_online_softmax)
            dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, bh, n, d, dmask, qk_scale, T, S, 0,
                                 STATIC_ROWS, HEAD_DIM, CAUSAL, DOT_PRECISION, UPCAST_DOT, BLOCK_M)
        else:
            dk, dv = _dkdv_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, bh, n, d, dmask, qk_scale, T, S, lo, T,
                                 HEAD_DIM, CAUSAL, DOT_PRECISION, UPCAST_DOT, BLOCK_M)
    tl.store(DK + kv_off, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, bh, n, d, dmask, qk_scale, T, S, lo, hi,
                HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                UPCAST_DOT: tl.constexpr, BLOCK_M: tl.constexpr):
    """Add the query rows [lo, hi) of query head ``bh`` to one key tile's dK (unscaled) and dV. Transposed
    tiles ([keys, queries]) so that P^T and dS^T come out of the dots without a transpose."""
    for start_m in range(lo, hi, BLOCK_M):
        m = start_m + tl.arange(0, BLOCK_M)
        mmask = m < T
        q_off = bh.to(tl.int64) * T * HEAD_DIM + m[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(Q + q_off, mask=mmask[:, None] & dmask, other=0.0)          # [BLOCK_M, BLOCK_D]
        do = tl.load(DO + q_off, mask=mmask[:, None] & dmask, other=0.0)
        lse2 = tl.load(LSE + bh.to(tl.int64) * T + m, mask=mmask, other=0.0) * LOG2E   # log2 units
        delta = tl.load(DELTA + bh.to(tl.int64) * T + m, mask=mmask, other=0.0)
        valid = (n[:, None] < S) & mmask[None, :]                               # [BLOCK_N, BLOCK_M]
        if CAUSAL:
            valid = valid & (n[:, None] <= m[None, :] + (S - T))
        s_t = _bwd_dot(k, tl.trans(q), DOT_PRECISION, UPCAST_DOT) * qk_scale    # scores^T, log2 units
        p_t = tl.where(valid, tl.exp2(s_t - lse2[None, :]), 0.0)                # P^T, the forward's
        dv += _bwd_dot(p_t, do, DOT_PRECISION, UPCAST_DOT)
        dp_t = _bwd_dot(v, tl.trans(do), DOT_PRECISION, UPCAST_DOT)             # (dO V^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        dk += _bwd_dot(ds_t, q, DOT_PRECISION, UPCAST_DOT)
    return dk, dv


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, scale, qk_scale, T, S,
                   H: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   CAUSAL: tl.constexpr, STATIC_TOKENS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   UPCAST_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)                                      # b * H + h
    bk = (bh // H) * (H // GROUP) + (bh % H) // GROUP          # b * K + kvh: GQA reads KV head h // G
    start_m = pid_m * BLOCK_M
    m = start_m + tl.arange(0, BLOCK_M)
    mmask = m < T
    d = tl.arange(0, BLOCK_D)
    dmask = d[None, :] < HEAD_DIM
    q_off = bh.to(tl.int64) * T * HEAD_DIM + m[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(Q + q_off, mask=mmask[:, None] & dmask, other=0.0)              # [BLOCK_M, BLOCK_D], once
    do = tl.load(DO + q_off, mask=mmask[:, None] & dmask, other=0.0)
    lse2 = tl.load(LSE + bh.to(tl.int64) * T + m, mask=mmask, other=0.0) * LOG2E
    delta = tl.load(DELTA + bh.to(tl.int64) * T + m, mask=mmask, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if STATIC_TOKENS > 0:       # interpreter: every key tile (see triton_online_softmax)
        hi = STATIC_TOKENS
    elif CAUSAL:
        hi = tl.minimum(S, start_m + BLOCK_M + S - T)         # the tile's last position + 1
    else:
        hi = S
    for start_n in range(0, hi, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        kv_off = bk.to(tl.int64) * S * HEAD_DIM + n[:, None] * HEAD_DIM + d[None, :]
        kv_mask = (n[:, None] < S) & dmask
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0)                        # [BLOCK_N, BLOCK_D]
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        valid = mmask[:, None] & (n[None, :] < S)                               # [BLOCK_M, BLOCK_N]
        if CAUSAL:
            valid = valid & (n[None, :] <= m[:, None] + (S - T))
        s = _bwd_dot(q, tl.trans(k), DOT_PRECISION, UPCAST_DOT) * qk_scale
        p = tl.where(valid, tl.exp2(s - lse2[:, None]), 0.0)
        dp = _bwd_dot(do, tl.trans(v), DOT_PRECISION, UPCAST_DOT)
        dq += _bwd_dot(p * (dp - delta[:, None]), k, DOT_PRECISION, UPCAST_DOT)
    tl.store(DQ + q_off, (dq * scale).to(DQ.dtype.element_ty), mask=mmask[:, None] & dmask)


def flash_attention_backward_triton(q, k, v, out, lse, dout, causal: bool = False, scale: float | None = None,
                                    block_m: int | None = None, block_n: int | None = None):
    """Gradients of FlashAttention: q [B, H, T, Dh], k/v [B, K, S, Dh], the forward's out [B, H, T, Dh] and
    natural log-sum-exp lse [B, H, T] (``flash_attention_triton(..., return_lse=True)``), dout [B, H, T, Dh]
    -> (dq, dk, dv) in the dtypes of q, k, v. ``causal`` needs T <= S. ``block_m``/``block_n``: powers of
    two >= 16 (tl.dot's smallest side); default 16 under the interpreter, 64 on a GPU."""
    B, H, K, T, S, Dh = check_backward_inputs(q, k, v, out, lse, dout)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"the Triton kernels support {SUPPORTED_DTYPES}, got dtype {q.dtype}")
    # the one decision of course_lib.env: ValueError where Triton cannot run, a warning on a T4
    use_triton(q.device, "triton", "the FlashAttention backward kernel", "flash_attention_backward_triton")
    if causal and T > S:
        raise ValueError(f"causal attention needs at least as many keys as queries, got T={T} > S={S}")
    default = 16 if interpreting() else 64
    bm = power_of_two(block_m if block_m is not None else default, "block_m", low=16)
    bn = power_of_two(block_n if block_n is not None else default, "block_n", low=16)
    q, k, v, dout = (x.contiguous() for x in (q, k, v, dout))   # the kernels index [B, heads, seq, Dh] densely
    lse = lse.float().contiguous()
    delta = (dout.float() * out.float()).sum(dim=-1)          # D = rowsum(dO * O), [B, H, T]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    meta = dict(HEAD_DIM=Dh, BLOCK_D=max(16, triton.next_power_of_2(Dh)), CAUSAL=bool(causal),
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
                UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16, BLOCK_M=bm, BLOCK_N=bn,
                num_warps=4 if bm * bn <= 64 * 64 else 8, num_stages=1 if interpreting() else 2)
    args = (q, k, v, dout, lse, delta)
    _bwd_dkdv_kernel[(triton.cdiv(S, bn), B * K)](*args, dk, dv, scale, scale * LOG2E.value, T, S, GROUP=H // K,
                                                  STATIC_ROWS=static_tokens(T), **meta)
    _bwd_dq_kernel[(triton.cdiv(T, bm), B * H)](*args, dq, scale, scale * LOG2E.value, T, S, H=H, GROUP=H // K,
                                                STATIC_TOKENS=static_tokens(S), **meta)
    return dq, dk, dv


class FlashAttentionTriton(torch.autograd.Function):
    """Attention with gradients, both ways in Triton: forward ``flash_attention_triton`` (saving q, k, v, the
    output and the log-sum-exp: O(T) extra memory, not the T x S probabilities), backward
    ``flash_attention_backward_triton``. Use ``flash_attention_autograd``."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        out, lse = flash_attention_triton(q, k, v, causal=causal, scale=scale, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward_triton(q, k, v, out, lse, dout, causal=ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None


def flash_attention_autograd(q, k, v, causal: bool = False, scale: float | None = None):
    """``flash_attention_triton`` that torch.autograd can differentiate: q [B, H, T, Dh], k/v [B, K, S, Dh]
    -> [B, H, T, Dh]; ``out.backward(...)`` runs the Triton backward."""
    return FlashAttentionTriton.apply(q, k, v, bool(causal), scale)


__all__ = ["flash_attention_backward_triton", "FlashAttentionTriton", "flash_attention_autograd"]
