"""GGUF block formats Q8_0 and Q4_0, and the k-quants Q4_K and Q6_K (module 03; their section is below),
byte for byte as llama.cpp (ggml) stores them.

Both cut each row into blocks of 32 values and store, per block, an fp16 scale ``d`` (2 bytes,
little-endian) followed by the codes:

    Q8_0  (34 bytes = 2 + 32):  d = absmax / 127;  q_i = roundf(x_i / d) as int8 (ties away from zero);
                                x_i ~ q_i * d                                        8.5 bits per weight
    Q4_0  (18 bytes = 2 + 16):  m = the value of largest magnitude, WITH its sign;  d = m / -8;
                                q_i = min(15, trunc(x_i / d + 8.5)) in 0..15;  x_i ~ (q_i - 8) * d
                                byte j (0..15) = q_j | q_{j+16} << 4: the low nibbles hold elements
                                0..15, the high nibbles elements 16..31.             4.5 bits per weight

Why ``m / -8``: the element of largest magnitude maps to code 0, i.e. exactly -8 * d = m, so it is
reproduced exactly, and the other side gets up to +7 (+8 saturates to 7). Using the signed value
spends the asymmetric int4 range (-8..7) on the side that needs it.

Like ggml, the arithmetic is float32 with the reciprocal ``id = 1/d`` (0 when d == 0): an all-zero block
has d = 0 and decodes to zeros (codes 0 in Q8_0, 8 in Q4_0). The result is bit-identical to the ``gguf``
package's reference quantizers (the tests check it). Unlike them we refuse NaN/Inf input, and input so
large that the fp16 scale would overflow (|d| > 65504, i.e. |x| above about 8.3e6 for Q8_0 or 5.2e5
for Q4_0), with a ValueError instead of writing an inf scale.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .core import check_tensor

__all__ = ["QK", "QK_K", "GGUFFormat", "GGUF_FORMATS", "register_format", "BLOCK_BYTES", "BLOCK_VALUES",
           "quantize_q8_0", "dequantize_q8_0", "quantize_q4_0", "dequantize_q4_0", "quantize_q4_k", "dequantize_q4_k",
           "quantize_q6_k", "dequantize_q6_k", "describe_block", "gguf_quantize", "gguf_dequantize",
           "gguf_bits_per_weight"]

QK = 32     # values per block of the legacy formats
QK_K = 256  # values per super-block of the k-quants


@dataclass(frozen=True)
class GGUFFormat:
    """One GGUF block format, all of it in one record (as gguf-py's ``quants.py`` has a class per type).

    ``quantize``: [..., k * block_values] float -> [..., k * block_bytes] uint8, ggml's bytes.
    ``unpack``: blocks [n, block_bytes] uint8 -> the stored fields as tensors: "d" [n, 1] (float32), "codes"
    [n, block_values] (integers, in element order), and whatever else the format stores ("dmin", "scales",
    "mins", per sub-block). The decoder and ``describe_block`` both read the bytes through it.
    ``decode``: those fields -> values [n, block_values] float32.
    ``code_bits`` and ``memory_name``: the format's row in ``quant.memory.WEIGHT_FORMATS`` (the rest of a
    block's bits are its scales: ``block_bytes * 8 - code_bits * block_values`` per block).
    """
    name: str
    block_values: int
    block_bytes: int
    code_bits: int
    quantize: Callable[[torch.Tensor], torch.Tensor]
    unpack: Callable[[torch.Tensor], dict]
    decode: Callable[[dict], torch.Tensor]
    memory_name: str

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / self.block_values

    def blocks(self, data: torch.Tensor) -> torch.Tensor:
        """uint8 data [..., k * block_bytes] -> [n, block_bytes], or a clear error."""
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            raise TypeError(f"data must be a uint8 torch.Tensor of {self.name} blocks")
        nb = self.block_bytes
        if data.dim() == 0 or data.shape[-1] % nb:
            raise ValueError(f"data's last dimension must be a multiple of {nb} bytes ({self.name} block), "
                             f"got shape {tuple(data.shape)}")
        return data.reshape(-1, nb)

    def dequantize(self, data: torch.Tensor) -> torch.Tensor:
        """[..., k * block_bytes] uint8 -> [..., k * block_values] float32."""
        values = self.decode(self.unpack(self.blocks(data)))
        return values.reshape(*data.shape[:-1], data.shape[-1] // self.block_bytes * self.block_values)


GGUF_FORMATS: dict[str, GGUFFormat] = {}     # the one registry: name -> format (filled below, one record each)


def register_format(fmt: GGUFFormat) -> GGUFFormat:
    """Add a format to the registry (its name must be new): adding a format is adding one record."""
    if not isinstance(fmt, GGUFFormat):
        raise TypeError(f"fmt must be a GGUFFormat, got {type(fmt).__name__}")
    if fmt.name in GGUF_FORMATS:
        raise ValueError(f"a GGUF format named {fmt.name!r} is already registered")
    GGUF_FORMATS[fmt.name] = fmt
    return fmt


def _blocks(x: torch.Tensor, name: str = "x", qk: int = QK) -> torch.Tensor:
    check_tensor(x, name)
    if x.dim() == 0 or x.shape[-1] % qk:
        raise ValueError(f"{name}'s last dimension must be a multiple of {qk} (GGUF block size), "
                         f"got shape {tuple(x.shape)}")
    return x.to(torch.float32).reshape(-1, qk)           # [n_blocks, qk]


def _fp16_bytes(d: torch.Tensor, fmt: str) -> torch.Tensor:
    """[n, 1] float32 -> [n, 2] uint8, little-endian fp16."""
    h = d.to(torch.float16)
    if bool(torch.isinf(h).any()):
        big = float(d.abs().max())
        raise ValueError(f"x is too large for {fmt}: its block scale d = {big:.4g} overflows fp16 (max 65504)")
    bits = h.view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.cat([bits & 0xFF, bits >> 8], dim=1).to(torch.uint8)


def _fp16_from_bytes(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 little-endian -> [n, 1] float32."""
    bits = b[:, 0:1].to(torch.int32) | (b[:, 1:2].to(torch.int32) << 8)
    bits = ((bits ^ 0x8000) - 0x8000).to(torch.int16)     # reinterpret as signed 16-bit
    return bits.view(torch.float16).to(torch.float32)


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf: to nearest, ties away from zero (computed exactly, without the x + 0.5 trap)."""
    a = v.abs()
    fl = torch.floor(a)
    return torch.sign(v) * (fl + torch.floor(2 * (a - fl)))


def _fdiv(num, den) -> torch.Tensor:
    """C's float ``num / den``, one rounding, where one side may be a Python number. torch computes
    ``c / t`` as ``t.reciprocal() * c`` (two roundings), and on CUDA ``t / c`` as ``t * (1 / c)``;
    tensor / tensor is a true division everywhere."""
    if not isinstance(num, torch.Tensor):
        num = torch.full_like(den, num)
    if not isinstance(den, torch.Tensor):
        den = torch.full_like(num, den)
    return num / den


def _rows_shape(shape, bytes_per_block, qk: int = QK):
    return (*shape[:-1], shape[-1] // qk * bytes_per_block)


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """[..., 32k] float -> [..., 34k] uint8 Q8_0 blocks (the layout ``gguf.quants.quantize`` returns)."""
    b = _blocks(x)
    d = _fdiv(b.abs().amax(dim=1, keepdim=True), 127.0)   # one rounding on every device (see _fdiv)
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = _roundf(b * inv).to(torch.int8)
    out = torch.cat([_fp16_bytes(d, "Q8_0"), q.view(torch.uint8)], dim=1)
    return out.reshape(_rows_shape(x.shape, out.shape[1]))


def _unpack_q8_0(b: torch.Tensor) -> dict:
    return {"d": _fp16_from_bytes(b[:, :2]), "codes": b[:, 2:].contiguous().view(torch.int8)}


def _decode_q8_0(f: dict) -> torch.Tensor:
    return f["codes"].to(torch.float32) * f["d"]


def quantize_q4_0(x: torch.Tensor) -> torch.Tensor:
    """[..., 32k] float -> [..., 18k] uint8 Q4_0 blocks (the layout ``gguf.quants.quantize`` returns)."""
    b = _blocks(x)
    imax = b.abs().argmax(dim=1, keepdim=True)            # first index of the largest magnitude
    m = b.gather(1, imax)                                  # ... with its sign
    d = m / -8
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = torch.clamp(torch.trunc(b * inv + 8.5), 0, 15).to(torch.uint8)   # [n, 32] in 0..15
    packed = q[:, :QK // 2] | (q[:, QK // 2:] << 4)        # low nibble: 0..15, high nibble: 16..31
    out = torch.cat([_fp16_bytes(d, "Q4_0"), packed], dim=1)
    return out.reshape(_rows_shape(x.shape, out.shape[1]))


def _unpack_q4_0(b: torch.Tensor) -> dict:
    qs = b[:, 2:]
    return {"d": _fp16_from_bytes(b[:, :2]), "codes": torch.cat([qs & 0xF, qs >> 4], dim=1)}   # 0..15, element order


def _decode_q4_0(f: dict) -> torch.Tensor:
    return (f["codes"].to(torch.int8) - 8).to(torch.float32) * f["d"]


# --------------------------------------------------------------------------------------------------------
# k-quants: super-blocks of 256 values whose sub-block scales are themselves quantized
#
# The lecture notes call Q4_K_M "4-bit quantization with K-means clustering". It is not: there is no
# clustering anywhere in llama.cpp's k-quants. The "K" names the family of super-block formats (QK_K = 256
# values per super-block) that ggml added in 2023, and the suffix (_S, _M, _L) of a *file* type such as
# Q4_K_M is a per-tensor mix: llama.cpp stores most tensors in Q4_K and a few sensitive ones (parts of
# attn_v and ffn_down, the output layer) in Q6_K. A k-quant is a two-level affine code:
#
#   Q4_K (144 bytes, 4.5 bits/weight): 8 sub-blocks of 32. Each sub-block j has a 6-bit scale sc_j and a
#       6-bit min m_j; the super-block has fp16 d and dmin. x ~ (d * sc_j) * q - (dmin * m_j), q in 0..15.
#       Layout: d (2) | dmin (2) | 12 bytes of packed 6-bit (sc, m) pairs | 128 bytes of nibbles, where
#       byte l of the c-th 32-byte chunk holds element 64c + l (low nibble) and 64c + 32 + l (high).
#   Q6_K (210 bytes, 6.5625 bits/weight): 16 sub-blocks of 16, each with an int8 scale s_j; one fp16 d.
#       x ~ (d * s_j) * (q - 32), q in 0..63 split into a low nibble (ql, 128 bytes) and 2 high bits
#       (qh, 64 bytes); then the 16 scales, then d (the only format here with d at the end).
#
# The encoders follow ggml's reference quantizers (``quantize_row_q4_K_ref``, ``quantize_row_q6_K_ref``
# in ggml-quants.c, the path llama.cpp takes without an importance matrix): per sub-block, a small search
# over the inverse scale for the (scale, min) or scale with the least weighted squared error, then the
# sub-block scales quantized to 6 (Q4_K) or 8 (Q6_K) bits relative to the largest one, then the codes
# recomputed with the quantized scales.
#
# The bytes are those of the reference C, compiled as plain IEEE float32 without fusing a*b + c into one
# rounding (gcc/clang -ffp-contract=off; x86-64's baseline target has no FMA, so a default build is the
# same). tests/test_quant_gguf_c_reference.py checks it: it compiles a C file of its own, written from
# the published algorithm, and compares every byte on random tensors (outliers, all-zero and negative-only
# blocks, tiny and huge magnitudes). What it takes to match, beyond the algorithm itself:
#   * Q4_K's search moves ``min`` to each better fit and starts every later trial from it (codes from
#     x - min, range max - min); a search that keeps the first min writes other bytes in most tensors;
#   * float32 in C's order: sums left to right, (w*l)*l, the divisions as divisions. torch computes
#     ``c / t`` as ``t.reciprocal() * c`` (two roundings) and its float32 CPU sqrt is off by one ulp on
#     about 1 value in 6 (``_fdiv``, ``_sqrtf``); a 1-ulp weight is enough to flip a search step;
#   * ggml's ``nearest_int`` (round half to even through a float32 add), and the running maxima of the
#     sub-block scales and mins starting at +0.0 (a super-block without negative values stores dmin +0).
# A build that fuses multiply-adds (-march=native on an FMA CPU; aarch64 by default) writes different
# bytes in a few blocks (we measured 71 of 1024 Q4_K and 6 of 1024 Q6_K super-blocks of randn, x86-64).
# The ``gguf`` package (0.19) has decoders for these types but no encoders: our decoders are bit-exact
# against its decoders (tests/test_quant_gguf_kquants.py).
# --------------------------------------------------------------------------------------------------------

GROUP_MAX_EPS = 1e-15


def _nearest_int(v: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int, bit for bit: add 1.5 * 2**23 in float32 and read the low 23 bits of the sum.

    For |v| < 2**22 this is round half to even; beyond it (and for inf/NaN) it returns what the C trick
    returns, not the rounded value, so the clamps that follow see the int C's clamps see.
    """
    t = v.to(torch.float32) + 12582912.0                 # float32 + float32: one rounding, as in C
    return (t.view(torch.int32) & 0x007FFFFF) - 0x00400000


def _sqrtf(v: torch.Tensor) -> torch.Tensor:
    """C's sqrtf, correctly rounded. torch's float32 CPU sqrt is not (one ulp off on about 1 value in 6 here).
    The float64 root, even one float64 ulp off, rounds to the right float32: the root of a float32 lies more
    than a float64 ulp away from every midpoint between two float32s."""
    if v.device.type == "mps":                           # no float64 there: round on the host (an offline encoder)
        return torch.sqrt(v.to("cpu", torch.float64)).to(v.device, torch.float32)
    return torch.sqrt(v.to(torch.float64)).to(torch.float32)


def _seq_sum(terms) -> torch.Tensor:
    """Sum a list of [n] float32 tensors left to right (the C loop's order, so the roundings match)."""
    acc = torch.zeros_like(terms[0])
    for t in terms:
        acc = acc + t
    return acc


def _make_qkx2_quants(x: torch.Tensor, w: torch.Tensor, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
                      nstep: int = 20):
    """Affine (scale, min) search for each row of x [n, 32] with weights w: -> (scale [n], -min [n], L [n, 32]).

    ggml's make_qkx2_quants: start from the min/max fit, then try nstep + 1 inverse scales
    (nmax + rmin + rdelta * step) / (max - min), each followed by a weighted least-squares fit of (scale, min)
    to its codes; keep a fit when its weighted squared error is lower. ``min`` is the best fit *so far*: each
    kept fit moves the origin (x - min) and the range (max - min) of every later trial, so the trials depend on
    the order they run in (a search that keeps the first min for all trials writes different bytes).
    """
    n, k = x.shape
    f = torch.float32
    mn = torch.clamp(x.amin(dim=1), max=0.0)             # the min is never above 0
    mx = x.amax(dim=1)
    flat = mx == mn                                      # all equal (after clamping min to 0): scale 0, codes 0
    sum_w = _seq_sum([w[:, i] for i in range(k)])
    sum_x = _seq_sum([w[:, i] * x[:, i] for i in range(k)])

    def codes(iscale, origin):                          # [n] x [n] -> [n, k] int32 in 0..nmax
        return torch.clamp(_nearest_int(iscale[:, None] * (x - origin[:, None])), 0, nmax)

    def werr(scale, minv, L):
        terms = []
        for i in range(k):
            diff = scale * L[:, i].to(f) + minv - x[:, i]
            terms.append(w[:, i] * (diff * diff))
        return _seq_sum(terms)

    minv = mn.clone()                                    # the current best min: it moves as fits are kept
    iscale = torch.tensor(float(nmax), dtype=f, device=x.device) / (mx - minv)
    scale = 1 / iscale
    L = codes(iscale, minv)
    best = werr(scale, minv, L)
    for step in range(nstep + 1):
        factor = (torch.tensor(rmin, dtype=f, device=x.device) + torch.tensor(rdelta, dtype=f, device=x.device) * step
                  + nmax)                                # float32, in C's order: (rmin + rdelta*step) + nmax
        La = codes(factor / (mx - minv), minv)          # from the current min, not the first one
        Lf = La.to(f)
        sum_l = _seq_sum([w[:, i] * Lf[:, i] for i in range(k)])
        sum_l2 = _seq_sum([w[:, i] * Lf[:, i] * Lf[:, i] for i in range(k)])
        sum_xl = _seq_sum([w[:, i] * Lf[:, i] * x[:, i] for i in range(k)])
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = torch.where(ok, D, torch.ones_like(D))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
        pos = this_min > 0
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        l2 = torch.where(sum_l2 > 0, sum_l2, torch.ones_like(sum_l2))   # D > 0 implies sum_l2 > 0
        this_scale = torch.where(pos, sum_xl / l2, this_scale)
        cur = werr(this_scale, this_min, La)
        better = ok & (cur < best) & ~flat
        L = torch.where(better[:, None], La, L)
        best = torch.where(better, cur, best)
        scale = torch.where(better, this_scale, scale)
        minv = torch.where(better, this_min, minv)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    L = torch.where(flat[:, None], torch.zeros_like(L), L)
    return scale, -minv, L


def _pack_k4_scales(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """8 six-bit scales and 8 six-bit mins per super-block [nb, 8] -> the 12 packed bytes [nb, 12]."""
    out = torch.zeros(ls.shape[0], 12, dtype=torch.int32, device=ls.device)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)         # scales 0..3, top 2 bits of scales 4..7
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)         # mins 0..3, top 2 bits of mins 4..7
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)  # low 4 bits of scales/mins 4..7
    return out.to(torch.uint8)


