"""A request inside the serving engine: how it is decoded (SamplingParams), what it streams (StepOutput)
and the engine's state of it (EngineRequest, nano-vllm's ``Sequence``). What the engine returns for a
request is its record, the course's one request timeline ``course_lib.perf.metrics.Trace`` (``req.trace``):
its id, token ids, finish, finish reason, preemptions and metrics, the same object the scheduler updated."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from course_lib.perf.metrics import Trace
from course_lib.sampling import SamplingParams, finish_reason   # the one SamplingParams (re-exported)

__all__ = ["SamplingParams", "StepOutput", "EngineRequest", "as_token_list"]


@dataclass
class StepOutput:
    """One token streamed out of ``Engine.step()``."""
    request_id: int
    token: int
    finished: bool
    finish_reason: str | None = None     # "length" | "stop" | None (an aborted request streams nothing more)


class EngineRequest:
    """The engine's state of one request (nano-vllm's ``Sequence``): its tokens so far, its sampling
    generator, how much of it is prefilled (the cache counts its computed tokens), and its record ``trace``
    (a ``course_lib.perf.metrics.Trace``: what ``Engine.generate`` / ``abort_request`` / ``output`` return;
    unlike this object it holds no generator, callback or cache, so a caller may keep it after the engine
    forgets the request)."""

    def __init__(self, rid, prompt, params, arrival, callback=None, device="cpu", cache=None):
        self.id, self.prompt, self.params, self.callback = rid, prompt, params, callback
        self.cache = cache         # the engine's PagedCache (None in the static baselines)
        # the seed is drawn on the host (no device sync); the generator lives next to the logits
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (), device="cpu"))
        self.generator = None if params.greedy else torch.Generator(device=device).manual_seed(int(seed))
        self.trace = Trace(arrival, prompt_tokens=len(prompt), rid=rid, max_new_tokens=params.max_new_tokens)
        self.generated: list[int] = []     # the output token ids (the trace holds them too, with their times)
        self.prefill_end = 0       # tokens to prefill at (re)admission: prompt + tokens generated so far

    @property
    def tokens(self) -> list:
        return self.prompt + self.generated

    @property
    def computed(self) -> int:
        """Tokens whose K/V are in the pool: the cache's count (0 while waiting or after preemption)."""
        return self.cache.computed.get(self.id, 0) if self.cache is not None else 0

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prefill_end

    def emit(self, token: int, now: float) -> str | None:
        """Record a sampled token at `now`; returns the finish reason if this token ends the request."""
        self.generated.append(token)
        self.trace.add_token(now, token)
        reason = finish_reason(token, len(self.generated), self.params.max_new_tokens, self.params.stop_token_ids)
        if reason is not None:
            self.trace.end(now, reason)
        return reason


def as_token_list(prompt_ids, vocab_size: int, name: str = "prompt_ids") -> list[int]:
    """One prompt as a list of ints in [0, vocab_size): from a list or a [T] / [1, T] integer tensor."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dtype.is_floating_point or prompt_ids.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a {prompt_ids.dtype} tensor")
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1:
            raise ValueError(f"{name} must be one prompt, a [T] or [1, T] tensor, got shape {tuple(prompt_ids.shape)}")
        ids = prompt_ids.tolist()
    else:
        try:
            ids = list(prompt_ids)
        except TypeError:
            raise TypeError(f"{name} must be a list of token ids or a 1-D integer tensor, "
                            f"got {type(prompt_ids).__name__}") from None
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"{name} must hold integer token ids, got {t!r}")
        ids = [int(t) for t in ids]
    if not ids:
        raise ValueError(f"{name} is empty: a request needs at least one prompt token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return ids
