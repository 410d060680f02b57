"""Workloads: when requests arrive, how long their prompts are, how many tokens they generate.

    from course_lib.perf.workload import make_workload, save_trace, load_trace   # also from course_lib.serving
    reqs = make_workload(200, rate=8.0, arrival="bursty", cv=3.0, seed=0)
    save_trace(reqs, "trace.jsonl"); load_trace("trace.jsonl") == reqs

The one request description of the course: ``Request(rid, arrival_s, prompt_tokens, output_tokens,
max_new_tokens=None)``. Module 06 (KV memory waste, ``course_lib.paged``), the serving simulator and the
real engine of Module 09 (``course_lib.serving``) all take it. It lives here, in the measurement layer
(``course_lib.perf``, the bottom of the library), and not in ``serving``, because ``paged`` sits below
``serving`` and needs it too; its field names match the request timeline ``course_lib.perf.metrics.Trace``
(``prompt_tokens``; ``n_tokens`` generated).

Generators (all seeded, host only: a workload is plain Python data):

* ``make_workload``: Poisson or bursty arrivals (gamma gaps of coefficient of variation ``cv`` > 1: the same
  mean rate in clumps, what real traffic looks like and what hurts tail latency), lognormal lengths clipped
  to the context, or rows of an empirical (prompt_tokens, output_tokens) table;
* ``limited_workload``: everything queued at t=0, each request with an API-style ``max_new_tokens`` limit
  larger than what it will generate (the reservation a contiguous KV allocator must make: Module 06);
* ``synthetic_workload``: log-uniform prompt lengths over a range and clipped lognormal outputs, for the
  small engine on the bundled model (Module 09's benchmark).
"""
from __future__ import annotations

import csv
import json
import math
import numbers
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from course_lib.validate import integer, number, optional

__all__ = ["Request", "poisson_arrivals", "bursty_arrivals", "lognormal_lengths", "make_workload",
           "limited_workload", "synthetic_workload", "offered_load", "save_trace", "load_trace"]


@dataclass(frozen=True)
class Request:
    """One request: it arrives at ``arrival_s`` (seconds), has ``prompt_tokens`` to prefill and generates
    exactly ``output_tokens`` new tokens (a simulation knows the length in advance; a real model may stop
    early). ``max_new_tokens``: the limit the client asked for (>= output_tokens), what a server that
    cannot know the length must plan for; None means the limit is the length itself."""
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_new_tokens: int | None = None

    def __post_init__(self):
        # a frozen record: checked, not converted (the names carry the request, one of many in a trace)
        number(self.arrival_s, f"arrival_s of request {self.rid}", 0)
        integer(self.prompt_tokens, f"prompt_tokens of request {self.rid}", low=1)
        integer(self.output_tokens, f"output_tokens of request {self.rid}", low=1)
        m = self.max_new_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < self.output_tokens):
            raise ValueError(f"max_new_tokens must be None or an integer >= output_tokens={self.output_tokens}, "
                             f"got {m!r} (request {self.rid})")

    @property
    def limit(self) -> int:
        """The most tokens it may generate: max_new_tokens, or output_tokens when no limit was given."""
        return self.output_tokens if self.max_new_tokens is None else self.max_new_tokens


def poisson_arrivals(n: int, rate: float, rng=None) -> np.ndarray:
    """n arrival times (s) of a Poisson process with `rate` requests/s: exponential gaps of mean 1/rate."""
    n, rate = integer(n, "n", low=0), number(rate, "rate", 0, low_open=True)
    rng = np.random.default_rng(rng)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def bursty_arrivals(n: int, rate: float, cv: float = 3.0, rng=None) -> np.ndarray:
    """n arrival times with gamma-distributed gaps: mean 1/rate, coefficient of variation `cv`.

    Gamma with shape k = 1/cv^2 and scale 1/(rate k) has mean 1/rate and std cv/rate; cv = 1 is Poisson,
    cv > 1 is burstier (many tiny gaps, a few very long ones)."""
    n, rate = integer(n, "n", low=0), number(rate, "rate", 0, low_open=True)
    cv = number(cv, "cv", 0, low_open=True)
    rng = np.random.default_rng(rng)
    k = 1.0 / cv ** 2
    return np.cumsum(rng.gamma(k, 1.0 / (rate * k), size=n))


