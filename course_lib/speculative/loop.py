"""Speculative decoding for a target/draft pair of course models: ``speculative_generate``.

Notation: p = target probabilities, q = draft probabilities, g = draft length, a = acceptance rate.

One pass:
    1. the draft proposes g tokens, one cached forward each (cheap model, g sequential steps);
    2. the target scores the pending token and the g proposals in ONE cached forward (g+1 positions),
       which gives p at every proposal and one position more;
    3. ``accept_step`` keeps a prefix of the proposals and adds one token of its own (corrected or bonus),
       so every pass emits between 1 and g+1 tokens, distributed exactly as the target would sample them;
    4. both KV caches are cropped back to the tokens that were kept.

The pass runs inside the one generate loop, ``course_lib.generation.generate(target, ids, n,
draft=draft, draft_length=g)`` (its ``Speculation`` documents the KV-cache invariant the tests check
after every pass); ``speculative_generate`` is that call returning the whole sequence and its
``SpecStats``. The loop lives below this package so that it can import nothing from here (see
``course_lib.generation``).

Scope: batch size 1, course models (``course_lib.models``) with a ``ContiguousCache``; for Hugging Face
models use ``course_lib.speculative.hf.hf_assisted_generate`` (transformers' own assisted generation).
"""
from __future__ import annotations

from typing import Callable

import torch

from course_lib.generation import SpecStats, model_device, prompt_tensor, check_pair, generate
from course_lib.validate import integer

__all__ = ["SpecStats", "speculative_generate", "check_pair", "check_tokenizers", "check_prompt"]


# --------------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------------
def check_prompt(input_ids) -> torch.Tensor:
    """A prompt as an int64 tensor [T]: accepts a list of ints, a tensor [T] or [1, T] (batch size 1)."""
    return prompt_tensor(input_ids, "speculative decoding here runs batch size 1",
                          "each row would accept a different number of tokens")


def check_tokenizers(tok_a, tok_b):
    """Raise ValueError unless two tokenizers map the same strings to the same ids (same vocabulary)."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va != vb:
        only_a = sorted(set(va) - set(vb))[:3]
        only_b = sorted(set(vb) - set(va))[:3]
        moved = [t for t in va if t in vb and va[t] != vb[t]][:3]
        raise ValueError(f"the tokenizers differ ({len(va)} vs {len(vb)} entries; only in the first: "
                         f"{only_a}, only in the second: {only_b}, different ids: {moved}); "
                         "draft and target must share the vocabulary")


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------
def speculative_generate(target, draft, input_ids, max_new_tokens: int, draft_length: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None, adaptive: float | None = None,
                         eos_token_id: int | None = None,
                         on_pass: Callable | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Generate up to `max_new_tokens` tokens from `target`, with `draft` proposing `draft_length` at a time.

    Returns (ids [1, T + N] including the prompt, on the target's device; SpecStats). It is
    ``generate(target, input_ids, max_new_tokens, ..., draft=draft, draft_length=draft_length)``.

    temperature 0 is greedy: the output equals the target's own greedy decoding, token for token.
    temperature > 0 (with top_k / top_p applied to p and q alike) samples, and the output is distributed
    exactly as sampling from the target alone; a seeded `generator` (on the models' device) makes it
    reproducible. `adaptive`: None, or a confidence threshold in (0, 1): a pass stops proposing after a
    token whose draft probability max_x q(x) is below it (at temperature 0: the max of softmax(logits)).
    `eos_token_id`: stop after that token (included). `on_pass(ids, target_cache, draft_cache)`: called
    after every pass with the sequence so far [1, n] (for tests and visualizations).
    """
    check_pair(target, draft)
    prompt = check_prompt(input_ids)
    if eos_token_id is not None:
        eos_token_id = integer(eos_token_id, "eos_token_id", low=0)
    out = generate(target, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   generator=generator, eos_token_id=eos_token_id, draft=draft, draft_length=draft_length,
                   adaptive=adaptive, on_pass=on_pass)
    device = model_device(target)
    return torch.cat([prompt.to(device), out.tokens.to(device)])[None], out.stats
