# %% [markdown] id="c002"
# # Lab 01 — Where the time goes
#
# In this lab you write the small formulas behind module 01: the FLOPs, bytes and arithmetic intensity
# of a matrix multiplication, the roofline of a device, whether an operation is memory- or
# compute-bound, the fastest possible decode step, and the batch size at which decoding stops being
# memory-bound.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, the grader calls your functions on inputs of its own (drawn for you, and a grid
#   of edge cases), so write the general formula, not the examples' answers.
# * Use plain Python numbers (no need for torch). Units: FLOPs, bytes, seconds, FLOP/s, bytes/s.
# * Exercises marked **contract** give what the function takes, returns and refuses, not the steps: you
#   design them; hints you open on purpose (the ▸ lines) hold a recipe. Exercise 6 is a **prediction**: the
#   time of a decode step on your own device, which the last cell then measures.
#
# 7 exercises: 2 + 2 + 2 + 2 + 2 + 3 + 2 (written, graded by your instructor) = 15 points.

# %% id="c003"
import math
import os

from course_lib.checks import check_close, check_equal, check_raises

# Known misconceptions: when a test finds one of these in your answer, its message names it.
MISTAKES = {
    "flops_mnk": "a matmul counted as m*n*k FLOPs: that is the number of multiply-adds, and each is two "
                 "floating-point operations, so 2*m*n*k (see notebook 01, section '2. The simplified tables, "
                 "reproduced exactly')",
    "critical_weights_only": "the batch comes from the approximation intensity = 2*B / bytes_per_element, which "
                             "counts only the weight's bytes; the activations [B, d_in] and outputs [B, d_out] are "
                             "read and written too, so the intensity grows more slowly and the batch is larger (see "
                             "notebook 01, section '7. Batch size and the ridge point')",
    "decode_weights_per_sequence": "the decode step reads the weights once per sequence (weight bytes x batch); "
                                   "a step reads every weight once for the whole batch, which is why batching "
                                   "helps (see notebook 01, section '7. Batch size and the ridge point')",
    "decode_memory_only": "the decode step's time leaves out the compute floor 2 x params x batch / peak; at a "
                          "large batch the step becomes compute-bound (see notebook 01, section '7. Batch size "
                          "and the ridge point')",
}

# Numbers you will need (dense, from the datasheets; course_lib.perf.GPUS has them all):
A100_FP16_FLOPS = 312e12       # NVIDIA A100 (80 GB SXM): fp16 tensor cores, FLOP/s
A100_BANDWIDTH = 2039e9        # its HBM2e bandwidth, bytes/s
H100_FP16_FLOPS = 989.4e12     # NVIDIA H100 SXM
H100_BANDWIDTH = 3350e9


# %% [markdown] id="c004"
# ## Exercise 1 — FLOPs, bytes and intensity of a matmul (2 points)
#
# A matrix multiplication `[m, k] × [k, n] → [m, n]` does `m·n·k` multiply-adds, and each multiply-add is
# **two** floating-point operations. Assume it reads both inputs from memory once and writes its output
# once; every element takes `bytes_per_element` bytes (4 for fp32, 2 for fp16, 1 for int8, 0.5 for int4).
#
# Write `matmul_cost(m, n, k, bytes_per_element)` returning the tuple `(flops, nbytes, intensity)`, where
# `intensity = flops / nbytes` (FLOP per byte).

# %% id="c005" nbgrader={"grade": false, "grade_id": "matmul_cost", "locked": false, "schema_version": 3, "solution": true, "task": false}
def matmul_cost(m, n, k, bytes_per_element):
    """FLOPs, bytes moved and FLOP/byte of [m, k] x [k, n] -> [m, n]."""
    ### BEGIN SOLUTION
    flops = 2 * m * n * k
    nbytes = bytes_per_element * (m * k + k * n + m * n)
    return flops, nbytes, flops / nbytes
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "matmul_cost_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# A decode step of a 4096-wide projection in fp16: one row times a 4096 x 4096 weight.
flops, nbytes, intensity = matmul_cost(1, 4096, 4096, 2)
check_equal(flops, 33_554_432, "matmul_cost(1, 4096, 4096, 2): FLOPs (2 per multiply-add)",
            mistakes={MISTAKES["flops_mnk"]: 16_777_216})
