"""Mixture of experts: a router sends each token to k of E expert MLPs, so a layer holds E experts'
parameters but a token pays for k of them.

    TopKRouter(dim, num_experts, k)     logits -> top-k experts per token, softmax over the k selected
    load_balancing_loss(probs, experts) Switch Transformer's auxiliary loss E * sum_i f_i * P_i (1 when even)
    expert_capacity(tokens, E, k, cf)   ceil(cf * tokens * k / E) slots per expert
    dispatch_loop(...)                  the reference: assignments one at a time, first come first served
    dispatch(...)                       batched: sort assignments by expert, one matmul per expert; equal
                                        to the loop, dropped assignments included
    MoEMLP                              router + SwiGLU experts + dispatch, with its aux loss and statistics
    moe_flops_per_token / dense_flops_per_token   compute per token vs a dense MLP of the same parameters
    train_moe_demo                      a small MoE trained on CPU: load per expert over training

Priority under capacity (GShard): every token's first choice is placed before any second choice; within
a choice, tokens in order. An assignment that finds its expert full is dropped: the token gets nothing from
that expert (its other experts, and the residual stream around the layer, still carry it).

Bad input: expert indices that are not integers or not in [0, E), a capacity that is not None or an int
>= 0, and an empty batch for the balancing loss (a mean over no tokens). The index range is read on the
host (one read per call; the dispatch reads its per-expert counts on the host anyway).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.quant.core import check_floating
from course_lib.validate import integer, number


class TopKRouter(nn.Module):
    def __init__(self, dim: int, num_experts: int, k: int = 2):
        super().__init__()
        dim, num_experts = integer(dim, "dim", low=1), integer(num_experts, "num_experts", low=1)
        k = integer(k, "k", low=1)
        if k > num_experts:
            raise ValueError(f"k must be at most num_experts={num_experts}, got {k}")
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.num_experts, self.k = num_experts, k

    def forward(self, x: torch.Tensor):
        """x [N, D] -> weights [N, k] (softmax over the k selected logits), experts [N, k] (best first),
        probs [N, E] (softmax over all experts, what the balancing loss reads)."""
        logits = self.gate(x)                                              # [N, E]
        top, experts = logits.topk(self.k, dim=-1)                         # [N, k]
        return F.softmax(top, dim=-1), experts, F.softmax(logits, dim=-1)


def _check_expert_ids(indices: torch.Tensor, num_experts: int, name: str) -> None:
    """Integer expert numbers in [0, num_experts): the range costs one host read (min and max together)."""
    if not isinstance(indices, torch.Tensor) or indices.is_floating_point() or indices.is_complex() \
            or indices.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of expert numbers, got "
                        f"{getattr(indices, 'dtype', type(indices).__name__)}")
    if indices.numel():
        lo, hi = torch.stack(torch.aminmax(indices)).tolist()
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"{name} must be expert numbers in [0, {num_experts}), got {lo}..{hi}")


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """E * sum_i f_i * P_i: f_i the share of the N*k assignments that went to expert i (not differentiable),
    P_i the mean router probability of expert i (differentiable). Equals 1 for a perfectly even router and
    grows to E when one expert takes everything.

    probs [N, E] with N >= 1 (the loss is a mean over tokens: an empty batch has none), experts: integer
    expert numbers in [0, E), any shape (usually [N, k])."""
    check_floating(probs, "probs")
    if probs.dim() != 2:
        raise ValueError(f"probs must be [tokens, num_experts], got {tuple(probs.shape)}")
    N, E = probs.shape
    if N == 0:
        raise ValueError(f"probs holds no tokens (shape {tuple(probs.shape)}): the loss is a mean over tokens, "
                         f"so an empty batch has none (skip the loss for it)")
    _check_expert_ids(experts, E, "experts")
    if experts.numel() == 0:
        raise ValueError(f"experts holds no assignments (shape {tuple(experts.shape)}): f_i is a share of them")
    f = torch.bincount(experts.reshape(-1), minlength=E).to(probs.dtype) / experts.numel()   # [E]
    return E * (f * probs.mean(0)).sum()


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float | None) -> int:
    """Slots per expert: ceil(capacity_factor * num_tokens * k / num_experts); None = no limit."""
    if capacity_factor is None:
        return num_tokens
    capacity_factor = number(capacity_factor, "capacity_factor", 0, low_open=True)
    return min(num_tokens, math.ceil(capacity_factor * num_tokens * k / num_experts))


def _check_dispatch(x, experts, weights, indices, capacity):
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, dim], got {tuple(x.shape)}")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0):
        raise ValueError(f"capacity must be None or an int >= 0 (assignments each expert keeps), got {capacity!r}")
    if not isinstance(indices, torch.Tensor) or not isinstance(weights, torch.Tensor) \
            or indices.shape != weights.shape or indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices and weights must both be [tokens={x.shape[0]}, k], got "
                         f"{tuple(getattr(indices, 'shape', ()))} and {tuple(getattr(weights, 'shape', ()))}")
    _check_expert_ids(indices, len(experts), "indices")


def dispatch_loop(x: torch.Tensor, experts, weights: torch.Tensor, indices: torch.Tensor,
                  capacity: int | None = None):
    """Reference: y [N, D] = sum over kept assignments of weight * expert(x_token), one at a time.

    Choice 0 of every token first, then choice 1, ...; an expert that already holds `capacity`
    assignments drops the rest. Returns (y, load [E] kept per expert, dropped: number of assignments)."""
    _check_dispatch(x, experts, weights, indices, capacity)
    N, k = indices.shape
    cap = N if capacity is None else capacity
    y = torch.zeros_like(x)
    load = [0] * len(experts)
    dropped = 0
    for j in range(k):
        for t in range(N):
            e = int(indices[t, j])
            if load[e] >= cap:
                dropped += 1
                continue
            load[e] += 1
            y[t] += weights[t, j] * experts[e](x[t:t + 1])[0]
    return y, torch.tensor(load, device=x.device), dropped


def dispatch(x: torch.Tensor, experts, weights: torch.Tensor, indices: torch.Tensor, capacity: int | None = None):
    """Batched dispatch, equal to ``dispatch_loop``: flatten the N*k assignments choice-major, sort them by
    expert (a stable sort keeps the priority order inside each expert), keep the first `capacity` of each
    expert, run each expert once on its tokens, and scatter-add the weighted outputs back.
    Returns (y [N, D], load [E], dropped)."""
    _check_dispatch(x, experts, weights, indices, capacity)
    N, k = indices.shape
    E = len(experts)
    cap = N if capacity is None else capacity
    flat_e = indices.t().reshape(-1)                                       # [k*N] choice-major
    flat_tok = torch.arange(N, device=x.device).repeat(k)                  # [k*N] token of each assignment
    flat_w = weights.t().reshape(-1)                                       # [k*N]
    order = torch.sort(flat_e, stable=True).indices                        # grouped by expert
    sorted_e = flat_e[order]
    counts = torch.bincount(flat_e, minlength=E)                           # [E] assignments per expert
    starts = torch.cumsum(counts, 0) - counts                              # [E] first slot of each expert
    rank = torch.arange(k * N, device=x.device) - starts[sorted_e]         # position within its expert
    keep = rank < cap
    kept_order = order[keep]                                               # still grouped by expert
    kept_counts = torch.clamp(counts, max=cap)                             # [E]
    y = torch.zeros_like(x)
    offset = 0
    for e, c in enumerate(kept_counts.tolist()):                          # one host read of E counts
        if c:
            sel = kept_order[offset:offset + c]                            # [c] assignments of expert e
            tok = flat_tok[sel]
            y.index_add_(0, tok, flat_w[sel, None].to(x.dtype) * experts[e](x[tok]))
        offset += c
    return y, kept_counts, int(k * N - int(kept_counts.sum()))


class Expert(nn.Module):
    """A SwiGLU MLP, the shape of the course model's MLP: D -> F -> D."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEMLP(nn.Module):
    """E SwiGLU experts of hidden size `hidden` behind a top-k router. forward(x [..., D]) -> y [..., D];
    after a call, ``aux_loss`` holds the balancing loss and ``stats`` the load per expert and the drops."""

    def __init__(self, dim: int, hidden: int, num_experts: int = 8, k: int = 2,
                 capacity_factor: float | None = 1.25):
        super().__init__()
        self.router = TopKRouter(dim, num_experts, k)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(num_experts))
        expert_capacity(1, num_experts, k, capacity_factor)                # validates capacity_factor
        self.capacity_factor = capacity_factor
        self.aux_loss = None
        self.stats = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                       # [N, D]
        if x.shape[0] == 0:
            raise ValueError(f"x holds no tokens (shape {tuple(shape)}): the router's balancing loss is a mean "
                             f"over tokens")
        weights, idx, probs = self.router(x)
        cap = expert_capacity(x.shape[0], len(self.experts), self.router.k, self.capacity_factor)
        y, load, dropped = dispatch(x, self.experts, weights, idx, cap)
        self.aux_loss = load_balancing_loss(probs, idx)
        self.stats = {"load": load.detach(), "dropped": dropped, "capacity": cap,
                      "assignments": idx.numel()}
        return y.reshape(shape)


