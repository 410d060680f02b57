"""A latent (MLA-style) cache: store a low-dimensional projection of each token's keys and values.

Multi-head latent attention (DeepSeek-V2/V3) caches, per token and layer, one latent vector c = W_down x
of a few hundred numbers instead of K and V for every head, and rebuilds K and V with an up-projection.
DeepSeek *trains* W_down and W_up with the model and folds W_up into the query and output projections, so
attention runs in latent space and nothing is rebuilt; RoPE cannot be folded that way, so MLA carries
one small extra "decoupled" RoPE key per token.

Here the model was trained without a latent, so we fit one afterwards: the best rank-r linear
compression of a token's [k; v] (all KV heads, keys **before** RoPE) is principal component analysis on
calibration text. The cache undoes RoPE on arrival (it knows the positions: the model's default
``positions`` continue from ``get_seq_length()``), stores c = (x - mean) @ U with U the top-r principal
directions, and on every update rebuilds x = mean + c @ U^T and re-applies RoPE. With r = 2 x K x Dh
nothing is lost (a test checks it); smaller r trades quality for memory, r / (2 K Dh) of the plain cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ContiguousCache, KVCache, check_kv
from .window import rotate_keys


@dataclass
class LatentProjection:
    """One layer's compression: x [.., 2*K*Dh] -> c = (x - mean) @ basis [.., r] -> mean + c @ basis^T."""
    mean: torch.Tensor    # [2*K*Dh]
    basis: torch.Tensor   # [2*K*Dh, r], orthonormal columns
    kv_heads: int
    head_dim: int

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def truncate(self, rank: int) -> "LatentProjection":
        if not 1 <= rank <= self.basis.shape[1]:
            raise ValueError(f"rank must be in [1, {self.basis.shape[1]}], got {rank!r}")
        return LatentProjection(self.mean, self.basis[:, :rank], self.kv_heads, self.head_dim)


@torch.no_grad()
def fit_latent(model, token_batches, rank: int | None = None) -> list[LatentProjection]:
    """PCA of each layer's [k (before RoPE); v] over calibration tokens.

    token_batches: iterable of integer tensors [B, T] (or [T]), each run from position 0.
    rank: components kept (default: all 2*K*Dh; truncate later with ``LatentProjection.truncate``).
    """
    cfg = model.config
    K, Dh, L = cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    xs = [[] for _ in range(L)]
    for ids in token_batches:
        ids = ids[None] if ids.dim() == 1 else ids
        ids = ids.to(model.device)
        cache = ContiguousCache()
        model(ids, cache=cache)
        n = ids.shape[1]
        pos = torch.arange(n, device=ids.device)
        for layer in range(L):
            k = rotate_keys(cache.k[layer], -pos, cfg.rope_theta)              # undo RoPE: [B, K, n, Dh]
            x = torch.cat([k.transpose(1, 2).reshape(-1, K * Dh),
                           cache.v[layer].transpose(1, 2).reshape(-1, K * Dh)], dim=1)  # [B*n, 2*K*Dh]
            xs[layer].append(x.float())
    if not xs[0]:
        raise ValueError("token_batches is empty: fit_latent needs calibration tokens")
    out = []
    for layer in range(L):
        x = torch.cat(xs[layer])
        mean = x.mean(0)
        cov = (x - mean).T @ (x - mean) / max(len(x) - 1, 1)
        evals, evecs = torch.linalg.eigh(cov)              # ascending
        basis = evecs.flip(-1)                             # largest variance first
        proj = LatentProjection(mean.to(model.dtype), basis.to(model.dtype), K, Dh)
        out.append(proj.truncate(rank) if rank else proj)
    return out


class LatentCache(KVCache):
    """Stores c = (x - mean) @ U per token and layer ([B, S, r]); rebuilds K (re-rotated) and V on update."""

    def __init__(self, projections: list[LatentProjection], rope_theta: float = 10000.0, rank: int | None = None):
        if not projections:
            raise ValueError("projections must be a non-empty list (one per layer), see fit_latent")
        self.proj = [p.truncate(rank) if rank else p for p in projections]
        self.theta = float(rope_theta)
        self.c: list[torch.Tensor] = []   # per layer [B, S, r]

    def get_seq_length(self) -> int:
        return self.c[0].shape[1] if self.c else 0

    def stored_length(self, layer: int = 0) -> int:
        return self.c[layer].shape[1] if layer < len(self.c) else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.c)

    def update(self, k, v, layer, q=None):
        check_kv(k, v, layer)
        if layer >= len(self.proj):
            raise ValueError(f"update: no projection for layer {layer} ({len(self.proj)} fitted)")
        p = self.proj[layer]
        B, K, T, Dh = k.shape
        if (K, Dh) != (p.kv_heads, p.head_dim):
            raise ValueError(f"update: projection fitted for kv_heads={p.kv_heads}, head_dim={p.head_dim}, "
                             f"got k of shape {tuple(k.shape)}")
        start = self.stored_length(layer)
        pos_new = torch.arange(start, start + T, device=k.device)
        k0 = rotate_keys(k, -pos_new, self.theta)                                    # before RoPE
        x = torch.cat([k0.transpose(1, 2).reshape(B, T, K * Dh), v.transpose(1, 2).reshape(B, T, K * Dh)], -1)
        c = (x - p.mean.to(x)) @ p.basis.to(x)                                       # [B, T, r]
        if layer == len(self.c):
            self.c.append(c)
        elif layer < len(self.c):
            self.c[layer] = torch.cat([self.c[layer], c], dim=1)
        else:
            raise ValueError(f"update: layers must be filled in order; got layer {layer}")
        return self.kv(layer)

    def kv(self, layer: int):
        """Rebuild a layer's keys (re-rotated at positions 0..S-1) and values from the stored latents."""
        p, c = self.proj[layer], self.c[layer]
        B, S, _ = c.shape
        K, Dh = p.kv_heads, p.head_dim
        xr = p.mean.to(c) + c @ p.basis.to(c).T                                      # [B, S, 2*K*Dh]
        k_all = xr[..., :K * Dh].reshape(B, S, K, Dh).transpose(1, 2)
        v_all = xr[..., K * Dh:].reshape(B, S, K, Dh).transpose(1, 2)
        k_all = rotate_keys(k_all, torch.arange(S, device=c.device), self.theta)
        return k_all.contiguous(), v_all.contiguous()

    def reset(self):
        self.c = []
