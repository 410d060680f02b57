"""Module 03's evaluation: every quantized variant of a model on one table (method, bits, measured weight
bytes, held-out bits per byte, decode ms/token).

It sits above ``quant`` (which knows no model) because it needs the bundled corpus, the quality measure
(``perf.quality.bits_per_byte``, the one notebooks 04 and 05 use) and the generate loop for decode timing.
More rows are more ``Variant`` entries: a name, a bit width and a function model -> quantized model.
The experiments of the module's second half live here too: QAT vs PTQ (``qat_vs_ptq``), the layer-wise
sensitivity scan on held-out bits per byte (``sensitivity_bpb``), bitsandbytes through transformers
(``load_bnb``, ``bnb_rows``; ``route_bnb_cpu`` decides each 4-bit layer's CPU path), and the model
transforms of the k-quant, FP8, fused weight-only and mixed-precision rows are model transforms in
``quant.transform`` (``to_gguf``, ``to_fp8``, ``to_fast_weight_only``, ``to_mixed``).

    variants = [Variant("fp32", 32, lambda m: m),
                Variant("RTN W4A16 g128", 4, lambda m: quantize_model(m, "rtn", bits=4))]
    rows = compare(model, tok, variants, heldout_texts(4, 4000))
"""
from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch import nn

from course_lib.generation import generate
from course_lib.models import bundled_path, load
from course_lib.models.corpus import encode_stream, load_split
from course_lib.modules import named_linears, replace_module
from course_lib.perf.quality import bits_per_byte
from course_lib.perf.tables import format_table
from course_lib.quant.linear import state_dict_bytes
from course_lib.quant.qat import convert_qat, prepare_qat, qat_finetune, rtn_quantize_linears
from course_lib.quant.sensitivity import layer_groups, sensitivity_scan
from course_lib.quant.transform import group_rtn
from course_lib.validate import integer, one_of, optional

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
    n_batches, seq_len = integer(n_batches, "n_batches", low=1), integer(seq_len, "seq_len", low=2)
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
    n_files, max_chars = integer(n_files, "n_files", low=1), optional(integer, max_chars, "max_chars", low=1)
    return list(_heldout(n_files, max_chars))


def heldout_bpb(model, tok, texts=None, max_len: int | None = None) -> float:
    """Bits per byte of the held-out texts (``perf.quality.bits_per_byte``, windows of the model's context
    unless ``max_len``; no progress bar): the quality column of every row of the module's table."""
    return bits_per_byte(model, tok, texts or heldout_texts(), max_len=max_len, progress=False)


@torch.no_grad()
def decode_ms_per_token(model, prompt_ids, n_tokens: int = 32, repeats: int = 1) -> float:
    """Median over ``repeats`` of the mean time per output token (TPOT) of greedy decoding with a KV cache."""
    n_tokens = integer(n_tokens, "n_tokens", low=2)   # TPOT averages the gaps between tokens
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
    """``quant.sensitivity.sensitivity_scan`` with held-out bits per byte as the loss and group RTN as the quantizer."""
    texts = texts or heldout_texts(4, 1500)
    q = group_rtn(4, group_size)
    return sensitivity_scan(model, lambda m: heldout_bpb(m, tok, texts), layer_groups(model, by),
                            lambda w, b: q(w, b), bits, progress)


# --- bitsandbytes on a CPU: which path each 4-bit linear takes ---
#
# bitsandbytes 0.50 has two CPU paths for an inference forward of a 4-bit linear (Linear4bit.forward):
# "packed": where the module's flag ``support_avx512bf16_for_cpu`` is set (at construction, from
#   ``bitsandbytes.functional.has_avx512bf16()``), the first forward in eval mode without grad repacks the weight
#   (``_convert_weight_packed_for_cpu``: nibbles interleaved in blocks of 32 output rows, double quantization
#   undone, block scales in bf16) and every forward then runs the fused bf16 kernel ``gemv_4bit``, which
#   bitsandbytes registers for the CPU at import only on a CPU with AVX512-BF16;
# "dequantize": otherwise each forward dequantizes the whole weight to the input's dtype and calls F.linear.
# The repack asserts N % 32 == 0 and reshapes the block scales to [N, K / blocksize]: a layer whose shape
# breaks either crashes at its first forward (the bundled model's 688-wide MLP). ``route_bnb_cpu`` is the one
# place the course decides, layer by layer, and sets the flag accordingly.

