"""Latency, throughput and cost metrics of LLM generation, computed from per-token timestamps.

A request starts at time ``start`` (when it was submitted) and produces tokens 0..n-1 at times
``t_0 <= t_1 <= ... <= t_{n-1}`` (seconds on one clock, e.g. ``time.perf_counter()``). From those:

    TTFT  time to first token          t_0 - start                  (prefill + first decode step)
    ITL   inter-token latencies        [t_i - t_{i-1} for i = 1..n-1]   (n - 1 gaps)
    TPOT  time per output token        (t_{n-1} - t_0) / (n - 1)    = mean ITL; needs n >= 2
    E2E   end-to-end latency           t_{n-1} - start              = TTFT + (n - 1) * TPOT
    tokens/s  (per request)            n / E2E                      what one user sees, prefill included
    decode rate                        1 / TPOT                     tokens/s once the first token is out

TPOT leaves out the first token on purpose: the first token pays for the whole prompt (prefill), the
others only for one decode step each; mixing the two hides both. Over many requests, report
percentiles (p50/p90/p99), never only the mean: a service is judged by its slow requests.

One record type holds a request's timeline, whoever served it: ``Trace`` (arrival, one ``TokenEvent`` per
token, finish, prompt length, finish reason). ``generation.generate``, the serving engine and the serving
simulator all fill it, and ``summarize`` turns many of them into percentiles, throughput and goodput.

``percentile(values, q)`` uses q in [0, 100] and numpy's default ("linear") interpolation.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from course_lib.validate import number

__all__ = [
    "TokenEvent", "Trace", "percentile", "percentiles", "ttft", "inter_token_latencies", "tpot",
    "e2e_latency", "tokens_per_second", "decode_tokens_per_second", "RequestMetrics",
    "request_metrics", "summarize", "format_summary", "makespan", "goodput", "queue_traces",
    "cost_per_million_tokens",
]


# --------------------------------------------------------------------------------------------------
# Percentiles
# --------------------------------------------------------------------------------------------------
def _as_floats(values, what: str) -> list[float]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of numbers, got {type(values).__name__}")
    try:
        out = [float(v) for v in values]
    except TypeError:
        raise TypeError(f"{what} must be a sequence of numbers, got {type(values).__name__}") from None
    if any(math.isnan(v) for v in out):
        raise ValueError(f"{what} contains NaN")
    return out


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]) of `values`, interpolating linearly between order statistics
    exactly as ``numpy.percentile(values, q)`` does by default.

    With the values sorted as v_0 <= ... <= v_{n-1}, the percentile sits at fractional rank
    r = q / 100 * (n - 1): the result is v_floor(r) + (r - floor(r)) * (v_floor(r)+1 - v_floor(r)).
    So p0 is the minimum, p100 the maximum, p50 the median. With few values the high percentiles are
    just the largest values: p99 of 20 requests lies between the two slowest ones.
    """
    xs = sorted(_as_floats(values, "values"))
    if not xs:
        raise ValueError("values must not be empty (a percentile of nothing is undefined)")
    q = number(q, "q", 0, 100)  # a percent, not a fraction
    rank = (len(xs) - 1) * (q / 100)  # fractional position in the sorted values
    lo = math.floor(rank)
    if lo >= len(xs) - 1:
        return xs[-1]
    a, b, frac = xs[lo], xs[lo + 1], rank - lo
    # numpy's two-sided lerp (same rounding): from the nearer neighbour
    return a + (b - a) * frac if frac < 0.5 else b - (b - a) * (1 - frac)


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99)) -> dict[float, float]:
    """{q: percentile(values, q)} for each q (default p50, p90, p99)."""
    xs = _as_floats(values, "values")
    return {q: percentile(xs, q) for q in qs}


# --------------------------------------------------------------------------------------------------
# One request: timestamps -> metrics
# --------------------------------------------------------------------------------------------------
def _check_times(times, what: str = "times") -> list[float]:
    ts = _as_floats(times, what)
    for i in range(1, len(ts)):
        if ts[i] < ts[i - 1]:
            raise ValueError(f"{what} must be non-decreasing (one clock, in order): "
                             f"{what}[{i}]={ts[i]!r} < {what}[{i - 1}]={ts[i - 1]!r}")
    return ts


