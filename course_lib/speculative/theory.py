"""The speed-up model of speculative decoding, in a few lines.

Notation: a = acceptance rate (the probability that a draft token passes, assumed the same at every
position and independent), g = draft length, c = cost of one draft step / cost of one target step,
verify_cost = cost of one target pass over g+1 tokens / cost of one plain (one-token) target step.

Tokens emitted per pass: the first k drafts pass with probability a^k, and every pass emits one token
from the target (corrected or bonus), so

    E[tokens per pass] = 1 + a + a^2 + ... + a^g = (1 - a^(g+1)) / (1 - a)      (g + 1 when a = 1)

A pass costs g draft steps and one verification, so, against plain decoding (one target step per token),

    speed-up = E[tokens per pass] / (g c + verify_cost)

On a GPU at small batch a pass over g+1 tokens costs about as much as one token (both are memory-bound:
the weights are read once), so verify_cost ~ 1 is the usual idealization. On a CPU the pass is closer to
compute-bound and verify_cost grows with g: measure it and pass the measured value (or a function of g).

The break-even acceptance of a draft (g >= 1 drafts of cost c): the a at which speed-up = 1, below which
speculative decoding is slower than plain decoding. The speed-up rises with a, so it is the root of
E[tokens per pass](a) = g c + verify_cost; it is a = c for g = 1 (at verify_cost 1) and grows with g, since the
k-th draft is emitted only with probability a^k while it costs c like the first.
"""
from __future__ import annotations

from typing import Callable

import torch

from course_lib.validate import integer, number, probability

__all__ = ["expected_tokens_per_pass", "speedup", "optimal_draft_length", "break_even_acceptance",
           "acceptance_rate"]


def expected_tokens_per_pass(a: float, g: int) -> float:
    """(1 - a^(g+1)) / (1 - a): expected tokens one draft-verify pass emits (g + 1 at a = 1)."""
    a = probability(a, "a (acceptance rate)")
    g = integer(g, "g (draft length)", low=0)
    if a == 1:
        return float(g + 1)
    return (1 - a ** (g + 1)) / (1 - a)


def speedup(a: float, g: int, c: float, verify_cost: float = 1.0) -> float:
    """Predicted speed-up over plain decoding: E[tokens per pass] / (g c + verify_cost).

    verify_cost: target pass over g+1 tokens / one plain decode step (1.0 = the GPU idealization).
    """
    c = number(c, "c (draft/target cost ratio)", 0)
    verify_cost = number(verify_cost, "verify_cost", 0)
    tokens = expected_tokens_per_pass(a, g)
    cost = g * c + verify_cost
    if cost <= 0:
        raise ValueError("g * c + verify_cost must be > 0 (a pass cannot be free)")
    return tokens / cost


def optimal_draft_length(a: float, c: float, max_g: int = 16,
                         verify_cost: float | Callable[[int], float] = 1.0) -> int:
    """The g in 1..max_g with the largest predicted speed-up (the smallest such g on ties).

    verify_cost: a number (the same for every g) or a function g -> measured cost of verifying g drafts.
    """
    a = probability(a, "a (acceptance rate)")
    c = number(c, "c (draft/target cost ratio)", 0)
    max_g = integer(max_g, "max_g", low=1)
    cost = verify_cost if callable(verify_cost) else (lambda g: verify_cost)
    best_g, best = 1, -1.0
    for g in range(1, max_g + 1):
        s = speedup(a, g, c, float(cost(g)))
        if s > best + 1e-12:
            best_g, best = g, s
    return best_g


def break_even_acceptance(c: float, g: int, verify_cost: float = 1.0) -> float | None:
    """The acceptance rate at which speculative decoding with `g` drafts a pass is exactly as fast as plain
    decoding: speedup(a, g, c, verify_cost) = 1. Below it the draft makes decoding slower.

    0.0 when every a pays (a pass costs at most one plain step: g c + verify_cost <= 1); None when none does
    (even a = 1 gives less than one step's worth per step: g + 1 < g c + verify_cost, e.g. c > 1 at
    verify_cost 1). Found by bisection on [0, 1], where the tokens per pass rise strictly with a (g >= 1),
    to the last bit of a float. The tokens are summed (1 + a + ... + a^g, Horner's way), not taken from the
    closed form, whose 1 - a^(g+1) over 1 - a loses digits near a = 1: a draft as dear as its target
    breaks even at exactly 1.0.
    """
    c = number(c, "c (draft/target cost ratio)", 0)
    g = integer(g, "g (draft length)", low=1)
    verify_cost = number(verify_cost, "verify_cost", 0, low_open=True)
    cost = g * c + verify_cost                       # a pass, in target steps; plain decoding: 1 per token

    def tokens(a: float) -> float:                   # 1 + a + ... + a^g
        total = 1.0
        for _ in range(g):
            total = 1.0 + a * total
        return total

    if tokens(0.0) >= cost:
        return 0.0
    if tokens(1.0) < cost:
        return None
    lo, hi = 0.0, 1.0                                # tokens(lo) < cost <= tokens(hi)
    while True:
        mid = (lo + hi) / 2
        if not lo < mid < hi:                        # adjacent floats: hi is the smallest a that pays
            return hi
        if tokens(mid) < cost:
            lo = mid
        else:
            hi = mid


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) along the last dim: the chance one draft token passes (= 1 - total variation).

    p, q: [..., V] target and draft probabilities; returns [...].
    """
    if not isinstance(p, torch.Tensor) or not isinstance(q, torch.Tensor):
        raise TypeError("p and q must be torch tensors of probabilities [..., V]")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)
