"""Which linear layers a model transform touches, and how it swaps one module for another: the one rule that
quantization (``quant``: ``quantize_model``, GPTQ, GGUF, FP8, QAT, the sensitivity scan), pruning
(``sparsity``) and the bitsandbytes route (``quant_eval``) all follow.

    named_linears(model)                      {dotted name: module} of every nn.Linear but the LM head
    named_linears(model, skip=("lm_head", "mlp.gate"))        leave out more, by name
    replace_module(model, "model.layers.0.mlp.up_proj", new)  swap one submodule in place

The rule: a transform touches every ``nn.Linear`` of the model, subclasses included (a QAT linear, a linear
holding a pruning mask, bitsandbytes' linears: a second pass sees what a first pass left), except the modules
an explicit skip list names. A skip entry names a module by a suffix of its dotted name, cut on dots:
``"lm_head"`` leaves out ``lm_head`` and ``model.lm_head``, not ``lm_head_proj`` or ``my_lm_head``; ``"gate"``
leaves out an MoE router ``mlp.gate``, not ``mlp.gate_proj``; ``"mlp.down_proj"`` leaves out that projection in
every layer. ``types=`` picks other classes for a second pass (``convert_qat`` walks its ``QATLinear`` s).

Why this rule and not the ones it replaces:
- a suffix on dots, not a substring: ``"lm_head" in name`` also drops ``lm_head_proj``, and ``"gate"`` drops
  every ``gate_proj``, so a skip list would leave out layers nobody named, and nothing would say so;
- every linear, not a fixed list of the seven Llama projections: a fixed list knows one model class (``quant``
  knows none), refuses any other model, and would silently miss a linear it does not name (an MoE's experts);
- the LM head skipped by default: in the bundled models it is tied to the token embedding (one matrix), so
  rounding or pruning it would change the embedding table too, and it is what transformers' bitsandbytes
  integration and llama.cpp's mixes keep at higher precision. Embeddings and norms are not linears.
"""
from __future__ import annotations

import re

from torch import nn

__all__ = ["DEFAULT_SKIP", "named_linears", "name_matches", "layer_index", "replace_module"]

DEFAULT_SKIP = ("lm_head",)

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _check_skip(skip) -> tuple[str, ...]:
    if skip is None:
        return ()
    if isinstance(skip, str):                      # one name, not its characters
        skip = (skip,)
    try:
        skip = tuple(skip)
    except TypeError:
        raise TypeError(f"skip must be a tuple of module names, got {type(skip).__name__}") from None
    for s in skip:
        if not isinstance(s, str) or not s or s.startswith(".") or s.endswith(".") or ".." in s:
            raise ValueError(f"skip must hold dotted module names like 'lm_head' or 'mlp.gate', got {s!r}")
    return skip


def name_matches(name: str, suffixes) -> bool:
    """Whether the dotted module name ``name`` ends with one of ``suffixes`` on a dot boundary
    (``"model.lm_head"`` matches ``"lm_head"``; ``"lm_head_proj"`` and ``"my_lm_head"`` do not)."""
    return _matches(name, _check_skip(suffixes))


def _matches(name: str, suffixes: tuple[str, ...]) -> bool:
    return any(name == s or name.endswith("." + s) for s in suffixes)


def named_linears(model: nn.Module, skip=DEFAULT_SKIP, types=(nn.Linear,)) -> dict[str, nn.Module]:
    """{dotted name: module} of every module of ``model`` that is one of ``types`` (default ``nn.Linear``,
    subclasses included), in ``model.named_modules()`` order, leaving out the names ``skip`` matches
    (``name_matches``; default: the LM head). The one walker: see the module docstring for the rule."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    skip = _check_skip(skip)
    types = types if isinstance(types, tuple) else (types,)
    if not types or not all(isinstance(t, type) and issubclass(t, nn.Module) for t in types):
        raise TypeError(f"types must be nn.Module classes (a class or a tuple of them), got {types!r}")
    return {n: m for n, m in model.named_modules() if isinstance(m, types) and not _matches(n, skip)}


def layer_index(name: str) -> int | None:
    """The decoder layer a module name lies in (the N of its first ``layers.N.``, on dots), or None."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def replace_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Put ``new`` where the submodule ``name`` (dotted, as ``named_modules`` spells it; ModuleList items by
    index, "model.layers.0.mlp") is, in place; returns the module it replaced. ``name`` must already name a
    submodule: a parameter, a buffer, a plain attribute or a missing name is a ValueError, not a new attribute."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a dotted module name (str), got {type(name).__name__}")
    if not isinstance(new, nn.Module):
        raise TypeError(f"new must be an nn.Module, got {type(new).__name__}")
    parent_name, _, child = name.rpartition(".")
    try:
        parent = model.get_submodule(parent_name)      # "" is the model itself
    except AttributeError:
        parent = None
    if not child or parent is None or not isinstance(parent._modules.get(child), nn.Module):
        raise ValueError(f"name must name a submodule of the model (as named_modules() spells it, e.g. "
                         f"{next((n for n, _ in model.named_modules() if n), 'no submodules')!r}), got {name!r}")
    old = parent._modules[child]
    setattr(parent, child, new)
    return old