BNB_CPU_PATHS = ("auto", "packed", "dequantize")
BNB_PACK_ROWS = 32          # block_n of bitsandbytes' CPU repack (the default it is called with)


class BnbRoute(NamedTuple):
    path: str               # "packed" | "dequantize" (4-bit on a CPU), "int8" (Linear8bitLt), else the device type
    why: str


def bnb_packed_cpu_kernel() -> bool:
    """True when bitsandbytes registered its fused 4-bit CPU kernel (``bitsandbytes::gemv_4bit`` for the CPU):
    it does so at import, only on a CPU with AVX512-BF16 and with its native library loaded. Without it a
    repacked weight would go to the generic kernel, which reads the packed bytes as the plain layout: wrong
    numbers, no error."""
    import bitsandbytes  # noqa: F401  (importing it registers its kernels)
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::gemv_4bit", "CPU"))


def bnb_int8_cpu_matmul() -> str:
    """How bitsandbytes multiplies int8 by int8 on this CPU: ``torch._int_mm`` (registered when torch >= 2.6
    and the CPU has AVX-512) or, elsewhere, its generic kernel (the int8 values multiplied as fp32)."""
    import bitsandbytes  # noqa: F401
    if torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::int8_linear_matmul", "CPU"):
        return "int8 x int8 -> int32 products by torch._int_mm (AVX-512)"
    return "int8 values multiplied as an fp32 matmul (generic kernel: no AVX-512)"


def bnb_packed_obstacle(module) -> str | None:
    """Why bitsandbytes' packed CPU path cannot take this ``Linear4bit`` (None when it can): the repack needs
    a 2-D weight, out_features (N) a multiple of 32, in_features (K) a multiple of the quantization block
    (the block scales are reshaped to [N, K / blocksize]) and even (two codes per byte)."""
    qs = getattr(module.weight, "quant_state", None)
    shape = tuple(qs.shape) if qs is not None else (module.out_features, module.in_features)
    block = qs.blocksize if qs is not None else module.weight.blocksize
    if len(shape) != 2:
        return f"weight shape {list(shape)} is not 2-D"
    n, k = shape
    if n % BNB_PACK_ROWS:
        return f"N={n} is not a multiple of {BNB_PACK_ROWS}"
    if k % block or k % 2:
        return f"K={k} is not a multiple of the block size {block}"
    return None


