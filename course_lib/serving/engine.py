"""A small real serving engine: continuous (iteration-level) batching on the paged KV cache.

    from course_lib.serving.engine import Engine, SamplingParams
    eng = Engine(model, num_blocks=256, block_size=16, max_batch=16, max_prefill_tokens=256)
    rid = eng.add_request(prompt_ids, SamplingParams(max_tokens=32))   # ValueError/TypeError if unservable
    while eng.has_unfinished():
        for out in eng.step():          # StepOutput(request_id, token, finished, finish_reason)
            ...
    results = eng.generate([p1, p2, p3], SamplingParams(max_tokens=16))   # [RequestOutput] in input order

How one ``step()`` works (the scheduler of vLLM, in miniature):

1. **Reserve decode slots.** Every running request whose prompt is done feeds its last sampled token
   this step, so it needs one KV slot (a new block when its last block is full). If the free blocks do
   not cover all of them, the **newest** admitted request is **preempted**: its blocks are freed and it
   goes back to the head of the waiting queue. When it is admitted again, its prompt *and the tokens it
   already generated* are prefilled again (recompute), so nothing is lost and greedy output is unchanged.
2. **Admit** waiting requests first-come-first-served while the batch has room (``max_batch``) and the
   pool keeps a small reserve of free blocks (the watermark) for the running requests to grow into.
3. **Prefill** the admitted prompts, up to ``max_prefill_tokens`` prompt tokens per step (a longer
   prompt is prefilled in chunks over several steps): one forward for all of them, rows right-padded.
4. **Decode**: ONE forward for all running requests, one token each, rows of different lengths.
5. **Sample** each finished row with its own SamplingParams and its own ``torch.Generator``, so a seeded
   request draws the same tokens whatever else shares its batch. Stream the tokens (``step()``'s return
   value, a per-request callback, ``stream()``) and record arrival / first token / finish times.

Memory: the engine runs on Module 06's one paged KV store, ``course_lib.paged.PagedCache`` (``engine.cache``):
its ``BlockManager`` (``engine.manager``) holds the block tables and the free list, its ``KVPool`` the K/V
blocks ``[num_blocks, kv_heads, block_size, head_dim]`` per layer. The engine only schedules: it registers
tokens (``add_sequence`` at admission, ``append`` for a decode step), frees preempted and finished
requests, and says which requests each forward runs and how many new tokens each brings
(``set_active(ids, num_new=...)``, rows right-padded). The cache builds the slot mapping, block tables and
context lengths once per forward on the model's device; every layer writes its new K/V with one batched
``index_put`` and a decode step reads them in place through the block tables with ``paged_attention``
(the Triton kernel on CUDA, ``backend=`` to choose), a prefill with one gather and causal attention.
Sampling stays on the device too (a ``torch.Generator`` on the model's device per request); the only host
sync of a step is the ``tolist()`` of its sampled tokens.

Baselines for the benchmark: ``static_batch_generate`` (our static batching: fixed groups, left
padding, a contiguous KV cache, a group runs until its longest request ends) and ``hf_static_generate``
(transformers' batched ``generate``). ``compare_with_static`` runs all of them on one workload.
"""
from __future__ import annotations

import copy
import math
import numbers
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from course_lib.generation import sample as _sample
from course_lib.paged import BlockManager, KVPool, PagedCache
from course_lib.perf.metrics import percentiles

__all__ = ["SamplingParams", "StepOutput", "RequestOutput", "Engine", "static_batch_generate",
           "hf_static_generate", "synthetic_workload", "as_workload", "run_engine_workload",
           "compare_with_static", "latency_summary"]


