"""The roofline model: how fast an operation can possibly run on a device.

An op with arithmetic intensity I (FLOP per byte moved) on a device with peak P (FLOP/s) and memory
bandwidth W (bytes/s) runs at most at

    attainable(I) = min(P, I * W)                        FLOP/s

The two lines meet at the ridge point I* = P / W. Below it the op is memory-bound (time = bytes / W),
above it compute-bound (time = FLOPs / P); either way its time is at least max(FLOPs / P, bytes / W).

    from course_lib.perf import ridge_point, attainable_flops, classify, min_decode_latency
    ridge_point("A100-80GB", "fp16")                       # 153 FLOP/byte
    min_decode_latency(6.74e9, "A100-80GB", "fp16")        # 6.6 ms: read every fp16 weight once
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from course_lib.models.config import as_config
from course_lib.perf.hardware import DeviceSpec, bytes_per_element, get_gpu
from course_lib.perf.intensity import intensity_table
from course_lib.perf.ops import OpTable
from course_lib.perf.tables import format_table, si
from course_lib.validate import integer, number

MEMORY_BOUND, COMPUTE_BOUND = "memory-bound", "compute-bound"


def _device(device) -> DeviceSpec:
    return get_gpu(device)  # a DeviceSpec passes through, a name is looked up (ValueError if unknown)


def ridge_point(device, dtype="fp16") -> float:
    """The intensity (FLOP/byte) where the roofline bends: peak FLOP/s / bandwidth bytes/s."""
    d = _device(device)
    return d.peak_flops(dtype) / d.bandwidth


def attainable_flops(intensity, device, dtype="fp16"):
    """min(peak, intensity * bandwidth) in FLOP/s; intensity may be a number or an array."""
    d = _device(device)
    x = np.asarray(intensity, dtype=float)
    if np.any(~(x >= 0)):
        raise ValueError(f"intensity must be >= 0, got {intensity!r}")
    out = np.minimum(d.peak_flops(dtype), x * d.bandwidth)
    return float(out) if out.ndim == 0 else out


def classify(intensity, device, dtype="fp16") -> str:
    """'memory-bound' below the ridge point, 'compute-bound' at or above it."""
    if intensity is None:
        return MEMORY_BOUND  # moves data, computes nothing
    if not intensity >= 0:
        raise ValueError(f"intensity must be >= 0, got {intensity!r}")
    return COMPUTE_BOUND if intensity >= ridge_point(device, dtype) else MEMORY_BOUND


def roofline_time(flops, nbytes, device, dtype="fp16") -> float:
    """Lower bound on an op's time: max(FLOPs / peak, bytes / bandwidth) seconds."""
    d = _device(device)
    if flops < 0 or nbytes < 0:
        raise ValueError(f"flops and nbytes must be >= 0, got {flops!r}, {nbytes!r}")
    return max(flops / d.peak_flops(dtype), nbytes / d.bandwidth)


@dataclass
class RooflineRow:
    name: str
    kind: str
    count: int
    flops: float
    bytes: float
    intensity: float | None
    attainable: float          # FLOP/s
    bound: str
    time: float                # seconds for all `count` runs


@dataclass
class RooflineAnalysis:
    """Every op of an OpTable placed on a device's roofline; `time` sums the ops' lower bounds."""
    table: OpTable
    device: DeviceSpec
    dtype: str
    rows: list = field(default_factory=list)

    @property
    def time(self) -> float:
        return sum(r.time for r in self.rows)

    @property
    def ridge(self) -> float:
        return ridge_point(self.device, self.dtype)

    def share(self, bound: str = MEMORY_BOUND) -> float:
        """Fraction of the predicted time spent in ops with this bound."""
        t = self.time
        return sum(r.time for r in self.rows if r.bound == bound) / t if t else 0.0

    def __getitem__(self, name):
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def _table(self):
        head = ["op", "count", "FLOP/byte", "attainable", "bound", "time", "share"]
        T = self.time
        rows = [[r.name, str(r.count), "-" if r.intensity is None else f"{r.intensity:.3g}",
                 si(r.attainable, "FLOP/s"), r.bound, si(r.time, "s"), f"{r.time / T:.1%}"] for r in self.rows]
        rows.append(["total", "", f"{self.table.intensity:.3g}", "", f"{self.share():.0%} of time memory-bound",
                     si(T, "s"), "100%"])
        note = (f"{self.table.caption()} on {self.device.name} ({self.dtype}, ridge {self.ridge:.3g} FLOP/byte); "
                f"time = max(FLOPs/peak, bytes/bandwidth) per op, summed")
        return head, rows, note

    def to_markdown(self):
        return format_table(*self._table()[:2], "markdown", note=self._table()[2])

    def to_html(self):
        return format_table(*self._table()[:2], "html", note=self._table()[2])

    def to_text(self):
        return format_table(*self._table()[:2], "text", note=self._table()[2])

    def _repr_html_(self):
        return self.to_html()

    def __str__(self):
        return self.to_text()

    def __repr__(self):
        return (f"RooflineAnalysis({self.table!r} on {self.device.name}, {self.dtype}: "
                f"{self.time * 1e3:.4g} ms, {self.share():.0%} memory-bound)")


