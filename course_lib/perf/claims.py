"""Timing claims: how a notebook states "X is faster than Y" without failing on a busy machine.

A notebook never asserts a timing: a laptop with a browser open, a shared Colab VM or a loaded CI runner
can make any measured comparison come out the other way once, and a student must never get an
AssertionError for that. Deterministic facts (bytes, FLOPs, equality, counts) stay asserts; a timing
is measured robustly (warm-up, interleaved repeats: ``course_lib.perf.timing.compare``) and stated
through ``timing_claim``, which shows a verdict and returns it:

    cmp = compare({"cached": cached_step, "recompute": recompute_step}, repeats=5)
    timing_claim("cached decoding is faster than recomputing", held=cmp.ratio("cached", "recompute") < 1,
                 measured=cmp.describe())

shows one line, "Claim held: <claim> (<measured>)" or "Claim did not hold on this run: <claim>
(<measured>). <advice>". In a notebook it is a display output (text/plain and text/html) whose output
metadata is ``{"course_claim": {"kind": "timing", "claim": ..., "held": ..., "measured": ...}}``: the
course's site build reads that metadata from executed notebooks and marks a page whose run had a claim
that did not hold. Outside IPython the plain line is printed. (It returns the verdict: end a cell whose
last line it is with ``;``, or the notebook shows the bool too.)
"""
from __future__ import annotations

import html

__all__ = ["DEFAULT_ADVICE", "METADATA_KEY", "claim_line", "timing_claim"]

METADATA_KEY = "course_claim"
DEFAULT_ADVICE = "Timings on a busy machine are noisy: close other programs and re-run this cell."


def _check_text(value, name: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be a non-empty string, got {value!r}")
    return value.strip()


def _as_bool(held) -> bool:
    # bool, or a numpy/torch scalar boolean (what `a < b` gives on their scalars); never a truthy number or list
    if isinstance(held, bool):
        return held
    if type(held).__name__ in ("bool_", "bool") and hasattr(held, "item"):   # numpy.bool_
        return bool(held.item())
    try:
        import torch
        if isinstance(held, torch.Tensor) and held.dtype == torch.bool and held.numel() == 1:
            return bool(held.item())
    except ImportError:  # pragma: no cover - torch is a dependency of the course
        pass
    raise TypeError(f"held must be a bool (the outcome of the comparison), got {type(held).__name__} {held!r}")


def claim_line(claim: str, held: bool, measured: str, advice: str | None = None) -> str:
    """The one-line verdict ``timing_claim`` shows (no display, no checks beyond the arguments')."""
    claim, measured = _check_text(claim, "claim"), _check_text(measured, "measured")
    advice = _check_text(advice, "advice", optional=True) or DEFAULT_ADVICE
    if _as_bool(held):
        return f"Claim held: {claim} ({measured})"
    return f"Claim did not hold on this run: {claim} ({measured}). {advice}"


def _html(claim: str, held: bool, measured: str, advice: str) -> str:
    e = html.escape
    if held:
        head, color, tail = "Claim held:", "#1a7f37", ""
    else:
        head, color, tail = "Claim did not hold on this run:", "#9a6700", f" {e(advice)}"
    return (f'<div class="course-claim course-claim-{"held" if held else "not-held"}" '
            f'style="border-left: 4px solid {color}; padding: 2px 8px; margin: 4px 0">'
            f'<b style="color: {color}">{head}</b> {e(claim)} <span style="opacity: 0.8">({e(measured)})</span>.'
            f'{tail}</div>')


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def timing_claim(claim: str, held, measured: str, advice: str | None = None) -> bool:
    """State a timing claim with its verdict on this run and return `held` (a bool).

    claim: what the text claims ("cached decoding is faster than recomputing").
    held: whether this run's measurement supports it (a bool, e.g. ``cmp.ratio("a", "b") < 1``).
    measured: the numbers it rests on, with their noise ("cached 1.20 ms, recompute 5.10 ms; fastest of 5
    interleaved runs, spread 3%"; ``Comparison.describe()`` writes this).
    advice: what to do when it did not hold (default: close other programs and re-run the cell).
    Never raises because of the outcome: a claim that did not hold is shown as such, with its numbers.
    """
    line = claim_line(claim, held, measured, advice)
    held = _as_bool(held)
    claim, measured = claim.strip(), measured.strip()
    shell = _ipython()
    if shell is None:
        print(line)
        return held
    from IPython.display import display
    advice_text = (advice or "").strip() or DEFAULT_ADVICE
    display({"text/plain": line, "text/html": _html(claim, held, measured, advice_text)}, raw=True,
            metadata={METADATA_KEY: {"kind": "timing", "claim": claim, "held": held, "measured": measured}})
    return held
