"""Module 09: batching and serving. A discrete-event simulator of an LLM server, and a small real engine.

    from course_lib.serving import make_workload, simulate, ContinuousBatching, StaticBatching, StepCostModel
    from course_lib.perf.metrics import format_summary
    reqs = make_workload(300, rate=10.0, arrival="bursty", seed=0)
    res = simulate(reqs, ContinuousBatching(max_batch=64), num_blocks=2000, block_size=16)
    print(format_summary(res.summary(ttft_slo=1.0, tpot_slo=0.1)))

Workloads (``Request``, Poisson / bursty arrivals, lognormal or empirical lengths, JSONL/CSV traces) come from
``course_lib.perf.workload`` and per-request records and their metrics (``Trace``: TTFT / TPOT / end-to-end,
``summarize``: percentiles, throughput, goodput under an SLO) from ``course_lib.perf.metrics``; both are
re-exported here. Simulator: StepCostModel (calibrate_local on this machine, from_roofline from Module 01's
hardware table), policies (static, dynamic, continuous with KV-block admission and preemption by recompute,
chunked prefill, prefill/decode disaggregation) with a scheduler hook (fcfs_schedule is the reference),
simulate / sweep_load, check_invariants.
Engine (split by role, as nano-vllm): ``request`` (SamplingParams, StepOutput, EngineRequest:
the request's state, whose record ``trace`` is what the engine returns), ``scheduler`` (admission,
preemption, prefill chunks), ``engine`` (Engine: the loop, forwards, sampling), ``baselines``
(static_batch_generate / hf_static_generate), ``compare`` (compare_with_static).
"""
from course_lib.perf.metrics import Trace, format_summary, goodput, makespan, summarize
from course_lib.perf.workload import (Request, bursty_arrivals, load_trace, lognormal_lengths, make_workload,
                                      offered_load, poisson_arrivals, save_trace, synthetic_workload)

from .baselines import hf_static_generate, static_batch_generate
from .compare import compare_with_static
from .engine import Engine
from .invariants import check_invariants, max_blocks_used
from .policies import (POLICY_NAMES, ChunkedPrefill, ContinuousBatching, Decision, Disaggregated, DynamicBatching,
                       SeqView, StaticBatching, blocks_needed, fcfs_schedule, make_policy)
from .request import SamplingParams, StepOutput
from .simulator import SchedulingError, SimResult, StepCostModel, StepLog, simulate, sweep_load

__all__ = ["Request", "poisson_arrivals", "bursty_arrivals", "lognormal_lengths", "make_workload", "offered_load",
           "synthetic_workload", "save_trace", "load_trace", "Trace", "summarize", "format_summary", "goodput",
           "makespan", "StepCostModel", "SchedulingError", "StepLog", "SimResult", "simulate", "sweep_load",
           "SeqView", "Decision", "blocks_needed", "fcfs_schedule", "StaticBatching", "DynamicBatching",
           "ContinuousBatching", "ChunkedPrefill", "Disaggregated", "make_policy", "POLICY_NAMES", "check_invariants",
           "max_blocks_used", "Engine", "SamplingParams", "StepOutput", "static_batch_generate",
           "hf_static_generate", "compare_with_static"]