def _unpack_k4_scales(s: torch.Tensor):
    """[nb, 12] uint8 -> (sc [nb, 8], m [nb, 8]) int32 in 0..63."""
    s = s.to(torch.int32)
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=1)
    m = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], dim=1)
    return sc, m


def _k4_scale_codes(scales: torch.Tensor, mins: torch.Tensor):
    """Q4_K's second level: the 8 sub-block scales and 8 mins of each super-block [nb, 8] float32 -> 6-bit
    codes ls, lm [nb, 8] int32 and the fp16 d, dmin bytes [nb, 2] (d = max scale / 63, dmin = max min / 63)."""
    # C starts the running maxima at +0.0 and replaces them only by larger values: a super-block whose mins
    # are all -0.0 (no sub-block below 0) keeps +0.0, so dmin is stored as +0 (clamp would keep the -0.0)
    max_scale, max_min = scales.amax(dim=1), mins.amax(dim=1)   # [nb]
    max_scale = torch.where(max_scale > 0, max_scale, 0.0)
    max_min = torch.where(max_min > 0, max_min, 0.0)
    inv_scale = torch.where(max_scale > 0, _fdiv(63.0, torch.where(max_scale > 0, max_scale, 1.0)), 0.0)
    inv_min = torch.where(max_min > 0, _fdiv(63.0, torch.where(max_min > 0, max_min, 1.0)), 0.0)
    ls = torch.clamp(_nearest_int(inv_scale[:, None] * scales) & 0xFF, max=63)   # uint8_t, then MIN(63, .)
    lm = torch.clamp(_nearest_int(inv_min[:, None] * mins) & 0xFF, max=63)
    d_bytes = _fp16_bytes(_fdiv(max_scale, 63.0)[:, None], "Q4_K")
    return ls, lm, d_bytes, _fp16_bytes(_fdiv(max_min, 63.0)[:, None], "Q4_K")


