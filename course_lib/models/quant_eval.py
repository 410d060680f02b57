"""Model-level quantization experiments on the bundled model (module 03, part B): held-out bits per byte,
QAT vs PTQ, the sensitivity scan, and bitsandbytes through transformers.

This module sits in layer 2 (it needs the bundled model and its corpus); the methods themselves live in
``course_lib.quant`` (layer 1), which never imports a model.

    from course_lib.models.quant_eval import heldout_texts, heldout_bpb, qat_vs_ptq, load_bnb
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from course_lib.perf.quality import score_texts
from course_lib.quant.core import fake_quantize
from course_lib.quant.qat import convert_qat, prepare_qat, qat_finetune, rtn_quantize_linears
from course_lib.quant.sensitivity import layer_groups, sensitivity_scan

from . import bundled_path, load
from .corpus import encode_stream, load_split

__all__ = ["heldout_texts", "heldout_bpb", "train_batches", "qat_vs_ptq", "sensitivity_bpb", "group_rtn",
           "load_bnb", "bnb_rows", "weight_bytes_of"]


@functools.lru_cache(maxsize=4)
def _heldout(n_texts: int, max_chars: int) -> tuple[str, ...]:
    return tuple(t[:max_chars] for t in load_split("heldout")[:n_texts])


def heldout_texts(n_texts: int = 4, max_chars: int = 1500) -> list[str]:
    """The first ``n_texts`` held-out stdlib files (never trained on), each cut to ``max_chars``."""
    if n_texts < 1 or max_chars < 1:
        raise ValueError("n_texts and max_chars must be >= 1")
    return list(_heldout(n_texts, max_chars))


def heldout_bpb(model, tok, texts=None, max_len: int = 256) -> float:
    """Bits per byte of the held-out texts (``perf.quality.score_texts``, no progress bar)."""
    return score_texts(model, tok, texts or heldout_texts(), max_len=max_len, progress=False).bits_per_byte


def train_batches(tok, n_batches: int = 8, batch_size: int = 4, seq_len: int = 128, seed: int = 0,
                  max_files: int = 40) -> list[torch.Tensor]:
    """Random windows [batch_size, seq_len + 1] of the training split's token stream (host tensors)."""
    stream = encode_stream(getattr(tok, "backend_tokenizer", tok), load_split("train", max_files=max_files))
    g = torch.Generator(device="cpu").manual_seed(seed)          # host windows of a host stream
    starts = torch.randint(0, len(stream) - seq_len - 1, (n_batches, batch_size), generator=g, device="cpu")
    return [torch.stack([stream[s:s + seq_len + 1] for s in row.tolist()]) for row in starts]


def group_rtn(bits: int, group_size: int = 16):
    """w, bits -> w_hat: the group-wise absmax RTN the scan and QAT use (``bits`` argument overrides)."""
    def q(w, b=bits):
        return fake_quantize(w, b, "absmax", "group", group_size=group_size)
    return q


def qat_vs_ptq(name: str = "tiny", bits: int = 3, group_size: int | None = None, steps: int = 20, lr: float = 1e-4,
               batch_size: int = 4, seq_len: int = 128, texts=None, device="cpu", ce_weight: float = 0.0,
               progress: bool = True) -> dict:
    """Quick QAT experiment: held-out bits per byte of the float model, of RTN PTQ at ``bits`` (groups of
    ``group_size``; None: one scale per output row), and of the same grid after ``steps`` QAT steps
    (distilling from the float model; measured: int3 per row, 20 steps of 4 x 128 tokens, recovers about a third
    of the PTQ gap on the tiny model).

    Returns {"fp32", "ptq", "qat", "recovered" (share of the PTQ loss gap closed), "losses", ...}."""
    texts = texts or heldout_texts()
    model, tok = load(name, device=device, verbose=False)
    fp = heldout_bpb(model, tok, texts)
    ptq_model, _ = load(name, device=device, verbose=False)
    ptq = heldout_bpb(rtn_quantize_linears(ptq_model, bits, group_size), tok, texts)
    student, _ = load(name, device=device, verbose=False)
    prepare_qat(student, bits, group_size)
    for n, p in student.named_parameters():           # train the quantized linears only (norms, embedding fixed)
        p.requires_grad_(".layers." in f".{n}" and n.endswith("proj.weight"))
    losses = qat_finetune(student, train_batches(tok, steps, batch_size, seq_len), steps, lr, teacher=model,
                          ce_weight=ce_weight, progress=progress)
    convert_qat(student)
    qat = heldout_bpb(student, tok, texts)
    gap = ptq - fp
    return {"name": name, "bits": bits, "group_size": group_size, "steps": steps, "fp32": fp, "ptq": ptq,
            "qat": qat, "recovered": (ptq - qat) / gap if gap > 0 else float("nan"), "losses": losses,
            "model": student}


def sensitivity_bpb(model, tok, texts=None, bits=(8, 4, 3), group_size: int = 16, by: str = "layer",
                    progress: bool = True) -> dict:
    """``quant.sensitivity_scan`` with held-out bits per byte as the loss and group RTN as the quantizer."""
    texts = texts or heldout_texts()
    q = group_rtn(4, group_size)
    return sensitivity_scan(model, lambda m: heldout_bpb(m, tok, texts), layer_groups(model, by),
                            lambda w, b: q(w, b), bits, progress)


