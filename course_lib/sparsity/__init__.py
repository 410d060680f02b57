"""Pruning, sparsity and mixture of experts (Module 10). Each technique is a model transform.

    masks.py      prunable_linears (= course_lib.modules.named_linears: every linear but the LM head),
                  apply_masks / current_masks / bake_masks (masks held as parametrizations), sparsity,
                  memory arithmetic (dense_bytes, csr_bytes, csr_break_even_density, semi_structured_bytes)
    pruning.py    magnitude_masks (global / per layer), torch_prune_masks (torch.nn.utils.prune, the oracle),
                  magnitude_prune, finetune, iterative_prune
    wanda.py      input_norms, wanda_scores, wanda_mask (unstructured per row, or n:m), wanda_masks
    nm.py         nm_mask, is_nm, semi_structured_speed (2:4 on sparse tensor cores, CUDA only)
    structured.py unit_importance (weight norm, Taylor), make_plan, StructuredPlan, structured_masks, shrink,
                  masked_copy, structured_prune, projection_params
    sweep.py      prune_finetune_sweep, PRUNERS
    moe.py        TopKRouter, load_balancing_loss, expert_capacity, dispatch_loop, dispatch, Expert, MoEMLP,
                  moe_flops_per_token, dense_flops_per_token, moe_params, train_moe_demo
    attention.py  sliding_window_mask, global_mask, random_blocks_mask, bigbird_mask, pattern_cost,
                  MaskedAttentionModel
"""
from .attention import (MaskedAttentionModel, bigbird_mask, global_mask, pattern_cost, random_blocks_mask,
                        sliding_window_mask)
from .masks import (apply_masks, bake_masks, csr_break_even_density, csr_bytes, current_masks, dense_bytes,
                    prunable_linears, semi_structured_bytes, sparsity)
from .moe import (Expert, MoEMLP, TopKRouter, dense_flops_per_token, dispatch, dispatch_loop, expert_capacity,
                  load_balancing_loss, moe_flops_per_token, moe_params, train_moe_demo)
from .nm import is_nm, nm_mask, semi_structured_speed
from .pruning import finetune, iterative_prune, magnitude_masks, magnitude_prune, torch_prune_masks
from .structured import (StructuredPlan, make_plan, masked_copy, projection_params, shrink, structured_masks,
                         structured_prune, unit_importance)
from .sweep import PRUNERS, prune_finetune_sweep
from .wanda import input_norms, wanda_mask, wanda_masks, wanda_scores

__all__ = ["prunable_linears", "apply_masks", "current_masks", "bake_masks", "sparsity", "dense_bytes",
           "csr_bytes", "csr_break_even_density", "semi_structured_bytes",
           "magnitude_masks", "torch_prune_masks", "magnitude_prune", "finetune", "iterative_prune",
           "input_norms", "wanda_scores", "wanda_mask", "wanda_masks",
           "nm_mask", "is_nm", "semi_structured_speed",
           "StructuredPlan", "unit_importance", "make_plan", "structured_masks", "shrink", "masked_copy",
           "structured_prune", "projection_params", "PRUNERS", "prune_finetune_sweep",
           "TopKRouter", "load_balancing_loss", "expert_capacity", "dispatch_loop", "dispatch", "Expert", "MoEMLP",
           "moe_flops_per_token", "dense_flops_per_token", "moe_params", "train_moe_demo",
           "sliding_window_mask", "global_mask", "random_blocks_mask", "bigbird_mask", "pattern_cost",
           "MaskedAttentionModel"]
