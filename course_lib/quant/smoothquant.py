"""SmoothQuant (Xiao et al., 2023): move the difficulty of quantizing activations into the weights.

Activations have a few channels with huge magnitudes (per-token int8 then wastes its range on them);
weights are smooth. Per input channel j:

    s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha)

and X diag(s)^-1 (folded into the previous op: the norm's gain, or the previous linear's rows) times
diag(s) W^T (the weight columns) computes the same product. alpha = 0.5 splits the difficulty evenly.
Before any quantization the smoothed fp model must equal the original (a test checks it); then W8A8.
"""
from __future__ import annotations

import torch

from course_lib.validate import probability

from .calibration import activation_absmax, fold_scales, scaling_groups
from .core import check_tensor, in_layer

__all__ = ["smooth_scales", "smooth_model"]


def smooth_scales(act_absmax: torch.Tensor, weight_absmax: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """s [in] from the activations' per-channel max |x| [in] and the weights' per-input-channel max |w| [in].

    Both must be finite and >= 0 (a NaN/Inf max, e.g. from an overflowing calibration run, would give NaN
    scales that the fold writes into the model); a channel whose max is 0 gets the floor 1e-5."""
    alpha = probability(alpha, "alpha")
    for name, t in (("act_absmax", act_absmax), ("weight_absmax", weight_absmax)):
        check_tensor(t, name)
    if act_absmax.shape != weight_absmax.shape or act_absmax.dim() != 1:
        raise ValueError(f"act_absmax and weight_absmax must be 1-D of the same length (input channels), "
                         f"got {tuple(act_absmax.shape)} and {tuple(weight_absmax.shape)}")
    for name, t in (("act_absmax", act_absmax), ("weight_absmax", weight_absmax)):
        if bool((t < 0).any()):
            raise ValueError(f"{name} must be >= 0 (a max of absolute values per input channel), got a "
                             f"minimum of {float(t.min()):.4g}")
    a = act_absmax.float().clamp(min=1e-5)
    w = weight_absmax.float().clamp(min=1e-5)
    return (a.pow(alpha) / w.pow(1 - alpha)).clamp(min=1e-5)


@torch.no_grad()
def smooth_model(model, batches, alpha: float = 0.5, groups=None) -> dict[str, torch.Tensor]:
    """Smooth every foldable group of the model in place (``calibration.scaling_groups``); returns the
    scales by group name."""
    groups = groups if groups is not None else scaling_groups(model)
    absmax = activation_absmax(model, batches, [g.linears[0][0] for g in groups])
    out = {}
    for g in groups:
        # the max over every linear reading this input: one column scale must serve all of them
        w_max = torch.stack([lin.weight.detach().abs().amax(dim=0) for _, lin in g.linears]).amax(dim=0)
        with in_layer(g.name):
            s = smooth_scales(absmax[g.linears[0][0]], w_max, alpha)
        fold_scales(g, s.to(w_max.device))
        out[g.name] = s
    return out
