"""Module 09: batching and serving. A discrete-event simulator of an LLM server (workloads, a step-cost
model, batching policies, metrics); the real small engine lives in ``course_lib.serving.engine``.

    from course_lib.serving import make_workload, simulate, ContinuousBatching, StaticBatching, StepCostModel
    reqs = make_workload(300, rate=10.0, arrival="bursty", seed=0)
    res = simulate(reqs, ContinuousBatching(max_batch=64), num_blocks=2000, block_size=16)
    print(format_metrics(res.summary(ttft_slo=1.0, tpot_slo=0.1)))

Pieces: workloads (Poisson / bursty arrivals, lognormal or empirical lengths, JSONL/CSV traces);
StepCostModel (calibrate_local on this machine, from_roofline from Module 01's hardware table);
policies (static, dynamic, continuous with KV-block admission and preemption by recompute, chunked
prefill, prefill/decode disaggregation) with a scheduler hook (fcfs_schedule is the reference);
metrics (TTFT / TPOT / end-to-end percentiles, throughput, goodput under an SLO, invariants).
The engine: Engine (continuous batching on paged KV memory), SamplingParams, and the baselines
static_batch_generate / hf_static_generate, compared by compare_with_static.
"""
from .engine import (Engine, RequestOutput, SamplingParams, compare_with_static, hf_static_generate,
                     static_batch_generate)
from .metrics import check_invariants, format_metrics, goodput, makespan, max_blocks_used, summarize, sweep_load
from .policies import (POLICY_NAMES, ChunkedPrefill, ContinuousBatching, Decision, Disaggregated, DynamicBatching,
                       SeqView, StaticBatching, blocks_needed, fcfs_schedule, make_policy)
from .simulator import RequestRecord, SchedulingError, SimResult, StepCostModel, StepLog, simulate
from .workload import (Request, bursty_arrivals, load_trace, lognormal_lengths, make_workload, offered_load,
                       poisson_arrivals, save_trace)

__all__ = ["Request", "poisson_arrivals", "bursty_arrivals", "lognormal_lengths", "make_workload", "offered_load",
           "save_trace", "load_trace", "StepCostModel", "SchedulingError", "RequestRecord", "StepLog", "SimResult",
           "simulate", "SeqView", "Decision", "blocks_needed", "fcfs_schedule", "StaticBatching", "DynamicBatching",
           "ContinuousBatching", "ChunkedPrefill", "Disaggregated", "make_policy", "POLICY_NAMES", "summarize",
           "goodput", "makespan", "Engine", "SamplingParams", "RequestOutput", "static_batch_generate",
           "hf_static_generate", "compare_with_static", "format_metrics", "check_invariants", "max_blocks_used", "sweep_load"]
