"""Assertions for lab tests: each failure says what was checked, what was expected and what came.

A student reads these messages, so they name the function and the inputs in plain words.
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


def check_close(actual, expected, what: str, rtol: float = 1e-5, atol: float = 1e-8):
    """Numbers or arrays equal within tolerance (NaN equals NaN)."""
    if actual is None:
        raise AssertionError(f"{what}: got None - did the function return its result?")
    a, e = _arr(actual), _arr(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: expected shape {e.shape}, got shape {a.shape}")
    if not np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        idx = tuple(int(i[0]) for i in np.nonzero(bad)) if a.ndim else ()
        where = f" (first mismatch at index {idx}: expected {e[idx]:.6g}, got {a[idx]:.6g})" if a.ndim else ""
        raise AssertionError(f"{what}: expected {_short(e)}, got {_short(a)}{where}")


def check_equal(actual, expected, what: str):
    """Exact equality (ints, strings, tensors of codes, tuples)."""
    if isinstance(expected, (torch.Tensor, np.ndarray)):
        a, e = _arr(actual), _arr(expected)
        if a.shape != e.shape or not np.array_equal(a, e):
            raise AssertionError(f"{what}: expected {_short(e)}, got {_short(a)}")
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)) and math.isclose(actual, expected):
        return
    if actual != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


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
