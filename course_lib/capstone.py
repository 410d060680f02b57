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

**The final project** (labs/lab13): a student's ``build(model) -> generate_fn`` is checked and timed against
the course's baseline (``baseline_build``: Module 05's KV-cached greedy loop, a fresh ``ContiguousCache`` per
prompt, the prompt prefilled once, then one position per step). ``evaluate_project`` does it in the student's
own process (the lab's visible test): greedy tokens equal to the baseline's on prompts cut from the held-out
corpus (``prompt_stream``, ``project_prompts``; a lossy entry instead decodes its own ``lossy_model`` greedily
within ``BPB_BOUND`` bits per byte of the model on held-out text), then the two interleaved round by round on
new prompts (``perf.timing.interleave``, CPU time on a CPU), the speed-up the geometric mean of the paired
per-round ratios with its 90% interval (``speedup_interval``), and the points ``speed_points`` of the
interval's lower end. ``course grade`` judges the project from outside (judges/lab13.py): the entry in the
student's sandboxed kernel, the same ``baseline_build`` in a clean kernel of the grader's, each call through
``run_entry``, each kernel's CPU time read from its cgroup; a lossy entry's ``model_logits`` scored by the grader.
"""
from __future__ import annotations

import copy
import math
import random
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch

from course_lib.generation import model_device, generate
from course_lib.kvcache import ContiguousCache
from course_lib.models import as_config
from course_lib.models.corpus import load_split
from course_lib.paged import blocks_needed
from course_lib.perf.hardware import get_gpu
from course_lib.perf.metrics import cost_per_million_tokens
from course_lib.perf.quality import bits_per_byte
from course_lib.perf.roofline import MEMORY_BOUND, decode_step
from course_lib.perf.timing import interleave, timed_call
from course_lib.quant.transform import to_fast_weight_only
from course_lib.serving.engine import Engine
from course_lib.serving.request import SamplingParams
from course_lib.validate import integer

__all__ = ["Step", "STEP_NAMES", "INT8_STEP", "run_capstone", "attribution_table", "waterfall", "hardware_choice",
           "GPU_PRICES", "int8_weights", "baseline_build", "prompt_stream", "project_prompts", "speed_points",
           "speedup_interval", "SpeedUp", "evaluate_project", "ProjectResult", "PROJECT_POINTS",
           "PROJECT_CONFIDENCE", "RATIO_FLOOR", "RATIO_FULL", "BPB_BOUND", "run_entry", "state_digest"]

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
        out, dt = timed_call(lambda: generate(model, p, n, **kw), device=model_device(model))
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
                                      device=model_device(model))
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


# --- the final project: a student's generate, checked and timed against the course's baseline ------------
PROJECT_POINTS = 6.0   # the speed points of the project (labs/lab13, Part A)
# The scale, against the cached loop (`baseline_build`): calibrated on the course's 2-core CPU (the bundled tiny,
# 64 + 16 tokens, one thread), where the baseline judged against itself never cleared 1.1 at its interval's lower
# end and the course's reference entry always cleared 1.3. The entries measured for it are in the instructor's
# judge (judges/lab13.py), not here: this module ships to students.
RATIO_FLOOR = 1.1      # at or below: no points (above every lower end the baseline against itself reached)
RATIO_FULL = 1.3       # at or above: every point (under every lower end the reference entry reached);
                       # between, linear in log(speed-up)
BPB_BOUND = 0.05       # a lossy entry's held-out bits per byte may exceed the model's by at most this


def baseline_build(model):
    """The course's baseline entry: Module 05's KV-cached greedy loop, as lean as the course writes it. Each
    call makes a fresh ``ContiguousCache`` (nothing carries over from one prompt to the next), runs the model
    once over the prompt (the prefill), then once per new token on that one position; the argmax stays on the
    model's device and the tokens come to the host once, at the end. Its tokens are ``generate``'s greedy ones.
    The project's template returns it; every entry is timed against it, by the grader (in a clean kernel) and
    by ``evaluate_project`` (in the same process)."""
    device = model_device(model)

    @torch.inference_mode()
    def generate_fn(prompt_ids, max_new_tokens):
        cache = ContiguousCache()                          # per prompt
        x, out = prompt_ids.to(device).view(1, -1), []
        for _ in range(max_new_tokens):
            tok = model(x, cache=cache)[0, -1].argmax()    # the prompt first, then the last token alone
            out.append(tok)
            x = tok.view(1, 1)
        return torch.stack(out).cpu()
    return generate_fn


def _recompute_build(model):
    """Greedy decoding of `model` by recomputing the whole sequence each step (``generate`` without a cache):
    the reference tokens of a lossy entry's ``lossy_model``, which the contract only asks to map token ids
    [1, T] to logits [1, T, vocab] (no cache). Not timed."""
    def generate_fn(prompt_ids, max_new_tokens):
        return generate(model, prompt_ids, max_new_tokens).tokens
    return generate_fn


def prompt_stream(tokenizer, length: int, seed: int | None = None, split: str = "heldout", max_files: int = 60):
    """Prompts of exactly `length` token ids ([length] int64 tensors on the CPU), cut one at a time at random
    places from the corpus' `split` (held-out stdlib source by default, which no bundled model trained on):
    an endless generator, so a grader draws each prompt only when it needs it. `seed` None draws from the
    clock."""
    length = integer(length, "length", low=1)
    rng = random.Random(time.time_ns() if seed is None else seed)
    texts = [t for t in load_split(split, max_files=max_files) if len(t) > 16 * length]
    if not texts:
        raise ValueError(f"no text of the {split!r} split is long enough for prompts of {length} tokens")
    misses = 0
    while True:
        text = rng.choice(texts)
        start = rng.randrange(0, len(text) - 12 * length)
        ids = tokenizer(text[start:start + 12 * length], add_special_tokens=False)["input_ids"][:length]
        if len(ids) == length:
            misses = 0
            yield torch.tensor(ids, dtype=torch.long, device="cpu")
        else:
            misses += 1
            if misses >= 100:
                raise ValueError(f"could not cut a prompt of {length} tokens from the {split!r} split")


def project_prompts(tokenizer, n: int, length: int, seed: int | None = None, split: str = "heldout",
                    max_files: int = 60) -> list[torch.Tensor]:
    """The first `n` prompts of ``prompt_stream(tokenizer, length, seed, split, max_files)``. `seed` None
    draws from the clock."""
    n = integer(n, "n", low=1)
    stream = prompt_stream(tokenizer, length, seed, split, max_files)
    return [next(stream) for _ in range(n)]


PROJECT_CONFIDENCE = 0.90   # the speed-up's interval: the points and the rank come from its lower end


@dataclass(frozen=True)
class SpeedUp:
    """An entry's speed-up over the baseline from paired rounds: ``estimate`` (the geometric mean of the
    per-round ratios), the `confidence` interval ``low``-``high`` around it, and the rounds ``n``."""
    estimate: float
    low: float
    high: float
    n: int
    confidence: float = PROJECT_CONFIDENCE

    def overlaps(self, other: "SpeedUp") -> bool:
        return self.low <= other.high and other.low <= self.high

    def __str__(self) -> str:
        return (f"{self.estimate:.2f}x ({100 * self.confidence:g}% interval {self.low:.2f}-{self.high:.2f}x, "
                f"{self.n} rounds)")


def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else the Cornish-Fisher expansion around
    the normal's (within 1% at df = 3, 0.1% from df = 5 on)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def speedup_interval(ratios, confidence: float = PROJECT_CONFIDENCE) -> SpeedUp:
    """The speed-up of paired rounds (``ratios[r]`` = baseline time / entry time in round r): the geometric
    mean of the ratios and Student's t interval of the mean of their logs, at `confidence` (two-sided). A
    ratio is a product of effects, so its log is what averages; the rounds are paired (the same prompt, the
    same moment of the machine), so the noise they share cancels in each ratio."""
    xs = [math.log(r) for r in ratios if isinstance(r, (int, float)) and math.isfinite(r) and r > 0]
    if len(xs) != len(list(ratios)) or len(xs) < 2:
        raise ValueError(f"ratios must be 2 or more positive finite numbers, got {list(ratios)!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    n, m = len(xs), statistics.fmean(xs)
    half = _t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return SpeedUp(math.exp(m), math.exp(m - half), math.exp(m + half), n, confidence)


def speed_points(ratio: float, points: float = PROJECT_POINTS, floor: float = RATIO_FLOOR,
                 full: float = RATIO_FULL) -> float:
    """The project's scale: 0 at or below `floor` x the baseline's speed, `points` at or above `full`, linear
    in log(speed-up) between (each doubling is worth the same), rounded down to half points. The grader
    passes the lower end of the speed-up's interval (`speedup_interval`), so noise rarely adds a point."""
    if not (0 < floor < full):
        raise ValueError(f"floor and full must satisfy 0 < floor < full, got floor={floor!r}, full={full!r}")
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio)) or ratio <= floor:
        return 0.0
    frac = min(1.0, math.log(ratio / floor) / math.log(full / floor))
    return math.floor(points * frac * 2) / 2