# --------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class SamplingParams:
    """How one request is decoded. An unknown field (``SamplingParams(temprature=0.5)``) is a TypeError.

    max_tokens: tokens to generate (>= 1). temperature 0 = greedy. top_k / top_p: filters (None = off).
    seed: seeds this request's own torch.Generator (on the model's device), so its sampled tokens do not
    depend on the batch (None: a seed drawn on the host from torch's global CPU generator when the request
    is added).
    stop_token_ids: generation ends after one of these tokens (it is included in the output).
    """
    max_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: tuple = ()

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, numbers.Integral) \
                or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral)
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1] or None, got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        stops = self.stop_token_ids
        if isinstance(stops, numbers.Integral):
            stops = (stops,)
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in stops):
            raise TypeError(f"stop_token_ids must be token ids (ints), got {self.stop_token_ids!r}")
        self.stop_token_ids = tuple(int(s) for s in stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class StepOutput:
    """One token streamed out of ``Engine.step()``."""
    request_id: int
    token: int
    finished: bool
    finish_reason: str | None = None     # "length" | "stop" | None


@dataclass
class RequestOutput:
    """A request's result and timings (``time.perf_counter`` seconds).

    ttft = first token - arrival; tpot = mean time per output token after the first;
    e2e = finish - arrival.
    """
    request_id: int
    prompt_ids: list
    token_ids: list = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if self.finish_time is None or self.first_token_time is None or len(self.token_ids) < 2:
            return None
        return (self.finish_time - self.first_token_time) / (len(self.token_ids) - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


class _Request:
    """The engine's private state of one request."""

    def __init__(self, rid, prompt, params, arrival, callback, device="cpu", cache=None):
        self.id, self.prompt, self.params, self.callback = rid, prompt, params, callback
        self.cache = cache         # the engine's PagedCache (None in the static baselines)
        # the seed is drawn on the host (no device sync); the generator lives next to the logits
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (), device="cpu"))
        self.generator = None if params.greedy else torch.Generator(device=device).manual_seed(int(seed))
        self.out = RequestOutput(rid, list(prompt), arrival_time=arrival)
        self.prefill_end = 0       # tokens to prefill at (re)admission: prompt + tokens generated so far

    @property
    def tokens(self) -> list:
        return self.prompt + self.out.token_ids

    @property
    def computed(self) -> int:
        """Tokens whose K/V are in the pool: the cache's count (0 while waiting or after preemption)."""
        return self.cache.computed.get(self.id, 0) if self.cache is not None else 0

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prefill_end


def _as_token_list(prompt_ids, vocab_size: int, name: str = "prompt_ids") -> list[int]:
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