def _check_start(start, ts: list[float]) -> float:
    if isinstance(start, bool) or not isinstance(start, numbers.Real) or math.isnan(start):
        raise TypeError(f"start must be a number (a timestamp in seconds), got {start!r}")
    if ts and ts[0] < start:
        raise ValueError(f"the first token time {ts[0]!r} is before start={start!r}: "
                         "negative duration (were the times taken on another clock?)")
    return float(start)


def _nonempty(ts: list[float], what: str = "times"):
    if not ts:
        raise ValueError(f"{what} is empty: no token was produced, so the metric is undefined")


def ttft(start: float, times: Sequence[float]) -> float:
    """Time to first token: times[0] - start (seconds)."""
    ts = _check_times(times)
    _nonempty(ts)
    return ts[0] - _check_start(start, ts)


def inter_token_latencies(times: Sequence[float]) -> list[float]:
    """The n - 1 gaps times[i] - times[i-1] between consecutive tokens (seconds)."""
    ts = _check_times(times)
    _nonempty(ts)
    return [b - a for a, b in zip(ts, ts[1:])]


def tpot(times: Sequence[float]) -> float:
    """Time per output token after the first: (times[-1] - times[0]) / (n - 1), the mean inter-token
    latency. Undefined (ValueError) for fewer than 2 tokens."""
    ts = _check_times(times)
    _nonempty(ts)
    if len(ts) < 2:
        raise ValueError(f"TPOT needs at least 2 token times (it averages the n - 1 gaps), got {len(ts)}")
    return (ts[-1] - ts[0]) / (len(ts) - 1)


def e2e_latency(start: float, times: Sequence[float]) -> float:
    """End-to-end latency: times[-1] - start, from submission to the last token (seconds)."""
    ts = _check_times(times)
    _nonempty(ts)
    return ts[-1] - _check_start(start, ts)


def tokens_per_second(start: float, times: Sequence[float]) -> float:
    """Output tokens per second of one request, prefill included: n / (times[-1] - start)."""
    elapsed = e2e_latency(start, times)
    if elapsed <= 0:
        raise ValueError(f"tokens/s needs a positive duration, got e2e latency {elapsed!r} s")
    return len(times) / elapsed


def decode_tokens_per_second(times: Sequence[float]) -> float:
    """Decode rate 1 / TPOT: tokens per second once the first token is out."""
    t = tpot(times)
    if t <= 0:
        raise ValueError(f"decode rate needs a positive TPOT, got {t!r} s")
    return 1.0 / t


# --------------------------------------------------------------------------------------------------
# Traces: the one record of a request (the generate loop, the serving engine and simulator fill it)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenEvent:
    """One generated token: its index in the output (0 = first), its id (None where there is no real
    token: the serving simulator), and when it was ready (``time.perf_counter()`` seconds after the
    token was on the host, or simulated seconds). ``start`` is the request's start on the same clock,
    so ``event.elapsed`` is the time since submission."""
    index: int
    token_id: int | None
    time: float
    start: float

    @property
    def elapsed(self) -> float:
        return self.time - self.start


