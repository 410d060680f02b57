"""The draft-then-verify loop: speculative decoding for a target/draft pair of course models.

Notation: p = target probabilities, q = draft probabilities, g = draft length, a = acceptance rate.

One pass:
    1. the draft proposes g tokens, one cached forward each (cheap model, g sequential steps);
    2. the target scores the pending token and the g proposals in ONE cached forward (g+1 positions),
       which gives p at every proposal and one position more;
    3. ``accept_step`` keeps a prefix of the proposals and adds one token of its own (corrected or bonus),
       so every pass emits between 1 and g+1 tokens, distributed exactly as the target would sample them;
    4. both KV caches are cropped back to the tokens that were kept.

KV-cache invariant (checked by the tests after every pass): with ``ids`` the sequence so far,
    target cache: exactly len(ids) - 1 tokens, the K/V of ids[:-1]. The last token is "pending": the
        target computes its K/V in the next pass, in the same forward that verifies the next proposals.
    draft cache: len(ids) - 1 tokens as well, except after a pass where all g proposals passed: then it
        holds len(ids) - 2, because the last proposal was never fed to the draft (its job was only to be
        checked). The next pass feeds the draft the 1 or 2 tokens it lacks together with its first step.
Both caches only ever hold K/V of tokens in ``ids``: rejected proposals are cropped away.

Scope: batch size 1, course models (``course_lib.models``) with a ``ContiguousCache``; for Hugging Face
models use ``course_lib.speculative.hf.hf_assisted_generate`` (transformers' own assisted generation).
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from course_lib.generation import _check_temperature, _check_top_k, _check_top_p, _prompt_tensor
from course_lib.kvcache import ContiguousCache

from .acceptance import accept_step, probs_from_logits

__all__ = ["SpecStats", "speculative_generate", "check_pair", "check_tokenizers", "check_prompt"]


@dataclass
class SpecStats:
    """Counters of one speculative run (a = acceptance rate, g = draft length).

    passes: draft-verify passes (one target forward each, the prefill aside).
    drafted: proposals made; accepted: proposals that passed; emitted: new tokens returned.
    per_pass: accepted proposals in each pass; per_pass_drafted: proposals made in each pass (g, or fewer
        near max_new_tokens or with adaptive drafting).
    rejections: passes that ended on a rejection (the others ended with a bonus token).
    draft_seconds: the draft's forwards and sampling; target_seconds: the target's forwards and the
        acceptance step (both include their prefill); total_seconds: the whole call (the rest is
        bookkeeping).
    """
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    rejections: int = 0
    per_pass: list[int] = field(default_factory=list)
    per_pass_drafted: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    total_seconds: float = 0.0

    def record(self, num_accepted: int, drafted: int) -> None:
        """Count one pass that tested `drafted` proposals and kept the first `num_accepted`."""
        self.passes += 1
        self.drafted += drafted
        self.accepted += num_accepted
        self.rejections += num_accepted < drafted
        self.per_pass.append(num_accepted)
        self.per_pass_drafted.append(drafted)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted: the share of proposals kept (proposals after a rejection count as lost)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def per_token_acceptance(self) -> float:
        """accepted / (accepted + rejections): the estimate of a in the theory's model, where each
        *tested* proposal passes with probability a (proposals after a rejection are never tested).
        This is the a to put into ``expected_tokens_per_pass``."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens a pass produced (accepted + 1), before any cut at max_new_tokens or eos."""
        return (self.accepted + self.passes) / self.passes if self.passes else float("nan")


# --------------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------------
def check_prompt(input_ids) -> torch.Tensor:
    """A prompt as an int64 tensor [T]: accepts a list of ints, a tensor [T] or [1, T] (batch size 1)."""
    return _prompt_tensor(input_ids, "speculative decoding here runs batch size 1",
                          "each row would accept a different number of tokens")


def check_pair(target, draft):
    """Target and draft must speak the same vocabulary: the same token id must mean the same token."""
    vt = getattr(getattr(target, "config", None), "vocab_size", None)
    vd = getattr(getattr(draft, "config", None), "vocab_size", None)
    if vt is None or vd is None:
        raise TypeError("target and draft must be course models with a .config.vocab_size "
                        "(for Hugging Face models use course_lib.speculative.hf.hf_assisted_generate)")
    if vt != vd:
        raise ValueError(f"target and draft vocabularies differ: target vocab_size={vt}, draft "
                         f"vocab_size={vd}; speculative decoding needs one shared tokenizer")


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


