"""Split-KV attention's two ends, in Triton, shared by flash-decoding (``triton_flash.flash_decode_triton``)
and the paged decode kernel (``course_lib.paged.triton_paged``): ``store_split``, the last step of every
one of their programs, and ``combine_splits_triton``, the log-sum-exp reduction kernel both launch after
their split programs.

Each split s of a (sequence, query head) wrote its partial result in log2 units (the kernels use exp2):
m_s (max score), l_s (sum of 2^(score - m_s)), acc_s (sum of 2^(score - m_s) v, unnormalized), fp32,
laid out as m, l [R, NUM_SPLITS] and acc [R, NUM_SPLITS, Dh] for R = B * H rows. The reduction is

    out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s,   M = max_s m_s

(``online_softmax.combine_splits`` is the PyTorch version). An empty split (m_s = -inf, l_s = 0) weighs
2^-inf = 0; a row whose splits are all empty (a sequence of length 0) gets zeros, not NaN (M = -inf is
replaced by 0, the zero sum by 1). Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``.

With one split there is nothing to merge: ``store_split`` writes acc / l directly (l = 0, a sequence of
length 0: a zero row, not 0/0). The partials' layout is written by ``store_split`` and read by
``combine_splits_kernel``, both here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def store_split(OUT, M_PART, L_PART, ACC_PART, m_i, l_i, acc, b, head, split, n_heads, s_ob, s_oh, d, gmask, dmask,
                HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """The end of a decode program of sequence b, query heads ``head`` [G] (rows of m_i, l_i [G], acc [G, D]),
    split ``split``: NUM_SPLITS == 1 writes out = acc / l to OUT [B, H, Dh] (a row with no key: zeros); more
    splits write the partials to M_PART, L_PART [B, H, NUM_SPLITS] and ACC_PART [B, H, NUM_SPLITS, HEAD_DIM]
    (fp32, log2 units, n_heads = H) for ``combine_splits_triton``. gmask, dmask: real heads and head-dim
    columns."""
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]                   # length 0: zeros, not 0/0
        tl.store(OUT + b * s_ob + head[:, None] * s_oh + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=gmask[:, None] & dmask[None, :])
    else:
        row = (b * n_heads + head) * NUM_SPLITS + split
        tl.store(M_PART + row, m_i, mask=gmask)
        tl.store(L_PART + row, l_i, mask=gmask)
        tl.store(ACC_PART + row[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None] & dmask[None, :])


@triton.jit
def combine_splits_kernel(M_PART, L_PART, ACC_PART, OUT, s_ob, s_oh,
                           NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    """out[b, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M = max_s m_s (log-sum-exp)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = b * tl.num_programs(1) + h
    s = tl.arange(0, BLOCK_S)
    smask = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    m = tl.load(M_PART + row * NUM_SPLITS + s, mask=smask, other=float("-inf"))
    l_s = tl.load(L_PART + row * NUM_SPLITS + s, mask=smask, other=0.0)
    acc = tl.load(ACC_PART + (row * NUM_SPLITS + s[:, None]) * HEAD_DIM + d[None, :],
                  mask=smask[:, None] & dmask[None, :], other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)   # every split empty: no -inf - -inf = NaN
    w = tl.exp2(m - m_max)                                 # empty splits: 2^-inf = 0
    den = tl.sum(w * l_s, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(den > 0, den, 1.0)   # no keys at all: 0, not 0/0
    tl.store(OUT + b * s_ob + h * s_oh + d, out.to(OUT.dtype.element_ty), mask=dmask)


def combine_splits_triton(m_part: torch.Tensor, l_part: torch.Tensor, acc_part: torch.Tensor,
                          out: torch.Tensor) -> torch.Tensor:
    """Reduce split partials m_part, l_part [B, H, NS] and acc_part [B, H, NS, Dh] (fp32, contiguous,
    log2 units) into out [B, H, Dh] (any float dtype, unit stride on Dh); returns out."""
    B, H, NS = m_part.shape
    Dh = acc_part.shape[-1]
    if l_part.shape != m_part.shape or acc_part.shape != (B, H, NS, Dh) or out.shape != (B, H, Dh):
        raise ValueError(f"partials must be m, l [B, H, NS] and acc [B, H, NS, Dh] for out [B, H, Dh]; got "
                         f"{tuple(m_part.shape)}, {tuple(l_part.shape)}, {tuple(acc_part.shape)}, {tuple(out.shape)}")
    if any(t.dtype != torch.float32 or not t.is_contiguous() for t in (m_part, l_part, acc_part)):
        raise ValueError("partials must be contiguous float32 tensors")
    if out.stride(-1) != 1:
        raise ValueError("out must have unit stride on its last axis")
    combine_splits_kernel[(B, H)](m_part, l_part, acc_part, out, out.stride(0), out.stride(1),
                                   NUM_SPLITS=NS, BLOCK_S=triton.next_power_of_2(NS),
                                   HEAD_DIM=Dh, BLOCK_D=triton.next_power_of_2(Dh))
    return out


__all__ = ["combine_splits_triton", "store_split"]
