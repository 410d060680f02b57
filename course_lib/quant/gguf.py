"""GGUF block formats Q8_0 and Q4_0, byte for byte as llama.cpp (ggml) stores them.

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

import torch

from .core import check_tensor

__all__ = ["QK", "BLOCK_BYTES", "quantize_q8_0", "dequantize_q8_0", "quantize_q4_0", "dequantize_q4_0",
           "describe_block", "gguf_quantize", "gguf_dequantize"]

QK = 32  # values per block
BLOCK_BYTES = {"q8_0": 2 + QK, "q4_0": 2 + QK // 2}  # 34 and 18


def _blocks(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    check_tensor(x, name)
    if x.dim() == 0 or x.shape[-1] % QK:
        raise ValueError(f"{name}'s last dimension must be a multiple of {QK} (GGUF block size), "
                         f"got shape {tuple(x.shape)}")
    return x.to(torch.float32).reshape(-1, QK)           # [n_blocks, 32]


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


def _rows_shape(shape, bytes_per_block):
    return (*shape[:-1], shape[-1] // QK * bytes_per_block)


def _byte_blocks(data: torch.Tensor, fmt: str) -> torch.Tensor:
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
        raise TypeError(f"data must be a uint8 torch.Tensor of {fmt} blocks")
    nb = BLOCK_BYTES[fmt]
    if data.dim() == 0 or data.shape[-1] % nb:
        raise ValueError(f"data's last dimension must be a multiple of {nb} bytes ({fmt} block), "
                         f"got shape {tuple(data.shape)}")
    return data.reshape(-1, nb)


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """[..., 32k] float -> [..., 34k] uint8 Q8_0 blocks (the layout ``gguf.quants.quantize`` returns)."""
    b = _blocks(x)
    d = b.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = _roundf(b * inv).to(torch.int8)
    out = torch.cat([_fp16_bytes(d, "Q8_0"), q.view(torch.uint8)], dim=1)
    return out.reshape(_rows_shape(x.shape, BLOCK_BYTES["q8_0"]))


def dequantize_q8_0(data: torch.Tensor) -> torch.Tensor:
    """[..., 34k] uint8 -> [..., 32k] float32."""
    b = _byte_blocks(data, "q8_0")
    d = _fp16_from_bytes(b[:, :2])
    q = b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return (q * d).reshape(*data.shape[:-1], data.shape[-1] // BLOCK_BYTES["q8_0"] * QK)


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
    return out.reshape(_rows_shape(x.shape, BLOCK_BYTES["q4_0"]))


def dequantize_q4_0(data: torch.Tensor) -> torch.Tensor:
    """[..., 18k] uint8 -> [..., 32k] float32."""
    b = _byte_blocks(data, "q4_0")
    d = _fp16_from_bytes(b[:, :2])
    qs = b[:, 2:]
    q = torch.cat([qs & 0xF, qs >> 4], dim=1).to(torch.int8) - 8   # elements 0..15, then 16..31
    return (q.to(torch.float32) * d).reshape(*data.shape[:-1], data.shape[-1] // BLOCK_BYTES["q4_0"] * QK)


def gguf_quantize(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """``fmt`` "q8_0" or "q4_0"."""
    fns = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
    if fmt not in fns:
        raise ValueError(f"fmt must be 'q8_0' or 'q4_0', got {fmt!r}")
    return fns[fmt](x)


def gguf_dequantize(data: torch.Tensor, fmt: str) -> torch.Tensor:
    fns = {"q8_0": dequantize_q8_0, "q4_0": dequantize_q4_0}
    if fmt not in fns:
        raise ValueError(f"fmt must be 'q8_0' or 'q4_0', got {fmt!r}")
    return fns[fmt](data)


def describe_block(block: torch.Tensor, fmt: str) -> dict:
    """Take one block's bytes apart: {"hex", "d", "codes" (element order), "values"}."""
    b = _byte_blocks(block.reshape(-1), fmt)
    if b.shape[0] != 1:
        raise ValueError(f"describe_block expects exactly one {fmt} block ({BLOCK_BYTES[fmt]} bytes)")
    d = float(_fp16_from_bytes(b[:, :2]))
    if fmt == "q8_0":
        codes = b[0, 2:].contiguous().view(torch.int8).tolist()
        values = dequantize_q8_0(b)[0].tolist()
    else:
        qs = b[0, 2:]
        codes = torch.cat([qs & 0xF, qs >> 4]).tolist()
        values = dequantize_q4_0(b)[0].tolist()
    return {"hex": " ".join(f"{v:02x}" for v in b[0].tolist()), "d": d, "codes": codes, "values": values}
