"""Timing done right: warm-up, device synchronization, repeats, and the median with its spread.

On a GPU, work is queued asynchronously: reading a wall clock without synchronizing measures the
launch, not the work. ``benchmark`` uses CUDA events there and ``time.perf_counter`` elsewhere.

Comparing two ways of doing something on a machine that is also doing other things (a laptop with a
browser open, a shared CI runner or Colab VM) needs one more rule: **interleave**. ``compare`` runs the
candidates in rounds, one call of each per round in rotating order, so a burst of background load slows
all of them alike instead of landing on whichever was being timed then; ``Comparison.ratio`` pairs the
calls of one round. On a CPU, ``clock="cpu"`` times a call by the process's CPU time (all its threads)
instead of the wall clock: the work itself, without the time spent waiting for a core that another
program holds (for single-threaded work on a quiet machine the two agree).

    cmp = compare({"cached": lambda: step(cache), "recompute": lambda: step(None)}, repeats=5)
    cmp.ratio("recompute", "cached")     # median over the rounds of recompute / cached
    cmp.describe()                       # 'cached 1.20 ms, recompute 5.10 ms; fastest of 5 interleaved runs, spread 3%'

This is the course's one measuring loop (warm-up, a device sync before and after each timed call, repeats,
min / median and spread); every other timing helper builds its callable and calls one of these:
``benchmark`` (one callable; ``inner=n`` times n back-to-back calls as one sample, ``after=`` runs untimed
after every call, e.g. a KV-cache crop), ``interleave`` (one or more callables, as ``compare`` times them),
``timed_call`` (one call that runs once, and its result).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from course_lib.env import sync
from course_lib.perf.metrics import percentile
from course_lib.validate import integer, number

_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}
_STATS = ("min", "median")
# The clocks by name: seconds as a float. Looked up at each measurement, so a test can put a fake clock in
# (monkeypatch.setitem(timing.CLOCKS, "wall", fake)) and check what a caller computes from it.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class Timing:
    """Seconds per call over `repeats` measured calls (after `warmup` unmeasured ones)."""
    times: list[float] = field(repr=False)
    warmup: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    def quantile(self, q: float) -> float:
        return percentile(self.times, q * 100)

    @property
    def iqr(self) -> float:
        return self.quantile(0.75) - self.quantile(0.25)

    @property
    def spread(self) -> float:
        """The relative spread, IQR / median: 0.05 means the middle half of the calls lie within 5% of the
        median's size. On a quiet machine a few percent; under background load it grows."""
        med = self.median
        return self.iqr / med if med > 0 else 0.0

    def __repr__(self):
        return (f"Timing(median={self.median * 1e3:.3f} ms, iqr={self.iqr * 1e3:.3f} ms, "
                f"n={len(self.times)}, warmup={self.warmup})")


def _timer(device, clock: str = "wall", inner: int = 1):
    """(device, timed): ``timed(fn)`` waits for the device to be idle, calls fn() `inner` times back to back
    and returns (the last call's result, seconds per call): CUDA events on a GPU (the work, not the launch),
    else the clock ``CLOCKS[clock]`` around the calls and a device sync."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}, got {clock!r}")
    dev = torch.device(device) if device is not None else None
    if clock == "cpu" and dev is not None and dev.type != "cpu":
        raise ValueError(f"clock='cpu' times work on the CPU; the device is {dev} (use clock='wall')")
    if dev is not None and dev.type == "cuda":
        def timed(fn):
            sync(dev)                      # start from an idle device: earlier work is not this call's
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                out = fn()
            b.record()
            b.synchronize()
            return out, a.elapsed_time(b) / 1e3 / inner
        return dev, timed

    def timed(fn):
        now = CLOCKS[clock]
        if dev is not None:
            sync(dev)
        t0 = now()
        for _ in range(inner):
            out = fn()
        if dev is not None:
            sync(dev)
        return out, (now() - t0) / inner
    return dev, timed


def _rounds(fns: dict, warmup: int, repeats: int, device, clock: str, inner: int = 1, after=None,
            min_time: float = 0.0) -> dict[str, Timing]:
    """The one measuring loop: `warmup` unmeasured rounds, then rounds (at least `repeats`, more until
    `min_time` seconds have passed) in which each candidate runs once, the order rotating by one per round;
    ``after[name]()`` runs untimed after each of name's calls (warm-up ones too)."""
    repeats, warmup = integer(repeats, "repeats", low=1), integer(warmup, "warmup", low=0)
    inner = integer(inner, "inner", low=1)
    min_time = number(min_time, "min_time", 0, finite=False)  # seconds
    after = dict(after or {})
    if after and inner > 1:
        raise ValueError("after runs between calls, so it cannot be used with inner > 1 (back-to-back calls)")
    dev, timed = _timer(device, clock, inner)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
            if name in after:
                after[name]()
    if dev is not None:
        sync(dev)
    times: dict[str, list[float]] = {name: [] for name in names}
    start_all = time.perf_counter()
    r = 0
    while r < repeats or time.perf_counter() - start_all < min_time:
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(timed(fns[name])[1])
            if name in after:
                after[name]()
        r += 1
    return {name: Timing(times[name], warmup) for name in names}


