"""A discrete-event simulator of an LLM server: requests arrive, a policy batches them, steps cost time.

    from course_lib.serving import make_workload, simulate, ContinuousBatching, StepCostModel
    reqs = make_workload(300, rate=10.0, seed=0)
    res = simulate(reqs, ContinuousBatching(max_batch=64), cost=StepCostModel.from_roofline("A100-80GB", "llama-2-7b"),
                   num_blocks=2000, block_size=16)
    res.summary(ttft_slo=1.0, tpot_slo=0.1)        # course_lib.perf.metrics.summarize + the step statistics

Why simulate? A real engine on a laptop CPU is far too slow to show what happens at 20 requests/s on a
GPU. What decides serving behaviour is (1) when requests arrive, (2) how long one engine step takes as a
function of what is in the batch, and (3) the scheduling policy. The simulator keeps (1) and (3) exact
and models (2) with a small `StepCostModel`, calibrated on your machine or predicted from the roofline.

The engine's unit of work is a *step*: one forward pass over a batch. A step processes `prefill_tokens`
prompt tokens and `decode_seqs` decoding sequences (one token each) whose attention reads
`context_tokens` cached tokens in total. Time only advances by whole steps, arrivals and KV transfers, so
the result is exact for the model and deterministic for a given workload.

KV memory is counted in blocks (Module 06): a request holding c tokens of KV needs ceil(c / block_size)
blocks. A prefill of c tokens writes c KV entries and yields one token; each decode step writes the KV
of the previous token and yields the next one, so a request with p prompt and o output tokens peaks at
p + o - 1 KV tokens. A request whose peak does not fit in the whole pool is rejected up front
(ValueError), never left to deadlock.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from course_lib.kvcache import ContiguousCache
from course_lib.models import load
from course_lib.models.config import as_config
from course_lib.perf.hardware import get_gpu
from course_lib.perf.metrics import Trace, summarize
from course_lib.perf.roofline import decode_step
from course_lib.perf.timing import benchmark
from course_lib.perf.workload import Request
from course_lib.serving.policies import (ContinuousBatching, Decision, Disaggregated, DynamicBatching, SeqView,
                                         StaticBatching, blocks_needed)
from course_lib.validate import integer, number, one_of


class SchedulingError(RuntimeError):
    """A scheduler broke a rule (over-subscribed blocks, overtook the queue, ...) or the run deadlocked."""


# --- step cost ------------------------------------------------------------------------------------
@dataclass
class StepCostModel:
    """Seconds one engine step takes, given what is in the batch.

        linear  = fixed_s + per_token_s * n + per_seq_s * decode_seqs + per_context_token_s * context_tokens
        step    = overhead_s + max(linear, compute_s_per_token * n)          n = prefill_tokens + decode_seqs

    The linear part is the memory side (read the weights once per step: fixed_s; read each sequence's KV
    cache: per_context_token_s) plus per-token and per-sequence work; the max with compute_s_per_token * n
    is the roofline's compute floor (big prefills are compute-bound). A measured model (calibrate_local)
    is purely linear; a roofline model (from_roofline) uses the max.
    """
    fixed_s: float = 7e-3
    per_token_s: float = 0.0
    per_seq_s: float = 0.0
    per_context_token_s: float = 2.6e-7
    compute_s_per_token: float = 4.3e-5
    overhead_s: float = 1e-3
    source: str = "default: roughly a 7B fp16 model on an A100 (roofline)"
    samples: list = field(default_factory=list, repr=False)   # calibration measurements, if any

    def __post_init__(self):
        for name in ("fixed_s", "per_token_s", "per_seq_s", "per_context_token_s", "compute_s_per_token", "overhead_s"):
            setattr(self, name, number(getattr(self, name), name, 0))

    def step_time(self, prefill_tokens: int = 0, decode_seqs: int = 0, context_tokens: int = 0) -> float:
        """Seconds for one step (0 for an empty step)."""
        n = prefill_tokens + decode_seqs
        if n <= 0:
            return 0.0
        lin = self.fixed_s + self.per_token_s * n + self.per_seq_s * decode_seqs \
            + self.per_context_token_s * context_tokens
        return self.overhead_s + max(lin, self.compute_s_per_token * n)

    def prefill_time(self, prompt_tokens: int) -> float:
        return self.step_time(prompt_tokens, 0, prompt_tokens)

    def decode_time(self, batch: int, context: int) -> float:
        """One decode step of `batch` sequences that each hold `context` tokens of KV."""
        return self.step_time(0, batch, batch * (context + 1))

    @classmethod
    def from_roofline(cls, gpu_name, model_config, dtype="fp16", overhead_s: float = 1e-3) -> "StepCostModel":
        """Predict the costs from Module 01's hardware table and roofline: the coefficients of the course's
        one decode-step model, ``course_lib.perf.decode_step``.

        A step reads every weight once (fixed_s = weight bytes / bandwidth) and each sequence's KV cache
        (per_context_token_s = KV bytes per token / bandwidth); it computes 2 * params FLOPs per token
        (compute_s_per_token = 2 * params / peak; attention's own FLOPs are left out). Step time =
        overhead + max(memory time, compute time), the roofline bound plus a launch overhead.
        gpu_name: a name of `course_lib.perf.gpu_names()` or a DeviceSpec; model_config: a LlamaConfig, a
        model, or a preset name ('llama-2-7b', 'tiny', ...).
        """
        dev = get_gpu(gpu_name)
        shape = as_config(getattr(model_config, "config", model_config))
        one = decode_step(shape, dev, dtype, batch=1, context=1)     # one sequence, one token of KV
        params = shape.num_parameters()
        return cls(fixed_s=one.weight_bytes / one.bandwidth, per_token_s=0.0, per_seq_s=0.0,
                   per_context_token_s=one.kv_bytes / one.bandwidth, compute_s_per_token=one.flops / one.peak,
                   overhead_s=overhead_s,
                   source=f"roofline: {shape.name or 'model'} ({params / 1e6:.1f}M params, {dtype}) on {dev.name}")

    @classmethod
    def calibrate_local(cls, model=None, batch_sizes=(1, 4, 8), context_lengths=(32, 160),
                        prefill_lengths=(32, 96, 192),
                        repeats: int = 3, device=None) -> "StepCostModel":
        """Measure step times of `model` (default: the bundled 'tiny') on this machine and fit the linear
        costs by least squares (non-negative).

        Decode: a ContiguousCache holding `context` tokens for each of `batch` rows, one token per row,
        timed `repeats` times (median), the cache cropped back between repeats. Prefill: one prompt of T
        tokens. Rows of the fit: [1, n_tokens, decode_seqs, context_tokens] -> seconds. A few seconds on a CPU.
        """
        import torch

        repeats = integer(repeats, "repeats", low=1)
        if model is None:
            model, _ = load("tiny")
        params = next(model.parameters())
        dev = params.device if device is None else torch.device(device)
        V = model.config.vocab_size
        g = torch.Generator(device=dev).manual_seed(0)      # the ids are drawn where the model runs

        def timed(fn, after=None):                  # median seconds of `repeats` calls after a warm-up
            return benchmark(fn, warmup=1, repeats=repeats, device=dev, after=after).median

        rows, ys, samples = [], [], []
        with torch.inference_mode():
            for T in prefill_lengths:
                ids = torch.randint(0, V, (1, T), generator=g, device=dev)
                t = timed(lambda: model(ids))
                rows.append([1.0, T, 0, T]); ys.append(t); samples.append(("prefill", 1, T, t))
            for B in batch_sizes:
                for C in context_lengths:
                    cache = ContiguousCache()
                    model(torch.randint(0, V, (B, C), generator=g, device=dev), cache=cache)
                    tok = torch.randint(0, V, (B, 1), generator=g, device=dev)

                    t = timed(lambda: model(tok, cache=cache), after=lambda: cache.crop(C))
                    rows.append([1.0, B, B, B * (C + 1)]); ys.append(t); samples.append(("decode", B, C, t))
        coef = _nnls(np.array(rows, dtype=float), np.array(ys, dtype=float))
        name = getattr(model, "name", None) or type(model).__name__
        return cls(fixed_s=coef[0], per_token_s=coef[1], per_seq_s=coef[2], per_context_token_s=coef[3],
                   compute_s_per_token=0.0, overhead_s=0.0, source=f"calibrated: {name} on {dev}", samples=samples)


def _nnls(A, y):
    """Least squares with coefficients >= 0: refit without the most negative one until none is negative."""
    active = list(range(A.shape[1]))
    coef = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


# --- records ----------------------------------------------------------------------------------------
# Each request's record is the course's one timeline, ``course_lib.perf.metrics.Trace`` (start = arrival,
# one event per token at its simulated time, finish, preemptions); what it was doing when (its segments
# (state, t0, t1), state in waiting / prefill / decode / preempted / transfer / padding) is in
# ``SimResult.segments[rid]``.


@dataclass
class StepLog:
    worker: int
    t0: float
    t1: float
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    blocks_used: int | None
    batch: int
    useful_tokens: int         # tokens that belong to a real request (padding excluded)


@dataclass
class SimResult:
    """The outcome of `simulate`: per-request records (``Trace``s, in rid order), the step log, admissions
    (t, rid, worker, kind in new/resume/transfer), preemptions (t, rid, worker), each request's state
    segments {rid: [(state, t0, t1)]}, and, with strict=False, the rule violations the scheduler committed."""
    policy: str
    records: list
    steps: list
    admissions: list
    preemptions: list
    num_blocks: int
    block_size: int
    cost: StepCostModel
    segments: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)
    swaps: list = field(default_factory=list)   # preemption="swap": (t, rid, worker, "out"/"in", kv tokens, seconds)

    def record(self, rid) -> Trace:
        return self._by_rid()[rid]

    def _by_rid(self):
        if not hasattr(self, "_index"):
            self._index = {r.rid: r for r in self.records}
        return self._index

    def summary(self, ttft_slo: float | None = None, tpot_slo: float | None = None) -> dict:
        """``course_lib.perf.metrics.summarize`` of the records (percentiles, throughput, goodput with both
        SLOs) plus what only a simulation knows: policy, preemptions, padding_waste (share of the computed
        token slots that were padding) and mean_batch (time-weighted requests per step)."""
        out = {"policy": self.policy, **summarize(self.records, ttft_slo=ttft_slo, tpot_slo=tpot_slo)}
        out["preemptions"] = len(self.preemptions)
        computed = sum(s.prefill_tokens + s.decode_seqs for s in self.steps)
        useful = sum(s.useful_tokens for s in self.steps)
        out["padding_waste"] = 1 - useful / computed if computed else 0.0
        busy = sum(s.t1 - s.t0 for s in self.steps)
        out["mean_batch"] = sum((s.t1 - s.t0) * s.batch for s in self.steps) / busy if busy else 0.0
        return out


# --- the engine's workers ----------------------------------------------------------------------------
class _SimSequence:
    """The simulated engine's live sequence: what ``serving.request.EngineRequest`` is to the real engine,
    counted in tokens and blocks only (no token ids, no generator, no model). The workers mutate it every
    step; its ``Trace`` (``rec``) and timeline ``segments`` are what a run returns, and a scheduler sees it
    only as a frozen ``policies.SeqView``, so it stays private to the simulator."""
    __slots__ = ("req", "rec", "kv", "target", "emitted", "blocks", "remote_kv", "segments", "state", "since",
                 "host_blocks")

    def __init__(self, req, rec, segments):
        self.req, self.rec, self.segments = req, rec, segments
        self.state, self.since = None, 0.0
        self.kv = 0                 # tokens whose KV is stored
        self.target = req.prompt_tokens   # tokens to prefill (0 once decoding)
        self.emitted = 0
        self.blocks = 0
        self.remote_kv = False      # KV computed elsewhere (disaggregation): admission costs no prefill
        self.host_blocks = 0        # blocks of KV swapped out to host memory (preemption="swap")

    def set_state(self, state, t):
        """Close the current segment at t and start `state` (None: done)."""
        if self.state is not None and t > self.since:
            self.segments.append((self.state, self.since, t))
        self.state, self.since = state, t

    def need(self) -> int:
        """Tokens of KV room needed after the next step: the whole prefill, or the context + 1 token."""
        return self.target if self.target and not self.remote_kv else self.kv + 1


class _IterWorker:
    """One engine doing iteration-level batching (role 'mixed'), or prefill only (role 'prefill')."""

    def __init__(self, sim, wid, role, policy, max_batch, token_budget, scheduler):
        self.sim, self.wid, self.role = sim, wid, role
        self.max_batch, self.budget, self.scheduler = max_batch, token_budget, scheduler
        self.waiting: deque = deque()
        self.running: list = []
        self.free = sim.num_blocks
        self.host_free = sim.host_blocks       # host (CPU) memory for swapped-out KV, in blocks
        self.busy_until = None
        self.pending = None

    def load(self):
        return len(self.waiting) + len(self.running)

    def wakeup(self):
        return None

    def _violate(self, msg):
        if self.sim.strict:
            raise SchedulingError(msg)
        self.sim.violations.append(msg)

    def try_start(self, now):
        if not self.waiting and not self.running:
            return
        bs = self.sim.block_size
        wv = [SeqView(s.req.rid, s.req.arrival_s, s.blocks, s.need()) for s in self.waiting]
        rv = [SeqView(s.req.rid, s.req.arrival_s, s.blocks, s.need()) for s in self.running]
        d = self.scheduler(wv, rv, self.free, bs, self.max_batch)
        if not isinstance(d, Decision):
            raise SchedulingError(f"the scheduler must return a Decision, got {type(d).__name__}")
        # preemptions: free the blocks, back to the head of the queue (older ones first)
        pre = set(d.preempt)
        by_rid = {s.req.rid: s for s in self.running}
        unknown = pre - set(by_rid)
        if unknown:
            self._violate(f"t={now:.4f}: preempt names requests that are not running: {sorted(unknown)}")
        out = [s for s in self.running if s.req.rid in pre]
        self.running = [s for s in self.running if s.req.rid not in pre]
        swap_s = 0.0            # seconds of KV copies over the host link this step waits for (swap mode)
        for s in reversed(out):
            self.free += s.blocks
            if self.sim.preemption == "swap" and s.kv > 0 and s.blocks <= self.host_free:
                # swap out: the blocks go to host memory as they are; the KV (and any prefill progress)
                # is kept, so resuming costs a copy back instead of a prefill
                self.host_free -= s.blocks
                s.host_blocks, s.blocks = s.blocks, 0
                swap_s += self._swap(now, s, "out")
            else:     # recompute (or the host pool is full, or no KV yet): drop the KV, prefill it again later
                s.blocks, s.kv, s.remote_kv = 0, 0, False
                s.target = s.req.prompt_tokens + s.emitted     # recompute prompt + generated tokens
            s.rec.preemptions += 1
            s.set_state("preempted", now)
            self.sim.preemptions.append((now, s.req.rid, self.wid))
            self.waiting.appendleft(s)
        # growth of the running requests
        for s in self.running:
            nb = blocks_needed(s.need(), bs)
            if nb > s.blocks:
                self.free -= nb - s.blocks
                s.blocks = nb
        # admission
        wid_list = [s.req.rid for s in self.waiting]
        admit = list(d.admit)
        if admit != wid_list[:len(admit)]:
            self._violate(f"t={now:.4f}: admitted {admit} but the head of the waiting queue is "
                          f"{wid_list[:max(1, len(admit))]} (first come, first served)")
        wmap = {s.req.rid: s for s in self.waiting}
        for rid in admit:
            s = wmap.pop(rid, None)
            if s is None:
                self._violate(f"t={now:.4f}: admitted request {rid} is not waiting")
                continue
            self.waiting.remove(s)
            nb = blocks_needed(s.need(), bs)
            self.free -= nb
            s.blocks = nb
            kind = "transfer" if s.remote_kv else ("resume" if s.rec.preemptions else "new")
            self.sim.admissions.append((now, s.req.rid, self.wid, kind))
            if s.host_blocks:                          # swap in: copy its KV back, carry on where it stopped
                self.host_free += s.host_blocks
                s.host_blocks = 0
                swap_s += self._swap(now, s, "in")
                s.set_state("prefill" if s.target else "decode", now)
            elif s.remote_kv:
                s.remote_kv = False
                s.target = 0
                s.set_state("decode", now)
            else:
                s.set_state("prefill", now)
            self.running.append(s)
        if len(self.running) > self.max_batch:
            self._violate(f"t={now:.4f}: {len(self.running)} running requests > max_batch={self.max_batch}")
        if self.free < 0:
            self._violate(f"t={now:.4f}: KV blocks over-subscribed: {self.sim.num_blocks - self.free} used of "
                          f"{self.sim.num_blocks}")
        # build the step: decodes first, then prefill chunks within the token budget
        budget = math.inf if self.budget is None else self.budget
        decoders, chunks, ctx = [], [], 0
        for s in self.running:
            if s.target == 0 and budget >= 1:
                decoders.append(s)
                budget -= 1
                ctx += s.kv + 1
        ptoks = 0
        for s in self.running:
            if s.target and budget >= 1:
                c = min(s.target - s.kv, budget)
                chunks.append((s, c))
                budget -= c
                ptoks += c
                ctx += s.kv + c
        if not decoders and not chunks:
            if swap_s > 0:            # only a swap-out happened: the worker is busy copying
                self.busy_until, self.pending = now + swap_s, ([], [])
            return
        # the step waits for this round's swaps (vLLM V0 issues the block copies before the forward pass)
        dt = self.sim.cost.step_time(ptoks, len(decoders), ctx) + swap_s
        self.busy_until = now + dt
        self.pending = (decoders, chunks)
        self.sim.steps.append(StepLog(self.wid, now, now + dt, ptoks, len(decoders), ctx,
                                      self.sim.num_blocks - self.free, len(self.running), ptoks + len(decoders)))

    def _swap(self, now, s, direction) -> float:
        """Seconds to copy s's KV (s.kv tokens) over the host link; logged in sim.swaps."""
        sec = self.sim.swap_latency_s + self.sim.swap_s_per_token * s.kv
        self.sim.swaps.append((now, s.req.rid, self.wid, direction, s.kv, sec))
        return sec

    def complete(self, now):
        decoders, chunks = self.pending
        self.pending, self.busy_until = None, None
        emitters = []
        for s in decoders:
            s.kv += 1
            emitters.append(s)
        for s, c in chunks:
            s.kv += c
            if s.kv == s.target:
                s.target = 0
                emitters.append(s)
                s.set_state("decode", now)
        leaving = []
        for s in emitters:
            s.emitted += 1
            s.rec.add_token(now)
            if s.emitted == s.req.output_tokens:
                leaving.append(s)
                self.sim.finish(s, now)
            elif self.role == "prefill":             # its prefill is done: ship the KV to a decode worker
                leaving.append(s)
                self.sim.transfer(s, now)
        if leaving:
            gone = {id(s) for s in leaving}
            for s in leaving:
                self.free += s.blocks
                s.blocks = 0
            self.running = [s for s in self.running if id(s) not in gone]


class _BatchWorker:
    """Request-level batching: form a batch, run it to the end (padded prompts, padded decode steps)."""

    def __init__(self, sim, wid, max_batch, timeout_s):
        self.sim, self.wid, self.max_batch, self.timeout = sim, wid, max_batch, timeout_s
        self.waiting: deque = deque()
        self.busy_until = None
        self.pending = None

    def load(self):
        return len(self.waiting)

    def wakeup(self):
        if self.timeout is None or not self.waiting or self.busy_until is not None:
            return None
        return self.waiting[0].req.arrival_s + self.timeout

    def try_start(self, now):
        if not self.waiting:
            return
        if self.timeout is not None and len(self.waiting) < self.max_batch \
                and now < self.waiting[0].req.arrival_s + self.timeout:
            return
        batch = [self.waiting.popleft() for _ in range(min(self.max_batch, len(self.waiting)))]
        B = len(batch)
        P = max(s.req.prompt_tokens for s in batch)
        O = max(s.req.output_tokens for s in batch)
        cost, t = self.sim.cost, now
        for s in batch:
            self.sim.admissions.append((now, s.req.rid, self.wid, "new"))
            s.set_state("prefill", now)
        dt = cost.step_time(B * P, 0, B * P)
        useful = sum(s.req.prompt_tokens for s in batch)
        self.sim.steps.append(StepLog(self.wid, t, t + dt, B * P, 0, B * P, None, B, useful))
        t += dt
        for k in range(1, O + 1):               # token k of every row is ready at time t
            if k > 1:
                dt = cost.step_time(0, B, B * (P + k - 1))
                alive = sum(1 for s in batch if s.req.output_tokens >= k)
                self.sim.steps.append(StepLog(self.wid, t, t + dt, 0, B, B * (P + k - 1), None, B, alive))
                t += dt
            for s in batch:
                if k <= s.req.output_tokens:
                    s.rec.add_token(t)
                    if k == 1:
                        s.set_state("decode", t)
                    if k == s.req.output_tokens:
                        s.rec.end(t)
                        s.set_state("padding", t)
        self.busy_until, self.pending = t, batch

    def complete(self, now):
        for s in self.pending:
            self.sim.finish(s, s.rec.finish, at=now)
        self.pending, self.busy_until = None, None


# --- the event loop ------------------------------------------------------------------------------------
class _Sim:
    def __init__(self, cost, num_blocks, block_size, strict, preemption="recompute", host_blocks=0,
                 swap_s_per_token=0.0, swap_latency_s=0.0):
        self.cost, self.num_blocks, self.block_size, self.strict = cost, num_blocks, block_size, strict
        self.preemption, self.host_blocks = preemption, host_blocks
        self.swap_s_per_token, self.swap_latency_s = swap_s_per_token, swap_latency_s
        self.steps, self.admissions, self.preemptions, self.violations, self.swaps = [], [], [], [], []
        self.done = 0
        self.transfers = []          # (ready_t, seq)
        self.decode_pool = None
        self.transfer_s_per_token = 0.0
        self.transfer_latency_s = 0.0

    def finish(self, s, t, at=None):
        s.rec.end(t)
        s.set_state(None, t if at is None else at)
        self.done += 1

    def transfer(self, s, now):
        ready = now + self.transfer_latency_s + self.transfer_s_per_token * s.kv
        s.set_state("transfer", now)
        self.transfers.append((ready, s))


def simulate(requests, policy, cost: StepCostModel | None = None, num_blocks: int = 2048, block_size: int = 16,
             strict: bool = True, max_steps: int = 2_000_000, preemption: str = "recompute",
             host_blocks: int | None = None, swap_s_per_token: float = 0.0, swap_latency_s: float = 0.0) -> SimResult:
    """Run `requests` (Request objects, any order) through `policy`; returns a SimResult.

    cost: a StepCostModel (default: roughly a 7B model on an A100). num_blocks, block_size: the KV pool of
    each worker. strict: raise SchedulingError when the scheduler breaks a rule (over-subscribes blocks,
    overtakes the queue, exceeds max_batch); strict=False records it in result.violations and carries on
    (what Lab 09's tests use to show you the mistake). A request whose peak KV (prompt + output - 1
    tokens) needs more blocks than num_blocks raises ValueError up front.

    preemption: what an iteration-level worker does with a preempted request's KV. "recompute" (vLLM V1's
    only mode): drop it and prefill prompt + generated tokens again later. "swap" (vLLM V0's
    ``--preemption-mode swap``, PagedAttention's second option): copy its blocks to a host pool of
    `host_blocks` blocks per worker, and back when it resumes; each copy costs swap_latency_s +
    swap_s_per_token * (its KV tokens) seconds (KV bytes per token / the host link's bandwidth), added to
    the step that issues it. A victim that does not fit in the host pool's free blocks is recomputed.
    The copies are logged in ``result.swaps``.
    """
    num_blocks, block_size = integer(num_blocks, "num_blocks", low=1), integer(block_size, "block_size", low=1)
    preemption = one_of(preemption, "preemption", ["recompute", "swap"])
    if preemption == "swap":
        if host_blocks is None:
            raise ValueError("host_blocks must be a positive integer (the host pool for swapped KV, in blocks) "
                             "when preemption='swap', got None")
        host_blocks = integer(host_blocks, "host_blocks", low=1)
    else:
        host_blocks = 0 if host_blocks is None else integer(host_blocks, "host_blocks", low=0)
    swap_s_per_token = number(swap_s_per_token, "swap_s_per_token", 0)
    swap_latency_s = number(swap_latency_s, "swap_latency_s", 0)
    cost = StepCostModel() if cost is None else cost
    if not isinstance(cost, StepCostModel):
        raise TypeError(f"cost must be a StepCostModel, got {type(cost).__name__}")
    reqs = list(requests)
    if not reqs:
        raise ValueError("requests must not be empty")
    for r in reqs:
        if not isinstance(r, Request):
            raise TypeError(f"requests must hold Request objects, got {type(r).__name__}")
        peak = blocks_needed(r.prompt_tokens + r.output_tokens - 1, block_size)
        if peak > num_blocks:
            raise ValueError(f"request {r.rid} (prompt_tokens={r.prompt_tokens}, output_tokens={r.output_tokens}) "
                             f"needs {peak} KV blocks at its longest but num_blocks={num_blocks}: it could never "
                             f"be served (raise num_blocks or shorten the request)")
    if len({r.rid for r in reqs}) != len(reqs):
        raise ValueError("requests must have distinct rid")
    reqs.sort(key=lambda r: (r.arrival_s, r.rid))
    sim = _Sim(cost, num_blocks, block_size, strict, preemption, host_blocks, swap_s_per_token, swap_latency_s)
    if isinstance(policy, StaticBatching):
        entry = [_BatchWorker(sim, 0, policy.max_batch, policy.timeout_s)]
    elif isinstance(policy, DynamicBatching):
        entry = [_BatchWorker(sim, 0, policy.max_batch, None)]
    elif isinstance(policy, ContinuousBatching):
        entry = [_IterWorker(sim, 0, "mixed", policy, policy.max_batch, policy.token_budget, policy.scheduler)]
    elif isinstance(policy, Disaggregated):
        entry = [_IterWorker(sim, i, "prefill", policy, policy.max_batch, policy.prefill_token_budget, policy.scheduler)
                 for i in range(policy.prefill_workers)]
        sim.decode_pool = [_IterWorker(sim, policy.prefill_workers + j, "mixed", policy, policy.max_batch, None,
                                       policy.scheduler) for j in range(policy.decode_workers)]
        sim.transfer_s_per_token = policy.transfer_s_per_token
        sim.transfer_latency_s = policy.transfer_latency_s
    else:
        raise TypeError(f"policy must be StaticBatching, DynamicBatching, ContinuousBatching (ChunkedPrefill) or "
                        f"Disaggregated, got {type(policy).__name__}")
    workers = entry + (sim.decode_pool or [])
    records = {r.rid: Trace(r.arrival_s, prompt_tokens=r.prompt_tokens, rid=r.rid, max_new_tokens=r.output_tokens)
               for r in reqs}
    segments = {r.rid: [] for r in reqs}
    i, t, n, steps = 0, 0.0, len(reqs), 0
    while sim.done < n:
        for w in workers:                                   # 1. steps that end now
            if w.busy_until is not None and w.busy_until <= t:
                w.complete(t)
        while i < n and reqs[i].arrival_s <= t:             # 2. arrivals and finished transfers
            s = _SimSequence(reqs[i], records[reqs[i].rid], segments[reqs[i].rid])
            s.set_state("waiting", reqs[i].arrival_s)
            min(entry, key=lambda w: w.load()).waiting.append(s)
            i += 1
        if sim.transfers:
            ready = sorted((x for x in sim.transfers if x[0] <= t), key=lambda x: (x[0], x[1].req.arrival_s))
            sim.transfers = [x for x in sim.transfers if x[0] > t]
            for _, s in ready:
                s.remote_kv = True
                s.target = 0
                s.set_state("waiting", t)
                min(sim.decode_pool, key=lambda w: w.load()).waiting.append(s)
        for w in workers:                                   # 3. idle workers start a step
            if w.busy_until is None:
                w.try_start(t)
                steps += 1
        if sim.done >= n:
            break
        nxt = [w.busy_until for w in workers if w.busy_until is not None]
        nxt += [w.wakeup() for w in workers if w.wakeup() is not None]
        nxt += [x[0] for x in sim.transfers]
        if i < n:
            nxt.append(reqs[i].arrival_s)
        if not nxt:
            stuck = sum(w.load() for w in workers)
            raise SchedulingError(f"deadlock at t={t:.4f}: {stuck} requests wait and no step can start "
                                  f"(the scheduler admitted nothing while nothing runs)")
        t = max(t, min(nxt))
        if steps > max_steps:
            raise SchedulingError(f"more than max_steps={max_steps} scheduling rounds: a scheduler that never "
                                  f"makes progress?")
    ordered = [records[r.rid] for r in sorted(reqs, key=lambda r: r.rid)]
    return SimResult(getattr(policy, "name", type(policy).__name__), ordered, sim.steps, sim.admissions,
                     sim.preemptions, num_blocks, block_size, cost, segments, sim.violations, sim.swaps)


def sweep_load(make_requests, policies: dict, rates, cost=None, num_blocks: int = 2048, block_size: int = 16,
               ttft_slo=None, tpot_slo=None) -> list[dict]:
    """Simulate every policy at every offered load. make_requests(rate) -> requests; policies:
    {label: policy}. Returns rows: ``SimResult.summary(ttft_slo, tpot_slo)`` plus 'label' and 'rate'."""
    rows = []
    for rate in rates:
        reqs = make_requests(rate)
        for label, pol in policies.items():
            res = simulate(reqs, pol, cost=cost, num_blocks=num_blocks, block_size=block_size)
            row = res.summary(ttft_slo, tpot_slo)
            row.update(label=label, rate=float(rate))
            rows.append(row)
    return rows


__all__ = ["StepCostModel", "SchedulingError", "StepLog", "SimResult", "simulate", "sweep_load"]
