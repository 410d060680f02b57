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

``percentile(values, q)`` uses q in [0, 100] and numpy's default ("linear") interpolation.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Iterable, Sequence

__all__ = [
    "TokenEvent", "Trace", "percentile", "percentiles", "ttft", "inter_token_latencies", "tpot",
    "e2e_latency", "tokens_per_second", "decode_tokens_per_second", "RequestMetrics",
    "request_metrics", "summarize", "format_summary", "cost_per_million_tokens",
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
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or math.isnan(q) or not 0 <= q <= 100:
        raise ValueError(f"q must be a number in [0, 100] (a percent, not a fraction), got {q!r}")
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
# Traces: what a generate loop records
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenEvent:
    """One generated token: its index in the output (0 = first), its id, and when it was ready
    (``time.perf_counter()`` seconds, after the token was on the host). ``start`` is the request's
    start on the same clock, so ``event.elapsed`` is the time since submission."""
    index: int
    token_id: int
    time: float
    start: float

    @property
    def elapsed(self) -> float:
        return self.time - self.start


@dataclass
class Trace:
    """The timeline of one request: start time, one TokenEvent per generated token, prompt length.

    Metrics are properties (``trace.ttft``, ``trace.tpot``, ...) computed by the functions above.
    """
    start: float
    events: list[TokenEvent] = field(default_factory=list)
    prompt_tokens: int = 0

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
    def ttft(self) -> float:
        return ttft(self.start, self.times)

    @property
    def tpot(self) -> float:
        return tpot(self.times)

    @property
    def inter_token_latencies(self) -> list[float]:
        return inter_token_latencies(self.times)

    @property
    def e2e(self) -> float:
        return e2e_latency(self.start, self.times)

    @property
    def tokens_per_second(self) -> float:
        return tokens_per_second(self.start, self.times)

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


def _start_times(trace_or_start, times=None) -> tuple[float, list[float]]:
    if times is None:
        if not hasattr(trace_or_start, "start") or not hasattr(trace_or_start, "times"):
            raise TypeError("expected a Trace (with .start and .times) or (start, times)")
        return trace_or_start.start, list(trace_or_start.times)
    return trace_or_start, list(times)


def request_metrics(trace_or_start, times: Sequence[float] | None = None) -> RequestMetrics:
    """All metrics of one request, from a Trace or from (start, times)."""
    start, ts = _start_times(trace_or_start, times)
    if not ts:
        raise ValueError("empty trace: the request produced no tokens, its metrics are undefined")
    return RequestMetrics(n_tokens=len(ts), ttft=ttft(start, ts), tpot=tpot(ts) if len(ts) > 1 else None,
                          e2e=e2e_latency(start, ts), tokens_per_second=tokens_per_second(start, ts))


# --------------------------------------------------------------------------------------------------
# Many requests: percentiles
# --------------------------------------------------------------------------------------------------
def summarize(traces: Iterable, qs: Sequence[float] = (50, 90, 99)) -> dict[str, dict]:
    """Percentiles over requests of each metric: {"ttft": {50: s, 90: s, 99: s}, "tpot": ..., "e2e": ...,
    "tokens_per_second": ...}, plus {"requests": n}.

    Each element of `traces` is a Trace (or a (start, times) pair). Requests with a single token have
    no TPOT and are left out of the TPOT percentiles only (``summary["tpot"]`` is None when none has 2+).
    Note that for tokens/s the *low* percentiles are the bad ones.
    """
    ms = []
    for tr in traces:
        ms.append(request_metrics(*tr) if isinstance(tr, tuple) else request_metrics(tr))
    if not ms:
        raise ValueError("traces is empty: need at least one request to summarize")
    tp = [m.tpot for m in ms if m.tpot is not None]
    return {
        "requests": len(ms),
        "ttft": percentiles([m.ttft for m in ms], qs),
        "tpot": percentiles(tp, qs) if tp else None,
        "e2e": percentiles([m.e2e for m in ms], qs),
        "tokens_per_second": percentiles([m.tokens_per_second for m in ms], qs),
    }


def format_summary(summary: dict) -> str:
    """A small text table of ``summarize``'s output (latencies in ms)."""
    qs = list(summary["ttft"])
    head = f"{'metric':<18}" + "".join(f"{'p%g' % q:>12}" for q in qs)
    lines = [f"{summary['requests']} requests", head, "-" * len(head)]
    for key, label, scale in (("ttft", "TTFT (ms)", 1e3), ("tpot", "TPOT (ms)", 1e3),
                              ("e2e", "E2E (ms)", 1e3), ("tokens_per_second", "tokens/s", 1.0)):
        row = summary[key]
        if row is None:
            lines.append(f"{label:<18}" + "".join(f"{'n/a':>12}" for _ in qs))
        else:
            lines.append(f"{label:<18}" + "".join(f"{row[q] * scale:>12.3f}" for q in qs))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Cost
# --------------------------------------------------------------------------------------------------
def cost_per_million_tokens(price_per_hour: float, tokens_per_second: float) -> float:
    """Dollars (or any currency) per 1M generated tokens for a machine rented at `price_per_hour`
    that sustains `tokens_per_second` (the *aggregate* throughput over all concurrent requests):

        cost = price_per_hour / (tokens_per_second * 3600) * 1e6
    """
    for name, v in (("price_per_hour", price_per_hour), ("tokens_per_second", tokens_per_second)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or math.isinf(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if price_per_hour < 0:
        raise ValueError(f"price_per_hour must be >= 0, got {price_per_hour!r}")
    if tokens_per_second <= 0:
        raise ValueError(f"tokens_per_second must be > 0, got {tokens_per_second!r}")
    return price_per_hour / (tokens_per_second * 3600.0) * 1e6