check_equal(nbytes, 33_570_816, "matmul_cost(1, 4096, 4096, 2): bytes (input + weight + output, 2 bytes each)")
check_close(intensity, 0.99951195, "matmul_cost(1, 4096, 4096, 2): FLOP/byte", rtol=1e-6)
# The same weight in a prefill of 2048 tokens.
check_close(matmul_cost(2048, 4096, 4096, 2)[2], 1024.0, "matmul_cost(2048, 4096, 4096, 2): FLOP/byte")
# fp32 halves the intensity of the same matmul
check_close(matmul_cost(2048, 4096, 4096, 4)[2], 512.0, "matmul_cost(2048, 4096, 4096, 4): FLOP/byte")

# %% [markdown] id="c007"
# ## Exercise 2 — The roofline (2 points)
#
# A device with peak throughput `peak_flops` (FLOP/s) and memory bandwidth `bandwidth` (bytes/s) can run
# an operation of arithmetic intensity `I` at most at `min(peak_flops, I × bandwidth)` FLOP/s. The two
# limits meet at the **ridge point**, the intensity `peak_flops / bandwidth`.
#
# Write `ridge_point(peak_flops, bandwidth)` (FLOP/byte) and `attainable(intensity, peak_flops, bandwidth)`
# (FLOP/s).

# %% id="c008" nbgrader={"grade": false, "grade_id": "roofline", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ridge_point(peak_flops, bandwidth):
    """Intensity (FLOP/byte) where the roofline bends."""
    ### BEGIN SOLUTION
    return peak_flops / bandwidth
    ### END SOLUTION


def attainable(intensity, peak_flops, bandwidth):
    """Best possible FLOP/s for an operation of this intensity."""
    ### BEGIN SOLUTION
    return min(peak_flops, intensity * bandwidth)
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "roofline_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_close(ridge_point(A100_FP16_FLOPS, A100_BANDWIDTH), 153.01618, "ridge_point of an A100 80GB in fp16", rtol=1e-6)
check_close(ridge_point(H100_FP16_FLOPS, H100_BANDWIDTH), 295.34328, "ridge_point of an H100 SXM in fp16", rtol=1e-6)
check_close(attainable(1.0, A100_FP16_FLOPS, A100_BANDWIDTH), 2.039e12,
            "attainable(1 FLOP/byte) on an A100: memory-bound, intensity x bandwidth")
check_close(attainable(1000.0, A100_FP16_FLOPS, A100_BANDWIDTH), 312e12,
            "attainable(1000 FLOP/byte) on an A100: compute-bound, the peak")
check_close(attainable(153.01618, A100_FP16_FLOPS, A100_BANDWIDTH), 312e12,
            "attainable at the ridge point: the peak", rtol=1e-6)

# %% [markdown] id="c010"
# ## Exercise 3 — Memory-bound or compute-bound, and how long at least (2 points)
#
# * `classify(intensity, peak_flops, bandwidth)` returns the string `"memory-bound"` when the intensity is
#   below the ridge point and `"compute-bound"` when it is at or above it.
# * `op_time(flops, nbytes, peak_flops, bandwidth)` returns the shortest possible time (seconds) of an
#   operation: it cannot compute faster than the peak nor move its bytes faster than the bandwidth, so
#   its time is the larger of the two.

# %% id="c011" nbgrader={"grade": false, "grade_id": "bound_and_time", "locked": false, "schema_version": 3, "solution": true, "task": false}
def classify(intensity, peak_flops, bandwidth):
    """'memory-bound' or 'compute-bound'."""
    ### BEGIN SOLUTION
    return "compute-bound" if intensity >= peak_flops / bandwidth else "memory-bound"
    ### END SOLUTION


def op_time(flops, nbytes, peak_flops, bandwidth):
    """Lower bound on the time of an operation, in seconds."""
    ### BEGIN SOLUTION
    return max(flops / peak_flops, nbytes / bandwidth)
    ### END SOLUTION


# %% id="c012" nbgrader={"grade": true, "grade_id": "bound_and_time_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_equal(classify(1.0, A100_FP16_FLOPS, A100_BANDWIDTH), "memory-bound",
            "classify: a decode projection (about 1 FLOP/byte) on an A100")
