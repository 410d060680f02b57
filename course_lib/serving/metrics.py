"""Serving metrics from a simulation: latency percentiles, throughput, goodput under an SLO, invariants.

    res.summary(ttft_slo=1.0, tpot_slo=0.1)      # == summarize(res, ...)
    check_invariants(res)                         # [] when every rule held
    sweep_load(make, policies, rates)             # throughput and p90 latency vs offered load

Definitions (per request): TTFT = first token - arrival; TPOT = (last token - first token) / (tokens - 1);
end-to-end = finish - arrival. Throughput = output tokens / makespan (first arrival to last finish).
Goodput = requests that met *both* SLOs (TTFT <= ttft_slo and TPOT <= tpot_slo) per second of makespan:
a server that is fast on average but misses the SLO for most users has a high throughput and a low goodput.
"""
from __future__ import annotations

import numpy as np

from course_lib.perf.metrics import percentiles   # Module 00's definition (numpy's linear interpolation)


def makespan(result) -> float:
    recs = result.records
    return max(r.finish_s for r in recs) - min(r.arrival_s for r in recs)


def goodput(result, ttft_slo: float, tpot_slo: float) -> float:
    """Requests per second that met both the TTFT and the TPOT limit."""
    for name, v in (("ttft_slo", ttft_slo), ("tpot_slo", tpot_slo)):
        if v is None or not v > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
    ok = sum(1 for r in result.records if r.ttft <= ttft_slo and r.tpot <= tpot_slo)
    return ok / makespan(result)


def summarize(result, ttft_slo: float | None = None, tpot_slo: float | None = None) -> dict:
    """A flat dict: ttft_p50/p90/p99, tpot_*, e2e_*, throughput_tok_s, requests_per_s, makespan_s,
    preemptions, padding_waste (share of computed token slots that were padding), and with both SLOs
    given: goodput_req_s and slo_attainment (share of requests meeting both)."""
    recs = result.records
    out = {"policy": result.policy, "requests": len(recs)}
    for name, xs in (("ttft", [r.ttft for r in recs]), ("tpot", [r.tpot for r in recs if r.output_tokens > 1]),
                     ("e2e", [r.e2e for r in recs])):
        for q, v in percentiles(xs or [0.0]).items():
            out[f"{name}_p{q}"] = v
    span = makespan(result)
    out["makespan_s"] = span
    out["throughput_tok_s"] = sum(r.output_tokens for r in recs) / span
    out["requests_per_s"] = len(recs) / span
    out["preemptions"] = len(result.preemptions)
    computed = sum(s.prefill_tokens + s.decode_seqs for s in result.steps)
    useful = sum(s.useful_tokens for s in result.steps)
    out["padding_waste"] = 1 - useful / computed if computed else 0.0
    busy = sum(s.t1 - s.t0 for s in result.steps)
    out["mean_batch"] = sum((s.t1 - s.t0) * s.batch for s in result.steps) / busy if busy else 0.0
    if ttft_slo is not None and tpot_slo is not None:
        out["goodput_req_s"] = goodput(result, ttft_slo, tpot_slo)
        out["slo_attainment"] = sum(1 for r in recs if r.ttft <= ttft_slo and r.tpot <= tpot_slo) / len(recs)
    return out


def format_metrics(summary: dict) -> str:
    """A few readable lines of a summary dict (times in ms)."""
    s = summary
    lines = [f"{s['policy']}: {s['requests']} requests in {s['makespan_s']:.2f} s, "
             f"throughput {s['throughput_tok_s']:.0f} tok/s, mean batch {s['mean_batch']:.1f}, "
             f"preemptions {s['preemptions']}, padding waste {s['padding_waste']:.0%}"]
    for m in ("ttft", "tpot", "e2e"):
        lines.append(f"  {m.upper():5s} p50 {1e3 * s[m + '_p50']:8.1f} ms   p90 {1e3 * s[m + '_p90']:8.1f} ms   "
                     f"p99 {1e3 * s[m + '_p99']:8.1f} ms")
    if "goodput_req_s" in s:
        lines.append(f"  goodput {s['goodput_req_s']:.2f} req/s ({s['slo_attainment']:.0%} of requests meet the SLO)")
    return "\n".join(lines)


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
        if r.finish_s is None or len(r.token_times) != r.output_tokens:
            bad.append(f"request {r.rid} emitted {len(r.token_times)} of {r.output_tokens} tokens"
                       + ("" if r.finish_s is not None else " and never finished"))
            continue
        if any(b < a for a, b in zip(r.token_times, r.token_times[1:])) or r.token_times[0] < r.arrival_s:
            bad.append(f"request {r.rid}: token times are not monotone after its arrival")
    arrival = {r.rid: (r.arrival_s, r.rid) for r in result.records}
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


def sweep_load(make_requests, policies: dict, rates, cost=None, num_blocks: int = 2048, block_size: int = 16,
               ttft_slo=None, tpot_slo=None) -> list[dict]:
    """Simulate every policy at every offered load. make_requests(rate) -> requests; policies:
    {label: policy}. Returns rows: summarize(...) plus 'label' and 'rate'."""
    from course_lib.serving.simulator import simulate
    rows = []
    for rate in rates:
        reqs = make_requests(rate)
        for label, pol in policies.items():
            res = simulate(reqs, pol, cost=cost, num_blocks=num_blocks, block_size=block_size)
            row = summarize(res, ttft_slo, tpot_slo)
            row.update(label=label, rate=float(rate))
            rows.append(row)
    return rows


__all__ = ["summarize", "goodput", "makespan", "format_metrics", "check_invariants", "max_blocks_used",
           "sweep_load"]
