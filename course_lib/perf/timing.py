"""Timing done right: warm-up, device synchronization, repeats, and the median with its spread.

On a GPU, work is queued asynchronously: reading a wall clock without synchronizing measures the
launch, not the work. ``benchmark`` uses CUDA events there and ``time.perf_counter`` elsewhere.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from course_lib.env import sync
from course_lib.perf.metrics import percentile


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

    def __repr__(self):
        return (f"Timing(median={self.median * 1e3:.3f} ms, iqr={self.iqr * 1e3:.3f} ms, "
                f"n={len(self.times)}, warmup={self.warmup})")


def benchmark(fn, *args, warmup: int = 3, repeats: int = 10, device=None, min_time: float = 0.0,
              **kwargs) -> Timing:
    """Time ``fn(*args, **kwargs)``: `warmup` calls first (caches, allocator, lazy init, compilation),
    then at least `repeats` timed calls (more until `min_time` seconds have passed), each synchronized."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    dev = torch.device(device) if device is not None else None
    use_events = dev is not None and dev.type == "cuda"
    for _ in range(warmup):
        fn(*args, **kwargs)
    sync(dev) if dev is not None else None
    times: list[float] = []
    start_all = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start_all < min_time:
        if use_events:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args, **kwargs)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            if dev is not None:
                sync(dev)
            times.append(time.perf_counter() - t0)
    return Timing(times, warmup)
