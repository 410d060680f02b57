"""Heavy-hitter oracle (H2O) eviction: keep the tokens that have received the most attention so far.

H2O (Zhang et al., 2023) keeps ``heavy`` "heavy hitters" (largest attention accumulated over all
queries seen so far) plus the ``recent`` most recent tokens, per layer and per KV head, and evicts the
rest. Between forwards the cache holds exactly ``heavy + recent`` tokens per head (fewer at the start).

It needs the attention weights. The model hands every cache the new tokens' rotated queries
(``update(k, v, layer, q=q)``, q [B, H, T, Dh]); this one forms softmax(q k^T / sqrt(Dh)) with the
causal rule over what it holds plus the new keys, and adds the weight each key receives (summed over the
query heads of its group and over the new queries) to that key's score. That doubles the attention
work - fine for teaching; a real implementation takes the weights from the attention kernel.

Keys keep their absolute positions (no repositioning), so the model's context still bounds the length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import KVCache, check_kv, check_same_stream


@dataclass
class _H2OState:
    k: torch.Tensor      # [B, K, n, Dh] rotated keys (absolute positions)
    v: torch.Tensor      # [B, K, n, Dh]
    score: torch.Tensor  # [B, K, n] float32 accumulated attention
    seen: int = 0


class H2OCache(KVCache):
    """Keep the `heavy` most-attended older tokens and the `recent` newest, per layer and KV head."""

    def __init__(self, heavy: int, recent: int):
        for name, value in (("heavy", heavy), ("recent", recent)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if heavy + recent < 1:
            raise ValueError("heavy + recent must be at least 1")
        self.heavy, self.recent = heavy, recent
        self.layers: list[_H2OState] = []

    @property
    def budget(self) -> int:
        return self.heavy + self.recent

    def get_seq_length(self) -> int:
        return self.layers[0].seen if self.layers else 0

    def stored_length(self, layer: int = 0) -> int:
        return self.layers[layer].k.shape[2] if layer < len(self.layers) else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for st in self.layers for t in (st.k, st.v))

    def update(self, k, v, layer, q=None):
        """Store k, v [B, K, T, Dh], score every held key by the attention of q [B, H, T, Dh] (rotated),
        evict down to the budget; returns the keys and values attended to this step [B, K, S, Dh]."""
        check_kv(k, v, layer)
        if q is None:
            raise ValueError("H2OCache.update needs q, the new tokens' rotated queries [batch, heads, T, "
                             "head_dim]: it scores keys by their attention (the model passes q)")
        if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] \
                or q.shape[1] % k.shape[1]:
            raise ValueError(f"q must be [batch, heads, T, head_dim] with heads a multiple of k's kv_heads, "
                             f"matching k {tuple(k.shape)}; got {tuple(q.shape) if torch.is_tensor(q) else q!r}")
        if layer == len(self.layers):
            B, K, _, Dh = k.shape
            self.layers.append(_H2OState(k[:, :, :0], v[:, :, :0],
                                         torch.zeros(B, K, 0, dtype=torch.float32, device=k.device)))
        elif layer > len(self.layers):
            raise ValueError(f"update: layers must be filled in order; got layer {layer}")
        st = self.layers[layer]
        check_same_stream(st.k, k, layer)
        B, K, T, Dh = k.shape
        G = q.shape[1] // K                                                 # query heads per KV head
        k_all = torch.cat([st.k, k], dim=2)                                 # [B, K, S, Dh]
        v_all = torch.cat([st.v, v], dim=2)
        S = k_all.shape[2]
        # The attention weights this step: query heads grouped by the KV head they share.
        qg = q.float().reshape(B, K, G, T, Dh)                              # head h reads KV head h // G
        logits = torch.einsum("bkgtd,bksd->bkgts", qg, k_all.float()) / math.sqrt(Dh)
        i = torch.arange(T, device=k.device)[:, None] + (S - T)
        j = torch.arange(S, device=k.device)[None, :]
        w = logits.masked_fill(~(j <= i), float("-inf")).softmax(-1)       # [B, K, G, T, S]
        score = torch.cat([st.score, st.score.new_zeros(B, K, T)], dim=2) + w.sum(dim=(2, 3))
        if S > self.budget:
            old = S - self.recent                                           # eviction candidates [0, old)
            top = score[:, :, :old].topk(self.heavy, dim=-1).indices.sort(dim=-1).values  # [B, K, heavy]
            rec = torch.arange(old, S, device=k.device).expand(B, K, self.recent)
            idx = torch.cat([top, rec], dim=-1)                              # [B, K, budget], in order
            gi = idx[..., None].expand(-1, -1, -1, Dh)
            st.k, st.v, st.score = k_all.gather(2, gi), v_all.gather(2, gi), score.gather(2, idx)
        else:
            st.k, st.v, st.score = k_all, v_all, score
        st.seen += T
        return k_all, v_all

    def reset(self):
        self.layers = []