def route_bnb_cpu(model: nn.Module, cpu_path: str = "auto") -> dict[str, BnbRoute]:
    """Decide the CPU path of each bitsandbytes linear of ``model`` and set each ``Linear4bit``'s flag so that
    bitsandbytes takes it. Call it before the first forward (the packed path repacks the weight at the first
    inference forward, in place). Returns {module name: BnbRoute(path, why)}.

    ``cpu_path``: "auto" keeps bitsandbytes' own choice (the module's flag, set from the CPU's AVX512-BF16)
    where the fused kernel is registered, and sends a layer the repack cannot take (``bnb_packed_obstacle``)
    to the dequantize path; "dequantize" sends every 4-bit layer there; "packed" asks for the packed path on
    every 4-bit layer and is refused (ValueError) on a CPU without the fused kernel (there it would compute
    wrong numbers) or when a layer cannot be repacked. Training mode or an input that needs grad always
    dequantizes (bitsandbytes' rule). Layers on another device keep their device's kernels and report its type
    (a choice other than "auto" is refused for them); int8 layers (``Linear8bitLt``) have one CPU path,
    reported with the matmul it uses."""
    import bitsandbytes as bnb
    one_of(cpu_path, "cpu_path", BNB_CPU_PATHS)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    four = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    on_cpu = {n: m for n, m in four.items() if m.weight.device.type == "cpu"}
    elsewhere = sorted({m.weight.device.type for m in four.values()} - {"cpu"})
    if cpu_path != "auto" and elsewhere:
        raise ValueError(f"cpu_path={cpu_path!r} chooses between the CPU paths, but 4-bit layers are on "
                         f"{', '.join(elsewhere)}: leave cpu_path='auto' there")
    kernel = bnb_packed_cpu_kernel()
    if cpu_path == "packed":
        if on_cpu and not kernel:
            raise ValueError("cpu_path='packed' needs bitsandbytes' fused 4-bit CPU kernel, registered only on a "
                             "CPU with AVX512-BF16, and this CPU lacks it (the repacked weights would be read "
                             "wrongly); use cpu_path='auto' or 'dequantize'")
        blocked = {n: why for n, m in on_cpu.items() if (why := bnb_packed_obstacle(m))}
        if blocked:
            raise ValueError(f"cpu_path='packed': {len(blocked)} layer(s) cannot be repacked: "
                             + "; ".join(f"{n}: {w}" for n, w in list(blocked.items())[:4])
                             + ("; ..." if len(blocked) > 4 else "") + ". Use cpu_path='auto' to send them "
                             "to the dequantize path")
    routes: dict[str, BnbRoute] = {}
    for n, m in model.named_modules():
        if isinstance(m, bnb.nn.Linear8bitLt):
            dev = m.weight.device.type
            routes[n] = BnbRoute("int8", bnb_int8_cpu_matmul()) if dev == "cpu" else BnbRoute(dev, f"{dev} kernels")
        if n not in four:
            continue
        if n not in on_cpu:
            dev = m.weight.device.type
            routes[n] = BnbRoute(dev, f"{dev} kernels (the CPU paths do not apply)")
            continue
        packed_now = getattr(m.weight.quant_state, "packing_format_for_cpu", False)
        obstacle = bnb_packed_obstacle(m)
        if cpu_path == "packed":
            path, why = "packed", "asked for"
        elif cpu_path == "dequantize":
            path, why = "dequantize", "asked for"
        elif not kernel:
            path, why = "dequantize", "bitsandbytes' choice on this CPU: no AVX512-BF16 fused kernel"
        elif not m.support_avx512bf16_for_cpu:
            path, why = "dequantize", "bitsandbytes' choice: the module's flag support_avx512bf16_for_cpu is off"
        elif obstacle:
            path, why = "dequantize", f"the packed path cannot take it: {obstacle}"
        else:
            path, why = "packed", "bitsandbytes' choice on this CPU: it has AVX512-BF16"
        if packed_now and path != "packed":
            raise ValueError(f"{n} was already repacked for the packed path by an earlier forward: route the "
                             "model before its first forward (bitsandbytes' way back re-quantizes the scales)")
        m.support_avx512bf16_for_cpu = path == "packed"
        routes[n] = BnbRoute(path, why)
    return routes


def bnb_linear(linear: nn.Linear, mode: str) -> nn.Module:
    """bitsandbytes' module for one ``nn.Linear`` (a copy of its weight), as transformers' integration builds
    it: ``Linear8bitLt`` (``mode`` "int8", threshold 6) or ``Linear4bit`` ("nf4", double quantization, fp32
    compute), quantized as it is moved to the linear's device. Its 4-bit CPU path is not decided yet: pass it
    (or the model holding it) to ``route_bnb_cpu`` before its first forward."""
    import bitsandbytes as bnb
    one_of(mode, "mode", ("int8", "nf4"))
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
    w = linear.weight.data.clone()
    bias = linear.bias is not None
    if mode == "int8":
        new = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias, has_fp16_weights=False,
                                  threshold=6.0)
        new.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        new = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias, compute_dtype=torch.float32,
                                quant_type="nf4", compress_statistics=True)
        new.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True)
    if bias:
        new.bias = nn.Parameter(linear.bias.data.clone(), requires_grad=False)
    return new.to(linear.weight.device)


def _swap_bnb(model: nn.Module, mode: str) -> nn.Module:
    """What transformers' bitsandbytes integration does: replace each nn.Linear (but lm_head) by
    ``bnb_linear(linear, mode)``."""
    for n, m in named_linears(model).items():
        replace_module(model, n, bnb_linear(m, mode))
    return model


