"""Module 05: KV caching, from the plain cache to the memory-saving variants.

    from course_lib.kvcache import ContiguousCache, generate_with_cache
    ids = generate_with_cache(model, prompt_ids, 50, cache=ContiguousCache())

Every cache follows the contract ``update(k, v, layer) -> (k_all, v_all)`` on [B, kv_heads, S, head_dim]
tensors (keys after RoPE) and ``get_seq_length()``, and adds ``stored_length()``, ``nbytes()``,
``attn_mask(T)`` and ``attach(model)`` (see ``base``).

Caches: ContiguousCache (torch.cat), StaticCache (preallocated), SlidingWindowCache, SinkCache
(attention sinks, positions inside the cache), H2OCache (heavy hitters), QuantizedCache (int8/int4),
MultiTierCache (full precision -> int8 -> int4), LatentCache (MLA-style low-rank latent, see fit_latent).
Model conversion: regroup_kv_heads (GQA/MQA). Memory: kv_cache_bytes, MODELS, kv_table.
"""
from .base import ContiguousCache, KVCache, StaticCache, attached
from .generate import StreamScore, generate_with_cache, stream_score
from .gqa import regroup_kv_heads
from .h2o import H2OCache
from .latent import LatentCache, LatentProjection, fit_latent
from .memory import MODELS, ModelKV, format_table, kv_cache_bytes, kv_cache_bytes_for, kv_table
from .quantized import (MultiTierCache, QuantBlock, QuantizedCache, dequantize_minmax, pack_int4,
                        quantize_minmax, unpack_int4)
from .window import SinkCache, SlidingWindowCache, rotate_keys

__all__ = ["KVCache", "ContiguousCache", "StaticCache", "attached", "generate_with_cache", "stream_score",
           "StreamScore", "regroup_kv_heads", "H2OCache", "LatentCache", "LatentProjection", "fit_latent",
           "MODELS", "ModelKV", "format_table", "kv_cache_bytes", "kv_cache_bytes_for", "kv_table",
           "MultiTierCache", "QuantBlock", "QuantizedCache", "quantize_minmax", "dequantize_minmax",
           "pack_int4", "unpack_int4", "SinkCache", "SlidingWindowCache", "rotate_keys"]
