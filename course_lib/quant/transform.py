"""``quantize_model(model, method, ...)``: swap a model's ``nn.Linear`` layers for quantized ones, the way
gpt-fast's quantization handlers do, with every method of module 03 behind one call.

    qmodel = quantize_model(model, "rtn", bits=4, group_size=128)            # W4A16 round-to-nearest
    qmodel = quantize_model(model, "gptq", bits=4, calib=batches)            # needs calibration batches
    state_dict_bytes(qmodel)                                                 # what a checkpoint holds

methods: "rtn" (weight-only W8A16 / W4A16), "awq" (scale search + RTN), "gptq" (weight-only), "w8a8"
(int8 weights, dynamic per-token int8 activations), "smoothquant" (smoothing + W8A8), "llm_int8".
The tied ``lm_head`` (it shares the embedding matrix) stays in full precision by default (``skip``: module
names matched on dots, the one rule of ``course_lib.modules.named_linears``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn as nn

from course_lib.modules import DEFAULT_SKIP, layer_index, name_matches, named_linears, replace_module

from .awq import awq_apply
from .core import fake_quantize, in_layer
from .calibration import input_hessians
from .fast import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from .fp8 import FP8Linear
from .gguf import BLOCK_VALUES, gguf_dequantize, gguf_quantize
from .gptq import gptq_quantize
from .linear import QuantLinear, W8A8Linear
from .llm_int8 import LLMInt8Linear
from .smoothquant import smooth_model

__all__ = ["METHODS", "QUANT_METHODS", "QuantMethod", "quantize_model", "gptq_model", "group_rtn", "to_gguf", "to_fp8",
           "to_fast_weight_only", "to_mixed"]

@dataclass(frozen=True)
class QuantMethod:
    """One row of ``quantize_model``'s table (gpt-fast's handler shape): ``prepare(model, opts)`` runs on the
    whole model first (a scale search, smoothing, or GPTQ, which swaps the linears itself, layer by layer),
    then ``linear(lin, opts)`` replaces every linear (None: nothing left to swap). ``needs_calib``: the
    method reads calibration batches; ``stored_bits``: it stores 4- or 8-bit weights (``bits``)."""
    prepare: Callable | None
    linear: Callable | None
    needs_calib: bool = False
    stored_bits: bool = False


def _weight_only(lin, o):
    return QuantLinear.from_linear(lin, o.bits, o.group_size, o.sym)


def _w8a8(lin, o):
    return W8A8Linear.from_linear(lin)


def _awq(model, o):
    awq_apply(model, o.calib, o.bits, o.group_size, o.sym, n_grid=o.n_grid, progress=o.progress)


def _gptq(model, o):
    gptq_model(model, o.calib, o.bits, o.group_size, o.sym, o.act_order, skip=o.skip, progress=o.progress)


QUANT_METHODS = {
    "rtn": QuantMethod(None, _weight_only, stored_bits=True),
    "awq": QuantMethod(_awq, _weight_only, needs_calib=True, stored_bits=True),
    "gptq": QuantMethod(_gptq, None, needs_calib=True, stored_bits=True),
    "w8a8": QuantMethod(None, _w8a8),
    "smoothquant": QuantMethod(lambda model, o: smooth_model(model, o.calib, o.alpha), _w8a8, needs_calib=True),
    "llm_int8": QuantMethod(None, lambda lin, o: LLMInt8Linear.from_linear(lin, o.threshold)),
}
METHODS = tuple(QUANT_METHODS)


@torch.no_grad()
def gptq_model(model, calib, bits=4, group_size=128, sym=False, act_order=False, blocksize=128,
               percdamp=0.01, skip=DEFAULT_SKIP, progress=False) -> dict:
    """GPTQ every linear in place, one decoder layer at a time: the Hessians of layer i are taken with
    layers < i already quantized (the inputs the quantized model will really see). Returns
    {name: GPTQResult}."""
    lins = named_linears(model, skip)
    order = sorted({layer_index(n) for n in lins if layer_index(n) is not None})
    stages = [[n for n in lins if layer_index(n) == i] for i in order]
    rest = [n for n in lins if layer_index(n) is None]
    stages += [rest] if rest else []
    if progress:
        from tqdm.auto import tqdm
        stages = tqdm(stages, desc="GPTQ", unit="layer")
    results = {}
    for names in stages:
        hs = input_hessians(model, calib, names)
        for n in names:
            lin = lins[n]
            with in_layer(n):
                r = gptq_quantize(lin.weight, hs[n][0], bits, group_size, sym, blocksize, percdamp, act_order)
            results[n] = r
            g_idx = r.g_idx if act_order else None
            replace_module(model, n, QuantLinear.from_codes(r.codes, r.scales, r.zeros, g_idx, lin.bias,
                                                             bits, group_size))
    return results


def quantize_model(model: nn.Module, method: str = "rtn", bits: int = 4, group_size: int | None = 128,
                   sym: bool = False, calib=None, skip=DEFAULT_SKIP, inplace: bool = False,
                   alpha: float = 0.5, threshold: float = 6.0, act_order: bool = False, n_grid: int = 20,
                   progress: bool = False) -> nn.Module:
    """A quantized copy of ``model`` (or the model itself with ``inplace=True``); see the module docstring.

    bits/group_size/sym: the weight format of rtn, awq and gptq (bits 4 or 8). calib: a list of input
    batches (token ids [B, T]) for awq, gptq and smoothquant. alpha: SmoothQuant's migration strength.
    threshold: LLM.int8's outlier magnitude. act_order: GPTQ's column order. n_grid: AWQ's alpha grid."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if method not in QUANT_METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    spec = QUANT_METHODS[method]
    if spec.needs_calib and calib is None:
        raise ValueError(f"method {method!r} needs calib= (a list of input batches, e.g. token ids [B, T])")
    if spec.stored_bits and bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8 for {method!r} (the stored formats), got {bits!r}")
    opts = SimpleNamespace(bits=bits, group_size=group_size, sym=sym, calib=calib, skip=skip, alpha=alpha,
                           threshold=threshold, act_order=act_order, n_grid=n_grid, progress=progress)
    m = model if inplace else copy.deepcopy(model)
    if spec.prepare is not None:
        spec.prepare(m, opts)
    if spec.linear is not None:
        for name, lin in named_linears(m, skip).items():
            with in_layer(name):
                new = spec.linear(lin, opts)
            replace_module(m, name, new)
    return m


