"""The one description of a model's shape: ``LlamaConfig``, the published architectures the course
tabulates (``PRESETS``), and ``as_config`` that turns a name, a model or a config.json into one.

This module imports nothing from the rest of ``course_lib``: the model (``models.llama``), the performance
models (``perf``) and the KV-cache tables (``kvcache.memory``) all read their sizes, parameter count,
KV-cache bytes and FLOPs per token from here.

    from course_lib.models.config import as_config, preset
    cfg = preset("llama-3-8b")                  # GQA: 32 query heads, 8 KV heads
    cfg.num_parameters(), cfg.kv_bytes_per_token(2), flops_per_token(cfg, context=1024)
    decode_reads(cfg, context=1024)             # numbers one decode step reads (a memory-bound step's cost)
    as_config("tiny")                           # the bundled model's config.json
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from course_lib.validate import integer, number


@dataclass
class LlamaConfig:
    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int | None = None  # defaults to hidden_size // num_attention_heads
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 0
    eos_token_id: int | None = 0
    # A label for tables and plots ('Llama-2-7B'); not part of the shape (equal configs compare equal
    # whatever their names) and not written to config.json.
    name: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"LlamaConfig: num_attention_heads={self.num_attention_heads} must divide "
                    f"hidden_size={self.hidden_size} (or give head_dim explicitly)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        # An explicit head_dim need not be hidden_size / heads (q_proj is D -> H*Dh, as in HF); RoPE
        # rotates two halves, so it must be even.
        if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be a positive even integer, got {self.head_dim!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"LlamaConfig: num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}")
        if not isinstance(self.name, str):
            raise TypeError(f"LlamaConfig.name must be a str, got {type(self.name).__name__}")

    # --- Hugging Face config.json round trip -------------------------------------------------------
    @classmethod
    def from_hf(cls, d: dict) -> "LlamaConfig":
        """Build from a Hugging Face ``config.json`` dict.

        Every key is checked against the tables below: a key the model implements is read, a key that
        cannot change the logits is ignored, a key with a required value must have it, and anything else
        raises ValueError (a config the model does not implement is refused, never silently ignored:
        ignoring e.g. llama3 rope scaling or a sliding window loads fine and computes wrong logits)."""
        mt = d.get("model_type", "llama")
        if mt not in _HF_MODEL_TYPES:
            why = _HF_MODEL_TYPES_REFUSED.get(mt, "it is not a Llama-family model")
            raise ValueError(f"config.json: model_type {mt!r} is not supported: {why} "
                             f"(supported: {', '.join(_HF_MODEL_TYPES)})")
        if mt == "mistral" and "sliding_window" not in d:
            # transformers' MistralConfig defaults sliding_window to 4096, so a missing key is a window.
            raise ValueError("config.json: model_type 'mistral' without a sliding_window key means a "
                             "4096-token sliding window in transformers; the course model supports only "
                             "full causal attention (sliding_window: null)")
        names = {f.name for f in fields(cls)} - {"name"}
        for key, value in d.items():
            if key in names or key in _HF_IGNORED or key in _HF_ROPE_KEYS or key.startswith("_") \
                    or key == "model_type":
                continue
            if key == "layer_types" and isinstance(value, list) and all(t == "full_attention" for t in value):
                continue
            if key in _HF_REQUIRED:
                allowed, what = _HF_REQUIRED[key]
                if value not in allowed:  # == as transformers reads it: attention_bias 0 is False
                    raise ValueError(f"config.json: {key}={value!r} is not supported by the course model, which "
                                     f"implements {what} only ({key} in {list(allowed)})")
                continue
            raise ValueError(
                f"config.json: unknown key {key!r} (= {value!r}). The course model refuses a key it does not "
                f"know rather than ignore it, since it may change the math. It reads {sorted(names)} and "
                f"{list(_HF_ROPE_KEYS)}, requires {sorted(_HF_REQUIRED)} at fixed values, and ignores "
                f"metadata (keys starting with '_', and course_lib.models.config._HF_IGNORED)")
        rope_theta = d.get("rope_theta")
        for key in _HF_ROPE_KEYS:
            theta = _rope_dict_theta(key, d.get(key))
            if theta is not None and rope_theta is not None and float(theta) != float(rope_theta):
                raise ValueError(f"config.json: {key}.rope_theta={theta!r} contradicts rope_theta={rope_theta!r}")
            rope_theta = rope_theta if rope_theta is not None else theta
        missing = [k for k in _HF_REQUIRED_KEYS if d.get(k) is None]
        if missing:
            raise ValueError(f"config.json: missing {missing} (the course model needs the shapes stated)")
        # A missing key means transformers' default, not this dataclass's (which are the bundled model's).
        kw = {**_HF_DEFAULTS, **{k: v for k, v in d.items() if k in names and k != "rope_theta"}}
        if kw.get("num_key_value_heads") is None:  # absent or null: plain multi-head attention (as HF)
            kw["num_key_value_heads"] = d["num_attention_heads"]
        eos = kw.get("eos_token_id")
        if isinstance(eos, list):
            kw["eos_token_id"] = eos[0]
        return cls(rope_theta=float(10000.0 if rope_theta is None else rope_theta),
                   name=str(d.get("_name_or_path") or ""), **kw)

    def to_hf(self) -> dict:
        d = asdict(self)
        d.pop("name")
        d.update(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
                 attention_bias=False, mlp_bias=False, attention_dropout=0.0, initializer_range=0.02,
                 pretraining_tp=1, rope_scaling=None, use_cache=True, torch_dtype="float32")
        return d

    # --- what the shape implies: parameters, KV-cache bytes, FLOPs ------------------------------------
    def num_parameters(self) -> int:
        """Parameters of the model this config builds (tied embeddings counted once)."""
        D, F_, V, Dh = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        H, K = self.num_attention_heads, self.num_key_value_heads
        attn = D * H * Dh * 2 + D * K * Dh * 2      # q, o: D x H*Dh; k, v: D x K*Dh
        layer = attn + 3 * D * F_ + 2 * D            # SwiGLU gate, up, down; two RMSNorm weights
        emb = V * D * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + emb + D

    @property
    def attention_kind(self) -> str:
        """'MHA' (one KV head per query head), 'GQA' (fewer) or 'MQA' (one)."""
        if self.num_key_value_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_key_value_heads == 1 else "GQA"

    def kv_cache_bytes(self, tokens: int, batch: int = 1, bytes_per_element: float = 2) -> int:
        """Bytes of the K and V cache of every layer for `batch` sequences of `tokens` tokens."""
        return kv_cache_bytes(self.num_hidden_layers, self.num_key_value_heads, self.head_dim, tokens, batch,
                              bytes_per_element)

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> int:
        return self.kv_cache_bytes(1, 1, bytes_per_element)


# --- what LlamaConfig.from_hf accepts from a Hugging Face config.json --------------------------------
# model types whose math, at the values checked below, is exactly this file's.
_HF_MODEL_TYPES = ("llama", "mistral")
_HF_MODEL_TYPES_REFUSED = {
    "qwen2": "its q/k/v projections always carry biases (not a config key), which the course model lacks",
    "qwen3": "it normalizes q and k per head (q_norm, k_norm), which the course model lacks",
}
# Keys that cannot change the logits of a loaded checkpoint: bookkeeping, initialization (pad_token_id
# only zeroes an embedding row at init), dtype (the caller picks it), cache use, and generation defaults
# (they act after the logits).
_HF_IGNORED = frozenset({
    "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache", "initializer_range",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "is_llama_config", "tokenizer_class",
    "output_hidden_states", "output_attentions", "return_dict", "use_return_dict", "torchscript",
    "id2label", "label2id", "problem_type", "finetuning_task", "task_specific_params", "prefix",
    "chunk_size_feed_forward", "tie_encoder_decoder", "is_decoder",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
})
# Keys a config.json must state, and transformers' defaults (Llama and Mistral alike) for keys it may omit.
_HF_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings")
_HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False}
# transformers 4 spells RoPE variants rope_scaling, transformers 5 rope_parameters (with rope_theta inside);
# both must describe plain RoPE (_rope_dict_theta).
_HF_ROPE_KEYS = ("rope_scaling", "rope_parameters")
# Keys the model implements at one value only: key -> (accepted values, what the model implements).
_HF_REQUIRED = {
    "hidden_act": (("silu", "swish"), "a SwiGLU MLP, silu(gate) * up ('swish' is the same function)"),
    "attention_bias": ((False,), "q/k/v/o projections without bias"),
    "mlp_bias": ((False,), "gate/up/down projections without bias"),
    "sliding_window": ((None,), "full causal attention (no sliding window)"),
    "use_sliding_window": ((False,), "full causal attention (no sliding window)"),
    "layer_types": ((None,), "full attention in every layer (a list of 'full_attention' is accepted too)"),
    "attention_dropout": ((0.0,), "attention without dropout (training would differ)"),
    "pretraining_tp": ((1,), "unsliced projections"),
    "rope_interleaved": ((False,), "RoPE on two halves (rotate_half), not on interleaved pairs"),
    "partial_rotary_factor": ((1.0,), "RoPE over the whole head"),
    "quantization_config": ((None,), "unquantized weights"),
    "pruned_heads": (({},), "all heads (none pruned)"),
    "is_encoder_decoder": ((False,), "a decoder-only model"),
    "add_cross_attention": ((False,), "no cross attention"),
}


def _rope_dict_theta(key: str, rope: dict | None):
    """The rope_theta inside ``rope_scaling``/``rope_parameters`` (or None) once the dict is checked to
    describe plain RoPE: rope_type 'default' and nothing that changes the frequencies."""
    if rope is None or rope == {}:
        return None
    if not isinstance(rope, dict):
        raise ValueError(f"config.json: {key}={rope!r} is not a dict")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"config.json: {key}.rope_type={rope_type!r} is not supported by the course model "
                         f"(it changes the RoPE frequencies); supported: rope_type 'default' (plain RoPE "
                         f"with rope_theta)")
    for k, v in rope.items():
        ok = k in ("rope_type", "type", "rope_theta") or (k == "partial_rotary_factor" and v == 1.0)
        if not ok:
            raise ValueError(f"config.json: {key}.{k}={v!r} is not supported by the course model; supported: "
                             f"{key} with only rope_type 'default' and rope_theta")
    return rope.get("rope_theta")


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                   bytes_per_element: float = 2) -> int:
    """Bytes of a full KV cache: 2 (K and V) x layers x kv_heads x head_dim x bytes x tokens x batch."""
    num_layers, num_kv_heads = integer(num_layers, "num_layers", low=1), integer(num_kv_heads, "num_kv_heads", low=1)
    head_dim = integer(head_dim, "head_dim", low=1)
    tokens, batch = integer(tokens, "tokens", low=0), integer(batch, "batch", low=0)
    # 2 for fp16/bf16, 1 for int8, 0.5 for int4
    bytes_per_element = number(bytes_per_element, "bytes_per_element", 0, low_open=True)
    return int(2 * num_layers * num_kv_heads * head_dim * bytes_per_element * tokens * batch)


def decode_reads(cfg: LlamaConfig, context: int = 0) -> int:
    """Numbers one decode step of one sequence reads from memory: the cost of a memory-bound step, in units of
    one weight (every weight and cached number the same size).

    A step reads in full every matrix it multiplies by and every norm vector: per layer q, o (D x H*Dh), k, v
    (D x K*Dh), gate, up, down (D x F) and two norms (D); the final norm (D) and the LM head (V x D), which
    is the embedding matrix itself when tied and is read in full either way. Of an untied input embedding
    it reads only the new token's row (D numbers: left out, as the new token's own key and value are), so an
    untied model reads V x D numbers fewer than `num_parameters` counts. With `context` tokens cached it
    also reads their keys and values: 2 x layers x K x Dh per token (only the K heads of GQA).

    Module 01's refined table says the same op by op (``perf.intensity.intensity_table``: the embedding
    reads rows, the LM head a whole matmul); Module 04's lab takes a draft's cost per token, `c` of
    Module 08's speed-up model, as the draft's reads over the target's.
    """
    if not isinstance(cfg, LlamaConfig):
        raise TypeError(f"cfg must be a LlamaConfig, got {type(cfg).__name__}")
    context = integer(context, "context", low=0)
    D, F_, V, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    H, K, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    layer = 2 * D * H * Dh + 2 * D * K * Dh + 3 * D * F_ + 2 * D   # q, o; k, v; gate, up, down; two norms
    return L * layer + D + V * D + 2 * L * K * Dh * context         # + final norm, LM head, cached K and V


def flops_per_token(cfg: LlamaConfig, context: int = 0) -> int:
    """Forward FLOPs (2 per multiply-add) for one token: the matmuls plus attention over `context` keys."""
    D, Dh, H, K = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = 2 * (D * H * Dh * 2 + D * K * Dh * 2 + 3 * D * cfg.intermediate_size)
    per_layer += 2 * 2 * H * Dh * context  # QK^T and PV
    return cfg.num_hidden_layers * per_layer + 2 * D * cfg.vocab_size


# --- published architectures ----------------------------------------------------------------------------
# From each checkpoint's config.json on the Hugging Face hub (context = max_position_embeddings). Only the
# shape is described: Llama-3.1's llama3 RoPE scaling and Mistral's 4096-token sliding window change no
# size or count here, but from_hf would refuse them for the course model.
def _llama(name, D, F_, layers, heads, kv_heads, vocab, context, rope_theta=10000.0, tie=False, bos=1, eos=2,
           eps=1e-5):
    return LlamaConfig(vocab_size=vocab, hidden_size=D, intermediate_size=F_, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=context,
                       rms_norm_eps=eps, rope_theta=rope_theta, tie_word_embeddings=tie, bos_token_id=bos,
                       eos_token_id=eos, name=name)


PRESETS: dict[str, LlamaConfig] = {
    "llama-2-7b": _llama("Llama-2-7B", 4096, 11008, 32, 32, 32, 32000, 4096),                     # MHA
    "llama-2-13b": _llama("Llama-2-13B", 5120, 13824, 40, 40, 40, 32000, 4096),
    "llama-2-70b": _llama("Llama-2-70B", 8192, 28672, 80, 64, 8, 32000, 4096),                    # GQA
    "llama-3-8b": _llama("Llama-3-8B", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0, bos=128000, eos=128001),
    "llama-3.1-8b": _llama("Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, bos=128000,
                           eos=128001),
    "mistral-7b": _llama("Mistral-7B-v0.1", 4096, 14336, 32, 32, 8, 32000, 32768),
    # Falcon-7B is not a Llama (parallel attention, a 2-matrix GELU MLP of 4D = 18176): its attention and
    # KV-cache shapes are exact (MQA: one KV head of 64), its MLP is the SwiGLU width with the same
    # parameters (3F = 2 x 18176, F = 12117), and its embeddings count twice as the hub's 7.22B does
    # (the checkpoint stores lm_head apart).
    "falcon-7b": _llama("Falcon-7B", 4544, 12117, 32, 71, 1, 65024, 2048, bos=11, eos=11),
    "smollm2-135m": _llama("SmolLM2-135M", 576, 1536, 30, 9, 3, 49152, 8192, 100000.0, tie=True, bos=0, eos=0),
    "smollm2-360m": _llama("SmolLM2-360M", 960, 2560, 32, 15, 5, 49152, 8192, 100000.0, tie=True, bos=0, eos=0),
    "smollm2-1.7b": _llama("SmolLM2-1.7B", 2048, 8192, 24, 32, 32, 49152, 8192, 130000.0, tie=True, bos=0,
                           eos=0),
}

# The bundled models (their config.json, read without loading any weights).
BUNDLED_ROOT = Path(__file__).parent / "bundled"
BUNDLED = {"tiny": "tiny", "tiny-draft": "tiny-draft", "tiny-draft-scratch": "tiny-draft-scratch"}


def preset_names() -> list[str]:
    """Every name as_config accepts: the bundled models, then the published architectures."""
    return [*BUNDLED, *PRESETS]


def preset(name: str) -> LlamaConfig:
    """A published architecture ('llama-2-7b', ...) or a bundled model's config ('tiny'), case-insensitive."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    if key in BUNDLED:
        cfg = LlamaConfig.from_hf(json.loads((BUNDLED_ROOT / BUNDLED[key] / "config.json").read_text()))
        cfg.name = key
        return cfg
    raise ValueError(f"name={name!r} is not a known architecture; known: {preset_names()}")


