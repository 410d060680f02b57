"""A cache that holds a prompt fixed, to run and time the same decode step again and again.

    cache = FixedPrefixCache.from_prompt(model, prompt_ids)    # [B, T] prompt, run once
    model(next_ids, cache=cache)                               # [B, 1]: one decode step after the prompt
    model(next_ids, cache=cache)                               # the very same step again

Module 01 times a decode step with it (``course_lib.device_bench.decode_step_call``) and counts its FLOPs.
"""
from __future__ import annotations

import torch

from .base import ContiguousCache, KVCache, check_kv, check_same_stream


class FixedPrefixCache(KVCache):
    """A KV cache holding a fixed prompt: ``update`` returns prompt + new K/V *without storing the new
    ones*, so the same decode step (one token after the prompt) can be run and timed again and again.

    The concatenation copies the prompt's K/V each step (a preallocated cache writes one row instead);
    for the course's models at short contexts that copy is small next to the weights.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        if len(keys) != len(values) or not keys:
            raise ValueError(f"keys and values must be per-layer lists of the same non-zero length, got "
                             f"{len(keys)} and {len(values)}")
        self.k, self.v = list(keys), list(values)   # per layer [B, K, S, Dh]

    @classmethod
    @torch.no_grad()
    def from_prompt(cls, model, input_ids: torch.Tensor) -> FixedPrefixCache:
        """Run the prompt [B, T] once through ``model`` and hold its K/V."""
        recorded = ContiguousCache()
        model(input_ids, cache=recorded)
        return cls(recorded.k, recorded.v)

    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        if layer >= len(self.k):
            raise ValueError(f"update: layer {layer}, but the prompt was recorded for {len(self.k)} layers")
        check_same_stream(self.k[layer], k, layer)
        return torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)  # [B, K, S + T, Dh]

    def get_seq_length(self) -> int:
        return self.k[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
