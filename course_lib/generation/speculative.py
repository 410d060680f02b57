"""Speculative decoding inside the loop: the ``Draft`` protocol, a draft model as a draft, one draft-then-verify
pass (``Speculation``)."""
from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import torch

from course_lib.env import sync
from course_lib.kvcache import ContiguousCache, KVCache
from course_lib.sampling import accept_step, probs_or_onehot_unchecked

from .calls import model_device
from .output import SpecStats
from .tree import TokenTree, verify_tree


@runtime_checkable
class Draft(Protocol):
    """What ``generate(..., draft=obj)`` asks of a draft object (a draft *model* is wrapped in ``ModelDraft``).

    Required: ``propose(seq, budget, hidden) -> [k] tokens (k <= budget) to follow seq [n], or a TokenTree
    rooted at seq[-1] of depth <= budget``. Optional, each read only if present:
      * ``needs_hidden``: False (default), True (``hidden`` is the target's final hidden state [D] at the last
        verified token: Medusa's heads) or ``"all"`` ([m, D] at every position verified since the last pass,
        the prompt's after the prefill: EAGLE's and MTP's drafts, which propose chains);
      * ``prefill(prompt_ids [n - 1])``: read the prompt before the first pass (a draft with its own cache);
      * ``verified(n)``: after each pass, seq[:n] was kept (drop what was rejected);
      * ``reset()``: a generate call starts (a draft object may be reused).
    ``check_draft`` holds a draft to this, once, before generation starts.
    """

    def propose(self, seq: torch.Tensor, budget: int, hidden=None):
        ...


def check_draft(model, draft, temperature, adaptive):
    """A draft object against the ``Draft`` protocol: callable ``propose`` (and ``prefill``, ``verified``,
    ``reset`` where present), a known ``needs_hidden``; and what a draft object allows: it proposes without
    probabilities, so it is verified greedily (temperature 0), with no ``adaptive`` threshold."""
    if not callable(getattr(draft, "propose", None)):
        raise TypeError(f"draft.propose must be callable, got {type(getattr(draft, 'propose', None)).__name__}")
    for hook in ("prefill", "verified", "reset"):
        if hasattr(draft, hook) and not callable(getattr(draft, hook)):
            raise TypeError(f"draft.{hook} must be callable when present, got {type(getattr(draft, hook)).__name__}")
    needs = getattr(draft, "needs_hidden", False)
    if needs not in (False, None, True, "all"):
        raise ValueError(f"draft.needs_hidden must be False, True (the last verified position's hidden state) "
                         f"or 'all' (every newly verified position's), got {needs!r}")
    if getattr(getattr(model, "config", None), "vocab_size", None) is None or hasattr(model, "generation_config"):
        raise TypeError("draft=: speculative decoding needs a course model with a .config.vocab_size")
    if temperature != 0:
        raise ValueError(f"temperature={temperature!r}: a draft object ({type(draft).__name__}) gives no "
                         "probabilities, so its proposals are verified greedily; use temperature=0 (or a draft "
                         "model to sample)")
    if adaptive is not None:
        raise ValueError(f"adaptive belongs to a draft model (it reads the draft's confidence); "
                         f"{type(draft).__name__} has none: leave adaptive=None")


