"""LLM.int8() (Dettmers et al., 2022): int8 matmul with a mixed-precision decomposition for outliers.

For x [n, in] and an int8 weight (one absmax scale per output row, W ~= C_W * s_W / 127):

1. the outlier columns are the input features where some token has |x| >= threshold (6.0 by default);
2. the other columns go through int8: x is quantized per token (absmax over those columns), multiplied
   with the int8 weight columns in integers, and rescaled: (C_x C_W^T) * s_x s_W / 127^2;
3. the outlier columns are multiplied in floating point, x_out @ (dequantized weight columns)^T, and added.

The weights are stored once, in int8 (as bitsandbytes' ``Linear8bitLt`` does with ``has_fp16_weights=False``):
the outlier part uses their dequantized values. Only the few outlier *activation* columns stay in 16/32 bits.

Compared with bitsandbytes 0.50: it quantizes x in fp16 and takes each token's absmax over every element
below the threshold, including the non-outlier entries of outlier columns; here the absmax covers exactly
the columns that take the int8 path. The two agree within one int8 step of x per element (the tolerance
the tests state and check).

Bad input: x must be floating point with ``in_features`` in its last dimension, and finite. The finiteness
check costs no extra host read: the outlier columns are read on the host on every call anyway (their
number sets the shape of the fp part), and that one read carries the NaN/Inf flag too (with
``threshold=0`` there are no outlier columns, and the read is the check's alone).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .core import check_finite, check_floating, check_linear, check_linear_input
from .linear import int_matmul

__all__ = ["LLMInt8Linear", "llm_int8_matmul", "outlier_columns"]


def outlier_columns(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Indices of the input features where some row of x [n, in] has |x| >= threshold."""
    return torch.nonzero((x.abs() >= threshold).any(dim=0)).flatten()


def llm_int8_matmul(x: torch.Tensor, cb: torch.Tensor, scb: torch.Tensor, threshold: float = 6.0,
                    bias: torch.Tensor | None = None, return_outliers: bool = False):
    """x [n, in] float; cb [out, in] int8 weight codes; scb [out] float absmax of each weight row."""
    if not isinstance(cb, torch.Tensor) or cb.dim() != 2:
        raise ValueError(f"cb must be the 2-D [out, in] int8 weight codes, got {getattr(cb, 'shape', type(cb))}")
    check_floating(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [n_tokens, in_features], got {tuple(x.shape)}")
    check_linear_input(x, cb.shape[1])
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0 (0 disables the decomposition), got {threshold!r}")
    xf = x.float()
    is_outlier = ((xf.abs() >= threshold).any(dim=0) if threshold > 0      # [in]
                  else torch.zeros(0, dtype=torch.bool, device=x.device))
    nonfinite = (~torch.isfinite(xf)).any().reshape(1)                    # [1]
    flags = torch.cat([nonfinite, is_outlier]).cpu()                       # the call's one host read
    if flags[0]:
        check_finite(xf, "x", why="LLM.int8 would return NaN/Inf for those tokens")   # raises, with counts
    cols = torch.nonzero(flags[1:]).flatten().to(x.device)                 # the outlier columns
    regular = torch.ones(x.shape[-1], dtype=torch.bool, device=x.device)
    regular[cols] = False
    xr = xf * regular                                                      # outlier columns zeroed
    sx = xr.abs().amax(dim=-1, keepdim=True)                               # [n, 1] per-token absmax
    cx = torch.round(xr * (127 / sx.clamp(min=1e-12)))                     # int8 codes, outliers 0
    y = int_matmul(cx, cb).float() * (sx / 127) * (scb.float()[None, :] / 127)    # [n, out]
    if cols.numel():
        w_out = cb[:, cols].float() * (scb.float()[:, None] / 127)         # [out, n_outlier] dequantized
        y = y + xf[:, cols] @ w_out.T                                      # the fp part
    if bias is not None:
        y = y + bias.float()
    y = y.to(x.dtype)
    return (y, cols) if return_outliers else y


class LLMInt8Linear(nn.Module):
    """An ``nn.Linear`` stored in int8 (row-wise absmax) that runs ``llm_int8_matmul``."""

    def __init__(self, in_features, out_features, bias=False, threshold=6.0, device=None):
        super().__init__()
        self.in_features, self.out_features, self.threshold = in_features, out_features, threshold
        self.register_buffer("cb", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scb", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self.last_outliers = None        # the outlier columns of the last call (for inspection)

    @classmethod
    def from_linear(cls, linear: nn.Linear, threshold: float = 6.0) -> "LLMInt8Linear":
        check_linear(linear)
        w = linear.weight.detach().float()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, threshold, w.device)
        scb = w.abs().amax(dim=1)
        m.scb.copy_(scb)
        m.cb.copy_(torch.round(w * (127 / scb.clamp(min=1e-12))[:, None]).to(torch.int8))
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach().float())
        return m

    def forward(self, x):  # [..., in] -> [..., out]
        check_linear_input(x, self.in_features)
        shape = x.shape
        y, cols = llm_int8_matmul(x.reshape(-1, shape[-1]), self.cb, self.scb, self.threshold, self.bias,
                                  return_outliers=True)
        self.last_outliers = cols
        return y.reshape(*shape[:-1], self.out_features)
