"""Microscaling 4-bit formats: MXFP4 (OCP MX v1.0) and NVFP4 (NVIDIA), encoders and decoders.

Both store 4-bit **FP4 E2M1** elements (1 sign, 2 exponent bits with bias 1, 1 mantissa bit) and one scale
per small block; they differ in the block and in the scale.

The element, E2M1. Codes 0..7 are the magnitudes below, codes 8..15 the same with the sign bit set (8 is
-0). No infinity, no NaN: all 16 codes are numbers, the largest 6 (the OCP MX specification's table of
FP4 E2M1; exponent field 0 is subnormal, 0.5 * M).

    code  0    1    2    3    4    5    6    7
    value 0    0.5  1    1.5  2    3    4    6          (exponent of the largest normal, emax_elem = 2)

Encoding rounds to nearest, ties to even (the code with mantissa bit 0: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), as IEEE's default, ml_dtypes' float4_e2m1fn and torchao's FP4 cast
do (the algorithm as Rouhani et al. print it names only "quantize_to_element_format"; microxcaling rounds
ties away from zero by default and to even with round="even"), and **saturates**: a magnitude above 6
becomes 6 (the spec's "clamping normal numbers"). Two codes per byte, element 2j in the low nibble (torchao's
``pack_uint4`` and
the layout of PyTorch's ``float4_e2m1fn_x2``).

MXFP4 (OCP Microscaling Formats (MX) Specification v1.0, 2023; Rouhani et al., arXiv 2310.10537, Algorithm
1). A block of k = 32 values V_i shares one scale X stored as **E8M0**: 8 exponent bits, no sign, no
mantissa, bias 127, value 2^(E - 127) for E in 0..254 (2^-127 .. 2^127; no zero, no infinity), and
E = 0xFF is NaN. The conversion:

    shared_exp = floor(log2(max_i |V_i|)) - emax_elem          (emax_elem = 2 for E2M1)
    X          = 2^shared_exp
    P_i        = quantize_to_element_format(V_i / X), clamping normal numbers

so the block's largest magnitude lands in E2M1's top binade [4, 8): a maximum with mantissa above 1.5
(e.g. 7 * 2^e) is clamped to 6 * 2^e, which is the price of a power-of-two scale. Decoding: v_i = X * P_i,
and, as the specification says, **if X is NaN every value of the block is NaN, whatever the P_i**.
What the algorithm leaves to the implementation, we decide as follows (and say where the spec authors'
library, microsoft/microxcaling's ``mx_ops._quantize_mx`` at commit 7bc4195, and torchao's
``torchao.prototype.mx_formats.mx_tensor.to_mx`` in its default FLOOR mode agree; both read, and run on
the cases below, in November 2026):
* shared_exp is computed exactly, from the maximum's binary exponent (``frexp``). torchao reads the same
  exponent bits. microxcaling takes floor(log2(max)) in float32, and float32's log2 rounds up to k for a
  maximum within a few ulps below 2^k (1 ulp below 8, 22 below 2^-50 on torch 2.13): such a block gets a
  scale twice the spec's (a block with maximum 8 - 2^-21 and a 5 decodes to 8 and 4 there, to 6 and 4 here);
* an all-zero block (log2 0 = -inf) and any block with shared_exp < -127 get the smallest scale, 2^-127
  (E = 0), and the elements are V_i / 2^-127, exactly; microxcaling agrees. torchao's release 0.18.0 (and
  earlier) stores the same byte but divides by 2^-126, its float32 scale clamped to the smallest normal
  (a workaround for subnormals in Triton), so such a block decodes to half its values (a block of values
  near 2^-128: 932 of 2,048 values differ from ours); its main branch since PR #4725 (commit 5d73a0c,
  August 2026) divides by the exact 2^-127 and agrees with us;
* a block holding a NaN or an infinity has no finite shared_exp: its scale is NaN (0xFF) and it decodes
  to NaN (E2M1 can hold neither). So does shared_exp > 127, possible only for float64 input above 2^130.
  microxcaling agrees (log2 of infinity overflows its scale range into NaN). torchao 0.18.0 gives a NaN
  block the NaN scale but an infinite one a finite scale (the exponent field 255 read as 128, less
  emax_elem: 2^126 for E2M1): its infinities saturate to 6 * 2^126 and the block decodes to finite values; its
  main branch since PR #4725 maps NaN and infinity alike to 0xFF, as we do;
* float32 subnormal inputs are kept as they are (microxcaling's optional flush to zero is not in the spec).
(torchao's RCEIL mode, the default of its ``MXDynamicActivationMXWeightConfig``, is another rule: the scale
is amax / 6 rounded up to a power of two, so the maximum is never clamped; it is not the spec's algorithm.)
Storage: 4 + 8/32 = 4.25 bits per value.

NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025; the recipe of
TensorRT Model Optimizer and torchao's ``nvfp4_quantize``). Blocks of 16 E2M1 values, one **FP8 E4M3**
scale per block (its sign bit always 0, "UE4M3"), and one FP32 scale per tensor that maps the block
scales into E4M3's range:

    tensor_scale = amax(|x|) / (6 * 448)                         (FP32; 448 = E4M3's max)
    block_scale  = e4m3( (amax_block / 6) / tensor_scale )     (round to nearest even, <= 448)
    P_i          = e2m1( x_i / (block_scale * tensor_scale) ), saturating at +-6
    x_i         ~= P_i * block_scale * tensor_scale

The block scale is not a power of two (3 mantissa bits), so the block's maximum lands near 6 instead of
anywhere in [4, 8): one reason NVFP4 is more accurate than MXFP4 at 4.5 bits per value (4 + 8/16, plus 32
bits per tensor). Because the E4M3 rounding may go down, x_i / scale can exceed 6 by up to 1/16: those
values saturate to 6 (cuDNN's block-scale quantize rounds the scale up instead, which never saturates but
uses a coarser scale). Degenerate cases: an all-zero tensor gets tensor_scale 1, an all-zero block scale
0 (it decodes to zeros); a nonzero block whose scale would round to 0 gets E4M3's smallest subnormal,
2^-9. NVIDIA's definition gives the elements no NaN or infinity and says nothing about them, so
``nvfp4_quantize`` refuses NaN and Inf input (ValueError) rather than invent a rule.

Arithmetic: every quotient is exact or rounded so finely that no value can cross an E2M1 midpoint, so the
codes are the exact round-to-nearest-even of the real quotient. MXFP4 divides by a power of two, exact in
float32 (float64 for float64 input; a float32 result can only underflow far below E2M1's smallest step);
NVFP4 divides by (E4M3 value x FP32 value) in float64, where the divisor is exact (4 + 24 significant bits). NVFP4's
scales are computed in float32 as the recipe does
(amax / 6, divided by the tensor scale, then one cast to E4M3). GPU kernels compute x * (1/scale) in
float32 and can differ on a value within an ulp of a midpoint. Blocks run along the last dimension; a last dimension
that is not a
multiple of the block is padded with zeros (they change no block maximum) and the padding is dropped on
decoding (microxcaling pads the same way), so a partial last block still pays for a whole scale.

The tests check the element table, every rounding midpoint and the E8M0/E4M3 bit patterns against the
casts of PyTorch (``float8_e8m0fnu``, ``float8_e4m3fn``) and, where it is installed, ``ml_dtypes``'
``float4_e2m1fn``, and pin the three choices above. Checked by hand (not a test: neither library is a
dependency): ``mxfp4_quantize``'s decoded values equal microxcaling's ``mx_ops._quantize_mx(x, 8,
"fp4_e2m1", axes=[-1], block_size=32, round="even")`` (commit 7bc4195) on 327,680 random float32 values
over 2^-30..2^30 with planted midpoints, on blocks near 2^-149 and 2^126, and on NaN/Inf blocks, and
differ on blocks whose maximum sits a few ulps below a power of two (above); with its default
round="nearest" (ties away from zero) 159 of 16,384 values differ, all on midpoints. They equal torchao's
``to_mx(x, torch.float4_e2m1fn_x2, 32)`` decoded (0.18.0 and main at 36027d8) on 327,680 random float32
values over 2^-30..2^30, and differ from 0.18.0 on the tiny and infinite blocks above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.validate import integer

from .core import check_tensor

__all__ = ["E2M1_VALUES", "E2M1_MAX", "E2M1_EMAX", "E8M0_BIAS", "E8M0_NAN", "E4M3_MAX", "MX_BLOCK", "NVFP4_BLOCK",
           "e2m1_values", "e2m1_encode", "e2m1_decode", "e8m0_encode", "e8m0_decode", "pack_fp4", "unpack_fp4",
           "MXFP4Tensor", "mxfp4_quantize", "mxfp4_dequantize", "NVFP4Tensor", "nvfp4_quantize",
           "nvfp4_dequantize"]

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)   # magnitudes of codes 0..7
E2M1_MAX = 6.0
E2M1_EMAX = 2            # exponent of E2M1's largest normal (6 = 1.5 * 2^2): the spec's emax_elem
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E4M3_MAX = 448.0
MX_BLOCK = 32            # the OCP MX block size k
NVFP4_BLOCK = 16


def e2m1_values() -> torch.Tensor:
    """The value of each of the 16 E2M1 codes, float32 [16] (code 8 is -0.0)."""
    mag = torch.tensor(E2M1_VALUES, dtype=torch.float32, device="cpu")   # a constant host table
    return torch.cat([mag, -mag])


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """The E2M1 code (uint8, 0..15) of each value: round to nearest, ties to even, saturate at +-6.

    ``v`` must be finite (E2M1 has no NaN or infinity to hold one); the sign is kept, so a negative value
    that rounds to zero becomes -0 (code 8), as an IEEE-style cast does."""
    check_tensor(v, "v")
    a = v.detach().to(torch.float64 if v.dtype == torch.float64 else torch.float32).abs()   # exact either way
    # the spacing of the grid around a: 0.5 below 2 (subnormals and the first binade), 1 in [2, 4), 2 above
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(a.dtype)
    # a / step is exact (a power of two); torch.round rounds half to even, and an even multiple of the
    # step is exactly the code whose mantissa bit is 0, so this is round-to-nearest-even on the E2M1 grid
    q = (torch.round(a / step) * step).clamp(max=E2M1_MAX)
    # q is on the grid; its code: 2q below 2 (0, 0.5, 1, 1.5 -> 0..3), q + 2 in [2, 4) (2, 3 -> 4, 5),
    # q/2 + 4 from 4 on (4, 6 -> 6, 7)
    code = torch.where(q < 2, 2 * q, torch.where(q < 4, q + 2, q / 2 + 4)).to(torch.uint8)
    return code | (torch.signbit(v.detach()).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (integer tensor, 0..15) -> float32 values."""
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex():
        raise TypeError(f"codes must be an integer torch.Tensor of E2M1 codes (0..15), got "
                        f"{type(codes).__name__ if not isinstance(codes, torch.Tensor) else codes.dtype}")
    c = codes.long()
    if c.numel() and bool(((c < 0) | (c > 15)).any()):
        raise ValueError(f"codes must be E2M1 codes in 0..15, got values from {int(c.min())} to {int(c.max())}")
    return e2m1_values().to(codes.device)[c]


