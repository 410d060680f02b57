"""A Llama-style decoder written from scratch, in one file.

The parameter names are the Hugging Face ``LlamaForCausalLM`` names, so a checkpoint saved by either side
loads in the other without renaming. Shapes use these letters:

    B batch, T new tokens in this call, S all tokens attended to (cache + new), D hidden size,
    H query heads, K key/value heads (H % K == 0), Dh head dim, V vocabulary, F MLP hidden size.

``forward(input_ids, cache=None, positions=None)``: with a cache (anything with
``update(k, v, layer) -> (k_all, v_all)`` on ``[B, K, S, Dh]`` tensors, the Module 05 contract) only the
new tokens are computed; without one the whole sequence is. A ``KVCache`` also attends itself
(``cache.attend``) and may place the new tokens itself (``cache.positions``): with a ``StaticCache``,
``model(token, cache=static_cache)`` is the decode step that ``torch.compile`` captures whole.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.attention import attention


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
        names = {f.name for f in fields(cls)}
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
                f"metadata (keys starting with '_', and course_lib.models.llama._HF_IGNORED)")
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
        return cls(rope_theta=float(10000.0 if rope_theta is None else rope_theta), **kw)

    def to_hf(self) -> dict:
        d = asdict(self)
        d.update(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
                 attention_bias=False, mlp_bias=False, attention_dropout=0.0, initializer_range=0.02,
                 pretraining_tp=1, rope_scaling=None, use_cache=True, torch_dtype="float32")
        return d

    def num_parameters(self) -> int:
        D, F_, V, Dh = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        H, K = self.num_attention_heads, self.num_key_value_heads
        attn = D * H * Dh * 2 + D * K * Dh * 2
        layer = attn + 3 * D * F_ + 2 * D
        emb = V * D * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + emb + D


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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))  # None: the default device
        self.eps = eps

    def forward(self, x):  # [..., D]
        # Normalize in fp32 (as HF does) so fp16/bf16 runs do not overflow in the mean of squares.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype=torch.float32):
    """cos, sin of shape [B, T, Dh] for integer positions [B, T] (HF's non-interleaved layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))  # [Dh/2]
    angles = positions.float()[..., None] * inv_freq  # [B, T, Dh/2]
    emb = torch.cat([angles, angles], dim=-1)  # [B, T, Dh]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):  # x [B, heads, T, Dh], cos/sin [B, T, Dh]
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        D, H, K, Dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(D, H * Dh, bias=False)
        self.k_proj = nn.Linear(D, K * Dh, bias=False)
        self.v_proj = nn.Linear(D, K * Dh, bias=False)
        self.o_proj = nn.Linear(H * Dh, D, bias=False)

    def forward(self, x, cos, sin, cache=None, attn_mask=None):
        B, T, _ = x.shape
        H, K, Dh = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        q = self.q_proj(x).view(B, T, H, Dh).transpose(1, 2)  # [B, H, T, Dh]
        k = self.k_proj(x).view(B, T, K, Dh).transpose(1, 2)  # [B, K, T, Dh]
        v = self.v_proj(x).view(B, T, K, Dh).transpose(1, 2)  # [B, K, T, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            out = attention(q, k, v, attn_mask)                           # [B, H, T, Dh]
        elif hasattr(cache, "attend"):
            # A KVCache stores k, v and attends over everything it holds (a paged cache reads its
            # blocks through the block table; a static cache masks its unwritten slots).
            out = cache.attend(q, k, v, self.layer_idx, attn_mask)
        else:                                                             # any object with update()
            k, v = cache.update(k, v, self.layer_idx)                     # [B, K, S, Dh]
            out = attention(q, k, v, attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):  # [B, T, D] -> [B, T, F] -> [B, T, D]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None, attn_mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """The ``model.`` prefix of HF's checkpoint: embeddings, layers, final norm."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def device(self):
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.model.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, cache=None, positions: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = False):
        """Logits [B, T, V] for input_ids [B, T].

        positions: [B, T] or [T] absolute positions (default: ``cache.positions(T)`` when the cache has it,
        else continue after ``cache.get_seq_length()``, else 0..T-1).
        attn_mask: optional boolean [T, S] or [B, 1, T, S] (True = attend) overriding the causal mask,
        e.g. a tree mask for speculative verification.
        return_hidden: also return the final hidden states [B, T, D] (after the last norm).
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int32):
            raise TypeError("input_ids must be an integer torch.Tensor of shape [batch, seq]")
        if input_ids.device != self.device:
            raise ValueError(f"input_ids are on {input_ids.device} but the model is on {self.device}: "
                             f"move them with input_ids.to(model.device)")
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must have shape [batch, seq] with seq >= 1, got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        ctx = self.config.max_position_embeddings
        if positions is None and hasattr(cache, "positions"):
            # The cache knows where its next tokens go (StaticCache: a tensor on the device, so the decode
            # step needs no host sync and compiles once); it keeps them inside its own max_len.
            positions = cache.positions(T).to(input_ids.device)
        elif positions is None:
            start = cache.get_seq_length() if cache is not None else 0
            if start + T > ctx:
                raise ValueError(f"position {start + T - 1} is past the model's context of {ctx} tokens")
            positions = torch.arange(start, start + T, device=input_ids.device)
        elif int(positions.max()) >= ctx:                                 # caller's positions: one host check
            raise ValueError(f"position {int(positions.max())} is past the model's context of {ctx} tokens")
        if positions.dim() == 1:
            positions = positions[None].expand(B, T)
        x = self.model.embed_tokens(input_ids)  # [B, T, D]
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, attn_mask)
        h = self.model.norm(x)
        logits = self.lm_head(h)  # [B, T, V]
        return (logits, h) if return_hidden else logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights counted once

    # --- saving and loading in the Hugging Face layout ---------------------------------------------
    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.float32):
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        cfg = self.config.to_hf()
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> "LlamaForCausalLM":
        """Load a local Hugging Face Llama-family folder (config.json + *.safetensors)."""
        from safetensors.torch import load_file
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model folder)")
        cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no *.safetensors weights")
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        with torch.device("meta"):
            model = cls(cfg)
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
        unexpected = [u for u in unexpected if "rotary_emb" not in u]
        if missing or unexpected:
            raise ValueError(f"{path}: weights do not match the config: missing={missing[:5]} "
                             f"unexpected={unexpected[:5]}")
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        return model.to(device=device, dtype=dtype).eval()


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in nats; logits [B, T, V] predict targets [B, T]."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def flops_per_token(cfg: LlamaConfig, context: int = 0) -> int:
    """Forward FLOPs (2 per multiply-add) for one token: the matmuls plus attention over `context` keys."""
    D, Dh, H, K = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = 2 * (D * H * Dh * 2 + D * K * Dh * 2 + 3 * D * cfg.intermediate_size)
    per_layer += 2 * 2 * H * Dh * context  # QK^T and PV
    return cfg.num_hidden_layers * per_layer + 2 * D * cfg.vocab_size


__all__ = ["LlamaConfig", "LlamaForCausalLM", "RMSNorm", "rope_cos_sin", "apply_rope",
           "causal_lm_loss", "flops_per_token"]
