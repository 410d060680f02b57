"""Layer-wise mixed precision: a sensitivity scan, then a bit allocation under a memory budget (module 03).

1. Scan: quantize one group of weights at a time (one linear, or all linears of one decoder layer) at each
   candidate bit width, measure the held-out loss, restore the weights. ``delta[group][bits]`` is the
   loss increase over the float model.
2. Allocate: choose bits b_g per group to minimize sum_g delta[g][b_g] subject to
   sum_g size_g * b_g / 8 <= budget (bytes). Summing the deltas assumes the groups' errors add up
   independently, which holds to first order for small perturbations (and is what HAWQ-style methods and
   llama.cpp's per-tensor mixes assume); the notebook checks it by evaluating the chosen mix.
   The problem is a multiple-choice knapsack: ``method="exact"`` solves it by dynamic programming over the
   Pareto frontier of (bytes, loss) of partial allocations (exact for any real costs; the frontier stays
   small for tens of groups), ``method="greedy"`` starts at the widest bits and repeatedly narrows the group
   that costs the least loss per byte saved.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from course_lib.modules import DEFAULT_SKIP, layer_index, named_linears

__all__ = ["layer_groups", "sensitivity_scan", "allocate_bits", "allocation_cost", "brute_force_allocation"]


def layer_groups(model: nn.Module, by: str = "layer", skip=DEFAULT_SKIP) -> dict[str, list[str]]:
    """Groups of the names ``course_lib.modules.named_linears(model, skip)`` gives: ``by="layer"`` ->
    {"layers.0": [its 7 linears], ...} (a linear in no decoder layer is its own group); ``by="linear"`` ->
    one group per linear."""
    if by not in ("layer", "linear"):
        raise ValueError(f"by must be 'layer' or 'linear', got {by!r}")
    names = list(named_linears(model, skip))
    if by == "linear":
        return {n: [n] for n in names}
    groups = defaultdict(list)
    for n in names:
        i = layer_index(n)
        groups[n if i is None else f"layers.{i}"].append(n)
    return dict(groups)


@torch.no_grad()
def sensitivity_scan(model: nn.Module, evaluate, groups: dict[str, list[str]], quantize_weight,
                     bits=(8, 4, 3), progress: bool = True) -> dict:
    """{"base": loss, "delta": {group: {bits: loss - base}}, "size": {group: weights}}.

    ``evaluate(model) -> float`` (a held-out loss); ``quantize_weight(w, bits) -> w_hat`` (same shape).
    Weights are restored after every trial (the model leaves as it came)."""
    if not groups:
        raise ValueError("groups is empty")
    base = float(evaluate(model))
    delta, size = {}, {}
    trials = [(g, b) for g in groups for b in bits]
    it = trials
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(trials, desc="sensitivity", unit="trial")
    for g, b in it:
        mods = [model.get_submodule(n) for n in groups[g]]
        saved = [m.weight.detach().clone() for m in mods]
        try:
            for m in mods:
                m.weight.copy_(quantize_weight(m.weight.detach(), b))
            delta.setdefault(g, {})[b] = float(evaluate(model)) - base
        finally:
            for m, w in zip(mods, saved):
                m.weight.copy_(w)
        size[g] = sum(w.numel() for w in saved)
    return {"base": base, "delta": delta, "size": size}


def _check(delta, size, budget):
    if set(delta) != set(size):
        raise ValueError("delta and size must have the same groups")
    for g, d in delta.items():
        if not d:
            raise ValueError(f"group {g!r} has no bit choices")
    if budget <= 0:
        raise ValueError(f"budget must be > 0 bytes, got {budget}")


def allocation_cost(alloc: dict, delta: dict, size: dict) -> tuple[float, float]:
    """(bytes, predicted loss increase) of an allocation {group: bits}."""
    return (sum(size[g] * b / 8 for g, b in alloc.items()), sum(delta[g][b] for g, b in alloc.items()))


def allocate_bits(delta: dict, size: dict, budget: float, method: str = "exact") -> dict:
    """{group: bits} minimizing the summed loss increase with total bytes <= ``budget``.

    ``delta`` {group: {bits: loss increase}}, ``size`` {group: number of weights}. Raises ValueError when
    even the narrowest choice of every group exceeds the budget."""
    _check(delta, size, budget)
    groups = list(delta)
    floor = sum(size[g] * min(delta[g]) / 8 for g in groups)
    if floor > budget + 1e-9:
        raise ValueError(f"budget {budget:,.0f} B is below the smallest allocation ({floor:,.0f} B)")
    if method == "exact":
        frontier = [(0.0, 0.0, ())]                       # (bytes, loss, choices), Pareto-optimal
        for g in groups:
            cand = [(c + size[g] * b / 8, l + delta[g][b], ch + (b,)) for c, l, ch in frontier for b in delta[g]]
            cand = [x for x in cand if x[0] <= budget + 1e-9]
            cand.sort(key=lambda x: (x[0], x[1]))
            frontier, best = [], float("inf")
            for x in cand:                                # keep only entries that lower the loss
                if x[1] < best - 1e-15:
                    frontier.append(x)
                    best = x[1]
        _, _, choice = min(frontier, key=lambda x: (x[1], x[0]))
        return dict(zip(groups, choice))
    if method == "greedy":
        alloc = {g: max(delta[g]) for g in groups}
        while allocation_cost(alloc, delta, size)[0] > budget + 1e-9:
            best = None
            for g in groups:
                lower = [b for b in delta[g] if b < alloc[g]]
                if not lower:
                    continue
                b = max(lower)                            # the next narrower width
                saved = size[g] * (alloc[g] - b) / 8
                price = (delta[g][b] - delta[g][alloc[g]]) / saved
                if best is None or price < best[0]:
                    best = (price, g, b)
            alloc[best[1]] = best[2]
        return alloc
    raise ValueError(f"method must be 'exact' or 'greedy', got {method!r}")


def brute_force_allocation(delta: dict, size: dict, budget: float) -> dict:
    """Every combination (for tests and tiny problems): the optimum ``allocate_bits`` must reach."""
    import itertools
    _check(delta, size, budget)
    groups = list(delta)
    best = None
    for choice in itertools.product(*(sorted(delta[g]) for g in groups)):
        alloc = dict(zip(groups, choice))
        c, l = allocation_cost(alloc, delta, size)
        if c <= budget + 1e-9 and (best is None or l < best[0]):
            best = (l, alloc)
    if best is None:
        raise ValueError("no allocation fits the budget")
    return best[1]
