"""The one learning-rate schedule (course_lib.schedule.cosine_lr): the formula every trainer used before it
was shared, to the last bit, so that the bundled models and heads train as they did."""
import math

import pytest

from course_lib.schedule import FLOOR, cosine_lr


@pytest.mark.parametrize("steps,peak,warmup", [(1500, 3e-3, 100), (600, 1e-3, 50), (700, 1e-2, 0), (1, 0.5, 1)])
def test_cosine_lr_is_the_trainers_formula_bit_for_bit(steps, peak, warmup):
    for step in range(steps):
        decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
        want = peak * min(1.0, (step + 1) / warmup) * decay if warmup else peak * decay
        assert cosine_lr(step, steps, peak, warmup) == want, step


def test_cosine_lr_shape():
    lrs = [cosine_lr(s, 1000, 1.0, 100) for s in range(1000)]
    assert lrs[0] == pytest.approx(0.01, rel=1e-3) and max(lrs) == pytest.approx(lrs[99])       # warm-up to step 100
    assert all(a >= b for a, b in zip(lrs[99:], lrs[100:]))                                      # then decays
    assert lrs[-1] == pytest.approx(FLOOR, abs=1e-5) and cosine_lr(0, 10, 2.0) == 2.0


@pytest.mark.parametrize("kw,match", [(dict(step=-1), "step"), (dict(steps=0), "steps"), (dict(peak=-1.0), "peak"),
                                      (dict(warmup=1.5), "warmup"), (dict(step=True), "step")])
def test_cosine_lr_bad_arguments(kw, match):
    args = dict(step=0, steps=10, peak=1e-3, warmup=0) | kw
    with pytest.raises(ValueError, match=match):
        cosine_lr(**args)