def as_config(model) -> LlamaConfig:
    """The LlamaConfig of `model`: a LlamaConfig (returned as is), a name (see preset), a model with a
    ``.config`` (the course model; its ``.name`` labels the copy returned), a Hugging Face config object
    (``to_dict()``) or a config.json dict. A config the course model does not implement raises ValueError
    (LlamaConfig.from_hf says why)."""
    if isinstance(model, LlamaConfig):
        return model
    if isinstance(model, str):
        return preset(model)
    if isinstance(model, dict):
        return LlamaConfig.from_hf(model)
    cfg = getattr(model, "config", None)
    if cfg is not None and not isinstance(model, type):
        cfg = as_config(cfg)
        name = getattr(model, "name", None)
        if isinstance(name, str) and name and not cfg.name:
            cfg = replace(cfg, name=name)
        return cfg
    if callable(getattr(model, "to_dict", None)) and hasattr(model, "hidden_size"):
        return LlamaConfig.from_hf(model.to_dict())
    raise TypeError(f"model must be a LlamaConfig, a name ({', '.join(preset_names())}), a model with a "
                    f".config, a Hugging Face config or a config.json dict; got {type(model).__name__}")


__all__ = ["LlamaConfig", "PRESETS", "BUNDLED", "BUNDLED_ROOT", "preset", "preset_names", "as_config",
           "kv_cache_bytes", "flops_per_token"]