check_equal(classify(1024.0, A100_FP16_FLOPS, A100_BANDWIDTH), "compute-bound",
            "classify: a 2048-token prefill projection (1024 FLOP/byte) on an A100")
check_equal(classify(200.0, A100_FP16_FLOPS, A100_BANDWIDTH), "compute-bound", "classify: 200 FLOP/byte on an A100")
check_equal(classify(200.0, H100_FP16_FLOPS, H100_BANDWIDTH), "memory-bound", "classify: 200 FLOP/byte on an H100")
check_equal(classify(10.0, 100.0, 10.0), "compute-bound", "classify exactly at the ridge point (10 FLOP/byte)")
# A decode projection of a 7B model in fp16 on an A100: 33.6 MFLOP, 33.6 MB -> bandwidth decides.
check_close(op_time(33_554_432, 33_570_816, A100_FP16_FLOPS, A100_BANDWIDTH), 33_570_816 / 2039e9,
            "op_time of a decode projection on an A100 (bytes / bandwidth)")
# The same weight in a 2048-token prefill: 68.7 GFLOP, 67.1 MB -> the peak decides.
check_close(op_time(68_719_476_736, 67_108_864, A100_FP16_FLOPS, A100_BANDWIDTH), 68_719_476_736 / 312e12,
            "op_time of a prefill projection on an A100 (FLOPs / peak)")

# %% [markdown] id="c013"
# ## Exercise 4 — The fastest possible decode step (2 points)
#
# In a decode step every weight of the model is read from memory once (whatever the batch), and each
# sequence's KV cache is read too. Memory bandwidth therefore sets a floor on the time per step:
#
# `(num_params × bytes_per_param + kv_cache_bytes) / bandwidth` seconds.
#
# Write `min_decode_latency(num_params, bytes_per_param, bandwidth, kv_cache_bytes=0)`.

# %% id="c014" nbgrader={"grade": false, "grade_id": "decode_latency", "locked": false, "schema_version": 3, "solution": true, "task": false}
def min_decode_latency(num_params, bytes_per_param, bandwidth, kv_cache_bytes=0):
    """Seconds per decode step at best (memory-bound: read every weight and the KV cache once)."""
    ### BEGIN SOLUTION
    return (num_params * bytes_per_param + kv_cache_bytes) / bandwidth
    ### END SOLUTION


# %% id="c015" nbgrader={"grade": true, "grade_id": "decode_latency_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# A 7B model in fp16 on an A100 80GB: 14 GB / 2.039 TB/s, about 7 ms per token.
check_close(min_decode_latency(7e9, 2, A100_BANDWIDTH), 6.8661108e-3, "min_decode_latency(7e9, fp16, A100)", rtol=1e-6)
# Llama-2-7B has 6,738,415,616 parameters.
check_close(min_decode_latency(6_738_415_616, 2, A100_BANDWIDTH), 6.6095298e-3,
            "min_decode_latency(Llama-2-7B, fp16, A100)", rtol=1e-6)
check_close(min_decode_latency(7e9, 0.5, A100_BANDWIDTH), 1.7165277e-3, "min_decode_latency(7e9, int4, A100)", rtol=1e-6)
check_close(min_decode_latency(7e9, 2, H100_BANDWIDTH, kv_cache_bytes=2e9), 4.7761194e-3,
            "min_decode_latency(7e9, fp16, H100, with a 2 GB KV cache)", rtol=1e-6)

