"""A streaming quality harness: the next-token loss of a text fed through a cache chunk by chunk.

Generating through a cache is ``course_lib.generation.generate(model, ids, n, cache=...)``, the one loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .base import KVCache


def _forward(model, ids, cache):
    # an update-only cache (no KVCache) has no mask of its own: the model applies the causal rule
    mask = cache.attn_mask(ids.shape[1], device=ids.device) if isinstance(cache, KVCache) else None
    return model(ids, cache=cache, attn_mask=mask)


@dataclass
class StreamScore:
    """Next-token loss of a sequence fed through a cache, and the cache's memory along the way."""
    nll_nats: float
    tokens: int
    peak_nbytes: int
    final_nbytes: int
    final_stored: int
    nll_per_token: list = field(default_factory=list, repr=False)

    @property
    def mean_nll(self) -> float:
        return self.nll_nats / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll)

    def bits_per_byte(self, num_bytes: int) -> float:
        return self.nll_nats / math.log(2) / num_bytes


@torch.no_grad()
def stream_score(model, ids: torch.Tensor, cache, prefill: int = 1, chunk: int = 1, progress: bool = False):
    """Feed `ids` [T] (or [1, T]) through the model with `cache`: `prefill` tokens first, then `chunk` at
    a time, and sum the loss of predicting each next token. This is how the cache behaves while
    generating (every prediction sees only what the cache kept), unlike scoring the text in one forward.
    """
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"ids must be one sequence of at least 2 tokens, got shape {tuple(ids.shape)}")
    if prefill < 1 or chunk < 1:
        raise ValueError(f"prefill and chunk must be >= 1, got prefill={prefill}, chunk={chunk}")
    ids = ids.to(model.device)
    n = ids.shape[1]
    bounds = [0, min(prefill, n - 1)]
    while bounds[-1] < n - 1:
        bounds.append(min(bounds[-1] + chunk, n - 1))
    it = range(len(bounds) - 1)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=type(cache).__name__, leave=False)
    nll, peak, per_tok = 0.0, 0, []
    for i in it:
        a, b = bounds[i], bounds[i + 1]
        logits = _forward(model, ids[:, a:b], cache).float()          # predicts ids[a+1 : b+1]
        loss = F.cross_entropy(logits[0], ids[0, a + 1:b + 1], reduction="none")
        per_tok.extend(loss.tolist())
        nll += float(loss.sum())
        peak = max(peak, cache.nbytes())
    return StreamScore(nll, n - 1, peak, cache.nbytes(), cache.stored_length(0), per_tok)