class Speculation:
    """Speculative decoding's state and one draft-then-verify pass (Module 08; the theory and the
    acceptance rule are in ``course_lib.speculative``).

    One pass: the draft proposes a chain of up to g tokens, or a tree of depth <= g; the target scores
    the pending token and the proposals in ONE cached forward (a tree: with its attention mask); the pass
    keeps a prefix of the chain (``accept_step``) or the greedy path of the tree (``verify_tree``) and adds
    one token of the target's own (corrected or bonus), so a pass emits 1..g+1 tokens, distributed
    exactly as the target would sample them (at temperature 0: equal to the target's greedy decoding).
    The target's cache is cropped back to the tokens kept and the draft is told (``verified(n)``).

    KV-cache invariant (the tests check it after every pass through ``on_pass``), with seq[:n] kept:
        target cache: exactly n - 1 tokens, the K/V of seq[:n-1]; the last token is "pending": the
            target computes its K/V in the next pass, in the forward that verifies the next proposals.
        a draft model's cache: n - 1 tokens as well, except after a pass where all g proposals passed:
            then n - 2, because the last proposal was never fed to the draft (its job was only to be
            checked). The next pass feeds the draft the 1 or 2 tokens it lacks together with its first step.
    """

    def __init__(self, target, draft, prompt: torch.Tensor, max_new_tokens: int, draft_length: int,
                 sampling: tuple, generator, eos: set, tcache: KVCache, on_pass):
        self.target, self.draft, self.g_max = target, draft, draft_length
        self.sampling, self.generator, self.eos, self.on_pass = sampling, generator, eos, on_pass
        needs = getattr(draft, "needs_hidden", False)        # checked once, by check_draft
        self.wants_hidden, self.all_hidden = needs in (True, "all"), needs == "all"
        # [D] the target's final hidden state where it chose the last token, or (needs_hidden == "all")
        # [m, D] those of the positions verified since the draft's last pass; None before any.
        self.hidden = None
        if callable(getattr(draft, "reset", None)):
            draft.reset()                   # a draft object may be reused: each call starts afresh
        self.device = model_device(target)
        self.end = prompt.numel() + max_new_tokens
        # One buffer for the whole sequence: the proposals go right after the last kept token,
        # verification keeps a prefix (a path) of them and writes its own token after it.
        self.seq = torch.empty(self.end, dtype=torch.long, device=self.device)
        self.seq[:prompt.numel()] = prompt.to(self.device)
        self.n = prompt.numel()                                     # tokens kept so far: seq[:n]
        self.tcache = tcache
        self.stats = SpecStats()

    def prefill(self):
        """The target (and a draft model) read the prompt except its last token, which stays pending."""
        if self.n > 1:
            t0 = time.perf_counter()
            if self.all_hidden:             # the draft reads the prompt's hidden states [n - 1, D]
                self.hidden = self.target(self.seq[None, :self.n - 1], cache=self.tcache, return_hidden=True)[1][0]
            else:
                self.target(self.seq[None, :self.n - 1], cache=self.tcache)
            sync(self.device)
            t1 = time.perf_counter()
            if hasattr(self.draft, "prefill"):
                self.draft.prefill(self.seq[:self.n - 1])
                sync(self.device)
            self.stats.target_seconds += t1 - t0
            self.stats.draft_seconds += time.perf_counter() - t1

    def step(self) -> list[int]:
        """One pass: the new tokens it keeps (1..g+1, cut after an eos)."""
        seq, n, stats = self.seq, self.n, self.stats
        g = min(self.g_max, self.end - n - 1)           # a pass emits at most g + 1 tokens: never waste any

        # 1. Draft: a chain [k] or a tree rooted at the pending token seq[n-1].
        t0 = time.perf_counter()
        proposal = self.draft.propose(seq[:n], g, self.hidden)
        sync(self.device)
        t1 = time.perf_counter()

        # 2. Verify in one target forward, 3. accept: seq[n:n + num_ok + 1] holds the kept tokens.
        if isinstance(proposal, TokenTree):
            num_ok, drafted = self._verify_tree(proposal, g)
        else:
            num_ok, drafted = self._verify_chain(proposal, g)
        sync(self.device)
        stats.draft_seconds += t1 - t0
        stats.target_seconds += time.perf_counter() - t1
        stats.record(num_ok, drafted)

        # Keep seq[:n + num_ok + 1], or up to and including an eos among them.
        new = seq[n:n + num_ok + 1].tolist()
        cut = next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))
        new = new[:cut]
        self.n = n = n + cut

        # 4. Re-sync the caches with seq[:n] (the invariant above).
        self.tcache.crop(n - 1)
        if hasattr(self.draft, "verified"):
            self.draft.verified(n)
        if self.on_pass is not None:
            self.on_pass(seq[None, :n], self.tcache, getattr(self.draft, "cache", None))
        return new

    def _verify_chain(self, proposals: torch.Tensor, g: int) -> tuple[int, int]:
        """Score the pending token and k proposals ([k + 1] positions); keep a prefix, add one token."""
        seq, n = self.seq, self.n
        if not isinstance(proposals, torch.Tensor) or proposals.dim() != 1 or proposals.numel() > g:
            got = tuple(proposals.shape) if isinstance(proposals, torch.Tensor) else type(proposals).__name__
            raise ValueError(f"draft.propose must return a chain of at most {g} tokens [k] or a TokenTree, "
                             f"got {got}")
        k = proposals.numel()
        seq[n:n + k] = proposals                                            # [k]
        out = self.target(seq[None, n - 1:n + k], cache=self.tcache, **({"return_hidden": True}
                                                                        if self.wants_hidden else {}))
        tlogits, hidden = (out[0][0], out[1][0]) if self.wants_hidden else (out[0], None)   # [k + 1, V], [k + 1, D]
        temperature, top_k, top_p = self.sampling
        # At temperature 0, p and q are one-hot and accept_step reduces to this comparison.
        if temperature == 0:
            best = tlogits.argmax(-1)                                       # [k + 1]
            num_ok = int((best[:k] == seq[n:n + k]).cumprod(0).sum())       # leading matches
            seq[n + num_ok] = best[num_ok]                                  # corrected or bonus token
        else:                                                               # a draft model: it kept q
            p = probs_or_onehot_unchecked(tlogits, temperature, top_k, top_p)       # [k + 1, V]
            q = self.draft.q if self.draft.q is not None else p.new_zeros(0, p.shape[-1])   # [k, V]
            res = accept_step(p, q, seq[n:n + k], self.generator)
            num_ok = res.num_accepted
            seq[n + num_ok] = res.tokens[-1]
        if hidden is not None:              # where the target chose the last kept token; "all": every kept one
            self.hidden = hidden[:num_ok + 1] if self.all_hidden else hidden[num_ok]    # [num_ok + 1, D] or [D]
        return num_ok, k

    def _verify_tree(self, tree: TokenTree, g: int) -> tuple[int, int]:
        """Score every node in one forward (``verify_tree``); keep the greedy path, add one token."""
        seq, n = self.seq, self.n
        root = int(seq[n - 1])
        if self.all_hidden:
            raise ValueError(f"{type(self.draft).__name__}: a draft with needs_hidden='all' must propose chains "
                             "[k] (tree verification hands back one hidden state, not the path's)")
        if int(tree.tokens[0]) != root or tree.max_depth > g:
            raise ValueError(f"draft.propose must return a tree rooted at the pending token {root} of depth "
                             f"<= {g}, got root {int(tree.tokens[0])} and depth {tree.max_depth}")
        res = verify_tree(self.target, self.tcache, tree)      # the cache: past + the accepted path
        num_ok = res.num_accepted
        seq[n:n + num_ok + 1] = torch.tensor(res.emitted, dtype=torch.long, device="cpu")
        self.hidden = res.hidden
        return num_ok, tree.size - 1


