"""Calibration: what the linear layers of a model see on real inputs, and where a per-channel scale can be
folded into the operation before a linear (SmoothQuant and AWQ both need it).

All functions take any ``nn.Module`` and a list of input batches (``[B, T]`` token ids for a language model);
they use forward hooks and never import a model class. ``scaling_groups`` knows the Llama decoder layout by
attribute names (``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``,
``mlp.{gate,up,down}_proj``), the names of the course model and of Hugging Face's Llama.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from course_lib.modules import named_linears

__all__ = ["capture_inputs", "input_hessians", "activation_absmax", "outlier_report",
           "ScalingGroup", "scaling_groups", "fold_scales", "run_batches"]


def _check_batches(batches):
    if isinstance(batches, torch.Tensor):
        batches = [batches]
    if not batches:
        raise ValueError("batches must be a non-empty list of input tensors (e.g. token ids [B, T])")
    return list(batches)


@torch.no_grad()
def run_batches(model, batches):
    for b in _check_batches(batches):
        model(b)


@torch.no_grad()
def capture_inputs(model: nn.Module, batches, names, max_rows: int | None = None) -> dict[str, torch.Tensor]:
    """The inputs each named submodule receives over all batches, flattened to [n_tokens, in_features]."""
    mods = dict(model.named_modules())
    missing = [n for n in names if n not in mods]
    if missing:
        raise ValueError(f"names not found in the model: {missing}")
    got = {n: [] for n in names}
    hooks = [mods[n].register_forward_pre_hook(lambda m, args, n=n: got[n].append(
        args[0].detach().reshape(-1, args[0].shape[-1]).float())) for n in names]
    try:
        run_batches(model, batches)
    finally:
        for h in hooks:
            h.remove()
    out = {n: torch.cat(v) for n, v in got.items()}
    return {n: v[:max_rows] for n, v in out.items()} if max_rows else out


@torch.no_grad()
def input_hessians(model: nn.Module, batches, names) -> dict[str, tuple[torch.Tensor, int]]:
    """H = 2/n * X^T X (in x in, float32) of each named linear's inputs X [n, in], accumulated batch by batch
    (no activations kept), with the number of rows n: GPTQ's Hessian of ||W X^T - W_q X^T||^2."""
    mods = dict(model.named_modules())
    acc = {}

    def hook(m, args, n):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()          # [rows, in]
        H, rows = acc.get(n, (torch.zeros(x.shape[1], x.shape[1], device=x.device), 0))
        acc[n] = (H + 2 * x.T @ x, rows + x.shape[0])

    hooks = [mods[n].register_forward_pre_hook(lambda m, a, n=n: hook(m, a, n)) for n in names]
    try:
        run_batches(model, batches)
    finally:
        for h in hooks:
            h.remove()
    return {n: (H / rows, rows) for n, (H, rows) in acc.items()}


@torch.no_grad()
def activation_absmax(model: nn.Module, batches, names=None) -> dict[str, torch.Tensor]:
    """max |x| per input channel [in_features] of each linear (default: every linear but lm_head)."""
    names = list(names or named_linears(model))
    mods = dict(model.named_modules())
    out = {}

    def hook(args, n):
        a = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0).float()
        out[n] = torch.maximum(out[n], a) if n in out else a

    hooks = [mods[n].register_forward_pre_hook(lambda m, a, n=n: hook(a, n)) for n in names]
    try:
        run_batches(model, batches)
    finally:
        for h in hooks:
            h.remove()
    return out


def outlier_report(absmax: dict[str, torch.Tensor], top: int = 3, threshold: float = 6.0) -> list[dict]:
    """One row per linear: the largest input channels, how far above the median channel they are, and how
    many channels ever exceed ``threshold`` (LLM.int8's default outlier magnitude)."""
    rows = []
    for n, a in absmax.items():
        vals, idx = a.topk(min(top, a.numel()))
        med = float(a.median())
        rows.append({"layer": n, "channels": idx.tolist(), "absmax": [round(float(v), 2) for v in vals],
                     "median": round(med, 3), "max/median": round(float(vals[0]) / max(med, 1e-12), 1),
                     f"channels >= {threshold:g}": int((a >= threshold).sum())})
    return rows


@dataclass
class ScalingGroup:
    """Linears that read the same input, and the op before them whose output channels can absorb a scale:
    x -> prev -> x' -> linears.  prev(x) / s  followed by  W * s  computes the same function."""
    name: str          # e.g. "model.layers.0.self_attn.qkv"
    prev: nn.Module    # an RMSNorm/LayerNorm (its weight) or an nn.Linear (its output rows)
    linears: list      # [(qualified name, nn.Linear)]


def scaling_groups(model: nn.Module) -> list[ScalingGroup]:
    """The foldable groups of a Llama-style decoder: norm -> q/k/v, norm -> gate/up, up -> down, and
    v -> o when there is one key/value head per query head (with grouped-query attention one v channel
    feeds several o channels, which would need equal scales: that pair is left out)."""
    body = getattr(model, "model", model)
    layers = getattr(body, "layers", None)
    if layers is None:
        raise ValueError("model has no .model.layers (or .layers): scaling_groups needs a Llama-style decoder")
    groups = []
    for i, layer in enumerate(layers):
        p = f"model.layers.{i}" if hasattr(model, "model") else f"layers.{i}"
        at, mlp = layer.self_attn, layer.mlp
        groups.append(ScalingGroup(f"{p}.self_attn.qkv", layer.input_layernorm,
                                   [(f"{p}.self_attn.{n}_proj", getattr(at, f"{n}_proj")) for n in "qkv"]))
        if at.v_proj.out_features == at.o_proj.in_features:
            groups.append(ScalingGroup(f"{p}.self_attn.o", at.v_proj, [(f"{p}.self_attn.o_proj", at.o_proj)]))
        groups.append(ScalingGroup(f"{p}.mlp.gate_up", layer.post_attention_layernorm,
                                   [(f"{p}.mlp.gate_proj", mlp.gate_proj), (f"{p}.mlp.up_proj", mlp.up_proj)]))
        groups.append(ScalingGroup(f"{p}.mlp.down", mlp.up_proj, [(f"{p}.mlp.down_proj", mlp.down_proj)]))
    return groups


@torch.no_grad()
def fold_scales(group: ScalingGroup, s: torch.Tensor) -> None:
    """Divide the previous op's output channels by s [in] and multiply the linears' input columns by s:
    the fp function is unchanged (up to rounding). In place."""
    k = group.linears[0][1].in_features
    if s.shape != (k,) or not bool((s > 0).all()):
        raise ValueError(f"s must be a positive tensor of shape ({k},), got {tuple(s.shape)}")
    prev = group.prev
    if isinstance(prev, nn.Linear):
        prev.weight.div_(s.to(prev.weight.dtype)[:, None])                      # [out=k, in] rows
        if prev.bias is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    else:
        prev.weight.div_(s.to(prev.weight.dtype))                              # a norm's gain [k]
        if getattr(prev, "bias", None) is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    for _, lin in group.linears:
        lin.weight.mul_(s.to(lin.weight.dtype)[None, :])                       # [out, in] columns