# --- more transforms (module 03's table rows; each changes the model in place and returns it) ---------

def group_rtn(bits: int, group_size: int = 16):
    """w, bits -> w_hat: the group-wise absmax RTN the scan and QAT use (``bits`` argument overrides)."""
    def q(w, b=bits):
        return fake_quantize(w, b, "absmax", "group", group_size=group_size)
    return q


@torch.no_grad()
def to_gguf(model, fmt: str = "q4_k", mix: dict | None = None):
    """Round every linear through a GGUF format (simulated: weights replaced by their decode). ``mix``
    {module-name suffix: fmt} picks another format per tensor, the suffix matched on dots as a ``skip`` name
    is (a Q4_K_M-style mix: e.g. {"v_proj": "q6_k", "down_proj": "q6_k"}). A weight whose rows are not a
    whole number of blocks (the tiny model's down_proj has 688 inputs) is cut into blocks across rows, which
    llama.cpp would not do (it would fall back to another type); the error is the format's all the same."""
    if mix is not None and not (isinstance(mix, dict) and all(isinstance(k, str) for k in mix)):
        raise TypeError(f"mix must be a dict {{module-name suffix: GGUF format}}, got {mix!r}")
    for n, m in named_linears(model).items():
        f = next((v for k, v in (mix or {}).items() if name_matches(n, k)), fmt)
        w = m.weight
        flat = w.reshape(-1) if w.shape[1] % BLOCK_VALUES[f] else w
        m.weight.copy_(gguf_dequantize(gguf_quantize(flat, f), f).reshape(w.shape))
    return model


def to_fp8(model, fmt: str = "e4m3", act: str | None = "row"):
    """Swap every linear for an FP8Linear (per-row weight scales; activations per token unless act=None)."""
    for n, m in named_linears(model).items():
        replace_module(model, n, FP8Linear.from_linear(m, fmt, "row", act))
    return model


def to_fast_weight_only(model, bits: int = 8, group_size: int = 128):
    """Swap linears for torch's fused weight-only int8 / int4 linears; with int4, a linear whose input size
    ``group_size`` does not divide (the tiny model's down_proj: 688) gets int8."""
    for n, m in named_linears(model).items():
        if bits == 4 and m.in_features % group_size == 0:
            replace_module(model, n, Int4WeightOnlyLinear.from_linear(m, group_size))
        else:
            replace_module(model, n, Int8WeightOnlyLinear.from_linear(m))
    return model


@torch.no_grad()
def to_mixed(model, alloc: dict, groups: dict, group_size: int = 16):
    """Group RTN with the bits of a ``sensitivity.allocate_bits`` allocation {group: bits}."""
    q = group_rtn(4, group_size)
    for g, b in alloc.items():
        for n in groups[g]:
            w = model.get_submodule(n).weight
            w.copy_(q(w, b))
    return model
