"""Module 12's capstone: the course's optimizations stacked on one model, measured in one run, attributed.

    from course_lib.capstone import run_capstone, attribution_table, waterfall, hardware_choice
    steps = run_capstone(model, draft, prompts, max_new_tokens=32)   # [Step(name, tokens, seconds, note)]
    rows = attribution_table([s.name for s in steps], [s.seconds / s.tokens for s in steps], price_per_hour=2.0)
    waterfall(rows)                                # each step's share of the total speed-up, as a plot
    hardware_choice(["llama-2-7b", "llama-2-70b"])  # tokens/s and $/1M tokens on T4 ... H200 (roofline)

The steps (each keeps what came before where the code allows it; the note says what runs):

1. **no cache**: every token recomputes the whole prefix (``generate(cache=None)``);
2. **KV cache** (Module 05): ``cache="contiguous"``;
3. **static cache + compile** (this module): ``generate(compile=True)``: one compiled decode step;
4. **int8 weights** (Module 03): ``INT8_STEP``, the fused int8 weight-only linears, decoded eagerly
   with a contiguous cache (its tokens may differ from the float model's: it is a different model);
5. **speculative** (Module 08): the bundled ``tiny-draft`` proposes, the target verifies (runs eager with a
   contiguous cache: ``draft=`` does not compile);
6. **continuous batching** (Module 09): all prompts at once through ``course_lib.serving.Engine`` (paged KV,
   Module 06): the only step that serves many requests together, so its tokens/s is the aggregate.

Steps 1-5 run the prompts one after the other (one user); their tokens/s is tokens / wall time.

**Attribution.** Speed-ups multiply, so they are attributed on a log scale: step i's share of the total is
``log(s_i) / log(S)`` with ``s_i = t_{i-1} / t_i`` (time per token before / after the step) and ``S = t_0 /
t_n`` the product of all ``s_i``. The shares add up to 1; a step that slows things down has a negative share.
The cost per 1M tokens at each step is Module 00's formula, ``course_lib.perf.metrics.cost_per_million_tokens``
(price per hour / tokens per hour).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from course_lib.generation import _model_device, generate
from course_lib.models import as_config
from course_lib.paged import blocks_needed
from course_lib.perf.hardware import get_gpu
from course_lib.perf.metrics import cost_per_million_tokens
from course_lib.perf.roofline import MEMORY_BOUND, decode_step
from course_lib.perf.timing import timed_call
from course_lib.quant.transform import to_fast_weight_only
from course_lib.serving.engine import Engine
from course_lib.serving.request import SamplingParams
from course_lib.validate import integer

__all__ = ["Step", "STEP_NAMES", "INT8_STEP", "run_capstone", "attribution_table", "waterfall", "hardware_choice",
           "GPU_PRICES", "int8_weights"]

STEP_NAMES = ("no cache", "KV cache", "static cache + compile", "int8 weights", "speculative (tiny-draft)",
              "continuous batching")

# --- int8 weights: Module 03's fused weight-only int8 linears ---------------------------------------------
def int8_weights(model):
    """A copy of ``model`` whose linears (but the tied lm_head) are torch's fused int8 weight-only linears
    (``quant.fast.Int8WeightOnlyLinear``: per-channel scales, prefills through dequantize + matmul); the
    original stays float for the other steps. Decoded eagerly with a contiguous KV cache."""
    return to_fast_weight_only(copy.deepcopy(model), 8)


INT8_STEP = int8_weights   # None skips the step (reported as skipped, left out of the chain)


@dataclass
class Step:
    name: str
    tokens: int          # tokens generated in the step's run
    seconds: float       # wall time of the run
    note: str = ""
    skipped: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def _sequential(model, prompts, n, **kw):
    """Generate each prompt alone; (tokens, seconds, outputs). The first prompt is run once untimed first
    (warm-up: allocator, lazy init, and for compile=True the compile itself)."""
    generate(model, prompts[0], n, **kw)
    outs, total = [], 0.0
    for p in prompts:
        out, dt = timed_call(lambda: generate(model, p, n, **kw), device=_model_device(model))
        outs.append(out)
        total += dt
    return sum(len(o.tokens) for o in outs), total, outs


@torch.inference_mode()
def run_capstone(model, draft, prompts, max_new_tokens: int = 32, steps=STEP_NAMES, progress: bool = True,
                 max_batch: int = 16) -> list[Step]:
    """Measure each step of STEP_NAMES (a subset may be given, in that order) on `prompts` (lists of token
    ids), in one run. Greedy throughout; every step's tokens are checked against the KV-cache step's
    (the optimizations must not change the output), except where a float near-tie may flip a token
    (speculative and batched paths compare exactly on a CPU in fp32)."""
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise ValueError("prompts must not be empty")
    max_new_tokens = integer(max_new_tokens, "max_new_tokens", low=1)
    unknown = [s for s in steps if s not in STEP_NAMES]
    if unknown:
        raise ValueError(f"unknown steps {unknown}; the steps are {list(STEP_NAMES)}")
    from tqdm.auto import tqdm  # notebook-aware progress bar
    n = max_new_tokens
    results, ref = [], None
    for name in tqdm(list(steps), desc="capstone", disable=not progress, leave=False):
        note, skipped = "", False
        if name == "no cache":
            tokens, secs, outs = _sequential(model, prompts, n, cache=None)
        elif name == "KV cache":
            tokens, secs, outs = _sequential(model, prompts, n, cache="contiguous")
        elif name == "static cache + compile":
            tokens, secs, outs = _sequential(model, prompts, n, compile=True)
            note = "first call compiles (not timed)"
        elif name == "int8 weights":
            if INT8_STEP is None:
                results.append(Step(name, 0, float("nan"), "skipped: no int8 transform "
                                    "(course_lib.capstone.INT8_STEP is None)", True))
                continue
            qmodel = INT8_STEP(model)
            generate(qmodel, prompts[0], 2, cache="contiguous")        # warm-up (kernel probes), not timed
            tokens, secs, outs = _sequential(qmodel, prompts, n, cache="contiguous")
            note = "fused int8 weight-only linears, eager, contiguous cache"
        elif name == "speculative (tiny-draft)":
            if draft is None:
                results.append(Step(name, 0, float("nan"), "skipped: no draft model given", True))
                continue
            tokens, secs, outs = _sequential(model, prompts, n, cache="contiguous", draft=draft)
            note = "draft= runs eager, contiguous cache"
        else:  # continuous batching
            per_prompt = blocks_needed(max(map(len, prompts)) + n, 16) + 1
            eng = Engine(model, num_blocks=max(64, len(prompts) * per_prompt), block_size=16, max_batch=max_batch)
            eng.generate(prompts[:1], SamplingParams(max_new_tokens=2))     # warm-up
            eng = Engine(model, num_blocks=eng.num_blocks, block_size=16, max_batch=max_batch)
            outs_b, secs = timed_call(lambda: eng.generate(prompts, SamplingParams(max_new_tokens=n)),
                                      device=_model_device(model))
            tokens = sum(len(o.token_ids) for o in outs_b)
            outs = [o.token_ids for o in outs_b]
            note = f"{len(prompts)} prompts at once, max_batch={max_batch} (aggregate tokens/s)"
        toks = [o if isinstance(o, list) else o.tokens.tolist() for o in outs]
        if name == "KV cache":
            ref = toks
        elif ref is not None and toks != ref and name != "int8 weights":
            note += "; WARNING: tokens differ from the KV-cache run"
        results.append(Step(name, tokens, secs, note.lstrip("; "), skipped))
    return results


def attribution_table(names, seconds_per_token, price_per_hour: float | None = None) -> list[dict]:
    """One row per step: its time per token, tokens/s, speed-up over the previous step and over the first,
    its share of the total (log) speed-up, and with `price_per_hour` the cost per 1M tokens. NaN times
    (skipped steps) get a row with no speed-up and are left out of the chain."""
    names, spt = list(names), [float(x) for x in seconds_per_token]
    if len(names) != len(spt) or not names:
        raise ValueError(f"names and seconds_per_token must be non-empty and the same length, got {len(names)} "
                         f"and {len(spt)}")
    if any(not math.isnan(x) and x <= 0 for x in spt):
        raise ValueError("seconds_per_token must be > 0 (or NaN for a skipped step)")
    live = [x for x in spt if not math.isnan(x)]
    if not live:
        raise ValueError("every step is skipped (all NaN)")
    total = live[0] / live[-1]
    rows, prev = [], None
    for name, x in zip(names, spt):
        row = {"step": name, "s_per_token": x, "tokens_per_s": 1 / x if not math.isnan(x) else float("nan"),
               "speedup": float("nan"), "cumulative": float("nan"), "share": float("nan")}
        if not math.isnan(x):
            row["speedup"] = 1.0 if prev is None else prev / x
            row["cumulative"] = live[0] / x
            row["share"] = (0.0 if prev is None else math.log(prev / x) / math.log(total)) if total != 1 else 0.0
            prev = x
        if price_per_hour is not None:
            row["usd_per_1M"] = cost_per_million_tokens(price_per_hour, 1 / x) if not math.isnan(x) else float("nan")
        rows.append(row)
    return rows


def waterfall(rows, ax=None, title: str = "Where the speed-up comes from"):
    """A waterfall of the cumulative speed-up (log scale): each bar rises from the previous step's total to
    its own, labelled with its own factor. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    live = [r for r in rows if not math.isnan(r["cumulative"])]
    level = 1.0
    for i, r in enumerate(live):
        lo, hi = sorted((level, r["cumulative"]))
        color = "tab:gray" if i == 0 else ("tab:green" if r["speedup"] >= 1 else "tab:red")
        ax.bar(i, hi / lo if hi > lo else 1.02, bottom=lo, color=color, edgecolor="black", width=0.6)
        ax.text(i, hi * 1.05, "1x" if i == 0 else f"x{r['speedup']:.2f}", ha="center", va="bottom", fontsize=9)
        level = r["cumulative"]
    ax.set_yscale("log")
    ax.set_xticks(range(len(live)), [r["step"] for r in live], rotation=20, ha="right")
    ax.set_ylabel("speed-up over 'no cache' (log)")
    ax.set_title(title)
    ax.figure.tight_layout()
    return ax


