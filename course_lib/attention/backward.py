"""FlashAttention's backward pass in PyTorch, one tile at a time, readable: the reference the Triton backward
(``triton_flash_backward``) is tested against.

The forward saved only the output O [T, Dh] and each row's natural log-sum-exp L [T] (``tiled_attention(...,
return_lse=True)``), never the T x S probabilities. The backward recomputes them tile by tile from L, so its
memory stays linear in the sequence length: FlashAttention's backward (Dao et al. 2022, Appendix B.2 and
B.4, Algorithm 4, which saves the row max and sum; FlashAttention-2's backward saves their log-sum-exp alone,
as here, and gives each key tile its own thread block, Dao 2024, Section 3.1.2, Algorithm 2). With dO the
gradient of the output, per (query tile i, key tile j):

    P_ij  = exp(Q_i K_j^T * scale - L_i)         the forward's probabilities, recomputed exactly
    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - D_i)                  softmax's backward, with D = rowsum(dO * O)
    dQ_i += scale * dS_ij K_j
    dK_j += scale * dS_ij^T Q_i

D = rowsum(dO * O) is rowsum(P * dP) (since O = P V), computed once per row from what the forward saved
instead of from a whole row of P (Dao et al. 2022, Appendix B.2).

Loop order (both papers' backward): the outer loop walks the key tiles, so each dK_j, dV_j is summed over the
query tiles in registers and written once; dQ_i gets a contribution from every key tile, here an fp32
buffer (the Triton version gives dQ its own pass instead, see ``triton_flash_backward``). Causal: query t
sits at position S - T + t and sees keys <= there (as ``tiled_attention``); (query tile, key tile) pairs
wholly in the future are skipped. GQA: the G query heads of a group read their KV head's tile by a
broadcast and their contributions to that head's dK, dV are summed.
"""
from __future__ import annotations

import math

import torch

from course_lib.validate import integer

from .reference import allowed_mask, check_qkv


def check_backward_inputs(q, k, v, out, lse, dout) -> tuple[int, int, int, int, int, int]:
    """check_qkv's shapes, plus out and dout [B, H, T, Dh] like q and lse [B, H, T] on q's device;
    returns (B, H, K, T, S, Dh) or raises a ValueError/TypeError naming the argument."""
    B, H, K, T, S, Dh = check_qkv(q, k, v)
    for name, x, shape in (("out", out, q.shape), ("dout", dout, q.shape), ("lse", lse, q.shape[:3])):
        if not torch.is_tensor(x):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return B, H, K, T, S, Dh


def tiled_attention_backward(q, k, v, out, lse, dout, causal: bool = False, scale: float | None = None,
                             block_q: int = 64, block_k: int = 64):
    """Gradients of ``tiled_attention`` (= ``reference_attention``) by tiles: q [B, H, T, Dh], k/v
    [B, K, S, Dh], the forward's out [B, H, T, Dh] and natural log-sum-exp lse [B, H, T], the output's
    gradient dout [B, H, T, Dh] -> (dq, dk, dv) in the dtypes of q, k, v. Math in fp32; memory
    O(tile sizes) besides the inputs, the outputs and dq's fp32 buffer. ``causal`` needs T <= S."""
    B, H, K, T, S, Dh = check_backward_inputs(q, k, v, out, lse, dout)
    block_q, block_k = integer(block_q, "block_q", low=1), integer(block_k, "block_k", low=1)
    G = H // K
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    mask = allowed_mask(T, S, causal, device=q.device)                    # [1, 1, T, S] or None
    qg = q.view(B, K, G, T, Dh).float()                                   # a group's heads side by side
    dog = dout.reshape(B, K, G, T, Dh).float()
    # D_i = rowsum(dO_i * O_i) = rowsum(P_i * dP_i): one number per query row, from what the forward saved
    delta = (dog * out.reshape(B, K, G, T, Dh).float()).sum(dim=-1)        # [B, K, G, T]
    # a row that saw no key has lse = -inf and P = 0: subtract 0 there, not -inf (no NaN)
    lse_g = lse.reshape(B, K, G, T).float()
    lse_g = torch.where(torch.isinf(lse_g), 0.0, lse_g)
    dq = torch.zeros(B, K, G, T, Dh, device=q.device)                     # fp32, every key tile adds to it
    dk = torch.empty(B, K, S, Dh, dtype=k.dtype, device=q.device)
    dv = torch.empty(B, K, S, Dh, dtype=v.dtype, device=q.device)
    for j0 in range(0, S, block_k):
        j1 = min(j0 + block_k, S)
        kj = k[:, :, None, j0:j1].float()                                 # [B, K, 1, bk, Dh]
        vj = v[:, :, None, j0:j1].float()
        dk_j = torch.zeros(B, K, j1 - j0, Dh, device=q.device)            # summed over every query tile
        dv_j = torch.zeros(B, K, j1 - j0, Dh, device=q.device)
        # causal: query t sees key j iff j <= S - T + t, so the first query that sees key j0 is j0 - (S - T)
        i_start = max(0, j0 - (S - T)) // block_q * block_q if causal else 0
        for i0 in range(i_start, T, block_q):
            i1 = min(i0 + block_q, T)
            qi, doi = qg[:, :, :, i0:i1], dog[:, :, :, i0:i1]             # [B, K, G, bq, Dh]
            s = (qi @ kj.transpose(-1, -2)) * scale                       # [B, K, G, bq, bk]
            if mask is not None:
                s = s.masked_fill(~mask[:, :, None, i0:i1, j0:j1], float("-inf"))
            p = torch.exp(s - lse_g[:, :, :, i0:i1, None])                # the forward's P, recomputed
            dv_j += (p.transpose(-1, -2) @ doi).sum(dim=2)                # P^T dO, summed over the group
            dp = doi @ vj.transpose(-1, -2)                               # [B, K, G, bq, bk]
            ds = p * (dp - delta[:, :, :, i0:i1, None])
            dq[:, :, :, i0:i1] += scale * (ds @ kj)
            dk_j += scale * (ds.transpose(-1, -2) @ qi).sum(dim=2)
        dk[:, :, j0:j1] = dk_j.to(k.dtype)
        dv[:, :, j0:j1] = dv_j.to(v.dtype)
    return dq.view(B, H, T, Dh).to(q.dtype), dk, dv


__all__ = ["check_backward_inputs", "tiled_attention_backward"]
