"""The course's one learning-rate schedule: linear warm-up, then cosine decay to a tenth of the peak.

Every trainer uses it (the bundled models, distillation, the Medusa, EAGLE and MTP heads), so one formula
decides all of their runs; the expression below is the one they were trained with, operation for operation.
"""
from __future__ import annotations

import math

from course_lib.validate import integer, number

FLOOR = 0.1   # the decayed learning rate at the last step, as a fraction of the peak


def cosine_lr(step: int, steps: int, peak: float, warmup: int = 0) -> float:
    """The learning rate at `step` (0-based) of `steps`: `peak` x min(1, (step + 1) / warmup) (no warm-up when
    `warmup` is 0) x (0.1 + 0.9 x (1 + cos(pi step / steps)) / 2)."""
    steps = integer(steps, "steps", low=1)
    step = integer(step, "step", low=0)
    warmup = integer(warmup, "warmup", low=0)
    peak = number(peak, "peak", low=0.0)
    decay = FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * step / steps))
    return peak * min(1.0, (step + 1) / warmup) * decay if warmup else peak * decay


__all__ = ["cosine_lr", "FLOOR"]