def moe_flops_per_token(dim: int, hidden: int, num_experts: int, k: int) -> int:
    """Router (2*D*E) plus k SwiGLU experts (3 matmuls of 2*D*F each)."""
    return 2 * dim * num_experts + k * 3 * 2 * dim * hidden


def dense_flops_per_token(dim: int, hidden: int) -> int:
    return 3 * 2 * dim * hidden


def moe_params(dim: int, hidden: int, num_experts: int) -> int:
    return dim * num_experts + num_experts * 3 * dim * hidden


def train_moe_demo(steps: int = 200, aux_weight: float = 0.01, dim: int = 32, hidden: int = 32,
                   num_experts: int = 8, k: int = 2, batch: int = 256, capacity_factor: float | None = 1.25,
                   lr: float = 3e-3, seed: int = 0, device=None, progress: bool = False) -> dict:
    """Train a MoEMLP on a synthetic task: inputs from `num_experts` Gaussian clusters, each cluster with
    its own target map (so specialised experts help). Loss = MSE + aux_weight * balancing loss.

    Returns {'loss': [steps], 'aux': [steps], 'load': [steps, E] share of assignments per expert,
    'dropped': [steps] share of assignments dropped}."""
    device = torch.device("cpu") if device is None else torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    centers = torch.randn(num_experts, dim, generator=gen, device="cpu") * 2               # the clusters
    maps = torch.randn(num_experts, dim, dim, generator=gen, device="cpu") / math.sqrt(dim)  # a target map per cluster
    torch.manual_seed(seed)
    moe = MoEMLP(dim, hidden, num_experts, k, capacity_factor).to(device)
    opt = torch.optim.Adam(moe.parameters(), lr=lr)
    hist = {"loss": [], "aux": [], "load": [], "dropped": []}
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="MoE training", mininterval=1)
    for _ in it:
        c = torch.randint(0, num_experts, (batch,), generator=gen, device="cpu")   # data drawn on the host
        x = centers[c] + torch.randn(batch, dim, generator=gen, device="cpu")              # [B, D]
        target = torch.tanh(torch.einsum("bij,bj->bi", maps[c], x))        # [B, D]
        x, target = x.to(device), target.to(device)
        y = moe(x)
        mse = F.mse_loss(y, target)
        loss = mse + aux_weight * moe.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        st = moe.stats
        hist["loss"].append(mse.item())
        hist["aux"].append(moe.aux_loss.item())
        hist["load"].append((st["load"].float() / st["load"].sum().clamp(min=1)).tolist())
        hist["dropped"].append(st["dropped"] / st["assignments"])
    hist["load"] = torch.tensor(hist["load"], device="cpu")
    return hist