def _sample_tokens(reqs, logits) -> list[int]:
    """One token per row of logits [B, V] (on the model's device): greedy rows take the argmax, sampled
    rows draw with their request's own generator (on the same device). One host sync: the tolist()."""
    toks = logits.argmax(-1)                                                  # [B] on the device
    for i, r in enumerate(reqs):
        p = r.params
        if not p.greedy:
            toks[i] = _sample(logits[i:i + 1].float(), p.temperature, p.top_k, p.top_p, generator=r.generator)[0]
    return toks.tolist()


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------
class Engine:
    """Continuous batching over a paged KV cache (see the module docstring).

    model: a course model (``course_lib.models.load``). num_blocks x block_size: the KV token slots.
    max_batch: most requests running at once. max_prefill_tokens: prompt tokens prefilled per step
    (longer prompts are chunked). watermark: fraction of the blocks kept free when admitting.
    backend: the decode attention (``course_lib.paged.paged_attention``): "auto" (the Triton kernel on
    CUDA, the vectorized PyTorch gather elsewhere), "torch", "triton" or "reference".
    """

    def __init__(self, model, num_blocks: int = 256, block_size: int = 16, max_batch: int = 16,
                 max_prefill_tokens: int = 512, watermark: float = 0.01, backend: str = "auto"):
        for name, val in (("num_blocks", num_blocks), ("block_size", block_size), ("max_batch", max_batch),
                          ("max_prefill_tokens", max_prefill_tokens)):
            if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 1:
                raise ValueError(f"{name} must be an int >= 1, got {val!r}")
        if not isinstance(watermark, numbers.Real) or not 0 <= watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark!r}")
        self.model = model
        cfg = model.config
        self.context = cfg.max_position_embeddings
        self.vocab_size = cfg.vocab_size
        self.block_size, self.num_blocks, self.max_batch = block_size, num_blocks, max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.watermark_blocks = int(watermark * num_blocks)
        # the one paged KV store (Module 06): block tables in its BlockManager, K/V in its KVPool
        self.cache = PagedCache(BlockManager(num_blocks, block_size), KVPool.for_model(model, num_blocks, block_size),
                                backend=backend)
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []                # in admission order (the last is the newest)
        self.requests: dict[int, _Request] = {}
        self._next_id = 0
        self.num_preemptions = 0
        self.num_steps = 0
        self.num_forwards = 0
        self.max_running_seen = 0

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
        ids = _as_token_list(prompt_ids, self.vocab_size)
        # positions 0 .. P + N - 2 are fed to the model (the last generated token never is)
        span = len(ids) + params.max_tokens - 1
        if span > self.context:
            raise ValueError(f"prompt of {len(ids)} tokens + max_tokens={params.max_tokens} needs {span} positions, "
                             f"past the model's context of {self.context}")
        blocks = -(-span // self.block_size)
        if blocks > self.num_blocks:
            raise ValueError(f"the request needs {blocks} KV blocks of {self.block_size} tokens but the whole pool "
                             f"has {self.num_blocks}: it could never finish")
        rid = self._next_id
        self._next_id += 1
        req = _Request(rid, ids, params, time.perf_counter() if arrival_time is None else arrival_time, callback,
                       device=self.model.device, cache=self.cache)
        self.requests[rid] = req
        self.waiting.append(req)
        return rid

    @property
    def manager(self) -> BlockManager:
        """The block bookkeeping (``self.cache.manager``): the one source of block tables."""
        return self.cache.manager

    @property
    def backend(self) -> str:
        return self.cache.backend

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def output(self, request_id: int) -> RequestOutput:
        return self.requests[request_id].out

    def pop_finished(self) -> list[RequestOutput]:
        """Forget finished requests (a long-running server would), returning their outputs."""
        done = [r.out for r in self.requests.values() if r.out.finished]
        for o in done:
            del self.requests[o.request_id]
        return done

    # --- scheduling --------------------------------------------------------------------------------
    def _preempt(self, req: _Request):
        """Free a running request's blocks and put it back at the head of the queue (recompute later)."""
        self.cache.free(req.id)
        self.running.remove(req)
        req.prefill_end = 0
        req.out.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _reserve_decode_slots(self) -> list[_Request]:
        """Register the token each decoding request feeds this step, preempting the newest on shortage."""
        while True:
            rows = [r for r in self.running if not r.prefilling]
            need = sum(self.manager.blocks_needed(r.id, 1) for r in rows)
            if need <= self.manager.num_free_blocks:
                break
            self._preempt(self.running[-1])
        self.cache.append([r.id for r in rows], [r.tokens[r.computed] for r in rows])
        return rows

    def _admit(self):
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            toks = req.tokens
            need = -(-len(toks) // self.block_size)
            reserve = self.watermark_blocks if self.running else 0    # alone, it only needs to fit
            if self.manager.num_free_blocks - need < reserve:
                break
            self.cache.add_sequence(req.id, toks)                   # no prefix caching here: all to compute
            self.waiting.popleft()
            req.prefill_end = len(toks)
            self.running.append(req)

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

    # --- sampling and bookkeeping ------------------------------------------------------------------
    def _emit(self, req: _Request, token: int, now: float) -> StepOutput:
        o = req.out
        o.token_ids.append(token)
        if o.first_token_time is None:
            o.first_token_time = now
        reason = None
        if token in req.params.stop_token_ids:
            reason = "stop"
        elif len(o.token_ids) >= req.params.max_tokens:
            reason = "length"
        if reason is not None:
            o.finished, o.finish_reason, o.finish_time = True, reason, now
            self.cache.free(req.id)
            self.running.remove(req)
        so = StepOutput(req.id, token, reason is not None, reason)
        if req.callback is not None:
            req.callback(so)
        return so

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """One iteration: reserve decode slots (preempt if short), admit, prefill, decode, sample.

        Returns the tokens sampled in this step (one per request that produced one). Runs under
        ``torch.inference_mode`` (no autograd bookkeeping: it matters for small forwards on a CPU)."""
        self.num_steps += 1
        before = self.num_preemptions
        decode = self._reserve_decode_slots()
        if self.num_preemptions == before:       # no admissions in a step that had to preempt (no thrash)
            self._admit()
        self.max_running_seen = max(self.max_running_seen, len(self.running))
        # prefill rows: the admitted prompts, FCFS, within the token budget (the last may be a chunk)
        pre, budget = [], self.max_prefill_tokens
        for r in self.running:
            if r.prefilling and budget > 0:
                n = min(r.prefill_end - r.computed, budget)
                pre.append((r, r.computed, n))
                budget -= n
        results = []
        if decode:
            logits = self._forward(decode, [1] * len(decode), [[r.tokens[r.computed]] for r in decode])
            toks = _sample_tokens(decode, logits)
            now = time.perf_counter()
            results += [self._emit(r, t, now) for r, t in zip(decode, toks)]
        for group in self._prefill_groups(pre):
            reqs = [r for r, _, _ in group]
            done = [i for i, (r, s, n) in enumerate(group) if s + n >= r.prefill_end]   # prompts that end here
            logits = self._forward(reqs, [n for _, _, n in group], [r.tokens[s:s + n] for r, s, n in group],
                                   rows=done)
            if done:
                toks = _sample_tokens([reqs[i] for i in done], logits)
                now = time.perf_counter()
                results += [self._emit(reqs[i], t, now) for i, t in zip(done, toks)]
        return results

    @staticmethod
    def _prefill_groups(pre, max_waste: float = 0.25):
        """Split prefill rows into forwards of similar lengths, so right-padding wastes at most
        ``max_waste`` of the computed tokens (one forward of 16 prompts padded to the longest would
        compute several times the real tokens)."""
        groups, cur, total = [], [], 0
        for row in sorted(pre, key=lambda x: -x[2]):
            if cur and cur[0][2] * (len(cur) + 1) > (1 + max_waste) * (total + row[2]):
                groups.append(cur)
                cur, total = [], 0
            cur.append(row)
            total += row[2]
        return groups + ([cur] if cur else [])

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

    def generate(self, prompts, params=None) -> list[RequestOutput]:
        """Run the prompts (one SamplingParams for all, or one each) to completion; outputs in input order."""
        ids = self._add_all(prompts, params)
        while self.has_unfinished():
            self.step()
        return [self.requests[i].out for i in ids]

    def stats(self) -> dict:
        return {"steps": self.num_steps, "forwards": self.num_forwards, "preemptions": self.num_preemptions,
                "max_running": self.max_running_seen, "blocks_used": self.manager.num_used_blocks,
                "blocks_free": self.manager.num_free_blocks}


# --------------------------------------------------------------------------------------------------
# Baselines: static batching
# --------------------------------------------------------------------------------------------------
def _params_list(prompts, params):
    if params is None or isinstance(params, SamplingParams):
        params = [params or SamplingParams()] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"params: got {len(params)} SamplingParams for {len(prompts)} prompts")
    for p in params:
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(p).__name__}")
    return params


