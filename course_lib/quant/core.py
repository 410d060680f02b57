"""Integer quantization: absmax (symmetric) and zero-point (asymmetric), per tensor / channel / group.

Conventions (the same in the lab):

* ``scale`` is the **step size** Delta, the real value of one integer step, so ``x ~ codes * scale``
  (absmax) or ``x ~ (codes - zero_point) * scale`` (zero-point). The lecture notes' "scale" is the
  inverse, the number of steps per unit (127 / absmax, 255 / (max - min)); both describe the same grid.
* absmax, ``bits`` b:  qmax = 2^(b-1) - 1,  scale = absmax / qmax,  codes = clamp(round(x / scale), -qmax, qmax).
  The grid is symmetric around 0 (for 8 bits, -127..127; the code -128 is left unused).
* zero-point, ``bits`` b: qmin, qmax = -2^(b-1), 2^(b-1) - 1 (all 2^b codes used),
  lo = min(min x, 0), hi = max(max x, 0),  scale = (hi - lo) / (2^b - 1),
  zero_point = qmin - round(lo / scale),  codes = clamp(round(x / scale) + zero_point, qmin, qmax).
  The range is widened to include 0 (as PyTorch's observers and GPTQ do), so real 0 is exactly the code
  ``zero_point`` (padding and ReLU zeros stay exact) and the zero point is always a valid code.
* ``round`` is torch.round: to nearest, ties to even. (GGUF uses ties away from zero; see ``gguf``.)
* Granularity: "tensor" (one scale), "channel" (one scale per index of ``axis``; default axis 0, the
  output channels = rows of an ``nn.Linear`` weight [out, in]), "group" (``axis`` is cut into groups of
  ``group_size`` consecutive elements, each with its own scale; default axis -1, the input dimension,
  as GPTQ/AWQ/GGUF do). ``scale`` and ``zero_point`` keep the input's number of dimensions: size 1 on
  reduced dimensions, size C (channel) or n_groups (group) on ``axis``.
* An all-zero tensor/channel/group gets scale 0, codes 0 (zero point qmin), and dequantizes to exact zeros.

Bad input raises: TypeError for a non-tensor or a non-floating dtype (int, bool, complex), ValueError for
an empty tensor, NaN/Inf values (with a count), bits outside 2..8, a group size that does not divide the
axis, an axis out of range, or a clip ratio outside (0, 1]. The checks (``check_tensor``, ``check_finite``,
``check_floating``, ``check_linear``, ``check_linear_input``) are the ones every quantizer, quantized layer
and pruning mask of the course uses, so one bad input reads the same everywhere.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from course_lib.validate import integer, probability

__all__ = ["QuantizedTensor", "quantize", "absmax_quantize", "zeropoint_quantize", "dequantize",
           "dequantize_codes", "fake_quantize", "qrange", "check_tensor", "check_finite", "check_floating",
           "check_linear", "check_linear_input", "in_layer", "check_bits", "expand_params",
           "percentile_clip_ratio", "search_clip_ratio", "group_sum"]

GRANULARITIES = ("tensor", "channel", "group")
SCHEMES = ("absmax", "zeropoint")


# --- validation (the library's one set of tensor checks: quant and sparsity both use them) --------------
def check_finite(x: torch.Tensor, name: str = "x",
                 why: str = "a scale computed from them would be NaN/Inf, so quantization refuses") -> None:
    """Raise a ValueError naming ``name`` (with a count of each) if ``x`` holds NaN or Inf. It reads one
    flag on the host: a sync on a GPU, so hot forward paths call it only under ``validate=True``."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(bad.sum()) - n_nan
        raise ValueError(f"{name} contains {n_nan} NaN and {n_inf} Inf value(s) out of {x.numel()}: {why}; "
                         f"clean or mask them first")


