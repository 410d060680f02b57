"""Quantized linear layers (module 03): weight-only W8A16 / W4A16 with group scales, and W8A8 with
dynamic per-token activation quantization.

Weight layout (one convention for every method of the module: RTN, AWQ and GPTQ all produce it):

    weight [out, in]  ->  codes [out, in] (signed ints, bits each)
                          scales [out, n_groups] (stored fp16), zeros [out, n_groups] (int8, asymmetric only)
                          g_idx [in]: which group each input column belongs to

    w[o, i] ~= (codes[o, i] - zeros[o, g_idx[i]]) * scales[o, g_idx[i]]

With contiguous groups ``g_idx[i] = i // group_size`` (a last, shorter group when group_size does not
divide ``in``) and is not stored; GPTQ with act-order quantizes columns in another order, so its groups are
sets of columns and ``g_idx`` is stored (int32, 4 bytes per input column). 4-bit codes are packed two per
byte with ``quant.pack_int4``; 8-bit codes are int8. ``state_dict_bytes`` measures what a checkpoint holds.

The forward pass here is the reference: dequantize the whole weight, then one matmul in the input's dtype.
It shows the numerics and the memory, not the speed (fast int8/int4 kernels do the dequantization inside
the matmul; see the fast weight-only path).

Bad input: ``from_linear`` refuses a weight or bias with NaN/Inf (a one-time transform, so it always reads
them); every forward checks for free that x is floating point with ``in_features`` in its last dimension.
Values of x are read on the host only where asked (``W8A8Linear(validate=True)``; see its docstring).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.validate import integer, one_of, optional

from .core import check_finite, check_floating, check_linear, check_linear_input, check_tensor
from .packing import pack_int4, unpack_int4

__all__ = ["weight_qparams", "quantize_weight_codes", "dequantize_weight_codes", "rtn_quantize_weight",
           "group_index", "QuantLinear", "W8A8Linear", "quantize_per_token", "state_dict_bytes"]

STORED_BITS = (4, 8)


def _check_weight(w, name="weight"):
    check_tensor(w, name)                                                # floating point, non-empty, finite
    if w.dim() != 2:
        raise ValueError(f"{name} must be a 2-D floating-point [out, in] tensor, got {w.dtype} {tuple(w.shape)}")


def group_index(in_features: int, group_size: int | None, device=None) -> torch.Tensor:
    """g_idx [in] = i // group_size (all zeros for one group per row, group_size None)."""
    group_size = optional(integer, group_size, "group_size", low=1)   # None: one scale per output row
    g = torch.arange(in_features, device=device)
    return torch.zeros_like(g) if group_size is None else g // group_size


