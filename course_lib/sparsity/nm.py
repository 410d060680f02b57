"""N:M semi-structured sparsity (2:4): in every group of M consecutive weights along the input dimension,
exactly N are kept. NVIDIA's sparse tensor cores (Ampere and later) run 2:4 matrices at up to twice the
dense math rate, from the compressed form (half the values plus 2-bit positions, ``masks.semi_structured_bytes``).

    nm_mask(scores, n=2, m=4)        keep the n largest scores of every m along the last dimension
    is_nm(mask_or_weight, n, m)      every group has at most n nonzeros (exactly n for a mask: exact=True)
    semi_structured_speed(...)       on a CUDA GPU with sparse tensor cores: dense vs
                                     torch.sparse.to_sparse_semi_structured matmul times
"""
from __future__ import annotations

import torch

from course_lib.perf.timing import benchmark
from course_lib.quant.core import check_finite
from course_lib.validate import integer

from .masks import RANK_WHY


def _check_nm(n, m) -> tuple[int, int]:
    n, m = integer(n, "n", low=1), integer(m, "m", low=1)
    if n > m:
        raise ValueError(f"n must be at most m, got n={n}, m={m}")
    return n, m


def nm_mask(scores: torch.Tensor, n: int = 2, m: int = 4) -> torch.Tensor:
    """Bool mask [..., C] keeping the n highest `scores` in each group of m along the last dim (C % m == 0).

    Ties go to the earlier position (a stable sort), so equal scores still give exactly n per group.
    NaN/Inf scores are refused (a one-time mask build, so the values are always read)."""
    n, m = _check_nm(n, m)
    if not isinstance(scores, torch.Tensor) or scores.dim() < 1:
        raise TypeError("scores must be a torch.Tensor with at least one dimension")
    if scores.is_floating_point():
        check_finite(scores, "scores", why=RANK_WHY)
    C = scores.shape[-1]
    if C % m:
        raise ValueError(f"the last dimension of scores ({C}) must be a multiple of m={m}")
    g = scores.reshape(*scores.shape[:-1], C // m, m)                     # [..., C/m, m]
    order = torch.sort(g, dim=-1, descending=True, stable=True).indices  # best first
    keep = torch.zeros_like(g, dtype=torch.bool)
    keep.scatter_(-1, order[..., :n], True)
    return keep.reshape(scores.shape)


def is_nm(x: torch.Tensor, n: int = 2, m: int = 4, exact: bool = False) -> bool:
    """True if every group of m along the last dim has at most n nonzeros (exactly n with exact=True)."""
    n, m = _check_nm(n, m)
    if x.shape[-1] % m:
        return False
    nz = (x != 0).reshape(*x.shape[:-1], x.shape[-1] // m, m).sum(-1)
    return bool((nz == n).all()) if exact else bool((nz <= n).all())


def semi_structured_speed(rows: int = 4096, cols: int = 4096, tokens: int = 4096, dtype=torch.float16,
                          repeats: int = 50) -> dict | None:
    """Time y = x @ W^T for a 2:4-pruned W [rows, cols] and x [tokens, cols]: dense vs the compressed
    ``torch.sparse.to_sparse_semi_structured`` form, on a CUDA GPU with compute capability >= 8.0.

    Returns {'dense_ms', 'sparse_ms', 'speedup', 'max_abs_diff', 'device'}, or None (with a one-line
    message) where there is no such GPU."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        print("semi_structured_speed: needs a CUDA GPU with sparse tensor cores (compute capability >= 8.0); "
              "skipped")
        return None
    from torch.sparse import to_sparse_semi_structured
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(rows, cols, device=dev, dtype=dtype, generator=gen)
    w = w * nm_mask(w.abs(), 2, 4)
    x = torch.randn(tokens, cols, device=dev, dtype=dtype, generator=gen)
    ws = to_sparse_semi_structured(w)

    def timed(fn):                                # ms per call: `repeats` back-to-back calls, CUDA events
        return benchmark(fn, warmup=5, repeats=1, inner=repeats, device=dev).min * 1e3

    dense_ms = timed(lambda: torch.nn.functional.linear(x, w))
    sparse_ms = timed(lambda: torch.nn.functional.linear(x, ws))
    diff = (torch.nn.functional.linear(x, w) - torch.nn.functional.linear(x, ws)).abs().max().item()
    return {"dense_ms": dense_ms, "sparse_ms": sparse_ms, "speedup": dense_ms / sparse_ms, "max_abs_diff": diff,
            "device": torch.cuda.get_device_name()}
