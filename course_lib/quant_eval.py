"""Module 03's evaluation: every quantized variant of a model on one table (method, bits, measured weight
bytes, held-out bits per byte, decode ms/token).

It sits above ``quant`` (which knows no model) because it needs the bundled corpus, the quality measure
(``perf.quality.bits_per_byte``, the one notebooks 04 and 05 use) and the generate loop for decode timing.
More rows are more ``Variant`` entries: a name, a bit width and a function model -> quantized model.
The experiments of the module's second half live here too: QAT vs PTQ (``qat_vs_ptq``), the layer-wise
sensitivity scan on held-out bits per byte (``sensitivity_bpb``), bitsandbytes through transformers
(``load_bnb``, ``bnb_rows``), and the model transforms of the k-quant, FP8, fused weight-only and
mixed-precision rows are model transforms in ``quant.transform`` (``to_gguf``, ``to_fp8``,
``to_fast_weight_only``, ``to_mixed``).

    variants = [Variant("fp32", 32, lambda m: m),
                Variant("RTN W4A16 g128", 4, lambda m: quantize_model(m, "rtn", bits=4))]
    rows = compare(model, tok, variants, heldout_texts(4, 4000))
"""
from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from course_lib.generation import generate
from course_lib.models import bundled_path, load
from course_lib.models.corpus import encode_stream, load_split
from course_lib.perf.quality import bits_per_byte
from course_lib.perf.tables import format_table
from course_lib.quant.linear import state_dict_bytes
from course_lib.quant.qat import convert_qat, prepare_qat, qat_finetune, rtn_quantize_linears
from course_lib.quant.sensitivity import layer_groups, sensitivity_scan
from course_lib.quant.transform import group_rtn

__all__ = ["Variant", "calibration_batches", "heldout_texts", "heldout_bpb", "decode_ms_per_token", "evaluate",
           "compare", "table_markdown", "COLUMNS"]

COLUMNS = ["method", "bits", "weight bytes", "held-out bits/byte", "decode ms/token", "quantize s"]


@dataclass
class Variant:
    name: str
    bits: float                                  # bits per weight of the quantized linears (nominal)
    transform: Callable                          # model -> model (a copy; the original must stay intact)
    note: str = field(default="")


def calibration_batches(tokenizer, n_batches: int = 8, seq_len: int = 256, seed: int = 0,
                        max_files: int = 200, device=None) -> list[torch.Tensor]:
    """Random windows [1, seq_len] of the training split's token stream (calibration data; the held-out
    split stays for evaluation)."""
    if n_batches < 1 or seq_len < 2:
        raise ValueError(f"n_batches must be >= 1 and seq_len >= 2, got {n_batches} and {seq_len}")
    texts = load_split("train", max_files=max_files)
    ids = tokenizer("\n".join(texts), add_special_tokens=False, verbose=False)["input_ids"]
    if len(ids) <= seq_len:
        raise ValueError(f"only {len(ids)} calibration tokens for seq_len={seq_len}: raise max_files")
    g = torch.Generator(device="cpu").manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len, (n_batches,), generator=g, device="cpu").tolist()
    return [torch.tensor([ids[s:s + seq_len]], device=device) for s in starts]


@functools.lru_cache(maxsize=8)
def _heldout(n_files: int, max_chars: int | None) -> tuple[str, ...]:
    return tuple(t[:max_chars] if max_chars else t for t in load_split("heldout", max_files=n_files))


def heldout_texts(n_files: int = 4, max_chars: int | None = 4000) -> list[str]:
    """The first ``n_files`` held-out stdlib files (never trained on), each cut to ``max_chars`` (None: whole)."""
    if n_files < 1 or (max_chars is not None and max_chars < 1):
        raise ValueError(f"n_files must be >= 1 and max_chars >= 1 or None, got {n_files} and {max_chars}")
    return list(_heldout(n_files, max_chars))


def heldout_bpb(model, tok, texts=None, max_len: int | None = None) -> float:
    """Bits per byte of the held-out texts (``perf.quality.bits_per_byte``, windows of the model's context
    unless ``max_len``; no progress bar): the quality column of every row of the module's table."""
    return bits_per_byte(model, tok, texts or heldout_texts(), max_len=max_len, progress=False)


