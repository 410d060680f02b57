"""A small real serving engine: continuous (iteration-level) batching on the paged KV cache.

    from course_lib.serving import Engine, SamplingParams
    eng = Engine(model, num_blocks=256, block_size=16, max_batch=16, max_prefill_tokens=256)
    rid = eng.add_request(prompt_ids, SamplingParams(max_new_tokens=32))   # ValueError/TypeError if unservable
    while eng.has_unfinished():
        for out in eng.step():          # StepOutput(request_id, token, finished, finish_reason)
            ...
    results = eng.generate([p1, p2, p3], SamplingParams(max_new_tokens=16))   # [Trace] in input order
    eng.abort_request(rid)              # its client left: blocks freed now, the engine forgets it

The code is split by role, as in nano-vllm: ``request.py`` (SamplingParams, the request state and its record),
``scheduler.py`` (admission, decode-slot reservation, preemption, prefill chunks and groups: which requests
run), this file (the loop, the forwards, the sampling). One ``step()``:

1. the **scheduler** books the step (``Scheduler.schedule``): decode slots for the running requests
   (preempting the newest on a shortage), FCFS admission, prefill chunks within ``max_prefill_tokens``;
2. **decode**: ONE forward for all running requests, one token each, rows of different lengths;
3. **prefill** the scheduled prompt chunks, one forward per group of similar lengths, rows right-padded;
4. **sample** each finished row with its own SamplingParams and its own ``torch.Generator``, so a seeded
   request draws the same tokens whatever else shares its batch. Stream the tokens (``step()``'s return
   value, a per-request callback, ``stream()``) and record each request's timeline (a
   ``course_lib.perf.metrics.Trace``: arrival, token times, finish).

Memory: the engine runs on Module 06's one paged KV store, ``course_lib.paged.PagedCache`` (``engine.cache``):
its ``BlockManager`` (``engine.manager``) holds the block tables and the free list, its ``KVPool`` the K/V
blocks ``[num_blocks, kv_heads, block_size, head_dim]`` per layer. The engine says which requests each
forward runs and how many new tokens each brings (``set_active(ids, num_new=...)``, rows right-padded).
The cache builds the slot mapping, block tables and context lengths once per forward on the model's
device; every layer writes its new K/V with one batched ``index_put`` and a decode step reads them in
place through the block tables with ``paged_attention`` (the Triton kernel on a GPU that Triton supports,
compute capability >= 8.0; the PyTorch gather elsewhere, a T4 included; ``backend=`` to choose), a prefill with one
gather and causal attention. Sampling stays on the device too (a
``torch.Generator`` on the model's device per request); the only host sync of a step is the
``tolist()`` of its sampled tokens.

Baselines: ``course_lib.serving.baselines``; the comparison harness: ``course_lib.serving.compare``.
"""
from __future__ import annotations

import numbers
import time

import torch

from course_lib.paged import BlockManager, KVPool, PagedCache, blocks_needed
from course_lib.perf.metrics import Trace
from course_lib.sampling import penalize_seen, sample_rows
from course_lib.validate import integer, probability

from .request import EngineRequest, SamplingParams, StepOutput, as_token_list
from .scheduler import Scheduler

__all__ = ["Engine", "sample_tokens"]


def sample_tokens(reqs, logits) -> list[int]:
    """One token per row of logits [B, V] (on the model's device), by the generate loop's rules
    (``course_lib.sampling.sample_rows``): a row's repetition penalty first (over its request's tokens so
    far), then greedy rows take the argmax, sampled rows draw with their request's own generator (on the
    same device). One host sync: the tolist()."""
    ps = [r.params for r in reqs]
    rows = [i for i, p in enumerate(ps) if p.repetition_penalty != 1]
    if rows:                                     # [len(rows), V]: the seen tokens of each penalized row
        seen = torch.zeros(len(rows), logits.shape[-1], dtype=torch.bool, device=logits.device)
        for j, i in enumerate(rows):
            seen[j, torch.tensor(reqs[i].tokens, dtype=torch.long, device=logits.device)] = True
        pen = torch.tensor([float(ps[i].repetition_penalty) for i in rows], device=logits.device)[:, None]
        logits = logits.clone()
        logits[rows] = penalize_seen(logits[rows], seen, pen)          # in float32, as the generate loop
    return sample_rows(logits, [p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps],
                       [r.generator for r in reqs]).tolist()