def weight_bytes_of(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, as stored (a quantized model's packed weights count as stored)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _swap_bnb(model: nn.Module, mode: str) -> nn.Module:
    """What transformers' bitsandbytes integration does: replace each nn.Linear (but lm_head) by
    bitsandbytes' Linear8bitLt / Linear4bit and quantize its weight when it is moved to the device."""
    import bitsandbytes as bnb
    for n, m in list(model.named_modules()):
        if not isinstance(m, nn.Linear) or "lm_head" in n:
            continue
        w = m.weight.data.clone()
        if mode == "int8":
            new = bnb.nn.Linear8bitLt(m.in_features, m.out_features, m.bias is not None, has_fp16_weights=False,
                                      threshold=6.0)
            new.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
        else:
            new = bnb.nn.Linear4bit(m.in_features, m.out_features, m.bias is not None, compute_dtype=torch.float32,
                                    quant_type="nf4", compress_statistics=True)
            new.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True)
        if m.bias is not None:
            new.bias = nn.Parameter(m.bias.data.clone(), requires_grad=False)
        parent, _, child = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new.to(m.weight.device))
    return model


def load_bnb(mode: str, name: str = "tiny", device: str = "cpu", fallback: bool = True):
    """The bundled model through transformers with ``BitsAndBytesConfig`` (``mode`` "int8": LLM.int8 with
    threshold 6; "nf4": 4-bit NF4 with double quantization, fp32 compute).

    Returns (model, info) with info["route"]: "transformers" when ``from_pretrained(...,
    quantization_config=...)`` works; otherwise (transformers 5 insists on ``accelerate`` for bitsandbytes,
    even on a CPU) and with ``fallback``, the same bitsandbytes modules put in by hand into the fp32 HF model,
    with info["refused"] holding transformers' message. Without ``fallback`` the refusal is raised."""
    if mode not in ("int8", "nf4"):
        raise ValueError(f"mode must be 'int8' or 'nf4', got {mode!r}")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    path = str(bundled_path(name))
    cfg = (BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0) if mode == "int8" else
           BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.float32))
    try:
        extra = {} if str(device) == "cpu" else {"device_map": device}
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg, **extra)
        return model.eval(), {"route": "transformers", "refused": None}
    except (ImportError, ValueError) as e:
        if not fallback:
            raise
        refused = f"{type(e).__name__}: {e}"
    model = AutoModelForCausalLM.from_pretrained(path).to(device)
    return _swap_bnb(model, mode).eval(), {"route": "bitsandbytes modules swapped in by hand", "refused": refused}


class _Once:
    def __init__(self):
        self.seen = set()

    def filter(self, record):
        key = record.getMessage()
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def bnb_rows(name: str = "tiny", texts=None, device: str = "cpu") -> list[dict]:
    """fp32 vs bitsandbytes int8 vs NF4 (double quant): measured bytes and held-out bits per byte."""
    import logging

    from transformers import AutoModelForCausalLM
    # bitsandbytes logs its fp32 -> fp16 cast note on every int8 matmul: keep the first, drop the repeats
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(_Once())
    texts = texts or heldout_texts()
    _, tok = load(name, device="cpu", verbose=False)
    fp = AutoModelForCausalLM.from_pretrained(str(bundled_path(name))).to(device).eval()
    rows = [{"method": "fp32 (transformers)", "bytes": weight_bytes_of(fp), "bpb": heldout_bpb(fp, tok, texts),
             "route": "transformers"}]
    for mode in ("int8", "nf4"):
        m, info = load_bnb(mode, name, device)
        rows.append({"method": f"bitsandbytes {mode}" + (" + double quant" if mode == "nf4" else ""),
                     "bytes": weight_bytes_of(m), "bpb": heldout_bpb(m, tok, texts), "route": info["route"],
                     "refused": info["refused"]})
    return rows


# --- model transforms for the notebook's one table (each returns the model, changed in place) -------------

def _linears(model, skip=("lm_head",)):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and not any(s in n for s in skip)]


def _put(model, name, new):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


@torch.no_grad()
def to_gguf(model, fmt: str = "q4_k", mix: dict | None = None):
    """Round every linear through a GGUF format (simulated: weights replaced by their decode). ``mix``
    {substring: fmt} picks another format per tensor (a Q4_K_M-style mix: e.g. {"v_proj": "q6_k",
    "down_proj": "q6_k"}). A weight whose rows are not a whole number of blocks (the tiny model's
    down_proj has 688 inputs) is cut into blocks across rows, which llama.cpp would not do (it would fall
    back to another type); the error is the format's all the same."""
    from course_lib.quant.gguf import BLOCK_VALUES, gguf_dequantize, gguf_quantize
    for n, m in _linears(model):
        f = next((v for k, v in (mix or {}).items() if k in n), fmt)
        w = m.weight
        flat = w.reshape(-1) if w.shape[1] % BLOCK_VALUES[f] else w
        m.weight.copy_(gguf_dequantize(gguf_quantize(flat, f), f).reshape(w.shape))
    return model


def to_fp8(model, fmt: str = "e4m3", act: str | None = "row"):
    """Swap every linear for an FP8Linear (per-row weight scales; activations per token unless act=None)."""
    from course_lib.quant.fp8 import FP8Linear
    for n, m in _linears(model):
        _put(model, n, FP8Linear.from_linear(m, fmt, "row", act))
    return model


def to_fast_weight_only(model, bits: int = 8, group_size: int = 128):
    """Swap linears for torch's fused weight-only int8 / int4 linears; with int4, a linear whose input size
    ``group_size`` does not divide (the tiny model's down_proj: 688) gets int8."""
    from course_lib.quant.fast import Int4WeightOnlyLinear, Int8WeightOnlyLinear
    for n, m in _linears(model):
        if bits == 4 and m.in_features % group_size == 0:
            _put(model, n, Int4WeightOnlyLinear.from_linear(m, group_size))
        else:
            _put(model, n, Int8WeightOnlyLinear.from_linear(m))
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


__all__ += ["to_gguf", "to_fp8", "to_fast_weight_only", "to_mixed"]