def _peak_dtype(table: OpTable, device: DeviceSpec, dtype):
    if dtype is not None:
        return dtype
    if table.dtype in device.peak_tflops:
        return table.dtype
    return device.default_dtype


def analyze(table: OpTable, device, dtype=None) -> RooflineAnalysis:
    """Place each op of `table` on `device`'s roofline for `dtype` (default: the table's dtype, or the
    device's default when it has no rate for it, e.g. fp32 on a measured CPU)."""
    if not isinstance(table, OpTable) or table.mode != "real":
        raise ValueError("table must be an OpTable from intensity_table(..., mode='real')")
    d = _device(device)
    dt = _peak_dtype(table, d, dtype)
    peak, bw = d.peak_flops(dt), d.bandwidth
    rows = []
    for r in table.rows:
        I = r.intensity
        att = min(peak, I * bw) if I is not None else 0.0
        t = max(r.flops / peak, r.bytes / bw) * r.count
        rows.append(RooflineRow(r.name, r.kind, r.count, r.flops, r.bytes, I, att,
                                classify(I, d, dt), t))
    return RooflineAnalysis(table, d, str(dt), rows)


def predict_time(model, device, phase: str, seq_len: int, batch: int = 1, dtype="fp16", **kw) -> float:
    """Roofline lower bound (seconds) of one prefill of seq_len tokens or one decode step after seq_len
    cached tokens: the sum over ops of max(FLOPs/peak, bytes/bandwidth)."""
    return analyze(intensity_table(model, phase, seq_len, batch, dtype, **kw), device).time