@dataclass
class Trace:
    """The timeline of one request, whoever served it (``generation.generate``, the serving engine, the
    serving simulator): ``start`` (its arrival: when it was submitted), one TokenEvent per generated token,
    ``prompt_tokens``, and, when a server tracks them, its id ``rid``, the ``max_new_tokens`` it asked for,
    ``finish`` (when it ended; None while it runs), ``finish_reason`` ("length" | "stop" | "abort") and how many
    times it was ``preemptions`` preempted.

    Metrics are properties computed by the functions above: ``ttft`` = first token - start; ``tpot`` =
    (last token - first token) / (n - 1), **None for a one-token answer** (it has no gap between tokens:
    a TPOT of 0 would look like an infinitely fast decoder and pull every percentile down; ``summarize``
    leaves such requests out of the TPOT percentiles, and ``goodput`` counts them as meeting any TPOT
    limit); ``e2e`` = finish - start (finish defaults to the last token's time). A trace without tokens
    has no metrics (ValueError).
    """
    start: float
    events: list[TokenEvent] = field(default_factory=list)
    prompt_tokens: int = 0
    rid: int | None = None
    max_new_tokens: int | None = None
    finish: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0

    def add_token(self, time: float, token_id: int | None = None) -> TokenEvent:
        """Record the next token, ready at `time` (same clock as start); returns its TokenEvent."""
        event = TokenEvent(len(self.events), token_id, time, self.start)
        self.events.append(event)
        return event

    def end(self, time: float, reason: str | None = "length"):
        """Mark the request finished at `time` ("length": it reached its limit, "stop": a stop token,
        "abort": the serving engine dropped it, its client having left)."""
        self.finish, self.finish_reason = time, reason

    @property
    def times(self) -> list[float]:
        return [e.time for e in self.events]

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]

    @property
    def n_tokens(self) -> int:
        return len(self.events)

    def __len__(self):
        return len(self.events)

    @property
    def finished(self) -> bool:
        return self.finish is not None

    @property
    def first_token_time(self) -> float | None:
        return self.events[0].time if self.events else None

    @property
    def finish_time(self) -> float | None:
        """When it ended: ``finish`` if set, else its last token's time (None without tokens)."""
        if self.finish is not None:
            return self.finish
        return self.events[-1].time if self.events else None

    @property
    def ttft(self) -> float:
        return ttft(self.start, self.times)

    @property
    def tpot(self) -> float | None:
        ts = self.times
        return tpot(ts) if len(ts) != 1 else None

    @property
    def inter_token_latencies(self) -> list[float]:
        return inter_token_latencies(self.times)

    @property
    def e2e(self) -> float:
        ts = self.times
        return e2e_latency(self.start, ts if self.finish is None else ts + [self.finish])

    @property
    def tokens_per_second(self) -> float:
        elapsed = self.e2e
        if elapsed <= 0:
            raise ValueError(f"tokens/s needs a positive duration, got e2e latency {elapsed!r} s")
        return self.n_tokens / elapsed

    def metrics(self) -> "RequestMetrics":
        return request_metrics(self)


@dataclass(frozen=True)
class RequestMetrics:
    """The metrics of one request (seconds, tokens/s). ``tpot`` is None for a single-token output."""
    n_tokens: int
    ttft: float
    tpot: float | None
    e2e: float
    tokens_per_second: float


def _as_trace(x, i: int = 0) -> Trace:
    """A Trace from a Trace (what the serving engine returns), anything holding one in ``.trace`` (a
    GenerateOutput) or a (start, times) pair."""
    if isinstance(x, Trace):
        return x
    if isinstance(getattr(x, "trace", None), Trace):
        return x.trace
    if isinstance(x, tuple) and len(x) == 2:
        start, times = x
        tr = Trace(start)
        for t in _check_times(times):
            tr.add_token(t)
        return tr
    raise TypeError(f"records[{i}] must be a Trace, an object with a .trace, or a (start, times) pair, "
                    f"got {type(x).__name__}")


def request_metrics(trace_or_start, times: Sequence[float] | None = None) -> RequestMetrics:
    """All metrics of one request, from a Trace (or anything with a .trace) or from (start, times)."""
    tr = _as_trace(trace_or_start if times is None else (trace_or_start, list(times)))
    if not tr.events:
        raise ValueError("empty trace: the request produced no tokens, its metrics are undefined")
    return RequestMetrics(n_tokens=tr.n_tokens, ttft=tr.ttft, tpot=tr.tpot, e2e=tr.e2e,
                          tokens_per_second=tr.tokens_per_second)


# --------------------------------------------------------------------------------------------------
# Many requests: percentiles, throughput, goodput
# --------------------------------------------------------------------------------------------------
def _records(records) -> list[Trace]:
    if hasattr(records, "records"):          # a serving SimResult
        records = records.records
    if isinstance(records, (Trace, str, bytes)) or not isinstance(records, Iterable):
        raise TypeError(f"records must be a sequence of Traces (or a result with .records), "
                        f"got {type(records).__name__}")
    out = [_as_trace(r, i) for i, r in enumerate(records)]
    if not out:
        raise ValueError("records is empty: need at least one request to summarize")
    for i, tr in enumerate(out):
        if not tr.events:
            raise ValueError(f"records[{i}] is an empty trace: no token was produced, its metrics are undefined")
    return out


