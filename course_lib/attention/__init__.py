"""Attention: the one causal, grouped-query attention the course model and its caches call.

    from course_lib.attention import attention
    out = attention(q, k, v)            # q [B, H, T, Dh], k/v [B, K, S, Dh] -> [B, H, T, Dh]

Module 07 (FlashAttention) grows this package: reference, online softmax, tiled, Triton, flash-decoding.
"""
from .sdpa import attention, causal_mask

__all__ = ["attention", "causal_mask"]