@torch.inference_mode()
def _static_group(model, group: list[_Request]):
    """Run one static batch: left-padded prefill, then decode steps until every row is done.
    Rows that finished keep computing (the waste of static batching); their extra tokens are dropped."""
    from course_lib.kvcache import ContiguousCache
    dev = model.device
    B = len(group)
    lens = [len(r.prompt) for r in group]
    L = max(lens)
    pad = torch.tensor([L - n for n in lens], dtype=torch.long, device=dev)                 # [B]
    ids = torch.tensor([[0] * (L - n) + r.prompt for n, r in zip(lens, group)], dtype=torch.long, device=dev)
    ar = torch.arange(L, device=dev)
    pos = (ar[None, :] - pad[:, None]).clamp(min=0)                                          # [B, L]
    i_, j_ = ar[:, None], ar[None, :]
    # a real query sees real keys up to itself; a pad query sees itself only (keeps it finite)
    mask = ((j_ <= i_)[None] & (j_[None] >= pad[:, None, None])) | (i_ == j_)[None]          # [B, L, L]
    cache = ContiguousCache()
    logits = model(ids, cache=cache, positions=pos, attn_mask=mask[:, None])[:, -1]           # [B, V]
    steps = max(r.params.max_tokens for r in group)
    done = [False] * B
    for step in range(steps):
        toks = _sample_tokens(group, logits)                 # every row draws (done rows' tokens are dropped)
        now = None
        for i, r in enumerate(group):
            p, t = r.params, toks[i]
            if not done[i]:
                now = now or time.perf_counter()
                o = r.out
                o.token_ids.append(t)
                if o.first_token_time is None:
                    o.first_token_time = now
                reason = "stop" if t in p.stop_token_ids else "length" if len(o.token_ids) >= p.max_tokens else None
                if reason:
                    done[i] = True
                    o.finished, o.finish_reason, o.finish_time = True, reason, now
        if all(done):
            break
        S = L + step + 1
        x = torch.tensor(toks, dtype=torch.long, device=dev)[:, None]                          # [B, 1]
        keep = torch.arange(S, device=dev)[None, :] >= pad[:, None]                             # [B, S]
        logits = model(x, cache=cache, positions=(L + step - pad)[:, None],
                       attn_mask=keep[:, None, None, :])[:, -1]


