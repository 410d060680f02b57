"""Rotary position embeddings (RoPE), Hugging Face's non-interleaved layout: the one copy of the math.

Shapes: B batch, T tokens, Dh head dim (even), heads any number of query or key/value heads.

RoPE rotates each pair of channels (i, i + Dh/2) of a query or key by the angle p * theta^(-2i/Dh) at
position p. Rotations compose by adding angles, so a key rotated at p and then at -p is back where it
started: what a cache that moves keys to new positions (``course_lib.kvcache.rotate_keys``) relies on.

    cos, sin = rope_cos_sin(positions, head_dim, theta, dtype)   # positions [B, T] -> [B, T, Dh] each
    q = apply_rope(q, cos, sin)                                  # q [B, heads, T, Dh]
"""
from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype=torch.float32):
    """cos, sin of shape [B, T, Dh] for integer positions [B, T] (on the positions' device)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))  # [Dh/2]
    angles = positions.float()[..., None] * inv_freq  # [B, T, Dh/2]
    emb = torch.cat([angles, angles], dim=-1)  # [B, T, Dh]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] on the last axis: the 90-degree turn of every channel pair (i, i + Dh/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):  # x [B, heads, T, Dh], cos/sin [B, T, Dh] -> [B, heads, T, Dh]
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


__all__ = ["rope_cos_sin", "rotate_half", "apply_rope"]
