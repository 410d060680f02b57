"""Attention: the one causal, grouped-query attention the course model and its caches call, and Module 07
(FlashAttention).

    from course_lib.attention import attention
    out = attention(q, k, v)            # q [B, H, T, Dh], k/v [B, K, S, Dh] -> [B, H, T, Dh]

RoPE, which rotates q and k before attention, is here too (``rope``): ``rope_cos_sin``, ``apply_rope``,
``rotate_half``, used by the model and by the caches that move keys (``course_lib.kvcache.rotate_keys``).

Module 07: ``reference_attention`` (scores materialized; causal, padding, GQA), ``online_softmax`` and
its statistics, ``tiled_attention`` (FlashAttention's forward in PyTorch, with an ``IOCounter``) and
``tiled_attention_backward`` (its backward, recomputing the probabilities from the log-sum-exp), the IO
model (``io_model``), flash-decoding in PyTorch (``flash_decode_torch``) and the log-sum-exp merge
``combine_splits``, SDPA backends, flash-attn and where the Triton kernels run (``backends``). The Triton
kernels import triton, an optional package, so they live in their own modules: ``triton_flash`` (forward,
flash-decoding), ``triton_flash_backward`` (the backward and an autograd function) and ``triton_splitkv``
(the split reduction, shared with ``course_lib.paged``).
"""
from .backends import (flash_attn_status, flash_backend_reason, hf_attn_implementation, sdpa_backend_report,
                       sdpa_default_backend, triton_status)
from .backward import tiled_attention_backward
from .flash_decoding import flash_decode_torch, split_partials
from .io_model import (LOOP_ORDERS, count_io, flash_attention_io, flash_io_theta, io_reduction, io_reduction_limit,
                       sram_tiles, standard_attention_io)
from .online_softmax import (combine_splits, merge_softmax_stats, online_softmax, online_softmax_stats,
                             softmax_stats_update)
from .reference import reference_attention, scores_bytes
from .rope import apply_rope, rope_cos_sin, rotate_half
from .sdpa import attention, causal_mask
from .tiled import IOCounter, tiled_attention

__all__ = ["attention", "causal_mask", "rope_cos_sin", "apply_rope", "rotate_half",
           "reference_attention", "scores_bytes", "online_softmax", "online_softmax_stats", "softmax_stats_update",
           "merge_softmax_stats", "combine_splits", "tiled_attention", "tiled_attention_backward", "IOCounter",
           "standard_attention_io",
           "flash_attention_io", "flash_io_theta", "io_reduction", "io_reduction_limit", "sram_tiles", "count_io",
           "LOOP_ORDERS",
           "flash_decode_torch", "split_partials", "sdpa_backend_report", "sdpa_default_backend",
           "flash_backend_reason", "flash_attn_status", "triton_status", "hf_attn_implementation"]
