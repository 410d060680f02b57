"""Attention: the one causal, grouped-query attention the course model and its caches call.

    from course_lib.attention import attention
    out = attention(q, k, v)            # q [B, H, T, Dh], k/v [B, K, S, Dh] -> [B, H, T, Dh]

RoPE, which rotates q and k before attention, is here too (``rope``): ``rope_cos_sin``, ``apply_rope``,
``rotate_half``, used by the model and by the caches that move keys (``course_lib.kvcache.rotate_keys``).

Module 07 (FlashAttention) grows this package: reference, online softmax, tiled, Triton, flash-decoding.
"""
from .rope import apply_rope, rope_cos_sin, rotate_half
from .sdpa import attention, causal_mask

__all__ = ["attention", "causal_mask", "rope_cos_sin", "apply_rope", "rotate_half"]
