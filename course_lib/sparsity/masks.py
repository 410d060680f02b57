"""Weight masks: which linears are pruned, how a mask is held on a model, and what a mask saves in memory.

A mask is a boolean tensor the shape of a weight (True = kept). It is applied as a model transform:
``apply_masks(model, masks)`` registers a ``torch.nn.utils.parametrize`` parametrization, so the layer
computes with ``weight * mask`` and a training step updates the underlying weight while the pruned
entries stay exactly zero in what the layer uses (fine-tuning cannot revive them). ``bake_masks`` removes
the parametrizations and leaves plain, zero-filled weights.

What gets pruned: what every model transform of the course touches, ``course_lib.modules.named_linears``
(re-exported here as ``prunable_linears``): every ``nn.Linear`` but the LM head, which in the Llama models is
the seven projections of every decoder layer (q, k, v, o, gate, up, down). The embedding (tied to the output
head in the bundled model) and the norms are kept: they are a small share of a large model's weights and
pruning them hurts most.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from course_lib.modules import named_linears
from course_lib.validate import probability

prunable_linears = named_linears   # the sparsity face's name for the one walker (its rule: course_lib/modules.py)

# why a mask builder refuses NaN/Inf scores or weights (course_lib.quant.core.check_finite names the tensor)
RANK_WHY = ("NaN has no rank and Inf (an overflow upstream) ties every other Inf, so which weights the mask "
            "keeps would be arbitrary")

class _Mask(nn.Module):
    """The parametrization weight -> weight * mask (the mask a buffer, on the weight's device)."""

    def __init__(self, mask: torch.Tensor):
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, w):
        return w * self.mask.to(w.dtype)


def apply_masks(model, masks: dict[str, torch.Tensor]):
    """Hold `masks` (name -> bool tensor shaped like that linear's weight) on `model`, in place; returns it.

    A linear that already holds a mask gets the product of both (pruning only ever removes more)."""
    linears = named_linears(model)
    for name, mask in masks.items():
        if name not in linears:
            raise ValueError(f"masks: {name!r} is not a prunable linear of the model (names like "
                             f"{next(iter(linears))!r})")
        lin = linears[name]
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != lin.weight.shape:
            raise ValueError(f"masks[{name!r}] must be a bool tensor of shape {tuple(lin.weight.shape)}, got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
        mask = mask.to(lin.weight.device)
        if parametrize.is_parametrized(lin, "weight"):
            old = lin.parametrizations.weight[0]
            old.mask = old.mask & mask
        else:
            parametrize.register_parametrization(lin, "weight", _Mask(mask))
    return model


def current_masks(model) -> dict[str, torch.Tensor]:
    """The masks `apply_masks` holds on `model` (name -> bool tensor); linears without one are left out."""
    return {name: lin.parametrizations.weight[0].mask.clone() for name, lin in named_linears(model).items()
            if parametrize.is_parametrized(lin, "weight")}


def bake_masks(model):
    """Remove the parametrizations, keeping the masked (zero-filled) weights as plain parameters; returns model."""
    for lin in named_linears(model).values():
        if parametrize.is_parametrized(lin, "weight"):
            parametrize.remove_parametrizations(lin, "weight", leave_parametrized=True)
    return model


@torch.no_grad()
def sparsity(model) -> dict:
    """Zeros among the prunable weights: {'overall': fraction, 'per_layer': {name: fraction}, 'zeros', 'total'}.
    Reads the weights the layers compute with (masked, when a mask is held)."""
    per, zeros, total = {}, 0, 0
    for name, lin in named_linears(model).items():
        w = lin.weight
        z = int((w == 0).sum())
        per[name] = z / w.numel()
        zeros += z
        total += w.numel()
    return {"overall": zeros / total, "per_layer": per, "zeros": zeros, "total": total}


# --- memory arithmetic -----------------------------------------------------------------------------------
def dense_bytes(rows: int, cols: int, bytes_per_value: float = 2) -> float:
    return rows * cols * bytes_per_value


def csr_bytes(rows: int, cols: int, density: float, bytes_per_value: float = 2, bytes_per_index: int = 4) -> float:
    """Bytes of a [rows, cols] matrix in CSR: nnz values + nnz column indices + (rows + 1) row pointers."""
    density = probability(density, "density")
    nnz = round(density * rows * cols)
    return nnz * (bytes_per_value + bytes_per_index) + (rows + 1) * bytes_per_index


def csr_break_even_density(bytes_per_value: float = 2, bytes_per_index: int = 4) -> float:
    """Density below which CSR is smaller than dense (ignoring the row pointers): v / (v + i).
    fp16 values with int32 indices: 1/3, so unstructured sparsity must pass ~67% before it saves memory."""
    return bytes_per_value / (bytes_per_value + bytes_per_index)


def semi_structured_bytes(rows: int, cols: int, bytes_per_value: float = 2, n: int = 2, m: int = 4) -> float:
    """Bytes of an n:m (2:4) compressed matrix: the n kept values of every m, and ceil(log2 m) bits of
    metadata per kept value saying where it sat (2 bits each for 2:4: 4 bits per group of four).
    fp16 2:4: 2*2 bytes + 4 bits per 4 weights = 4.5 bytes vs 8 dense, a ratio of 0.5625."""
    if cols % m:
        raise ValueError(f"cols={cols} must be a multiple of m={m}")
    groups = rows * cols // m
    index_bits = max(1, (m - 1).bit_length())
    return groups * (n * bytes_per_value + n * index_bits / 8)
