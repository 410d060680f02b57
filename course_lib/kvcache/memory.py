"""How much memory a KV cache takes: the formula, and the formula applied to real models.

    bytes = 2 (K and V) x layers x kv_heads x head_dim x bytes_per_element x tokens x batch

The formula is ``LlamaConfig.kv_cache_bytes`` (``course_lib.models.config``; ``kv_cache_bytes`` here is
the same formula on bare numbers), and the published models are its ``PRESETS``. Multi-head attention
(MHA) has kv_heads = heads, grouped-query attention (GQA) fewer, multi-query attention (MQA) one.
Multi-head latent attention (MLA, DeepSeek-V2/V3) is no LlamaConfig: it caches one latent vector plus one
small shared RoPE key per token and layer instead of K and V per head, so its per-token size is
layers x (latent_dim + rope_dim) x bytes_per_element, with no factor 2 (``LATENT_MODELS``).
"""
from __future__ import annotations

from course_lib.models.config import as_config, kv_cache_bytes
from course_lib.validate import integer, optional

# MLA models, from their config.json (kv_lora_rank, qk_rope_head_dim); parameters as published (a
# mixture of experts: all experts counted, about 21B active per token).
LATENT_MODELS = {
    "deepseek-v2": dict(name="DeepSeek-V2", layers=60, heads=128, head_dim=128, latent_dim=512, rope_dim=64,
                        context=131072, parameters=236e9),
}
# The models of the KV-memory table, in its order: MHA, GQA, MQA, then MLA.
KV_TABLE_MODELS = ("llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3.1-8b", "mistral-7b", "falcon-7b",
                   "deepseek-v2")


def latent_kv_bytes(num_layers: int, latent_dim: int, rope_dim: int, tokens: int, batch: int = 1,
                    bytes_per_element: float = 2) -> int:
    """Bytes of an MLA cache: layers x (latent_dim + rope_dim) x bytes x tokens x batch (no K/V factor 2)."""
    kv_cache_bytes(num_layers, 1, latent_dim + rope_dim, tokens, batch, bytes_per_element)  # its checks
    return int(num_layers * (latent_dim + rope_dim) * bytes_per_element * tokens * batch)


def _row(model, tokens, batch, bytes_per_element) -> dict:
    key = model.lower() if isinstance(model, str) else None
    if key in LATENT_MODELS:
        m = LATENT_MODELS[key]
        n = tokens or m["context"]
        per_token = latent_kv_bytes(m["layers"], m["latent_dim"], m["rope_dim"], 1, 1, bytes_per_element)
        return {"model": m["name"], "attention": "MLA", "layers": m["layers"], "heads": m["heads"],
                "kv_heads": m["heads"], "head_dim": m["head_dim"], "tokens": n, "batch": batch,
                "per_token": per_token, "parameters": m["parameters"]}
    cfg = as_config(model)
    n = tokens or cfg.max_position_embeddings
    return {"model": cfg.name or "model", "attention": cfg.attention_kind, "layers": cfg.num_hidden_layers,
            "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "tokens": n, "batch": batch, "per_token": cfg.kv_bytes_per_token(bytes_per_element),
            "parameters": cfg.num_parameters()}


def kv_table(models=None, tokens: int | None = None, batch: int = 1, bytes_per_element: float = 2) -> list[dict]:
    """One row per model: per-token bytes and the cache for `tokens` (default: each model's context).

    models: names (PRESETS, LATENT_MODELS; default KV_TABLE_MODELS) or anything as_config takes.
    MLA rows give the heads' own sizes (kv_heads = heads, head_dim), though the cache holds one latent
    per token and layer. Weights: the parameters (num_parameters(); MLA: as published) x bytes_per_element.
    """
    tokens = optional(integer, tokens, "tokens", low=1)           # None: each model's context
    rows = []
    for model in KV_TABLE_MODELS if models is None else models:
        r = _row(model, tokens, batch, bytes_per_element)
        per_token = r.pop("per_token")
        cache = per_token * r["tokens"] * batch
        weights = r.pop("parameters") * bytes_per_element
        rows.append({**r, "KiB/token": per_token / 2**10, "cache GiB": cache / 2**30,
                     "weights GiB": weights / 2**30, "cache/weights": cache / weights})
    return rows


__all__ = ["kv_cache_bytes", "latent_kv_bytes", "kv_table", "LATENT_MODELS", "KV_TABLE_MODELS"]
