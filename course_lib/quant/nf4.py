"""NF4 (4-bit NormalFloat, QLoRA): a 16-value codebook from normal quantiles, blockwise absmax scaling,
and double quantization of the scales.

The codebook. Trained weights are roughly normal, so spend the 16 levels where the probability mass is:
put the levels at quantiles of N(0, 1), then rescale to [-1, 1]. Two details make it the table
bitsandbytes uses:

* 0 must be exactly representable (padding, and the many near-zero weights), and a symmetric 16-level
  grid cannot contain 0 (an even number of levels, symmetric about 0). So the halves are asymmetric:
  8 positive levels at the quantiles of 9 evenly spaced probabilities from ``offset`` down to 0.5
  (0.5 itself dropped), 7 negative levels likewise from 8 probabilities, plus 0 itself: 8 + 7 + 1 = 16.
* The extreme quantile of probability 1 is infinite, so the top probability is pulled in to
  ``offset`` = 1 - (1/(2*15) + 1/(2*16)) / 2 = 0.9677083, halfway between the choices for 15 and 16
  equal-probability bins. Both halves are divided by the largest value, so the table runs from -1 to 1.

Blockwise quantization (block 64): each block of 64 consecutive values (of the flattened tensor) is
divided by its absmax, each result is replaced by the index of the nearest codebook entry (ties go to the
lower entry), and two indices are packed per byte, the first in the high nibble (bitsandbytes' order).
"Divided" is rounded as bitsandbytes rounds it: x * (1/absmax) in full blocks, x / absmax in a partial last
block (the two can differ by 1 ulp, enough to move a value on a midpoint to the next code).
Storage: 4 bits + 32/64 (fp32 absmax) = 4.5 bits per weight.

Double quantization: the absmax values (one per 64 weights) are themselves quantized to 8 bits in blocks
of 256. They are all positive, so first their mean (the ``offset``) is subtracted to centre them around
0 - otherwise half of a signed 8-bit code would be wasted - then each block of 256 gets an fp32 absmax and
8-bit codes from bitsandbytes' "dynamic" 8-bit code (a float-like table, finer near 0). Storage:
4 + 8/64 + 32/(64*256) = 4.127 bits per weight. Dequantize: absmax = code8[q] * absmax2 + offset.

Against ``bitsandbytes.functional.quantize_4bit(..., quant_type="nf4", blocksize=64)`` on CPU (the tests):
the codebook is bitsandbytes' table to the last bit; without double quantization the 4-bit codes, the
packed bytes, the absmax values and the dequantized tensor are identical. With double quantization the
4-bit codes and bytes are still identical, but bitsandbytes' CPU kernel for the 8-bit step does not
always return the nearest entry of the dynamic code (about 0.1% of the scales land 1-2 entries away);
this module takes the exact nearest entry, so its scales are never further from the true absmax, and
the dequantized tensors agree to about 0.1% of the tensor's absmax (the tests allow 0.5%).
Degenerate blocks store what bitsandbytes stores, so a state passes through its dequantizer unchanged: an
all-zero block an absmax of 0.0 (1e-38 if it is the partial last block); under double quantization a block of
256 scales with no spread (an all-zero tensor, or equal absmax everywhere) absmax2 0.0 and index 0, the C
kernel's result for 0/0, and a subnormal absmax2 scales its block by itself, unclamped, as the kernel does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.validate import integer

from .core import check_tensor

__all__ = ["NF4_OFFSET", "nf4_codebook", "dynamic_map", "NF4Tensor", "nf4_quantize", "nf4_dequantize",
           "nearest_code"]

NF4_OFFSET = 1 - (1 / (2 * 15) + 1 / (2 * 16)) / 2   # 0.96770833...


def nf4_codebook(offset: float = 0.9677083) -> torch.Tensor:
    """The 16 NF4 levels, sorted, in [-1, 1], float32 (index 7 is exactly 0)."""
    if not 0.5 < offset < 1:
        raise ValueError(f"offset must be in (0.5, 1), got {offset}")
    # float32 probabilities (as bitsandbytes built its table), float64 inverse normal CDF. A constant table,
    # built on the host (float64) and moved to the data by its users (nf4_quantize: .to(x.device)).
    p_pos = torch.linspace(offset, 0.5, 9, dtype=torch.float32, device="cpu")[:-1].double()   # 8 probs > 0.5
    p_neg = torch.linspace(offset, 0.5, 8, dtype=torch.float32, device="cpu")[:-1].double()   # 7 probs > 0.5
    pos = torch.special.ndtri(p_pos)
    neg = -torch.special.ndtri(p_neg)
    v = torch.cat([neg, torch.zeros(1, dtype=torch.float64, device="cpu"), pos]).to(torch.float32).sort().values
    return v / v.max()


def dynamic_map(max_exponent_bits: int = 7) -> torch.Tensor:
    """bitsandbytes' signed 8-bit "dynamic" code (256 sorted values in [-1, 1]): for i = 0..6, 2^i
    evenly spaced levels in (0.1, 1) * 10^(i - 6) on each sign, plus 0 and 1. Like a float: a decimal
    "exponent" picks the decade, a "fraction" the position inside it, and small decades get fewer levels."""
    data = []
    for i in range(max_exponent_bits):
        bounds = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32, device="cpu")   # a host table
        means = (bounds[:-1] + bounds[1:]) / 2.0
        level = 10 ** (-(max_exponent_bits - 1) + i)
        data += (level * means).tolist()
        data += (-level * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return torch.tensor(sorted(data), dtype=torch.float32, device="cpu")


def nearest_code(v: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the nearest entry of the sorted ``code`` for each value (ties to the lower entry)."""
    mid = (code[:-1] + code[1:]) / 2
    return torch.bucketize(v, mid.to(v.dtype))


