"""Sampling: how logits become the next token, and how speculative decoding accepts a draft's tokens.

The bottom of the generation stack (it imports only torch and ``course_lib.validate``), so that the one
generate loop (``course_lib.generation``), speculative decoding, the serving engine and distillation all
draw tokens the same way. ``course_lib.generation`` re-exports the sampling functions; ``course_lib.speculative``
re-exports the acceptance step.

Sampling turns the logits of the last position into the next token, in small composable steps
(the order Hugging Face uses too: temperature, then top-k, then top-p):

    apply_temperature(logits, t)   logits / t; t < 1 sharpens, t > 1 flattens
    top_k_filter(logits, k)        keep the k largest logits (ties with the k-th kept), others -> -inf
    top_p_filter(logits, p)        keep the smallest set of most likely tokens whose probability reaches p
                                   (the token that crosses p is kept; the most likely token always is)
    sampling_probs(logits, ...)    the distribution `sample` draws from (one-hot at the argmax for t = 0)
    sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None)
                                   temperature 0 means greedy (argmax, no randomness)

Before them, one step that looks at the text so far instead of the distribution alone:

    apply_repetition_penalty(logits, tokens, penalty)
                                   every token id already in `tokens` (prompt and output) gets its logit
                                   divided by `penalty` when positive, multiplied when negative (CTRL's
                                   penalized sampling with Hugging Face's sign rule; Keskar et al., 2019)

``sample_rows(logits, temperatures, top_ks, top_ps, generators)`` draws each row with its own settings
and generator (a batch of requests: the serving engine, a static batch through ``generate``);
and when a sequence ends: ``finish_reason(token, count, max_new_tokens, stop_ids)`` ("stop" after a stop
token, which is kept; "length" at max_new_tokens), the rule of the generate loop and the serving engine.

The acceptance step of speculative decoding (Module 08; the derivation is in
``course_lib.speculative.acceptance``): ``accept_step(p, q, draft_tokens, generator)`` keeps draft token
t_i with probability min(1, p_i(t_i) / q_i(t_i)), draws the first rejected position from
normalize(max(0, p - q)), and adds a bonus token from p when every draft passed, so the output is
distributed exactly as sampling from p. ``probs_from_logits`` gives p and q with the same settings.

Shapes: logits [..., V] (any leading batch dims); sampled tokens [...]; p [g+1, V], q [g, V].
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from course_lib.validate import integer, number, optional, probability

__all__ = ["SamplingParams", "apply_temperature", "top_k_filter", "top_p_filter", "sampling_probs", "sample", "greedy",
           "apply_repetition_penalty", "penalize_seen", "sample_rows", "finish_reason", "StepResult", "accept_step",
           "probs_from_logits", "probs_unchecked", "draw_unchecked", "probs_or_onehot_unchecked"]


# --------------------------------------------------------------------------------------------------
# How a request is decoded
# --------------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class SamplingParams:
    """How one request is decoded, for every entrance: ``generate(..., params=)``, the serving engine, the
    OpenAI-style server, the static baselines. Its fields are checked here, once (the border); the per-token
    paths (``sample_rows``, generate's draw) do not check them again. An unknown field
    (``SamplingParams(temprature=0.5)``) is a TypeError.

    max_new_tokens: tokens to generate (>= 1). temperature 0 = greedy. top_k / top_p: filters (None = off).
    seed: seeds this request's own torch.Generator (on the model's device), so its sampled tokens do not
    depend on the batch (the engine: None draws a seed on the host from torch's global CPU generator when the
    request is added; ``generate``: None uses its ``generator=`` argument, or torch's global one).
    stop_token_ids: generation ends after one of these tokens (it is included in the output).
    repetition_penalty: > 0, 1 = none (``apply_repetition_penalty``, as ``generate``'s and vLLM's): every
    token id already in the request (prompt or output) has its logit divided by it when
    positive, multiplied when negative, before temperature, top-k and top-p; at temperature 0 too.
    """
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: tuple = ()
    repetition_penalty: float = 1.0

    def __post_init__(self):
        # checked, not converted: the fields keep the values the caller gave
        integer(self.max_new_tokens, "max_new_tokens", low=1)
        number(self.temperature, "temperature", 0)   # 0 = greedy
        number(self.repetition_penalty, "repetition_penalty", 0, low_open=True)
        optional(integer, self.top_k, "top_k", low=1)
        optional(probability, self.top_p, "top_p", zero=False)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        stops = self.stop_token_ids
        if isinstance(stops, numbers.Integral):
            stops = (stops,)
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in stops):
            raise TypeError(f"stop_token_ids must be token ids (ints), got {self.stop_token_ids!r}")
        self.stop_token_ids = tuple(int(s) for s in stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# --------------------------------------------------------------------------------------------------
# Argument checks (shared by the sampling functions, generate and speculative decoding)
# --------------------------------------------------------------------------------------------------
def _check_logits(logits):
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        got = type(logits).__name__ + (f" of {logits.dtype}" if isinstance(logits, torch.Tensor) else "")
        raise TypeError(f"logits must be a floating-point torch.Tensor of shape [..., vocab], got {got}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}")


# --------------------------------------------------------------------------------------------------
# Sampling, step by step
# --------------------------------------------------------------------------------------------------
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature (temperature > 0). Temperature 0 has no distribution: it is greedy,
    which ``sample``/``sampling_probs`` handle; here it is an error."""
    _check_logits(logits)
    temperature = number(temperature, "temperature", 0)   # 0 = greedy, refused just below
    if temperature == 0:
        raise ValueError("temperature must be > 0 to rescale logits (temperature 0 means greedy: "
                         "use sample(..., temperature=0) or greedy(logits))")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the others to -inf.

    Tokens tied with the k-th largest logit are kept as well (so a row may keep more than k), as in
    Hugging Face's TopKLogitsWarper. k >= vocab keeps everything.
    """
    _check_logits(logits)
    return _top_k(logits, integer(k, "top_k", low=1))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose total probability reaches p;
    set the others to -inf.

    Sorted by probability (descending), token i is kept when the probability of the tokens before it
    is still below p, so the token that crosses p is kept, and the most likely token always is.
    p = 1 keeps everything. Ties are broken by the sort (stable: lower index first).
    """
    _check_logits(logits)
    return _top_p(logits, probability(p, "top_p", zero=False))


# The unchecked arithmetic: the checked functions above and below, and the per-token paths of generate and
# the engine (whose settings were checked once, at the border: SamplingParams, generate's arguments), call it.
def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [..., 1] the k-th largest value
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # [..., V]
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more likely tokens
    remove_sorted = before >= p
    remove_sorted[..., 0] = False  # the most likely token is always kept
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)  # back to vocab order
    return logits.masked_fill(remove, float("-inf"))