@torch.no_grad()
def decode_ms_per_token(model, prompt_ids, n_tokens: int = 32, repeats: int = 1) -> float:
    """Median over ``repeats`` of the mean time per output token (TPOT) of greedy decoding with a KV cache."""
    if n_tokens < 2:
        raise ValueError(f"n_tokens must be >= 2 (TPOT averages the gaps between tokens), got {n_tokens}")
    times = []
    for _ in range(repeats):
        _, trace = generate(model, prompt_ids, n_tokens, cache="contiguous")
        times.append(trace.tpot * 1e3)
    return sorted(times)[len(times) // 2]


def evaluate(model, tokenizer, texts, prompt_ids=None, decode_tokens: int = 32, repeats: int = 1) -> dict:
    row = {"weight bytes": state_dict_bytes(model), "held-out bits/byte": heldout_bpb(model, tokenizer, texts)}
    if prompt_ids is not None:
        row["decode ms/token"] = decode_ms_per_token(model, prompt_ids, decode_tokens, repeats)
    return row


def compare(model, tokenizer, variants: list[Variant], texts, prompt_ids=None, decode_tokens: int = 32,
            repeats: int = 1, progress: bool = True) -> list[dict]:
    """One row per variant; each transform gets a fresh copy of ``model``."""
    if not variants:
        raise ValueError("variants must be a non-empty list of Variant")
    it = variants
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(variants, desc="variants", unit="model")
    rows = []
    for v in it:
        if not isinstance(v, Variant):
            raise TypeError(f"variants must hold Variant entries, got {type(v).__name__}")
        t0 = time.perf_counter()
        qm = v.transform(copy.deepcopy(model))
        dt = time.perf_counter() - t0
        rows.append({"method": v.name, "bits": v.bits,
                     **evaluate(qm, tokenizer, texts, prompt_ids, decode_tokens, repeats), "quantize s": dt})
    return rows


def table_markdown(rows: list[dict], note: str = "") -> str:
    def cell(k, v):
        if v is None:
            return "-"
        if k == "weight bytes":
            return f"{v / 1e6:.2f} MB"
        if isinstance(v, float):
            return f"{v:.3f}" if k != "bits" else f"{v:g}"
        return str(v)
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    return format_table(cols, [[cell(c, r.get(c)) for c in cols] for r in rows], note=note)


# --- experiments on the bundled model: QAT vs PTQ, sensitivity, bitsandbytes; transforms for more rows ---

def train_batches(tok, n_batches: int = 8, batch_size: int = 4, seq_len: int = 128, seed: int = 0,
                  max_files: int = 40) -> list[torch.Tensor]:
    """Random windows [batch_size, seq_len + 1] of the training split's token stream (host tensors)."""
    stream = encode_stream(getattr(tok, "backend_tokenizer", tok), load_split("train", max_files=max_files))
    g = torch.Generator(device="cpu").manual_seed(seed)          # host windows of a host stream
    starts = torch.randint(0, len(stream) - seq_len - 1, (n_batches, batch_size), generator=g, device="cpu")
    return [torch.stack([stream[s:s + seq_len + 1] for s in row.tolist()]) for row in starts]


def qat_vs_ptq(name: str = "tiny", bits: int = 3, group_size: int | None = None, steps: int = 20, lr: float = 1e-4,
               batch_size: int = 4, seq_len: int = 128, texts=None, device="cpu", ce_weight: float = 0.0,
               progress: bool = True) -> dict:
    """Quick QAT experiment: held-out bits per byte of the float model, of RTN PTQ at ``bits`` (groups of
    ``group_size``; None: one scale per output row), and of the same grid after ``steps`` QAT steps
    (distilling from the float model; measured: int3 per row, 20 steps of 4 x 128 tokens, recovers about a third
    of the PTQ gap on the tiny model).

    Returns {"fp32", "ptq", "qat", "recovered" (share of the PTQ loss gap closed), "losses", ...}."""
    texts = texts or heldout_texts(4, 1500)
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
    texts = texts or heldout_texts(4, 1500)
    q = group_rtn(4, group_size)
    return sensitivity_scan(model, lambda m: heldout_bpb(m, tok, texts), layer_groups(model, by),
                            lambda w, b: q(w, b), bits, progress)


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
    texts = texts or heldout_texts(4, 1500)
    _, tok = load(name, device="cpu", verbose=False)
    fp = AutoModelForCausalLM.from_pretrained(str(bundled_path(name))).to(device).eval()
    rows = [{"method": "fp32 (transformers)", "bytes": state_dict_bytes(fp), "bpb": heldout_bpb(fp, tok, texts),
             "route": "transformers"}]
    for mode in ("int8", "nf4"):
        m, info = load_bnb(mode, name, device)
        rows.append({"method": f"bitsandbytes {mode}" + (" + double quant" if mode == "nf4" else ""),
                     "bytes": state_dict_bytes(m), "bpb": heldout_bpb(m, tok, texts), "route": info["route"],
                     "refused": info["refused"]})
    return rows


__all__ += ["train_batches", "qat_vs_ptq", "sensitivity_bpb", "load_bnb", "bnb_rows"]