def _check_int(x, name, low):
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {x!r}")
    return int(x)


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kept_length(seq: torch.Tensor, n: int, new: int, eos_token_id: int | None) -> int:
    """How many of the `new` tokens seq[n:n+new] to keep: all of them, or up to and including an eos."""
    if eos_token_id is not None:
        hits = (seq[n:n + new] == eos_token_id).nonzero()
        if len(hits):
            return int(hits[0]) + 1
    return new


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------
@torch.inference_mode()
def speculative_generate(target, draft, input_ids, max_new_tokens: int, draft_length: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None, adaptive: float | None = None,
                         eos_token_id: int | None = None,
                         on_pass: Callable | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Generate up to `max_new_tokens` tokens from `target`, with `draft` proposing `draft_length` at a time.

    Returns (ids [1, T + N] including the prompt, SpecStats).

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
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 0)
    g_max = _check_int(draft_length, "draft_length", 1)
    _check_temperature(temperature)
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    if adaptive is not None and (isinstance(adaptive, bool) or not isinstance(adaptive, numbers.Real)
                                 or not 0 < adaptive < 1):
        raise ValueError(f"adaptive must be None or a confidence threshold in (0, 1), got {adaptive!r}")
    if eos_token_id is not None:
        eos_token_id = _check_int(eos_token_id, "eos_token_id", 0)
    T = prompt.numel()
    for name, m in (("target", target), ("draft", draft)):
        ctx = m.config.max_position_embeddings
        if T + max_new_tokens > ctx:
            raise ValueError(f"prompt of {T} tokens + max_new_tokens={max_new_tokens} is past the {name}'s "
                             f"context of {ctx} tokens")
    V = target.config.vocab_size
    if int(prompt.max()) >= V or int(prompt.min()) < 0:
        raise ValueError(f"input_ids must be token ids in [0, {V}), got values up to {int(prompt.max())}")
    device = _model_device(target)
    greedy = temperature == 0

    # One buffer for the whole sequence: the draft writes its proposals right after the last kept token,
    # verification keeps a prefix of them and writes its own token after that prefix.
    seq = torch.empty(T + max_new_tokens, dtype=torch.long, device=device)
    seq[:T] = prompt.to(device)
    n = T                                        # tokens kept so far: seq[:n]
    stats = SpecStats()
    start = time.perf_counter()
    tcache, dcache = ContiguousCache(), ContiguousCache()

    # Prefill: both models read the prompt except its last token, which stays pending (see the invariant).
    if T > 1:
        t0 = time.perf_counter()
        target(seq[None, :T - 1], cache=tcache)
        _sync(device)
        t1 = time.perf_counter()
        draft(seq[None, :T - 1], cache=dcache)
        _sync(device)
        stats.target_seconds += t1 - t0
        stats.draft_seconds += time.perf_counter() - t1

    while n < T + max_new_tokens:
        # Never propose more than can be used: a pass emits at most g + 1 tokens.
        g = min(g_max, T + max_new_tokens - n - 1)

        # 1. Draft: g cached steps. The first step also feeds the tokens the draft's cache lacks
        #    (the pending token, and the last proposal of the previous pass if all passed).
        t0 = time.perf_counter()
        q_rows = []                                               # g x [V]
        x = seq[dcache.get_seq_length():n]                        # [1] or [2] tokens
        drafted = 0
        for i in range(g):
            logits = draft(x[None], cache=dcache)[0, -1]                   # [V]
            if greedy:
                tok = logits.argmax()
                confidence = torch.softmax(logits, -1).max() if adaptive is not None else None
            else:
                q = probs_from_logits(logits, temperature, top_k, top_p)   # [V]
                tok = torch.multinomial(q, 1, generator=generator)[0]
                q_rows.append(q)
                confidence = q.max() if adaptive is not None else None
            seq[n + i] = tok
            x = seq[n + i:n + i + 1]
            drafted += 1
            if adaptive is not None and float(confidence) < adaptive:
                break                                             # the draft is unsure: verify now
        _sync(device)
        t1 = time.perf_counter()

        # 2. Verify: one target forward over the pending token and the proposals, [1 + drafted] positions.
        tlogits = target(seq[None, n - 1:n + drafted], cache=tcache)[0]    # [drafted + 1, V]
        proposals = seq[n:n + drafted]                                      # [drafted]

        # 3. Accept. At temperature 0, p and q are one-hot and accept_step reduces to this comparison.
        if greedy:
            best = tlogits.argmax(-1)                                       # [drafted + 1]
            num_ok = int((best[:drafted] == proposals).cumprod(0).sum())   # leading matches
            seq[n + num_ok] = best[num_ok]                                  # corrected or bonus token
        else:
            p = probs_from_logits(tlogits, temperature, top_k, top_p)      # [drafted + 1, V]
            q = torch.stack(q_rows) if q_rows else p.new_zeros(0, V)
            res = accept_step(p, q, proposals, generator)
            num_ok = res.num_accepted
            seq[n + num_ok] = res.tokens[-1]
        _sync(device)
        t2 = time.perf_counter()
        stats.draft_seconds += t1 - t0
        stats.target_seconds += t2 - t1

        # Book-keeping: keep seq[:n + num_ok + 1], or up to an eos among them.
        stats.record(num_ok, drafted)
        n += kept_length(seq, n, num_ok + 1, eos_token_id)

        # 4. Re-sync the caches with seq[:n] (see the invariant in the module docstring).
        tcache.crop(n - 1)
        dcache.crop(min(dcache.get_seq_length(), n - 1))
        if on_pass is not None:
            on_pass(seq[None, :n], tcache, dcache)
        if eos_token_id is not None and int(seq[n - 1]) == eos_token_id:
            break

    stats.emitted = n - T
    stats.total_seconds = time.perf_counter() - start
    return seq[None, :n].clone(), stats
