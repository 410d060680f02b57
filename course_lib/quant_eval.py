"""Module 03's evaluation: every quantized variant of a model on one table (method, bits, measured weight
bytes, held-out bits per byte, decode ms/token).

It sits above ``quant`` (which knows no model) because it needs the bundled corpus, the quality measure
(``perf.quality.bits_per_byte``, the one notebooks 04 and 05 use) and the generate loop for decode timing.
More rows are more ``Variant`` entries: a name, a bit width and a function model -> quantized model.

    variants = [Variant("fp32", 32, lambda m: m),
                Variant("RTN W4A16 g128", 4, lambda m: quantize_model(m, "rtn", bits=4))]
    rows = compare(model, tok, variants, heldout_texts(4, 4000))
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from course_lib.generation import generate
from course_lib.models.corpus import load_split
from course_lib.perf.quality import bits_per_byte
from course_lib.perf.tables import format_table
from course_lib.quant.linear import state_dict_bytes

__all__ = ["Variant", "calibration_batches", "heldout_texts", "decode_ms_per_token", "evaluate",
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


def heldout_texts(n_files: int = 4, max_chars: int | None = 4000) -> list[str]:
    return [t[:max_chars] if max_chars else t for t in load_split("heldout", max_files=n_files)]


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
    row = {"weight bytes": state_dict_bytes(model),
           "held-out bits/byte": bits_per_byte(model, tokenizer, texts, progress=False)}
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