def probs_unchecked(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """``sampling_probs`` for temperature > 0 without its checks: softmax after temperature, top-k, top-p, in
    float32. For the per-token paths whose settings were checked at the border."""
    x = logits.float() / temperature
    if top_k is not None:
        x = _top_k(x, top_k)
    if top_p is not None:
        x = _top_p(x, top_p)
    return torch.softmax(x, dim=-1)


def draw_unchecked(logits: torch.Tensor, temperature: float, top_k, top_p, generator) -> torch.Tensor:
    """``sample`` without its checks: one token per row of [..., V], the argmax at temperature 0, else a draw
    from ``probs_unchecked``. For the per-token paths whose settings were checked at the border."""
    if temperature == 0:
        return torch.argmax(logits, dim=-1)
    probs = probs_unchecked(logits, temperature, top_k, top_p)
    idx = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)  # [N, 1]
    return idx.reshape(probs.shape[:-1])


def apply_repetition_penalty(logits: torch.Tensor, tokens, penalty: float) -> torch.Tensor:
    """The repetition penalty of CTRL (Keskar et al., 2019, "penalized sampling"): the logit of every token id
    that occurs in `tokens` is divided by `penalty` if it is positive and multiplied by it if it is negative,
    so penalty > 1 always makes a seen token less likely (1 changes nothing; in (0, 1) favours repeats).

    logits [..., V]; tokens: the ids seen so far (prompt and generated), an integer tensor [..., n] with the
    logits' leading dims (n may be 0), or a list of ids for logits [V]. A token counts once however often it
    occurred. The paper divides the logit whatever its sign, which *raises* a negative one; the sign rule is
    Hugging Face's correction (transformers issue #2302), and this equals its ``RepetitionPenaltyLogitsProcessor``.
    Note it is not shift-invariant: logits z and z + c give one softmax, but not once penalized.
    Applied before temperature, top-k and top-p (Hugging Face's order), and at temperature 0 too.
    """
    _check_logits(logits)
    penalty = number(penalty, "penalty", 0, low_open=True)
    if not isinstance(tokens, torch.Tensor):
        tokens = torch.as_tensor(list(tokens), dtype=torch.long, device=logits.device)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() != logits.dim() or tokens.shape[:-1] != logits.shape[:-1]:
        raise ValueError(f"tokens must have shape [..., n] with the logits' leading dims {tuple(logits.shape[:-1])}, "
                         f"got {tuple(tokens.shape)}")
    V = logits.shape[-1]
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
        raise ValueError(f"tokens must be token ids in [0, {V}), got values in "
                         f"[{int(tokens.min())}, {int(tokens.max())}]")
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    seen.scatter_(-1, tokens.to(device=logits.device, dtype=torch.long), True)
    return penalize_seen(logits, seen, penalty)