def load_bnb(mode: str, name: str = "tiny", device: str = "cpu", fallback: bool = True, cpu_path: str = "auto"):
    """The bundled model through transformers with ``BitsAndBytesConfig`` (``mode`` "int8": LLM.int8 with
    threshold 6; "nf4": 4-bit NF4 with double quantization, fp32 compute).

    Returns (model, info) with info["route"]: "transformers" when ``from_pretrained(...,
    quantization_config=...)`` works; otherwise (transformers 5 insists on ``accelerate`` for bitsandbytes,
    even on a CPU) and with ``fallback``, the same bitsandbytes modules put in by hand into the fp32 HF model,
    with info["refused"] holding transformers' message. Without ``fallback`` the refusal is raised.
    Either way the model goes through ``route_bnb_cpu(model, cpu_path)`` ("auto", "packed", "dequantize": the
    4-bit CPU path; int8 has one) and info["cpu_paths"] holds its answer, {module name: BnbRoute}."""
    one_of(mode, "mode", ("int8", "nf4"))
    one_of(cpu_path, "cpu_path", BNB_CPU_PATHS)
    if mode == "int8" and cpu_path != "auto":
        raise ValueError(f"cpu_path={cpu_path!r} chooses between the 4-bit CPU paths; mode='int8' has one: "
                         "leave cpu_path='auto'")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    path = str(bundled_path(name))
    cfg = (BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0) if mode == "int8" else
           BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.float32))
    try:
        extra = {} if str(device) == "cpu" else {"device_map": device}
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg, **extra)
        info = {"route": "transformers", "refused": None}
    except (ImportError, ValueError) as e:
        if not fallback:
            raise
        model = _swap_bnb(AutoModelForCausalLM.from_pretrained(path).to(device), mode)
        info = {"route": "bitsandbytes modules swapped in by hand", "refused": f"{type(e).__name__}: {e}"}
    model.eval()
    info["cpu_paths"] = route_bnb_cpu(model, cpu_path)
    return model, info


class _Once:
    def __init__(self):
        self.seen = set()

    def filter(self, record):
        key = record.getMessage()
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def bnb_resident_bytes(model: nn.Module) -> int:
    """Bytes the bitsandbytes 4-bit linears of ``model`` hold in memory now: codes, block scales, the scales'
    own statistics (double quantization), code tables and biases, each storage once. Unlike
    ``state_dict_bytes`` it reads the modules as they are: ``state_dict()`` converts a repacked layer back to
    bitsandbytes' plain layout (re-quantizing its scales) before it is counted."""
    import bitsandbytes as bnb
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, torch.Tensor):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            add(m.weight.data)
            add(m.bias)
            qs = m.weight.quant_state
            for obj in (qs, getattr(qs, "state2", None)):
                for attr in ("absmax", "code", "offset"):
                    add(getattr(obj, attr, None))
    return total


def bnb_rows(name: str = "tiny", texts=None, device: str = "cpu", cpu_path: str = "auto") -> list[dict]:
    """fp32 vs bitsandbytes int8 vs NF4 (double quant): measured bytes (the state dict, bitsandbytes' plain
    layout, measured before any forward) and held-out bits per byte; "paths" counts the layers per CPU path
    (``route_bnb_cpu``; ``cpu_path`` applies to the NF4 model)."""
    import logging
    from collections import Counter

    from transformers import AutoModelForCausalLM
    # bitsandbytes logs its fp32 -> fp16 cast note on every int8 matmul: keep the first, drop the repeats
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(_Once())
    texts = texts or heldout_texts(4, 1500)
    _, tok = load(name, device="cpu", verbose=False)
    fp = AutoModelForCausalLM.from_pretrained(str(bundled_path(name))).to(device).eval()
    rows = [{"method": "fp32 (transformers)", "bytes": state_dict_bytes(fp), "bpb": heldout_bpb(fp, tok, texts),
             "route": "transformers", "paths": {}}]
    for mode in ("int8", "nf4"):
        m, info = load_bnb(mode, name, device, cpu_path=cpu_path if mode == "nf4" else "auto")
        rows.append({"method": f"bitsandbytes {mode}" + (" + double quant" if mode == "nf4" else ""),
                     "bytes": state_dict_bytes(m), "bpb": heldout_bpb(m, tok, texts), "route": info["route"],
                     "refused": info["refused"],
                     "paths": dict(Counter(r.path for r in info["cpu_paths"].values()))})
    return rows


__all__ += ["train_batches", "qat_vs_ptq", "sensitivity_bpb", "BNB_CPU_PATHS", "BnbRoute", "bnb_packed_cpu_kernel",
            "bnb_int8_cpu_matmul", "bnb_packed_obstacle", "route_bnb_cpu", "bnb_linear", "load_bnb",
            "bnb_resident_bytes", "bnb_rows"]