def quantize_q4_k(x: torch.Tensor) -> torch.Tensor:
    """[..., 256k] float -> [..., 144k] uint8 Q4_K super-blocks (llama.cpp's layout and reference algorithm)."""
    xb = _blocks(x, qk=QK_K)                              # [nb, 256]
    nb = xb.shape[0]
    sub = xb.reshape(nb * 8, 32)                          # [nb*8, 32] sub-blocks
    sum_x2 = _seq_sum([sub[:, i] * sub[:, i] for i in range(32)])
    av_x = _sqrtf(sum_x2 / 32)
    w = av_x[:, None] + sub.abs()                         # ggml's weights: rms of the sub-block + |x|
    scales, mins, L = _make_qkx2_quants(sub, w)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    ls, lm, d_bytes, dmin_bytes = _k4_scale_codes(scales, mins)
    d = _fp16_from_bytes(d_bytes)                         # [nb, 1], the stored (fp16-rounded) values
    dmin = _fp16_from_bytes(dmin_bytes)
    dj = d * ls.to(torch.float32)                         # [nb, 8] effective sub-block scales
    mj = dmin * lm.to(torch.float32)
    safe = torch.where(dj == 0, torch.ones_like(dj), dj)
    Lq = torch.clamp(_nearest_int((sub.reshape(nb, 8, 32) + mj[..., None]) / safe[..., None]), 0, 15)
    L = torch.where((dj == 0)[..., None], L, Lq).reshape(nb, 4, 2, 32)   # a zero scale keeps the search's codes
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128).to(torch.uint8)
    out = torch.cat([d_bytes, dmin_bytes, _pack_k4_scales(ls, lm), qs], dim=1)
    return out.reshape(_rows_shape(x.shape, out.shape[1], QK_K))


