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
The FlashAttention paper (Dao et al. 2022, Algorithm 1) sizes the tiles from the SRAM:
    B_c = ceil(M / 4d) key rows,   B_r = min(ceil(M / 4d), d) query rows,
so that a K and a V tile (B_c x d each), a Q and an O tile (B_r x d each, at most M/4 each) **and** the
B_r x B_c score tile (at most d * M/4d = M/4) all fit in O(M). With B_r = B_c = M/4d the four d-wide tiles
alone would fill M and the M/4d x M/4d score tile would not fit. In our loop order K and V are re-read
ceil(N / B_r) times, so the tiled count is about 2 N^2 d / B_r:
    M <= 4 d^2 (B_r = M/4d):  8 N^2 d^2 / M, the paper's Theta(N^2 d^2 / M);
    M >= 4 d^2 (B_r = d):     2 N^2, a K/V re-read per d query rows.
(The paper's own loop order, K/V tiles outside, re-reads Q and O once per key tile of B_c = M/4d rows:
Theta(N^2 d^2 / M) for every M; ``flash_io_theta`` is that bound.)

What that buys: standard / tiled ~ 4 N^2 / (2 N^2 d / B_r) = 2 B_r / d for long sequences: M / (2 d^2)
while the SRAM is small against d^2, 2 once the query tile reaches d rows (an H100's 228 KB SM at d = 64 or
128). The reduction is set by the SRAM and d and does **not** grow with N: not "a factor of sqrt(N)".
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


def sram_block_cols(head_dim: int, sram_elements: int) -> int:
    """The paper's key tile from the SRAM size: B_c = ceil(M / 4d) rows of K (and of V)."""
    sram_elements, head_dim = integer(sram_elements, "sram_elements", low=1), integer(head_dim, "head_dim", low=1)
    return max(1, math.ceil(sram_elements / (4 * head_dim)))


def sram_block_rows(head_dim: int, sram_elements: int) -> int:
    """The paper's query tile from the SRAM size: B_r = min(ceil(M / 4d), d) rows of Q. The cap at d keeps
    the B_r x B_c score tile within M/4 (d * M/4d), next to the Q, O, K and V tiles."""
    return min(sram_block_cols(head_dim, sram_elements), integer(head_dim, "head_dim", low=1))


def flash_attention_io(seq_len: int, head_dim: int, block_q: int | None = None, block_k: int | None = None,
                       sram_elements: int | None = None, causal: bool = False) -> dict:
    """Elements read and written by tiled attention, per (batch, query head), exactly as
    ``tiled_attention``'s ``IOCounter`` counts them (divided by batch * heads).

    Give ``block_q`` (and ``block_k``, which matters only for causal skipping), or ``sram_elements`` to
    size the tiles the paper's way (block_q = ``sram_block_rows``, block_k = ``sram_block_cols``)."""
    N, d = integer(seq_len, "seq_len", low=1), integer(head_dim, "head_dim", low=1)
    if block_q is None:
        if sram_elements is None:
            raise ValueError("give block_q or sram_elements")
        block_q = sram_block_rows(d, sram_elements)
        if block_k is None:
            block_k = sram_block_cols(d, sram_elements)
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
    """The paper's bound without its constant: N^2 d^2 / M (its loop order, key tiles of M/4d rows outside)."""
    return seq_len ** 2 * head_dim ** 2 / sram_elements


def io_reduction(seq_len: int, head_dim: int, sram_elements: int) -> float:
    """standard / tiled elements moved, with the tiles sized from the SRAM the paper's way; tends to
    2 B_r / d (B_r = ``sram_block_rows``) as N grows."""
    return (standard_attention_io(seq_len, head_dim)["total"]
            / flash_attention_io(seq_len, head_dim, sram_elements=sram_elements)["total"])


__all__ = ["standard_attention_io", "sram_block_rows", "sram_block_cols", "flash_attention_io", "flash_io_theta",
           "io_reduction"]