# %% [markdown] id="c016"
# ## Exercise 5 — When does decoding stop being memory-bound? (2 points, contract)
#
# Decoding `B` sequences together turns a weight matmul into `[B, d_in] × [d_in, d_out]`: the weight is read
# once for the whole batch, so the intensity grows with `B` (notebook 01, section 7).
#
# **Contract.** `critical_batch(d_in, d_out, bytes_per_element, peak_flops, bandwidth)`:
#
# * takes positive `d_in`, `d_out` (ints), `bytes_per_element` (0.5, 1, 2, 4), `peak_flops` (FLOP/s) and
#   `bandwidth` (bytes/s);
# * returns the **smallest integer batch size `B ≥ 1`** at which `[B, d_in] × [d_in, d_out]`, costed as in
#   exercise 1 (inputs read once, output written once), is compute-bound: its intensity at or above the
#   ridge point; or `None` if no batch size gets there;
# * so: the returned `B` is compute-bound and `B - 1` (if `B > 1`) is not, exactly, for any dimensions from
#   16 to 32768 and any device; a larger `peak_flops` never returns a smaller batch;
# * runs in O(1) or O(log B) time, not by trying every batch from 1 (a ridge of 1000 FLOP/byte with int4
#   weights needs thousands).
#
# <details><summary>Hint 1: the shape of the curve</summary>
#
# Write the intensity as a function of `B` with exercise 1's formula. It grows with `B` but cannot exceed
# `2·d_in·d_out / (bytes_per_element·(d_in + d_out))`, however large the batch: compare that limit with
# the ridge first. The common approximation "intensity ≈ 2B / bytes_per_element" forgets the activations'
# bytes and is wrong here.
# </details>
#
# <details><summary>Hint 2: the recipe</summary>
#
# With `a = bytes_per_element`, `W = d_in·d_out`, `A = d_in + d_out` and `R` the ridge:
#
# 1. `intensity(B) = 2BW / (a(BA + W))`; setting it to `R` gives `B(2W − RaA) = RaW`;
# 2. if `2W − RaA <= 0`, no batch gets there: return `None`;
# 3. otherwise `B = max(1, ceil(RaW / (2W − RaA)))`, then step `B` by ±1 while floating-point rounding puts
#    it on the wrong side of the ridge (check with `intensity`).
# </details>

# %% id="c017" nbgrader={"grade": false, "grade_id": "critical_batch", "locked": false, "schema_version": 3, "solution": true, "task": false}
def critical_batch(d_in, d_out, bytes_per_element, peak_flops, bandwidth):
    """Smallest integer batch at which [B, d_in] x [d_in, d_out] is compute-bound, or None."""
    ### BEGIN SOLUTION
    ridge = peak_flops / bandwidth
    a, W, A = bytes_per_element, d_in * d_out, d_in + d_out
    # 2 B W / (a (B A + W)) = ridge  ->  B (2 W - ridge a A) = ridge a W
    den = 2 * W - ridge * a * A
    if den <= 0:
        return None
    b = max(1, math.ceil(ridge * a * W / den))

    def intensity(batch):
        return 2 * batch * W / (a * (batch * A + W))

    while b > 1 and intensity(b - 1) >= ridge:  # guard against rounding at an exact integer
        b -= 1
    while intensity(b) < ridge:
        b += 1
    return b
    ### END SOLUTION


# %% id="c018" nbgrader={"grade": true, "grade_id": "critical_batch_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_equal(critical_batch(4096, 4096, 2, A100_FP16_FLOPS, A100_BANDWIDTH), 166,
            "critical_batch(4096, 4096, fp16, A100)", mistakes={MISTAKES["critical_weights_only"]: 154})
check_equal(critical_batch(4096, 11008, 2, H100_FP16_FLOPS, H100_BANDWIDTH), 328,
            "critical_batch(4096, 11008, fp16, H100)")
check_equal(critical_batch(8192, 8192, 1, 624e12, A100_BANDWIDTH), 159,
            "critical_batch(8192, 8192, int8 at 624 TOPS, A100)")
check_equal(critical_batch(64, 64, 2, H100_FP16_FLOPS, H100_BANDWIDTH), None,
            "critical_batch(64, 64, fp16, H100): never compute-bound")
check_equal(critical_batch(4096, 4096, 2, 1e12, 1e12), 2,
            "critical_batch(4096, 4096, fp16) on a device whose ridge is 1 FLOP/byte")
check_equal(critical_batch(4096, 4096, 1, 1e12, 1e12), 1,
            "critical_batch(4096, 4096, int8) on a device whose ridge is 1 FLOP/byte (batch 1 is enough)")

