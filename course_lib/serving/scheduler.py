"""The engine's scheduler: which requests run in the next step (the policy half of ``Engine.step``).

Each ``schedule()`` (vLLM's scheduler, in miniature):

1. **Reserve decode slots.** Every running request whose prompt is done feeds its last sampled token this
   step, so it needs one KV slot (a new block when its last block is full). If the free blocks do not cover
   all of them, the **newest** admitted request is **preempted**: its blocks are freed and it goes back to
   the head of the waiting queue. When it is admitted again, its prompt *and the tokens it already
   generated* are prefilled again (recompute), so nothing is lost and greedy output is unchanged.
2. **Admit** waiting requests first-come-first-served while the batch has room (``max_batch``) and the pool
   keeps a small reserve of free blocks (the watermark) for the running requests to grow into; nothing is
   admitted in a step that had to preempt (no thrashing).
3. **Prefill** the admitted prompts, up to ``max_prefill_tokens`` prompt tokens per step (a longer prompt is
   prefilled in chunks over several steps), grouped into forwards of similar lengths.

It only books memory in the engine's ``PagedCache`` (``add_sequence``, ``append``, ``free``); the forwards
and the sampling are the engine's.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from course_lib.paged import PagedCache, blocks_needed

from .request import EngineRequest

__all__ = ["Scheduler", "StepPlan"]


@dataclass
class StepPlan:
    """What one step runs: the decoding requests (one token each, their slot already reserved) and the
    prefill forwards, each a list of (request, first position, tokens to prefill)."""
    decode: list
    prefill_groups: list


class Scheduler:
    """FCFS continuous batching over a PagedCache: waiting queue, running list, admission, preemption."""

    def __init__(self, cache: PagedCache, max_batch: int, max_prefill_tokens: int, watermark_blocks: int):
        self.cache = cache
        self.max_batch, self.max_prefill_tokens, self.watermark_blocks = max_batch, max_prefill_tokens, watermark_blocks
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []       # in admission order (the last is the newest)
        self.num_preemptions = 0
        self.max_running_seen = 0

    @property
    def manager(self):
        return self.cache.manager

    def add(self, req: EngineRequest):
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: EngineRequest):
        """A request ended: free its blocks and drop it from the batch."""
        self.cache.free(req.id)
        self.running.remove(req)

    def abort(self, req: EngineRequest):
        """Drop a request that has not finished (its client left): free its blocks if it holds any (a
        running one; a waiting one holds none, preempted or not) and forget it."""
        if req in self.running:
            self.cache.free(req.id)
            self.running.remove(req)
        else:
            self.waiting.remove(req)

    def preempt(self, req: EngineRequest):
        """Free a running request's blocks and put it back at the head of the queue (recompute later)."""
        self.cache.free(req.id)
        self.running.remove(req)
        req.prefill_end = 0
        req.trace.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _reserve_decode_slots(self) -> list[EngineRequest]:
        """Register the token each decoding request feeds this step, preempting the newest on shortage."""
        while True:
            rows = [r for r in self.running if not r.prefilling]
            need = sum(self.manager.blocks_needed(r.id, 1) for r in rows)
            if need <= self.manager.num_free_blocks:
                break
            self.preempt(self.running[-1])
        self.cache.append([r.id for r in rows], [r.tokens[r.computed] for r in rows])
        return rows

    def _admit(self):
        bs = self.manager.block_size
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            toks = req.tokens
            need = blocks_needed(len(toks), bs)
            reserve = self.watermark_blocks if self.running else 0    # alone, it only needs to fit
            if self.manager.num_free_blocks - need < reserve:
                break
            self.cache.add_sequence(req.id, toks)                   # no prefix caching here: all to compute
            self.waiting.popleft()
            req.prefill_end = len(toks)
            self.running.append(req)

    def schedule(self) -> StepPlan:
        """Book the next step's memory and say what it runs (see the module docstring)."""
        before = self.num_preemptions
        decode = self._reserve_decode_slots()
        if self.num_preemptions == before:
            self._admit()
        self.max_running_seen = max(self.max_running_seen, len(self.running))
        pre, budget = [], self.max_prefill_tokens       # FCFS within the token budget (the last may be a chunk)
        for r in self.running:
            if r.prefilling and budget > 0:
                n = min(r.prefill_end - r.computed, budget)
                pre.append((r, r.computed, n))
                budget -= n
        return StepPlan(decode, prefill_groups(pre))


def prefill_groups(pre, max_waste: float = 0.25) -> list[list]:
    """Split prefill rows (request, start, n) into forwards of similar lengths, so right-padding wastes
    at most ``max_waste`` of the computed tokens (one forward of 16 prompts padded to the longest would
    compute several times the real tokens)."""
    groups, cur, total = [], [], 0
    for row in sorted(pre, key=lambda x: -x[2]):
        if cur and cur[0][2] * (len(cur) + 1) > (1 + max_waste) * (total + row[2]):
            groups.append(cur)
            cur, total = [], 0
        cur.append(row)
        total += row[2]
    return groups + ([cur] if cur else [])