class Engine:
    """Continuous batching over a paged KV cache (see the module docstring).

    model: a course model (``course_lib.models.load``). num_blocks x block_size: the KV token slots.
    max_batch: most requests running at once. max_prefill_tokens: prompt tokens prefilled per step
    (longer prompts are chunked). watermark: fraction of the blocks kept free when admitting.
    backend: the decode attention (``course_lib.paged.paged_attention``): "auto" (the Triton kernel on a
    GPU that Triton supports, the vectorized PyTorch gather elsewhere: a CPU, a T4), "torch", "triton" or
    "reference"; ``decode_backend`` says which one runs. policy: the scheduling rule, the hook the simulator
    calls (``policy(waiting, running, free_blocks, block_size, max_batch) -> Decision``, Lab 09's); default
    ``fcfs_schedule`` with the watermark.
    """

    def __init__(self, model, num_blocks: int = 256, block_size: int = 16, max_batch: int = 16,
                 max_prefill_tokens: int = 512, watermark: float = 0.01, backend: str = "auto", policy=None):
        num_blocks, block_size = integer(num_blocks, "num_blocks", low=1), integer(block_size, "block_size", low=1)
        max_batch = integer(max_batch, "max_batch", low=1)
        max_prefill_tokens = integer(max_prefill_tokens, "max_prefill_tokens", low=1)
        watermark = probability(watermark, "watermark", one=False)   # a fraction of the blocks kept free
        self.model = model
        cfg = model.config
        self.context = cfg.max_position_embeddings
        self.vocab_size = cfg.vocab_size
        self.block_size, self.num_blocks, self.max_batch = block_size, num_blocks, max_batch
        self.max_prefill_tokens = max_prefill_tokens
        # the one paged KV store (Module 06): block tables in its BlockManager, K/V in its KVPool
        self.cache = PagedCache(BlockManager(num_blocks, block_size), KVPool.for_model(model, num_blocks, block_size),
                                backend=backend)
        self.scheduler = Scheduler(self.cache, max_batch, max_prefill_tokens, int(watermark * num_blocks), policy)
        self.requests: dict[int, EngineRequest] = {}
        self._next_id = 0
        self.num_steps = 0
        self.num_forwards = 0
        self.num_aborted = 0

    # --- requests ----------------------------------------------------------------------------------
    def add_request(self, prompt_ids, params: SamplingParams | None = None, arrival_time: float | None = None,
                    callback=None) -> int:
        """Queue a request; returns its id. ValueError/TypeError (and nothing changes) if it cannot be served.

        callback(step_output) is called for each of its tokens as it is sampled (streaming).
        arrival_time: its arrival (perf_counter seconds; default now), for the latency numbers.
        """
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if callback is not None and not callable(callback):
            raise TypeError("callback must be callable(StepOutput) or None")
        ids = as_token_list(prompt_ids, self.vocab_size)
        # positions 0 .. P + N - 2 are fed to the model (the last generated token never is)
        span = len(ids) + params.max_new_tokens - 1
        if span > self.context:
            raise ValueError(f"prompt of {len(ids)} tokens + max_new_tokens={params.max_new_tokens} needs {span} "
                             f"positions, past the model's context of {self.context}")
        blocks = blocks_needed(span, self.block_size)
        if blocks > self.num_blocks:
            raise ValueError(f"the request needs {blocks} KV blocks of {self.block_size} tokens but the whole pool "
                             f"has {self.num_blocks}: it could never finish")
        rid = self._next_id
        self._next_id += 1
        req = EngineRequest(rid, ids, params, time.perf_counter() if arrival_time is None else arrival_time,
                            callback, device=self.model.device, cache=self.cache)
        self.requests[rid] = req
        self.scheduler.add(req)
        return rid

    def abort_request(self, request_id: int) -> Trace | None:
        """Stop a request that has not finished (vLLM's ``abort_request``: the server calls it when the
        client disconnects): it leaves the scheduler, its KV blocks go back to the pool at once, its trace
        ends with finish_reason "abort" and the engine forgets it (no further token, no callback).
        Returns its record (its Trace), or None when the id is unknown or the request already finished
        (nothing changes: an abort racing the last token is harmless). Call it between steps, from the
        thread that runs them (the engine is not thread-safe)."""
        if isinstance(request_id, bool) or not isinstance(request_id, numbers.Integral):
            raise TypeError(f"request_id must be an int, got {request_id!r}")
        req = self.requests.get(int(request_id))
        if req is None or req.trace.finished:
            return None
        self.scheduler.abort(req)
        req.trace.end(time.perf_counter(), "abort")
        del self.requests[req.id]
        self.num_aborted += 1
        return req.trace

    @property
    def manager(self) -> BlockManager:
        """The block bookkeeping (``self.cache.manager``): the one source of block tables."""
        return self.cache.manager

    @property
    def backend(self) -> str:
        return self.cache.backend

    @property
    def decode_backend(self) -> str:
        """What the decode attention runs on the model's device ("auto" resolved): "triton", "torch", ..."""
        return self.cache.decode_backend

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def running(self):
        return self.scheduler.running

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def output(self, request_id: int) -> Trace:
        """A request's record (its Trace), the one the scheduler updates as it runs."""
        return self.requests[request_id].trace

    def pop_finished(self) -> list[Trace]:
        """Forget finished requests (a long-running server would), returning their records."""
        done = [r.trace for r in self.requests.values() if r.trace.finished]
        for tr in done:
            del self.requests[tr.rid]
        return done

    # --- forwards ----------------------------------------------------------------------------------
    def _forward(self, reqs, counts, tokens_per_row, rows=None):
        """One forward over rows (req, n new tokens, those tokens), right-padded to the longest; the cache
        places them after each request's computed tokens. Returns the last logits [len(rows), V] of the
        rows asked for (default: all)."""
        dev = self.model.device
        T = max(counts)
        # host -> device copies before the forward is queued (a copy waits for the stream; it is idle here)
        ids = torch.tensor([list(t) + [0] * (T - len(t)) for t in tokens_per_row], dtype=torch.long, device=dev)
        pick = None
        if T > 1 or rows is not None:
            rows = range(len(reqs)) if rows is None else rows
            pick = torch.tensor([list(rows), [counts[i] - 1 for i in rows]], dtype=torch.long, device=dev)
        self.cache.set_active([r.id for r in reqs], num_new=counts)
        logits = self.model(ids, cache=self.cache)               # positions from cache.positions(T)
        self.num_forwards += 1
        return logits[:, 0] if pick is None else logits[pick[0], pick[1]]      # [rows, V]

    def _emit(self, req: EngineRequest, token: int, now: float) -> StepOutput:
        reason = req.emit(token, now)
        if reason is not None:
            self.scheduler.finish(req)
        so = StepOutput(req.id, token, reason is not None, reason)
        if req.callback is not None:
            req.callback(so)
        return so

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """One iteration: the scheduler books it (decode slots, preemption, admission, prefill chunks),
        then decode, prefill, sample.

        Returns the tokens sampled in this step (one per request that produced one). Runs under
        ``torch.inference_mode`` (no autograd bookkeeping: it matters for small forwards on a CPU)."""
        self.num_steps += 1
        plan = self.scheduler.schedule()
        results = []
        if plan.decode:
            decode = plan.decode
            logits = self._forward(decode, [1] * len(decode), [[r.tokens[r.computed]] for r in decode])
            toks = sample_tokens(decode, logits)
            now = time.perf_counter()
            results += [self._emit(r, t, now) for r, t in zip(decode, toks)]
        for group in plan.prefill_groups:
            reqs = [r for r, _, _ in group]
            done = [i for i, (r, s, n) in enumerate(group) if s + n >= r.prefill_end]   # prompts that end here
            logits = self._forward(reqs, [n for _, _, n in group], [r.tokens[s:s + n] for r, s, n in group],
                                   rows=done)
            if done:
                toks = sample_tokens([reqs[i] for i in done], logits)
                now = time.perf_counter()
                results += [self._emit(reqs[i], t, now) for i, t in zip(done, toks)]
        return results

    # --- conveniences ------------------------------------------------------------------------------
    def _add_all(self, prompts, params) -> list[int]:
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise ValueError(f"params: got {len(params)} SamplingParams for {len(prompts)} prompts")
        return [self.add_request(p, sp) for p, sp in zip(prompts, params)]

    def stream(self, prompts, params=None):
        """Add the prompts (ids are given out in their order) and yield the StepOutputs of every
        request in the engine until all are done."""
        self._add_all(prompts, params)
        while self.has_unfinished():
            yield from self.step()

    def generate(self, prompts, params=None) -> list[Trace]:
        """Run the prompts (one SamplingParams for all, or one each) to completion; their records (Traces:
        ``token_ids``, ``finish_reason``, ``ttft``, ...) in input order."""
        ids = self._add_all(prompts, params)
        while self.has_unfinished():
            self.step()
        return [self.requests[i].trace for i in ids]

    def stats(self) -> dict:
        return {"steps": self.num_steps, "forwards": self.num_forwards, "preemptions": self.num_preemptions,
                "max_running": self.scheduler.max_running_seen, "aborted": self.num_aborted,
                "blocks_used": self.manager.num_used_blocks, "blocks_free": self.manager.num_free_blocks}
