"""Memory arithmetic: how many bytes N parameters take in each format, scales and zero points included.

    bytes = N * bits_per_weight / 8,   bits_per_weight = code_bits + (scale_bits + zero_point_bits + extra) / group_size

Examples: INT4 with one fp16 scale per group of 128 -> 4 + 16/128 = 4.125 bits; GGUF Q4_0 (fp16 scale per
32) -> 4.5; Q8_0 -> 8.5; NF4 with an fp32 absmax per 64 -> 4.5; NF4 with double quantization (8-bit scale
per 64, fp32 second-level scale per 256 scales) -> 4 + 8/64 + 32/(64*256) = 4.127; MXFP4 (8-bit E8M0 scale
per 32) -> 4.25; NVFP4 (8-bit E4M3 scale per 16, plus one FP32 scale per tensor) -> 4.5.

GB here is 10^9 bytes (what model cards and the lecture notes use); GiB is 2^30.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gguf import GGUF_FORMATS

__all__ = ["WeightFormat", "WEIGHT_FORMATS", "bits_per_weight", "weight_bytes", "memory_table",
           "memory_table_markdown", "GB", "GiB"]

GB = 10 ** 9
GiB = 2 ** 30


@dataclass(frozen=True)
class WeightFormat:
    """How one weight is stored: ``code_bits`` per value, plus per group of ``group_size`` values a scale
    (``scale_bits``), a zero point (``zero_point_bits``) and any other bits (``extra_bits_per_group``)."""
    name: str
    code_bits: int
    group_size: int | None = None
    scale_bits: float = 0
    zero_point_bits: float = 0
    extra_bits_per_group: float = 0

    def __post_init__(self):
        if self.code_bits <= 0:
            raise ValueError(f"code_bits must be positive, got {self.code_bits}")
        if self.group_size is not None and self.group_size <= 0:
            raise ValueError(f"group_size must be positive or None, got {self.group_size}")

    @property
    def bits_per_weight(self) -> float:
        if self.group_size is None:
            return float(self.code_bits)
        return self.code_bits + (self.scale_bits + self.zero_point_bits + self.extra_bits_per_group) / self.group_size

    def nbytes(self, n_params: float) -> float:
        if n_params < 0:
            raise ValueError(f"n_params must be >= 0, got {n_params}")
        return n_params * self.bits_per_weight / 8


WEIGHT_FORMATS = {
    "fp32": WeightFormat("FP32", 32),
    "fp16": WeightFormat("FP16 / BF16", 16),
    "int8": WeightFormat("INT8 (per-channel scales, negligible)", 8),
    "int4": WeightFormat("INT4 (no scales counted)", 4),
    "int4-g128": WeightFormat("INT4, group 128, fp16 scales", 4, 128, 16),
    "int4-g128-zp": WeightFormat("INT4, group 128, fp16 scale + 4-bit zero", 4, 128, 16, 4),
    # the GGUF formats, from their records: code bits per value, the rest of each block's bytes its scales
    **{name: WeightFormat(f.memory_name, f.code_bits, f.block_values, f.block_bytes * 8 - f.code_bits * f.block_values)
       for name, f in GGUF_FORMATS.items()},
    "nf4": WeightFormat("NF4, block 64, fp32 absmax", 4, 64, 32),
    "nf4-dq": WeightFormat("NF4 + double quant (8-bit absmax, fp32 per 256)", 4, 64, 8, 0, 32 / 256),
    # microscaling FP4 (``mx``): E2M1 codes; NVFP4's one FP32 scale per tensor is not counted (32 bits per tensor)
    "mxfp4": WeightFormat("MXFP4 (E2M1, E8M0 scale per 32)", 4, 32, 8),
    "nvfp4": WeightFormat("NVFP4 (E2M1, E4M3 scale per 16)", 4, 16, 8),
}


def _fmt(fmt) -> WeightFormat:
    if isinstance(fmt, WeightFormat):
        return fmt
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"fmt must be a WeightFormat or one of {list(WEIGHT_FORMATS)}, got {fmt!r}")
    return WEIGHT_FORMATS[fmt]


def bits_per_weight(fmt="int4", group_size: int | None = None, scale_bits: float = 16,
                    zero_point_bits: float = 0) -> float:
    """Effective bits per weight. ``fmt`` a preset name / WeightFormat, or an int (code bits) used with
    ``group_size``, ``scale_bits`` and ``zero_point_bits``."""
    if isinstance(fmt, int) and not isinstance(fmt, bool):
        return WeightFormat(f"{fmt}-bit", fmt, group_size, scale_bits if group_size else 0,
                            zero_point_bits if group_size else 0).bits_per_weight
    return _fmt(fmt).bits_per_weight


def weight_bytes(n_params: float, fmt="fp16", group_size: int | None = None, scale_bits: float = 16,
                 zero_point_bits: float = 0) -> float:
    """Bytes for ``n_params`` weights in ``fmt`` (see ``bits_per_weight``)."""
    return n_params * bits_per_weight(fmt, group_size, scale_bits, zero_point_bits) / 8


def memory_table(models: dict | None = None, formats=("fp32", "fp16", "int8", "int4", "int4-g128", "q8_0",
                                                      "q4_0", "nf4", "nf4-dq")) -> list[dict]:
    """Rows {format, bits_per_weight, <model>: GB, ...} for models given as {label: n_params}
    (default 7B and 70B parameters)."""
    models = {"7B": 7e9, "70B": 70e9} if models is None else models
    rows = []
    for key in formats:
        f = _fmt(key)
        row = {"format": f.name, "key": key if isinstance(key, str) else f.name, "bits_per_weight": f.bits_per_weight}
        for label, n in models.items():
            row[label] = f.nbytes(n) / GB
        rows.append(row)
    return rows


def memory_table_markdown(rows: list[dict]) -> str:
    labels = [k for k in rows[0] if k not in ("format", "key", "bits_per_weight")]
    out = "| format | bits / weight | " + " | ".join(f"{l} (GB)" for l in labels) + " |\n"
    out += "|---|---|" + "---|" * len(labels) + "\n"
    for r in rows:
        out += f"| {r['format']} | {r['bits_per_weight']:.3f} | " + " | ".join(f"{r[l]:.2f}" for l in labels) + " |\n"
    return out