def lognormal_lengths(n: int, median: float, sigma: float, low: int = 1, high: int | None = None,
                      rng=None) -> np.ndarray:
    """n integer lengths from a lognormal with the given median (exp(mu)) and log-std `sigma`,
    rounded and clipped to [low, high]."""
    n, median = integer(n, "n", low=0), number(median, "median", 0, low_open=True)
    sigma = number(sigma, "sigma", 0, finite=False)
    rng = np.random.default_rng(rng)
    x = np.rint(median * np.exp(sigma * rng.standard_normal(n))).astype(np.int64)
    return np.clip(x, low, high if high is not None else np.iinfo(np.int64).max)


def make_workload(n: int, rate: float, *, arrival: str = "poisson", cv: float = 3.0, prompt_median: float = 256,
                  prompt_sigma: float = 0.8, output_median: float = 128, output_sigma: float = 0.8,
                  max_context: int = 2048, min_output: int = 2, lengths_table=None, seed=0) -> list[Request]:
    """A seeded list of `n` requests sorted by arrival.

    arrival: 'poisson' or 'bursty' (gamma gaps with coefficient of variation `cv`).
    Lengths: lognormal (medians and log-stds above); the prompt is clipped to max_context - min_output
    and the output to what is left of the context, so every request fits in `max_context` tokens.
    lengths_table: instead, a sequence of (prompt_tokens, output_tokens) pairs to sample rows from
    (an empirical distribution, e.g. measured from a production log).
    """
    n = integer(n, "n", low=0)
    rate = number(rate, "rate", 0, low_open=True)
    max_context = integer(max_context, "max_context", low=0)
    min_output = integer(min_output, "min_output", low=1)
    if max_context < min_output + 1:
        raise ValueError(f"max_context must be >= min_output + 1 = {min_output + 1}, got {max_context}")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        t = poisson_arrivals(n, rate, rng)
    elif arrival == "bursty":
        t = bursty_arrivals(n, rate, cv, rng)
    else:
        raise ValueError(f"arrival must be 'poisson' or 'bursty', got {arrival!r}")
    if lengths_table is not None:
        table = np.asarray(lengths_table, dtype=np.int64)
        if table.ndim != 2 or table.shape[1] != 2 or len(table) == 0 or (table < 1).any():
            raise ValueError("lengths_table must be a non-empty sequence of (prompt_tokens, output_tokens) pairs "
                             f"of positive integers, got shape {table.shape}")
        rows = table[rng.integers(0, len(table), size=n)]
        p = np.clip(rows[:, 0], 1, max_context - min_output)
        o = np.clip(rows[:, 1], min_output, None)
    else:
        p = lognormal_lengths(n, prompt_median, prompt_sigma, 1, max_context - min_output, rng)
        o = lognormal_lengths(n, output_median, output_sigma, min_output, None, rng)
    o = np.minimum(o, max_context - p)
    return [Request(i, float(t[i]), int(p[i]), int(o[i])) for i in range(n)]


