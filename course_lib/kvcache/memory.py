"""How much memory a KV cache takes: the formula, and the formula applied to real models.

    bytes = 2 (K and V) x layers x kv_heads x head_dim x bytes_per_element x tokens x batch

Multi-head attention (MHA) has kv_heads = heads, grouped-query attention (GQA) fewer, multi-query
attention (MQA) one. Multi-head latent attention (MLA, DeepSeek-V2/V3) caches one latent vector plus
one small shared RoPE key per token and layer instead of K and V per head, so its per-token size is
layers x (latent_dim + rope_dim) x bytes_per_element, with no factor 2.
"""
from __future__ import annotations

from dataclasses import dataclass


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                   bytes_per_element: float = 2) -> int:
    """Bytes of a full KV cache: 2 x layers x kv_heads x head_dim x bytes x tokens x batch."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name, value in (("tokens", tokens), ("batch", batch)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if bytes_per_element <= 0:
        raise ValueError(f"bytes_per_element must be positive (2 for fp16/bf16, 1 for int8, 0.5 for int4), "
                         f"got {bytes_per_element!r}")
    return int(2 * num_layers * num_kv_heads * head_dim * bytes_per_element * tokens * batch)


def kv_cache_bytes_for(config, tokens: int, batch: int = 1, bytes_per_element: float = 2) -> int:
    """The formula for a course ``LlamaConfig`` (or anything with the same field names)."""
    return kv_cache_bytes(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, tokens,
                          batch, bytes_per_element)


@dataclass(frozen=True)
class ModelKV:
    """The numbers of a published model that decide its KV cache size (from its config.json)."""
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    params_b: float              # parameters in billions (for comparing with the weights' size)
    latent_dim: int | None = None  # MLA: kv_lora_rank
    rope_dim: int | None = None    # MLA: qk_rope_head_dim (the decoupled RoPE key, shared by all heads)

    @property
    def attention(self) -> str:
        if self.latent_dim is not None:
            return "MLA"
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    def bytes_per_token(self, bytes_per_element: float = 2) -> int:
        if self.latent_dim is not None:
            return int(self.layers * (self.latent_dim + self.rope_dim) * bytes_per_element)
        return kv_cache_bytes(self.layers, self.kv_heads, self.head_dim, 1, 1, bytes_per_element)

    def cache_bytes(self, tokens: int, batch: int = 1, bytes_per_element: float = 2) -> int:
        return self.bytes_per_token(bytes_per_element) * tokens * batch


# Values from each model's config.json on the Hugging Face hub.
MODELS = {
    "llama-2-7b": ModelKV("Llama-2-7B", 32, 32, 32, 128, 4096, 6.74),
    "llama-2-70b": ModelKV("Llama-2-70B", 80, 64, 8, 128, 4096, 69.0),
    "llama-3-8b": ModelKV("Llama-3-8B", 32, 32, 8, 128, 8192, 8.03),
    "llama-3.1-8b": ModelKV("Llama-3.1-8B", 32, 32, 8, 128, 131072, 8.03),
    "mistral-7b": ModelKV("Mistral-7B-v0.1", 32, 32, 8, 128, 32768, 7.24),
    "falcon-7b": ModelKV("Falcon-7B", 32, 71, 1, 64, 2048, 7.22),
    "deepseek-v2": ModelKV("DeepSeek-V2", 60, 128, 128, 128, 131072, 236.0, latent_dim=512, rope_dim=64),
}


def kv_table(models=None, tokens: int | None = None, batch: int = 1, bytes_per_element: float = 2) -> list[dict]:
    """One row per model: per-token bytes and the cache for `tokens` (default: each model's context)."""
    rows = []
    for key in models or MODELS:
        m = MODELS[key] if isinstance(key, str) else key
        n = tokens or m.context
        cache = m.cache_bytes(n, batch, bytes_per_element)
        weights = m.params_b * 1e9 * bytes_per_element
        rows.append({"model": m.name, "attention": m.attention, "layers": m.layers, "heads": m.heads,
                     "kv_heads": m.kv_heads, "head_dim": m.head_dim, "tokens": n, "batch": batch,
                     "KiB/token": m.bytes_per_token(bytes_per_element) / 2**10,
                     "cache GiB": cache / 2**30, "weights GiB": weights / 2**30,
                     "cache/weights": cache / weights})
    return rows


def format_table(rows: list[dict], floatfmt: str = ".3g") -> str:
    """A plain-text table of dict rows (same keys), for printing in notebooks."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [[f"{r[k]:{floatfmt}}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))  # noqa: E731
    return "\n".join([line(keys), line(["-" * w for w in widths]), *map(line, cells)])
