"""The engine against static batching on one workload, on the same machine (Module 09's notebook and
``bench/serving.py``).

    from course_lib.serving import compare_with_static, synthetic_workload
    rows = compare_with_static(model, synthetic_workload(64, vocab_size=2048), batch_size=8, max_batch=16)

Every system's outputs are its requests' records (``Trace``s), which ``course_lib.perf.metrics.summarize``
turns into the row (throughput = generated tokens / makespan, latency percentiles over requests).
"""
from __future__ import annotations

import numbers
import statistics
import time

import torch

from course_lib.models import bundled_path
from course_lib.paged.manager import blocks_needed
from course_lib.perf.metrics import Trace, summarize
from course_lib.validate import integer, number

from .baselines import hf_static_generate, run_static
from .engine import Engine
from .request import EngineRequest, SamplingParams

__all__ = ["as_workload", "run_engine_workload", "compare_with_static"]


def as_workload(workload, vocab_size: int = 2048, seed: int = 0) -> list[tuple[float, list[int], int]]:
    """Normalize a workload to [(arrival_s, prompt_ids, max_new_tokens)].

    Accepts such tuples, or requests with ``arrival_s``, ``prompt_tokens`` (a count, or the ids) and
    ``output_tokens`` (``course_lib.perf.workload.Request``): counts get random prompt ids (seeded,
    drawn on the host; the engine's speed does not depend on which tokens they are)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for i, w in enumerate(workload):
        if hasattr(w, "arrival_s"):
            arr, prompt, n = w.arrival_s, w.prompt_tokens, w.output_tokens
        else:
            try:
                arr, prompt, n = w
            except (TypeError, ValueError):
                raise TypeError(f"workload[{i}] must be (arrival_s, prompt_ids, max_new_tokens) or a Request with "
                                f"arrival_s/prompt_tokens/output_tokens, got {w!r}") from None
        if isinstance(prompt, numbers.Integral):
            prompt = torch.randint(1, vocab_size, (int(prompt),), generator=g, device="cpu").tolist()
        elif torch.is_tensor(prompt):
            prompt = prompt.reshape(-1).tolist()
        arr = number(arr, f"workload[{i}]: arrival time", 0)
        out.append((arr, list(prompt), int(n)))
    return out


def run_engine_workload(engine: Engine, workload, replay: bool = False) -> list[Trace]:
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
            i, (arr, prompt, n) = items[k]
            ids[i] = engine.add_request(prompt, SamplingParams(max_new_tokens=n),
                                        arrival_time=t0 + arr if replay else t0)
            k += 1
        if engine.has_unfinished():
            engine.step()
        elif k < len(items):
            time.sleep(max(0.0, t0 + items[k][1][0] - time.perf_counter()))
    return [engine.output(ids[i]) for i in range(len(workload))]


def _row(outs: list[Trace], start: float, preemptions: int) -> dict:
    """A table row from the outputs' traces: throughput over the wall time from `start` (the run's start,
    the first arrival) to the last finish, and the latency percentiles of ``summarize``."""
    s = summarize(outs, qs=(50, 90))
    wall = max(o.finish_time for o in outs) - start
    return {"requests": s["requests"], "tokens": s["output_tokens"], "wall_s": round(wall, 3),
            "tokens_per_s": round(s["output_tokens"] / wall, 1), "p50_latency_s": round(s["e2e_p50"], 3),
            "p90_latency_s": round(s["e2e_p90"], 3), "p50_ttft_s": round(s["ttft_p50"], 3),
            "p90_ttft_s": round(s["ttft_p90"], 3), "preemptions": preemptions}


def compare_with_static(model, workload, batch_size=8, replay: bool = False, hf: bool = False, hf_model=None,
                        repeats: int = 1, check: bool = True, **engine_kwargs) -> list[dict]:
    """Serve one workload (greedy) with the engine, our static batching and (hf=True) transformers'
    batched generate, interleaved on the same machine.

    workload: ``course_lib.perf.workload.Request``s (random prompt ids of their lengths) or
    [(arrival_s, prompt_ids, max_new_tokens)].
    batch_size: an int or a tuple of static batch sizes to try (each is a row). Everything runs on the
    model's device (hf_model, if given, where it is; if loaded here, on the model's device).
    replay=False: all requests arrive at t=0 (offline); True: replay the arrival times (the engine only
    sees requests that have arrived; a static group starts with the requests arrived by then).
    repeats: run every system this many times, alternating, and report the median of each number.
    engine_kwargs go to ``Engine`` (default: max_batch=16, num_blocks enough for the whole workload).
    check: raise if the engine's greedy outputs and static batching's disagree (beyond float near-ties).
    Returns rows (dicts) for a table; ``speedup`` = tokens_per_s / the best static row's.
    """
    sizes = (batch_size,) if isinstance(batch_size, numbers.Integral) else tuple(batch_size)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1 for b in sizes):
        raise ValueError(f"batch_size must be an int >= 1 or a tuple of them, got {batch_size!r}")
    repeats = integer(repeats, "repeats", low=1)
    if not workload:
        raise ValueError("workload is empty")
    workload = as_workload(workload, model.config.vocab_size)
    mode = "replay" if replay else "offline"
    kw = {"max_batch": 16, "block_size": 16, **engine_kwargs}
    if "num_blocks" not in kw:     # enough for the whole workload at once: no preemption unless asked
        need = sum(blocks_needed(len(p) + n, kw["block_size"]) for _, p, n in workload)
        kw["num_blocks"] = max(64, min(need, 8192))
    if hf and hf_model is None:
        import transformers

        hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(bundled_path("tiny")),
                                                                     dtype=torch.float32).eval()
        hf_model = hf_model.to(model.device)          # every system on the same device
    outs, runs = {}, {}

    def engine_run():
        eng = Engine(model, **kw)
        t0 = time.perf_counter()
        o = run_engine_workload(eng, workload, replay=replay)
        return o, _row(o, t0, eng.num_preemptions)

    def static_run(bs):
        t0 = time.perf_counter()
        reqs = [EngineRequest(i, list(p), SamplingParams(max_new_tokens=n), t0 + (a if replay else 0.0),
                              device=model.device)
                for i, (a, p, n) in enumerate(workload)]
        run_static(model, reqs, bs)
        o = [r.trace for r in reqs]
        return o, _row(o, t0, 0)

    def hf_run(bs):
        t0 = time.perf_counter()
        o = hf_static_generate([p for _, p, _ in workload],
                               [SamplingParams(max_new_tokens=n) for *_, n in workload],
                               batch_size=bs, hf_model=hf_model,
                               arrivals=[t0 + (a if replay else 0.0) for a, _, _ in workload])
        return o, _row(o, t0, 0)

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