def limited_workload(n: int, seed: int = 0, max_context: int = 2048, prompt_median: float = 180,
                     prompt_sigma: float = 0.9, output_median: float = 140, output_sigma: float = 1.0,
                     max_new_choices=(256, 512, 1024, 2048), max_new_weights=(0.2, 0.3, 0.3, 0.2)) -> list[Request]:
    """`n` requests all queued at t=0, with log-normal prompt and output lengths (the long-tailed shape of
    chat traces such as ShareGPT) and an API-style max_new_tokens limit drawn from `max_new_choices`; the
    prompt is at most half the context and the limit fits in what is left (Module 06's waste study)."""
    n = integer(n, "n", low=1)
    rng = random.Random(seed)
    out = []
    for rid in range(n):
        p = int(min(max(4, rng.lognormvariate(math.log(prompt_median), prompt_sigma)), max_context // 2))
        max_new = min(rng.choices(max_new_choices, max_new_weights)[0], max_context - p)
        o = int(min(max(1, rng.lognormvariate(math.log(output_median), output_sigma)), max_new))
        out.append(Request(rid, 0.0, p, o, max_new))
    return out


def synthetic_workload(n: int = 64, seed: int = 0, rate: float | None = None, prompt_range=(8, 192),
                       output_range=(4, 128), output_median: float = 24.0, sigma: float = 1.0) -> list[Request]:
    """`n` requests for the engine on a small model: prompt lengths log-uniform in prompt_range, output
    lengths lognormal (median output_median, log-std sigma) clipped to output_range, arrivals Poisson at
    ``rate`` per second starting at 0 (all at 0 when rate is None)."""
    n = integer(n, "n", low=0)
    rate = optional(number, rate, "rate", 0, low_open=True)
    (lo, hi), (olo, ohi) = prompt_range, output_range
    if not 1 <= lo <= hi or not 1 <= olo <= ohi:
        raise ValueError(f"prompt_range and output_range must be (low, high) with 1 <= low <= high, "
                         f"got {prompt_range!r} and {output_range!r}")
    rng = np.random.default_rng(seed)
    plen = np.rint(np.exp(math.log(lo) + rng.random(n) * (math.log(hi) - math.log(lo)))).astype(np.int64)
    olen = lognormal_lengths(n, output_median, sigma, olo, ohi, rng)
    arr = np.zeros(n) if rate is None else poisson_arrivals(n, rate, rng)
    if n and rate is not None:
        arr = arr - arr[0]
    return [Request(i, float(arr[i]), int(plen[i]), int(olen[i])) for i in range(n)]


def offered_load(requests) -> float:
    """Requests per second over the arrival window (n - 1 gaps / (last - first arrival))."""
    ts = sorted(r.arrival_s for r in requests)
    if len(ts) < 2 or ts[-1] == ts[0]:
        raise ValueError("requests must hold at least two different arrival times")
    return (len(ts) - 1) / (ts[-1] - ts[0])


_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")


def save_trace(requests, path) -> Path:
    """Write a trace: JSON lines (``.jsonl``/``.json``) or CSV (``.csv``), fields arrival_s,
    prompt_tokens, output_tokens (and rid, and max_new_tokens where one is set)."""
    path = Path(path)
    rows = [{k: v for k, v in asdict(r).items() if v is not None} for r in requests]
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=("rid", *_FIELDS, "max_new_tokens"))
            w.writeheader()
            w.writerows(rows)
    elif path.suffix in (".jsonl", ".json"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        raise ValueError(f"path must end in .jsonl, .json or .csv, got {str(path)!r}")
    return path


def load_trace(path) -> list[Request]:
    """Read a trace written by save_trace (or by hand: rid and max_new_tokens are optional), sorted by arrival."""
    path = Path(path)
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    elif path.suffix in (".jsonl", ".json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"path must end in .jsonl, .json or .csv, got {str(path)!r}")
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in _FIELDS if k not in r]
        if missing:
            raise ValueError(f"{path}: row {i} lacks {missing} (expected fields {_FIELDS})")
        limit = r.get("max_new_tokens")
        out.append(Request(int(r.get("rid", i)), float(r["arrival_s"]), int(r["prompt_tokens"]),
                           int(r["output_tokens"]), None if limit in (None, "") else int(limit)))
    return sorted(out, key=lambda r: (r.arrival_s, r.rid))
