"""Quantization-aware training (QAT): train through the rounding with a straight-through estimator (module 03).

Post-training quantization (PTQ) rounds trained weights and hopes; QAT keeps float "shadow" weights,
rounds them in every forward pass (fake quantization: quantize then dequantize, so the model sees the
values it will have after deployment), and lets the loss move the float weights to where their rounded
values work well. Rounding has zero gradient almost everywhere, so the backward pass pretends it was the
identity: the straight-through estimator (STE, Bengio et al. 2013),

    forward:  w_q = fake_quantize(w)            backward:  d loss / d w := d loss / d w_q

written ``w + (fake_quantize(w) - w).detach()``: the value is w_q, the gradient flows to w unchanged.
After training, ``convert_qat`` bakes the rounded weights into plain ``nn.Linear`` layers (what a real
int kernel would then store). The grid here is the course's group-wise absmax RTN (``core.fake_quantize``),
so a QAT model and a PTQ model at the same bits use exactly the same format.

The production route in PyTorch is torchao (not installed here): ``torchao.quantization.qat``
(``IntXQuantizationAwareTrainingConfig`` / ``FakeQuantizeConfig`` with ``quantize_(model, ...)``, and the
older ``Int8DynActInt4WeightQATQuantizer`` with ``.prepare(model)`` / ``.convert(model)``), which is what
torchtune's QAT recipes call. ``torch.quantization`` / ``torch.ao.quantization`` is the legacy eager/FX
workflow for CNN-style int8, not the LLM path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.modules import DEFAULT_SKIP, named_linears, replace_module

from .core import check_bits, fake_quantize

__all__ = ["fake_quantize_ste", "QATLinear", "prepare_qat", "convert_qat", "rtn_quantize_linears", "qat_finetune"]


def fake_quantize_ste(w: torch.Tensor, bits: int = 4, group_size: int | None = 32) -> torch.Tensor:
    """Group-wise absmax RTN in the forward pass, identity in the backward pass (straight-through)."""
    gran = "group" if group_size else "channel"
    wq = fake_quantize(w.detach(), bits, "absmax", gran, group_size=group_size) if group_size else \
        fake_quantize(w.detach(), bits, "absmax", gran, axis=0)
    return w + (wq.to(w.dtype) - w).detach()


class QATLinear(nn.Linear):
    """An ``nn.Linear`` whose forward uses the fake-quantized weight; gradients reach the float weight by STE."""

    def __init__(self, in_features, out_features, bias=True, bits: int = 4, group_size: int | None = 32,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.bits, self.group_size = check_bits(bits), group_size

    def forward(self, x):
        return F.linear(x, fake_quantize_ste(self.weight, self.bits, self.group_size), self.bias)

    def extra_repr(self):
        return super().extra_repr() + f", bits={self.bits}, group_size={self.group_size}"


def _check_group(model, names, group_size):
    for n in names:
        k = model.get_submodule(n).in_features
        if group_size and k % group_size:
            raise ValueError(f"group_size={group_size} does not divide {n}'s in_features={k}")


def prepare_qat(model: nn.Module, bits: int = 4, group_size: int | None = 32, skip=DEFAULT_SKIP) -> nn.Module:
    """Swap every ``nn.Linear`` (but ``skip``, module names matched on dots: ``course_lib.modules``) for a
    ``QATLinear`` sharing its parameters, in place."""
    check_bits(bits)
    names = list(named_linears(model, skip))
    _check_group(model, names, group_size)
    for n in names:
        lin = model.get_submodule(n)
        q = QATLinear(lin.in_features, lin.out_features, lin.bias is not None, bits, group_size,
                      device=lin.weight.device, dtype=lin.weight.dtype)
        q.weight, q.bias = lin.weight, lin.bias           # the same Parameters: training moves them
        replace_module(model, n, q)
    return model


def convert_qat(model: nn.Module) -> nn.Module:
    """Replace each ``QATLinear`` by an ``nn.Linear`` holding its rounded weights (the deployed model), in place."""
    for n, m in named_linears(model, skip=(), types=QATLinear).items():     # the second pass: every QATLinear
        lin = nn.Linear(m.in_features, m.out_features, m.bias is not None, device=m.weight.device,
                        dtype=m.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(fake_quantize_ste(m.weight, m.bits, m.group_size))
            if m.bias is not None:
                lin.bias.copy_(m.bias)
        replace_module(model, n, lin)
    return model


@torch.no_grad()
def rtn_quantize_linears(model: nn.Module, bits: int = 4, group_size: int | None = 32, skip=DEFAULT_SKIP,
                         names=None) -> nn.Module:
    """PTQ baseline: round each chosen linear's weight to the same grid as QAT (in place, simulated)."""
    check_bits(bits)
    names = list(named_linears(model, skip)) if names is None else list(names)
    _check_group(model, names, group_size)
    for n in names:
        w = model.get_submodule(n).weight
        w.copy_(fake_quantize_ste(w, bits, group_size))
    return model


def qat_finetune(model: nn.Module, batches, steps: int, lr: float = 1e-4, teacher: nn.Module | None = None,
                 kd_weight: float = 1.0, ce_weight: float = 1.0, progress: bool = True) -> list[float]:
    """Fine-tune a ``prepare_qat``-ed causal LM on token batches [B, T+1] (next-token loss on T positions).

    loss = ``ce_weight`` * next-token cross-entropy, plus with ``teacher`` (the float model) ``kd_weight`` *
    KL(teacher || student) per token: the float model's own distribution is the cheapest target to recover
    with few steps (ce_weight=0: pure self-distillation, as LLM-QAT does). Returns the losses.
    ``batches``: an iterable of int64 tensors; it is cycled until ``steps`` steps are done.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if teacher is None and ce_weight == 0:
        raise ValueError("ce_weight=0 needs a teacher: the loss would be empty")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(bar, desc="QAT", unit="step")
    batches = list(batches)
    if not batches:
        raise ValueError("batches is empty")
    device = next(model.parameters()).device
    for step in bar:
        ids = batches[step % len(batches)].to(device)
        logits = model(ids[:, :-1])
        logits = logits if isinstance(logits, torch.Tensor) else logits.logits
        loss = ce_weight * F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        if teacher is not None:
            with torch.no_grad():
                t = teacher(ids[:, :-1])
                t = t if isinstance(t, torch.Tensor) else t.logits
            loss = loss + kd_weight * F.kl_div(F.log_softmax(logits.float(), -1).flatten(0, 1),
                                               F.log_softmax(t.float(), -1).flatten(0, 1),
                                               log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
