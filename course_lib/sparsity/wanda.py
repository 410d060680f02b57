"""Wanda (Sun et al., 2023, "A Simple and Effective Pruning Approach for LLMs"): prune by
|W_ij| * ||X_j||_2, the weight times the norm of its input feature over calibration tokens, compared
within each output row. A small weight on a feature with large activations (LLMs have a few such
outlier features) can matter more than a large weight on a quiet one: magnitude alone misses that.

    input_norms(model, ids)                       name -> ||X_j||_2 [in_features] for every prunable linear
    wanda_scores(weight, x_norm)                  |W| * ||X||  [out, in]
    wanda_mask(weight, x_norm, sparsity=, n=, m=) per output row: drop the lowest scores, or keep n of every m
    wanda_masks(model, ids, sparsity=0.5, n=None, m=None)   the masks of a whole model, from one calibration pass

One calibration pass on the dense model gives every layer's inputs (the paper feeds each layer the outputs
of the already-pruned layers before it; at 50% the difference is small, and one pass keeps this short).

How many weights a row loses: ``int(sparsity * in_features)``, truncated, as the authors' code does
(locuslab/wanda, ``prune_wanda`` in lib/prune.py: a stable ascending sort of each row's scores, then
``indices = sort_res[1][:, :int(W_metric.shape[1] * args.sparsity_ratio)]`` are pruned). So 35% of a
688-wide row (the ``tiny`` model's down_proj) removes 240 weights, not round(240.8) = 241. (Magnitude
pruning, ``pruning.magnitude_masks``, counts ``round(sparsity * n)`` instead, as its oracle
``torch.nn.utils.prune`` does.)

Bad input: weights or norms with NaN/Inf, negative norms, and empty calibration ids are refused (mask
builders run once, so the values are always read).
"""
from __future__ import annotations

import torch

from course_lib.modules import named_linears
from course_lib.quant.core import check_finite, check_floating
from course_lib.validate import probability

from .masks import RANK_WHY
from .nm import nm_mask


@torch.no_grad()
def input_norms(model, ids: torch.Tensor, batch_size: int = 8) -> dict[str, torch.Tensor]:
    """name -> ||X_j||_2 over all calibration tokens ([in_features], float32) for every prunable linear.

    ids: [N, T] token ids (calibration windows), run through `model` in batches of `batch_size`."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32):
        raise TypeError("ids must be an integer tensor [num_windows, seq_len]")
    if ids.numel() == 0:
        raise ValueError(f"ids is empty (shape {tuple(ids.shape)}): the input norms need at least one calibration "
                         f"window of at least one token")
    linears = named_linears(model)
    sq = {name: torch.zeros(lin.in_features, device=lin.weight.device) for name, lin in linears.items()}

    def hook(name):
        def fn(module, args):
            x = args[0].detach().float()                                   # [B, T, in]
            sq[name] += x.pow(2).sum(dim=tuple(range(x.dim() - 1)))
        return fn

    handles = [lin.register_forward_pre_hook(hook(name)) for name, lin in linears.items()]
    try:
        for s in range(0, ids.shape[0], batch_size):
            model(ids[s:s + batch_size].to(model.device))
    finally:
        for h in handles:
            h.remove()
    return {name: v.sqrt() for name, v in sq.items()}


def wanda_scores(weight: torch.Tensor, x_norm: torch.Tensor) -> torch.Tensor:
    """|W_ij| * ||X_j||: [out, in] for weight [out, in] and x_norm [in] (both finite, x_norm >= 0)."""
    check_floating(weight, "weight")
    check_floating(x_norm, "x_norm")
    if weight.dim() != 2 or x_norm.shape != (weight.shape[1],):
        raise ValueError(f"x_norm must have shape [in_features={weight.shape[-1]}] for weight "
                         f"{tuple(weight.shape)}, got {tuple(x_norm.shape)}")
    check_finite(weight.detach(), "weight", why=RANK_WHY)
    check_finite(x_norm, "x_norm", why=RANK_WHY)
    if bool((x_norm < 0).any()):
        raise ValueError(f"x_norm must be >= 0 (the L2 norm of each input feature), got a minimum of "
                         f"{float(x_norm.min()):.4g}")
    return weight.detach().abs().float() * x_norm.float()[None, :]


@torch.no_grad()
def wanda_mask(weight: torch.Tensor, x_norm: torch.Tensor, sparsity: float | None = None, n: int | None = None,
               m: int | None = None) -> torch.Tensor:
    """Bool mask [out, in]: in each output row, the int(sparsity * in) lowest Wanda scores removed (truncated,
    as the authors' code does; ties: the earlier input goes first, a stable sort as theirs), or (n and m
    given) the n highest of every m consecutive inputs kept (2:4: n=2, m=4)."""
    scores = wanda_scores(weight, x_norm)                                  # [out, in]
    if (n is None) != (m is None):
        raise ValueError("give both n and m (an n:m pattern), or neither")
    if n is not None:
        if sparsity is not None:
            raise ValueError("give sparsity or n:m, not both (n:m fixes the sparsity at 1 - n/m)")
        return nm_mask(scores, n, m)
    sparsity = probability(0.5 if sparsity is None else sparsity, "sparsity", one=False)
    k = int(scores.shape[1] * sparsity)                                    # the authors' count, truncated
    keep = torch.ones_like(scores, dtype=torch.bool)
    if k:
        drop = torch.sort(scores, dim=1, stable=True).indices[:, :k]     # the k lowest of each row
        keep.scatter_(1, drop, False)
    return keep


def wanda_masks(model, ids: torch.Tensor, sparsity: float | None = None, n: int | None = None,
                m: int | None = None, batch_size: int = 8) -> dict[str, torch.Tensor]:
    """The Wanda masks of every prunable linear of `model` from calibration windows `ids` [N, T]."""
    norms = input_norms(model, ids, batch_size)
    return {name: wanda_mask(lin.weight, norms[name], sparsity, n, m) for name, lin in named_linears(model).items()}
