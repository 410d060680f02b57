"""Flash-decoding in PyTorch: split the keys of one decode step across independent workers, then merge.

A decode step has one query per sequence, so "one program per (sequence, head)" gives a GPU only
B * heads programs: with a batch of one and 8 KV heads, 8 of an H100's 132 SMs work while a 32k-token
cache is read. Flash-decoding cuts the keys into ``num_splits`` chunks, runs each chunk as its own
worker (partial max m_s, sum l_s, unnormalized acc_s), and merges the chunks with the log-sum-exp
reduction ``online_softmax.combine_splits``. The result is exact: merging is the online-softmax update.

This is the readable version (a Python loop over splits); ``triton_flash.flash_decode_triton`` runs the
splits as programs of one kernel and the shared Triton reduction merges them.

Lengths (every backend, paged ones included): sequence b reads its first ``lengths[b]`` keys, 0 <= lengths[b]
<= S. A sequence of length 0 attends to nothing and gets an all-zero row (``reference_attention``'s rule for a
row with no key). A length outside [0, S] is a ValueError naming ``lengths[b]``, the value and the range:
always here (this version reads the lengths on the host anyway); the Triton kernel checks only with
``validate=True`` (reading a GPU tensor is a host sync) and otherwise clamps into [0, S].
"""
from __future__ import annotations

import math
import operator

import torch

from course_lib.validate import integer

from .online_softmax import combine_splits
from .reference import check_qkv


def split_bounds(length: int, num_splits: int) -> list[tuple[int, int]]:
    """[start, end) of each split of ``length`` keys: equal chunks (the last shorter; some may be empty)."""
    per = -(-length // num_splits)
    return [(min(s * per, length), min((s + 1) * per, length)) for s in range(num_splits)]


def check_lengths(lengths, batch: int, max_len: int, name: str = "lengths") -> list[int]:
    """``lengths`` (a sequence or 1-D integer tensor of ``batch`` values, each in [0, max_len]) as Python ints,
    or a ValueError naming the argument, the offending entry and the range. Reads a tensor on the host."""
    if torch.is_tensor(lengths):
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got a {lengths.dtype} tensor")
        if lengths.dim() != 1:
            raise ValueError(f"{name} must be {batch} values (one per sequence), got shape {tuple(lengths.shape)}")
        values = lengths.tolist()
    else:
        values = []
        for x in lengths:                      # ints, NumPy ints, 0-d integer tensors; not 2.5, not True
            try:
                values.append(operator.index(x))
            except TypeError:
                raise ValueError(f"{name} must hold integers, got {list(lengths)}") from None
            if isinstance(x, bool):
                raise ValueError(f"{name} must hold integers, not bools, got {list(lengths)}")
    if len(values) != batch:
        raise ValueError(f"{name} must be {batch} values (one per sequence), got {len(values)}")
    for b, n in enumerate(values):
        if not 0 <= n <= max_len:
            raise ValueError(f"{name}[{b}]={n} is outside [0, {max_len}] (keys a sequence may read; 0 = empty)")
    return values


def split_partials(q, k, v, num_splits: int, lengths=None, scale: float | None = None):
    """The partials of every split: q [B, H, Dh], k/v [B, K, S, Dh] -> m, l [B, H, NS], acc [B, H, NS, Dh]
    (fp32, natural-log units). An empty split has m = -inf, l = 0, acc = 0. ``lengths``: keys of each
    sequence, in [0, S] (checked, ValueError); None = S."""
    if not torch.is_tensor(q) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor [B, H, Dh], got {getattr(q, 'shape', type(q).__name__)}")
    B, H, K, _, S, Dh = check_qkv(q[:, :, None], k, v)
    num_splits = integer(num_splits, "num_splits", low=1)
    G = H // K
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    lens = [S] * B if lengths is None else check_lengths(lengths, B, S)
    m = torch.full((B, H, num_splits), float("-inf"), device=q.device)
    l = torch.zeros(B, H, num_splits, device=q.device)
    acc = torch.zeros(B, H, num_splits, Dh, device=q.device)
    for b in range(B):
        qb = q[b].float().view(K, G, Dh)                                      # heads of a group as rows
        for s, (lo, hi) in enumerate(split_bounds(lens[b], num_splits)):
            if hi <= lo:
                continue
            scores = (qb @ k[b, :, lo:hi].float().transpose(-1, -2)) * scale       # [K, G, n]
            ms = scores.max(dim=-1).values                                    # [K, G]
            p = torch.exp(scores - ms[..., None])
            m[b, :, s] = ms.reshape(H)
            l[b, :, s] = p.sum(-1).reshape(H)
            acc[b, :, s] = (p @ v[b, :, lo:hi].float()).reshape(H, Dh)              # [K, G, Dh]
    return m, l, acc


def flash_decode_torch(q, k, v, num_splits: int = 4, lengths=None, scale: float | None = None):
    """Flash-decoding, readable: per-split partials merged by the log-sum-exp reduction -> [B, H, Dh].
    q [B, H, Dh], k/v [B, K, S, Dh]; ``lengths`` [B] in [0, S] (a ValueError outside; 0 gives a zero row)."""
    m, l, acc = split_partials(q, k, v, num_splits, lengths, scale)
    return combine_splits(m, l, acc).to(q.dtype)


__all__ = ["check_lengths", "split_bounds", "split_partials", "flash_decode_torch"]
