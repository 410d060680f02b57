"""Module 05: KV caching, from the plain cache to the memory-saving variants.

    from course_lib.kvcache import ContiguousCache
    from course_lib.generation import generate          # the one generate loop (layer above this one)
    tokens, trace = generate(model, prompt_ids, 50, cache=ContiguousCache())

Every cache is a ``KVCache`` and follows the contract ``update(k, v, layer, q=None) -> (k_all, v_all)``
on [B, kv_heads, S, head_dim] tensors (k, v and the queries q [B, heads, T, head_dim] after RoPE; a cache
reads q only if its policy needs it, as H2O does) and ``get_seq_length()``; the base class gives
``attend(q, k, v, layer, attn_mask)`` (what the model calls), ``positions(T)``, ``attn_mask(T)``,
``stored_length()`` and ``nbytes()`` (see ``base``).

Caches: ContiguousCache (torch.cat), StaticCache (preallocated), FixedPrefixCache (a prompt held fixed, to
time one decode step again and again), SlidingWindowCache, SinkCache
(attention sinks, positions inside the cache), H2OCache (heavy hitters), QuantizedCache (int8/int4),
FP8Cache (E4M3, per-token or per-head scales),
MultiTierCache (full precision -> int8 -> int4), LatentCache (MLA-style low-rank latent, see fit_latent).
Model conversion: regroup_kv_heads (GQA/MQA). Memory: kv_cache_bytes (LlamaConfig.kv_cache_bytes on bare
numbers), kv_table over course_lib.models.config.PRESETS and LATENT_MODELS (MLA).
"""
from .base import ContiguousCache, KVCache, StaticCache
from .fixed import FixedPrefixCache
from .stream import StreamScore, stream_score
from .gqa import regroup_kv_heads
from .h2o import H2OCache
from .latent import LatentCache, LatentProjection, fit_latent
from .memory import KV_TABLE_MODELS, LATENT_MODELS, kv_cache_bytes, kv_table, latent_kv_bytes
from .quantized import (FP8_SCALES, FP8Cache, MultiTierCache, QuantBlock, QuantizedCache, dequantize_minmax, pack_uint4,
                        quantize_minmax, unpack_uint4, fp8_kv_quantize, fp8_kv_dequantize)
from .window import SinkCache, SlidingWindowCache, rotate_keys

__all__ = ["KVCache", "ContiguousCache", "StaticCache", "FixedPrefixCache", "stream_score",
           "StreamScore", "regroup_kv_heads", "H2OCache", "LatentCache", "LatentProjection", "fit_latent",
           "KV_TABLE_MODELS", "LATENT_MODELS", "kv_cache_bytes", "kv_table", "latent_kv_bytes",
           "MultiTierCache", "QuantBlock", "QuantizedCache", "quantize_minmax", "dequantize_minmax",
           "pack_uint4", "unpack_uint4",
           "FP8Cache", "FP8_SCALES", "fp8_kv_quantize", "fp8_kv_dequantize", "SinkCache", "SlidingWindowCache",
           "rotate_keys"]
