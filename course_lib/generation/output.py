"""What ``generate`` returns: the tokens, the trace, the logits, and a speculative run's counters."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.perf.metrics import Trace


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