def check_floating(x, name: str = "x") -> None:
    """TypeError unless ``x`` is a real floating-point tensor (no host read)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex() or not x.is_floating_point():
        raise TypeError(f"{name} must be a real floating-point tensor (float32/float16/bfloat16/float64), "
                        f"got dtype {x.dtype}")


def check_tensor(x, name: str = "x", allow_nonfinite: bool = False) -> None:
    """Raise a clear TypeError/ValueError unless ``x`` is a non-empty, finite, floating-point tensor."""
    check_floating(x, name)
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): there is nothing to quantize")
    if not allow_nonfinite:
        check_finite(x, name)


@contextmanager
def in_layer(name: str):
    """Put a layer's name in front of a ValueError raised inside, so a model-wide transform's bad input says
    which layer it came from ("model.layers.1.mlp.up_proj: linear.weight contains 1 NaN ...")."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from e


def check_linear(linear, name: str = "linear") -> None:
    """What every ``from_linear`` checks: an ``nn.Linear`` whose weight (and bias) are finite floats."""
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"{name} must be an nn.Linear, got {type(linear).__name__}")
    check_tensor(linear.weight.detach(), f"{name}.weight")
    if linear.bias is not None:
        check_finite(linear.bias.detach(), f"{name}.bias", why="the layer would add them to every output")


def check_linear_input(x, in_features: int, name: str = "x") -> None:
    """What every linear layer's forward checks for free (no host read): a floating-point tensor whose last
    dimension is ``in_features``. An empty batch [0, in] is fine."""
    check_floating(x, name)
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"{name}'s last dimension must be in_features={in_features}, got {tuple(x.shape)}")


def check_bits(bits, low: int = 2, high: int = 8) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int in {low}..{high}, got {type(bits).__name__} {bits!r}")
    if not low <= bits <= high:
        raise ValueError(f"bits must be in {low}..{high}, got {bits}")
    return bits


def qrange(bits: int, symmetric: bool = True) -> tuple[int, int]:
    """(qmin, qmax) of the integer codes: symmetric -> (-(2^(b-1)-1), 2^(b-1)-1); else (-2^(b-1), 2^(b-1)-1)."""
    check_bits(bits)
    qmax = (1 << (bits - 1)) - 1
    return (-qmax if symmetric else -qmax - 1), qmax


