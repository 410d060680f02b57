"""A Llama-style decoder written from scratch, in one file.

The parameter names are the Hugging Face ``LlamaForCausalLM`` names, so a checkpoint saved by either side
loads in the other without renaming. Shapes use these letters:

    B batch, T new tokens in this call, S all tokens attended to (cache + new), D hidden size,
    H query heads, K key/value heads (H % K == 0), Dh head dim, V vocabulary, F MLP hidden size.

``forward(input_ids, cache=None, positions=None)``: with a cache (a ``course_lib.kvcache.KVCache``, the
Module 05 contract) only the new tokens are computed; without one the whole sequence is. Each layer hands
the cache its rotated q, k, v (``cache.attend(q, k, v, layer, attn_mask)``: store k, v, attend q over all
held, by default through ``update(k, v, layer, q=q)``), and the cache may place the new tokens itself
(``cache.positions``): with a ``StaticCache``, ``model(token, cache=static_cache)`` is the decode step that
``torch.compile`` captures whole. An object with only ``update(k, v, layer)`` and ``get_seq_length()`` (a
Hugging Face-style cache, notebook 05's first cache) works too: ``_as_cache`` decides, in one place.

RoPE lives in ``course_lib.attention.rope``; ``rope_cos_sin``, ``rotate_half`` and ``apply_rope`` are
re-exported here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.attention import attention
from course_lib.attention.rope import apply_rope, rope_cos_sin, rotate_half
from course_lib.models.config import LlamaConfig, flops_per_token



def save_safetensors(state: dict, file: str | Path) -> Path:
    """Write `state` to a safetensors file readable by everyone the umask allows. safetensors creates
    its files 0600 whatever the umask, and the grading sandbox's kernel (an unprivileged user) must read
    the bundled models: a retrained model would otherwise fail every lab that loads it."""
    from safetensors.torch import save_file
    file = Path(file)
    save_file(state, str(file), metadata={"format": "pt"})
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(file, 0o666 & ~mask)
    return file

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


class _UpdateOnlyCache:
    """An object with only ``update(k, v, layer)`` and ``get_seq_length()`` (Hugging Face's cache shape,
    notebook 05's first cache) seen as a ``KVCache``: attend = update, then attention. It gets no queries
    and places no tokens (the model continues after ``get_seq_length()``)."""

    def __init__(self, cache):
        self.cache = cache

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()

    def positions(self, num_new: int):
        return None

    def attend(self, q, k, v, layer, attn_mask=None):
        k_all, v_all = self.cache.update(k, v, layer)                     # [B, K, S, Dh]
        return attention(q, k_all, v_all, attn_mask)                      # [B, H, T, Dh]


def _as_cache(cache):
    """The one place that decides what ``forward`` takes as a cache: None; a ``course_lib.kvcache.KVCache``
    (recognized by its ``attend`` and ``positions``: this layer cannot import kvcache, which builds on it);
    or an object with only ``update`` and ``get_seq_length``, wrapped in ``_UpdateOnlyCache``."""
    if cache is None or (callable(getattr(cache, "attend", None)) and callable(getattr(cache, "positions", None))):
        return cache
    if callable(getattr(cache, "update", None)) and callable(getattr(cache, "get_seq_length", None)):
        return _UpdateOnlyCache(cache)
    raise TypeError(f"cache must be None, a course_lib.kvcache.KVCache, or an object with update(k, v, layer) "
                    f"and get_seq_length(); got {type(cache).__name__}")


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
        else:
            # The cache stores k, v and attends q over everything it holds (by default update(k, v,
            # layer, q=q) then attention; a paged cache reads its blocks, a static cache masks its
            # unwritten slots). A cache that scores keys by attention (H2O) reads q in update.
            out = cache.attend(q, k, v, self.layer_idx, attn_mask)       # [B, H, T, Dh]
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

        cache: None, a ``course_lib.kvcache.KVCache``, or an object with only ``update(k, v, layer)`` and
        ``get_seq_length()`` (see ``_as_cache``); anything else is a TypeError.
        positions: [B, T] or [T] absolute positions (default: ``cache.positions(T)`` unless that is None,
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
        cache = _as_cache(cache)
        ctx = self.config.max_position_embeddings
        if positions is not None:                                         # the caller's: one host check
            if int(positions.max()) >= ctx:
                raise ValueError(f"position {int(positions.max())} is past the model's context of {ctx} tokens")
        elif cache is not None and (placed := cache.positions(T)) is not None:
            # The cache knows where its next tokens go (StaticCache: a tensor on the device, so the decode
            # step needs no host sync and compiles once); it keeps them inside its own max_len.
            positions = placed.to(input_ids.device)
        else:
            start = cache.get_seq_length() if cache is not None else 0
            if start + T > ctx:
                raise ValueError(f"position {start + T - 1} is past the model's context of {ctx} tokens")
            positions = torch.arange(start, start + T, device=input_ids.device)
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
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_safetensors(state, path / "model.safetensors")
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


__all__ = ["LlamaConfig", "LlamaForCausalLM", "RMSNorm", "rope_cos_sin", "rotate_half", "apply_rope",
           "causal_lm_loss", "flops_per_token"]
