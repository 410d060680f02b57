"""INT4 packing: two 4-bit codes in one byte, and back.

PyTorch has no 4-bit dtype, so int4 codes travel as uint8 bytes holding two codes each. The layout here:

    byte j of a row = code[2j] in the low nibble (bits 0-3) | code[2j+1] in the high nibble (bits 4-7)

``order="high_first"`` swaps the nibbles (bitsandbytes' NF4 layout puts the first code in the high
nibble). GGUF's Q4_0 uses yet another layout (low nibbles = elements 0..15 of a 32-block, high nibbles =
16..31; see ``gguf``): the bits are the same, the byte order is a convention you must match exactly.

Signed codes (-8..7) are stored as their 4-bit two's complement (code & 0xF) and sign-extended on the way
back; unsigned codes (0..15) are stored as they are.
"""
from __future__ import annotations

import torch

__all__ = ["pack_int4", "unpack_int4"]

_ORDERS = ("low_first", "high_first")
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def pack_int4(codes: torch.Tensor, signed: bool = True, order: str = "low_first") -> torch.Tensor:
    """[..., 2n] integer codes -> [..., n] uint8, two codes per byte (see module docstring)."""
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype not in _INT_DTYPES:
        raise TypeError(f"codes must be an integer tensor (int8/uint8/int16/int32/int64), got {codes.dtype}")
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {_ORDERS}, got {order!r}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes' last dimension must be even (two codes per byte), got shape {tuple(codes.shape)}")
    lo, hi = (-8, 7) if signed else (0, 15)
    if codes.numel() and (int(codes.min()) < lo or int(codes.max()) > hi):
        raise ValueError(f"codes must lie in {lo}..{hi} for signed={signed}, "
                         f"got values in {int(codes.min())}..{int(codes.max())}")
    nib = (codes.to(torch.int16) & 0xF).to(torch.uint8)   # two's complement nibble for negative codes
    first, second = nib[..., 0::2], nib[..., 1::2]
    if order == "high_first":
        first, second = second, first
    return first | (second << 4)


def unpack_int4(packed: torch.Tensor, signed: bool = True, order: str = "low_first") -> torch.Tensor:
    """[..., n] uint8 -> [..., 2n] int8 codes (-8..7 if ``signed`` else 0..15); exact inverse of pack_int4."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got {packed.dtype}")
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {_ORDERS}, got {order!r}")
    if packed.dim() == 0:
        raise ValueError("packed must have at least one dimension")
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    if signed:
        low = torch.where(low >= 8, low - 16, low)
        high = torch.where(high >= 8, high - 16, high)
    first, second = (low, high) if order == "low_first" else (high, low)
    return torch.stack([first, second], dim=-1).flatten(-2)