# Assumed on-demand prices, $/GPU-hour (late-2025 public cloud list prices vary by 2x across providers and
# regions: put in your own). They are inputs, not facts of the hardware.
GPU_PRICES = {"T4": 0.35, "L4": 0.80, "A100-80GB": 1.80, "H100-SXM": 3.00, "H200": 3.80}


def hardware_choice(models=("llama-2-7b", "llama-2-70b"), gpus=tuple(GPU_PRICES), dtype="fp16", batch: int = 1,
                    context: int = 2048, prices: dict | None = None, memory_headroom: float = 0.9) -> list[dict]:
    """Tokens/s and $ per 1M tokens of decoding `model` on each GPU, from the roofline model.

    Assumptions (stated in each row): the weights in `dtype`, split over the fewest GPUs whose memory
    (times `memory_headroom`) holds weights + the KV cache of `batch` sequences of `context` tokens; the GPUs
    work as one (tensor parallel with no communication cost: an upper bound); a decode step takes
    max(bytes moved / bandwidth, FLOPs / peak) with bytes = weights + KV cache read once and FLOPs =
    2 x params x batch (``course_lib.perf.decode_step``, the course's one decode-step model); `batch` tokens
    per step. Price: `prices` (default GPU_PRICES) x GPUs."""
    prices = dict(GPU_PRICES if prices is None else prices)
    batch = integer(batch, "batch", low=1)
    rows = []
    for m in models:
        cfg = as_config(m)
        for g in gpus:
            d = get_gpu(g)
            if d.name not in prices:
                raise ValueError(f"no price for {d.name}: give prices={{{d.name!r}: $/hour}}")
            whole = decode_step(cfg, d, dtype, batch=batch, context=context)            # on one GPU
            n_gpu = max(1, math.ceil((whole.weight_bytes + whole.kv_bytes) / (d.memory_gb * 1e9 * memory_headroom)))
            step = decode_step(cfg, d, dtype, batch=batch, context=context, gpus=n_gpu)
            tps = batch / step.time
            rows.append({"model": m, "gpu": d.name, "gpus": n_gpu, "batch": batch, "step_ms": step.time * 1e3,
                         "bound": "memory" if step.bound == MEMORY_BOUND else "compute", "tokens_per_s": tps,
                         "usd_per_hour": prices[d.name] * n_gpu,
                         "usd_per_1M": cost_per_million_tokens(prices[d.name] * n_gpu, tps)})
    return rows