def _run_static(model, reqs: list[_Request], batch_size: int):
    """Serve requests in arrival order in groups of batch_size: a group starts when the previous one
    has ended, with the requests that have arrived by then (waiting for the first if none has)."""
    queue = deque(sorted(reqs, key=lambda r: r.out.arrival_time))
    while queue:
        now = time.perf_counter()
        if queue[0].out.arrival_time > now:
            time.sleep(queue[0].out.arrival_time - now)
            now = time.perf_counter()
        group = []
        while queue and len(group) < batch_size and queue[0].out.arrival_time <= now:
            group.append(queue.popleft())
        _static_group(model, group)


def static_batch_generate(model, prompts, params=None, batch_size: int = 8) -> list[RequestOutput]:
    """Static batching baseline: groups of batch_size in order, left-padded, a contiguous KV cache;
    a group runs until its longest request ends. RequestOutputs in input order; a request's finish
    time is when its own last token came out (the kindest reading for static batching)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    prompts = list(prompts)
    params = _params_list(prompts, params)
    V, ctx = model.config.vocab_size, model.config.max_position_embeddings
    t0 = time.perf_counter()
    reqs = []
    for i, (p, sp) in enumerate(zip(prompts, params)):
        ids = _as_token_list(p, V, f"prompts[{i}]")
        if len(ids) + sp.max_tokens - 1 > ctx:
            raise ValueError(f"prompts[{i}]: {len(ids)} tokens + max_tokens={sp.max_tokens} is past the context {ctx}")
        reqs.append(_Request(i, ids, sp, t0, None, device=model.device))
    _run_static(model, reqs, batch_size)
    return [r.out for r in reqs]


def hf_static_generate(prompts, params=None, batch_size: int = 8, model_dir=None, hf_model=None,
                       arrivals=None, device=None) -> list[RequestOutput]:
    """Static batching with transformers' batched ``generate`` (left padding, greedy) on the bundled model.

    Greedy only (sampling in HF uses its own random stream). arrivals: optional arrival times
    (perf_counter seconds) for a replay; groups then start as in ``static_batch_generate``.
    hf_model: a loaded transformers model (it runs where it is); otherwise the model is loaded from
    model_dir (default: the bundled tiny model) onto ``device`` (default: ``course_lib.env.device()``).
    """
    import transformers

    from course_lib.models import bundled_path
    prompts = [list(map(int, p.tolist() if torch.is_tensor(p) else p)) for p in prompts]
    params = _params_list(prompts, params)
    if any(not p.greedy for p in params):
        raise ValueError("hf_static_generate compares greedy decoding only (temperature=0)")
    if hf_model is None:
        from course_lib.env import device as best_device
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir or bundled_path("tiny")),
                                                                     dtype=torch.float32).eval()
        hf_model = hf_model.to(best_device() if device is None else torch.device(device))
    t0 = time.perf_counter()
    arrivals = [t0] * len(prompts) if arrivals is None else list(arrivals)
    outs = [RequestOutput(i, p, arrival_time=a) for i, (p, a) in enumerate(zip(prompts, arrivals))]
    order = deque(sorted(range(len(prompts)), key=lambda i: arrivals[i]))
    dev = hf_model.device
    while order:
        now = time.perf_counter()
        if arrivals[order[0]] > now:
            time.sleep(arrivals[order[0]] - now)
            now = time.perf_counter()
        group = []
        while order and len(group) < batch_size and arrivals[order[0]] <= now:
            group.append(order.popleft())
        L = max(len(prompts[i]) for i in group)
        # built on the host, moved to the model's device in one copy each
        ids = torch.tensor([[0] * (L - len(prompts[i])) + prompts[i] for i in group], dtype=torch.long, device="cpu")
        am = torch.tensor([[0] * (L - len(prompts[i])) + [1] * len(prompts[i]) for i in group], dtype=torch.long,
                          device="cpu")
        n_new = max(params[i].max_tokens for i in group)
        # no end-of-sequence token: every row runs its max_tokens, as in the engine (min_new_tokens would
        # instead forbid the eos token and change the greedy choices)
        gc = copy.deepcopy(hf_model.generation_config)
        gc.eos_token_id, gc.max_new_tokens, gc.do_sample, gc.pad_token_id = None, n_new, False, 0
        with torch.inference_mode():
            gen = hf_model.generate(input_ids=ids.to(dev), attention_mask=am.to(dev), generation_config=gc)
        end = time.perf_counter()
        for row, i in enumerate(group):
            o = outs[i]
            o.token_ids = gen[row, L:L + params[i].max_tokens].tolist()
            o.first_token_time = o.finish_time = end     # HF returns the whole group at once
            o.finished, o.finish_reason = True, "length"
    return outs


# --------------------------------------------------------------------------------------------------
# Workloads and the comparison
# --------------------------------------------------------------------------------------------------
def synthetic_workload(n: int = 64, seed: int = 0, vocab_size: int = 2048, rate: float | None = None,
                       prompt_range=(8, 192), output_range=(4, 128), output_median: float = 24.0,
                       sigma: float = 1.0) -> list[tuple[float, list[int], int]]:
    """[(arrival_s, prompt_ids, max_tokens)]: prompt lengths log-uniform in prompt_range, output lengths
    lognormal (median output_median) clipped to output_range, arrivals Poisson at ``rate`` per second
    (all at 0 when rate is None). Token ids are random: the engine's speed does not depend on them.
    Generated on the host (a CPU generator, CPU tensors): a workload is plain Python data."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    lo, hi = prompt_range
    plen = torch.exp(math.log(lo) + torch.rand(n, generator=g, device="cpu") * (math.log(hi) - math.log(lo)))
    plen = plen.round().long()
    olen = torch.exp(math.log(output_median) + sigma * torch.randn(n, generator=g, device="cpu")).round().long()
    olen = olen.clamp(*output_range)
    if rate is None:
        arr = torch.zeros(n, device="cpu")
    else:
        arr = torch.cumsum(-torch.log(torch.rand(n, generator=g, device="cpu")) / rate, 0)
        arr = arr - arr[0]
    return [(float(arr[i]), torch.randint(1, vocab_size, (int(plen[i]),), generator=g, device="cpu").tolist(),
             int(olen[i])) for i in range(n)]


