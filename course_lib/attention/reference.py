"""Reference attention: the N x N scores materialized, every mask explicit. The source of truth that the
tiled PyTorch version, the Triton kernel and flash-decoding are tested against.

Shapes: B batch, H query heads, K key/value heads (H = K * G), T queries, S keys, Dh head dim.
Query head h reads KV head h // G (the Hugging Face layout).

Masks (True = may attend):
* ``causal``: query t sits at absolute position S - T + t (the last T of the S keys; T == S without a
  cache) and sees keys j <= S - T + t ("bottom-right" alignment, what a KV cache needs).
* ``key_padding_mask`` [B, S] bool (or [1, S], one mask for the whole batch): False marks a padding key that
  no query may read. Nothing else is taken (no [B, 1, T, S] mask, no additive float mask).
A query row that may read no key at all gets zeros and a log-sum-exp of -inf (not NaN).
"""
from __future__ import annotations

import math

import torch


def check_qkv(q, k, v, argument_prefix: str = "") -> tuple[int, int, int, int, int, int]:
    """Shapes of q [B, H, T, Dh], k/v [B, K, S, Dh] (H a multiple of K), same dtype and device; returns
    (B, H, K, T, S, Dh) or raises a ValueError/TypeError naming the argument."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(x):
            raise TypeError(f"{argument_prefix}{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{argument_prefix}{name} must be 4-D [B, heads, seq, head_dim], "
                             f"got shape {tuple(x.shape)}")
    B, H, T, Dh = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != B or k.shape[3] != Dh:
        raise ValueError(f"k/v must be [B={B}, K, S, Dh={Dh}], got {tuple(k.shape)}")
    K, S = k.shape[1], k.shape[2]
    if K == 0 or H % K:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads K={K}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    return B, H, K, T, S, Dh


def allowed_mask(T: int, S: int, causal: bool, key_padding_mask=None, device=None,
                 batch: int | None = None) -> torch.Tensor | None:
    """Boolean (True = may attend) from the causal rule and a padding mask, or None: [1, 1, T, S] causal
    only, [B or 1, 1, 1, S] padding only (broadcast over the queries: slice its query axis only if it has
    T entries), [B or 1, 1, T, S] both. ``batch``: the B a [B, S] padding mask must have (1 also taken)."""
    mask = None
    if causal:
        if T > S:
            raise ValueError(f"causal attention needs at least as many keys as queries, got T={T} > S={S}")
        i = torch.arange(T, device=device)[:, None] + (S - T)
        mask = (torch.arange(S, device=device)[None, :] <= i)[None, None]          # [1, 1, T, S]
    if key_padding_mask is not None:
        if not torch.is_tensor(key_padding_mask) or key_padding_mask.dtype != torch.bool \
                or key_padding_mask.dim() != 2 or key_padding_mask.shape[1] != S \
                or (batch is not None and key_padding_mask.shape[0] not in (1, batch)):
            raise ValueError(f"key_padding_mask must be a bool tensor [B{'' if batch is None else '=' + str(batch)}"
                             f" or 1, S={S}] (True = a real key), got "
                             f"{getattr(key_padding_mask, 'dtype', type(key_padding_mask).__name__)} "
                             f"{tuple(getattr(key_padding_mask, 'shape', ()))}")
        pad = key_padding_mask.to(device)[:, None, None, :]                         # [B, 1, 1, S]
        mask = pad if mask is None else mask & pad
    return mask


def reference_attention(q, k, v, causal: bool = False, key_padding_mask=None, scale: float | None = None,
                        return_lse: bool = False):
    """softmax(q k^T * scale + mask) v, with the [B, H, T, S] scores materialized, in fp32.

    q [B, H, T, Dh], k/v [B, K, S, Dh] -> out [B, H, T, Dh] in q's dtype (and, with ``return_lse``, the
    natural log-sum-exp of every row's scaled scores, [B, H, T] fp32)."""
    B, H, K, T, S, Dh = check_qkv(q, k, v)
    G = H // K
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    kr = k.float().repeat_interleave(G, dim=1)          # [B, H, S, Dh]: a copy, fine for a reference
    vr = v.float().repeat_interleave(G, dim=1)
    scores = (q.float() @ kr.transpose(-1, -2)) * scale  # [B, H, T, S], the N x N matrix
    mask = allowed_mask(T, S, causal, key_padding_mask, device=q.device, batch=B)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                 # [B, H, T]; -inf for a row with no key
    p = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])   # rows sum to 1 (or 0)
    out = (p @ vr).to(q.dtype)                            # [B, H, T, Dh]
    return (out, lse) if return_lse else out


def scores_bytes(seq_len: int, heads: int = 1, batch: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes of the materialized [batch, heads, N, N] score matrix (and as much again for P = softmax)."""
    return batch * heads * seq_len * seq_len * bytes_per_element


__all__ = ["check_qkv", "allowed_mask", "reference_attention", "scores_bytes"]
