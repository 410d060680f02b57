"""How many elements attention moves between main memory (HBM) and the chip, standard vs tiled.

Per (batch, query head): N queries and N keys, head dim d, fast on-chip memory (SRAM) of M elements.

Standard attention (the FlashAttention paper's Algorithm 0) writes the N x N scores S and probabilities P
to main memory:
    S = Q K^T   reads Q, K (2 N d)         writes S (N^2)
    P = softmax reads S (N^2)              writes P (N^2)
    O = P V     reads P, V (N^2 + N d)     writes O (N d)
    total 4 N d + 4 N^2 elements: Theta(N d + N^2).

Tiled attention has two loop orders, and ``count_io`` runs each one's tile loops and counts every load and
store as written; ``flash_attention_io`` is the closed form of the same count:

* ``"kv_outer"``: the paper's Algorithm 1 (Dao et al. 2022). O, l, m start in HBM (zeros, -inf); for each
  key tile K_j, V_j (B_c rows, loaded once), every query tile loads Q_i, O_i, l_i, m_i and stores O_i, l_i,
  m_i back:
      N d + 2 N  +  2 N d  +  ceil(N / B_c) (3 N d + 4 N)  ~  12 N^2 d^2 / M   for B_c = M / 4d.
* ``"query_outer"``: FlashAttention-2's order (Dao 2023), ``tiled_attention``'s and the course's Triton
  kernel's: each query tile (B_r rows) loads Q_i once, walks every K and V tile, and stores O_i once, the
  running statistics staying on chip:
      N d  +  ceil(N / B_r) 2 N d  +  N d  ~  8 N^2 d^2 / M   for B_r = M / 4d.

In each order the tile of the **outer** loop is the one re-read against, and the SRAM sets its size.
``sram_tiles`` splits M the paper's way: the two d-wide tiles of the outer loop take M/4 each
(ceil(M / 4d) rows), the inner loop's tile is capped at d rows so that the B_r x B_c score tile takes at
most d * M/4d = M/4 as well; the paper's B_c = ceil(M/4d), B_r = min(ceil(M/4d), d) for ``kv_outer`` and
the same rule with the roles swapped for ``query_outer``. Both orders are Theta(N^2 d^2 / M) (the paper's
Theorem 2); the saving against standard attention tends, as N grows, to
    kv_outer:    4 B_c / (3d + 4)  ~  M / 3d^2         query_outer:  2 B_r / d  ~  M / 2d^2,
set by the SRAM against d^2 and growing with M; it does **not** grow with N (not "a factor of sqrt(N)").
(The query-outer order also saves re-reading and re-writing O and the statistics: one of FlashAttention-2's
changes.) The model counts main-memory traffic only; on a GPU the L2 cache serves some of the re-reads.
"""
from __future__ import annotations

import math

from course_lib.validate import integer

LOOP_ORDERS = ("query_outer", "kv_outer")


def _order(order) -> str:
    if order not in LOOP_ORDERS:
        raise ValueError(f"order must be one of {LOOP_ORDERS}, got {order!r}")
    return order


def standard_attention_io(seq_len: int, head_dim: int) -> dict:
    """Elements read and written by standard (materializing) attention, per (batch, head)."""
    N, d = integer(seq_len, "seq_len", low=1), integer(head_dim, "head_dim", low=1)
    reads = 2 * N * d + N * N + N * N + N * d
    writes = N * N + N * N + N * d
    return {"reads": reads, "writes": writes, "total": reads + writes}


def sram_tiles(head_dim: int, sram_elements: int, order: str) -> tuple[int, int]:
    """(block_q, block_k) sized from an SRAM of `sram_elements` elements: the outer loop's tile gets
    ceil(M / 4d) rows, the inner loop's min(ceil(M / 4d), d) (the paper's Algorithm 1 for ``kv_outer``:
    B_r = min(ceil(M/4d), d), B_c = ceil(M/4d); roles swapped for ``query_outer``)."""
    d = integer(head_dim, "head_dim", low=1)
    M = integer(sram_elements, "sram_elements", low=1)
    outer = max(1, math.ceil(M / (4 * d)))
    inner = min(outer, d)
    return (inner, outer) if _order(order) == "kv_outer" else (outer, inner)


def _tiles(n: int, block: int):
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def _visible(q_tile, k_tile, causal: bool) -> bool:
    """Whether a key tile holds any key a query of the tile may see (causal: key position <= query's)."""
    return not causal or k_tile[0] <= q_tile[1] - 1


