# %% [markdown] id="c002"
# # Lab 01 — Where the time goes
#
# In this lab you write the small formulas behind module 01: the FLOPs, bytes and arithmetic intensity
# of a matrix multiplication, the roofline of a device, whether an operation is memory- or
# compute-bound, the fastest possible decode step, and the batch size at which decoding stops being
# memory-bound; then you apply them to a server whose users each bring a KV cache of their own.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, the grader calls your functions on inputs of its own (drawn for you, and a grid
#   of edge cases), so write the general formula, not the examples' answers.
# * Use plain Python numbers (no need for torch). Units: FLOPs, bytes, seconds, FLOP/s, bytes/s.
# * Exercises marked **contract** give what the function takes, returns and refuses, not the steps: you
#   design them; hints you open on purpose (the ▸ lines) hold a recipe. Exercise 6 is a **prediction**: what
#   a server's decode step costs when every user brings a KV cache of their own, its tokens per second, and the
#   batch where it turns compute-bound; the extension cell then measures your own machine against it.
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
    "kv_read_once": "the KV cache counted once for the whole batch, like the weights; every sequence attends to its "
                    "own keys and values, so a step reads batch x context x kv_bytes_per_token of them and its "
                    "memory floor grows with the batch (see notebook 01, section '7. Batch size and the ridge "
                    "point': attention's intensity does not grow with the batch)",
    "user_is_total": "the tokens/s one user sees taken as the server's; a step gives each of its batch sequences one "
                     "token, so the server makes batch tokens per step and each user one",
    "batch_without_kv": "the compute-bound batch found from the weights alone; each sequence also brings its own KV "
                        "cache to read, which the batch does not share, so the crossover comes later, and past some "
                        "context never",
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
# ## Exercise 6 — Predict: decoding for many users at a long context (3 points, contract)
#
# Exercise 4 costs a decode step by its bytes, and notebook 01 (section 7) finds the batch where a step's weight
# matmuls turn compute-bound, leaving attention over the KV cache aside: batching does not share it. A server
# cannot leave it aside. Every sequence of the batch reads **its own** KV cache of `context` tokens at every
# step, while the weights are still read once for all of them. Predict what that does to the step, to the
# tokens per second each user and the whole server see, and to the batch where batching stops paying.
#
# Use the course's model of a step (the one behind `course_lib.perf.roofline.decode_step`): a step of `batch`
# sequences reads every weight once and each sequence's KV cache once; it does `2 × num_params` FLOPs per
# sequence (one multiply-add per weight; attention's own arithmetic is left out); it takes as long as the
# slower of its memory traffic at `bandwidth` and its arithmetic at `peak_flops`; and it gives each sequence
# one new token.
#
# **Contract.**
#
# * `predict_decode(num_params, bytes_per_param, peak_flops, bandwidth, batch=1, context=0, kv_bytes_per_token=0)`
#   takes the parameter count (> 0), the bytes per weight (> 0: 2 for fp16, 0.5 for int4), the device's peak
#   (FLOP/s, > 0) and bandwidth (bytes/s, > 0), the number of sequences decoded together `batch` (an int >= 1),
#   the tokens in each sequence's KV cache `context` (an int >= 0) and the KV bytes of one token of one sequence,
#   all layers, keys and values (>= 0; its number format may differ from the weights'); it returns
#   `(step_s, user_tokens_per_s, total_tokens_per_s)`: the step's time in seconds, the tokens per second one
#   user sees, and the tokens per second the server produces for all its users;
# * `compute_bound_batch(num_params, bytes_per_param, peak_flops, bandwidth, context=0, kv_bytes_per_token=0)`
#   returns the smallest batch (an int >= 1) at which the step's arithmetic takes at least as long as its
#   memory traffic, exactly (the batch before it is memory-bound), or `None` when no batch gets there; it
#   solves rather than searches: near the context where no batch is enough, the answer runs into the tens of
#   thousands and beyond;
# * invariants: at batch 1 with no KV cache, `step_s` is exercise 4's floor whenever that step is memory-bound
#   (on a device whose ridge point is below the step's intensity, 2 FLOPs per weight over its bytes, the
#   compute floor binds instead);
#   as the batch grows, the step never gets shorter, each user's tokens/s never grows and the server's never
#   shrinks; from `compute_bound_batch` on, the server's tokens/s no longer grows;
# * both raise `ValueError` when `batch` is not an int >= 1 or `context` not an int >= 0 (a `bool` or a float
#   such as `2.0` is refused too), `kv_bytes_per_token` is negative, or another argument is not > 0.
#
# The grader draws its own models, formats, devices and contexts and compares with the course's model. The
# visible tests check the units and what must hold whatever the formula; the extension cell after them
# predicts the bundled model's steps on your machine at several batches and measures them.
#
# <details><summary>Hint 1: what a step reads</summary>
#
# Write the memory floor and the compute floor of a step as functions of the batch. Which bytes does the batch
# share, and which does every sequence bring? Pitfall: counting the KV cache once for the whole batch, like the
# weights.
# </details>
#
# <details><summary>Hint 2: the crossover</summary>
#
# Each sequence added to the batch adds to both floors. The arithmetic can only catch up if a sequence adds
# more time to the compute floor than to the memory floor; then the two floors meet at one batch, which you can
# solve for. Pitfalls: a crossover found from the weights alone, and floating-point rounding at an exact
# integer (exercise 5 met it: check the neighbours).
# </details>

