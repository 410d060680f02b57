"""The one generate loop: prefill, then decode (recompute, any KV cache, compiled, or speculative).

``generate(model, input_ids, max_new_tokens, ...)`` is the loop: by default every step runs the model on
the whole sequence so far (no KV cache), takes the last position's logits, samples, appends, and records
when each token was ready. ``cache=`` (Module 05) prefills once and feeds one token per step, through
any ``KVCache`` (the cache's ``attn_mask`` is passed on: a sliding window needs a banded prefill mask);
``compile=True`` (Module 12) runs that step compiled through a static cache; ``draft=`` (Module 08) makes
each step a draft-then-verify pass (speculative decoding, exact in distribution). It returns the new
tokens and a ``Trace`` from which ``course_lib.perf.metrics`` computes TTFT, TPOT, tokens/s. The loop
comes first in this file; the speculative pass, tree verification, the model calls and the argument
checks (``_check_generate``) follow it.

Drafts. ``draft=`` takes a draft *model* (a course model with the same vocabulary: it proposes
``draft_length`` tokens, sampled like the target) or a draft *object*: anything with
``propose(seq [n], budget, hidden)`` that returns a chain of tokens [k] (k <= budget) to follow ``seq``,
or a ``TokenTree`` rooted at ``seq[-1]`` of depth <= budget. ``generate`` verifies every proposal itself,
one target forward per pass: a chain causally (``accept_step``, or its greedy form), a tree with the
tree attention mask (``verify_tree``). Prompt lookup (``speculative.prompt_lookup.PromptLookupDraft``) and
Medusa (``speculative.medusa.MedusaDraft``) are such objects; a draft whose ``needs_hidden`` is True
receives the target's final hidden state [D] at the last verified token (Medusa's heads read it); one whose
``needs_hidden`` is ``"all"`` receives [m, D], the hidden states at every position verified since its last
pass (the prompt's after the prefill), and proposes chains (EAGLE's and MTP's drafts keep their own cache
of them); one with ``verified(n)`` learns after each pass that seq[:n] was kept; one with ``reset()`` is
reset when a generate call starts. The context rule is the same for all.

Sampling has one path, ``course_lib.sampling`` (a repetition penalty, then temperature, top-k, top-p, a
``torch.Generator``); its functions are re-exported here: apply_repetition_penalty, apply_temperature,
top_k_filter, top_p_filter, sampling_probs, sample, greedy, sample_rows (each row its own settings); and its
stop rule ``finish_reason`` (the serving engine's too).

Why speculative decoding runs here and not in ``course_lib.speculative``: that package (layer 5) builds
on this one (layer 4: measurement, Medusa, prompt lookup, distillation's teacher), so the loop cannot
import it. What verification needs is at or below this layer: the acceptance rule is a sampling rule
(``course_lib.sampling.accept_step``); the pass (``_Speculation``) and tree verification (``verify_tree``,
the tree mask) are bookkeeping next to the loop they plug into; keeping the accepted path is the cache's own
``compact``.
``course_lib.speculative`` re-exports them and holds the drafts (``speculative_generate``,
``prompt_lookup_generate`` and ``medusa_generate`` are ``generate(..., draft=...)`` returning the full ids).

Shapes: prompt [T] or [B, T] (or a list of B prompts of different lengths, left-padded); logits [B, V] per
step; new tokens [n] (one request) or [B, n]; a tree of N nodes.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from course_lib.env import sync
from course_lib.kvcache import ContiguousCache, KVCache, StaticCache
from course_lib.perf.metrics import TokenEvent, Trace
from course_lib.sampling import (accept_step, apply_repetition_penalty, apply_temperature, finish_reason, greedy,
                                 penalize_seen, probs_from_logits, sample, sample_rows, sampling_probs, top_k_filter,
                                 top_p_filter)
from course_lib.validate import integer, number, optional, probability

__all__ = ["apply_repetition_penalty", "apply_temperature", "top_k_filter", "top_p_filter", "sampling_probs",
           "sample", "greedy", "finish_reason", "generate", "decode_step", "GenerateOutput", "SpecStats", "TokenEvent",
           "Trace", "model_logits", "context_length", "check_pair", "TokenTree", "TreeVerification", "verify_tree",
           "tree_attention_mask", "tree_positions", "tree_depths"]


# --------------------------------------------------------------------------------------------------
# The generate loop
# --------------------------------------------------------------------------------------------------
@torch.inference_mode()
def generate(model, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id: int | list[int] | None = None,
             callback: Callable[[TokenEvent], bool | None] | None = None,
             cache=None, compile: bool | str = False, return_logits: bool = False,
             draft=None, draft_length: int = 4, adaptive: float | None = None,
             on_pass: Callable | None = None, repetition_penalty: float = 1.0) -> GenerateOutput:
    """Generate up to `max_new_tokens` tokens after the prompt `input_ids` (list of ids, [T] or [B, T]).

    The default temperature 0 is greedy decoding (like ``model.generate(do_sample=False)``); give
    temperature > 0 (and optionally top_k / top_p, and a seeded ``generator`` on the model's device) to
    sample. Generation stops after an `eos_token_id` token (included in the output) if one is given.
    repetition_penalty (> 0; 1 = none, as ``model.generate(repetition_penalty=...)``): before sampling or the
    argmax, the logit of every token already in the row (its prompt, left padding excluded, and its new
    tokens) is divided by it when positive and multiplied by it when negative (``apply_repetition_penalty``,
    CTRL's penalty; notebook 00 measures what it does to greedy decoding's loops).
    ``callback(event)`` runs after each token (each step, for a batch) with a ``TokenEvent(index,
    token_id, time, start)`` (``time.perf_counter()`` seconds, taken once the token is on the host, so
    device work is finished); if it returns True, generation stops there (streaming UIs, stop rules).

    A batch: [B, T], or a list of B prompts, which may differ in length (left-padded; they need
    cache="contiguous"). max_new_tokens, temperature, top_k, top_p, generator, eos_token_id and
    repetition_penalty may be one for all rows or a list with one per row (each row then samples with its
    own settings and generator: the static serving baseline). A row that finished (its eos, its
    max_new_tokens) repeats its last token until every row has; the trace has one event per step (row 0's
    token).

    cache: None (default) is the baseline without a KV cache: each step runs the model over the *whole*
    sequence, so step i costs about as much as a prefill of prompt + i tokens. With a cache (Module 05:
    "contiguous", "static", or an empty ``KVCache`` of any kind) the prompt is prefilled once and each
    step feeds one token. compile (Module 12, the gpt-fast recipe): the decode step compiled whole,
    through a ``StaticCache`` (made if none is given; see ``decode_step``); the prefill stays eager. The
    first call compiles (seconds to a minute); greedy output equals the eager loop's.
    return_logits: also return the logits that chose each token (``GenerateOutput.logits``; after the
    repetition penalty, when there is one).

    The context: the model sees the prompt and every new token but the last (which is never fed back),
    so prompt + max_new_tokens - 1 must fit in config.max_position_embeddings (the serving engine's
    rule, and every draft's), unless the cache places positions inside itself (``SinkCache``).

    draft (Module 08): speculative decoding of one request, at most ``draft_length`` proposals per pass
    (a tree: that depth), verified by `model` in one forward. A draft course model with the same
    vocabulary (at temperature 0 the output equals plain greedy decoding token for token; otherwise it is
    distributed exactly as sampling from `model`), or a draft object with ``propose(seq, budget,
    hidden)`` (prompt lookup, Medusa's tree, EAGLE's and MTP's chains; see the module docstring), verified
    greedily (temperature 0).
    The target's cache is `cache` (None or an empty ``ContiguousCache``: the pass crops it). `adaptive`
    (a draft model): None, or a confidence threshold in (0, 1): a pass stops proposing after a token
    whose draft probability max_x q(x) is below it. ``on_pass(ids [1, n], target_cache, draft_cache)``
    runs after every pass (tests, visualizations). The output's ``stats`` holds the run's ``SpecStats``;
    the trace's tokens of one pass share its time.
    """
    ids, pad, limits, eos, draw, cache, penalty = _check_generate(
        model, input_ids, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id, callback, cache,
        compile, return_logits, draft, draft_length, adaptive, on_pass, repetition_penalty)
    B, T = ids.shape                            # [B, T] prompts; pad [B]: left padding of each (or None)
    device = _model_device(model)
    start = time.perf_counter()
    trace = Trace(start=start, events=[], prompt_tokens=T)
    rows: list[list[int]] = []                  # the new tokens, one [B] list per step
    chosen_by: list[torch.Tensor] = []          # the logits [B, V] behind each step's tokens

    def emit(step_tokens: list[int]) -> bool:
        """Record one step's tokens [B] (ready now); True when generation must stop."""
        event = TokenEvent(index=len(rows), token_id=step_tokens[0], time=time.perf_counter(), start=start)
        trace.events.append(event)
        rows.append(step_tokens)
        stop = callback(event) if callback is not None else None
        return stop is True or all(finish_reason(t, len(rows), limits[r], eos[r]) for r, t in enumerate(step_tokens))

    spec = None
    if max(limits) == 0:
        pass
    elif draft is not None:                 # speculative: each pass emits 1..g+1 tokens
        if not hasattr(draft, "propose"):   # a draft model: proposes g tokens sampled like the target
            draft = _ModelDraft(draft, (temperature, top_k, top_p), generator, adaptive)
        spec = _Speculation(model, draft, ids[0], limits[0], draft_length, (temperature, top_k, top_p),
                            generator, eos[0], cache, on_pass)
        spec.prefill()
        stop = False
        while not stop:
            stop = any(emit([t]) for t in spec.step())   # any() stops at the first that says stop
    else:
        step = decode_step(model, compile) if cache is not None else None
        seq = ids.to(device)                # [B, T]: everything so far (grows only without a cache)
        x = seq                             # what the model sees first: the prompt
        last = [None] * B                   # the last token each finished row repeats
        seen = None                         # [B, V] the token ids each row holds so far (a penalty needs them)
        for i in range(max(limits)):
            if cache is None:
                # No cache: the whole sequence again (with a cache only the tokens it has not seen).
                logits = model_logits(model, seq)[:, -1, :]                 # [B, V] the last position
            else:                           # prefill eager, then steps
                logits = _forward(model if i == 0 else step, x, cache, pad)[:, -1, :]
            if penalty is not None:         # [B, 1] per row: the seen tokens' logits scaled
                if seen is None:
                    seen = _prompt_tokens_seen(ids.to(device), pad, logits.shape[-1])
                logits = penalize_seen(logits, seen, penalty.to(logits.dtype))
            token = draw(logits)            # [B]: sample(...) with the call's settings, or each row its own
            toks = token.tolist()           # copies to the host: waits for the device, so times are real
            if any(t is not None for t in last):
                toks = [t if p is None else p for t, p in zip(toks, last)]
                token = torch.tensor(toks, dtype=torch.long, device=device)
            last = [p if p is not None or not finish_reason(t, i + 1, limits[r], eos[r]) else t
                    for r, (t, p) in enumerate(zip(toks, last))]
            if return_logits:
                chosen_by.append(logits)
            if emit(toks):
                break
            x = token.view(B, 1).to(seq.dtype)
            if seen is not None:
                seen.scatter_(1, x, True)
            if cache is None:
                seq = torch.cat([seq, x], dim=1)                                # [B, T + i + 1]

    tokens = torch.tensor(rows, dtype=torch.long, device="cpu").reshape(len(rows), B).T  # [B, n]
    logits = None
    if return_logits:                                                                    # [B, n, V]
        vocab = getattr(getattr(model, "config", None), "vocab_size", 0)
        logits = torch.stack(chosen_by, dim=1) if chosen_by else torch.zeros(B, 0, vocab, device=device)
    if spec is not None:
        spec.stats.emitted = len(rows)
        spec.stats.total_seconds = time.perf_counter() - start
    if B == 1:
        tokens, logits = tokens[0], (logits[0] if logits is not None else None)
    return GenerateOutput(tokens.contiguous(), trace, logits, spec.stats if spec is not None else None)


# --------------------------------------------------------------------------------------------------
# Speculative decoding: one draft-then-verify pass, whatever the draft
# --------------------------------------------------------------------------------------------------
class _Speculation:
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
        needs = getattr(draft, "needs_hidden", False)
        if needs not in (False, None, True, "all"):
            raise ValueError(f"draft.needs_hidden must be False, True (the last verified position's hidden state) "
                             f"or 'all' (every newly verified position's), got {needs!r}")
        self.wants_hidden, self.all_hidden = needs in (True, "all"), needs == "all"
        # [D] the target's final hidden state where it chose the last token, or (needs_hidden == "all")
        # [m, D] those of the positions verified since the draft's last pass; None before any.
        self.hidden = None
        if callable(getattr(draft, "reset", None)):
            draft.reset()                   # a draft object may be reused: each call starts afresh
        self.device = _model_device(target)
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
            p = probs_from_logits(tlogits, temperature, top_k, top_p)       # [k + 1, V]
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


class _ModelDraft:
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
                q = probs_from_logits(logits, temperature, top_k, top_p)   # [V]
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


# --------------------------------------------------------------------------------------------------
# Tree verification (SpecInfer, Medusa; why the mask makes it exact: course_lib.speculative.tree)
# --------------------------------------------------------------------------------------------------
def _check_parents(parents, name="parents") -> list[int]:
    if isinstance(parents, torch.Tensor):
        parents = parents.tolist()
    try:
        parents = [int(p) for p in parents]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of ints (parent node index per node), got {parents!r}")
    if len(parents) == 0:
        raise ValueError(f"{name}: the tree is empty; it needs at least the root node")
    if parents[0] != -1:
        raise ValueError(f"{name}[0] must be -1 (node 0 is the root), got {parents[0]}")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"{name}[{i}] = {p}: every parent index must satisfy 0 <= parent < node index "
                             f"(parents come before their children)")
    return parents


def tree_depths(parents) -> list[int]:
    """Depth of every node (root = 0); parents come first, so one left-to-right sweep suffices."""
    parents = _check_parents(parents)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


@dataclass
class TokenTree:
    """A candidate tree: ``tokens[i]`` at node i, following node ``parents[i]`` (root: parents[0] = -1).

    tokens: [N] long. parents: N ints with parents[i] < i. paths: the Medusa top-k paths the tree was
    built from (empty for a hand-made tree), ``paths[i-1]`` belongs to node i.
    """
    tokens: torch.Tensor
    parents: list[int]
    paths: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.tokens, torch.Tensor):
            self.tokens = torch.as_tensor(self.tokens, dtype=torch.long, device="cpu")   # a list: host tokens
        if self.tokens.dim() != 1 or self.tokens.dtype not in (torch.long, torch.int32):
            raise TypeError(f"tokens must be an integer tensor [N], got {self.tokens.dtype} "
                            f"of shape {tuple(self.tokens.shape)}")
        if self.tokens.numel() == 0:
            raise ValueError("tokens: the tree is empty; it needs at least the root node")
        self.parents = _check_parents(self.parents)
        if len(self.parents) != self.tokens.numel():
            raise ValueError(f"parents has {len(self.parents)} entries but tokens has {self.tokens.numel()}")
        self.tokens = self.tokens.long()

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        return tree_depths(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        if not 0 <= node < self.size:
            raise ValueError(f"node must be in [0, {self.size}), got {node}")
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]



def tree_attention_mask(parents, past_len: int = 0, device=None) -> torch.Tensor:
    """Boolean mask [N, past_len + N], True = may attend: every past token, then the node's ancestors and itself.

    With past_len = 0 this is the [N, N] tree mask; with the cache length it is the ``attn_mask`` the
    model takes for a forward of the N tree nodes on top of the cache.
    """
    parents = _check_parents(parents)
    past_len = integer(past_len, "past_len", low=0)
    N = len(parents)
    # Built on the host (a Python loop over rows would be N tiny kernels on a GPU), then moved once.
    tree = torch.zeros(N, N, dtype=torch.bool, device="cpu")
    for i in range(N):
        if parents[i] >= 0:
            tree[i] = tree[parents[i]]  # the parent's row already holds all of its ancestors
        tree[i, i] = True
    past = torch.ones(N, past_len, dtype=torch.bool, device="cpu")
    return torch.cat([past, tree], dim=1).to(device)  # [N, past_len + N]


def tree_positions(parents, start: int, device=None) -> torch.Tensor:
    """Positions [N] = start + depth: node i sits where it would in the plain sequence past + path(i)."""
    start = integer(start, "start", low=0)
    return torch.tensor(tree_depths(parents), dtype=torch.long, device=device) + start


@dataclass
class TreeVerification:
    """The outcome of one tree verification.

    path: accepted node indices, root first (root always accepted). tokens: the accepted candidate
    tokens (the path without the root), so ``len(tokens)`` is the number accepted. next_token: the
    target's greedy token after the path (correction or bonus). hidden: [D] the target's final hidden
    state at the last path node (what Medusa heads read next). logits: [N, V] target logits per node.
    """
    path: list[int]
    tokens: list[int]
    next_token: int
    hidden: torch.Tensor
    logits: torch.Tensor

    @property
    def num_accepted(self) -> int:
        return len(self.tokens)

    @property
    def emitted(self) -> list[int]:
        """New tokens this pass adds to the output: the accepted candidates and the next token."""
        return [*self.tokens, self.next_token]


@torch.no_grad()
def verify_tree(target, cache, tree: TokenTree, compact: bool = True) -> TreeVerification:
    """Score all tree nodes in one target forward and keep the longest greedily-correct path.

    cache: the target's KV cache holding the past (everything before the root), batch size 1. After the
    call it holds the past plus the accepted path, root first, so the next pass starts right after it.

    Why the RoPE positions stay right after compaction: keys are stored already rotated. Node i was
    rotated with position S_past + depth(i). The accepted path has exactly one node per depth 0..d, and
    compaction puts the depth-j node at cache index S_past + j, which is the position it was rotated
    with. So the compacted cache is what a plain forward of past + path would have written (checked in
    the tests against a fresh recompute). Nodes off the path are dropped, and nothing else moves.
    """
    if not isinstance(tree, TokenTree):
        raise TypeError(f"tree must be a TokenTree (see build_tree), got {type(tree).__name__}")
    past = cache.get_seq_length()
    if cache.k and cache.k[0].shape[0] != 1:
        raise ValueError(f"cache: tree verification is for batch size 1, the cache holds batch "
                         f"{cache.k[0].shape[0]}")
    device = target.device
    ids = tree.tokens.to(device)[None]                                  # [1, N]
    positions = tree_positions(tree.parents, past, device=device)       # [N]
    mask = tree_attention_mask(tree.parents, past, device=device)       # [N, past + N]
    logits, hidden = target(ids, cache=cache, positions=positions, attn_mask=mask, return_hidden=True)
    logits, hidden = logits[0], hidden[0]                               # [N, V], [N, D]
    greedy = logits.argmax(-1).tolist()                                 # target's pick after each node

    # A node is accepted when its parent is and its token is the target's pick at the parent.
    tokens = tree.tokens.tolist()
    accepted = [True] + [False] * (tree.size - 1)
    depth = tree.depths
    for i in range(1, tree.size):
        p = tree.parents[i]
        accepted[i] = accepted[p] and tokens[i] == greedy[p]
    # The deepest accepted node ends the path (ties: the lower index; with distinct sibling tokens,
    # as top-k candidates are, at most one child per node can match, so there is no tie).
    last = max((i for i in range(tree.size) if accepted[i]), key=lambda i: (depth[i], -i))
    path = tree.path_to(last)
    if compact:
        if path == list(range(len(path))):       # the path is a prefix of the node order: just crop
            cache.crop(past + len(path))
        else:
            keep = torch.cat([torch.arange(past, device=device),
                              past + torch.tensor(path, dtype=torch.long, device=device)])
            cache.compact(keep)
    return TreeVerification(path=path, tokens=[tokens[i] for i in path[1:]], next_token=greedy[last],
                            hidden=hidden[last], logits=logits)


# --------------------------------------------------------------------------------------------------
# What generate returns
# --------------------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class GenerateOutput:
    """What ``generate`` returns: unpack as ``tokens, trace = generate(...)``.

    tokens: the new tokens only, int64 on the CPU (the prompt is not repeated): [n] for one request
        (a list, [T] or [1, T] prompt), [B, n] for a batch of B > 1 prompts.
    trace: the timeline (start, one TokenEvent per step, prompt length); for a batch, one event per step
        with row 0's token (every row's token of a step is ready at the same time).
    logits: with ``return_logits=True``, the logits that chose each token, [n, V] or [B, n, V], on the
        model's device; else None.
    stats: with ``draft=``, the run's ``SpecStats`` (passes, acceptance, time in each model); else None.
    """
    tokens: torch.Tensor
    trace: Trace
    logits: torch.Tensor | None = None
    stats: SpecStats | None = None

    def __iter__(self):  # tokens, trace = generate(...)
        return iter((self.tokens, self.trace))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return (self.tokens, self.trace)[i]


# --------------------------------------------------------------------------------------------------
# Model calls, caches, the compiled step
# --------------------------------------------------------------------------------------------------
def model_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of a course model (returns a tensor) or a Hugging Face model (returns .logits).

    Hugging Face models are called with use_cache=False: this is the recompute-everything baseline.
    """
    if hasattr(model, "generation_config"):  # a transformers PreTrainedModel
        out = model(input_ids=input_ids, use_cache=False)
    else:
        out = model(input_ids)
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}; expected logits or an object with .logits")


def context_length(model) -> int | None:
    """The model's context window (config.max_position_embeddings), or None if it does not say."""
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if n is not None else None


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _make_cache(model, cache, compile, batch: int, span: int):
    """The cache generate decodes through: None (recompute), a fresh one by name, or the caller's."""
    if hasattr(model, "generation_config") and (cache is not None or compile):
        raise ValueError("cache= and compile= need a course model (course_lib.models); a transformers model "
                         "brings its own cache: use model.generate")
    if compile and cache is None:
        cache = "static"
    if cache is None or isinstance(cache, KVCache):
        if compile and not isinstance(cache, StaticCache):
            raise ValueError(f"compile=True needs a StaticCache (fixed shapes), got {type(cache).__name__}")
        if cache is not None and cache.get_seq_length() != 0:
            raise ValueError("cache must be empty: generate prefills the prompt into it")
        return cache
    if cache == "contiguous":
        return ContiguousCache()
    if cache == "static":
        # Sized to the request rounded up to 256 tokens (capped at the context): a compiled step is
        # reused by every request in the same size bucket, and attention reads few unused slots.
        ctx = model.config.max_position_embeddings
        return StaticCache.for_model(model, batch, min(ctx, -(-span // 256) * 256))
    raise ValueError(f"cache must be None, 'contiguous', 'static' or an empty KVCache, got {cache!r}")


def decode_step(model, compile: bool | str = True):
    """``model`` itself, or its forward compiled for one-token steps through a ``StaticCache``.

    compile=True: ``torch.compile(fullgraph=True)``, with CUDA graphs (mode "reduce-overhead") on a
    GPU, where a step of a small model is launch-bound; inductor's C++ code on a CPU. A string names
    another torch.compile backend ("eager" traces the graph without generating code: a cheap check that
    the step has no graph break). Compiled once per model and setting; a new cache size compiles again.
    """
    if not compile:
        return model
    backend = "inductor" if compile is True else str(compile)
    mode = "reduce-overhead" if backend == "inductor" and model.device.type == "cuda" else None
    steps = model.__dict__.setdefault("_compiled_decode_steps", {})
    if (backend, mode) not in steps:
        steps[(backend, mode)] = torch.compile(model.forward, backend=backend, mode=mode, fullgraph=True,
                                               dynamic=False)
    return steps[(backend, mode)]


def _forward(fn, ids: torch.Tensor, cache: KVCache, pad: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, T, V] of `ids` [B, T] through `cache`, with the cache's mask when it has one (a sliding
    window's banded prefill); None means the model's causal mask, and the call stays the plain one.
    Left-padded rows (pad [B] > 0) get their own positions (from 0 at their first real token) and a mask
    that hides the pads (a pad query sees itself only, which keeps its softmax finite)."""
    if pad is not None:
        past, T = cache.get_seq_length(), ids.shape[1]
        q = torch.arange(past, past + T, device=ids.device)[None, :, None]           # [1, T, 1] query index
        k = torch.arange(past + T, device=ids.device)[None, None, :]                  # [1, 1, S] key index
        mask = ((k <= q) & (k >= pad[:, None, None])) | (k == q)                      # [B, T, S]
        positions = (q[..., 0] - pad[:, None]).clamp(min=0)                           # [B, T]
        return fn(ids, cache=cache, positions=positions, attn_mask=mask[:, None])
    mask = cache.attn_mask(ids.shape[1], device=ids.device)
    if mask is None:
        return fn(ids, cache=cache)
    return fn(ids, cache=cache, attn_mask=mask)


# --------------------------------------------------------------------------------------------------
# Argument checks (everything generate refuses, in one place)
# --------------------------------------------------------------------------------------------------
def check_pair(target, draft):
    """Target and draft must speak the same vocabulary: the same token id must mean the same token."""
    vt = getattr(getattr(target, "config", None), "vocab_size", None)
    vd = getattr(getattr(draft, "config", None), "vocab_size", None)
    if vt is None or vd is None or hasattr(target, "generation_config") or hasattr(draft, "generation_config"):
        raise TypeError("target and draft must be course models with a .config.vocab_size "
                        "(for Hugging Face models use course_lib.speculative.hf.hf_assisted_generate)")
    if vt != vd:
        raise ValueError(f"target and draft vocabularies differ: target vocab_size={vt}, draft "
                         f"vocab_size={vd}; speculative decoding needs one shared tokenizer")


def _check_generator(generator, device: torch.device):
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device.type} but the model is on {device.type}: create it "
                         f"there, torch.Generator(device={str(device)!r}).manual_seed(...)")


def _prompt_batch(input_ids) -> torch.Tensor:
    """Prompts as an int64 tensor [B, T], from a list of ints or an integer tensor [T] / [B, T]."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        ids = input_ids
    elif isinstance(input_ids, (list, tuple)):
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in input_ids):
            raise TypeError("input_ids must be a list of int token ids or an integer tensor")
        ids = torch.tensor([int(t) for t in input_ids], dtype=torch.long, device="cpu")
    else:
        raise TypeError(f"input_ids must be a list of token ids or a tensor [T] / [B, T], "
                        f"got {type(input_ids).__name__}")
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] == 0:
        raise ValueError(f"input_ids must have shape [T] or [B, T] with B >= 1, got {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token "
                         "(e.g. the BOS/EOS token as a start-of-text marker)")
    return ids.long()


def _prompt_tensor(input_ids, why_one: str = "this runs one request (batch size 1)",
                   batch_hint: str = "Module 09 batches requests") -> torch.Tensor:
    """One prompt as an int64 tensor [T], from a list of ints or an integer tensor [T] / [1, T]."""
    ids = _prompt_batch(input_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"input_ids: {why_one}; got batch size {ids.shape[0]} ({batch_hint})")
    return ids[0]


def _check_generate(model, input_ids, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id,
                    callback, cache, compile, return_logits, draft, draft_length, adaptive, on_pass,
                    repetition_penalty=1.0):
    """Every argument of ``generate`` checked (ValueError/TypeError naming it). Returns the prompts [B, T]
    and their left padding [B] (None when all have the same length), each row's max_new_tokens and stop
    tokens (a set), ``draw(logits [B, V]) -> [B]`` (the sampling rule, shared or per row), the cache to
    decode through (None, or a KVCache) and the repetition penalty of each row as a [B, 1] tensor on the
    model's device (None when every row's is 1: the loop then skips it)."""
    ids, pad = _prompts(input_ids)                                      # [B, T]; [B] or None
    B, T = ids.shape
    device = _model_device(model)
    limits, rows_n = _per_row(max_new_tokens, B, "max_new_tokens", lambda v: integer(v, "max_new_tokens", low=0))
    temps, rows_t = _per_row(temperature, B, "temperature", lambda v: number(v, "temperature", 0))  # 0 = greedy
    ks, rows_k = _per_row(top_k, B, "top_k", lambda v: optional(integer, v, "top_k", low=1))
    ps, rows_p = _per_row(top_p, B, "top_p", lambda v: optional(probability, v, "top_p", zero=False))
    gens, rows_g = _per_row(generator, B, "generator", lambda v: _check_generator(v, device))
    eos, rows_e = _eos_rows(eos_token_id, B)
    pens, rows_r = _per_row(repetition_penalty, B, "repetition_penalty",
                            lambda v: number(v, "repetition_penalty", 0, low_open=True))   # 1 = no penalty
    penalty = (torch.tensor([[float(v)] for v in pens], device=device) if any(float(v) != 1 for v in pens)
               else None)
    per_row = rows_n or rows_t or rows_k or rows_p or rows_g or rows_e or rows_r
    max_new_tokens = max(limits)
    if per_row:          # each row its own settings (a batch of requests; the static serving baseline)
        def draw(logits):
            return sample_rows(logits, temps, ks, ps, gens)
    else:
        def draw(logits):
            return sample(logits, temperature, top_k, top_p, generator)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (it receives a TokenEvent), got {type(callback).__name__}")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
    if pad is not None:
        if cache is None or compile:
            raise ValueError("input_ids: prompts of different lengths are left-padded and decode through a KV cache "
                             "that takes their masks: give cache='contiguous' (and compile=False)")
        if not (cache == "contiguous" or isinstance(cache, ContiguousCache)):
            raise ValueError(f"input_ids: prompts of different lengths need cache='contiguous' or a ContiguousCache, "
                             f"got {cache!r}")
    if draft is not None:
        if per_row:
            raise ValueError("draft= runs one request: give max_new_tokens, temperature, top_k, top_p, generator "
                             "and eos_token_id for it alone, not per row")
        if penalty is not None:
            raise ValueError(f"repetition_penalty={repetition_penalty!r}: speculative decoding (draft=) does not "
                             "apply a repetition penalty (the draft's proposals and the target's verification would "
                             "both need it); leave repetition_penalty=1.0")
        if hasattr(draft, "propose"):       # a draft object: proposals verified greedily
            _check_draft_object(model, draft, temperature, adaptive)
        else:
            check_pair(model, draft)
        draft_length = integer(draft_length, "draft_length", low=1)
        optional(probability, adaptive, "adaptive", zero=False, one=False)   # a confidence threshold
        if B != 1:
            raise ValueError(f"input_ids: speculative decoding (draft=) runs one request; got batch size {B} "
                             "(each row would accept a different number of tokens)")
        if compile or return_logits:
            raise ValueError("draft= runs eager and returns no logits: leave compile=False, return_logits=False")
        cache = ContiguousCache() if cache in (None, "contiguous") else cache
        if not isinstance(cache, ContiguousCache):
            raise ValueError(f"with draft=, cache must be None, 'contiguous' or a ContiguousCache (each pass crops "
                             f"it), got {type(cache).__name__}")
        V = model.config.vocab_size
        if int(ids.max()) >= V or int(ids.min()) < 0:
            raise ValueError(f"input_ids must be token ids in [0, {V}), got values up to {int(ids.max())}")
    elif adaptive is not None or on_pass is not None:
        raise ValueError("adaptive and on_pass belong to speculative decoding: give draft= as well")
    # The model sees the prompt and every new token but the last (which is never fed back); in a batch
    # every row runs until the last one ends, so the longest prompt and the largest max_new_tokens count.
    span = T + max(max_new_tokens - 1, 0)
    for name, m in (("model", model), ("draft", draft)):   # a draft object has no context (None)
        ctx = context_length(m) if m is not None else None
        repositions = m is model and getattr(cache, "reposition", False) is True  # SinkCache: positions inside
        if ctx is not None and span > ctx and not repositions:
            raise ValueError(f"prompt of {T} tokens + max_new_tokens={max_new_tokens} needs {span} positions "
                             f"(the last new token is never fed back), past the {name}'s context of {ctx} "
                             "tokens (config.max_position_embeddings)")
    cache = _make_cache(model, cache, compile, B, span)
    if cache is not None and getattr(cache, "max_len", span) < span:
        raise ValueError(f"cache holds max_len={cache.max_len} tokens but this request needs {span}")
    return ids, (pad.to(device) if pad is not None else None), limits, eos, draw, cache, penalty


def _prompt_tokens_seen(ids: torch.Tensor, pad: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[B, V] bool: which token ids each prompt row [B, T] holds, its left padding (pad [B]) left out (the pad
    id 0 is no token of the row). The repetition penalty's memory at the first step."""
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise ValueError(f"input_ids must be token ids in [0, {vocab}) for repetition_penalty, got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    seen = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device)
    real = torch.ones_like(ids, dtype=torch.bool)
    if pad is not None:
        real = torch.arange(ids.shape[1], device=ids.device)[None, :] >= pad[:, None]     # [B, T]
    return seen.scatter_(1, ids, real)


def _per_row(value, B: int, name: str, check) -> tuple[list, bool]:
    """One setting for every row, or a list/tuple of B settings (one per row); each checked."""
    if isinstance(value, (list, tuple)):
        if len(value) != B:
            raise ValueError(f"{name}: got {len(value)} values for a batch of {B} prompts (one per row, or one "
                             "for all)")
        for v in value:
            check(v)
        return list(value), True
    check(value)
    return [value] * B, False


def _eos_set(e, name: str = "eos_token_id") -> set:
    if e is None:
        return set()
    if isinstance(e, numbers.Integral) and not isinstance(e, bool):
        return {int(e)}
    if isinstance(e, (list, tuple, set, frozenset)) and all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                                            for x in e):
        return {int(x) for x in e}
    raise ValueError(f"{name} must be an int, a list of ints or None (or one of those per row), got {e!r}")


def _eos_rows(eos_token_id, B: int) -> tuple[list[set], bool]:
    """The stop tokens of each row: one int / list of ints / None for all rows, or a list of B of those."""
    if isinstance(eos_token_id, (list, tuple)) and eos_token_id and all(
            e is None or isinstance(e, (list, tuple, set, frozenset)) for e in eos_token_id):
        if len(eos_token_id) != B:
            raise ValueError(f"eos_token_id: got {len(eos_token_id)} stop-token lists for a batch of {B} prompts")
        return [_eos_set(e) for e in eos_token_id], True
    return [_eos_set(eos_token_id)] * B, False


def _prompts(input_ids) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts [B, T] and their left padding [B]: a list of prompts (lists of ids or [T_i] tensors) of
    different lengths is left-padded with id 0 to the longest (pad[i] = T - T_i); else pad is None."""
    if not (isinstance(input_ids, (list, tuple)) and input_ids
            and all(isinstance(p, (list, tuple, torch.Tensor)) for p in input_ids)):
        return _prompt_batch(input_ids), None
    rows = [_prompt_tensor(p, "each prompt of a list is one request").to("cpu") for p in input_ids]  # [T_i] each
    T = max(r.numel() for r in rows)
    if all(r.numel() == T for r in rows):
        return torch.stack(rows), None
    ids = torch.stack([torch.cat([r.new_zeros(T - r.numel()), r]) for r in rows])                    # [B, T]
    return ids, torch.tensor([T - r.numel() for r in rows], dtype=torch.long, device="cpu")


def _check_draft_object(model, draft, temperature, adaptive):
    """A draft object (``propose(seq, budget, hidden)``) proposes without probabilities: greedy only."""
    if not callable(draft.propose):
        raise TypeError(f"draft.propose must be callable, got {type(draft.propose).__name__}")
    if getattr(getattr(model, "config", None), "vocab_size", None) is None or hasattr(model, "generation_config"):
        raise TypeError("draft=: speculative decoding needs a course model with a .config.vocab_size")
    if temperature != 0:
        raise ValueError(f"temperature={temperature!r}: a draft object ({type(draft).__name__}) gives no "
                         "probabilities, so its proposals are verified greedily; use temperature=0 (or a draft "
                         "model to sample)")
    if adaptive is not None:
        raise ValueError(f"adaptive belongs to a draft model (it reads the draft's confidence); "
                         f"{type(draft).__name__} has none: leave adaptive=None")