def makespan(records) -> float:
    """Seconds from the first arrival to the last finish over all requests."""
    recs = _records(records)
    return max(r.finish_time for r in recs) - min(r.start for r in recs)


def _meets(tr: Trace, ttft_slo: float, tpot_slo: float) -> bool:
    tp = tr.tpot
    return tr.ttft <= ttft_slo and (tp is None or tp <= tpot_slo)   # one token: no TPOT to miss


def _check_slos(ttft_slo, tpot_slo):
    number(ttft_slo, "ttft_slo", 0, low_open=True, finite=False)  # seconds; no limit at all is inf
    number(tpot_slo, "tpot_slo", 0, low_open=True, finite=False)


def goodput(records, ttft_slo: float, tpot_slo: float) -> float:
    """Requests per second of makespan that met *both* limits: TTFT <= ttft_slo and TPOT <= tpot_slo
    (limits included; a one-token answer has no TPOT and meets any TPOT limit)."""
    _check_slos(ttft_slo, tpot_slo)
    recs = _records(records)
    return sum(_meets(r, ttft_slo, tpot_slo) for r in recs) / makespan(recs)


def summarize(records, qs: Sequence[float] = (50, 90, 99), ttft_slo: float | None = None,
              tpot_slo: float | None = None) -> dict:
    """One flat dict over many requests (Traces, objects with a ``.trace``, (start, times) pairs, or a
    serving SimResult): ``requests``; ``ttft_p50``, ``tpot_p50``, ``e2e_p50``, ``tokens_per_second_p50``
    (and every q in qs: percentiles over requests, seconds); ``output_tokens``; ``makespan_s`` (first
    arrival to last finish), ``throughput_tok_s`` (output tokens / makespan) and ``requests_per_s``; with
    both SLOs: ``goodput_req_s`` and ``slo_attainment`` (share of requests meeting both).

    One-token requests have no TPOT and are left out of the TPOT percentiles only (the ``tpot_p*`` are
    None when no request has 2+ tokens). For tokens/s the *low* percentiles are the bad ones.
    """
    recs = _records(records)
    out: dict = {"requests": len(recs)}
    tp = [r.tpot for r in recs if r.tpot is not None]
    for name, xs in (("ttft", [r.ttft for r in recs]), ("tpot", tp), ("e2e", [r.e2e for r in recs]),
                     ("tokens_per_second", [r.tokens_per_second for r in recs])):
        for q in qs:
            out[f"{name}_p{q:g}"] = percentile(xs, q) if xs else None
    span = makespan(recs)
    out["output_tokens"] = sum(r.n_tokens for r in recs)
    out["makespan_s"] = span
    out["throughput_tok_s"] = out["output_tokens"] / span if span > 0 else None
    out["requests_per_s"] = len(recs) / span if span > 0 else None
    if (ttft_slo is None) != (tpot_slo is None):
        raise ValueError("give both ttft_slo and tpot_slo (goodput needs both limits) or neither")
    if ttft_slo is not None:
        _check_slos(ttft_slo, tpot_slo)
        ok = sum(_meets(r, ttft_slo, tpot_slo) for r in recs)
        out["goodput_req_s"] = ok / span if span > 0 else None
        out["slo_attainment"] = ok / len(recs)
    return out


