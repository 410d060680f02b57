"""FP8 E4M3 / E5M2 with per-tensor and per-row scales, and an FP8 linear layer (module 03).

An FP8 number has 8 bits: sign, E exponent bits, M mantissa bits. Its grid is logarithmic (constant
*relative* step), unlike int8's uniform grid, and its range is fixed, so a scale maps the tensor into it:

    E4M3 (torch.float8_e4m3fn, finite: no inf):  max 448,   3 mantissa bits: relative step 2^-3
    E5M2 (torch.float8_e5m2, IEEE-like):         max 57344, 2 mantissa bits: relative step 2^-2

    scale = amax / FP8_MAX            (per tensor: one amax; per row: one per output channel)
    data  = (x / scale) cast to fp8   (round to nearest even; we clamp first, so nothing becomes inf/NaN)
    x    ~ data.float() * scale

E4M3 is the usual choice for weights and activations (more precision), E5M2 for gradients (more range).
``FP8Linear`` stores its weight as fp8 + scales and computes, in the reference path, dequantize + matmul;
on GPUs with FP8 tensor cores (compute capability >= 8.9: L4, Ada, H100) it can call ``torch._scaled_mm``,
which multiplies the fp8 operands directly and applies the scales to the fp32 accumulator. The tests
compare that path to the reference on a GPU (``@pytest.mark.gpu``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .core import absmax_quantize, check_linear, check_linear_input, check_tensor

__all__ = ["FP8_DTYPES", "FP8_MAX", "FP8Tensor", "fp8_quantize", "fp8_dequantize", "FP8Linear",
           "scaled_mm_available", "fp8_error_rows"]

FP8_DTYPES = {"e4m3": getattr(torch, "float8_e4m3fn", None), "e5m2": getattr(torch, "float8_e5m2", None)}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
GRANULARITIES = ("tensor", "row")


def _check_fmt(fmt) -> torch.dtype:
    if fmt not in FP8_DTYPES:
        raise ValueError(f"fmt must be one of {list(FP8_DTYPES)}, got {fmt!r}")
    if FP8_DTYPES[fmt] is None:
        raise RuntimeError(f"this torch ({torch.__version__}) has no FP8 dtype for {fmt}")
    return FP8_DTYPES[fmt]


@dataclass
class FP8Tensor:
    """``data`` (fp8, shape of x) times ``scale`` (float32, [1, 1] per tensor or [rows, 1] per row)."""
    data: torch.Tensor
    scale: torch.Tensor
    fmt: str
    granularity: str

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.to(torch.float32) * self.scale).to(dtype)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()


def fp8_quantize(x: torch.Tensor, fmt: str = "e4m3", granularity: str = "tensor") -> FP8Tensor:
    """x [..., K] (2-D or more; "row" means one scale per row of the flattened [-1, K] view) -> FP8Tensor."""
    dtype = _check_fmt(fmt)
    check_tensor(x, "x")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension")
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)      # [R, K]
    amax = x2.abs().amax() if granularity == "tensor" else x2.abs().amax(dim=1)     # [] or [R]
    amax = amax.reshape(-1, 1)                             # [1, 1] or [R, 1]
    scale = torch.where(amax > 0, amax / FP8_MAX[fmt], torch.ones_like(amax))       # all-zero: scale 1
    data = (x2 / scale).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(dtype)
    return FP8Tensor(data.reshape(x.shape), scale, fmt, granularity)


def fp8_dequantize(q: FP8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    shape = q.data.shape
    return (q.data.reshape(-1, shape[-1]).to(torch.float32) * q.scale).reshape(shape).to(dtype)


def scaled_mm_available(device=None) -> bool:
    """True where ``torch._scaled_mm`` has FP8 tensor cores to run on: CUDA, compute capability >= 8.9."""
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class FP8Linear(nn.Module):
    """A linear layer with an FP8 weight (per-row or per-tensor scales) and, optionally, dynamically
    quantized FP8 activations (``act`` "row": one scale per token, "tensor": one per call, None: keep x).

    ``backend``: "reference" (dequantize + matmul in float32), "scaled_mm" (``torch._scaled_mm``; needs
    E4M3, activations quantized, a GPU with compute capability >= 8.9, K and N multiples of 16), or "auto"
    (scaled_mm where it applies, else the reference).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, fmt: str = "e4m3",
                 granularity: str = "row", act: str | None = "row", backend: str = "auto", device=None):
        super().__init__()
        dtype = _check_fmt(fmt)
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if act not in (None, *GRANULARITIES):
            raise ValueError(f"act must be None, 'tensor' or 'row', got {act!r}")
        if backend not in ("auto", "reference", "scaled_mm"):
            raise ValueError(f"backend must be 'auto', 'reference' or 'scaled_mm', got {backend!r}")
        self.in_features, self.out_features = in_features, out_features
        self.fmt, self.granularity, self.act, self.backend = fmt, granularity, act, backend
        rows = out_features if granularity == "row" else 1
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=dtype, device=device))
        self.register_buffer("weight_scale", torch.ones(rows, 1, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str = "e4m3", granularity: str = "row", act: str | None = "row",
                    backend: str = "auto") -> "FP8Linear":
        check_linear(linear)
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, fmt, granularity, act, backend,
                device=w.device)
        q = fp8_quantize(w, fmt, granularity)
        m.weight.copy_(q.data)
        m.weight_scale.copy_(q.scale)
        if linear.bias is not None:
            m.bias = linear.bias.detach().to(torch.float32).clone()
        return m

    def _use_scaled_mm(self, x: torch.Tensor) -> bool:
        ok = (self.fmt == "e4m3" and self.act is not None and scaled_mm_available(x.device)
              and self.in_features % 16 == 0 and self.out_features % 16 == 0)
        if self.backend == "scaled_mm" and not ok:
            raise RuntimeError("backend='scaled_mm' needs fmt='e4m3', quantized activations, a CUDA GPU with "
                               "compute capability >= 8.9 and in/out features that are multiples of 16")
        return ok and self.backend != "reference"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_linear_input(x, self.in_features)      # dtype and shape, no host read (fp8_quantize checks values)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)                # [M, K]
        if self.act is None:
            xs = x2.to(torch.float32)
        else:
            xq = fp8_quantize(x2, self.fmt, self.act)
            if self._use_scaled_mm(x):
                w_scale = self.weight_scale.reshape(1, -1) if self.granularity == "row" else self.weight_scale
                a_scale = xq.scale if self.act == "row" else xq.scale.reshape(())
                b_scale = w_scale if self.granularity == "row" else w_scale.reshape(())
                if (self.act == "row") != (self.granularity == "row"):      # _scaled_mm wants both or neither rowwise
                    a_scale = xq.scale.expand(x2.shape[0], 1).contiguous()
                    b_scale = self.weight_scale.reshape(1, -1).expand(1, self.out_features).contiguous()
                y = torch._scaled_mm(xq.data, self.weight.t(), scale_a=a_scale, scale_b=b_scale,
                                     out_dtype=torch.bfloat16)           # [M, N], fp8 operands, fp32 accumulate
                y = y.to(torch.float32)
                if self.bias is not None:
                    y = y + self.bias
                return y.reshape(*lead, self.out_features).to(x.dtype)
            xs = xq.dequantize()                            # [M, K] float32
        w = self.weight.to(torch.float32) * self.weight_scale                 # [N, K] dequantized
        y = xs @ w.t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, "
                f"weight scales per {self.granularity}, activations {self.act or 'not quantized'}")


def fp8_error_rows(x: torch.Tensor) -> list[dict]:
    """Quantization error of one 2-D tensor in E4M3, E5M2 and int8 absmax, per tensor and per row:
    rows of {"format", "granularity", "rel_rmse", "sqnr_db"}."""
    check_tensor(x, "x")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [rows, cols], got shape {tuple(x.shape)}")
    x = x.to(torch.float32)
    signal = float(x.pow(2).mean())
    rows = []
    for gran in GRANULARITIES:
        recon = {f"fp8 {f}": fp8_quantize(x, f, gran).dequantize() for f in ("e4m3", "e5m2")}
        recon["int8"] = absmax_quantize(x, 8, "tensor" if gran == "tensor" else "channel", axis=None if gran == "tensor"
                                        else 0).dequantize().to(torch.float32)
        for name, xh in recon.items():
            noise = float((x - xh).pow(2).mean())
            rows.append({"format": name, "granularity": gran, "rel_rmse": math.sqrt(noise / signal),
                         "sqnr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise)})
    return rows
