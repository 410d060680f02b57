"""AWQ (Lin et al., 2023): activation-aware weight quantization. A few input channels carry much larger
activations than the rest; scaling those weight columns up before rounding (and the activations down by
the same factor, folded into the previous op) protects them. The scale is *searched*, not set from the
importance alone:

    s(alpha) = mean|x|^alpha, normalized so that sqrt(max(s) * min(s)) = 1,    alpha on a grid in [0, 1)
    loss(alpha) = || X W^T - X (Q(W diag(s)) diag(s)^-1)^T ||^2                  on calibration inputs X

alpha = 0 is plain RTN, so the best alpha is never worse than RTN on the calibration data. Each trial
quantizes a scaled *copy*; the layer's weights are left untouched until the winner is folded in
(``fold_scales``: previous op / s, linear columns * s), after which the model still computes the same fp
function and RTN of the scaled weights is the AWQ model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.validate import integer

from .calibration import capture_inputs, fold_scales, scaling_groups
from .core import check_finite, check_floating, check_tensor, in_layer
from .linear import dequantize_weight_codes, rtn_quantize_weight, group_index

__all__ = ["awq_scale_candidates", "awq_search_group", "awq_apply", "AWQSearch"]


def _rtn_dequant(w, bits, group_size, sym):
    codes, scales, zeros = rtn_quantize_weight(w, bits, group_size, sym)
    g = group_index(w.shape[1], group_size, w.device)
    return dequantize_weight_codes(codes, scales[:, g], None if zeros is None else zeros[:, g])


def awq_scale_candidates(x_mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^alpha per input channel, normalized to sqrt(max * min) = 1."""
    s = x_mean_abs.float().clamp(min=1e-4).pow(alpha)
    return s / (s.max() * s.min()).sqrt()


@dataclass
class AWQSearch:
    name: str
    alpha: float            # the winning exponent
    scales: torch.Tensor    # [in] the winning scales
    losses: list            # loss per alpha of the grid
    grid: list


@torch.no_grad()
def awq_search_group(weights: list, x: torch.Tensor, bits: int = 4, group_size: int | None = 128,
                     sym: bool = False, n_grid: int = 20, name: str = "") -> AWQSearch:
    """Search alpha for linears that share inputs x [n, in] (weights: list of [out_i, in] tensors).

    Refused: no weights, weights of different ``in``, x that is empty or whose last dimension is not
    ``in``, and NaN/Inf in either (every loss would be NaN and the search would silently return scale 1)."""
    n_grid = integer(n_grid, "n_grid", low=1)
    if isinstance(weights, torch.Tensor):
        raise TypeError("weights must be a list of [out, in] weight tensors, got one tensor: wrap it in a list")
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError(f"weights must be a non-empty list of [out, in] weight tensors (the linears that read x), "
                         f"got {weights!r}")
    for i, w in enumerate(weights):
        check_tensor(w.detach() if isinstance(w, torch.Tensor) else w, f"weights[{i}]")
        if w.dim() != 2 or w.shape[1] != weights[0].shape[-1]:
            raise ValueError(f"weights[{i}] must be a 2-D [out, in={weights[0].shape[-1]}] tensor (all linears "
                             f"read the same x), got {tuple(w.shape)}")
    in_f = weights[0].shape[1]
    check_floating(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [n_tokens, in_features], got {tuple(x.shape)}")
    if x.shape[1] != in_f:
        raise ValueError(f"x's last dimension must be in_features={in_f} (the weights' columns), got "
                         f"{tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"x is empty (shape {tuple(x.shape)}): the search needs calibration inputs [n >= 1, in]")
    check_finite(x, "x", why="every trial's loss would be NaN and the search would return scale 1 unsearched")
    x = x.float()
    W = torch.cat([w.detach().float() for w in weights])                     # [sum out, in]
    before = W.clone()
    ref = x @ W.T                                                              # fp outputs
    x_mean = x.abs().mean(dim=0)                                               # [in]
    grid = [i / n_grid for i in range(n_grid)]
    losses, best = [], (float("inf"), 0.0, torch.ones_like(x_mean))
    for alpha in grid:
        s = awq_scale_candidates(x_mean, alpha)
        w_q = _rtn_dequant(W * s, bits, group_size, sym) / s                 # trial on a scaled copy
        loss = float((x @ w_q.T - ref).pow(2).mean())
        losses.append(loss)
        if loss < best[0]:
            best = (loss, alpha, s)
    assert torch.equal(W, before), "a trial modified the weights"            # restored between trials
    return AWQSearch(name, best[1], best[2], losses, grid)


@torch.no_grad()
def awq_apply(model, batches, bits: int = 4, group_size: int | None = 128, sym: bool = False,
              n_grid: int = 20, max_rows: int | None = 4096, progress: bool = False) -> list[AWQSearch]:
    """Search each scaling group's scales on the calibration batches and fold them into the model (in
    place; the fp model's function is unchanged). Quantize the linears afterwards (RTN) for AWQ."""
    groups = scaling_groups(model)
    names = [n for g in groups for n, _ in g.linears]
    xs = capture_inputs(model, batches, names, max_rows=max_rows)            # fp activations, one pass
    it = groups
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(groups, desc="AWQ search", unit="group")
    found = []
    for g in it:
        x = xs[g.linears[0][0]]
        with in_layer(g.name):
            r = awq_search_group([lin.weight for _, lin in g.linears], x, bits, group_size, sym, n_grid, g.name)
        fold_scales(g, r.scales.to(x.device))
        found.append(r)
    return found