def _blockwise_absmax_codes(flat: torch.Tensor, blocksize: int, code: torch.Tensor, step: str):
    """flat [n] float32 -> (indices [n] int64, absmax [ceil(n/blocksize)] float32), as bitsandbytes' CPU path.

    ``step="4bit"`` is its 4-bit step (quantize_4bit, backends/default/ops.py): full blocks are scaled
    by x * (1/absmax), with absmax clamped to 1e-38 only inside the reciprocal (an all-zero full block stores
    0.0); a partial last block is scaled by x / absmax with its absmax clamped to 1e-38 *and stored clamped*.
    x * (1/a) and x / a can differ by 1 ulp, which flips the code of a value on a codebook midpoint.

    ``step="8bit"`` is its 8-bit step (double quantization), a C kernel: every block is scaled by
    x / absmax and stores its absmax as it is (no clamp, so a subnormal absmax scales its block to +-1). An
    all-zero block divides 0 by 0; the kernel's search maps the NaNs to index 0 (its most negative code, which
    times the stored absmax 0 decodes to 0), and we store index 0 too, so the state is the one bitsandbytes
    writes. (A nearest-entry search would pick 0.0's index, 127: same decoded value, different bytes.)"""
    n = flat.numel()
    full = n - n % blocksize if step == "4bit" else n   # the 8-bit step pads its last block
    n_blocks = -(-full // blocksize)
    padded = torch.nn.functional.pad(flat[:full], (0, n_blocks * blocksize - full))  # zeros keep absmax
    blocks = padded.reshape(n_blocks, blocksize)
    absmax = blocks.abs().amax(dim=1)
    if step == "8bit":
        empty = (absmax == 0).unsqueeze(1)                                        # [n_blocks, 1]
        scaled = blocks / torch.where(empty, torch.ones_like(blocks), absmax.unsqueeze(1))
        idx = nearest_code(torch.clamp(scaled, -1, 1), code)                      # [n_blocks, blocksize]
        return torch.where(empty, torch.zeros_like(idx), idx).reshape(-1)[:full], absmax
    scaled = (blocks * (1.0 / absmax.clamp(min=1e-38)).unsqueeze(1)).reshape(-1)[:full]
    if full < n:
        am = flat[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, flat[full:] / am])
    return nearest_code(torch.clamp(scaled, -1, 1), code), absmax


