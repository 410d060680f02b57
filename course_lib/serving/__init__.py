"""Module 09: batching and serving. A discrete-event simulator of an LLM server, and a small real engine.

    from course_lib.serving import make_workload, simulate, ContinuousBatching, StaticBatching, StepCostModel
    from course_lib.perf.metrics import format_summary
    reqs = make_workload(300, rate=10.0, arrival="bursty", seed=0)
    res = simulate(reqs, ContinuousBatching(max_batch=64), num_blocks=2000, block_size=16)
    print(format_summary(res.summary(ttft_slo=1.0, tpot_slo=0.1)))

This face holds what the notebook and Lab 09 use, and the real engine the notebook presents; the rest is
imported from its submodule. Workloads (``Request``, arrivals, lengths, JSONL/CSV traces) live in
``course_lib.perf.workload``, per-request records and their metrics (``Trace``, ``summarize``, ``goodput``)
in ``course_lib.perf.metrics``. Simulator: ``simulator`` (StepCostModel, simulate, sweep_load, SimResult,
SchedulingError), ``policies`` (the batching policies, the scheduler hook and ``fcfs_schedule``, its
reference, ``make_policy``), ``invariants``. Engine, split by role as nano-vllm: ``request``
(SamplingParams, StepOutput, EngineRequest), ``scheduler``, ``engine``, ``baselines``
(static_batch_generate, hf_static_generate), ``compare`` (compare_with_static). HTTP: ``server``,
``server_metrics``, ``loadtest``.
"""
# workloads and the metrics of the requests' records (re-exported from course_lib.perf)
from course_lib.perf.metrics import format_summary, goodput
from course_lib.perf.workload import Request, make_workload, synthetic_workload

# the simulator: a step's cost, a run, a load sweep, the rules a run must keep
from .simulator import StepCostModel, simulate, sweep_load
from .invariants import check_invariants, max_blocks_used
# batching policies, and the scheduler hook Lab 09 writes (what it sees, what it returns, the reference)
from .policies import (ChunkedPrefill, ContinuousBatching, Decision, Disaggregated, DynamicBatching, SeqView,
                       StaticBatching, fcfs_schedule)
# the real engine, and the engine against static batching on one workload
from .engine import Engine
from .request import SamplingParams
from .compare import compare_with_static

__all__ = ["Request", "make_workload", "synthetic_workload", "format_summary", "goodput", "StepCostModel",
           "simulate", "sweep_load", "check_invariants", "max_blocks_used", "StaticBatching", "DynamicBatching",
           "ContinuousBatching", "ChunkedPrefill", "Disaggregated", "SeqView", "Decision", "fcfs_schedule",
           "Engine", "compare_with_static"]
