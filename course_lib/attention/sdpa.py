"""Causal grouped-query attention on top of PyTorch's ``scaled_dot_product_attention`` (SDPA).

Shapes: B batch, H query heads, K key/value heads (H = K * G), T queries (the new tokens), S keys (all
tokens attended to), Dh head dim. Query head h reads KV head h // G (the Hugging Face layout).

GQA without copying K/V: the G query heads of a group all read the same keys, so they can be stacked
as G times more query *rows* of one head, q [B, H, T, Dh] -> [B, K, G*T, Dh], and attention runs
against k/v [B, K, S, Dh] as they are. Repeating K/V to H heads (``repeat_interleave``) would copy the
whole cache every step, the cost a KV cache exists to avoid.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# SDPA gained enable_gqa in torch 2.5; older versions get the K/V repeated (a copy), correct but slower.
_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2] if x.isdigit()) >= (2, 5)


def causal_mask(num_new: int, num_keys: int, device=None) -> torch.Tensor:
    """[T, S] boolean (True = may attend): new token t sits at absolute index S - T + t."""
    i = torch.arange(num_new, device=device)[:, None] + (num_keys - num_new)
    j = torch.arange(num_keys, device=device)[None, :]
    return j <= i


def _fold_mask(mask: torch.Tensor, B: int, G: int, T: int, S: int) -> torch.Tensor:
    """A [T, S] or [B or 1, 1, T, S] mask for the folded query rows [B or 1, 1, G*T, S]."""
    if mask.dim() == 2:
        mask = mask[None, None]
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2:] != (T, S):
        raise ValueError(f"attn_mask must be [T={T}, S={S}] or [B, 1, T, S], got {tuple(mask.shape)}")
    return mask[:, :, None].expand(mask.shape[0], 1, G, T, S).reshape(mask.shape[0], 1, G * T, S)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for q [B, H, T, Dh], k/v [B, K, S, Dh] -> [B, H, T, Dh].

    attn_mask None means causal, the T queries being the last T of the S keys' positions (no cache:
    T == S; a cache: S - T keys came before; one new token: it sees every key, no mask at all).
    A boolean attn_mask ([T, S] or [B, 1, T, S], True = may attend) replaces the causal rule.
    """
    B, H, T, Dh = q.shape
    K, S = k.shape[1], k.shape[2]
    if H % K:
        raise ValueError(f"query heads {H} must be a multiple of key/value heads {K}")
    G = H // K
    if attn_mask is None and T == S and T > 1:
        # Plain causal attention over the whole sequence: SDPA's is_causal, no mask tensor to build.
        if G == 1:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        if _SDPA_HAS_GQA:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1),
                                              is_causal=True, scale=scale)
    if attn_mask is None and T > 1:
        attn_mask = causal_mask(T, S, device=q.device)
    if G == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    qg = q.reshape(B, K, G * T, Dh)                                   # a group's heads become rows
    mask = None if attn_mask is None else _fold_mask(attn_mask, B, G, T, S)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)  # [B, K, G*T, Dh]
    # reshape, not view: CUDA's memory-efficient and cuDNN backends return a transposed layout (rows of
    # a head are not contiguous), which view refuses (found on an H100; the CPU's output is contiguous).
    return out.reshape(B, H, T, Dh)