def as_workload(workload, vocab_size: int = 2048, seed: int = 0) -> list[tuple[float, list[int], int]]:
    """Normalize a workload to [(arrival_s, prompt_ids, max_tokens)].

    Accepts such tuples, or request objects with ``arrival_s``, ``prompt_tokens`` (a count, or the ids)
    and ``output_tokens`` (``course_lib.serving.workload.Request``): counts get random prompt ids
    (seeded, drawn on the host; the engine's speed does not depend on which tokens they are)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for i, w in enumerate(workload):
        if hasattr(w, "arrival_s"):
            arr, prompt, n = w.arrival_s, w.prompt_tokens, w.output_tokens
        else:
            try:
                arr, prompt, n = w
            except (TypeError, ValueError):
                raise TypeError(f"workload[{i}] must be (arrival_s, prompt_ids, max_tokens) or a Request with "
                                f"arrival_s/prompt_tokens/output_tokens, got {w!r}") from None
        if isinstance(prompt, numbers.Integral):
            prompt = torch.randint(1, vocab_size, (int(prompt),), generator=g, device="cpu").tolist()
        elif torch.is_tensor(prompt):
            prompt = prompt.reshape(-1).tolist()
        if not isinstance(arr, numbers.Real) or not math.isfinite(arr) or arr < 0:
            raise ValueError(f"workload[{i}]: arrival time must be a finite number >= 0, got {arr!r}")
        out.append((float(arr), list(prompt), int(n)))
    return out


def run_engine_workload(engine: Engine, workload, replay: bool = False) -> list[RequestOutput]:
    """Serve a workload with the engine. replay=False: everything arrives at once. replay=True: a
    request is added only once its arrival time (seconds after the start) has passed."""
    workload = as_workload(workload, engine.vocab_size)
    t0 = time.perf_counter()
    items = sorted(enumerate(workload), key=lambda x: x[1][0] if replay else 0)
    ids = {}
    k = 0
    while k < len(items) or engine.has_unfinished():
        now = time.perf_counter()
        while k < len(items) and (not replay or t0 + items[k][1][0] <= now):
            i, (arr, prompt, max_tokens) = items[k]
            ids[i] = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens),
                                        arrival_time=t0 + arr if replay else t0)
            k += 1
        if engine.has_unfinished():
            engine.step()
        elif k < len(items):
            time.sleep(max(0.0, t0 + items[k][1][0] - time.perf_counter()))
    return [engine.output(ids[i]) for i in range(len(workload))]


def latency_summary(outs: list[RequestOutput], start: float) -> dict:
    """Throughput (generated tokens / wall s from start to the last finish) and latency percentiles."""
    tokens = sum(len(o.token_ids) for o in outs)
    wall = max(o.finish_time for o in outs) - start
    e50, e90 = percentiles([o.e2e for o in outs], (50, 90)).values()
    t50, t90 = percentiles([o.ttft for o in outs], (50, 90)).values()
    return {"requests": len(outs), "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1), "p50_latency_s": round(e50, 3), "p90_latency_s": round(e90, 3),
            "p50_ttft_s": round(t50, 3), "p90_ttft_s": round(t90, 3)}


def compare_with_static(model, workload, batch_size=8, replay: bool = False, hf: bool = False, hf_model=None,
                        repeats: int = 1, check: bool = True, **engine_kwargs) -> list[dict]:
    """Serve one workload [(arrival_s, prompt_ids, max_tokens)] (greedy) with the engine, our static
    batching and (hf=True) transformers' batched generate, interleaved on the same machine.

    batch_size: an int or a tuple of static batch sizes to try (each is a row). Everything runs on the
    model's device (hf_model, if given, where it is; if loaded here, on the model's device).
    replay=False: all requests arrive at t=0 (offline); True: replay the arrival times (the engine only
    sees requests that have arrived; a static group starts with the requests arrived by then).
    repeats: run every system this many times, alternating, and report the median of each number.
    engine_kwargs go to ``Engine`` (default: max_batch=16, num_blocks enough for the whole workload).
    check: raise if the engine's greedy outputs and static batching's disagree (beyond float near-ties).
    workload: [(arrival_s, prompt_ids, max_tokens)] or ``course_lib.serving.workload.Request`` objects.
    Returns rows (dicts) for a table; ``speedup`` = tokens_per_s / the best static row's.
    """
    sizes = (batch_size,) if isinstance(batch_size, numbers.Integral) else tuple(batch_size)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1 for b in sizes):
        raise ValueError(f"batch_size must be an int >= 1 or a tuple of them, got {batch_size!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, numbers.Integral) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not workload:
        raise ValueError("workload is empty")
    workload = as_workload(workload, model.config.vocab_size)
    mode = "replay" if replay else "offline"
    kw = {"max_batch": 16, "block_size": 16, **engine_kwargs}
    if "num_blocks" not in kw:     # enough for the whole workload at once: no preemption unless asked
        need = sum(-(-(len(p) + n) // kw["block_size"]) for _, p, n in workload)
        kw["num_blocks"] = max(64, min(need, 8192))
    if hf and hf_model is None:
        import transformers

        from course_lib.models import bundled_path
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(bundled_path("tiny")),
                                                                     dtype=torch.float32).eval()
        hf_model = hf_model.to(model.device)          # every system on the same device
    outs, runs = {}, {}

    def engine_run():
        eng = Engine(model, **kw)
        t0 = time.perf_counter()
        o = run_engine_workload(eng, workload, replay=replay)
        return o, {**latency_summary(o, t0), "preemptions": eng.num_preemptions}

    def static_run(bs):
        t0 = time.perf_counter()
        reqs = [_Request(i, list(p), SamplingParams(max_tokens=n), t0 + (a if replay else 0.0), None,
                         device=model.device)
                for i, (a, p, n) in enumerate(workload)]
        _run_static(model, reqs, bs)
        o = [r.out for r in reqs]
        return o, {**latency_summary(o, t0), "preemptions": 0}

    def hf_run(bs):
        t0 = time.perf_counter()
        o = hf_static_generate([p for _, p, _ in workload], [SamplingParams(max_tokens=n) for *_, n in workload],
                               batch_size=bs, hf_model=hf_model,
                               arrivals=[t0 + (a if replay else 0.0) for a, _, _ in workload])
        return o, {**latency_summary(o, t0), "preemptions": 0}

    systems = [(f"engine (max_batch={kw['max_batch']})", engine_run)]
    systems += [(f"static (batch={b})", lambda b=b: static_run(b)) for b in sizes]
    if hf:
        systems += [(f"HF generate (batch={b})", lambda b=b: hf_run(b)) for b in sizes]
    for _ in range(repeats):
        for name, fn in systems:
            o, summary = fn()
            outs[name] = o
            runs.setdefault(name, []).append(summary)
    rows = []
    for name, _ in systems:
        med = {k: statistics.median_low([float(r[k]) for r in runs[name]]) for k in runs[name][0]}
        med = {k: (int(v) if k in ("requests", "tokens", "preemptions") else round(v, 3)) for k, v in med.items()}
        rows.append({"mode": mode, "system": name, **med})
    if check:
        e_outs = outs[systems[0][0]]
        for name, _ in systems[1:1 + len(sizes)]:
            same = sum(e.token_ids == s.token_ids for e, s in zip(e_outs, outs[name]))
            if same < len(workload) - max(1, len(workload) // 20):
                raise AssertionError(f"engine and {name} disagree on {len(workload) - same} of {len(workload)} "
                                     "greedy outputs")
    base = max(r["tokens_per_s"] for r in rows if r["system"].startswith("static"))
    for r in rows:
        r["speedup"] = round(r["tokens_per_s"] / base, 2)
    return rows
