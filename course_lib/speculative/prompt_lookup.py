"""Prompt-lookup (n-gram) drafting: speculative decoding with no draft model at all.

When the output copies the input (editing code, answering from a document, rewriting a function), the
next tokens are often already in the text. The "draft" is a search: take the last n tokens, find an
earlier place where the same n tokens occur, and propose the g tokens that followed there (n from
`max_ngram` down to 1; the most recent match wins). The target verifies greedily, exactly as in
``speculative_generate`` at temperature 0, so the output equals the target's greedy output; only the
number of target forwards changes. The draft costs a search, c ~ 0, so every accepted token is nearly
free, but a is high only on input-grounded text.
"""
from __future__ import annotations

import time

import torch

from course_lib.env import sync
from course_lib.generation import SpecStats, _check_int, _model_device
from course_lib.kvcache import ContiguousCache
from course_lib.models.corpus import load_split

from .loop import check_prompt, kept_length

__all__ = ["propose_ngram", "prompt_lookup_generate", "editing_prompts"]


def propose_ngram(tokens: torch.Tensor, draft_length: int, max_ngram: int = 3) -> torch.Tensor:
    """Up to `draft_length` tokens that followed the most recent earlier occurrence of the text's last n
    tokens, trying n = max_ngram, ..., 1. tokens: [L] int64. Returns [k], 0 <= k <= draft_length
    (empty when no n-gram of the suffix occurs earlier)."""
    draft_length = _check_int(draft_length, "draft_length", 1)
    max_ngram = _check_int(max_ngram, "max_ngram", 1)
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


@torch.inference_mode()
def prompt_lookup_generate(target, input_ids, max_new_tokens: int, draft_length: int = 8,
                           max_ngram: int = 3, eos_token_id: int | None = None
                           ) -> tuple[torch.Tensor, SpecStats]:
    """Greedy decoding of `target` with n-gram proposals; returns (ids [1, T + N], SpecStats).

    The output equals the target's greedy decoding. Target KV cache invariant as in
    ``speculative_generate``: len(ids) - 1 tokens after every pass (the last token is pending).
    SpecStats.draft_seconds is the time spent searching.
    """
    prompt = check_prompt(input_ids)
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 0)
    g_max = _check_int(draft_length, "draft_length", 1)
    max_ngram = _check_int(max_ngram, "max_ngram", 1)
    T = prompt.numel()
    ctx = target.config.max_position_embeddings
    if T + max_new_tokens > ctx:
        raise ValueError(f"prompt of {T} tokens + max_new_tokens={max_new_tokens} is past the target's "
                         f"context of {ctx} tokens")
    device = _model_device(target)
    seq = torch.empty(T + max_new_tokens, dtype=torch.long, device=device)
    seq[:T] = prompt.to(device)
    n, stats, cache = T, SpecStats(), ContiguousCache()
    start = time.perf_counter()
    if T > 1:
        target(seq[None, :T - 1], cache=cache)                     # prefill all but the pending token
    stats.target_seconds += time.perf_counter() - start
    while n < T + max_new_tokens:
        g = min(g_max, T + max_new_tokens - n - 1)
        t0 = time.perf_counter()
        proposals = propose_ngram(seq[:n], g, max_ngram) if g > 0 else seq[:0]   # [k], k <= g
        k = proposals.shape[0]
        seq[n:n + k] = proposals.clone()
        t1 = time.perf_counter()
        logits = target(seq[None, n - 1:n + k], cache=cache)[0]     # [k + 1, V]
        best = logits.argmax(-1)                                    # the target's greedy choices
        num_ok = int((best[:k] == seq[n:n + k]).cumprod(0).sum())   # leading matches
        seq[n + num_ok] = best[num_ok]                              # corrected or bonus token
        sync(device)
        stats.draft_seconds += t1 - t0
        stats.target_seconds += time.perf_counter() - t1
        stats.record(num_ok, k)
        n += kept_length(seq, n, num_ok + 1, eos_token_id)
        cache.crop(n - 1)
        if eos_token_id is not None and int(seq[n - 1]) == eos_token_id:
            break
    stats.emitted = n - T
    stats.total_seconds = time.perf_counter() - start
    return seq[None, :n].clone(), stats


def editing_prompts(tokenizer, num: int = 4, min_tokens: int = 60, max_tokens: int = 160,
                    max_files: int = 40) -> list[tuple[torch.Tensor, int]]:
    """Input-grounded prompts from held-out stdlib functions, where copying pays off.

    Each prompt is a function's source, two blank lines, then the function's first line again: a
    model that has learned to continue code tends to repeat the body, which n-gram lookup can propose.
    Returns a list of (prompt ids [T], body length in tokens) for `num` functions of min_tokens..max_tokens
    tokens, taken in a fixed order from the held-out split (never seen in training).
    """
    num = _check_int(num, "num", 1)
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
