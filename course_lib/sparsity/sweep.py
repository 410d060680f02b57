"""Prune -> fine-tune on a trained model: held-out bits per byte against sparsity, for each method.

    PRUNERS                  name -> prune(model, sparsity, calib) for "magnitude", "wanda", "structured"
    prune_finetune_sweep     every (method, sparsity): prune a copy of the model, score it, fine-tune it
                             (iteratively, in `rounds`), score it again
"""
from __future__ import annotations

import copy

import torch

from course_lib.perf.quality import bits_per_byte

from .masks import apply_masks, bake_masks, sparsity as measured_sparsity
from .pruning import finetune, magnitude_masks
from .structured import projection_params, structured_prune
from .wanda import wanda_masks


def _magnitude(model, s, calib):
    return apply_masks(model, magnitude_masks(model, s, "global"))


def _wanda(model, s, calib):
    return apply_masks(model, wanda_masks(model, calib[:, :-1], sparsity=s))


def _structured(model, s, calib):
    # s is the share of the *original* heads and neurons to remove; a round on an already smaller model
    # removes what is left to reach it.
    base = model._sweep_base_params if hasattr(model, "_sweep_base_params") else projection_params(model.config)
    now = projection_params(model.config) / base                           # share left
    s_here = max(0.0, 1 - (1 - s) / now) if now > 0 else 0.0
    small = structured_prune(model, min(s_here, 0.999), method="taylor", ids=calib) if s_here > 0 else model
    small._sweep_base_params = base
    return small


PRUNERS = {"magnitude": _magnitude, "wanda": _wanda, "structured": _structured}


def removed_share(model, dense_params: int) -> float:
    """Share of the dense model's projection weights that are gone (zeros held, or removed outright)."""
    left = projection_params(model.config) * (1 - measured_sparsity(model)["overall"])
    return 1 - left / dense_params


def prune_finetune_sweep(model, tokenizer, heldout: list[str], stream: torch.Tensor, calib: torch.Tensor,
                         sparsities=(0.3, 0.6), methods=("magnitude", "wanda", "structured"), steps: int = 10,
                         rounds: int = 1, batch_size: int = 8, seq_len: int = 64, lr: float = 1e-3,
                         progress: bool = True) -> list[dict]:
    """Rows {'method', 'target', 'removed', 'params', 'bpb_pruned', 'bpb_finetuned', 'seconds'}.

    Each run starts from a copy of `model`: `rounds` times, prune to target * r / rounds and fine-tune
    `steps` steps (cross entropy on windows of `stream`, masks held so pruned weights stay zero);
    'bpb_pruned' is after the first pruning without fine-tuning, of the one-shot model at the target.
    calib: [N, T+1] token windows for Wanda's activation norms and the structured Taylor scores."""
    import time
    for m in methods:
        if m not in PRUNERS:
            raise ValueError(f"methods: {m!r} is not one of {list(PRUNERS)}")
    dense = projection_params(model.config)
    rows = []
    jobs = [(m, s) for m in methods for s in sparsities]
    it = jobs
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(jobs, desc="prune -> fine-tune", unit="run")
    for method, s in it:
        t0 = time.perf_counter()
        one_shot = PRUNERS[method](copy.deepcopy(model), s, calib)
        bpb_pruned = bits_per_byte(one_shot, tokenizer, heldout, progress=False)
        if rounds == 1:
            pruned = one_shot
        else:
            pruned = copy.deepcopy(model)
        for r in range(1, rounds + 1):
            if rounds > 1:
                pruned = PRUNERS[method](pruned, s * r / rounds, calib)
            if steps:
                pruned, _ = finetune(pruned, stream, steps, batch_size=batch_size, seq_len=seq_len, lr=lr, seed=r)
        bake_masks(pruned)
        rows.append({"method": method, "target": s, "removed": removed_share(pruned, dense),
                     "params": pruned.num_parameters(), "bpb_pruned": bpb_pruned,
                     "bpb_finetuned": bits_per_byte(pruned, tokenizer, heldout, progress=False),
                     "seconds": time.perf_counter() - t0})
    return rows
