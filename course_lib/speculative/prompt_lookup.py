"""Prompt-lookup (n-gram) drafting: speculative decoding with no draft model at all.

When the output copies the input (editing code, answering from a document, rewriting a function), the
next tokens are often already in the text. The "draft" is a search: take the last n tokens, find an
earlier place where the same n tokens occur, and propose the g tokens that followed there (n from
`max_ngram` down to 1; the most recent match wins). ``PromptLookupDraft`` is that search as a draft for
the one generate loop, which verifies greedily, exactly as ``speculative_generate`` at temperature 0, so
the output equals the target's greedy output; only the number of target forwards changes. The draft
costs a search, c ~ 0, so every accepted token is nearly free, but a is high only on input-grounded text.
"""
from __future__ import annotations

import torch

from course_lib.generation import SpecStats, model_device, generate
from course_lib.models.corpus import load_split
from course_lib.validate import integer

from .loop import check_prompt

__all__ = ["propose_ngram", "PromptLookupDraft", "prompt_lookup_generate", "editing_prompts"]


def propose_ngram(tokens: torch.Tensor, draft_length: int, max_ngram: int = 3) -> torch.Tensor:
    """Up to `draft_length` tokens that followed the most recent earlier occurrence of the text's last n
    tokens, trying n = max_ngram, ..., 1. tokens: [L] int64. Returns [k], 0 <= k <= draft_length
    (empty when no n-gram of the suffix occurs earlier)."""
    draft_length = integer(draft_length, "draft_length", low=1)
    max_ngram = integer(max_ngram, "max_ngram", low=1)
    L = tokens.shape[0]
    for n in range(min(max_ngram, L - 1), 0, -1):
        suffix = tokens[L - n:]                                    # [n]
        windows = tokens[:L - 1].unfold(0, n, 1)                   # [L - n, n]: every earlier n-gram
        # (windows start at 0..L-n-1, so the suffix itself, starting at L-n, is excluded)
        hits = (windows == suffix).all(-1).nonzero()               # starts of matching n-grams
        if len(hits):
            start = int(hits[-1]) + n                              # what followed the latest match
            return tokens[start:start + draft_length]
    return tokens[:0]


class PromptLookupDraft:
    """Prompt lookup as a draft for the one generate loop: ``generate(target, ids, n,
    draft=PromptLookupDraft(max_ngram), draft_length=g)``. Each pass proposes ``propose_ngram`` of the
    sequence so far (at most the pass's budget, possibly nothing); ``generate`` verifies greedily."""

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = integer(max_ngram, "max_ngram", low=1)

    def propose(self, seq: torch.Tensor, budget: int, hidden=None) -> torch.Tensor:
        """seq: [n] the tokens so far; returns [k], k <= budget (the search reads no hidden state)."""
        return propose_ngram(seq, budget, self.max_ngram) if budget > 0 else seq[:0]


def prompt_lookup_generate(target, input_ids, max_new_tokens: int, draft_length: int = 8,
                           max_ngram: int = 3, eos_token_id: int | None = None
                           ) -> tuple[torch.Tensor, SpecStats]:
    """Greedy decoding of `target` with n-gram proposals; returns (ids [1, T + N], SpecStats).

    It is ``generate(target, input_ids, max_new_tokens, draft=PromptLookupDraft(max_ngram),
    draft_length=draft_length)`` returning the prompt too: the output equals the target's greedy
    decoding, the context rule and the KV-cache invariant are generate's. SpecStats.draft_seconds is the
    time spent searching.
    """
    prompt = check_prompt(input_ids)
    if eos_token_id is not None:
        eos_token_id = integer(eos_token_id, "eos_token_id", low=0)
    out = generate(target, prompt, max_new_tokens, eos_token_id=eos_token_id, draft=PromptLookupDraft(max_ngram),
                   draft_length=draft_length)
    device = model_device(target)
    return torch.cat([prompt.to(device), out.tokens.to(device)])[None], out.stats


def editing_prompts(tokenizer, num: int = 4, min_tokens: int = 60, max_tokens: int = 160,
                    max_files: int = 40) -> list[tuple[torch.Tensor, int]]:
    """Input-grounded prompts from held-out stdlib functions, where copying pays off.

    Each prompt is a function's source, two blank lines, then the function's first line again: a
    model that has learned to continue code tends to repeat the body, which n-gram lookup can propose.
    Returns a list of (prompt ids [T], body length in tokens) for `num` functions of min_tokens..max_tokens
    tokens, taken in a fixed order from the held-out split (never seen in training).
    """
    num = integer(num, "num", low=1)
    out = []
    for text in load_split("heldout", max_files=max_files):
        for block in text.split("\n\n\n"):
            block = block.strip("\n")
            if not block.startswith("def ") or "\n" not in block or len(block) > 10 * max_tokens:
                continue
            n_tok = len(tokenizer(block)["input_ids"])
            if not min_tokens <= n_tok <= max_tokens:
                continue
            head, body = block.split("\n", 1)
            ids = tokenizer(block + "\n\n\n" + head + "\n")["input_ids"]
            out.append((torch.tensor(ids, dtype=torch.long, device="cpu"),   # host prompts: the loops move them
                        len(tokenizer(body)["input_ids"])))
            if len(out) == num:
                return out
    if not out:
        raise ValueError("no held-out function of the requested size was found (raise max_files)")
    return out
