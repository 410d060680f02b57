"""Argument checks, written once: each names the argument, says what was expected and shows what came.

    n = integer(n, "n", low=1)                 # "n must be a positive integer, got 0"
    p = number(p, "top_p", low=0, high=1, low_open=True)   # "top_p must be a number in (0, 1], got 1.5"
    x = optional(integer, x, "tokens", low=1)  # None passes through

A bool is never a number here (``True`` is an ``int`` to Python, but ``n=True`` is a bug at the call).
Every check returns the value converted (``int`` / ``float``), so a numpy integer or a 0-d tensor's
``.item()`` is normalised once, at the border.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["integer", "number", "optional", "one_of", "power_of_two", "probability"]


def _range_text(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def integer(x, name: str, low: int | None = None, high: int | None = None) -> int:
    """`x` as an int in [low, high] (either end may be None); ValueError naming `name` otherwise."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or \
            (low is not None and x < low) or (high is not None and x > high):
        if low == 1 and high is None:
            what = "a positive integer"
        else:
            what = "an integer" + _range_text(low, high, False, False)
        raise ValueError(f"{name} must be {what}, got {x!r}")
    return int(x)


def number(x, name: str, low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, finite: bool = True) -> float:
    """`x` as a float in the range (ends closed unless `low_open` / `high_open`); NaN is always refused,
    an infinity unless `finite=False`."""
    bad = isinstance(x, bool) or not isinstance(x, numbers.Real)
    if not bad:
        v = float(x)
        bad = (math.isnan(v) or (finite and math.isinf(v))
               or (low is not None and (v <= low if low_open else v < low))
               or (high is not None and (v >= high if high_open else v > high)))
    if bad:
        if low == 0 and low_open and high is None:
            what = "a positive number"
        else:
            what = "a number" + _range_text(low, high, low_open, high_open)
        if finite:
            what = what.replace("a ", "a finite ", 1)
        raise ValueError(f"{name} must be {what}, got {x!r}")
    return float(x)


def probability(x, name: str, *, zero: bool = True, one: bool = True) -> float:
    """A number in [0, 1]; `zero=False` / `one=False` open that end."""
    return number(x, name, 0, 1, low_open=not zero, high_open=not one)


def power_of_two(x, name: str, low: int = 1) -> int:
    """An integer power of two >= `low` (tile sizes, block sizes)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < low or x & (x - 1):
        raise ValueError(f"{name} must be a power of two >= {low}, got {x!r}")
    return int(x)


def one_of(x, name: str, choices) -> object:
    """`x` if it is one of `choices` (compared with ==); the message lists them."""
    choices = tuple(choices)
    if isinstance(x, (list, dict, set)) or x not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {x!r}")
    return x


def optional(check, x, name: str, *args, **kwargs):
    """None, or `check(x, name, ...)`: ``optional(integer, tokens, "tokens", low=1)``."""
    return None if x is None else check(x, name, *args, **kwargs)