def weight_qparams(w: torch.Tensor, bits: int, sym: bool = False, scale_dtype=torch.float16):
    """One scale (and zero point) per row of w [out, k] -> scale [out, 1], zero [out, 1] or None.

    Symmetric: scale = absmax / (2^(b-1) - 1). Asymmetric: scale = (max - min) / (2^b - 1) over a range
    that includes 0, zero = qmin - round(min / scale), both in the signed code range. The scale is rounded
    up to ``scale_dtype`` (what the layer stores) before anything uses it, so codes match the stored scale.
    """
    bits = integer(bits, "bits", 2, 8)
    wf = w.float()
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if sym:
        scale = wf.abs().amax(dim=1, keepdim=True) / qmax
    else:
        lo = wf.amin(dim=1, keepdim=True).clamp(max=0)
        hi = wf.amax(dim=1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / (qmax - qmin)
    tiny = torch.finfo(scale_dtype).tiny if scale_dtype.is_floating_point else 1e-12
    scale = scale.clamp(min=max(tiny, 1e-8))                               # an all-zero row: any scale works
    stored = scale.to(scale_dtype)
    if scale_dtype.is_floating_point:     # round the stored scale up, never down: the range still covers max|w|
        up = torch.nextafter(stored, torch.full_like(stored, float("inf")))
        stored = torch.where(stored.float() < scale, up, stored)
    scale = stored.float()
    if sym:
        return scale, None
    lo = wf.amin(dim=1, keepdim=True).clamp(max=0)
    zero = (qmin - torch.round(lo / scale)).clamp(qmin, qmax)
    return scale, zero


def quantize_weight_codes(w, scale, zero, bits):
    """w [out, k] with scale/zero [out, 1] (or [out, k]) -> integer codes (float tensor, exact ints)."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    z = 0 if zero is None else zero
    return torch.clamp(torch.round(w.float() / scale) + z, qmin, qmax)


def dequantize_weight_codes(codes, scale, zero):
    z = 0 if zero is None else zero
    return (codes.float() - z) * scale


def rtn_quantize_weight(w: torch.Tensor, bits: int, group_size: int | None = 128, sym: bool = False,
                        scale_dtype=torch.float16):
    """Round-to-nearest, one scale per (row, group): w [out, in] -> (codes [out, in], scales [out, G],
    zeros [out, G] or None). Groups are contiguous, the last one shorter if group_size does not divide in."""
    _check_weight(w, "w")
    bits = integer(bits, "bits", 2, 8)
    out_f, in_f = w.shape
    g_idx = group_index(in_f, group_size, w.device)
    n_groups = int(g_idx[-1]) + 1
    codes = torch.empty(out_f, in_f, device=w.device)
    scales = torch.empty(out_f, n_groups, device=w.device)
    zeros = None if sym else torch.empty(out_f, n_groups, device=w.device)
    step = in_f if group_size is None else group_size
    for g, c0 in enumerate(range(0, in_f, step)):
        cols = w[:, c0:c0 + step]                                              # [out, <= group_size]
        s, z = weight_qparams(cols, bits, sym, scale_dtype)
        codes[:, c0:c0 + step] = quantize_weight_codes(cols, s, z, bits)
        scales[:, g] = s[:, 0]
        if zeros is not None:
            zeros[:, g] = z[:, 0]
    return codes, scales, zeros


class QuantLinear(nn.Module):
    """A weight-only quantized ``nn.Linear`` (W8A16 / W4A16): packed codes + group scales as buffers."""

    def __init__(self, in_features: int, out_features: int, bits: int = 4, group_size: int | None = 128,
                 sym: bool = False, bias: bool = False, act_order: bool = False, device=None,
                 scale_dtype: torch.dtype = torch.float16):
        super().__init__()
        bits = one_of(integer(bits, "bits"), "bits", STORED_BITS)
        group_size = optional(integer, group_size, "group_size", low=1)   # None: one scale per output row
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size, self.sym = bits, group_size, sym
        # as many groups as contiguous ones; with act_order they are sets of columns named by g_idx
        n_groups = self.n_groups = -(-in_features // (group_size or in_features))
        if bits == 4:
            qweight = torch.zeros(out_features, (in_features + 1) // 2, dtype=torch.uint8, device=device)
        else:
            qweight = torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", torch.ones(out_features, n_groups, dtype=scale_dtype, device=device))
        self.register_buffer("zeros", None if sym else
                             torch.zeros(out_features, n_groups, dtype=torch.int8, device=device))
        self.register_buffer("g_idx", torch.zeros(in_features, dtype=torch.int32, device=device)
                             if act_order else None)
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    # --- construction ------------------------------------------------------------------------------
    @classmethod
    def from_codes(cls, codes, scales, zeros=None, g_idx=None, bias=None, bits=4, group_size=128,
                   scale_dtype=torch.float16) -> "QuantLinear":
        """Wrap codes [out, in] (ints in the signed range), scales [out, G], zeros [out, G] or None,
        g_idx [in] (None: contiguous groups of group_size)."""
        out_f, in_f = codes.shape
        m = cls(in_f, out_f, bits, group_size, sym=zeros is None, bias=bias is not None,
                act_order=g_idx is not None, device=codes.device, scale_dtype=scale_dtype)
        if scales.shape != m.scales.shape:
            raise ValueError(f"scales must have shape {tuple(m.scales.shape)}, got {tuple(scales.shape)}")
        c = codes.round().to(torch.int8)
        m.qweight.copy_(pack_int4(F.pad(c, (0, in_f % 2))) if bits == 4 else c)
        m.scales.copy_(scales.to(scale_dtype))
        if zeros is not None:
            m.zeros.copy_(zeros.round().to(torch.int8))
        if g_idx is not None:
            m.g_idx.copy_(g_idx.to(torch.int32))
        if bias is not None:
            m.bias.copy_(bias.detach().float())
        return m

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: int | None = 128,
                    sym: bool = False) -> "QuantLinear":
        """Round-to-nearest quantization of an ``nn.Linear`` (the RTN baseline)."""
        check_linear(linear)
        bits = one_of(integer(bits, "bits"), "bits", STORED_BITS)
        codes, scales, zeros = rtn_quantize_weight(linear.weight.detach(), bits, group_size, sym)
        return cls.from_codes(codes, scales, zeros, None, linear.bias, bits, group_size)

    # --- use -----------------------------------------------------------------------------------------
    def codes(self) -> torch.Tensor:
        """The integer codes [out, in] (int8)."""
        if self.bits == 4:
            return unpack_int4(self.qweight)[:, :self.in_features]
        return self.qweight

    def group_of_column(self) -> torch.Tensor:
        if self.g_idx is not None:
            return self.g_idx.long()
        return group_index(self.in_features, self.group_size, self.qweight.device)

    def dequantize_weight(self, dtype=torch.float32) -> torch.Tensor:
        g = self.group_of_column()                                     # [in]
        s = self.scales.float()[:, g]                                  # [out, in]
        z = None if self.zeros is None else self.zeros.float()[:, g]
        return dequantize_weight_codes(self.codes(), s, z).to(dtype)

    def forward(self, x):  # [..., in] -> [..., out]
        check_linear_input(x, self.in_features)
        return F.linear(x, self.dequantize_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, sym={self.sym}, act_order={self.g_idx is not None}")


def quantize_per_token(x: torch.Tensor, bits: int = 8, validate: bool = True):
    """Dynamic symmetric quantization, one scale per token (row of the last dimension):
    x [..., k] -> codes [..., k] (float tensor of ints), scale [..., 1].

    ``validate`` (default on, as a reference should be) refuses NaN/Inf in x, which would make that token's
    scale NaN/Inf; it reads a flag on the host, so ``W8A8Linear`` calls it with its own ``validate``."""
    check_floating(x, "x")
    bits = integer(bits, "bits", 2, 8)
    if validate:
        check_finite(x, "x", why="the token's absmax scale would be NaN/Inf and so would its whole output row")
    qmax = 2 ** (bits - 1) - 1
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / qmax
    return torch.clamp(torch.round(x.float() / scale), -qmax, qmax), scale


def int_matmul(a_codes, b_codes):
    """[n, k] @ [m, k]^T of integer-valued tensors, exactly: float32 while every partial sum stays below
    2^24 (k * 127^2 < 2^24 for k < 1040), float64 beyond."""
    k = a_codes.shape[-1]
    dt = torch.float32 if k * 127 * 127 < 2 ** 24 or a_codes.device.type != "cpu" else torch.float64
    return a_codes.to(dt) @ b_codes.to(dt).T


class W8A8Linear(nn.Module):
    """int8 weights (one scale per output row) x int8 activations (one scale per token, computed on the
    fly): y = (Xq @ Wq^T) * s_x * s_w. The integer matmul is what an int8 GEMM does; here it runs exactly
    in floating point (see ``int_matmul``).

    The forward always checks x's dtype and last dimension (no host read). ``validate=True`` also refuses
    NaN/Inf in x, which reads a flag on the host (a sync per call on a GPU, so it is off by default in a
    model's forward, where such a token's row comes out NaN as it would from ``nn.Linear``)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, act_bits: int = 8, device=None,
                 validate: bool = False):
        super().__init__()
        self.in_features, self.out_features, self.act_bits = in_features, out_features, act_bits
        self.validate = bool(validate)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scales", torch.ones(out_features, 1, dtype=torch.float16, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, act_bits: int = 8, validate: bool = False) -> "W8A8Linear":
        check_linear(linear)
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, act_bits, device=w.device,
                validate=validate)
        s, _ = weight_qparams(w, 8, sym=True)
        m.qweight.copy_(quantize_weight_codes(w, s, None, 8).to(torch.int8))
        m.scales.copy_(s.half())
        if linear.bias is not None:
            m.bias.copy_(linear.bias.detach().float())
        return m

    def forward(self, x):  # [..., in] -> [..., out]
        check_linear_input(x, self.in_features)
        shape = x.shape
        xq, sx = quantize_per_token(x.reshape(-1, shape[-1]), self.act_bits, self.validate)   # [n, in], [n, 1]
        acc = int_matmul(xq, self.qweight)                                    # [n, out]
        y = acc.float() * sx * self.scales.float().T
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)


def state_dict_bytes(module: nn.Module) -> int:
    """Bytes of the tensors in ``module.state_dict()``, each storage counted once (tied weights once)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    seen, total = set(), 0
    for t in module.state_dict().values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
