"""The rules every simulated serving run must obey (``check_invariants``), and its peak KV use.

The latency metrics (TTFT, TPOT, e2e, throughput, goodput) are not here: they are
``course_lib.perf.metrics.summarize`` over the run's records (``SimResult.summary()`` adds the step
statistics).
"""
from __future__ import annotations

import numpy as np

__all__ = ["check_invariants", "max_blocks_used"]


def check_invariants(result, requests=None) -> list[str]:
    """The rules every run must obey; returns the broken ones as messages ([] = all good).

    * no step uses more KV blocks than num_blocks (per worker);
    * every request finished and emitted exactly output_tokens tokens, at non-decreasing times, the first
      one after its arrival;
    * first admissions on each worker follow arrival order (first come, first served), and no new request is admitted on
      a worker while a request it preempted is still waiting to resume;
    * time never goes backwards in the step log of a worker, and its steps do not overlap;
    * the scheduler reported no violation (strict=False runs).
    """
    bad = list(result.violations)
    for s in result.steps:
        if s.blocks_used is not None and s.blocks_used > result.num_blocks:
            bad.append(f"step at t={s.t0:.4f} on worker {s.worker} uses {s.blocks_used} KV blocks > "
                       f"num_blocks={result.num_blocks}")
            break
    last = {}
    for s in result.steps:
        if s.t1 < s.t0 or s.t0 < last.get(s.worker, -np.inf) - 1e-12:
            bad.append(f"time went backwards on worker {s.worker} at t={s.t0:.4f}")
            break
        last[s.worker] = s.t1
    if requests is not None:
        want = {r.rid: r.output_tokens for r in requests}
        got = {r.rid for r in result.records}
        if set(want) != got:
            bad.append(f"the result holds requests {sorted(got ^ set(want))[:5]} that differ from the workload")
    for r in result.records:
        ts = r.times
        if r.finish is None or len(ts) != r.max_new_tokens:
            bad.append(f"request {r.rid} emitted {len(ts)} of {r.max_new_tokens} tokens"
                       + ("" if r.finish is not None else " and never finished"))
            continue
        if any(b < a for a, b in zip(ts, ts[1:])) or ts[0] < r.start:
            bad.append(f"request {r.rid}: token times are not monotone after its arrival")
    arrival = {r.rid: (r.start, r.rid) for r in result.records}
    for w in sorted({a[2] for a in result.admissions}):        # each worker serves its own queue in order
        order = [a[1] for a in result.admissions if a[3] == "new" and a[2] == w]
        if order != sorted(order, key=lambda rid: arrival[rid]):
            bad.append(f"first admissions on worker {w} are not in arrival order: {order[:12]}...")
    # a preempted request must be resumed before any new request is admitted on that worker
    pending = {}
    events = sorted([(t, 0, rid, w) for t, rid, w in result.preemptions]
                    + [(t, 1, rid, w, k) for t, rid, w, k in result.admissions], key=lambda e: (e[0], e[1]))
    for e in events:
        if e[1] == 0:
            pending.setdefault(e[3], set()).add(e[2])
        else:
            w, rid, kind = e[3], e[2], e[4]
            if kind == "resume":
                pending.get(w, set()).discard(rid)
            elif kind == "new" and pending.get(w):
                bad.append(f"t={e[0]:.4f}: new request {rid} admitted while preempted {sorted(pending[w])} "
                           f"still wait (preempted requests go first)")
                break
    return bad


def max_blocks_used(result) -> int:
    return max((s.blocks_used or 0) for s in result.steps)
