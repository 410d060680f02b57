"""Sparse attention patterns (Longformer: a sliding window plus global tokens; BigBird: plus random
blocks) as boolean [T, T] masks, their cost against dense causal attention, and a wrapper that imposes a
pattern on a trained model at inference.

    sliding_window_mask(T, window)              token i sees i-window+1 .. i
    global_mask(T, n_global)                    everyone sees the first n_global tokens (causal keeps it so)
    random_blocks_mask(T, block, n_random, seed) each query block sees n_random earlier key blocks at random
    bigbird_mask(T, window, n_global, block, n_random, seed)   their union
    pattern_cost(mask, head_dim)                allowed pairs, FLOPs and score memory vs dense causal
    MaskedAttentionModel(model, mask_fn)        model(ids) with attn_mask=mask_fn(T) in every layer

Every mask is causal (nothing from the future) and keeps the diagonal, so no row is empty. The model already
takes a boolean attn_mask ([T, S], True = attend) that replaces its causal rule, so imposing a pattern needs
no change to ``course_lib.attention``: the default path (no mask, SDPA's is_causal) is untouched. A dense mask
through SDPA computes every score and discards the masked ones: it shows the *quality* of a pattern, not
its speed (that takes a kernel that skips the masked blocks, as Longformer's and BigBird's do); the cost
column counts what such a kernel would compute.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from course_lib.validate import integer


def causal(T: int, device=None) -> torch.Tensor:
    T = integer(T, "T", low=1)
    i = torch.arange(T, device=device)
    return i[None, :] <= i[:, None]                                        # [T, T]


def sliding_window_mask(T: int, window: int, device=None) -> torch.Tensor:
    """[T, T]: query i attends keys j with i - window < j <= i (window tokens, itself included)."""
    window = integer(window, "window", low=1)
    i = torch.arange(T, device=device)
    d = i[:, None] - i[None, :]                                            # i - j
    return causal(T, device) & (d < window)


def global_mask(T: int, n_global: int, device=None) -> torch.Tensor:
    """[T, T]: every query sees the first n_global keys (and itself); a global query sees every key before it."""
    n_global = integer(n_global, "n_global", low=0)
    i = torch.arange(T, device=device)
    m = (i[None, :] < n_global) | (i[:, None] < n_global) | (i[:, None] == i[None, :])
    return causal(T, device) & m


def random_blocks_mask(T: int, block: int, n_random: int, seed: int = 0, device=None) -> torch.Tensor:
    """[T, T]: the sequence cut in blocks of `block`; each query block attends `n_random` key blocks drawn
    (without replacement, seeded, on the host) among the blocks up to its own, plus the diagonal."""
    block = integer(block, "block", low=1)
    n_random = integer(n_random, "n_random", low=0)
    nb = -(-T // block)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks = torch.zeros(nb, nb, dtype=torch.bool, device="cpu")
    for qb in range(nb):
        choice = torch.randperm(qb + 1, generator=gen, device="cpu")[:n_random]
        blocks[qb, choice] = True
    m = blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)[:T, :T].to(device)
    return causal(T, device) & (m | torch.eye(T, dtype=torch.bool, device=device))


def bigbird_mask(T: int, window: int, n_global: int, block: int, n_random: int, seed: int = 0,
                 device=None) -> torch.Tensor:
    """Union of a sliding window, global tokens and random blocks (BigBird, causal)."""
    return (sliding_window_mask(T, window, device) | global_mask(T, n_global, device)
            | random_blocks_mask(T, block, n_random, seed, device))


def pattern_cost(mask: torch.Tensor, head_dim: int, bytes_per_score: int = 4) -> dict:
    """What a kernel computing only allowed pairs would do, per head, against dense causal attention:
    pairs, FLOPs (2*Dh for q.k and 2*Dh for p.v per pair), and the bytes of the score matrix."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2 \
            or mask.shape[0] != mask.shape[1]:
        raise ValueError("mask must be a square bool tensor [T, T]")
    T = mask.shape[0]
    pairs = int(mask.sum())
    dense = T * (T + 1) // 2
    return {"pairs": pairs, "dense_pairs": dense, "fraction": pairs / dense, "flops": 4 * head_dim * pairs,
            "dense_flops": 4 * head_dim * dense, "score_bytes": pairs * bytes_per_score,
            "dense_score_bytes": dense * bytes_per_score,
            "max_keys_per_query": int(mask.sum(1).max())}


class MaskedAttentionModel(nn.Module):
    """`model` with a sparse attention pattern imposed in every layer: forward(ids) calls
    model(ids, attn_mask=mask_fn(T, device)). For whole-sequence scoring (no cache)."""

    def __init__(self, model, mask_fn):
        super().__init__()
        if not callable(mask_fn):
            raise TypeError("mask_fn must be callable as mask_fn(T, device) -> bool [T, T]")
        self.model, self.mask_fn = model, mask_fn

    @property
    def config(self):
        return self.model.config

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids: torch.Tensor, **kw):
        if kw.get("cache") is not None:
            raise ValueError("MaskedAttentionModel scores whole sequences: cache must be None")
        T = input_ids.shape[-1]
        return self.model(input_ids, attn_mask=self.mask_fn(T, input_ids.device), **kw)