@dataclass(frozen=True)
class DecodeStep:
    """One decode step on the roofline, per GPU: the bytes it reads, the FLOPs it does, and its best time.

    time = max(memory_s, compute_s) with memory_s = (weight_bytes + kv_bytes) / bandwidth and compute_s =
    flops / peak; peak None leaves the compute floor out (a memory-only model, compute_s = 0).
    """
    weight_bytes: float     # bytes of weights read in the step
    kv_bytes: float         # bytes of KV cache read in the step
    flops: float            # FLOPs of the step
    bandwidth: float        # bytes/s
    peak: float | None      # FLOP/s, or None

    @property
    def memory_s(self) -> float:
        return (self.weight_bytes + self.kv_bytes) / self.bandwidth

    @property
    def compute_s(self) -> float:
        return 0.0 if self.peak is None else self.flops / self.peak

    @property
    def time(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        """Compute-bound when the arithmetic takes at least as long as the traffic: a tie is compute-bound, as
        ``classify`` calls an intensity at the ridge point (no peak: memory-bound)."""
        if self.peak is not None and self.compute_s >= self.memory_s:
            return COMPUTE_BOUND
        return MEMORY_BOUND


def decode_step(model, device, dtype="fp16", batch: int = 1, context: int = 0, gpus: int = 1,
                kv_bytes: float | None = None) -> DecodeStep:
    """The course's one model of a decode step's time (Module 01's roofline applied to a whole step).

    A step of `batch` sequences, each attending to `context` cached tokens, reads every weight once and
    each sequence's KV cache once, and does 2 x params FLOPs per sequence (one multiply-add per weight).
    "Every weight" is the rule of thumb, `num_parameters`: an untied input embedding is only looked up (a row
    per token), so for an untied model this counts V x D weights more than a step reads (Llama-2-7B: 6.74e9
    against 6.61e9); ``models.config.decode_reads`` counts the reads exactly, where the difference matters.
    Attention's own FLOPs (4 x heads x head_dim x context per layer) are left out: they come to about
    heads / kv_heads FLOP per byte of fp16 KV read, far below any ridge point: their time is the KV bytes'.
    Split over `gpus` GPUs working as one (no communication: a bound):

        time = max((weights + KV) / (bandwidth x gpus), 2 x params x batch / (peak x gpus))

    model: a parameter count, or anything as_config takes (a LlamaConfig, a preset name, a course model).
    dtype: the weights' and the KV cache's number format (a name, or a number of bytes); the peak rate is
    the device's for `dtype`, or its default rate when it has none for it (int4 weights compute in fp16).
    kv_bytes: the KV bytes read, given directly (default: the config's KV cache of batch x context tokens,
    ``LlamaConfig.kv_cache_bytes``, the one KV formula; a bare parameter count needs kv_bytes or context=0).
    Callers: ``min_decode_latency`` (its memory side), ``serving.StepCostModel.from_roofline`` (its
    coefficients), ``capstone.hardware_choice``, ``parallel.cost.tp_step_time`` (per-GPU bytes, memory only).
    """
    batch, context = integer(batch, "batch", low=1), integer(context, "context", low=0)
    gpus = integer(gpus, "gpus", low=1)
    d = _device(device)
    bpe = bytes_per_element(dtype)
    if isinstance(model, numbers.Real) and not isinstance(model, bool):
        params, cfg = number(model, "model (a parameter count)", 0, low_open=True, finite=False), None
    else:
        cfg = as_config(model)
        params = cfg.num_parameters()
    if kv_bytes is None:
        if cfg is None and context:
            raise ValueError("context > 0 needs a model config for the KV formula, or kv_bytes given directly; "
                             f"got a bare parameter count {model!r}")
        kv_bytes = 0 if cfg is None else cfg.kv_cache_bytes(context, batch, bpe)
    else:
        kv_bytes = number(kv_bytes, "kv_bytes", 0, finite=False)
    peak_dtype = _peak_dtype_of(device, dtype, None)
    if not d.supports(peak_dtype):
        peak_dtype = d.default_dtype
    return DecodeStep(weight_bytes=params * bpe / gpus, kv_bytes=kv_bytes / gpus, flops=2 * params * batch / gpus,
                      bandwidth=d.bandwidth, peak=d.peak_flops(peak_dtype))


def min_decode_latency(num_params, device, dtype="fp16", kv_cache_bytes: float = 0) -> float:
    """Seconds per decode step at best: every weight is read once per step (plus the KV cache).

    The memory side of ``decode_step`` (at batch 1 the compute side is far below it).
    num_params: a parameter count, or a model (anything as_config takes: LlamaConfig, name) to count them from.
    dtype: bytes per weight, as a dtype name or a number.
    E.g. a 7B model in fp16 on an A100 80 GB: 6.74e9 * 2 bytes / 2.039e12 B/s = 6.6 ms.
    """
    kv_cache_bytes = number(kv_cache_bytes, "kv_cache_bytes", 0, finite=False)
    if isinstance(num_params, numbers.Real):
        number(num_params, "num_params", 0, low_open=True, finite=False)
    return decode_step(num_params, device, dtype, kv_bytes=kv_cache_bytes).memory_s


def decode_step_critical_batch(model, device, dtype="fp16", context: int = 0, gpus: int = 1,
                               kv_bytes: float | None = None) -> float:
    """The batch B* at which ``decode_step`` turns compute-bound with the KV cache's reads included: its
    compute floor (2 x params x B FLOPs at the peak) reaches its memory floor (the weights once, plus each of
    the B sequences' own KV cache, at the bandwidth). Below B* a step costs the weights' read plus B KV reads;
    from B* on, the arithmetic. math.inf when no batch gets there: a sequence whose KV cache takes at least as
    long to read as its 2 x params FLOPs take to compute makes the memory floor grow at least as fast as the
    compute floor, so long contexts keep decoding memory-bound at every batch. The smallest integer batch
    that is compute-bound is max(1, ceil(B*)) (or one less, at an exact tie that rounding puts just above).

    model, device, dtype, context, gpus: as ``decode_step`` (context: the cached tokens each sequence reads);
    kv_bytes: the KV bytes **one** sequence reads, given directly (default: the config's formula at `context`).
    Unlike ``decode_critical_batch`` (the weight matmuls alone, with their activations), this is the whole
    step of ``decode_step``'s model: weights and KV only, attention's own FLOPs left out.
    """
    one = decode_step(model, device, dtype, batch=1, context=context, gpus=gpus, kv_bytes=kv_bytes)
    per_sequence = one.compute_s - one.kv_bytes / one.bandwidth    # what each added sequence adds to the gap
    return math.inf if per_sequence <= 0 else (one.weight_bytes / one.bandwidth) / per_sequence


def matmul_intensity(batch, d_in: int, d_out: int, dtype="fp16", weight_dtype=None):
    """FLOP/byte of a decode weight matmul [batch, d_in] x [d_in, d_out] (batch may be an array)."""
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    b = np.asarray(batch, dtype=float)
    out = 2 * b * d_in * d_out / (a * (b * d_in + b * d_out) + w * d_in * d_out)
    return float(out) if out.ndim == 0 else out


def _solve_batch(R, a, w, W, A) -> float:
    # I(B) = 2 B W / (a B A + w W) = R  ->  B = R w W / (2 W - R a A); never when 2 W <= R a A.
    den = 2 * W - R * a * A
    return math.inf if den <= 0 else R * w * W / den


def _peak_dtype_of(device, dtype, peak_dtype):
    if peak_dtype is not None:
        return peak_dtype
    if isinstance(dtype, numbers.Real):  # a bare number of bytes: the device's main rate
        return _device(device).default_dtype
    return dtype


def critical_batch(d_in: int, d_out: int, device, dtype="fp16", weight_dtype=None, peak_dtype=None) -> float:
    """The batch size B* at which a decode weight matmul [B, d_in] x [d_in, d_out] reaches the ridge
    point (intensity(B*) = peak / bandwidth). Below it decode is memory-bound: the weights are read
    once for the whole batch, so a bigger batch costs almost nothing. math.inf when the matmul can
    never become compute-bound. The smallest integer batch that is compute-bound is max(1, ceil(B*)).

    dtype: bytes per element (a dtype name or a number); peak_dtype: whose peak rate to use (default:
    dtype when it is a name, else the device's default rate).
    """
    d_in = int(number(d_in, "d_in", 0, low_open=True, finite=False))
    d_out = int(number(d_out, "d_out", 0, low_open=True, finite=False))
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    R = ridge_point(device, _peak_dtype_of(device, dtype, peak_dtype))
    return _solve_batch(R, a, w, d_in * d_out, d_in + d_out)


def decode_critical_batch(model, device, dtype="fp16", weight_dtype=None) -> float:
    """critical_batch for all the weight matmuls of one decode step together (projections, MLP,
    LM head): the batch where their combined FLOPs / bytes reach the ridge point. Attention over the
    KV cache is left out: each sequence reads its own cache, so its intensity does not grow with
    the batch (it stays memory-bound at any batch size)."""
    W, A, a, w = decode_matmul_sums(model, dtype, weight_dtype)
    return _solve_batch(ridge_point(device, dtype), a, w, W, A)


def decode_matmul_sums(model, dtype="fp16", weight_dtype=None):
    """(W, A, a, w) for the weight matmuls of one decode step: W = sum k*n (weights), A = sum (k + n)
    (activations in and out per sequence), a / w = bytes per activation / weight element. At batch B
    their combined intensity is I(B) = 2 B W / (a B A + w W)."""
    t = intensity_table(model, "decode", 1, 1, dtype, weight_dtype=weight_dtype)
    mats = [r for r in t.rows if r.kind == "matmul"]
    W = sum(r.count * r.k * r.n for r in mats)
    A = sum(r.count * (r.k + r.n) for r in mats)
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    return W, A, a, w


__all__ = ["MEMORY_BOUND", "COMPUTE_BOUND", "ridge_point", "attainable_flops", "classify", "roofline_time",
           "RooflineRow", "RooflineAnalysis", "analyze", "predict_time", "DecodeStep", "decode_step",
           "decode_step_critical_batch", "min_decode_latency",
           "matmul_intensity", "critical_batch", "decode_critical_batch"]
