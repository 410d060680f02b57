"""Tensor-parallel layers (Megatron-LM's split), for inference, written with plain ``torch.distributed``.

Shapes: B batch, T tokens, D hidden, F MLP hidden, H query heads, K KV heads, Dh head dim, p world size,
r this rank. A linear layer ``y = x W^T + b`` with ``W`` [out, in] splits two ways:

* column-parallel: rank r holds rows ``W[r*out/p:(r+1)*out/p]`` (a slice of the *outputs*) and that slice
  of the bias; it computes its slice of y from the whole x. No communication.
* row-parallel: rank r holds columns ``W[:, r*in/p:(r+1)*in/p]`` (a slice of the *inputs*); given its
  slice of x it computes a partial sum of y. ``all_reduce`` (sum) gives every rank the whole y; the bias
  is added once, after the sum (added on every rank before it, it would count p times).

A column-parallel layer followed by a row-parallel one needs a single all-reduce: the MLP
(gate/up column, down row) and attention (Q/K/V column by heads, O row) each cost one all-reduce of
[B, T, D] per layer. Attention shards by whole heads: rank r gets query heads r*H/p.. and KV heads
r*K/p..; with grouped-query attention the query heads of a group stay with their KV head, so p must
divide K (else the KV heads would have to be replicated; ``shard_model`` refuses instead).

Everything here is for inference (``torch.no_grad``): the all-reduce in ``forward`` has no backward.
``group=None`` is the default process group; with ``world_size == 1`` nothing is communicated.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.attention import attention
from course_lib.attention.rope import apply_rope
from course_lib.validate import integer


def shard_range(n: int, rank: int, world_size: int, what: str = "size") -> slice:
    """The slice of ``n`` items that rank ``rank`` holds (equal shards; ``world_size`` must divide ``n``)."""
    world_size = integer(world_size, "world_size", low=1)
    rank = integer(rank, "rank", 0, world_size - 1)
    if n % world_size:
        raise ValueError(f"world_size={world_size} must divide {what}={n} to shard it evenly")
    s = n // world_size
    return slice(rank * s, (rank + 1) * s)


def all_reduce_sum(x: torch.Tensor, world_size: int, group=None) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place; a no-op for one rank."""
    if world_size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    return x


class ColumnParallelLinear(nn.Module):
    """Rank r's slice of the outputs: ``weight`` [out/p, in], ``bias`` [out/p]. ``forward(x [.., in])``
    -> [.., out/p] (its slice of y; ``gather_output=True`` all-gathers the whole y [.., out])."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, world_size: int,
                 gather_output: bool = False, group=None):
        super().__init__()
        world_size = integer(world_size, "world_size", low=1)
        rank = integer(rank, "rank", 0, world_size - 1)
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.rank, self.world_size, self.gather_output, self.group = rank, world_size, gather_output, group

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int, **kw) -> "ColumnParallelLinear":
        rows = shard_range(linear.out_features, rank, world_size, "out_features")
        bias = None if linear.bias is None else linear.bias[rows]
        return cls(linear.weight[rows], bias, rank, world_size, **kw)

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)                    # [.., out/p]
        if self.gather_output and self.world_size > 1:
            parts = [torch.empty_like(y) for _ in range(self.world_size)]
            dist.all_gather(parts, y.contiguous(), group=self.group)
            y = torch.cat(parts, dim=-1)                           # [.., out]
        return y


class RowParallelLinear(nn.Module):
    """Rank r's slice of the inputs: ``weight`` [out, in/p], ``bias`` [out] (whole, added once).
    ``forward(x [.., in/p])`` -> [.., out], the same on every rank (one all-reduce)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rank: int, world_size: int, group=None):
        super().__init__()
        world_size = integer(world_size, "world_size", low=1)
        rank = integer(rank, "rank", 0, world_size - 1)
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.rank, self.world_size, self.group = rank, world_size, group

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world_size: int, **kw) -> "RowParallelLinear":
        cols = shard_range(linear.in_features, rank, world_size, "in_features")
        return cls(linear.weight[:, cols], linear.bias, rank, world_size, **kw)

    def forward(self, x):
        y = F.linear(x, self.weight)                               # [.., out] partial sum over this rank's inputs
        y = all_reduce_sum(y, self.world_size, self.group)         # [.., out] the whole sum, on every rank
        if self.bias is not None:
            y = y + self.bias                                      # once, after the sum
        return y


