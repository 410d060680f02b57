"""The engine's scheduler: which requests run in the next step (the policy half of ``Engine.step``).

The rule is not written here: each ``schedule()`` shows the engine's state to a **policy**, the same hook the
simulator calls (``policies.fcfs_schedule`` by default, the one Lab 09 asks you to write):

    decision = policy(waiting, running, free_blocks, block_size, max_batch)      # SeqViews in, Decision out

and carries the decision out on the ``PagedCache``:

1. **Preempt** what the policy names: the blocks are freed and the request goes back to the head of the
   waiting queue (older ones first). When it is admitted again, its prompt *and the tokens it already
   generated* are prefilled again (recompute), so nothing is lost and greedy output is unchanged.
2. **Reserve decode slots.** Every running request whose prompt is done feeds its last sampled token this
   step, so it needs one KV slot (a new block when its last block is full). A policy that leaves too few
   free blocks for them is an error, named.
3. **Admit** what the policy admits (a prefix of the waiting queue: first come, first served), booking each
   prompt's blocks.
4. **Prefill** the admitted prompts, up to ``max_prefill_tokens`` prompt tokens per step (a longer prompt is
   prefilled in chunks over several steps), grouped into forwards of similar lengths.

The engine's default policy is ``fcfs_schedule`` with a small watermark of blocks kept free at admission (vLLM's
``watermark``): vLLM's default rule, simplified. It only books memory in the engine's ``PagedCache``
(``add_sequence``, ``append``, ``free``); the forwards and the sampling are the engine's.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import partial

from course_lib.paged import PagedCache, blocks_needed

from .policies import Decision, SeqView, fcfs_schedule
from .request import EngineRequest

__all__ = ["Scheduler", "StepPlan", "PolicyError"]


class PolicyError(RuntimeError):
    """The scheduling policy returned a decision the engine cannot carry out (names the rule it broke)."""


@dataclass
class StepPlan:
    """What one step runs: the decoding requests (one token each, their slot already reserved) and the
    prefill forwards, each a list of (request, first position, tokens to prefill)."""
    decode: list
    prefill_groups: list


class Scheduler:
    """FCFS continuous batching over a PagedCache: waiting queue, running list, admission, preemption."""

    def __init__(self, cache: PagedCache, max_batch: int, max_prefill_tokens: int, watermark_blocks: int,
                 policy=None):
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable(waiting, running, free_blocks, block_size, max_batch) -> "
                            f"Decision (e.g. serving.fcfs_schedule), got {type(policy).__name__}")
        self.cache = cache
        self.max_batch, self.max_prefill_tokens, self.watermark_blocks = max_batch, max_prefill_tokens, watermark_blocks
        self.policy = policy if policy is not None else partial(fcfs_schedule, watermark=watermark_blocks)
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

    def _views(self) -> tuple[list[SeqView], list[SeqView]]:
        """What the policy sees: waiting requests (no blocks; the tokens to prefill at admission) and running
        ones (blocks held; the tokens to hold after this step: one more while decoding, the booked prompt
        while prefilling)."""
        m = self.manager
        waiting = [SeqView(r.id, r.trace.start, 0, len(r.tokens)) for r in self.waiting]
        running = [SeqView(r.id, r.trace.start, len(m.block_table(r.id)),
                           m.num_tokens(r.id) + (0 if r.prefilling else 1)) for r in self.running]
        return waiting, running

    def _decide(self) -> Decision:
        waiting, running = self._views()
        d = self.policy(waiting, running, self.manager.num_free_blocks, self.manager.block_size, self.max_batch)
        if not isinstance(d, Decision):
            raise PolicyError(f"the policy must return a Decision, got {type(d).__name__}")
        run_ids, wait_ids = [v.rid for v in running], [v.rid for v in waiting]
        unknown = set(d.preempt) - set(run_ids)
        if unknown:
            raise PolicyError(f"the policy preempts requests that are not running: {sorted(unknown)}")
        if list(d.admit) != wait_ids[:len(d.admit)]:
            raise PolicyError(f"the policy admitted {list(d.admit)} but the head of the waiting queue is "
                              f"{wait_ids[:max(1, len(d.admit))]} (first come, first served)")
        if len(running) - len(set(d.preempt)) + len(d.admit) > self.max_batch:
            raise PolicyError(f"the policy's batch exceeds max_batch={self.max_batch}")
        return d

    def _admit(self, n: int | None = None):
        """Book the prompts of the first `n` waiting requests (None: as many as the policy admits now) and
        move them to the running batch."""
        if n is None:
            n = len(self._decide().admit)
        for _ in range(n):
            req = self.waiting[0]
            toks = req.tokens
            if blocks_needed(len(toks), self.manager.block_size) > self.manager.num_free_blocks:
                raise PolicyError(f"the policy admitted request {req.id} ({len(toks)} tokens) without the "
                                  f"blocks for its prompt ({self.manager.num_free_blocks} free)")
            self.cache.add_sequence(req.id, toks)                   # no prefix caching here: all to compute
            self.waiting.popleft()
            req.prefill_end = len(toks)
            self.running.append(req)

    def schedule(self) -> StepPlan:
        """Ask the policy, carry out its decision, and say what the step runs (see the module docstring)."""
        d = self._decide()
        for r in reversed([r for r in self.running if r.id in set(d.preempt)]):
            self.preempt(r)                               # newest first: the older ends up at the queue's head
        rows = [r for r in self.running if not r.prefilling]
        need = sum(self.manager.blocks_needed(r.id, 1) for r in rows)
        if need > self.manager.num_free_blocks:
            raise PolicyError(f"after the policy's preemptions the {len(rows)} decoding requests need {need} "
                              f"blocks for their next token and {self.manager.num_free_blocks} are free")
        self.cache.append([r.id for r in rows], [r.tokens[r.computed] for r in rows])
        self._admit(len(d.admit))
        self.max_running_seen = max(self.max_running_seen, len(self.running))
        pre, budget = [], self.max_prefill_tokens       # FCFS within the token budget (the last may be a chunk)
        for r in self.running:
            if r.prefilling and budget > 0:
                n = min(r.prefill_end - r.computed, budget)
                pre.append((r, r.computed, n))
                budget -= n
        return StepPlan(rows, prefill_groups(pre))


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
