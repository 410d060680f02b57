"""Online softmax: softmax over a row that arrives in pieces, with a running max and a running sum.

softmax(x)_i = exp(x_i - m) / l with m = max_j x_j and l = sum_j exp(x_j - m). Reading the row piece by
piece, keep (m, l) for what was seen so far. A new piece c with its own max m_c updates them:

    m' = max(m, m_c)
    l' = l * exp(m - m') + sum_j exp(c_j - m')       # the old sum rescaled to the new max

The factor exp(m - m') is the whole trick: forgetting it (``l' = l + sum exp(c - m')``) gives a sum
measured against two different maxima, and a wrong softmax as soon as a later piece raises the max.
Two partial results (m_a, l_a), (m_b, l_b) merge the same way; weighted sums of values (attention's
``acc = sum_j exp(s_j - m) v_j``) are rescaled by the same factor, which is what makes tiled attention
and split-KV decoding exact. A piece of all -inf (a fully masked tile) leaves (m, l) unchanged.
"""
from __future__ import annotations

import torch


def _safe(m: torch.Tensor) -> torch.Tensor:
    """m with -inf replaced by 0, to subtract from -inf scores without NaN (exp(-inf - 0) = 0)."""
    return torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)


def softmax_stats_update(m: torch.Tensor, l: torch.Tensor, piece: torch.Tensor):
    """Fold one piece [..., n] of the row into the running max m [...] and sum l [...]; returns (m', l')."""
    m_new = torch.maximum(m, piece.max(dim=-1).values)
    l_new = l * torch.exp(m - _safe(m_new)) + torch.exp(piece - _safe(m_new)[..., None]).sum(dim=-1)
    return m_new, l_new


def merge_softmax_stats(m_a, l_a, m_b, l_b):
    """(m, l) of the concatenation of two pieces from the (m, l) of each (the log-sum-exp merge)."""
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m_a - _safe(m)) + l_b * torch.exp(m_b - _safe(m))


def split_sizes(n: int, splits) -> list[int]:
    """Piece lengths along a row of n: an int block size (the last piece shorter) or explicit lengths."""
    if isinstance(splits, bool) or not isinstance(splits, (int, list, tuple)):
        raise TypeError(f"splits must be an int block size or a list of piece lengths, got {type(splits).__name__}")
    if isinstance(splits, int):
        if splits < 1:
            raise ValueError(f"splits (a block size) must be >= 1, got {splits}")
        return [min(splits, n - i) for i in range(0, n, splits)]
    sizes = [int(s) for s in splits]
    if any(s < 1 for s in sizes) or sum(sizes) != n:
        raise ValueError(f"splits must be positive lengths summing to the row length {n}, got {sizes}")
    return sizes


def online_softmax_stats(x: torch.Tensor, splits):
    """Running (max, sum) over the last axis of x [..., n], read in pieces (``splits``: block size or
    lengths). Returns (m, l), each [...]: m = max(x), l = sum(exp(x - m)), in x's dtype (fp32 advised)."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    start = 0
    for size in split_sizes(x.shape[-1], splits):
        m, l = softmax_stats_update(m, l, x[..., start:start + size])
        start += size
    return m, l


def online_softmax(x: torch.Tensor, splits) -> torch.Tensor:
    """softmax(x, dim=-1) from one pass of running statistics over pieces, then one normalizing pass.
    Equal to ``torch.softmax`` on any split (up to rounding)."""
    m, l = online_softmax_stats(x, splits)
    return torch.exp(x - _safe(m)[..., None]) / l[..., None]


def combine_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, base2: bool = False) -> torch.Tensor:
    """The log-sum-exp reduction of split-KV attention (flash-decoding), in PyTorch.

    Split s of a row saw its keys only and kept m_s (max score), l_s (sum of exp(score - m_s)) and
    acc_s (sum of exp(score - m_s) v, unnormalized): m, l [..., S], acc [..., S, D]. Then

        out = sum_s w_s acc_s / sum_s w_s l_s,   w_s = exp(m_s - max_s m_s)

    An empty split (m_s = -inf, l_s = 0) weighs nothing; a row whose splits are all empty (a sequence of
    no keys) gets zeros, not 0/0. ``base2``: scores in log2 units (kernels use exp2), w_s = 2^(m_s - M).
    The Triton kernels do the same in ``triton_splitkv.combine_splits_triton``."""
    M = m.max(dim=-1, keepdim=True).values
    w = (torch.exp2 if base2 else torch.exp)(m - _safe(M))                          # [..., S]
    den = (w * l).sum(dim=-1, keepdim=True)
    return (w[..., None] * acc).sum(dim=-2) / torch.where(den > 0, den, 1.0)


__all__ = ["softmax_stats_update", "merge_softmax_stats", "split_sizes", "online_softmax_stats", "online_softmax",
           "combine_splits"]