def _unpack_q4_k(b: torch.Tensor) -> dict:
    nb = b.shape[0]
    sc, m = _unpack_k4_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(nb, 4, 1, 32)             # byte l of chunk c: element 64c + l (low), 64c + 32 + l (high)
    return {"d": _fp16_from_bytes(b[:, 0:2]), "dmin": _fp16_from_bytes(b[:, 2:4]), "scales": sc, "mins": m,
            "codes": torch.cat([qs & 0xF, qs >> 4], dim=2).reshape(nb, QK_K)}


def _decode_q4_k(f: dict) -> torch.Tensor:
    """x = (d * sc_j) * q - (dmin * m_j)."""
    nb = f["codes"].shape[0]
    dj = (f["d"] * f["scales"].to(torch.float32))[..., None]       # [nb, 8, 1]
    mj = (f["dmin"] * f["mins"].to(torch.float32))[..., None]
    return (dj * f["codes"].reshape(nb, 8, 32).to(torch.float32) - mj).reshape(nb, QK_K)


def _make_qx_quants(x: torch.Tensor, nmax: int = 32):
    """Symmetric scale search for each row of x [n, 16], weights x^2 (ggml's rmse_type 1) -> (scale [n], L [n, 16])."""
    n, k = x.shape
    f = torch.float32
    imax = x.abs().argmax(dim=1, keepdim=True)            # first index of the largest magnitude
    mx = x.gather(1, imax)[:, 0]                          # ... with its sign
    zero = mx.abs() < GROUP_MAX_EPS
    mxs = torch.where(zero, torch.ones_like(mx), mx)
    wts = x * x

    def trial(iscale):
        l = torch.clamp(_nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        lf = l.to(f)
        sumlx = _seq_sum([wts[:, i] * x[:, i] * lf[:, i] for i in range(k)])
        suml2 = _seq_sum([wts[:, i] * lf[:, i] * lf[:, i] for i in range(k)])
        return l, sumlx, suml2

    l, sumlx, suml2 = trial(torch.tensor(-float(nmax), dtype=f, device=x.device) / mxs)
    L = l + nmax
    scale = torch.where(suml2 != 0, sumlx / torch.where(suml2 != 0, suml2, 1.0), 0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(nmax + torch.tensor(0.1, dtype=f, device=x.device) * step) / mxs
        l, sumlx, suml2 = trial(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = torch.where(better[:, None], l + nmax, L)
        scale = torch.where(better, sumlx / torch.where(suml2 > 0, suml2, 1.0), scale)
        best = torch.where(better, scale * sumlx, best)
    return torch.where(zero, 0.0, scale), torch.where(zero[:, None], 0, L)


def quantize_q6_k(x: torch.Tensor) -> torch.Tensor:
    """[..., 256k] float -> [..., 210k] uint8 Q6_K super-blocks (llama.cpp's layout and reference algorithm)."""
    xb = _blocks(x, qk=QK_K)                              # [nb, 256]
    nb = xb.shape[0]
    sub = xb.reshape(nb * 16, 16)
    scales, L = _make_qx_quants(sub)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    amax_idx = scales.abs().argmax(dim=1, keepdim=True)   # the first sub-block with the largest |scale|
    max_scale = scales.gather(1, amax_idx)[:, 0]          # [nb], with its sign
    empty = max_scale.abs() < GROUP_MAX_EPS
    ms = torch.where(empty, torch.ones_like(max_scale), max_scale)
    iscale = _fdiv(-128.0, ms)
    d_bytes = _fp16_bytes((1 / iscale)[:, None], "Q6_K")
    d = _fp16_from_bytes(d_bytes)                         # [nb, 1]
    sc = torch.clamp(_nearest_int(iscale[:, None] * scales), max=127)      # [nb, 16] int8 range
    dj = d * sc.to(torch.float32)                         # [nb, 16]
    safe = torch.where(dj == 0, torch.ones_like(dj), dj)
    Lq = torch.clamp(_nearest_int(sub.reshape(nb, 16, 16) / safe[..., None]), -32, 31) + 32
    L = torch.where((dj == 0)[..., None], L, Lq).reshape(nb, 2, 4, 32)     # [nb, chunk of 128, quarter, 32]
    ql = torch.cat([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                    (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], dim=2).reshape(nb, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
          | ((L[:, :, 3] >> 4) << 6)).reshape(nb, 64)
    out = torch.cat([ql.to(torch.uint8), qh.to(torch.uint8), sc.to(torch.int8).view(torch.uint8), d_bytes], dim=1)
    out[empty] = 0                                        # ggml zeroes a super-block with no signal
    return out.reshape(_rows_shape(x.shape, out.shape[1], QK_K))


def _unpack_q6_k(b: torch.Tensor) -> dict:
    nb = b.shape[0]
    ql, qh = b[:, :128].reshape(nb, 2, 1, 64), b[:, 128:192].reshape(nb, 2, 1, 32)
    lo = torch.cat([ql & 0xF, ql >> 4], dim=2).reshape(nb, 2, 4, 32)      # quarters 0,1 | 2,3 of each 128
    hi = torch.cat([(qh >> sh) & 3 for sh in (0, 2, 4, 6)], dim=2)        # [nb, 2, 4, 32]
    return {"d": _fp16_from_bytes(b[:, 208:210]), "scales": b[:, 192:208].contiguous().view(torch.int8),
            "codes": (lo | (hi << 4)).reshape(nb, QK_K)}                  # 0..63, element order


def _decode_q6_k(f: dict) -> torch.Tensor:
    """x = (d * s_j) * (q - 32)."""
    nb = f["codes"].shape[0]
    q = (f["codes"].to(torch.int8) - 32).reshape(nb, 16, 16).to(torch.float32)
    return ((f["d"] * f["scales"].to(torch.float32))[..., None] * q).reshape(nb, QK_K)


# The registry: one record per format. Adding a format is adding one record here (CONTRIBUTING.md).
register_format(GGUFFormat("q8_0", QK, 2 + QK, 8, quantize_q8_0, _unpack_q8_0, _decode_q8_0,
                           "GGUF Q8_0 (32-blocks, fp16 d)"))                                   # 34 bytes
register_format(GGUFFormat("q4_0", QK, 2 + QK // 2, 4, quantize_q4_0, _unpack_q4_0, _decode_q4_0,
                           "GGUF Q4_0 (32-blocks, fp16 d)"))                                   # 18 bytes
register_format(GGUFFormat("q4_k", QK_K, 2 + 2 + 12 + QK_K // 2, 4, quantize_q4_k, _unpack_q4_k, _decode_q4_k,
                           "GGUF Q4_K (256-super-blocks, fp16 d and dmin, 6-bit scales and mins per 32)"))
register_format(GGUFFormat("q6_k", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, 6, quantize_q6_k, _unpack_q6_k,
                           _decode_q6_k, "GGUF Q6_K (256-super-blocks, int8 scale per 16, fp16 d)"))
# 144 bytes: d, dmin, 8 x (6-bit scale, 6-bit min), nibbles; 210: low nibbles, high 2 bits, 16 int8 scales, d

# Views of the registry, for readers that want one number per format.
BLOCK_BYTES = {n: f.block_bytes for n, f in GGUF_FORMATS.items()}
BLOCK_VALUES = {n: f.block_values for n, f in GGUF_FORMATS.items()}


def _format(fmt) -> GGUFFormat:
    if isinstance(fmt, GGUFFormat):
        return fmt
    if fmt not in GGUF_FORMATS:
        raise ValueError(f"fmt must be one of {list(GGUF_FORMATS)}, got {fmt!r}")
    return GGUF_FORMATS[fmt]


def dequantize_q8_0(data: torch.Tensor) -> torch.Tensor:
    """[..., 34k] uint8 -> [..., 32k] float32."""
    return GGUF_FORMATS["q8_0"].dequantize(data)


def dequantize_q4_0(data: torch.Tensor) -> torch.Tensor:
    """[..., 18k] uint8 -> [..., 32k] float32."""
    return GGUF_FORMATS["q4_0"].dequantize(data)


def dequantize_q4_k(data: torch.Tensor) -> torch.Tensor:
    """[..., 144k] uint8 -> [..., 256k] float32:  x = (d * sc_j) * q - (dmin * m_j)."""
    return GGUF_FORMATS["q4_k"].dequantize(data)


def dequantize_q6_k(data: torch.Tensor) -> torch.Tensor:
    """[..., 210k] uint8 -> [..., 256k] float32:  x = (d * s_j) * (q - 32)."""
    return GGUF_FORMATS["q6_k"].dequantize(data)


def gguf_quantize(x: torch.Tensor, fmt) -> torch.Tensor:
    """``fmt`` a registered name ("q8_0", "q4_0", "q4_k", "q6_k": ``GGUF_FORMATS``) or a GGUFFormat."""
    return _format(fmt).quantize(x)


def gguf_dequantize(data: torch.Tensor, fmt) -> torch.Tensor:
    return _format(fmt).dequantize(data)


def gguf_bits_per_weight(fmt) -> float:
    """Stored bits per value, scales included: 8.5, 4.5, 4.5, 6.5625."""
    return _format(fmt).bits_per_weight


def describe_block(block: torch.Tensor, fmt) -> dict:
    """Take one block's bytes apart: {"hex", "d", "codes" (element order), "values"}, plus what else the format
    stores, as stored integers: "dmin", and per sub-block "scales" and "mins" (Q4_K); "scales" (Q6_K)."""
    f = _format(fmt)
    b = f.blocks(block.reshape(-1))
    if b.shape[0] != 1:
        raise ValueError(f"describe_block expects exactly one {f.name} block ({f.block_bytes} bytes)")
    fields = f.unpack(b)
    info = {"hex": " ".join(f"{v:02x}" for v in b[0].tolist()), "values": f.decode(fields)[0].tolist()}
    for key, v in fields.items():
        info[key] = float(v) if key in ("d", "dmin") else v[0].tolist()
    return info