@dataclass
class NF4Tensor:
    """A tensor in NF4: packed 4-bit indices plus per-block scales (plain or double-quantized)."""
    packed: torch.Tensor            # uint8 [ceil(n/2)], first index in the high nibble
    shape: torch.Size
    dtype: torch.dtype
    blocksize: int
    code: torch.Tensor              # the 16-entry codebook
    absmax: torch.Tensor | None     # float32 [n_blocks] (None when double-quantized)
    # double quantization of the absmax values:
    absmax_codes: torch.Tensor | None = None   # uint8 [n_blocks], indices into code2
    absmax2: torch.Tensor | None = None        # float32 [ceil(n_blocks/dq_blocksize)]
    offset: float | None = None                # mean of the absmax values, subtracted before quantizing
    code2: torch.Tensor | None = None          # the 8-bit dynamic code
    dq_blocksize: int = 256

    @property
    def double_quant(self) -> bool:
        return self.absmax_codes is not None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def codes(self) -> torch.Tensor:
        """The unpacked 4-bit indices, [n] int64."""
        hi, lo = (self.packed >> 4).long(), (self.packed & 0xF).long()
        return torch.stack([hi, lo], dim=-1).reshape(-1)[: self.numel]

    def scales(self) -> torch.Tensor:
        """The per-block absmax, float32 [n_blocks] (dequantized from 8 bits under double quantization)."""
        if not self.double_quant:
            return self.absmax
        n_blocks = self.absmax_codes.numel()
        v = self.code2[self.absmax_codes.long()]
        reps = torch.repeat_interleave(self.absmax2, self.dq_blocksize)[:n_blocks]
        return v * reps + self.offset

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        vals = self.code[self.codes()]
        s = torch.repeat_interleave(self.scales(), self.blocksize)[: self.numel]
        return (vals * s).reshape(self.shape).to(dtype or self.dtype)

    def storage_bits(self) -> int:
        n_blocks = -(-self.numel // self.blocksize)
        if not self.double_quant:
            return 4 * self.numel + 32 * n_blocks
        return 4 * self.numel + 8 * n_blocks + 32 * self.absmax2.numel() + 32

    def bits_per_value(self) -> float:
        return self.storage_bits() / self.numel


def nf4_quantize(x: torch.Tensor, blocksize: int = 64, double_quant: bool = False,
                 dq_blocksize: int = 256) -> NF4Tensor:
    """Blockwise NF4 quantization of ``x`` (flattened; the last block may be partial), optionally with
    double quantization of the block absmax values (8-bit dynamic code in blocks of ``dq_blocksize``,
    mean subtracted first)."""
    check_tensor(x, "x")
    blocksize, dq_blocksize = integer(blocksize, "blocksize", low=1), integer(dq_blocksize, "dq_blocksize", low=1)
    code = nf4_codebook().to(x.device)
    flat = x.detach().reshape(-1).to(torch.float32)
    idx, absmax = _blockwise_absmax_codes(flat, blocksize, code, step="4bit")
    if idx.numel() % 2:                                   # pad with the index of 0.0 (as bitsandbytes does)
        idx = torch.cat([idx, torch.full((1,), 7, dtype=idx.dtype, device=idx.device)])
    idx8 = idx.to(torch.uint8)
    packed = (idx8[0::2] << 4) | idx8[1::2]
    q = NF4Tensor(packed=packed, shape=x.shape, dtype=x.dtype, blocksize=blocksize, code=code, absmax=absmax)
    if double_quant:
        offset = absmax.mean()
        code2 = dynamic_map().to(x.device)
        a_idx, absmax2 = _blockwise_absmax_codes(absmax - offset, dq_blocksize, code2, step="8bit")
        q.absmax, q.absmax_codes, q.absmax2 = None, a_idx.to(torch.uint8), absmax2
        q.offset, q.code2, q.dq_blocksize = float(offset), code2, dq_blocksize
    return q


def nf4_dequantize(q: NF4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(q, NF4Tensor):
        raise TypeError(f"nf4_dequantize expects an NF4Tensor, got {type(q).__name__}")
    return q.dequantize(dtype)
