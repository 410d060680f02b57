"""How much KV memory is wasted: contiguous reservation vs paging, on a realistic serving workload.

A request (``course_lib.perf.workload.Request``; ``limited_workload`` draws them) arrives with a prompt and
a ``max_new_tokens`` limit; how many tokens it will really generate (``output_tokens``) is unknown until
it stops. Two ways to give it KV memory:

* **contiguous**: reserve one contiguous range for the most it could ever need when it is admitted
  (what serving systems did before vLLM), first-fit in one memory arena: ``reserve="request"`` reserves
  prompt + max_new_tokens, ``reserve="context"`` the model's whole context (every reservation the same
  size: no external fragmentation, but even more internal).
* **paged**: blocks of ``block_size`` slots, allocated one at a time as the sequence grows (``BlockManager``);
  when a decode step finds no free block, the newest running request is preempted (freed, requeued,
  and recomputed later).

``simulate_waste`` runs both with the same arena size and the same first-come-first-served queue, one token
per running request per step, and integrates over all steps (token-steps) where the memory goes:

* used: slots holding a token's K/V;
* reserved: reserved slots that this request will fill later (contiguous only);
* internal: allocated slots never filled: the rest of a contiguous reservation beyond the request's
  final length, or the unfilled tail of a paged sequence's last block;
* external: free memory that cannot be used: the request at the head of the queue does not fit in any
  free hole although the free total is large enough (fragmentation *between* allocations).

``waste = (reserved + internal + external) / (used + reserved + internal + external)``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from course_lib.perf.workload import Request

from .allocator import OutOfBlocks
from .manager import BlockManager, blocks_needed


class ContiguousArena:
    """First-fit allocation of contiguous ranges in `size` slots (free holes kept sorted, merged on free)."""

    def __init__(self, size: int):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        self.size = size
        self.holes = [(0, size)]        # (start, length), sorted by start
        self.allocs: dict[int, int] = {}

    @property
    def free(self) -> int:
        return sum(n for _, n in self.holes)

    @property
    def largest_hole(self) -> int:
        return max((n for _, n in self.holes), default=0)

    def allocate(self, n: int):
        if n < 1:
            raise ValueError(f"allocation size must be >= 1, got {n}")
        for i, (start, length) in enumerate(self.holes):
            if length >= n:
                self.holes[i] = (start + n, length - n)
                if self.holes[i][1] == 0:
                    del self.holes[i]
                self.allocs[start] = n
                return start
        return None

    def release(self, start: int):
        if start not in self.allocs:
            raise ValueError(f"release of unknown range at {start} (double free?)")
        n = self.allocs.pop(start)
        self.holes.append((start, n))
        self.holes.sort()
        merged = []
        for s, length in self.holes:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.holes = merged


@dataclass
class WasteReport:
    allocator: str
    block_size: int | None
    memory_slots: int
    steps: int
    used: int = 0           # token-steps in each category
    reserved: int = 0
    internal: int = 0
    external: int = 0
    batch_sum: int = 0
    preemptions: int = 0
    finished: int = 0

    @property
    def total(self) -> int:
        return self.used + self.reserved + self.internal + self.external

    def fraction(self, name: str) -> float:
        return getattr(self, name) / self.total if self.total else 0.0

    @property
    def waste(self) -> float:
        return 1.0 - self.fraction("used")

    @property
    def mean_batch(self) -> float:
        return self.batch_sum / max(self.steps, 1)

    def row(self) -> dict:
        return {"allocator": self.allocator, "block": self.block_size or "-", "steps": self.steps,
                "mean batch": round(self.mean_batch, 1), "used %": 100 * self.fraction("used"),
                "reserved %": 100 * self.fraction("reserved"), "internal %": 100 * self.fraction("internal"),
                "external %": 100 * self.fraction("external"), "waste %": 100 * self.waste,
                "preemptions": self.preemptions}


def simulate_waste(workload: list[Request], memory_slots: int, allocator: str = "paged", block_size: int = 16,
                   reserve: str = "request", max_context: int = 2048, max_steps: int = 1_000_000) -> WasteReport:
    """Serve `workload` (Requests, all queued at time 0, FCFS; arrival times are ignored) in `memory_slots`
    token slots of KV memory, and account where the memory went (see the module docstring)."""
    if allocator not in ("paged", "contiguous"):
        raise ValueError(f"allocator must be 'paged' or 'contiguous', got {allocator!r}")
    if reserve not in ("request", "context"):
        raise ValueError(f"reserve must be 'request' or 'context', got {reserve!r}")
    if not workload:
        raise ValueError("workload is empty")
    if not all(isinstance(r, Request) for r in workload):
        raise TypeError("workload must hold course_lib.perf.workload.Request objects")
    paged = allocator == "paged"
    if paged:
        mgr = BlockManager(memory_slots // block_size, block_size)
        capacity = mgr.num_blocks * block_size
    else:
        arena = ContiguousArena(memory_slots)
        capacity = memory_slots
    def need(r):  # contiguous reservation of a request
        return max_context if reserve == "context" else r.prompt_tokens + r.limit

    for r in workload:
        if not paged and need(r) < r.prompt_tokens + r.output_tokens:
            raise ValueError(f"request {r.rid} is longer ({r.prompt_tokens + r.output_tokens}) than its reservation "
                             f"({need(r)}): raise max_context")
        if (r.prompt_tokens + r.output_tokens if paged else need(r)) > capacity:
            raise ValueError(f"request {r.rid} can never fit in {capacity} slots")
    rep = WasteReport(allocator if paged else f"contiguous ({reserve})", block_size if paged else None, capacity, 0)
    waiting = deque((r, 0) for r in workload)      # (request, tokens generated before a preemption)
    running: list = []                             # [request, generated, handle] in admission order
    while (waiting or running) and rep.steps < max_steps:
        # admit from the head of the queue while it fits
        blocked_free = 0
        while waiting:
            r, done = waiting[0]
            if paged:
                length = r.prompt_tokens + done
                try:
                    mgr.add_sequence(r.rid, [0] * length)
                except OutOfBlocks:
                    break
                handle = r.rid
            else:
                handle = arena.allocate(need(r))
                if handle is None:
                    if arena.free >= need(r):
                        blocked_free = arena.free          # enough in total, but no hole big enough
                    break
            waiting.popleft()
            running.append([r, done, handle])
        # one decode step for every running request
        i = 0
        while i < len(running):
            r, done, handle = running[i]
            if paged:
                try:
                    mgr.append(r.rid, 0)
                except OutOfBlocks:                        # preempt the newest request (recompute later)
                    victim = running.pop()
                    mgr.free(victim[0].rid)
                    waiting.appendleft((victim[0], victim[1]))
                    rep.preemptions += 1
                    continue
            running[i][1] += 1
            i += 1
        # account this step
        rep.steps += 1
        rep.batch_sum += len(running)
        for r, done, handle in running:
            length, final = r.prompt_tokens + done, r.prompt_tokens + r.output_tokens
            rep.used += length
            if paged:
                rep.internal += blocks_needed(length, block_size) * block_size - length
            else:
                rep.reserved += final - length
                rep.internal += need(r) - final
        rep.external += blocked_free
        # retire finished requests
        still = []
        for item in running:
            r, done, handle = item
            if done >= r.output_tokens:
                mgr.free(r.rid) if paged else arena.release(handle)
                rep.finished += 1
            else:
                still.append(item)
        running = still
    return rep