def benchmark(fn, *args, warmup: int = 3, repeats: int = 10, device=None, min_time: float = 0.0,
              clock: str = "wall", inner: int = 1, after: Callable[[], object] | None = None, **kwargs) -> Timing:
    """Time ``fn(*args, **kwargs)``: `warmup` calls first (caches, allocator, lazy init, compilation),
    then at least `repeats` timed calls (more until `min_time` seconds of wall time have passed), each
    synchronized; `clock` "wall" or "cpu" (see the module's docstring).

    `inner` > 1 times `inner` back-to-back calls as one sample (seconds per call = their time / inner):
    for calls too short to time one by one, or whose launches should overlap. `after` (no arguments)
    runs untimed after every call, e.g. to crop a KV cache back so that every call sees the same length."""
    if after is not None and not callable(after):
        raise TypeError(f"after must be callable or None, got {type(after).__name__}")
    call = lambda: fn(*args, **kwargs)  # noqa: E731
    return _rounds({"fn": call}, warmup, repeats, device, clock, inner,
                   None if after is None else {"fn": after}, min_time)["fn"]


def timed_call(fn: Callable[[], object], device=None, clock: str = "wall") -> tuple[object, float]:
    """(fn(), seconds) of one synchronized call, no warm-up: for work that runs once and whose result is
    needed (a whole generation), after the caller has warmed it up itself."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    return _timer(device, clock)[1](fn)


def interleave(fns: Mapping, warmup: int = 1, repeats: int = 5, device=None, clock: str = "wall",
               after: Mapping | None = None) -> dict:
    """Time one or more callables (no arguments) interleaved, as ``compare`` does: {name: Timing}.
    ``after[name]`` (optional, no arguments) runs untimed after each of name's calls. ``compare`` is this
    for two or more candidates, with their ``Comparison``."""
    if not isinstance(fns, Mapping) or not fns:
        raise TypeError(f"fns must be a non-empty mapping of names to callables, got {fns!r}")
    for kind, d in (("fns", fns), ("after", after or {})):
        if not isinstance(d, Mapping):
            raise TypeError(f"{kind} must be a mapping of names to callables, got {d!r}")
        bad = [name for name, f in d.items() if not callable(f)]
        if bad:
            raise TypeError(f"{kind}[{bad[0]!r}] must be callable, got {type(d[bad[0]]).__name__}")
    unknown = [name for name in (after or {}) if name not in fns]
    if unknown:
        raise ValueError(f"after names {unknown} that are not candidates; the candidates are {list(fns)}")
    return _rounds(dict(fns), warmup, repeats, device, clock, after=after)


@dataclass
class Comparison:
    """Timings of several candidates measured interleaved: ``timings[name].times[r]`` is `name`'s call in
    round r, and every candidate ran once in every round."""
    timings: dict[str, Timing]
    clock: str = "wall"

    def __post_init__(self):
        lengths = {len(t.times) for t in self.timings.values()}
        if len(self.timings) < 2 or len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"timings must hold 2 or more candidates with one call per round each, got "
                             f"{ {k: len(t.times) for k, t in self.timings.items()} }")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {tuple(CLOCKS)}, got {self.clock!r}")

    def __getitem__(self, name: str) -> Timing:
        try:
            return self.timings[name]
        except KeyError:
            raise KeyError(f"no candidate {name!r}; the candidates are {list(self.timings)}") from None

    @property
    def rounds(self) -> int:
        return len(next(iter(self.timings.values())).times)

    def time(self, name: str, stat: str = "min") -> float:
        """Seconds per call of `name`: its fastest call ("min", the least disturbed) or its median."""
        if stat not in _STATS:
            raise ValueError(f"stat must be one of {_STATS}, got {stat!r}")
        return getattr(self[name], stat)

    def ratio(self, a: str, b: str) -> float:
        """How many times `b`'s time `a` takes: the median over the rounds of a's call / b's call in the
        same round (paired, so a burst of load that slows one round cancels out of its ratio)."""
        ta, tb = self[a].times, self[b].times
        if min(tb) <= 0:
            raise ValueError(f"a call of {b!r} took no measurable time on the {self.clock} clock: time more "
                             f"work per call")
        return statistics.median(x / y for x, y in zip(ta, tb))

    @property
    def spread(self) -> float:
        """The largest relative spread (IQR / median) among the candidates: the noise of this measurement."""
        return max(t.spread for t in self.timings.values())

    def note(self, stat: str = "min") -> str:
        """How the numbers were taken, for a claim's measured text: 'fastest of 5 interleaved runs, spread 8%'."""
        if stat not in _STATS:
            raise ValueError(f"stat must be one of {_STATS}, got {stat!r}")
        how = "fastest" if stat == "min" else "median"
        cpu = ", CPU time" if self.clock == "cpu" else ""
        return f"{how} of {self.rounds} interleaved runs{cpu}, spread {self.spread:.0%}"

    def describe(self, stat: str = "min", unit: str = "ms", digits: int = 2) -> str:
        """Each candidate's time and the note: 'cached 1.20 ms, recompute 5.10 ms; fastest of 5 interleaved runs,
        spread 3%'."""
        if unit not in _UNITS:
            raise ValueError(f"unit must be one of {list(_UNITS)}, got {unit!r}")
        parts = ", ".join(f"{name} {self.time(name, stat) * _UNITS[unit]:.{digits}f} {unit}" for name in self.timings)
        return f"{parts}; {self.note(stat)}"

    def __repr__(self):
        return f"Comparison({self.describe('median')})"


def compare(fns: Mapping[str, Callable[[], object]], warmup: int = 1, repeats: int = 5,
            device=None, clock: str = "wall") -> Comparison:
    """Time several callables (no arguments; use a lambda) interleaved: `warmup` rounds unmeasured, then
    `repeats` rounds in which each runs once, the order rotating by one per round (A B C, B C A, C A B,
    ...), so neither the background load nor the cache state a neighbour leaves behind favours one.
    `clock` "wall" or "cpu" (see the module's docstring)."""
    if not isinstance(fns, Mapping) or len(fns) < 2:
        raise TypeError(f"fns must be a mapping of 2 or more names to callables, got {fns!r}")
    return Comparison(interleave(fns, warmup, repeats, device, clock), clock)
