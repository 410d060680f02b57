"""Number formats: how a bit pattern becomes a number, for every format the course uses.

A binary floating-point format with ``e`` exponent bits, ``m`` mantissa bits and bias ``b`` stores

    sign | exponent field E | mantissa field M

    normal      (0 < E < E_max):  (-1)^sign * (1 + M / 2^m) * 2^(E - b)
    subnormal   (E == 0):         (-1)^sign * (0 + M / 2^m) * 2^(1 - b)     (zero when M == 0 too)
    special     (E == E_max):     IEEE-style formats (FP32, FP16, BF16, FP8 E5M2): inf (M == 0) or NaN;
                                  FP8 E4M3 "fn" (finite): only E == E_max and M == all ones is NaN, the
                                  other patterns with E == E_max are ordinary normal numbers (max 448).

Integer formats (INT8, INT4) are two's-complement codes; they carry no scale of their own, so a
quantized tensor stores a separate floating-point scale (see ``core``). NF4 is a 16-entry lookup table
(a codebook), not a float: the 4-bit code is an index (see ``nf4``).

Everything in the summary table (range, smallest normal / subnormal, spacing near 1) is computed here
from the bit layout, and the tests check it against ``torch.finfo`` wherever torch has the dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.perf.tables import format_table

from .nf4 import nf4_codebook

__all__ = ["FloatFormat", "IntFormat", "CodebookFormat", "Decoded", "FORMATS", "get_format",
           "decode_bits", "encode_bits", "representable_values", "formats_table_rows", "formats_table_markdown"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exponent_bits``, ``mantissa_bits``, a bias.

    ``finite_only`` marks the FP8 E4M3 "fn" flavour: no infinities, the all-ones exponent holds
    ordinary numbers and only S.1111.111 is NaN, which buys one extra binade (max 448 instead of 240).
    """
    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    finite_only: bool = False
    torch_dtype: torch.dtype | None = None
    kind: str = "float"

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def max_exponent_field(self) -> int:
        return (1 << self.exponent_bits) - 1

    @property
    def max_value(self) -> float:
        """The largest finite value."""
        m = self.mantissa_bits
        if self.finite_only:  # top exponent usable; its all-ones mantissa is NaN
            top_e, top_m = self.max_exponent_field, (1 << m) - 2
        else:                 # top exponent reserved for inf/NaN
            top_e, top_m = self.max_exponent_field - 1, (1 << m) - 1
        return (1 + top_m / 2 ** m) * 2.0 ** (top_e - self.bias)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value: 2^(1 - bias)."""
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value at all: one mantissa step above zero, 2^(1 - bias - m)."""
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def spacing_near_one(self) -> float:
        """Distance from 1.0 to the next larger value (machine epsilon): 2^-m."""
        return 2.0 ** (-self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """About how many significant decimal digits the format holds: log10(2^(m+1))."""
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def has_inf(self) -> bool:
        return not self.finite_only


@dataclass(frozen=True)
class IntFormat:
    """A two's-complement (signed) or plain binary (unsigned) integer code of ``bits`` bits."""
    name: str
    bits: int
    signed: bool = True
    torch_dtype: torch.dtype | None = None
    kind: str = "int"

    @property
    def min_value(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def max_value(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def spacing_near_one(self) -> float:
        return 1.0


@dataclass(frozen=True)
class CodebookFormat:
    """A format whose ``bits``-bit code indexes a table of values (NF4); values are then scaled."""
    name: str
    bits: int
    kind: str = "codebook"

    @property
    def values(self) -> torch.Tensor:
        return nf4_codebook()

    @property
    def max_value(self) -> float:
        return float(self.values.max())

    @property
    def min_value(self) -> float:
        return float(self.values.min())

    @property
    def spacing_near_one(self) -> float:
        v = self.values
        return float(v[-1] - v[-2])

    @property
    def min_nonzero(self) -> float:
        v = self.values.abs()
        return float(v[v > 0].min())


FORMATS = {
    "fp32": FloatFormat("FP32", 8, 23, 127, torch_dtype=torch.float32),
    "fp16": FloatFormat("FP16", 5, 10, 15, torch_dtype=torch.float16),
    "bf16": FloatFormat("BF16", 8, 7, 127, torch_dtype=torch.bfloat16),
    "fp8_e4m3": FloatFormat("FP8 E4M3", 4, 3, 7, finite_only=True,
                            torch_dtype=getattr(torch, "float8_e4m3fn", None)),
    "fp8_e5m2": FloatFormat("FP8 E5M2", 5, 2, 15, torch_dtype=getattr(torch, "float8_e5m2", None)),
    "int8": IntFormat("INT8", 8, torch_dtype=torch.int8),
    "int4": IntFormat("INT4", 4),
    "nf4": CodebookFormat("NF4", 4),
}
_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "e4m3": "fp8_e4m3",
            "fp8_e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "e5m2": "fp8_e5m2",
            "float8_e5m2": "fp8_e5m2"}


def get_format(fmt) -> FloatFormat | IntFormat | CodebookFormat:
    """A format object from its name ("fp16", "bf16", "fp8_e4m3", "int4", "nf4", ...) or itself."""
    if isinstance(fmt, (FloatFormat, IntFormat, CodebookFormat)):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name or a format object, got {type(fmt).__name__}")
    key = _ALIASES.get(fmt.lower(), fmt.lower())
    if key not in FORMATS:
        raise ValueError(f"fmt must be one of {sorted(FORMATS)}, got {fmt!r}")
    return FORMATS[key]


@dataclass(frozen=True)
class Decoded:
    """The fields of one bit pattern and the value they stand for."""
    format: FloatFormat
    bits: int             # the whole pattern as an unsigned integer
    sign: int
    exponent_field: int   # E as stored
    mantissa_field: int   # M as stored
    exponent: int | None  # the power of two actually applied (None for inf/NaN)
    kind: str             # "zero", "subnormal", "normal", "inf", "nan"
    value: float

    @property
    def bitstring(self) -> str:
        """"s|eeeee|mmmmmmmmmm", for display."""
        s = format(self.bits, f"0{self.format.bits}b")
        e = self.format.exponent_bits
        return f"{s[0]}|{s[1:1 + e]}|{s[1 + e:]}"

    def formula(self) -> str:
        """How the fields make the value, e.g. "+1 x (1 + 614/1024) x 2^-4"."""
        f, sgn = self.format, "-" if self.sign else "+"
        if self.kind in ("inf", "nan"):
            return f"{sgn}{self.kind} (exponent field all ones)"
        lead = 0 if self.kind in ("zero", "subnormal") else 1
        return f"{sgn}1 x ({lead} + {self.mantissa_field}/{2 ** f.mantissa_bits}) x 2^{self.exponent}"


def decode_bits(pattern: int, fmt) -> Decoded:
    """Split a bit pattern (an unsigned int of ``fmt.bits`` bits) into its fields and compute its value.

    Pure Python from the bit layout, so it works for any FloatFormat; the tests compare it with
    torch's own interpretation of every FP16, BF16 and FP8 pattern.
    """
    f = get_format(fmt)
    if not isinstance(f, FloatFormat):
        raise ValueError(f"decode_bits needs a floating-point format, got {f.name}")
    if not isinstance(pattern, int) or not 0 <= pattern < (1 << f.bits):
        raise ValueError(f"pattern must be an int in [0, 2^{f.bits}) for {f.name}, got {pattern!r}")
    m_bits, e_bits = f.mantissa_bits, f.exponent_bits
    man = pattern & ((1 << m_bits) - 1)
    exp = (pattern >> m_bits) & ((1 << e_bits) - 1)
    sign = pattern >> (m_bits + e_bits)
    sgn = -1.0 if sign else 1.0
    if exp == f.max_exponent_field and (not f.finite_only or man == (1 << m_bits) - 1):
        if f.finite_only or man != 0:
            return Decoded(f, pattern, sign, exp, man, None, "nan", float("nan"))
        return Decoded(f, pattern, sign, exp, man, None, "inf", sgn * float("inf"))
    if exp == 0:
        power = 1 - f.bias
        value = sgn * (man / 2 ** m_bits) * 2.0 ** power
        return Decoded(f, pattern, sign, exp, man, power, "zero" if man == 0 else "subnormal", value)
    power = exp - f.bias
    value = sgn * (1 + man / 2 ** m_bits) * 2.0 ** power
    return Decoded(f, pattern, sign, exp, man, power, "normal", value)


_UINT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def encode_bits(value: float, fmt) -> int:
    """The bit pattern of ``value`` rounded (to nearest, ties to even) into ``fmt``, via torch's cast.

    Note torch's casts: FP8 E4M3 saturates out-of-range values (even inf) to +-448 in current torch,
    while FP8 E5M2 and FP16 overflow to inf.
    """
    f = get_format(fmt)
    if not isinstance(f, FloatFormat) or f.torch_dtype is None:
        raise ValueError(f"encode_bits needs a float format that torch has, got {f.name}")
    t = torch.tensor([float(value)], dtype=torch.float64, device="cpu").to(f.torch_dtype)   # one host scalar
    raw = int(t.view(_UINT_VIEW[f.bits]).item())
    return raw & ((1 << f.bits) - 1)


def representable_values(fmt, finite: bool = True) -> torch.Tensor:
    """Every value a small format can hold, sorted (float64): FP8 (all 256 patterns), FP16, BF16,
    INT8/INT4 (the integer codes) and NF4 (its 16 codebook entries). Too many for FP32."""
    f = get_format(fmt)
    if isinstance(f, IntFormat):
        return torch.arange(f.min_value, f.max_value + 1, dtype=torch.float64, device="cpu")   # a host table
    if isinstance(f, CodebookFormat):
        return f.values.double()
    if f.bits > 16:
        raise ValueError(f"{f.name} has 2^{f.bits} patterns; representable_values is for 16 bits or fewer")
    vals = torch.tensor([decode_bits(p, f).value for p in range(1 << f.bits)], dtype=torch.float64, device="cpu")
    if finite:
        vals = vals[torch.isfinite(vals)]
    return torch.unique(vals)  # sorted; +0 and -0 merge


def formats_table_rows(names=("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "nf4")) -> list[dict]:
    """One row per format, every number computed from the layout (none typed in).

    Keys: format, bits, layout ("1-8-23" = sign-exponent-mantissa bits), sign, exponent, mantissa, bias,
    max, min (most negative), min_normal, min_subnormal, spacing_near_1, digits, inf, note. Integer
    formats count in units of their scale; NF4 in units of the block absmax.
    """
    rows = []
    for key in names:
        f = get_format(key)
        if isinstance(f, FloatFormat):
            rows.append(dict(format=f.name, bits=f.bits, layout=f"1-{f.exponent_bits}-{f.mantissa_bits}",
                             sign=1, exponent=f.exponent_bits, mantissa=f.mantissa_bits, bias=f.bias,
                             max=f.max_value, min=-f.max_value, min_normal=f.min_normal,
                             min_subnormal=f.min_subnormal, spacing_near_1=f.spacing_near_one,
                             digits=round(f.decimal_digits, 1), inf="yes" if f.has_inf else "no",
                             note=("no inf; only S.1111.111 is NaN (max 448, not 240)" if f.finite_only
                                   else "IEEE-style: top exponent = inf/NaN")))
        elif isinstance(f, IntFormat):
            rows.append(dict(format=f.name, bits=f.bits, layout="two's complement" if f.signed else "unsigned",
                             sign=None, exponent=None, mantissa=None, bias=None, max=f.max_value,
                             min=f.min_value, min_normal=None, min_subnormal=None, spacing_near_1=1.0,
                             digits=None, inf="no", note="uniform codes, times a float scale"))
        else:
            rows.append(dict(format=f.name, bits=f.bits, layout="16-entry codebook", sign=None, exponent=None,
                             mantissa=None, bias=None, max=f.max_value, min=f.min_value, min_normal=None,
                             min_subnormal=None, spacing_near_1=f.spacing_near_one, digits=None, inf="no",
                             note=f"normal quantiles, times a block absmax; smallest nonzero {f.min_nonzero:.4f}"))
    return rows


def _fmt_num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e6):
        return str(int(v))
    return f"{v:.4g}"


def formats_table_markdown(rows: list[dict] | None = None) -> str:
    """The format table as a Markdown table (for ``IPython.display.Markdown``)."""
    rows = formats_table_rows() if rows is None else rows
    cols = ["format", "bits", "layout", "bias", "min", "max", "min_normal", "min_subnormal", "spacing_near_1",
            "note"]
    return format_table(cols, [[_fmt_num(r.get(c)) for c in cols] for r in rows], "markdown")
