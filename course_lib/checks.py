"""Assertions for lab tests: each failure says what was checked, what was expected and what came.

A student reads these messages, so they name the function and the inputs in plain words.

Feedback that diagnoses: `check_close` and `check_equal` take ``mistakes={explanation: value}``, the
values that known misconceptions give on the same inputs (a hidden test computes them with the planted
wrong answer). When the student's result matches one, the message leads with that explanation ("your
causal mask is aligned top-left ...; see 07 section 3") before the numbers. The explanations are public
text: each lab keeps them in its visible ``MISTAKES`` dict, so a hidden test that names one leaks nothing.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _arr(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=float)


def _short(x, n=6):
    a = np.asarray(x)
    if a.size <= n:
        return np.array2string(a, precision=5) if a.ndim else f"{a.item():.6g}"
    flat = a.reshape(-1)[:n]
    return np.array2string(flat, precision=5)[:-1] + " ...] shape " + str(tuple(a.shape))


def _close(a, e, rtol, atol) -> bool:
    return a.shape == e.shape and bool(np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True))


def _diagnosis(actual, mistakes, same) -> str:
    """The explanation of the first known mistake whose value `actual` matches, as a message prefix."""
    for explanation, value in (mistakes or {}).items():
        try:
            if same(actual, value):
                return f"this looks like a known mistake: {explanation}. "
        except Exception:  # noqa: BLE001 - a value of another kind is simply not this mistake
            continue
    return ""


def check_close(actual, expected, what: str, rtol: float = 1e-5, atol: float = 1e-8, mistakes: dict | None = None):
    """Numbers or arrays equal within tolerance (NaN equals NaN). `mistakes`: {explanation: the value
    that mistake gives}; a match names the misconception in the message."""
    if actual is None:
        raise AssertionError(f"{what}: got None - did the function return its result?")
    a, e = _arr(actual), _arr(expected)
    if _close(a, e, rtol, atol):
        return
    hint = _diagnosis(a, mistakes, lambda x, v: _close(x, _arr(v), rtol, atol))
    if a.shape != e.shape:
        raise AssertionError(f"{what}: {hint}expected shape {e.shape}, got shape {a.shape}")
    where = _first_mismatch(a, e, ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True))
    raise AssertionError(f"{what}: {hint}expected {_short(e)}, got {_short(a)}{where}")


def _first_mismatch(a, e, bad) -> str:
    """' (first mismatch at index ...: expected ..., got ...)' for arrays of one shape, '' for 0-d ones."""
    if not a.ndim:
        return ""
    idx = tuple(int(i[0]) for i in np.nonzero(bad))
    return f" (first mismatch at index {idx}: expected {e[idx]:.6g}, got {a[idx]:.6g})"


def _equal(actual, expected) -> bool:
    if isinstance(expected, (torch.Tensor, np.ndarray)):
        try:
            a = _arr(actual)
        except Exception:  # noqa: BLE001 - not an array of numbers (a string, None): not equal
            return False
        e = _arr(expected)
        return a.shape == e.shape and bool(np.array_equal(a, e))
    if isinstance(expected, float) and isinstance(actual, (int, float)) and math.isclose(actual, expected):
        return True
    return bool(actual == expected)


def check_equal(actual, expected, what: str, mistakes: dict | None = None):
    """Exact equality (ints, strings, tensors of codes, tuples). `mistakes` as in `check_close`."""
    if _equal(actual, expected):
        return
    hint = _diagnosis(actual, mistakes, _equal)
    if actual is None:
        raise AssertionError(f"{what}: {hint}got None - did the function return its result?")
    if isinstance(expected, (torch.Tensor, np.ndarray)):
        try:
            a, e = _arr(actual), _arr(expected)
        except Exception:  # noqa: BLE001 - not an array at all: say what it is
            raise AssertionError(f"{what}: {hint}expected an array {_short(_arr(expected))}, got {actual!r}") from None
        if a.shape != e.shape:
            raise AssertionError(f"{what}: {hint}expected shape {e.shape}, got shape {a.shape}")
        raise AssertionError(f"{what}: {hint}expected {_short(e)}, got {_short(a)}{_first_mismatch(a, e, a != e)}")
    raise AssertionError(f"{what}: {hint}expected {expected!r}, got {actual!r}")


def diagnose(actual, mistakes: dict, rtol: float = 1e-5, atol: float = 1e-8) -> str | None:
    """The explanation of the known mistake `actual` matches (numbers or arrays, within tolerance), or
    None: for a test that checks something other than one value (a raised error, a property)."""
    try:
        a = _arr(actual)
    except Exception:  # noqa: BLE001
        return None
    for explanation, value in (mistakes or {}).items():
        try:
            if _close(a, _arr(value), rtol, atol):
                return explanation
        except Exception:  # noqa: BLE001
            continue
    return None


def check_shape(actual, shape, what: str):
    got = tuple(getattr(actual, "shape", ()))
    if got != tuple(shape):
        raise AssertionError(f"{what}: expected shape {tuple(shape)}, got {got}")


def check_raises(fn, exc_type, what: str):
    """fn() must raise exc_type (e.g. ValueError for bad input)."""
    try:
        fn()
    except exc_type:
        return
    except Exception as e:  # wrong kind of error
        raise AssertionError(f"{what}: expected {exc_type.__name__}, got {type(e).__name__}: {e}") from None
    raise AssertionError(f"{what}: expected {exc_type.__name__} to be raised, but nothing was raised")