def penalize_seen(logits: torch.Tensor, seen: torch.Tensor, penalty) -> torch.Tensor:
    """The penalty's arithmetic on a mask: where `seen` [..., V] (bool) is True, logit * penalty if the logit
    is negative, logit / penalty otherwise; `penalty` a number or a tensor broadcasting against logits
    ([B, 1]: one per row). No checks: the generate loop keeps `seen` up to date token by token and calls
    this every step; ``apply_repetition_penalty`` is the checked entry from a list of token ids."""
    scaled = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, scaled, logits)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary (the first index among equal maxima). [..., V] -> [...]"""
    _check_logits(logits)
    return torch.argmax(logits, dim=-1)


def _check_settings(temperature, top_k, top_p) -> tuple:
    return (number(temperature, "temperature", 0),                  # 0 = greedy
            optional(integer, top_k, "top_k", low=1),                # None: no top-k
            optional(probability, top_p, "top_p", zero=False))       # None: no top-p


def sampling_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """The probabilities ``sample`` draws from, [..., V] in float32: softmax of the logits after
    temperature, then top-k, then top-p. For temperature 0, a one-hot at the argmax."""
    _check_logits(logits)
    return probs_or_onehot_unchecked(logits, *_check_settings(temperature, top_k, top_p))


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row: [..., V] -> [...] (int64).

    temperature 0 is greedy (deterministic, the generator is not used). Pass a seeded
    ``torch.Generator`` (on the logits' device) for reproducible draws.
    """
    _check_logits(logits)
    return draw_unchecked(logits, *_check_settings(temperature, top_k, top_p), generator)


def sample_rows(logits: torch.Tensor, temperatures, top_ks, top_ps, generators) -> torch.Tensor:
    """One token per row of logits [B, V], row i drawn with its own temperature, top-k, top-p and
    generator (each a sequence of B): greedy rows take the argmax, the others are drawn one at a time
    (in float32), so a seeded row draws the same tokens whatever else shares the batch. Returns [B].
    The settings are not checked here: they come checked from the border (``SamplingParams``, generate's
    arguments), and this runs every decode step."""
    _check_logits(logits)
    toks = torch.argmax(logits, dim=-1)                                       # [B] on the logits' device
    for i, (t, k, p, g) in enumerate(zip(temperatures, top_ks, top_ps, generators)):
        if t != 0:
            toks[i] = draw_unchecked(logits[i:i + 1].float(), t, k, p, g)[0]
    return toks


def finish_reason(token: int, count: int, max_new_tokens: int, stop_ids) -> str | None:
    """Why a sequence ends with `token`, its `count`-th new token: "stop" when the token is one of
    `stop_ids` (an eos; it stays in the output), "length" when count reaches `max_new_tokens`, else None."""
    if token in stop_ids:
        return "stop"
    return "length" if count >= max_new_tokens else None


# --------------------------------------------------------------------------------------------------
# Speculative decoding's acceptance step
# --------------------------------------------------------------------------------------------------
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


def probs_or_onehot_unchecked(logits: torch.Tensor, temperature: float, top_k, top_p) -> torch.Tensor:
    """``probs_from_logits`` without its checks (speculative decoding's per-pass path, settings checked by
    generate)."""
    if temperature == 0:
        idx = torch.argmax(logits, dim=-1)
        return torch.zeros_like(logits, dtype=torch.float32).scatter(-1, idx[..., None], 1.0)
    return probs_unchecked(logits, temperature, top_k, top_p)


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