class ModelDraft:
    """A draft course model: up to g cached steps per pass, sampled with the target's settings (its
    probabilities q kept for the acceptance step); ``adaptive`` ends a pass after an unsure token."""

    def __init__(self, model, sampling: tuple, generator, adaptive: float | None):
        self.model, self.sampling, self.generator, self.adaptive = model, sampling, generator, adaptive
        self.cache = ContiguousCache()
        self.q: torch.Tensor | None = None      # [k, V] the last proposals' probabilities (temperature > 0)

    def prefill(self, ids: torch.Tensor):
        self.model(ids[None], cache=self.cache)

    def propose(self, seq: torch.Tensor, budget: int, hidden=None) -> torch.Tensor:
        temperature, top_k, top_p = self.sampling
        x = seq[self.cache.get_seq_length():]                              # [1] or [2] tokens it lacks
        toks, q_rows = [], []
        for _ in range(budget):
            logits = self.model(x[None], cache=self.cache)[0, -1]         # [V]
            if temperature == 0:
                tok = logits.argmax()
                confidence = torch.softmax(logits, -1).max() if self.adaptive is not None else None
            else:
                q = probs_or_onehot_unchecked(logits, temperature, top_k, top_p)   # [V]
                tok = torch.multinomial(q, 1, generator=self.generator)[0]
                q_rows.append(q)
                confidence = q.max() if self.adaptive is not None else None
            toks.append(tok)
            x = tok.view(1)
            if self.adaptive is not None and float(confidence) < self.adaptive:
                break                                                      # the draft is unsure: verify now
        self.q = torch.stack(q_rows) if q_rows else None
        return torch.stack(toks) if toks else seq[:0]                      # [k]

    def verified(self, n: int):
        """seq[:n] was kept: drop what the cache holds past seq[:n-1] (the rejected proposals)."""
        self.cache.crop(min(self.cache.get_seq_length(), n - 1))