@dataclass
class ProjectResult:
    """One evaluation of a project entry. ``ratios[r]``: baseline seconds / entry seconds in round r (the same
    prompt for both, in the same round; CPU seconds of the process on a CPU, wall seconds on a GPU: `clock`).
    ``outputs`` / ``expected``: the entry's and the reference's tokens on every prompt, checks then timed
    rounds (the reference is the baseline; for a lossy entry, greedy decoding of its ``lossy_model``)."""
    correct: bool
    problem: str
    ratios: list = field(default_factory=list)
    points: float = 0.0
    max_points: float = PROJECT_POINTS
    lossy: bool = False
    bpb: float | None = None           # lossy entries: held-out bits per byte of lossy_model, and the model's
    bpb_model: float | None = None
    baseline_s: float = float("nan")    # median seconds per generation, each side
    entry_s: float = float("nan")
    outputs: list = field(default_factory=list, repr=False)
    expected: list = field(default_factory=list, repr=False)
    clock: str = "cpu"

    @property
    def speed_up(self) -> SpeedUp | None:
        """The statistic the points come from (`speedup_interval`); None with fewer than 2 rounds."""
        return speedup_interval(self.ratios) if len(self.ratios) >= 2 else None

    @property
    def ratio(self) -> float:
        """The speed-up's estimate: the geometric mean of the per-round ratios."""
        return math.exp(statistics.fmean(math.log(r) for r in self.ratios)) if self.ratios else float("nan")

    def describe(self) -> str:
        """Two lines a student reads: correct or why not, then the speed-up with its interval and the points."""
        ok = ("correct: the greedy tokens equal the baseline's" if not self.lossy else
              f"correct (lossy): greedy decoding of lossy_model, {self.bpb:.4f} bits/byte held out vs the model's "
              f"{self.bpb_model:.4f} (bound +{BPB_BOUND})") if self.correct else f"NOT correct: {self.problem}"
        s = self.speed_up
        if s is None:
            return ok
        clock = "CPU time" if self.clock == "cpu" else "wall time"
        return (f"{ok} on {len(self.outputs)} prompts\nspeed-up {s} ({clock}; {self.entry_s * 1e3:.1f} ms vs "
                f"{self.baseline_s * 1e3:.1f} ms per generation); speed points {self.points:g}/{self.max_points:g}"
                + (f" (from the interval's lower end, {s.low:.2f}x)" if self.correct else
                   " (an entry that is not correct scores none)"))


