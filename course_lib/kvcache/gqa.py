"""Grouped-query and multi-query attention: fewer KV heads, a proportionally smaller cache.

MHA has one K/V head per query head, GQA one per group of query heads, MQA one for all. The cache holds
only the KV heads, so its size scales with ``num_key_value_heads``.

``regroup_kv_heads(model, n)`` converts a trained model after the fact:
* to fewer KV heads by **mean-pooling** the K and V projection weights of each group of heads merged
  (the GQA paper's "uptraining" starts from exactly this, then trains a little; we only pool, so the
  quality cost measured in the notebook is an upper bound of what uptraining would leave);
* to more KV heads by **repeating** them, which changes nothing: an MHA model whose heads come in equal
  copies computes exactly the GQA model's function, with a bigger cache.
Pooling weights equals pooling the keys themselves: the projection is linear and RoPE rotates every head
by the same angles.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


def _regroup(weight: torch.Tensor, old: int, new: int, head_dim: int) -> torch.Tensor:
    D = weight.shape[1]
    w = weight.view(old, head_dim, D)
    if new < old:
        w = w.view(new, old // new, head_dim, D).mean(dim=1)
    else:
        w = w.repeat_interleave(new // old, dim=0)
    return w.reshape(new * head_dim, D)


@torch.no_grad()
def regroup_kv_heads(model, num_kv_heads: int):
    """A copy of `model` with `num_kv_heads` KV heads (pooled when fewer, repeated when more)."""
    cfg = model.config
    old, H = cfg.num_key_value_heads, cfg.num_attention_heads
    if not isinstance(num_kv_heads, int) or num_kv_heads < 1 or H % num_kv_heads:
        raise ValueError(f"num_kv_heads must divide num_attention_heads={H}, got {num_kv_heads!r}")
    if num_kv_heads < old and old % num_kv_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads} must divide the current {old} KV heads to pool them")
    if num_kv_heads > old and num_kv_heads % old:
        raise ValueError(f"num_kv_heads={num_kv_heads} must be a multiple of the current {old} KV heads")
    new_model = copy.deepcopy(model)
    new_model.config.num_key_value_heads = num_kv_heads   # the layers share this config object
    Dh = cfg.head_dim
    for layer in new_model.model.layers:
        attn = layer.self_attn
        for name in ("k_proj", "v_proj"):
            lin = getattr(attn, name)
            w = _regroup(lin.weight, old, num_kv_heads, Dh)
            new = nn.Linear(lin.in_features, w.shape[0], bias=False, device=w.device, dtype=w.dtype)
            new.weight.copy_(w)
            setattr(attn, name, new)
    return new_model