def _norm_axis(axis: int, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for a tensor with {ndim} dimension(s)")
    return axis % ndim


@dataclass(frozen=True)
class _Layout:
    """Which elements share a scale. ``rows(x)`` gives [n_scales, elements_per_scale]; ``to_stat(v)``
    turns one value per row into the keepdim ``scale`` shape."""
    granularity: str
    axis: int | None
    group_size: int | None
    shape: tuple

    @staticmethod
    def make(shape, granularity="tensor", axis=None, group_size=None) -> "_Layout":
        shape, ndim = tuple(shape), len(shape)
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if granularity == "tensor":
            return _Layout("tensor", None, None, shape)
        if ndim == 0:
            raise ValueError(f"granularity={granularity!r} needs a tensor with at least 1 dimension")
        if granularity == "channel":
            a = _norm_axis(0 if axis is None else axis, ndim)
            return _Layout("channel", a, None, shape)
        a = _norm_axis(-1 if axis is None else axis, ndim)
        if group_size is None:
            raise ValueError("granularity='group' needs group_size (e.g. 32, 64 or 128)")
        group_size = integer(group_size, "group_size", low=1)
        if shape[a] % group_size:
            raise ValueError(f"group_size={group_size} does not divide the size {shape[a]} of axis {a} "
                             f"(shape {shape}); pick a divisor of {shape[a]}")
        return _Layout("group", a, group_size, shape)

    @property
    def stat_shape(self) -> tuple:
        ndim = len(self.shape)
        if self.granularity == "tensor":
            return (1,) * ndim
        if self.granularity == "channel":
            return tuple(s if d == self.axis else 1 for d, s in enumerate(self.shape))
        return tuple(s // self.group_size if d == self.axis else s for d, s in enumerate(self.shape))

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.granularity == "tensor":
            return x.reshape(1, -1)
        if self.granularity == "channel":
            return x.movedim(self.axis, 0).reshape(self.shape[self.axis], -1)
        return x.movedim(self.axis, -1).reshape(-1, self.group_size)  # [..., L] -> [.. * L/g, g]

    def to_stat(self, v: torch.Tensor) -> torch.Tensor:  # v: [n_rows]
        if self.granularity == "group":
            moved = [s for d, s in enumerate(self.shape) if d != self.axis]
            return v.reshape(*moved, self.shape[self.axis] // self.group_size).movedim(-1, self.axis)
        return v.reshape(self.stat_shape)


def expand_params(p: torch.Tensor, shape) -> torch.Tensor:
    """Broadcast a keepdim scale/zero-point tensor to ``shape``: a dimension that holds n_groups < size
    is repeated group-wise (``repeat_interleave``), a dimension of size 1 broadcasts."""
    shape = tuple(shape)
    if p.dim() == 0:
        return p.expand(shape)
    if p.dim() != len(shape):
        raise ValueError(f"scale/zero_point has {p.dim()} dimensions but the codes have {len(shape)}")
    for d, (ps, s) in enumerate(zip(p.shape, shape)):
        if ps not in (1, s):
            if s % ps:
                raise ValueError(f"scale/zero_point size {ps} on dim {d} does not divide the codes' size {s}")
            p = p.repeat_interleave(s // ps, dim=d)
    return p.expand(shape)


def group_sum(t: torch.Tensor, granularity="tensor", axis=None, group_size=None) -> torch.Tensor:
    """Sum ``t`` within each channel/group: one number per scale, in the keepdim scale shape."""
    lay = _Layout.make(t.shape, granularity, axis, group_size)
    return lay.to_stat(lay.rows(t).sum(dim=1))


# --- the quantized tensor --------------------------------------------------------------------------
@dataclass
class QuantizedTensor:
    """Integer codes plus the scales (and zero points) that turn them back into real values."""
    codes: torch.Tensor              # int8, same shape as the input
    scale: torch.Tensor              # float step size, keepdim shape (see module docstring)
    zero_point: torch.Tensor | None  # int8 code of real 0 (zero-point scheme), same shape as scale
    bits: int
    scheme: str                      # "absmax" or "zeropoint"
    granularity: str
    axis: int | None
    group_size: int | None
    dtype: torch.dtype               # the input's dtype, restored by dequantize()

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def symmetric(self) -> bool:
        return self.scheme == "absmax"

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_codes(self.codes, self.scale, self.zero_point, dtype=dtype or self.dtype)

    def storage_bits(self, scale_bits: int = 16, zero_point_bits: int | None = None) -> int:
        """Bits to store it: codes at ``bits`` each, plus each scale (fp16 by default) and zero point
        (``bits`` each by default)."""
        zp_bits = self.bits if zero_point_bits is None else zero_point_bits
        n_scales = self.scale.numel()
        extra = n_scales * zp_bits if self.zero_point is not None else 0
        return self.codes.numel() * self.bits + n_scales * scale_bits + extra

    def bits_per_value(self, scale_bits: int = 16, zero_point_bits: int | None = None) -> float:
        return self.storage_bits(scale_bits, zero_point_bits) / self.codes.numel()

    def __repr__(self) -> str:
        g = f", group_size={self.group_size}" if self.group_size else ""
        a = f", axis={self.axis}" if self.axis is not None else ""
        return (f"QuantizedTensor(shape={tuple(self.shape)}, bits={self.bits}, scheme={self.scheme!r}, "
                f"granularity={self.granularity!r}{a}{g}, n_scales={self.scale.numel()})")


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_clip(clip_ratio, stat_shape):
    if isinstance(clip_ratio, torch.Tensor):
        if bool(((clip_ratio <= 0) | (clip_ratio > 1) | ~torch.isfinite(clip_ratio)).any()):
            raise ValueError("clip_ratio values must be in (0, 1]")
        try:
            torch.broadcast_shapes(clip_ratio.shape, stat_shape)
        except RuntimeError:
            raise ValueError(f"clip_ratio of shape {tuple(clip_ratio.shape)} does not broadcast to the "
                             f"scale shape {tuple(stat_shape)}") from None
        return clip_ratio
    return probability(clip_ratio, "clip_ratio", zero=False)            # 1 = no clipping


def quantize(x: torch.Tensor, bits: int = 8, scheme: str = "absmax", granularity: str = "tensor",
             axis: int | None = None, group_size: int | None = None, clip_ratio=1.0) -> QuantizedTensor:
    """Quantize ``x`` to ``bits``-bit integer codes with one scale per tensor, channel or group.

    ``clip_ratio`` in (0, 1] shrinks the range before the scale is computed (absmax * r, or lo * r and
    hi * r): values beyond it saturate at the end codes. A float applies to every scale; a tensor that
    broadcasts to the scale shape gives each channel/group its own ratio (see ``search_clip_ratio``).
    """
    check_tensor(x, "x")
    check_bits(bits)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    lay = _Layout.make(x.shape, granularity, axis, group_size)
    r = _check_clip(clip_ratio, lay.stat_shape)
    xf = x.to(_work_dtype(x))
    if isinstance(r, torch.Tensor):
        r = r.to(device=xf.device, dtype=xf.dtype)
    rows = lay.rows(xf)                                         # [n_scales, k]
    if scheme == "absmax":
        qmin, qmax = qrange(bits, symmetric=True)
        amax = lay.to_stat(rows.abs().amax(dim=1)) * r          # stat shape
        scale = amax / qmax
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.clamp(torch.round(xf / expand_params(safe, x.shape)), qmin, qmax)
        zero_point = None
    else:
        qmin, qmax = qrange(bits, symmetric=False)
        lo = torch.clamp(lay.to_stat(rows.amin(dim=1)), max=0) * r
        hi = torch.clamp(lay.to_stat(rows.amax(dim=1)), min=0) * r
        scale = (hi - lo) / (qmax - qmin)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        zp = torch.where(scale > 0, qmin - torch.round(lo / safe), torch.full_like(scale, qmin))
        zp = torch.clamp(zp, qmin, qmax)
        codes = torch.clamp(torch.round(xf / expand_params(safe, x.shape)) + expand_params(zp, x.shape),
                            qmin, qmax)
        zero_point = zp.to(torch.int8)
    return QuantizedTensor(codes=codes.to(torch.int8), scale=scale, zero_point=zero_point, bits=bits,
                           scheme=scheme, granularity=lay.granularity, axis=lay.axis,
                           group_size=lay.group_size, dtype=x.dtype)


def absmax_quantize(x: torch.Tensor, bits: int = 8, granularity: str = "tensor", axis: int | None = None,
                    group_size: int | None = None, clip_ratio=1.0) -> QuantizedTensor:
    """Symmetric quantization: scale = absmax / (2^(bits-1) - 1), codes = round(x / scale).

    Lecture-notes example: absmax 3.2, 8 bits: 0.1 -> round(0.1 / (3.2/127)) = 4 -> 4 * 3.2/127 = 0.1008.
    """
    return quantize(x, bits, "absmax", granularity, axis, group_size, clip_ratio)


def zeropoint_quantize(x: torch.Tensor, bits: int = 8, granularity: str = "tensor", axis: int | None = None,
                       group_size: int | None = None, clip_ratio=1.0) -> QuantizedTensor:
    """Asymmetric quantization: scale = (max - min) / (2^bits - 1), zero_point = qmin - round(min / scale).

    Lecture-notes example: max 3.2, min -3.0, 8 bits: 255 / 6.2 = 41.13 steps per unit (our scale is
    its inverse, 0.02431), zero point -128 - round(-3.0 * 41.13) = -5, and 0.1 -> round(4.11) - 5 = -1.
    """
    return quantize(x, bits, "zeropoint", granularity, axis, group_size, clip_ratio)


def dequantize_codes(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes * scale (absmax) or (codes - zero_point) * scale, with group-wise scales expanded."""
    if not isinstance(codes, torch.Tensor) or not isinstance(scale, torch.Tensor):
        raise TypeError("codes and scale must be torch tensors")
    s = expand_params(scale, codes.shape)
    q = codes.to(s.dtype)
    if zero_point is not None:
        q = q - expand_params(zero_point, codes.shape).to(s.dtype)
    return (q * s).to(dtype)


def dequantize(q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"dequantize expects a QuantizedTensor, got {type(q).__name__}")
    return q.dequantize(dtype)


def fake_quantize(x: torch.Tensor, bits: int = 8, scheme: str = "absmax", granularity: str = "tensor",
                  axis: int | None = None, group_size: int | None = None, clip_ratio=1.0) -> torch.Tensor:
    """Quantize then dequantize: the values a quantized model actually computes with."""
    return quantize(x, bits, scheme, granularity, axis, group_size, clip_ratio).dequantize()


# --- clipping --------------------------------------------------------------------------------------
def percentile_clip_ratio(x: torch.Tensor, percentile: float = 99.9, granularity: str = "tensor",
                          axis: int | None = None, group_size: int | None = None):
    """The clip ratio that puts the range at the given percentile of |x| (per tensor: a float; per
    channel/group: a tensor in the scale shape). Use it as ``quantize(..., clip_ratio=...)``."""
    check_tensor(x, "x")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile!r}")
    lay = _Layout.make(x.shape, granularity, axis, group_size)
    rows = lay.rows(x.to(_work_dtype(x))).abs()
    k = rows.shape[1]
    # the value at `percentile` by linear interpolation between order statistics (like torch.quantile)
    srt = rows.sort(dim=1).values
    pos = (percentile / 100) * (k - 1)
    lo_i, frac = int(pos), pos - int(pos)
    hi_i = min(lo_i + 1, k - 1)
    thr = srt[:, lo_i] * (1 - frac) + srt[:, hi_i] * frac
    amax = srt[:, -1]
    ratio = torch.where(amax > 0, thr / torch.where(amax > 0, amax, torch.ones_like(amax)),
                        torch.ones_like(amax)).clamp(min=1e-6, max=1.0)
    if lay.granularity == "tensor":
        return float(ratio[0])
    return lay.to_stat(ratio)


def search_clip_ratio(x: torch.Tensor, bits: int = 4, scheme: str = "absmax", granularity: str = "tensor",
                      axis: int | None = None, group_size: int | None = None, grid=None,
                      per_scale: bool = False):
    """Grid search for the clip ratio with the lowest mean squared error.

    Returns ``(best, ratios, mse)``: ``ratios`` the grid (default 0.30..1.00 in 71 steps, 1.0 included so
    the result is never worse than no clipping), ``mse`` the whole-tensor MSE for each ratio applied to
    every scale, and ``best`` the best single ratio (float), or with ``per_scale=True`` the best ratio
    of each channel/group separately (a tensor in the scale shape; each group's error is minimized on
    its own, which is never worse than the best shared ratio).
    """
    check_tensor(x, "x")
    # The grid and the MSE table are small float64 host tensors (results, not data; not every device has
    # float64); the per-scale answer below is on x's device.
    ratios = torch.linspace(0.3, 1.0, 71, dtype=torch.float64, device="cpu") if grid is None else \
        torch.as_tensor(grid, dtype=torch.float64, device="cpu")
    if ratios.numel() == 0 or bool(((ratios <= 0) | (ratios > 1)).any()):
        raise ValueError("grid must hold clip ratios in (0, 1]")
    xf = x.to(_work_dtype(x))
    mse, per_group = [], []
    for r in ratios.tolist():
        x_hat = quantize(xf, bits, scheme, granularity, axis, group_size, clip_ratio=r).dequantize()
        err = (x_hat.double() - xf.double()) ** 2
        mse.append(float(err.mean()))
        if per_scale:
            per_group.append(group_sum(err, granularity, axis, group_size))
    mse = torch.tensor(mse, dtype=torch.float64, device="cpu")
    if not per_scale:
        return float(ratios.flip(0)[int(torch.argmin(mse.flip(0)))]), ratios, mse
    stack = torch.stack(per_group).flip(0)                     # [n_ratios, *scale_shape], largest ratio first
    best = ratios.flip(0).to(device=stack.device, dtype=stack.dtype)[stack.argmin(dim=0)]  # ties: least clipping
    return best, ratios, mse