# %% [markdown] id="c018a"
# ## Exercise 6 — Predict a decode step (3 points, contract)
#
# Exercise 4 gave the memory floor of a decode step. A whole step has a compute floor too: each sequence of
# the batch does one multiply-add per weight, `2 × num_params` FLOPs, and the step cannot beat either floor
# (notebook 01, sections 6 and 7). This is the course's model of a decode step
# (`course_lib.perf.roofline.decode_step`); the last cell uses it to predict a step of the course's model on
# your own device before measuring it.
#
# **Contract.** `predict_decode_step(num_params, bytes_per_param, peak_flops, bandwidth, batch=1, kv_cache_bytes=0)`:
#
# * takes the parameter count (> 0), the bytes per weight (> 0, e.g. 2 for fp16, 0.5 for int4), the device's
#   peak (FLOP/s, > 0) and bandwidth (bytes/s, > 0), the number of sequences decoded together `batch` (an
#   int >= 1) and the bytes of KV cache the step reads for all of them (>= 0);
# * returns the step's lower-bound time in seconds: a step of `batch` sequences reads every weight **once**
#   and the KV cache once, and does `2 × num_params` FLOPs **per sequence**; it takes as long as the slower of
#   its memory traffic and its arithmetic at the device's rates;
# * invariants: at `batch=1` with no KV cache it equals exercise 4's `min_decode_latency` on any real model
#   and device; it never decreases when `batch` grows; per sequence (`time / batch`) it never increases;
# * raises `ValueError` when `batch` is not an int >= 1 or any other argument is out of range.
#
# <details><summary>Hint: the two floors</summary>
#
# Memory: `(num_params × bytes_per_param + kv_cache_bytes) / bandwidth`, whatever the batch.
# Compute: `2 × num_params × batch / peak_flops`. The step time is the larger (exercise 3's `op_time`).
# </details>

