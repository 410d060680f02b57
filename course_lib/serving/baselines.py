"""Static batching baselines for the serving engine: a group of requests runs until its longest ends.

``static_batch_generate``: our static batching (fixed groups in arrival order, each group one call of the
generate loop: left padding, a contiguous KV cache; rows that finished keep computing, the waste
continuous batching removes). ``hf_static_generate``:
transformers' batched ``generate`` on the same workload. Both return the requests' records
(``course_lib.perf.metrics.Trace``s) the comparison (``course_lib.serving.compare``) summarizes like the
engine's.
"""
from __future__ import annotations

import copy
import time
from collections import deque

import torch

from course_lib.env import device as best_device
from course_lib.generation import generate
from course_lib.models import bundled_path
from course_lib.perf.metrics import Trace
from course_lib.validate import integer

from .request import EngineRequest, SamplingParams, as_token_list

__all__ = ["static_batch_generate", "hf_static_generate", "run_static"]


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


def _static_group(model, group: list[EngineRequest]):
    """Run one static batch through the one generate loop: left-padded prompts in a contiguous KV cache,
    each row with its own SamplingParams and generator, until every request has ended (its stop token or
    its max_new_tokens). Rows that finished keep computing (the waste of static batching); their extra
    tokens are dropped. Each token is recorded at the time its step came out."""
    out = generate(model, [r.prompt for r in group], params=[r.params for r in group],
                   generator=[r.generator for r in group], cache="contiguous")
    times = [e.time for e in out.trace.events]                       # one per step
    for r, toks in zip(group, out.tokens.reshape(len(group), -1).tolist()):
        for t, now in zip(toks, times):
            if r.emit(t, now) is not None:
                break


def run_static(model, reqs: list[EngineRequest], batch_size: int):
    """Serve requests in arrival order in groups of batch_size: a group starts when the previous one
    has ended, with the requests that have arrived by then (waiting for the first if none has)."""
    queue = deque(sorted(reqs, key=lambda r: r.trace.start))
    while queue:
        now = time.perf_counter()
        if queue[0].trace.start > now:
            time.sleep(queue[0].trace.start - now)
            now = time.perf_counter()
        group = []
        while queue and len(group) < batch_size and queue[0].trace.start <= now:
            group.append(queue.popleft())
        _static_group(model, group)


def static_batch_generate(model, prompts, params=None, batch_size: int = 8) -> list[Trace]:
    """Static batching baseline: groups of batch_size in order, left-padded, a contiguous KV cache;
    a group runs until its longest request ends. Their Traces in input order; a request's finish
    time is when its own last token came out (the kindest reading for static batching)."""
    batch_size = integer(batch_size, "batch_size", low=1)
    prompts = list(prompts)
    params = _params_list(prompts, params)
    V, ctx = model.config.vocab_size, model.config.max_position_embeddings
    t0 = time.perf_counter()
    reqs = []
    for i, (p, sp) in enumerate(zip(prompts, params)):
        ids = as_token_list(p, V, f"prompts[{i}]")
        if len(ids) + sp.max_new_tokens - 1 > ctx:
            raise ValueError(f"prompts[{i}]: {len(ids)} tokens + max_new_tokens={sp.max_new_tokens} is past the "
                             f"context {ctx}")
        reqs.append(EngineRequest(i, ids, sp, t0, None, device=model.device))
    run_static(model, reqs, batch_size)
    return [r.trace for r in reqs]


def hf_static_generate(prompts, params=None, batch_size: int = 8, model_dir=None, hf_model=None,
                       arrivals=None, device=None) -> list[Trace]:
    """Static batching with transformers' batched ``generate`` (left padding, greedy) on the bundled model.

    Greedy only (sampling in HF uses its own random stream). arrivals: optional arrival times
    (perf_counter seconds) for a replay; groups then start as in ``static_batch_generate``.
    hf_model: a loaded transformers model (it runs where it is); otherwise the model is loaded from
    model_dir (default: the bundled tiny model) onto ``device`` (default: ``course_lib.env.device()``).
    """
    import transformers

    prompts = [list(map(int, p.tolist() if torch.is_tensor(p) else p)) for p in prompts]
    params = _params_list(prompts, params)
    if any(not p.greedy for p in params):
        raise ValueError("hf_static_generate compares greedy decoding only (temperature=0)")
    if any(p.repetition_penalty != 1 for p in params):
        raise ValueError("hf_static_generate compares plain greedy decoding only (repetition_penalty=1)")
    if hf_model is None:
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir or bundled_path("tiny")),
                                                                     dtype=torch.float32).eval()
        hf_model = hf_model.to(best_device() if device is None else torch.device(device))
    t0 = time.perf_counter()
    arrivals = [t0] * len(prompts) if arrivals is None else list(arrivals)
    outs = [Trace(a, prompt_tokens=len(p), rid=i, max_new_tokens=sp.max_new_tokens)
            for i, (p, a, sp) in enumerate(zip(prompts, arrivals, params))]
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
        n_new = max(params[i].max_new_tokens for i in group)
        # no end-of-sequence token: every row runs its max_new_tokens, as in the engine (min_new_tokens would
        # instead forbid the eos token and change the greedy choices)
        gc = copy.deepcopy(hf_model.generation_config)
        gc.eos_token_id, gc.max_new_tokens, gc.do_sample, gc.pad_token_id = None, n_new, False, 0
        with torch.inference_mode():
            gen = hf_model.generate(input_ids=ids.to(dev), attention_mask=am.to(dev), generation_config=gc)
        end = time.perf_counter()
        for row, i in enumerate(group):
            o = outs[i]
            for t in gen[row, L:L + params[i].max_new_tokens].tolist():
                o.add_token(end, t)                 # HF returns the whole group at once
            o.end(end, "length")
    return outs