def e8m0_encode(exponent: torch.Tensor) -> torch.Tensor:
    """Unbiased exponents e (float tensor, NaN allowed) -> E8M0 bytes (uint8): e + 127 for integer e in
    [-127, 127], 0xFF (NaN) for NaN, +-inf or |e| out of that range. Not a rounding cast: an E8M0 scale is
    an exact power of two, so ``e`` must be an integer where it is finite."""
    if not isinstance(exponent, torch.Tensor) or not exponent.is_floating_point():
        raise TypeError("exponent must be a floating-point torch.Tensor of unbiased exponents (NaN for a NaN scale)")
    e = exponent.to(torch.float64)
    finite = torch.isfinite(e)
    if bool((finite & (e != torch.floor(e))).any()):
        raise ValueError("exponent must hold integers (an E8M0 scale is a power of two) or NaN")
    ok = finite & (e >= -E8M0_BIAS) & (e <= E8M0_BIAS)
    biased = torch.where(ok, e + E8M0_BIAS, torch.full_like(e, E8M0_NAN))
    return biased.to(torch.uint8)


def e8m0_decode(bits: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (uint8) -> float32 scales 2^(E - 127), NaN for 0xFF (2^-127 is a float32 subnormal)."""
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.uint8:
        raise TypeError("bits must be a uint8 torch.Tensor of E8M0 scales")
    e = bits.to(torch.float64) - E8M0_BIAS
    return torch.where(bits == E8M0_NAN, math.nan, torch.exp2(e)).to(torch.float32)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] FP4 codes (0..15) -> [..., n] uint8: element 2j in the low nibble, 2j+1 in the high one."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes' last dimension must be even to pack two per byte, got shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] uint8 -> [..., 2n] uint8 FP4 codes (the inverse of ``pack_fp4``)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError("packed must be a uint8 torch.Tensor")
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 data, else float32 (which holds float16 and bfloat16 values exactly)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., K] -> [..., ceil(K/block), block] in the work dtype, the last block padded with zeros."""
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (blocks run along the last one)")
    k = x.shape[-1]
    pad = -k % block
    xd = x.detach().to(_work_dtype(x.dtype))
    if pad:
        xd = torch.nn.functional.pad(xd, (0, pad))
    return xd.reshape(*x.shape[:-1], (k + pad) // block, block)


def _unblock(v: torch.Tensor, shape) -> torch.Tensor:
    """[..., n_blocks, block] -> [..., K]: drop the padding."""
    return v.reshape(*v.shape[:-2], -1)[..., : shape[-1]]


def _codes(packed: torch.Tensor, n_blocks: int, block: int) -> torch.Tensor:
    c = unpack_fp4(packed)
    return c.reshape(*c.shape[:-1], n_blocks, block)


@dataclass
class MXFP4Tensor:
    """A tensor in MXFP4: packed E2M1 codes and one E8M0 scale byte per block of the last dimension."""
    packed: torch.Tensor      # uint8 [..., ceil(K/block) * block / 2], two codes per byte (low nibble first)
    scales: torch.Tensor      # uint8 [..., ceil(K/block)], E8M0 (0xFF = NaN)
    shape: torch.Size
    dtype: torch.dtype
    block_size: int = MX_BLOCK

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def codes(self) -> torch.Tensor:
        """The E2M1 codes, uint8 [..., n_blocks, block_size] (padding included)."""
        return _codes(self.packed, self.scales.shape[-1], self.block_size)

    def scale_values(self) -> torch.Tensor:
        """The block scales X as float32 [..., n_blocks] (NaN where the E8M0 byte is 0xFF)."""
        return e8m0_decode(self.scales)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """v_i = X * P_i; a NaN scale makes its whole block NaN (the spec's rule: X * P_i is NaN anyway).
        Exact in float32 (float64 when the tensor was float64: only it can need 6 * 2^127)."""
        wd = _work_dtype(self.dtype)
        vals = e2m1_decode(self.codes()).to(wd) * self.scale_values().to(wd).unsqueeze(-1)
        return _unblock(vals, self.shape).to(dtype or self.dtype)

    def storage_bits(self) -> int:
        return 8 * (self.packed.numel() + self.scales.numel())

    def bits_per_value(self) -> float:
        return self.storage_bits() / self.numel


def mxfp4_quantize(x: torch.Tensor, block_size: int = MX_BLOCK) -> MXFP4Tensor:
    """MXFP4 per the OCP MX v1.0 conversion (module docstring), blocks along the last dimension.

    NaN and Inf are accepted: the format has a NaN scale for them (their block decodes to NaN)."""
    check_tensor(x, "x", allow_nonfinite=True)
    block_size = integer(block_size, "block_size", low=2)
    if block_size % 2:
        raise ValueError(f"block_size must be even (two E2M1 codes per byte), got {block_size}")
    b = _blocks(x, block_size)                              # [..., nb, block] float32 (float64 for float64)
    amax = b.abs().amax(dim=-1)                             # NaN if the block holds a NaN, inf if an inf
    mant, exp = torch.frexp(amax)                           # amax = mant * 2^exp, mant in [0.5, 1): exact
    shared = (exp.to(b.dtype) - 1) - E2M1_EMAX              # floor(log2(amax)) - emax_elem
    shared = torch.where(amax > 0, shared, torch.full_like(shared, -E8M0_BIAS))   # log2(0) = -inf: clamp
    shared = shared.clamp(min=-E8M0_BIAS)                   # below 2^-127: the smallest E8M0 scale
    bad = ~torch.isfinite(amax) | (shared > E8M0_BIAS)      # no E8M0 power of two: the NaN scale
    scales = e8m0_encode(torch.where(bad, math.nan, shared))
    # V_i / X, exact (times a power of two in [2^-125, 2^127]); blocks with a NaN scale store code 0 (any code
    # decodes to NaN there)
    ratio = torch.where(bad.unsqueeze(-1), 0.0, b * torch.exp2(-shared).unsqueeze(-1))
    codes = e2m1_encode(ratio)                              # round half to even, clamp to +-6
    packed = pack_fp4(codes.reshape(*codes.shape[:-2], -1))
    return MXFP4Tensor(packed=packed, scales=scales, shape=x.shape, dtype=x.dtype, block_size=block_size)


def mxfp4_dequantize(q: MXFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(q, MXFP4Tensor):
        raise TypeError(f"mxfp4_dequantize expects an MXFP4Tensor, got {type(q).__name__}")
    return q.dequantize(dtype)


@dataclass
class NVFP4Tensor:
    """A tensor in NVFP4: packed E2M1 codes, one FP8 E4M3 scale per 16 values, one FP32 scale per tensor."""
    packed: torch.Tensor        # uint8 [..., ceil(K/16) * 8], two codes per byte (low nibble first)
    block_scales: torch.Tensor  # float8_e4m3fn [..., ceil(K/16)], all >= 0
    tensor_scale: torch.Tensor  # float32 [] (amax / (6 * 448))
    shape: torch.Size
    dtype: torch.dtype
    block_size: int = NVFP4_BLOCK

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def codes(self) -> torch.Tensor:
        return _codes(self.packed, self.block_scales.shape[-1], self.block_size)

    def scale_values(self) -> torch.Tensor:
        """block_scale * tensor_scale, the factor each block's codes are multiplied by (float64)."""
        return self.block_scales.to(torch.float64) * self.tensor_scale.to(torch.float64)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """P_i * block_scale (exact: 2 x 4 significant bits), then * tensor_scale: one rounding."""
        wd = _work_dtype(self.dtype)
        vals = e2m1_decode(self.codes()).to(wd) * self.block_scales.to(wd).unsqueeze(-1) * self.tensor_scale.to(wd)
        return _unblock(vals, self.shape).to(dtype or self.dtype)

    def storage_bits(self) -> int:
        return 8 * (self.packed.numel() + self.block_scales.numel()) + 32

    def bits_per_value(self) -> float:
        return self.storage_bits() / self.numel


def nvfp4_quantize(x: torch.Tensor, block_size: int = NVFP4_BLOCK) -> NVFP4Tensor:
    """NVFP4: E2M1 codes, an E4M3 scale per ``block_size`` values of the last dimension, an FP32 scale per
    tensor (module docstring). NaN/Inf input raises a ValueError (the format defines nothing for it)."""
    e4m3 = getattr(torch, "float8_e4m3fn", None)
    if e4m3 is None:
        raise RuntimeError(f"this torch ({torch.__version__}) has no float8_e4m3fn dtype for NVFP4's block scales")
    check_tensor(x, "x")                                    # finite, floating, non-empty
    block_size = integer(block_size, "block_size", low=2)
    if block_size % 2:
        raise ValueError(f"block_size must be even (two E2M1 codes per byte), got {block_size}")
    b = _blocks(x, block_size)
    amax_t = b.abs().amax().to(torch.float32)
    # the per-tensor FP32 scale; an all-zero tensor keeps 1 (every block scale is then 0)
    t = torch.where(amax_t > 0, amax_t / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax_t))
    block_amax = b.abs().amax(dim=-1).to(torch.float32)     # [..., nb], exact for float32/16/bf16 input
    # the block scale in units of the tensor scale, in float32 as the recipe computes it, then one rounding
    # to E4M3 (nearest even; the clamp keeps a float32 rounding just above 448 from saturating silently)
    want = (block_amax / E2M1_MAX) / t
    s = want.clamp(max=E4M3_MAX).to(e4m3)
    tiny = torch.tensor(2.0 ** -9, dtype=torch.float32, device=x.device).to(e4m3)   # smallest E4M3 subnormal
    s = torch.where((s.to(torch.float32) == 0) & (block_amax > 0), tiny, s)
    scale = s.to(torch.float64) * t.to(torch.float64)       # exact: 4-bit x 24-bit significands
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = e2m1_encode(b.to(torch.float64) / safe.unsqueeze(-1))   # saturates at +-6 where the scale rounded down
    packed = pack_fp4(codes.reshape(*codes.shape[:-2], -1))
    return NVFP4Tensor(packed=packed, block_scales=s, tensor_scale=t, shape=x.shape, dtype=x.dtype,
                       block_size=block_size)


def nvfp4_dequantize(q: NVFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(q, NVFP4Tensor):
        raise TypeError(f"nvfp4_dequantize expects an NVFP4Tensor, got {type(q).__name__}")
    return q.dequantize(dtype)
