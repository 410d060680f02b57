"""The generate loop: prefill, then decode (recompute, any KV cache, compiled), or speculative passes."""
from __future__ import annotations

import time
from typing import Callable

import torch

from course_lib.perf.metrics import TokenEvent, Trace
from course_lib.sampling import finish_reason, penalize_seen

from .calls import decode_step, forward_through, model_device, model_logits
from .checks import check_generate, prompt_tokens_seen, settings_from_params
from .output import GenerateOutput
from .speculative import ModelDraft, Speculation


@torch.inference_mode()
def generate(model, input_ids, max_new_tokens: int | None = None, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id: int | list[int] | None = None,
             callback: Callable[[TokenEvent], bool | None] | None = None,
             cache=None, compile: bool | str = False, return_logits: bool = False,
             draft=None, draft_length: int = 4, adaptive: float | None = None,
             on_pass: Callable | None = None, repetition_penalty: float = 1.0, params=None) -> GenerateOutput:
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

    params: the sampling settings as one ``course_lib.sampling.SamplingParams`` (or a list, one per row)
    instead of max_new_tokens, temperature, top_k, top_p, eos_token_id (its stop_token_ids) and
    repetition_penalty, which then stay at their defaults; a params' seed seeds that row's generator on the
    model's device unless ``generator=`` is given. The engine, the server and the static baselines pass theirs.
    """
    if params is not None:
        max_new_tokens, temperature, top_k, top_p, generator, eos_token_id, repetition_penalty = settings_from_params(
            params, input_ids, model, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id,
            repetition_penalty)
    elif max_new_tokens is None:
        raise TypeError("generate needs max_new_tokens (or params=SamplingParams(max_new_tokens=...))")
    ids, pad, limits, eos, draw, cache, penalty = check_generate(
        model, input_ids, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id, callback, cache,
        compile, return_logits, draft, draft_length, adaptive, on_pass, repetition_penalty)
    B, T = ids.shape                            # [B, T] prompts; pad [B]: left padding of each (or None)
    device = model_device(model)
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
            draft = ModelDraft(draft, (temperature, top_k, top_p), generator, adaptive)
        spec = Speculation(model, draft, ids[0], limits[0], draft_length, (temperature, top_k, top_p),
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
                logits = forward_through(model if i == 0 else step, x, cache, pad)[:, -1, :]
            if penalty is not None:         # [B, 1] per row: the seen tokens' logits scaled
                if seen is None:
                    seen = prompt_tokens_seen(ids.to(device), pad, logits.shape[-1])
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
