"""Model quality on held-out text: perplexity (per token) and bits per byte (tokenizer-independent)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LMScore:
    nll_nats: float      # summed next-token loss
    tokens: int          # tokens predicted
    bytes: int           # UTF-8 bytes of the scored texts

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_nats / max(self.tokens, 1))

    @property
    def bits_per_byte(self) -> float:
        return self.nll_nats / math.log(2) / max(self.bytes, 1)


def _logits(model, ids):
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def _context(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "max_position_embeddings", 512))


@torch.no_grad()
def score_texts(model, tokenizer, texts: list[str], max_len: int | None = None,
                progress: bool = True) -> LMScore:
    """Sum the next-token loss over each text, preceded by the EOS token, in windows of `max_len`.

    Every token of every text is predicted exactly once; a window's first token is only context.
    Works with the course model and with Hugging Face causal LMs.
    """
    if isinstance(texts, str):
        texts = [texts]
    if not texts or not any(t for t in texts):
        raise ValueError("texts must be a non-empty list of non-empty strings")
    W = max_len or _context(model)
    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    nll, ntok, nbytes = 0.0, 0, 0
    it = texts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(texts, desc="scoring", unit="text")
    for text in it:
        if not text:
            continue
        ids = [eos] + tokenizer(text, add_special_tokens=False)["input_ids"]
        for s in range(0, len(ids) - 1, W):
            chunk = torch.tensor(ids[s:s + W + 1], device=device)[None]
            logits = _logits(model, chunk[:, :-1]).float()
            nll += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            ntok += chunk.shape[1] - 1
        nbytes += len(text.encode("utf-8"))
    return LMScore(nll, ntok, nbytes)


def bits_per_byte(model, tokenizer, texts, max_len=None, progress=True) -> float:
    return score_texts(model, tokenizer, texts, max_len, progress).bits_per_byte


def perplexity(model, tokenizer, texts, max_len=None, progress=True) -> float:
    return score_texts(model, tokenizer, texts, max_len, progress).perplexity
