"""Model quality on held-out text: perplexity (per token) and bits per byte (tokenizer-independent); and
the repetition of generated text: ``repeated_ngram_share`` (how much of a continuation repeats itself, the
measure of greedy decoding's loops in notebook 00 and on the model card) and ``distinct_ngrams``."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course_lib.validate import integer


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


# --------------------------------------------------------------------------------------------------
# Repetition of generated text (on token ids)
# --------------------------------------------------------------------------------------------------
def _token_list(tokens) -> list[int]:
    """Token ids as a list of ints, from a list/tuple of ints or a 1-D integer tensor."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be a 1-D integer tensor or a list of token ids, got a {tokens.dim()}-D "
                             f"tensor of {tokens.dtype}")
        return tokens.tolist()
    if isinstance(tokens, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                 for t in tokens):
        return [int(t) for t in tokens]
    raise ValueError(f"tokens must be a list of int token ids or a 1-D integer tensor, got {type(tokens).__name__}")


def _ngrams(tokens, n: int) -> list[tuple[int, ...]]:
    n = integer(n, "n", low=1)
    ids = _token_list(tokens)
    return [tuple(ids[k:k + n]) for k in range(len(ids) - n + 1)]


def repeated_ngram_share(tokens, n: int = 4) -> float:
    """Share of the n-token windows of `tokens` that already occurred earlier in it: 0 for text that never
    repeats itself, near 1 for a loop ("f, f, f, ..." or the same line over and over). A text shorter than
    n tokens has no window and scores 0. The measure of greedy decoding's loops (notebook 00, the model card).
    """
    seen, repeats = set(), 0
    grams = _ngrams(tokens, n)
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / max(1, len(grams))


def distinct_ngrams(tokens, n: int = 1) -> float:
    """Distinct n-grams / n-grams of `tokens` (distinct-n): 1 when no window repeats, small for a loop over
    few tokens. Over one text, distinct-n = 1 - repeated_ngram_share(tokens, n) whenever it has a window (each
    repeat is a window whose n-gram is not new); distinct-1 is the share of distinct tokens. A text shorter
    than n tokens scores 1 (nothing repeats)."""
    grams = _ngrams(tokens, n)
    return len(set(grams)) / len(grams) if grams else 1.0
