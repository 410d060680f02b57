"""How many elements attention moves between main memory (HBM) and the chip, standard vs tiled.

Per (batch, query head), N queries and N keys, head dim d, fast on-chip memory (SRAM) of M elements.

Standard attention writes the N x N scores S and probabilities P to main memory:
    S = Q K^T   reads Q, K (2 N d)         writes S (N^2)
    P = softmax reads S (N^2)              writes P (N^2)
    O = P V     reads P, V (N^2 + N d)     writes O (N d)
    total 4 N d + 4 N^2 elements: Theta(N d + N^2).

Tiled attention (the course's FlashAttention-2 loop order: query tiles outside, key tiles inside) reads
each query tile once, the K and V tiles once per query tile, and writes the output once:
    N d + 2 N d * ceil(N / B_r) + N d          (B_r query rows per tile; causal: about half the K/V)
The FlashAttention paper sizes the tile from the SRAM: B_r = ceil(M / 4d) rows (the tile of Q, its
output, a K and a V tile and the scores must fit), so K and V are re-read N / B_r = 4 N d / M times:
    Theta(N^2 d^2 / M) elements.

What that buys: standard / tiled ~ (4 N^2) / (8 N^2 d^2 / M) = M / (2 d^2) for long sequences. The
reduction is set by the SRAM size against d^2 and does **not** grow with N: not "a factor of sqrt(N)".
"""
from __future__ import annotations

import math

from course_lib.validate import integer


def standard_attention_io(seq_len: int, head_dim: int) -> dict:
    """Elements read and written by standard (materializing) attention, per (batch, head)."""
    N, d = integer(seq_len, "seq_len", low=1), integer(head_dim, "head_dim", low=1)
    reads = 2 * N * d + N * N + N * N + N * d
    writes = N * N + N * N + N * d
    return {"reads": reads, "writes": writes, "total": reads + writes}


def sram_block_rows(head_dim: int, sram_elements: int) -> int:
    """The paper's tile height from the SRAM size: ceil(M / 4d) rows (at least 1)."""
    sram_elements, head_dim = integer(sram_elements, "sram_elements", low=1), integer(head_dim, "head_dim", low=1)
    return max(1, math.ceil(sram_elements / (4 * head_dim)))


def flash_attention_io(seq_len: int, head_dim: int, block_q: int | None = None, block_k: int | None = None,
                       sram_elements: int | None = None, causal: bool = False) -> dict:
    """Elements read and written by tiled attention, per (batch, query head), exactly as
    ``tiled_attention``'s ``IOCounter`` counts them (divided by batch * heads).

    Give ``block_q`` (and ``block_k``, which matters only for causal skipping), or ``sram_elements`` to
    size the tile the paper's way (``sram_block_rows``; then block_k = block_q)."""
    N, d = integer(seq_len, "seq_len", low=1), integer(head_dim, "head_dim", low=1)
    if block_q is None:
        if sram_elements is None:
            raise ValueError("give block_q or sram_elements")
        block_q = sram_block_rows(d, sram_elements)
    block_q = min(integer(block_q, "block_q", low=1), N)
    block_k = block_q if block_k is None else integer(block_k, "block_k", low=1)
    kv_rows = 0
    for i0 in range(0, N, block_q):
        i1 = min(i0 + block_q, N)
        if causal:     # key tiles that start before the tile's last query position
            k_end = i1
            kv_rows += min(N, -(-k_end // block_k) * block_k)
        else:
            kv_rows += N
    reads = N * d + 2 * kv_rows * d
    writes = N * d
    return {"reads": reads, "writes": writes, "total": reads + writes, "block_q": block_q, "block_k": block_k}


def flash_io_theta(seq_len: int, head_dim: int, sram_elements: int) -> float:
    """The paper's bound without its constant: N^2 d^2 / M."""
    return seq_len ** 2 * head_dim ** 2 / sram_elements


def io_reduction(seq_len: int, head_dim: int, sram_elements: int) -> float:
    """standard / tiled elements moved, with the tile sized from the SRAM."""
    return (standard_attention_io(seq_len, head_dim)["total"]
            / flash_attention_io(seq_len, head_dim, sram_elements=sram_elements)["total"])


__all__ = ["standard_attention_io", "sram_block_rows", "flash_attention_io", "flash_io_theta", "io_reduction"]