def shard_fused_qkv(weight: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, rank: int,
                    world_size: int) -> torch.Tensor:
    """Rank r's rows of a fused QKV projection ``weight`` [(H + 2K) * Dh, D] (Q rows, then K, then V):
    [(H + 2K) / p * Dh, D] = [its Q heads; its K heads; its V heads].

    Split into Q, K and V *before* sharding: a plain ``chunk(p)`` of the fused rows would give rank 0 all
    the Q heads and rank p-1 the V heads."""
    H, K, Dh = num_heads, num_kv_heads, head_dim
    if weight.dim() != 2 or weight.shape[0] != (H + 2 * K) * Dh:
        raise ValueError(f"weight must be [(num_heads + 2*num_kv_heads) * head_dim, D] = [{(H + 2 * K) * Dh}, D], "
                         f"got {tuple(weight.shape)}")
    q, k, v = weight.split([H * Dh, K * Dh, K * Dh], dim=0)
    qh, kh = shard_range(H, rank, world_size, "num_heads"), shard_range(K, rank, world_size, "num_kv_heads")
    q = q.view(H, Dh, -1)[qh].reshape(-1, weight.shape[1])
    k = k.view(K, Dh, -1)[kh].reshape(-1, weight.shape[1])
    v = v.view(K, Dh, -1)[kh].reshape(-1, weight.shape[1])
    return torch.cat([q, k, v], dim=0)


class ShardedAttention(nn.Module):
    """Rank r's heads of a ``course_lib.models.llama.Attention``: one fused column-parallel QKV
    projection (its H/p query heads and K/p KV heads), attention over those heads (through the model's
    cache contract: the cache on this rank holds [B, K/p, S, Dh]), and a row-parallel O projection (one
    all-reduce). Same call as the model's: ``forward(x, cos, sin, cache=None, attn_mask=None)``."""

    def __init__(self, attn: nn.Module, rank: int, world_size: int, group=None):
        super().__init__()
        cfg = attn.cfg
        H, K, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        for n, what in ((H, "num_attention_heads"), (K, "num_key_value_heads")):
            if n % world_size:
                raise ValueError(f"world_size={world_size} must divide {what}={n}: attention is sharded by "
                                 f"whole heads (GQA: each rank needs the KV heads of its query heads)")
        self.layer_idx = attn.layer_idx
        self.heads, self.kv_heads, self.head_dim = H // world_size, K // world_size, Dh   # local
        fused = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], dim=0)  # [(H+2K)Dh, D]
        biases = [m.bias for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        bias = None
        if any(b is not None for b in biases):
            fb = torch.cat([b if b is not None else torch.zeros(m.out_features, device=fused.device, dtype=fused.dtype)
                            for b, m in zip(biases, (attn.q_proj, attn.k_proj, attn.v_proj))])
            bias = shard_fused_qkv(fb[:, None], H, K, Dh, rank, world_size)[:, 0]
        self.qkv_proj = ColumnParallelLinear(shard_fused_qkv(fused, H, K, Dh, rank, world_size), bias,
                                             rank, world_size, group=group)
        self.o_proj = RowParallelLinear.from_linear(attn.o_proj, rank, world_size, group=group)

    def forward(self, x, cos, sin, cache=None, attn_mask=None):
        B, T, _ = x.shape
        h, k_h, Dh = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([h * Dh, k_h * Dh, k_h * Dh], dim=-1)   # this rank's heads
        q = q.view(B, T, h, Dh).transpose(1, 2)                     # [B, H/p, T, Dh]
        k = k.view(B, T, k_h, Dh).transpose(1, 2)                   # [B, K/p, T, Dh]
        v = v.view(B, T, k_h, Dh).transpose(1, 2)                   # [B, K/p, T, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            out = attention(q, k, v, attn_mask)                     # [B, H/p, T, Dh]
        else:
            out = cache.attend(q, k, v, self.layer_idx, attn_mask)  # this rank's cache: its KV heads only
        return self.o_proj(out.transpose(1, 2).reshape(B, T, h * Dh))  # [B, T, D] after the all-reduce


class ShardedMLP(nn.Module):
    """Rank r's F/p columns of the SwiGLU MLP: gate and up column-parallel, down row-parallel: one
    all-reduce. ``forward(x [B, T, D]) -> [B, T, D]``."""

    def __init__(self, mlp: nn.Module, rank: int, world_size: int, group=None):
        super().__init__()
        self.gate_proj = ColumnParallelLinear.from_linear(mlp.gate_proj, rank, world_size, group=group)
        self.up_proj = ColumnParallelLinear.from_linear(mlp.up_proj, rank, world_size, group=group)
        self.down_proj = RowParallelLinear.from_linear(mlp.down_proj, rank, world_size, group=group)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))   # [B, T, F/p] -> [B, T, D]


def parallel_mlp_reference(x, w1, b1, w2, b2, rank: int, world_size: int, group=None):
    """The two-layer MLP ``relu(x w1^T + b1) w2^T + b2`` split column/row over the group: rank r uses
    rows r of w1 (and b1), columns r of w2, one all-reduce, b2 added once. (Lab 11's exercise; the
    reference its checks compare with.) x [.., D], w1 [F, D], b1 [F], w2 [D, F], b2 [D] (whole)."""
    f = shard_range(w1.shape[0], rank, world_size, "w1.shape[0]")
    h = F.relu(F.linear(x, w1[f], b1[f]))                          # [.., F/p]
    y = F.linear(h, w2[:, f])                                      # [.., D] partial
    y = all_reduce_sum(y, world_size, group)
    return y + b2
