"""Argument checks shared by every paged-attention implementation (the PyTorch ones in ``attention`` and
the Triton kernel in ``triton_paged``), in a module of their own so that neither imports the other for them."""
from __future__ import annotations

import torch

from .manager import blocks_needed


def check_paged_args(q, k_pool, v_pool, block_tables, context_lens, sync_checks: bool = True):
    """Raise ValueError naming the argument and what was expected.

    Shapes, dtypes, devices and H % K are always checked (no device work). ``sync_checks`` adds the
    checks that must read the lengths and tables on the host (a device sync): lengths in
    [0, max_blocks * block_size] (0: an empty sequence, whose output row is zeros) and every used table
    entry inside the pool."""
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("block_tables", block_tables),
                    ("context_lens", context_lens)):
        if not torch.is_tensor(t):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, head_dim] (one decode query per sequence), got {tuple(q.shape)}")
    if k_pool.dim() != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool and v_pool must be equal [num_blocks, kv_heads, block_size, head_dim], got "
                         f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}")
    B, H, Dh = q.shape
    N, K, bs, Dh2 = k_pool.shape
    if B < 1 or H < 1 or Dh < 1 or N < 1 or K < 1 or bs < 1:
        raise ValueError(f"empty q {tuple(q.shape)} or pools {tuple(k_pool.shape)}: every dimension must be >= 1")
    if Dh != Dh2:
        raise ValueError(f"q head_dim {Dh} != pool head_dim {Dh2}")
    if H % K:
        raise ValueError(f"query heads {H} must be a multiple of kv heads {K}")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or block_tables.shape[1] < 1 \
            or block_tables.dtype.is_floating_point or block_tables.dtype == torch.bool:
        raise ValueError(f"block_tables must be an integer [batch={B}, max_blocks>=1] tensor, got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.shape != (B,) or context_lens.dtype.is_floating_point or context_lens.dtype == torch.bool:
        raise ValueError(f"context_lens must be an integer [batch={B}] tensor, got {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}")
    devices = {name: t.device for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool),
                                              ("block_tables", block_tables), ("context_lens", context_lens))}
    if len(set(devices.values())) > 1:
        raise ValueError("q, k_pool, v_pool, block_tables and context_lens must be on the same device, got "
                         + ", ".join(f"{n}: {d}" for n, d in devices.items()))
    if not (q.dtype == k_pool.dtype == v_pool.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q ({q.dtype}) and the pools (k_pool {k_pool.dtype}, v_pool {v_pool.dtype}) must share "
                         "a floating-point dtype")
    if not sync_checks:
        return
    lens = context_lens.tolist()
    cap = block_tables.shape[1] * bs
    for b, n in enumerate(lens):
        if not 0 <= n <= cap:
            raise ValueError(f"context_lens[{b}]={n} is outside [0, max_blocks * block_size = {cap}] "
                             f"(tokens a sequence's table can hold; 0 = empty), got {lens}")
    tables = block_tables.tolist()
    for b, n in enumerate(lens):
        used = tables[b][:blocks_needed(n, bs)]
        if used and (min(used) < 0 or max(used) >= N):
            raise ValueError(f"block_tables[{b}] points outside the pool of {N} blocks: {used}")
