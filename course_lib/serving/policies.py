"""Batching policies for the serving simulator, and the continuous-batching scheduler's hook.

Request-level batching (a batch is formed, then runs to the end):
  * StaticBatching(max_batch, timeout_s): wait until `max_batch` requests wait (or the oldest has waited
    `timeout_s`), then run them together, padded to the longest prompt and the longest output.
  * DynamicBatching(max_batch): whenever the engine is free, batch whatever is waiting (up to max_batch).
Iteration-level batching (the batch is re-formed at every step, Orca / vLLM style):
  * ContinuousBatching(max_batch, token_budget=None, scheduler=fcfs_schedule): finished requests leave and
    waiting ones join at every step; admission is limited by free KV blocks; when a running request cannot
    get a block for its next token the newest running request is preempted (its blocks are freed and it is
    recomputed later). token_budget=None prefills each admitted prompt whole in one step.
  * ChunkedPrefill(max_batch, token_budget): the same, but each step processes at most `token_budget`
    tokens: one per decoding request first, then prompt chunks, so one long prompt cannot stall decoding.
  * Disaggregated(prefill_workers, decode_workers, transfer_s_per_token): prompts are prefilled on one pool
    of workers, their KV cache is shipped (cost proportional to the prompt) to another pool that only
    decodes.

The scheduler hook (what Lab 09 asks you to write):

    decision = scheduler(waiting, running, free_blocks, block_size, max_batch)

waiting: SeqViews in queue order (head first: preempted requests come back at the head); running: SeqViews in
admission order (oldest first). A SeqView's `need` is the number of tokens it must have KV room for after
the next step; it holds `blocks` blocks now. Return Decision(preempt=[rids], admit=[rids]).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from course_lib.paged.manager import blocks_needed   # the one block count (re-exported by serving)
from course_lib.validate import integer, number, one_of, optional


@dataclass(frozen=True)
class SeqView:
    """What the scheduler sees of one request: id, arrival time, blocks held, tokens to hold after the next
    step (running: context + 1 while decoding; waiting: the tokens to prefill)."""
    rid: int
    arrival_s: float
    blocks: int
    need: int


@dataclass
class Decision:
    preempt: list = field(default_factory=list)   # rids of running requests to preempt (blocks freed)
    admit: list = field(default_factory=list)     # rids of waiting requests to start (a prefix of waiting)


def fcfs_schedule(waiting, running, free_blocks, block_size, max_batch, watermark: int = 0) -> Decision:
    """The reference continuous-batching scheduler (vLLM's default policy, simplified): the simulator's and
    the engine's (``serving.Engine`` calls it with its ``watermark``).

    1. Growth: walk the running requests oldest first; each needs blocks_needed(need) - blocks more blocks.
       While it cannot get them, preempt the newest running request (free its blocks); if it is itself the
       newest, preempt it and stop. The oldest requests keep going, so the system always progresses.
    2. Admission, only if nothing was preempted this step: take waiting requests from the head, in order,
       while the batch has room (max_batch) and their prefill's blocks fit; stop at the first that does not
       fit (first come, first served: no overtaking). With `watermark` > 0, a request is admitted next to
       others only if `watermark` blocks stay free after it (room for the running ones to grow); alone, it
       only has to fit.
    """
    run = list(running)
    free = free_blocks
    preempt = []
    i = 0
    while i < len(run):
        r = run[i]
        extra = max(0, blocks_needed(r.need, block_size) - r.blocks)
        while extra > free and len(run) > i + 1:
            victim = run.pop()
            preempt.append(victim.rid)
            free += victim.blocks
        if extra > free:
            run.pop()
            preempt.append(r.rid)
            free += r.blocks
            break
        free -= extra
        i += 1
    admit = []
    if not preempt:
        for w in waiting:
            if len(run) + len(admit) >= max_batch:
                break
            nb = blocks_needed(w.need, block_size)
            reserve = watermark if run or admit else 0
            if free - nb < reserve:
                break
            admit.append(w.rid)
            free -= nb
    return Decision(preempt=preempt, admit=admit)


@dataclass
class StaticBatching:
    """Wait for a full batch of `max_batch` (or until the oldest waited `timeout_s`); run it to the end, padded."""
    max_batch: int = 8
    timeout_s: float = 1.0
    name: str = "static"

    def __post_init__(self):
        self.max_batch = integer(self.max_batch, "max_batch", low=1)
        self.timeout_s = number(self.timeout_s, "timeout_s", 0)


@dataclass
class DynamicBatching:
    """Batch whatever is waiting when the engine is free (up to `max_batch`); run it to the end, padded."""
    max_batch: int = 8
    name: str = "dynamic"

    def __post_init__(self):
        self.max_batch = integer(self.max_batch, "max_batch", low=1)


@dataclass
class ContinuousBatching:
    """Iteration-level batching with KV-block admission and preemption by recompute."""
    max_batch: int = 64
    token_budget: int | None = None
    scheduler: Callable = fcfs_schedule
    name: str = "continuous"

    def __post_init__(self):
        self.max_batch = integer(self.max_batch, "max_batch", low=1)
        self.token_budget = optional(integer, self.token_budget, "token_budget", low=1)
        if not callable(self.scheduler):
            raise TypeError(f"scheduler must be callable, got {type(self.scheduler).__name__}")


def ChunkedPrefill(max_batch: int = 64, token_budget: int = 512,
                   scheduler: Callable = fcfs_schedule) -> ContinuousBatching:
    """Continuous batching with at most `token_budget` tokens per step (decodes first, then prompt chunks)."""
    if token_budget is None:
        raise ValueError("token_budget must be a positive integer for chunked prefill, got None")
    return ContinuousBatching(max_batch, token_budget, scheduler, name="chunked")


@dataclass
class Disaggregated:
    """Prefill on `prefill_workers`, decode on `decode_workers` (each with its own KV pool of num_blocks);
    a prompt's KV cache takes transfer_latency_s + transfer_s_per_token * prompt_tokens seconds to move
    between them (KV bytes per token / the link's bandwidth, plus the link's per-transfer latency)."""
    prefill_workers: int = 1
    decode_workers: int = 1
    transfer_s_per_token: float = 2e-6
    max_batch: int = 64
    prefill_token_budget: int | None = 2048
    scheduler: Callable = fcfs_schedule
    name: str = "disaggregated"
    transfer_latency_s: float = 0.0

    def __post_init__(self):
        self.prefill_workers = integer(self.prefill_workers, "prefill_workers", low=1)
        self.decode_workers = integer(self.decode_workers, "decode_workers", low=1)
        self.transfer_s_per_token = number(self.transfer_s_per_token, "transfer_s_per_token", 0)
        self.transfer_latency_s = number(self.transfer_latency_s, "transfer_latency_s", 0)
        self.max_batch = integer(self.max_batch, "max_batch", low=1)
        self.prefill_token_budget = optional(integer, self.prefill_token_budget, "prefill_token_budget", low=1)


def make_policy(name: str, **kw):
    """A policy by name: 'static', 'dynamic', 'continuous', 'chunked', 'disaggregated'."""
    table = {"static": StaticBatching, "dynamic": DynamicBatching, "continuous": ContinuousBatching,
             "chunked": ChunkedPrefill, "disaggregated": Disaggregated}
    return table[one_of(name, "policy", sorted(table))](**kw)


POLICY_NAMES = ["static", "dynamic", "continuous", "chunked", "disaggregated"]

__all__ = ["SeqView", "Decision", "blocks_needed", "fcfs_schedule", "StaticBatching", "DynamicBatching",
           "ContinuousBatching", "ChunkedPrefill", "Disaggregated", "make_policy", "POLICY_NAMES"]
