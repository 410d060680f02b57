"""GPTQ (Frantar et al., 2022): quantize a linear layer's weight column by column, pushing each column's
rounding error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's output
error. Second-order (it uses H = 2 X^T X of the calibration inputs), not gradient-based.

For one row w of W [out, in] and inputs X [n, in], the error is ||(w - q) X^T||^2 = (w - q) H (w - q)^T / 2
with H = 2 X^T X. Quantizing column j to q_j and re-solving the columns not yet quantized optimally (OBS)
gives, with F = {j, j+1, ...} those columns and H_F^-1 the inverse of H restricted to them (not the full
inverse's entries, once columns have been quantized),

    err   = (w_j - q_j) / [H_F^-1]_jj
    w_k  -= err * [H_F^-1]_jk        for the columns k after j

The upper Cholesky factor U of H^-1 (H^-1 = U^T U) holds every step's row at once: row j of U is row j of
H_F^-1 divided by sqrt([H_F^-1]_jj), so U[j, j]^2 = [H_F^-1]_jj and U[j, k] / U[j, j] = [H_F^-1]_jk / [H_F^-1]_jj,
the ratio the update needs (the entries themselves are not equal): err = (w_j - q_j) / U[j, j] and
w_k -= err * U[j, k] make the same update. This is the "Cholesky of the inverse" of the paper;
tests/test_quant_core.py checks the identity on random Hessians.

Details that matter (each has a test): damping (H + lambda I, lambda = percdamp * mean diag H) keeps H
invertible; a column that never sees a non-zero input (diag H = 0, a "dead" column) is set to 0 and its
H diagonal to 1; lazy batch updates apply the error of a block of columns to the rest in one matmul;
group scales are computed when the loop reaches the group's first column, from the weights with every
update so far applied (so the result does not depend on the block size); act-order quantizes columns by decreasing
diag H and the result is un-permuted, each column
keeping the group it was quantized in (``g_idx``).

Bad input (one-time transforms, so every value is checked): a weight or H that is not a finite floating-point
tensor, an empty weight, an H of the wrong shape, an H that is not positive definite even after damping
(a ValueError naming H instead of torch's LinAlgError), and ``hessian`` of a batch with no rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.validate import integer, optional, probability

from .core import check_finite, check_floating, check_tensor

from .linear import dequantize_weight_codes, quantize_weight_codes, weight_qparams

__all__ = ["GPTQResult", "gptq_quantize", "layer_output_error", "hessian_error", "hessian"]


@dataclass
class GPTQResult:
    codes: torch.Tensor          # [out, in] integer codes (float tensor of exact ints), original column order
    scales: torch.Tensor         # [out, G]
    zeros: torch.Tensor | None   # [out, G] or None (symmetric)
    g_idx: torch.Tensor          # [in] the group of each column (long)
    weight: torch.Tensor         # [out, in] the dequantized weight, original column order
    perm: torch.Tensor | None    # the act-order permutation (None without act-order)


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2/n X^T X for inputs x [n, in] (float32); x must be finite, with at least one row."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a 2-D [n_tokens, in_features] tensor")
    if x.shape[0] == 0:
        raise ValueError(f"x has no rows (shape {tuple(x.shape)}): H = 2/n X^T X averages over n >= 1 "
                         f"calibration tokens")
    check_floating(x, "x")
    check_finite(x, "x", why="H = 2/n X^T X would be NaN/Inf, and GPTQ's Cholesky factorization of it would fail")
    x = x.float()
    return 2 * x.T @ x / x.shape[0]


def layer_output_error(w: torch.Tensor, w_q: torch.Tensor, x: torch.Tensor) -> float:
    """||x W^T - x W_q^T||_F^2 / n: the objective GPTQ minimizes, on inputs x [n, in]."""
    d = x.float() @ (w.float() - w_q.float()).T
    return float(d.pow(2).sum() / x.shape[0])


def hessian_error(w: torch.Tensor, w_q: torch.Tensor, H: torch.Tensor) -> float:
    """The same objective from H = 2/n X^T X alone: tr((W - W_q) H (W - W_q)^T) / 2 (no activations kept)."""
    d = w.float() - w_q.float()
    return float(((d @ H.float()) * d).sum() / 2)


@torch.no_grad()
def gptq_quantize(weight: torch.Tensor, H: torch.Tensor, bits: int = 4, group_size: int | None = 128,
                  sym: bool = False, blocksize: int = 128, percdamp: float = 0.01, act_order: bool = False,
                  scale_dtype=torch.float16) -> GPTQResult:
    """GPTQ of weight [out, in] given the Hessian H [in, in] of its inputs (see ``hessian``)."""
    check_tensor(weight.detach() if isinstance(weight, torch.Tensor) else weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D [out, in] tensor, got shape {tuple(weight.shape)}")
    if not isinstance(H, torch.Tensor) or H.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(f"H must have shape ({weight.shape[1]}, {weight.shape[1]}), got "
                         f"{tuple(H.shape) if isinstance(H, torch.Tensor) else type(H).__name__}")
    check_floating(H, "H")
    check_finite(H, "H", why="GPTQ's Cholesky factorization of H would fail")
    percdamp = probability(percdamp, "percdamp", one=False)
    blocksize = integer(blocksize, "blocksize", low=1)
    group_size = optional(integer, group_size, "group_size", low=1)
    W = weight.detach().float().clone()                                # [out, in]
    H = H.detach().float().clone()
    out_f, in_f = W.shape
    gs = group_size or in_f

    dead = torch.diag(H) == 0                                          # columns whose input is always 0
    H[dead, dead] = 1
    W[:, dead] = 0

    perm = None
    if act_order:                                                      # most "important" columns first
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]

    damp = percdamp * torch.mean(torch.diag(H))
    H += damp * torch.eye(in_f, device=H.device)
    try:
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)  # U, H^-1 = U^T U
    except torch.linalg.LinAlgError:
        raise ValueError(f"H is not positive definite, even with damping percdamp={percdamp} "
                         f"(lambda = {float(damp):.3g} added to its diagonal): the Hessian 2/n X^T X of real inputs "
                         f"is positive semi-definite (pass hessian(x) of the layer's inputs), and a larger percdamp "
                         f"helps one that is nearly singular") from None

    Q = torch.zeros_like(W)                                            # codes, quantization order
    n_groups = -(-in_f // gs)
    scales = torch.zeros(out_f, n_groups, device=W.device)
    zeros = None if sym else torch.zeros(out_f, n_groups, device=W.device)
    scale = zero = None
    for i1 in range(0, in_f, blocksize):
        i2 = min(i1 + blocksize, in_f)
        W1 = W[:, i1:i2].clone()                                       # [out, b] the block, updated in place
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % gs == 0:                                          # a new group: its scale from the updated weights
                g = col // gs
                # the group's columns past this block have not received the block's lazy update yet:
                # apply it to them here, so that the scale (and the result) does not depend on blocksize
                ahead = W[:, i2:col + gs] - Err1[:, :i] @ Hinv[i1:col, i2:col + gs]
                block = torch.cat([W1[:, i:], ahead], dim=1)[:, :gs]
                scale, zero = weight_qparams(block, bits, sym, scale_dtype)
                scales[:, g] = scale[:, 0]
                if zeros is not None:
                    zeros[:, g] = zero[:, 0]
            w = W1[:, i:i + 1]                                         # [out, 1]
            q = quantize_weight_codes(w, scale, zero, bits)
            Q[:, col:col + 1] = q
            err = (w - dequantize_weight_codes(q, scale, zero)) / Hinv1[i, i]
            W1[:, i:] -= err @ Hinv1[i:i + 1, i:]                     # error feedback inside the block
            Err1[:, i:i + 1] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]                           # lazy batch update of the rest

    g_idx = torch.arange(in_f, device=W.device) // gs                  # group of each position in quantization order
    if perm is not None:                                               # back to the original column order
        inv = torch.argsort(perm)
        Q, g_idx = Q[:, inv], g_idx[inv]
    s_full = scales[:, g_idx]
    z_full = None if zeros is None else zeros[:, g_idx]
    w_hat = dequantize_weight_codes(Q, s_full, z_full)
    return GPTQResult(Q, scales, zeros, g_idx, w_hat.to(weight.dtype), perm)
