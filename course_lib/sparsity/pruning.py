"""Unstructured magnitude pruning, and the prune -> fine-tune loop every pruning method shares.

    magnitude_masks(model, sparsity, scope="global"|"layer")   zero the smallest |w|: over all prunable
                                                               weights at once, or the same share per linear
    torch_prune_masks(model, sparsity, scope)                  the same through torch.nn.utils.prune (the oracle)
    finetune(model, stream, steps, ...)                        a few steps of cross entropy with the masks held
                                                               (course_lib.distill.distill, mode="scratch")
    iterative_prune(model, prune_fn, target, rounds, ...)      prune a little, fine-tune, repeat

``torch.nn.utils.prune`` counts the weights to remove as ``round(amount * n)`` and removes the smallest by
``topk(|w|, largest=False)``; ``magnitude_masks`` does the same, so both give the same masks.
"""
from __future__ import annotations

import torch

from course_lib.distill.train import distill
from course_lib.modules import named_linears
from course_lib.quant.core import check_finite
from course_lib.validate import integer, probability

from .masks import RANK_WHY, apply_masks


@torch.no_grad()
def _smallest_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Bool mask shaped like `scores`, False at the round(sparsity * n) smallest entries."""
    k = round(sparsity * scores.numel())
    keep = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    if k:
        keep[torch.topk(scores.reshape(-1), k, largest=False).indices] = False
    return keep.reshape(scores.shape)


@torch.no_grad()
def magnitude_masks(model, sparsity: float, scope: str = "global") -> dict[str, torch.Tensor]:
    """name -> bool mask removing the smallest-magnitude weights of the prunable linears.

    scope="global": one threshold over all of them (layers with small weights lose more);
    scope="layer": the same `sparsity` in every linear. The weights read are the ones the layers compute
    with, so on a model that already holds masks the pruned zeros are the first to go (pruning is cumulative).
    A weight with NaN/Inf is refused, naming its linear."""
    sparsity = probability(sparsity, "sparsity", one=False)
    if scope not in ("global", "layer"):
        raise ValueError(f"scope must be 'global' or 'layer', got {scope!r}")
    linears = named_linears(model)
    for name, lin in linears.items():
        check_finite(lin.weight, f"{name}.weight", why=RANK_WHY)
    if scope == "layer":
        return {name: _smallest_mask(lin.weight.abs(), sparsity) for name, lin in linears.items()}
    flat = torch.cat([lin.weight.abs().reshape(-1) for lin in linears.values()])    # [all prunable weights]
    keep = _smallest_mask(flat, sparsity)
    out, start = {}, 0
    for name, lin in linears.items():
        n = lin.weight.numel()
        out[name] = keep[start:start + n].reshape(lin.weight.shape)
        start += n
    return out


def torch_prune_masks(model, sparsity: float, scope: str = "global") -> dict[str, torch.Tensor]:
    """The library route: ``torch.nn.utils.prune`` (l1_unstructured per linear, or global_unstructured with
    L1Unstructured) on a copy of `model`'s prunable linears; returns their masks (the model is untouched)."""
    import copy

    import torch.nn.utils.prune as prune
    sparsity = probability(sparsity, "sparsity", one=False)
    if scope not in ("global", "layer"):
        raise ValueError(f"scope must be 'global' or 'layer', got {scope!r}")
    linears = {n: copy.deepcopy(m) for n, m in named_linears(model).items()}
    if scope == "layer":
        for lin in linears.values():
            prune.l1_unstructured(lin, name="weight", amount=sparsity)   # the module first, then the name
    else:
        prune.global_unstructured([(lin, "weight") for lin in linears.values()],
                                  pruning_method=prune.L1Unstructured, amount=sparsity)
    return {n: lin.weight_mask.bool() for n, lin in linears.items()}


def magnitude_prune(model, sparsity: float, scope: str = "global"):
    """Hold magnitude masks on `model` (in place, see ``masks.apply_masks``); returns the model."""
    return apply_masks(model, magnitude_masks(model, sparsity, scope))


def finetune(model, stream: torch.Tensor, steps: int, batch_size: int = 8, seq_len: int = 64, lr: float = 1e-3,
             seed: int = 0, progress: bool = False):
    """Fine-tune `model` in place with cross entropy on windows of the token `stream`; returns (model, history).

    This is ``course_lib.distill.distill(mode="scratch")`` (the models' optimizer, warm-up and cosine
    schedule): masks held by ``apply_masks`` stay applied, so pruned weights stay zero."""
    return distill(model, model, steps=steps, batch_size=batch_size, seq_len=seq_len, mode="scratch", lr=lr,
                   stream=stream, seed=seed, progress=progress, warmup=max(1, steps // 10))


def iterative_prune(model, prune_fn, target: float, rounds: int, stream: torch.Tensor | None = None,
                    steps_per_round: int = 0, progress: bool = False, **finetune_kw):
    """Reach `target` sparsity in `rounds` equal steps, fine-tuning `steps_per_round` steps after each.

    prune_fn(model, sparsity) -> model: prunes to `sparsity` overall (masks it holds, or a new smaller
    model); called with target * r / rounds for r = 1..rounds. Returns (model, losses per round)."""
    target = probability(target, "target", one=False)
    rounds = integer(rounds, "rounds", low=1)
    if steps_per_round and stream is None:
        raise ValueError("stream (the training tokens) is needed to fine-tune between rounds")
    losses = []
    for r in range(1, rounds + 1):
        model = prune_fn(model, target * r / rounds)
        if steps_per_round:
            model, hist = finetune(model, stream, steps_per_round, progress=progress, **finetune_kw)
            losses.append(hist["loss"])
    return model, losses