def _token_list(out, n: int) -> tuple[list[int] | None, str]:
    """An entry's output as a list of ints, or None and what is wrong with it."""
    if isinstance(out, torch.Tensor):
        if out.dim() != 1 or out.dtype.is_floating_point:
            return None, f"returned a {out.dtype} tensor of shape {tuple(out.shape)}; expected [{n}] integer token ids"
        out = out.detach().cpu().tolist()
    elif isinstance(out, (list, tuple)):
        out = list(out)
    else:
        return None, f"returned a {type(out).__name__}; expected a 1-D tensor or a list of {n} token ids"
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in out):
        return None, "returned something other than integer token ids"
    if len(out) != n:
        return None, (f"returned {len(out)} tokens for max_new_tokens={n}; expected exactly the {n} new tokens "
                      "(not the prompt, no early stop)")
    return out, ""


@torch.inference_mode()
def model_logits(model, ids) -> torch.Tensor:
    """`model`'s next-token logits at every position of `ids` (a list or 1-D tensor of token ids, one
    sequence): float32 [len(ids), vocab] on the CPU. The project's grader asks a lossy entry's
    ``lossy_model`` for these and scores them itself (bits per byte, greedy tokens)."""
    ids = torch.as_tensor(ids, dtype=torch.long, device=model_device(model)).view(1, -1)
    out = model(ids)
    out = out if isinstance(out, torch.Tensor) else out.logits
    return out[0].float().cpu()


