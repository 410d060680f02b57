"""The acceptance step of speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Notation used everywhere in ``course_lib.speculative``:
    p   TARGET probabilities (the model whose distribution we must reproduce)
    q   DRAFT probabilities (the cheap model that proposes tokens)
    g   draft length (gamma): tokens proposed per pass
    a   acceptance rate (alpha); c: draft/target cost ratio per token

One pass: the draft samples g tokens t_0..t_{g-1} from q; the target scores them all in one forward,
giving p at the g draft positions plus one more (the "bonus" position). Then, left to right:

    accept t_i with probability min(1, p_i(t_i) / q_i(t_i))          (a coin flip, not a threshold)
    on the first rejection: emit one token from normalize(max(0, p_i - q_i)) and stop
    if all g are accepted: emit a bonus token from p_g (the target's next-token distribution)

Why this is exact: token x is emitted at position i by acceptance with probability q(x) min(1, p(x)/q(x))
= min(p(x), q(x)); it is rejected with total probability 1 - sum_x min(p(x), q(x)) = sum_x max(0, p(x)-q(x)),
and then drawn from max(0, p - q) normalized. The two add up to min(p, q) + max(0, p - q) = p(x).
Resampling from p itself on rejection (a common mistake) over-weights the tokens the draft likes; dropping
the bonus token wastes the target's last row. At temperature 0 p and q are one-hot, so the rule becomes
greedy verification: accept iff the draft picked the target's argmax, otherwise emit the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.generation import sampling_probs

__all__ = ["StepResult", "accept_step", "probs_from_logits"]

_SUM_TOL = 1e-3  # rows of p and q must sum to 1 within this (float32 softmax over a large vocab is ~1e-6)


@dataclass
class StepResult:
    """What one acceptance step decided.

    tokens: the tokens to emit, accepted drafts followed by one corrected (residual) or bonus token,
        so always num_accepted + 1 tokens.
    num_accepted: how many draft tokens passed (0..g).
    draws: the uniform u drawn for each tested draft token (len = tokens tested).
    ratios: min(1, p/q) of each tested draft token (its acceptance probability).
    residual: [V] the normalized max(0, p_i - q_i) sampled at the rejection, None if all passed.
    bonus: True when all g drafts passed and the last token came from p[g].
    """
    tokens: list[int]
    num_accepted: int
    draws: list[float]
    ratios: list[float]
    residual: torch.Tensor | None
    bonus: bool


def probs_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None) -> torch.Tensor:
    """Probabilities [..., V] (float32) that sampling would use: temperature, then top-k, then top-p.

    Temperature 0 gives a one-hot at the argmax (ties: the lowest index, like ``torch.argmax``). Use the
    same settings for p and q: the acceptance rule then reproduces the *filtered* target distribution.
    """
    return sampling_probs(logits, temperature, top_k, top_p)


def _check_probs(x, name, rows):
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[0] != rows:
        raise ValueError(f"{name} must have shape [{rows}, V], got {tuple(x.shape)}")
    if rows == 0:
        return
    # One pass over the data: min >= 0 is False for NaN, and an inf makes its row sum fail below.
    if not float(x.min()) >= 0:
        raise ValueError(f"{name} must hold finite, non-negative probabilities")
    sums = x.sum(-1, dtype=torch.float64)
    bad = ~((sums - 1).abs() <= _SUM_TOL)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"every row of {name} must sum to 1; row {i} sums to {float(sums[i]):.6f}")


def accept_step(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor,
                generator: torch.Generator | None = None) -> StepResult:
    """Verify g draft tokens against the target: which to keep, and which token comes next.

    p: [g+1, V] target probabilities at the g draft positions and the bonus position (row g).
    q: [g, V] draft probabilities the draft tokens were sampled from.
    draft_tokens: [g] int64, draft_tokens[i] ~ q[i].
    generator: a seeded ``torch.Generator`` (on the device of p) makes the step reproducible.

    Every random number comes from `generator`: one uniform per tested draft token, then one
    multinomial draw (residual or bonus).
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError("draft_tokens must be an integer torch.Tensor of shape [g]")
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must have shape [g], got {tuple(draft_tokens.shape)}")
    g = draft_tokens.shape[0]
    _check_probs(p, "p (target probabilities)", g + 1)
    _check_probs(q, "q (draft probabilities)", g)
    if q.shape[-1] != p.shape[-1]:
        raise ValueError(f"p and q must share the vocabulary size, got V={p.shape[-1]} and V={q.shape[-1]}")
    V = p.shape[-1]
    toks = draft_tokens.tolist()
    if any(not 0 <= t < V for t in toks):
        raise ValueError(f"draft_tokens must be token ids in [0, {V}), got {toks}")
    device = generator.device if generator is not None else p.device
    p = p.to(device=device, dtype=torch.float64)  # float64: exact ratios, clean residuals
    q = q.to(device=device, dtype=torch.float64)
    # The probabilities of the drafted tokens under both models, [g] each.
    idx = torch.arange(g, device=device)
    dt = draft_tokens.to(device)
    p_tok = p[idx, dt].tolist()
    q_tok = q[idx, dt].tolist()
    for i, (t, qt) in enumerate(zip(toks, q_tok)):
        if qt <= 0:
            raise ValueError(f"q[{i}, {t}] = 0 but the draft proposed token {t} at position {i}: the draft "
                             "tokens must be sampled from q (same temperature/top-k/top-p)")

    tokens: list[int] = []
    draws: list[float] = []
    ratios: list[float] = []
    for i in range(g):
        ratio = min(1.0, p_tok[i] / q_tok[i])
        u = float(torch.rand((), generator=generator, device=device))
        draws.append(u)
        ratios.append(ratio)
        if u < ratio:                      # accepted with probability min(1, p/q)
            tokens.append(toks[i])
            continue
        # Rejected: draw from the part of p that q under-covers, normalize(max(0, p - q)).
        residual = torch.clamp(p[i] - q[i], min=0)
        total = residual.sum()
        if total <= 0:  # p == q up to rounding: then a rejection has probability ~0; p is the right law
            residual, total = p[i], p[i].sum()
        residual = residual / total
        tokens.append(int(torch.multinomial(residual, 1, generator=generator)))
        return StepResult(tokens, i, draws, ratios, residual.to(torch.float32), False)
    # All g drafts passed: the target's last row gives one more token for free.
    tokens.append(int(torch.multinomial(p[g], 1, generator=generator)))
    return StepResult(tokens, g, draws, ratios, None, True)