def format_summary(summary: dict) -> str:
    """A small text report of ``summarize``'s dict (latencies in ms), with a serving run's extra keys
    (policy, mean_batch, preemptions, padding_waste) and the goodput when they are there."""
    s = summary
    qs = [k[len("ttft_p"):] for k in s if k.startswith("ttft_p")]
    head = f"{s['policy']}: " if "policy" in s else ""
    first = f"{head}{s['requests']} requests in {s['makespan_s']:.2f} s"
    if s.get("throughput_tok_s") is not None:
        first += f", throughput {s['throughput_tok_s']:.0f} tok/s"
    for key, fmt in (("mean_batch", "mean batch {:.1f}"), ("preemptions", "preemptions {}"),
                     ("padding_waste", "padding waste {:.0%}")):
        if key in s:
            first += ", " + fmt.format(s[key])
    cols = f"{'metric':<18}" + "".join(f"{'p' + q:>12}" for q in qs)
    lines = [first, cols, "-" * len(cols)]
    for key, label, scale in (("ttft", "TTFT (ms)", 1e3), ("tpot", "TPOT (ms)", 1e3),
                              ("e2e", "E2E (ms)", 1e3), ("tokens_per_second", "tokens/s", 1.0)):
        vals = [s.get(f"{key}_p{q}") for q in qs]
        lines.append(f"{label:<18}" + "".join(f"{'n/a':>12}" if v is None else f"{v * scale:>12.3f}" for v in vals))
    if s.get("goodput_req_s") is not None:
        lines.append(f"goodput {s['goodput_req_s']:.2f} req/s ({s['slo_attainment']:.0%} of requests meet the SLO)")
    return "\n".join(lines)


def queue_traces(requests, tpot: float) -> list[Trace]:
    """The traces the request model predicts for requests that one server handles one at a time, first come
    first served (Lab 00's prediction).

    The model of one request (``E2E = TTFT + (n - 1) x TPOT``): once the server takes it, its first token is
    ready ``ttft_s`` later (the prefill), and each further token ``tpot`` after the one before. The server takes
    a request at its arrival or when the previous request's last token is out, whichever is later, so a request
    that arrives while another runs waits.

    requests: ``(arrival_s, ttft_s, n_tokens)`` triples in order of arrival (arrivals >= 0 and non-decreasing,
    ``ttft_s >= 0``, ``n_tokens`` an int >= 1); tpot >= 0 seconds. Returns one Trace per request, in order,
    starting at its arrival: its ``ttft`` and ``e2e`` hold the wait in the queue, and ``makespan`` and
    ``summarize`` take the list as they take measured traces.
    """
    tpot = number(tpot, "tpot", 0)
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Iterable):
        raise TypeError(f"requests must be a sequence of (arrival_s, ttft_s, n_tokens), got {type(requests).__name__}")
    requests = list(requests)
    if not requests:
        raise ValueError("requests is empty: nothing to serve")
    traces, free, last_arrival = [], 0.0, 0.0
    for i, r in enumerate(requests):
        if isinstance(r, (str, bytes)) or not isinstance(r, Sequence) or len(r) != 3:
            raise ValueError(f"requests[{i}] must be a triple (arrival_s, ttft_s, n_tokens), got {r!r}")
        arrival = number(r[0], f"requests[{i}] arrival_s", 0)
        if arrival < last_arrival:
            raise ValueError(f"requests must be in order of arrival: requests[{i}] arrives at {arrival!r}, before "
                             f"requests[{i - 1}] at {last_arrival!r}")
        first_s = number(r[1], f"requests[{i}] ttft_s", 0)
        n = r[2]
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"requests[{i}] n_tokens must be an int >= 1, got {n!r}")
        first = max(arrival, free) + first_s              # taken on arrival or once the server is free
        trace = Trace(start=arrival, events=[], rid=i)
        for k in range(int(n)):
            trace.add_token(first + k * tpot)
        traces.append(trace)
        free, last_arrival = trace.times[-1], arrival
    return traces


# --------------------------------------------------------------------------------------------------
# Cost
# --------------------------------------------------------------------------------------------------
def cost_per_million_tokens(price_per_hour: float, tokens_per_second: float) -> float:
    """Dollars (or any currency) per 1M generated tokens for a machine rented at `price_per_hour`
    that sustains `tokens_per_second` (the *aggregate* throughput over all concurrent requests):

        cost = price_per_hour / (tokens_per_second * 3600) * 1e6
    """
    price_per_hour = number(price_per_hour, "price_per_hour", 0)
    tokens_per_second = number(tokens_per_second, "tokens_per_second", 0, low_open=True)
    return price_per_hour / (tokens_per_second * 3600.0) * 1e6