def count_io(seq_len: int, head_dim: int, block_q: int, block_k: int, order: str, causal: bool = False) -> dict:
    """Run the tile loops of `order` and count every element loaded from and stored to main memory, per
    (batch, query head), tensor by tensor (``q_reads``, ``k_reads``, ``v_reads``, ``o_reads``,
    ``o_writes``, ``stats_reads``, ``stats_writes``: the running max and sum, one each per row) and in
    all (``reads``, ``writes``, ``total``). Causal: a tile wholly in a query tile's future is skipped.
    Slow on purpose (a Python loop over tile pairs): ``flash_attention_io`` is the fast closed form."""
    N, d = integer(seq_len, "seq_len", low=1), integer(head_dim, "head_dim", low=1)
    bq, bk = integer(block_q, "block_q", low=1), integer(block_k, "block_k", low=1)
    c = dict.fromkeys(("q_reads", "k_reads", "v_reads", "o_reads", "o_writes", "stats_reads", "stats_writes"), 0)
    if _order(order) == "kv_outer":            # Algorithm 1, as written
        c["o_writes"] += N * d                 # line 2: O = 0, l = 0, m = -inf in HBM
        c["stats_writes"] += 2 * N
        for kt in _tiles(N, bk):               # line 5
            rows_k = kt[1] - kt[0]
            c["k_reads"] += rows_k * d         # line 6: K_j, V_j
            c["v_reads"] += rows_k * d
            for qt in _tiles(N, bq):           # line 7
                if not _visible(qt, kt, causal):
                    continue
                rows_q = qt[1] - qt[0]
                c["q_reads"] += rows_q * d     # line 8: Q_i, O_i, l_i, m_i
                c["o_reads"] += rows_q * d
                c["stats_reads"] += 2 * rows_q
                c["o_writes"] += rows_q * d    # lines 12-13: O_i, l_i, m_i
                c["stats_writes"] += 2 * rows_q
    else:                                      # FlashAttention-2's order, tiled_attention's
        for qt in _tiles(N, bq):
            rows_q = qt[1] - qt[0]
            c["q_reads"] += rows_q * d         # Q_i once; m, l and the output accumulate on chip
            for kt in _tiles(N, bk):
                if not _visible(qt, kt, causal):
                    continue
                c["k_reads"] += (kt[1] - kt[0]) * d
                c["v_reads"] += (kt[1] - kt[0]) * d
            c["o_writes"] += rows_q * d        # O_i once
    c["reads"] = c["q_reads"] + c["k_reads"] + c["v_reads"] + c["o_reads"] + c["stats_reads"]
    c["writes"] = c["o_writes"] + c["stats_writes"]
    c["total"] = c["reads"] + c["writes"]
    return c


def _causal_pairs_rows(N: int, outer: int, inner: int, outer_is_query: bool) -> int:
    """Sum over outer tiles of the inner rows they visit (causal), without the pair loop: for a query tile
    ending at e, the key tiles starting before e; for a key tile starting at s, the query tiles ending after s."""
    total = 0
    if outer_is_query:
        for s in range(0, N, outer):
            e = min(s + outer, N)
            total += min(N, -(-e // inner) * inner)          # key tiles starting below e, rows clipped to N
    else:
        for s in range(0, N, outer):
            first = (s // inner) * inner                     # the query tile holding position s
            total += N - first
    return total


def flash_attention_io(seq_len: int, head_dim: int, block_q: int | None = None, block_k: int | None = None,
                       sram_elements: int | None = None, causal: bool = False, order: str = "query_outer") -> dict:
    """Elements read and written by tiled attention in loop `order`, per (batch, query head): the closed
    form of ``count_io`` (equal to it, term by term). ``"query_outer"`` (the default) is
    ``tiled_attention``'s loop, whose ``IOCounter`` it also equals.

    Give ``block_q`` (and ``block_k``; default ``block_q``), or ``sram_elements`` to size the tiles the
    paper's way (``sram_tiles``)."""
    N, d = integer(seq_len, "seq_len", low=1), integer(head_dim, "head_dim", low=1)
    _order(order)
    if block_q is None:
        if sram_elements is None:
            raise ValueError("give block_q or sram_elements")
        block_q, auto_k = sram_tiles(d, sram_elements, order)
        block_k = auto_k if block_k is None else block_k
    bq = integer(block_q, "block_q", low=1)
    bk = bq if block_k is None else integer(block_k, "block_k", low=1)
    if order == "query_outer":
        kv_rows = _causal_pairs_rows(N, bq, bk, True) if causal else N * math.ceil(N / bq)
        reads, writes = N * d + 2 * kv_rows * d, N * d
    else:
        q_rows = _causal_pairs_rows(N, bk, bq, False) if causal else N * math.ceil(N / bk)
        reads = 2 * N * d + q_rows * (2 * d + 2)            # K, V once; Q, O, l, m per key tile
        writes = N * d + 2 * N + q_rows * (d + 2)           # the initial O, l, m; O, l, m per key tile
    return {"reads": reads, "writes": writes, "total": reads + writes, "block_q": min(bq, N),
            "block_k": min(bk, N), "order": order}


def flash_io_theta(seq_len: int, head_dim: int, sram_elements: int) -> float:
    """The paper's bound without its constant: N^2 d^2 / M (Theorem 2)."""
    return seq_len ** 2 * head_dim ** 2 / sram_elements


def io_reduction(seq_len: int, head_dim: int, sram_elements: int, order: str) -> float:
    """standard / tiled elements moved, with the tiles of loop `order` sized from the SRAM (``sram_tiles``);
    tends to ``io_reduction_limit`` as N grows."""
    return (standard_attention_io(seq_len, head_dim)["total"]
            / flash_attention_io(seq_len, head_dim, sram_elements=sram_elements, order=order)["total"])


def io_reduction_limit(head_dim: int, sram_elements: int, order: str) -> float:
    """The reduction for N -> infinity: 4 B_c / (3d + 4) for ``kv_outer`` (about M / 3d^2), 2 B_r / d for
    ``query_outer`` (about M / 2d^2), with the tiles of ``sram_tiles``."""
    d = integer(head_dim, "head_dim", low=1)
    bq, bk = sram_tiles(d, sram_elements, order)
    return 4 * bk / (3 * d + 4) if order == "kv_outer" else 2 * bq / d


__all__ = ["LOOP_ORDERS", "standard_attention_io", "sram_tiles", "count_io", "flash_attention_io", "flash_io_theta",
           "io_reduction", "io_reduction_limit"]
