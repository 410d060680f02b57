"""Tiled exact attention in PyTorch: FlashAttention's forward pass, one tile at a time, readable.

For each tile of ``block_q`` queries (the outer loop, as in FlashAttention-2), walk the keys in tiles of
``block_k`` and keep three running quantities per query row, in fp32:

    m    [rows]       the largest score seen so far
    l    [rows]       sum of exp(score - m) over the keys seen
    acc  [rows, Dh]   sum of exp(score - m) * v over the keys seen (not yet divided by l)

A new key tile with scores s updates them with the online-softmax rescaling (``online_softmax``):
m' = max(m, rowmax(s)), alpha = exp(m - m'), l' = alpha l + rowsum(exp(s - m')), acc' = alpha acc +
exp(s - m') v. At the end out = acc / l. The N x N scores never exist; only a [block_q, block_k] tile does.

Causal: key tiles entirely in a query tile's future are skipped (never loaded); the tiles that cross the
diagonal are masked element by element. Lengths need not be multiples of the tiles (the last tiles are
shorter). GQA: the G query heads of a group read their KV head's tile without a copy (a broadcast).

``IOCounter`` counts the elements a kernel with one program per (query head, query tile) would read from
and write to main memory (HBM): every Q tile once, the K and V tiles it visits, the output once. The IO
model of ``io_model.flash_attention_io`` predicts exactly these counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.validate import integer

from .reference import allowed_mask, check_qkv


@dataclass
class IOCounter:
    """Elements read from / written to main memory, by tensor (per query head, summed over the batch)."""
    q_reads: int = 0
    k_reads: int = 0
    v_reads: int = 0
    o_writes: int = 0
    tiles_visited: int = 0
    tiles_skipped: int = 0

    @property
    def reads(self) -> int:
        return self.q_reads + self.k_reads + self.v_reads

    @property
    def total(self) -> int:
        return self.reads + self.o_writes


def tiled_attention(q, k, v, causal: bool = False, block_q: int = 64, block_k: int = 64,
                    key_padding_mask=None, scale: float | None = None, counter: IOCounter | None = None,
                    return_lse: bool = False):
    """Exact attention by tiles with running statistics: q [B, H, T, Dh], k/v [B, K, S, Dh] ->
    [B, H, T, Dh] (and the natural log-sum-exp [B, H, T] with ``return_lse``). Same masks as
    ``reference_attention``; ``counter`` (an ``IOCounter``) accumulates the main-memory traffic."""
    B, H, K, T, S, Dh = check_qkv(q, k, v)
    block_q, block_k = integer(block_q, "block_q", low=1), integer(block_k, "block_k", low=1)
    G = H // K
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    mask = allowed_mask(T, S, causal, key_padding_mask, device=q.device, batch=B)    # [B|1, 1, T|1, S] or None
    out = torch.empty(B, H, T, Dh, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    qg = q.view(B, K, G, T, Dh)                                                       # group's heads side by side
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        qi = qg[:, :, :, i0:i1].float()                                               # [B, K, G, bq, Dh]
        m = torch.full((B, K, G, i1 - i0), float("-inf"), device=q.device)
        l = torch.zeros(B, K, G, i1 - i0, device=q.device)
        acc = torch.zeros(B, K, G, i1 - i0, Dh, device=q.device)
        if counter is not None:
            counter.q_reads += B * H * (i1 - i0) * Dh
        # causal: the last query of this tile sits at S - T + i1 - 1 and sees keys up to there
        k_end = min(S, S - T + i1) if causal else S
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            if j0 >= k_end:                          # wholly in the future of every query of the tile
                if counter is not None:
                    counter.tiles_skipped += 1
                continue
            kj = k[:, :, None, j0:j1].float()                                          # [B, K, 1, bk, Dh]
            vj = v[:, :, None, j0:j1].float()
            s = (qi @ kj.transpose(-1, -2)) * scale                                    # [B, K, G, bq, bk]
            if mask is not None:          # a padding-only mask has one query row, shared by every query
                rows = slice(i0, i1) if mask.shape[2] == T else slice(None)
                tile_mask = mask[:, :, rows, j0:j1]                                    # [B|1, 1, bq|1, bk]
                s = s.masked_fill(~tile_mask[:, :, None], float("-inf"))
            m_new = torch.maximum(m, s.max(dim=-1).values)
            m_use = torch.where(torch.isinf(m_new), 0.0, m_new)       # a row with nothing seen yet: no NaN
            alpha = torch.exp(m - m_use)                              # rescale what was summed so far
            p = torch.exp(s - m_use[..., None])
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ vj
            m = m_new
            if counter is not None:
                counter.k_reads += B * H * (j1 - j0) * Dh
                counter.v_reads += B * H * (j1 - j0) * Dh
                counter.tiles_visited += 1
        safe_l = torch.where(l > 0, l, 1.0)
        out.view(B, K, G, T, Dh)[:, :, :, i0:i1] = (acc / safe_l[..., None]).to(q.dtype)
        lse.view(B, K, G, T)[:, :, :, i0:i1] = torch.where(l > 0, m + torch.log(safe_l), float("-inf"))
        if counter is not None:
            counter.o_writes += B * H * (i1 - i0) * Dh
    return (out, lse) if return_lse else out


__all__ = ["IOCounter", "tiled_attention"]