# %% id="c018b" nbgrader={"grade": false, "grade_id": "predict_decode_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_decode_step(num_params, bytes_per_param, peak_flops, bandwidth, batch=1, kv_cache_bytes=0):
    """Lower bound (seconds) on one decode step of `batch` sequences: max(memory floor, compute floor)."""
    ### BEGIN SOLUTION
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    for name, value in (("num_params", num_params), ("bytes_per_param", bytes_per_param),
                        ("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if not kv_cache_bytes >= 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv_cache_bytes!r}")
    memory = (num_params * bytes_per_param + kv_cache_bytes) / bandwidth
    compute = 2 * num_params * batch / peak_flops
    return max(memory, compute)
    ### END SOLUTION


# %% id="c018c" nbgrader={"grade": true, "grade_id": "predict_decode_step_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# A 7B model in fp16 on an A100: memory-bound at batch 1 and 64, compute-bound at 512.
check_close(predict_decode_step(7e9, 2, A100_FP16_FLOPS, A100_BANDWIDTH), 6.8661108e-3,
            "predict_decode_step(7e9, fp16, A100, batch=1)", rtol=1e-6)
check_close(predict_decode_step(7e9, 2, A100_FP16_FLOPS, A100_BANDWIDTH, batch=64), 6.8661108e-3,
            "predict_decode_step(7e9, fp16, A100, batch=64) (the weights are read once for the whole batch)",
            rtol=1e-6, mistakes={MISTAKES["decode_weights_per_sequence"]: 64 * 6.8661108e-3})
check_close(predict_decode_step(7e9, 2, A100_FP16_FLOPS, A100_BANDWIDTH, batch=512), 2 * 7e9 * 512 / 312e12,
            "predict_decode_step(7e9, fp16, A100, batch=512) (compute-bound: 2 x params x batch / peak)", rtol=1e-6,
            mistakes={MISTAKES["decode_weights_per_sequence"]: 512 * 6.8661108e-3,
                      MISTAKES["decode_memory_only"]: 6.8661108e-3})
check_close(predict_decode_step(7e9, 2, H100_FP16_FLOPS, H100_BANDWIDTH, batch=8, kv_cache_bytes=2e9), 4.7761194e-3,
            "predict_decode_step(7e9, fp16, H100, batch=8, with a 2 GB KV cache)", rtol=1e-6)
check_raises(lambda: predict_decode_step(7e9, 2, A100_FP16_FLOPS, A100_BANDWIDTH, batch=0), ValueError,
             "predict_decode_step(..., batch=0)")
check_raises(lambda: predict_decode_step(7e9, 2, A100_FP16_FLOPS, -1.0), ValueError,
             "predict_decode_step(..., bandwidth=-1)")
print("Exercise 6: visible tests passed")

# %% [markdown] id="c019"
# ## Extension (not graded): your own machine, predicted then measured
#
# `course_lib.device_bench.measure_device()` measures this machine's copy bandwidth and matmul throughput (a
# few seconds on a CPU). Use your functions on it: where is its ridge point, and at what batch size would a
# 4096 × 4096 fp32 projection become compute-bound here? Then your `predict_decode_step` predicts one decode
# step of the course's bundled model (with a KV cache of 64 tokens) on this machine, and
# `course_lib.device_bench.time_decode_step` measures it. On a GPU listed in `course_lib.perf.GPUS` the
# datasheet's prediction is printed too. (Skipped during grading.)

# %% id="c020"
if os.environ.get("NBGRADER_EXECUTION"):
    print("skipped while grading")
else:
    from course_lib import device_bench

    local = device_bench.measure_device(quick=True)
    peak, bw = local.peak_flops(local.default_dtype), local.bandwidth
    print(f"{local.name}: {bw / 1e9:.1f} GB/s, {peak / 1e9:.1f} GFLOP/s ({local.default_dtype})")
    try:
        print(f"ridge point: {ridge_point(peak, bw):.1f} FLOP/byte; a 4096 x 4096 fp32 projection turns "
              f"compute-bound at batch {critical_batch(4096, 4096, 4, peak, bw)}")
    except NotImplementedError:
        print("finish exercises 2 and 5 first")

    import torch

    from course_lib import env
    from course_lib.models import load
    from course_lib.perf.claims import timing_claim
    from course_lib.perf.hardware import GPUS, get_gpu

    model, _ = load("tiny", device=env.device(), verbose=False)
    n_params = sum(p.numel() for p in model.parameters())
    bpp = next(model.parameters()).element_size()
    kv = model.config.kv_cache_bytes(64, 1, bpp)
    measured = device_bench.time_decode_step(model, context=64, repeats=20)
    try:
        predicted = predict_decode_step(n_params, bpp, peak, bw, batch=1, kv_cache_bytes=kv)
        print(f"one decode step of the bundled model ({n_params / 1e6:.2f} M parameters x {bpp} bytes, "
              f"KV cache {kv / 1e3:.0f} kB): predicted {predicted * 1e6:.1f} us, "
              f"measured {measured.median * 1e6:.1f} us (median of 20)")
        if torch.cuda.is_available():
            try:
                spec = get_gpu(torch.cuda.get_device_name())
                pred_sheet = predict_decode_step(n_params, bpp, spec.peak_flops(spec.default_dtype), spec.bandwidth,
                                                 kv_cache_bytes=kv)
                print(f"   with {spec.name}'s datasheet numbers: predicted {pred_sheet * 1e6:.1f} us")
            except ValueError:
                print(f"   ({torch.cuda.get_device_name()} is not in course_lib.perf.GPUS: {', '.join(GPUS)})")
        timing_claim("the roofline's decode step is a lower bound on the measured step",
                     measured.median >= predicted,
                     f"predicted {predicted * 1e6:.1f} us, measured {measured.median * 1e6:.1f} us "
                     f"(measured / predicted = {measured.median / predicted:.1f}; median of 20, "
                     f"spread {measured.spread:.0%})",
                     advice="a measured step faster than the bound means the bandwidth was under-measured "
                            "(a cache larger than the copy buffer): re-run with quick=False")
        print("For a model this small the step is set by per-operation costs, not by bytes: notebook 01, section 6.")
    except NotImplementedError:
        print("finish exercise 6 first")

# %% [markdown] id="c021"
# ## Going further
#
# * Llama-2-7B (6,738,415,616 parameters) in int4 (0.5 bytes per weight) on an H100 SXM: what is the fastest
#   possible decode step for one sequence, and the most tokens per second it can produce?
# * With exercise 6's model, from which batch on is a decode step of a 7B fp16 model (no KV cache) on an A100
#   compute-bound? Why is it not exercise 5's answer for a 4096 × 4096 projection (166)?
# * Now give each sequence a KV cache of 4096 tokens (Llama-2-7B: 32 layers, 32 KV heads of 128 dimensions,
#   fp16: 512 KiB per token). Does the step ever become compute-bound as the batch grows?
# * Your measured decode step of the bundled model is many times the prediction. Name two costs the roofline
#   leaves out, and one technique from a later module that removes each.


# %% [markdown] id="cw01p"
# ## Exercise 7 — Written analysis: the roofline against your decode step (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run the extension cell above first (it
# is skipped while grading), then answer in 100 to 200 words, about **your** machine's numbers:
#
# 1. quote your predicted and measured decode step and their ratio, and say which floor your
#    `predict_decode_step` found binding at batch 1 and why (the step's intensity against your ridge point);
# 2. explain why the measured step of this 4.7 M-parameter model is so far above the bound, with an estimate
#    from your numbers (for instance the time per operator the gap implies, if a step runs a few hundred);
# 3. say whether the measured / predicted ratio would shrink or grow for a 7B model on the same machine, and
#    why.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw01" nbgrader={"grade": true, "grade_id": "written_roofline_gap", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer: the numbers in brackets are what a student quotes from their own run.)*
#
# On my machine ([bw] GB/s, [peak] GFLOP/s fp32: ridge [r] FLOP/byte) the roofline predicted [p] us for one
# decode step and the step measured [m] us, [m/p] times more. At batch 1 every fp32 weight (4 bytes) serves one
# multiply-add (2 FLOPs): about 0.5 FLOP/byte, far below the ridge, so the memory floor binds: 18.7 MB of
# weights over the bandwidth.
#
# The roofline counts bytes and FLOPs only. A decode step of the bundled model runs about 6 layers x 15
# operators (two norms, seven projections, RoPE, attention, SwiGLU, residual adds) plus the head and the argmax,
# roughly 100 to 150 operator calls, and each pays a fixed cost in PyTorch (Python, dispatch, shape checks, the
# allocator, waking the thread pool) whatever its size. The gap, [m - p] us over about 120 calls, is [x] us per
# call: the size of an eager operator's overhead, so the step is overhead-bound, not memory-bound. (The 18.7 MB
# partly fits in the caches, which would make the step faster than a bandwidth measured on large copies, not
# slower.)
#
# For a 7B model (14 GB in fp16) the bytes per operator grow a thousandfold while the operator count grows only
# with the layers (32 instead of 6), so the weights' read time dominates and the ratio falls towards 1 to 1.5.

# %% [markdown] id="c022" tags=["answer-key"]
# ### Answer key
#
# * 6,738,415,616 × 0.5 bytes = 3.37 GB read per step; at 3.35 TB/s that is **1.006 ms**, so at most
#   **994 tokens/s** for one sequence (4 × faster than fp16's 4.02 ms, 249 tokens/s).
# * The step is compute-bound when 2·P·B / peak ≥ 2·P / bandwidth (fp16: 2 bytes per weight), that is
#   B ≥ peak / bandwidth = the ridge, 153.0 FLOP/byte on an A100: from **B = 154** on. Exercise 5 costs one
#   projection with its activations and outputs (B·(d_in + d_out) elements read and written), traffic that
#   grows with B, so its intensity rises more slowly and the crossing comes later (166). The whole-step model
#   counts only the weights, which dominate the bytes at small batches (at B = 166 a 4096 × 4096
#   projection moves 2.7 MB of activations beside 33.6 MB of weight).
# * No. Each sequence adds 4096 × 512 KiB = 2.15 GB of KV reads, 1.05 ms at 2.039 TB/s, but only
#   2 × 6.74e9 FLOPs, 0.043 ms at 312 TFLOP/s: the memory floor grows 24 × faster than the compute floor, so
#   the step stays memory-bound at every batch (and an 80 GB A100 holds only (80 − 13.5) / 2.15 = 30 such
#   sequences anyway). Long contexts make decoding memory-bound for good, which is what KV-cache
#   compression, GQA and paged attention (modules 05 and 06) attack.
# * (1) A fixed cost per operation: Python, the dispatcher and the allocator on a CPU, a kernel launch on a
#   GPU, paid by each of the step's hundreds of small operations: CUDA graphs and `torch.compile` (module 12)
#   remove most of it. (2) Memory traffic beyond the weights: every unfused operation (norms, RoPE,
#   attention's softmax, residual adds) writes its output and the next one reads it back, and single-row
#   matmuls run below the copy bandwidth: fusion (FlashAttention in module 07, compiled kernels in module 12)
#   and batching (module 09) remove or amortize it.