# %% id="c018b" nbgrader={"grade": false, "grade_id": "predict_decode", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_decode(num_params, bytes_per_param, peak_flops, bandwidth, batch=1, context=0, kv_bytes_per_token=0):
    """(step seconds, tokens/s one user sees, tokens/s of the server) of a decode step of `batch` sequences."""
    ### BEGIN SOLUTION
    for name, value in (("num_params", num_params), ("bytes_per_param", bytes_per_param),
                        ("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be an int >= 0, got {context!r}")
    if isinstance(kv_bytes_per_token, bool) or not isinstance(kv_bytes_per_token, (int, float)) \
            or not kv_bytes_per_token >= 0:
        raise ValueError(f"kv_bytes_per_token must be a number >= 0, got {kv_bytes_per_token!r}")
    memory = (num_params * bytes_per_param + batch * context * kv_bytes_per_token) / bandwidth
    compute = 2 * num_params * batch / peak_flops
    step = max(memory, compute)
    return step, 1 / step, batch / step
    ### END SOLUTION


def compute_bound_batch(num_params, bytes_per_param, peak_flops, bandwidth, context=0, kv_bytes_per_token=0):
    """The smallest batch whose decode step is compute-bound, or None."""
    ### BEGIN SOLUTION
    predict_decode(num_params, bytes_per_param, peak_flops, bandwidth, 1, context, kv_bytes_per_token)  # checks

    def compute_bound(b):
        return 2 * num_params * b / peak_flops >= \
            (num_params * bytes_per_param + b * context * kv_bytes_per_token) / bandwidth

    weights_s = num_params * bytes_per_param / bandwidth      # read once, whatever the batch
    # what one more sequence adds to the compute floor beyond what it adds to the memory floor
    per_sequence = 2 * num_params / peak_flops - context * kv_bytes_per_token / bandwidth
    if per_sequence <= 0:
        return None
    b = max(1, math.ceil(weights_s / per_sequence))
    while b > 1 and compute_bound(b - 1):                     # rounding at an exact integer
        b -= 1
    while not compute_bound(b):
        b += 1
    return b
    ### END SOLUTION


# %% id="c018c" nbgrader={"grade": true, "grade_id": "predict_decode_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
P7, KV7 = 6_738_415_616, 524_288    # Llama-2-7B: its parameters, and its fp16 KV bytes per token (all 32 layers)
A100 = (A100_FP16_FLOPS, A100_BANDWIDTH)


def _decode(*args, **kw):
    got = predict_decode(*args, **kw)
    check_equal(len(got) if isinstance(got, (tuple, list)) else type(got).__name__, 3,
                "predict_decode returns (step_s, user_tokens_per_s, total_tokens_per_s)")
    step, user, total = (float(x) for x in got)
    check_equal(step > 0 and 0 < user <= total, True, f"predict_decode{args + tuple(kw.items())} = ({step:.4g} s, "
                f"{user:.4g}, {total:.4g} tokens/s): seconds > 0, and one user's tokens/s no more than the server's")
    return step, user, total


_step, _user, _total = _decode(P7, 2, *A100)
check_close(_step, min_decode_latency(P7, 2, A100_BANDWIDTH),
            "one sequence, no KV cache: exercise 4's floor (your min_decode_latency)")
check_close(_user, _total, "one sequence: its user's tokens/s are the server's")
check_equal(1e-3 < _step < 2e-2, True, f"a 7B fp16 model's decode step on an A100 takes milliseconds, got {_step:.4g} s")
_sweep = [_decode(P7, 2, *A100, batch=B, context=4096, kv_bytes_per_token=KV7) for B in (1, 2, 4, 8, 16)]
for (s0, u0, t0), (s1, u1, t1), B in zip(_sweep, _sweep[1:], (2, 4, 8, 16)):
    check_equal(s1 >= s0 * (1 - 1e-12) and u1 <= u0 * (1 + 1e-12) and t1 >= t0 * (1 - 1e-12), True,
                f"Llama-2-7B at 4096 tokens, batch {B // 2} -> {B}: the step ({s0:.4g} -> {s1:.4g} s) never shorter, "
                f"each user's tokens/s ({u0:.4g} -> {u1:.4g}) never higher, the server's ({t0:.4g} -> {t1:.4g}) "
                "never lower")
check_equal(_sweep[-1][0] > 2 * _sweep[0][0], True, f"16 users at 4096 tokens: each reads a KV cache of its own, so "
            f"the step is not flat in the batch ({_sweep[0][0]:.4g} s at batch 1, {_sweep[-1][0]:.4g} s at 16); if it "
            f"is: {MISTAKES['kv_read_once']}")
_b = compute_bound_batch(P7, 2, *A100)
check_equal(isinstance(_b, int) and not isinstance(_b, bool) and _b > 1, True,
            f"compute_bound_batch(Llama-2-7B, fp16, A100, no KV cache) is a batch size above 1, got {_b!r}")
check_close(_decode(P7, 2, *A100, batch=2 * _b)[2], _decode(P7, 2, *A100, batch=_b)[2],
            f"from batch {_b} on the step is compute-bound: twice the batch, the same server tokens/s")
check_equal(_decode(P7, 2, *A100, batch=_b - 1)[2] < _decode(P7, 2, *A100, batch=_b)[2], True,
            f"batch {_b - 1}, one below compute_bound_batch, is still memory-bound: fewer tokens/s than batch {_b}")
check_equal(compute_bound_batch(P7, 0.5, *A100) <= _b, True,
            "int4 weights, a quarter of the bytes: the arithmetic catches up at a batch no larger")
_contexts = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
_bs = [compute_bound_batch(P7, 2, *A100, context=c, kv_bytes_per_token=KV7) for c in _contexts]
_none = next((k for k, b in enumerate(_bs) if b is None), len(_bs))
check_equal(_none < len(_bs) and all(b is None for b in _bs[_none:])
            and all(a <= b for a, b in zip(_bs[:_none], _bs[1:_none])), True,
            f"compute_bound_batch of Llama-2-7B on an A100 at contexts {_contexts}: {_bs}; a longer context never "
            "lowers the batch, and past some context no batch is enough (each sequence's KV cache costs more to "
            "read than its arithmetic)")
check_raises(lambda: predict_decode(P7, 2, *A100, batch=0), ValueError, "predict_decode(..., batch=0)")
check_raises(lambda: predict_decode(P7, 2, *A100, context=-1), ValueError, "predict_decode(..., context=-1)")
check_raises(lambda: predict_decode(P7, 2, *A100, kv_bytes_per_token=-1), ValueError,
             "predict_decode(..., kv_bytes_per_token=-1)")
check_raises(lambda: compute_bound_batch(P7, 2, A100_FP16_FLOPS, -1.0), ValueError,
             "compute_bound_batch(..., bandwidth=-1)")
print("Exercise 6: visible tests passed")

# %% [markdown] id="c019"
# ## Extension (not graded): your own machine, predicted then measured
#
# `course_lib.device_bench.measure_device()` measures this machine's copy bandwidth and matmul throughput (a
# fraction of a second each on a CPU; the cell keeps the best of three, since a busy machine only ever slows a
# benchmark down). Use your functions on it: where is its ridge point, and at what batch size would a
# 4096 × 4096 fp32 projection become compute-bound here? Then your `predict_decode` predicts the bundled
# model's decode steps at several batches with a KV cache of 64 tokens, `compute_bound_batch` says where they
# turn compute-bound, and `course_lib.device_bench.decode_step_call` times the same steps, interleaved. On a
# GPU listed in `course_lib.perf.GPUS` the datasheet's prediction is printed too. (Skipped during grading.)

# %% id="c020"
if os.environ.get("NBGRADER_EXECUTION"):
    print("skipped while grading")
else:
    import torch

    from course_lib import device_bench, env
    from course_lib.models import load
    from course_lib.perf.claims import timing_claim
    from course_lib.perf.hardware import GPUS, get_gpu
    from course_lib.perf.timing import compare

    runs = [device_bench.measure_device(quick=True) for _ in range(3)]
    dt = runs[0].default_dtype
    peak, bw = max(r.peak_flops(dt) for r in runs), max(r.bandwidth for r in runs)
    print(f"{runs[0].name}: {bw / 1e9:.1f} GB/s, {peak / 1e9:.1f} GFLOP/s ({dt}), the best of 3 measurements")
    try:
        print(f"ridge point: {ridge_point(peak, bw):.1f} FLOP/byte; a 4096 x 4096 fp32 projection turns "
              f"compute-bound at batch {critical_batch(4096, 4096, 4, peak, bw)}")
    except NotImplementedError:
        print("finish exercises 2 and 5 first")

    model, _ = load("tiny", device=env.device(), verbose=False)
    n_params = sum(p.numel() for p in model.parameters())
    bpp = next(model.parameters()).element_size()
    kv_token = model.config.kv_cache_bytes(1, 1, bpp)
    CONTEXT, BATCHES = 64, [1, 4, 16, 64]
    steps = compare({f"batch {B}": device_bench.decode_step_call(model, context=CONTEXT, batch=B) for B in BATCHES},
                    warmup=1, repeats=5, device=model.device)           # interleaved, each by its fastest run
    measured = [steps.time(f"batch {B}") for B in BATCHES]
    try:
        predicted = [predict_decode(n_params, bpp, peak, bw, batch=B, context=CONTEXT, kv_bytes_per_token=kv_token)
                     for B in BATCHES]
        print(f"the bundled model: {n_params / 1e6:.2f} M parameters x {bpp} bytes, {kv_token:,} bytes of KV per "
              f"token, {CONTEXT} tokens of context")
        print(f"{'batch':>6}{'step pred':>12}{'measured':>11}{'ratio':>7}{'server tok/s pred':>19}{'measured':>10}"
              f"{'user tok/s pred':>17}{'measured':>10}")
        for B, (s, u, total), m in zip(BATCHES, predicted, measured):
            print(f"{B:>6}{s * 1e3:>10.3f}ms{m * 1e3:>9.3f}ms{m / s:>7.1f}{total:>19.0f}{B / m:>10.0f}{u:>17.0f}"
                  f"{1 / m:>10.0f}")
        n_ops = device_bench.count_ops(device_bench.decode_step_call(model, context=CONTEXT, batch=1))
        if n_ops is not None:                   # None: this torch cannot count them
            print(f"one step at batch 1 dispatches {n_ops} PyTorch operators (counted as notebook 01, section 6, "
                  "does)")
        at = {c: compute_bound_batch(n_params, bpp, peak, bw, context=c, kv_bytes_per_token=kv_token)
              for c in (0, CONTEXT, 256, 511)}
        print("your compute_bound_batch here: " + ", ".join(f"{b} at {c} tokens" for c, b in at.items()))
        if torch.cuda.is_available():
            try:
                spec = get_gpu(torch.cuda.get_device_name())
                sheet = predict_decode(n_params, bpp, spec.peak_flops(spec.default_dtype), spec.bandwidth,
                                       batch=BATCHES[-1], context=CONTEXT, kv_bytes_per_token=kv_token)
                print(f"   with {spec.name}'s datasheet numbers, batch {BATCHES[-1]}: {sheet[0] * 1e6:.1f} us per step")
            except ValueError:
                print(f"   ({torch.cuda.get_device_name()} is not in course_lib.perf.GPUS: {', '.join(GPUS)})")
        timing_claim("the roofline's step is a lower bound on the measured step at every batch",
                     all(m >= p[0] for m, p in zip(measured, predicted)),
                     ", ".join(f"batch {B}: measured / predicted {m / p[0]:.1f}"
                               for B, m, p in zip(BATCHES, measured, predicted)) + f"; {steps.note()}",
                     advice="a measured step faster than the bound means this run under-measured the bandwidth or "
                            "the peak (a busy machine slows the short benchmarks): re-run the cell")
    except NotImplementedError:
        print("finish exercise 6 first")

# %% [markdown] id="c021"
# ## Going further
#
# * Llama-2-7B (6,738,415,616 parameters) in int4 (0.5 bytes per weight) on an H100 SXM: what is the fastest
#   possible decode step for one sequence, and the most tokens per second it can produce?
# * With exercise 6's model and no KV cache, from which batch on is a decode step of a 7B fp16 model on an A100
#   compute-bound? Why is it not exercise 5's answer for a 4096 × 4096 projection (166)?
# * Llama-3-8B (8,030,261,248 parameters; grouped-query attention keeps its KV cache at 128 KiB per token in
#   fp16) is served with int4 weights and an fp8 KV cache (64 KiB per token) on an H100 SXM, computing in fp16.
#   Up to which context can a batch still turn the step compute-bound? At 512 tokens, from which batch, and do
#   that many sequences fit in its 80 GB?
# * Your measured decode step of the bundled model is many times the prediction. Name two costs the roofline
#   leaves out, and one technique from a later module that removes each.


# %% [markdown] id="cw01p"
# ## Exercise 7 — Written analysis: the roofline against your decode steps (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run the extension cell above first (it
# is skipped while grading), then answer in 100 to 200 words, about **your** machine's numbers:
#
# 1. quote the predicted and measured step at batch 1 and at your largest batch, their ratios, and the batch
#    from which your `compute_bound_batch` says the bundled model's step is compute-bound at 64 tokens; which
#    floor binds at each of the two batches?
# 2. explain why the measured step is so far above the bound at batch 1 and why the ratio changes at the largest
#    batch, with an estimate from your numbers (for instance the time per operator the gap implies, from the
#    operators the cell counts in one step);
# 3. quote your `compute_bound_batch` at longer contexts, and explain why a longer context pushes the crossover
#    up and, past some context, removes it; what does that mean for a 7B model serving 4096-token contexts?
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw01" nbgrader={"grade": true, "grade_id": "written_roofline_gap", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on this course's 2-core CPU
# machine (AMD EPYC, 2 threads), torch 2.13; your numbers will differ: what matters is how you explain them.)*
#
# My machine measured 30.2 GB/s and 180.1 GFLOP/s (fp32): a ridge of 6.0 FLOP/byte. At batch 1 the roofline
# predicted 0.627 ms and the step took 4.252 ms (6.8 times); at batch 64, 3.326 ms against 9.702 ms (2.9 times).
# `compute_bound_batch` puts the crossover at batch 14 for 64 tokens: batch 1 is memory-bound (18.7 MB of
# weights at 30.2 GB/s), batch 64 compute-bound (64 × 9.4 MFLOP at 180 GFLOP/s).
#
# The roofline counts bytes and FLOPs only. A step runs 463 PyTorch operators (counted as notebook 01 does),
# each paying a fixed cost in Python, dispatch and the allocator whatever its size: the 3.6 ms gap at batch 1 is
# 7.8 µs per operator. That cost is paid once per step, not per sequence, so at batch 64 it is shared by 64 tokens and the
# arithmetic shows: of the 6.4 ms gap, about 3.6 ms is the same fixed cost, the rest small matmuls running below
# the rate of the benchmark's large one. The ratio falls to 2.9.
#
# My crossover was 12 with no KV, 24 at 256 tokens, and none at 511. Each sequence adds its arithmetic
# (2 × params FLOPs) and its own KV read to the step; a longer context makes the read larger, so more sequences
# are needed to outgrow the weights' read, and once the read costs more than the arithmetic no batch does. A 7B
# fp16 model on an A100 reaches that at 168 tokens: at 4096 it is memory-bound at every batch.

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
# * A sequence brings 2 × 8.03e9 = 16.06 GFLOP, 16.23 µs at 989.4 TFLOP/s, and c × 65,536 bytes of KV, read in
#   c × 19.6 ps at 3.35 TB/s. The arithmetic can catch up only while each sequence adds more compute than KV
#   reading: c < 16.23 µs × 3.35 TB/s / 65,536 B = 829.8, so **up to 829 tokens**. At 512 tokens a sequence's
#   KV takes 10.02 µs, leaving 6.22 µs per sequence to close the gap of the weights' read, 4.02 GB in 1.199 ms:
#   B* = 1.199 ms / 6.22 µs = 192.8, compute-bound from **batch 193** (a 3.13 ms step, 61,600 tokens/s for the
#   server, 319 for each user). Its KV cache is 193 × 512 × 64 KiB = 6.5 GB beside 4.0 GB of weights: it fits
#   many times over. Memory capacity does not stop this batch; bandwidth would, past 829 tokens.
# * (1) A fixed cost per operation: Python, the dispatcher and the allocator on a CPU, a kernel launch on a
#   GPU, paid by each of the step's hundreds of small operations: CUDA graphs and `torch.compile` (module 12)
#   remove most of it. (2) Memory traffic beyond the weights: every unfused operation (norms, RoPE,
#   attention's softmax, residual adds) writes its output and the next one reads it back, and single-row
#   matmuls run below the copy bandwidth: fusion (FlashAttention in module 07, compiled kernels in module 12)
#   and batching (module 09) remove or amortize it.
