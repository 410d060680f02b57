"""Generation with a KV cache (prefill once, then one token per step) and a streaming quality harness."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .base import ContiguousCache, attached


def _forward(model, ids, cache):
    mask = cache.attn_mask(ids.shape[1], device=ids.device) if hasattr(cache, "attn_mask") else None
    return model(ids, cache=cache, attn_mask=mask)


@torch.no_grad()
def generate_with_cache(model, input_ids: torch.Tensor, max_new_tokens: int, cache=None, sample=None,
                        eos_token_id: int | None = None, return_logits: bool = False):
    """Prefill the prompt once, then feed one token per step through the cache.

    input_ids: [B, T] (or [T]) prompt. cache: any cache (default a fresh ``ContiguousCache``).
    sample: function logits [B, V] -> token ids [B] (default greedy argmax).
    eos_token_id: rows that produced it keep producing it; stops early when all rows have.
    Returns ids [B, T + N] (and the logits that chose each new token, [B, N, V], if return_logits).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int32):
        raise TypeError("input_ids must be an integer tensor [batch, seq]")
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, seq] prompt, got shape {tuple(ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    ids = ids.to(model.device)                                 # a host prompt for a model on the GPU
    cache = ContiguousCache() if cache is None else cache
    choose = sample or (lambda logits: logits.argmax(-1))
    out, all_logits = [ids], []
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    with attached(cache, model):
        if max_new_tokens == 0:
            return (ids, ids.new_zeros(ids.shape[0], 0, 0).float()) if return_logits else ids
        logits = _forward(model, ids, cache)[:, -1]            # prefill: the whole prompt at once
        for step in range(max_new_tokens):
            nxt = choose(logits).to(ids.dtype)                 # [B]
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done |= nxt == eos_token_id
            out.append(nxt[:, None])
            all_logits.append(logits)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            logits = _forward(model, nxt[:, None], cache)[:, -1]   # decode: one token
    ids_out = torch.cat(out, dim=1)
    return (ids_out, torch.stack(all_logits, dim=1)) if return_logits else ids_out


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
    with attached(cache, model):
        for i in it:
            a, b = bounds[i], bounds[i + 1]
            logits = _forward(model, ids[:, a:b], cache).float()          # predicts ids[a+1 : b+1]
            loss = F.cross_entropy(logits[0], ids[0, a + 1:b + 1], reduction="none")
            per_tok.extend(loss.tolist())
            nll += float(loss.sum())
            peak = max(peak, cache.nbytes())
    return StreamScore(nll, n - 1, peak, cache.nbytes(), cache.stored_length(0), per_tok)