@torch.inference_mode()
def run_entry(generate_fn, prompt_ids, max_new_tokens: int) -> list[int]:
    """One call of a project entry as the grader makes it: under inference_mode, on a copy of the prompt. Its
    tokens as a list of ints; a ValueError says what is wrong with an output that is not `max_new_tokens`
    integer ids."""
    tokens, why = _token_list(generate_fn(prompt_ids.clone(), max_new_tokens), max_new_tokens)
    if why:
        raise ValueError(f"generate_fn {why}")
    return tokens


def state_digest(model) -> str:
    """SHA-256 of a model's weights and buffers (names, dtypes, shapes, bytes): equal digests, equal state."""
    import hashlib
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict(keep_vars=True).items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _globals() -> tuple:
    return torch.get_num_threads(), torch.is_grad_enabled(), torch.get_default_dtype()


@torch.inference_mode()
def evaluate_project(build, model, prompts, max_new_tokens: int, rounds: int = 5, tokenizer=None,
                     heldout: list[str] | None = None) -> ProjectResult:
    """Check and time a project entry against the course's baseline, in this process.

    ``entry = build(model)``, then: the entry and the reference generate on ``prompts[:-rounds]`` (the checks,
    which also warm both up: allocator, lazy init, a compile), then `rounds` interleaved rounds on the last
    `rounds` prompts, each round the baseline and the entry on the same new prompt, the order alternating
    (``perf.timing.interleave``). Every prompt is new to the entry when it is timed: a cache of outputs gains
    nothing. Correct means: every output (checks and timed rounds) equals the reference's tokens, `model`'s
    weights and buffers are unchanged, and torch's threads, grad mode and default dtype are as before. A
    lossy entry (one whose generate_fn has a ``lossy_model`` attribute) is referenced against greedy decoding
    of its ``lossy_model`` (recomputed: the contract asks no cache of it), whose bits per byte on `heldout`
    (default: held-out corpus text; needs `tokenizer`) may exceed `model`'s by at most ``BPB_BOUND``; the
    speed-up is always against the baseline on `model`. Each call is timed by the process's CPU time (all its
    threads) where the model is on the CPU, by the wall clock on a GPU. The result's points are
    ``speed_points`` of the lower end of the speed-up's interval (`speedup_interval`: the grader's statistic;
    the grader times the two in separate processes). A call of the entry that raises makes it incorrect (its
    output None) and the evaluation goes on; `build` raising is raised."""
    prompts = list(prompts)
    rounds = integer(rounds, "rounds", low=1)
    max_new_tokens = integer(max_new_tokens, "max_new_tokens", low=1)
    if len(prompts) < rounds + 1:
        raise ValueError(f"prompts must hold at least rounds + 1 = {rounds + 1} prompts (checks, then one per "
                         f"timed round), got {len(prompts)}")
    if not all(isinstance(p, torch.Tensor) and p.dim() == 1 for p in prompts):
        raise TypeError("prompts must be 1-D tensors of token ids")
    checks, timed = prompts[:-rounds], prompts[-rounds:]
    device = model_device(model)
    before, settings = _state(model), _globals()
    base = baseline_build(model)
    problems: list[str] = []
    with warnings.catch_warnings():     # a warning on stderr would cost the test cell its points (nbgrader)
        warnings.simplefilter("ignore")
        entry = build(model)
        if not callable(entry):
            raise TypeError(f"build(model) must return a callable generate_fn(prompt_ids, max_new_tokens), got "
                            f"{type(entry).__name__}")
        lossy_model = getattr(entry, "lossy_model", None)
        ref = base if lossy_model is None else _recompute_build(lossy_model)
        outputs, expected = [], []

        def run(fn, p):
            try:
                out = fn(p.clone(), max_new_tokens)
            except Exception as e:  # noqa: BLE001 - not correct; the evaluation goes on, so its record says why
                out, why = None, f"raised {type(e).__name__}: {str(e)[:200]}"
            else:
                out, why = _token_list(out, max_new_tokens)
            if why and f"generate_fn {why}" not in problems:
                problems.append(f"generate_fn {why}")
            return out

        for p in checks:
            expected.append(_token_list(ref(p.clone(), max_new_tokens), max_new_tokens)[0])
            outputs.append(run(entry, p))
        seen = {"baseline": [], "entry": []}
        calls = {"baseline": lambda: seen["baseline"].append(base(timed[len(seen["baseline"])].clone(),
                                                                  max_new_tokens)),
                 "entry": lambda: seen["entry"].append(run(entry, timed[len(seen["entry"])]))}
        clock = "cpu" if torch.device(device).type == "cpu" else "wall"
        times = interleave(calls, warmup=0, repeats=rounds, device=device, clock=clock)
        outputs += seen["entry"]
        if lossy_model is None:
            expected += [_token_list(o, max_new_tokens)[0] for o in seen["baseline"]]
        else:
            expected += [_token_list(ref(p.clone(), max_new_tokens), max_new_tokens)[0] for p in timed]
    ratios = [b / e for b, e in zip(times["baseline"].times, times["entry"].times) if e > 0]
    bpb = bpb_model = None
    if lossy_model is not None:
        if tokenizer is None:
            raise ValueError("a lossy entry is checked on held-out text: give evaluate_project a tokenizer")
        texts = heldout if heldout is not None else [t[:1200] for t in load_split("heldout", max_files=4)]
        bpb = bits_per_byte(lossy_model, tokenizer, texts, progress=False)
        bpb_model = bits_per_byte(model, tokenizer, texts, progress=False)
        if not bpb <= bpb_model + BPB_BOUND:
            problems.append(f"lossy_model's held-out bits per byte {bpb:.4f} exceed the model's {bpb_model:.4f} "
                            f"by more than the bound {BPB_BOUND}")
    differ = [k for k, (o, e) in enumerate(zip(outputs, expected)) if o is not None and o != e]
    if differ:   # first: the reason that matters most
        whose = "baseline's" if lossy_model is None else "greedy decoding of lossy_model's"
        problems.insert(0, f"the greedy tokens differ from the {whose} on {len(differ)} of {len(outputs)} prompts "
                           f"(first: prompt {differ[0] + 1})")
    after = _state(model)
    if after.keys() != before.keys() or any(not torch.equal(before[k], after[k]) for k in before):
        problems.append("build or generate_fn changed the model's weights or buffers (copy the model to change it)")
    if _globals() != settings:
        problems.append(f"torch's global settings changed (threads, grad mode, default dtype: {settings} -> "
                        f"{_globals()}); they would change the baseline's time too")
        torch.set_num_threads(settings[0])
        torch.set_grad_enabled(settings[1])
        torch.set_default_dtype(settings[2])
    correct = not problems
    result = ProjectResult(correct, "; ".join(problems), ratios, 0.0, PROJECT_POINTS, lossy_model is not None, bpb,
                           bpb_model, times["baseline"].median, times["entry"].median, outputs, expected, clock)
    result.points = speed_points(result.speed_up.low) if correct and result.speed_up is not None else 0.0
    return result
