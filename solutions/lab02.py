# %% [markdown] id="c002"
# # Lab 02 — Quantization fundamentals
#
# In this lab you write the core of integer quantization from module 02: absmax (symmetric) and
# zero-point (asymmetric) quantization and their inverses, per-group scales, packing two 4-bit codes
# into one byte, the SQNR error metric, and NF4, the 4-bit codebook format of QLoRA [@dettmers2023qlora].
# Exercises 3 and 6 are
# specified by their **contract** (what the functions take, return, keep invariant and refuse): you
# design the steps; hints you open on purpose (the ▸ lines) hold a recipe. Exercise 7 asks you to
# **predict** a format's storage cost before the last cell measures it.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, the grader calls your functions on tensors of its own (random ones of random
#   shapes drawn for you, and a grid of edge cases) and compares them with `course_lib.quant`'s reference, so
#   write the general code, not the examples' answers. Do not import the answers from `course_lib.quant`:
#   the grader flags an answer that does, and while it grades, the course's versions of these functions are
#   not in the library (the NF4 levels of the setup cell are).
# * Use PyTorch (`torch.round`, `torch.clamp`, `amax`, `reshape`, ...); no loops over elements needed.
# * Conventions (the same as `course_lib.quant`): the **scale** is the step size Δ, the real value of one
#   integer step, so `x ≈ codes * scale`. Round with `torch.round`. Codes may be any integer dtype
#   (`torch.int8` is natural); scales are float tensors.
#
# 8 exercises: 3 + 3 + 3 + 2 + 1 + 4 + 2 + 2 (written, graded by your instructor) = 20 points.

# %% id="c003"
import math

import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.quant import nf4_codebook

# The 16 NF4 levels (QLoRA), sorted, from -1 to 1; index 7 is exactly 0 (exercise 6; notebook 02, section 9).
NF4 = nf4_codebook()

# Known misconceptions: when a test finds one of these in your answer, its message names it.
MISTAKES = {
    "absmax_128": "absmax divides by 2**(bits-1) = 128 for 8 bits; the largest code is qmax = 2**(bits-1) - 1 = "
                  "127 (-128 stays unused so the grid is symmetric), so scale = max|x| / 127 (see notebook 02, "
                  "section '2. From floats to integers: absmax and zero-point quantization')",
    "group_strided": "the groups take every (cols // group_size)-th value of a row (reshape(rows, group_size, -1)) "
                     "instead of group_size consecutive values (reshape(rows, -1, group_size)); the formats store "
                     "a scale per run of consecutive weights (see notebook 02, section '3. Granularity: one "
                     "scale per tensor, per channel, or per group')",
    "nf4_bucketize": "the NF4 code is the level at or above x / absmax (torch.bucketize / searchsorted on the "
                     "levels), not the nearest level; search the midpoints between neighbouring levels, or take "
                     "the argmin of the distance (see notebook 02, section '9. NF4: a codebook shaped like the "
                     "weights')",
    "bits_no_scales": "the bits per weight leave out the scales: each group of group_size weights also stores "
                      "one scale of scale_bits bits, scale_bits / group_size bits per weight (see notebook 02, "
                      "section '7. Memory arithmetic for 7B and 70B models')",
    "partial_group_dropped": "the scales were counted as numel / group_size (or rounded down): a tensor whose "
                             "length is not a multiple of the group still stores one scale for its short last "
                             "group, so it stores ceil(numel / group_size) scales (see notebook 02, section '8. "
                             "Block formats: GGUF Q8_0 and Q4_0, byte for byte')",
    "dq_outer_forgotten": "double quantization was counted as the quantized scales alone: every group of "
                          "scale_group scales also stores an outer scale, and the tensor an offset (see notebook "
                          "02, section '9. NF4: a codebook shaped like the weights')",
}


# %% [markdown] id="c004"
# ## Exercise 1 — Absmax (symmetric) quantization (3 points)
#
# With `b` bits, absmax uses the codes `-qmax..qmax` with `qmax = 2**(b-1) - 1` (127 for 8 bits; the code
# -128 stays unused so the grid is symmetric):
#
# * `scale = max|x| / qmax`, a 0-d tensor (one scale for the whole tensor);
# * `codes = clamp(round(x / scale), -qmax, qmax)`, same shape as `x`;
# * dequantize: `x_hat = codes * scale` (a float tensor).
#
# Two rules: raise `ValueError` if `bits` is not in 2..8, and an all-zero `x` must not divide by zero: its
# scale is 0, its codes 0, and it dequantizes to zeros (no NaN).
#
# The lecture notes' example: absmax 3.2, 8 bits: 0.1 → round(0.1 · 127 / 3.2) = 4 → 4 · 3.2 / 127 = 0.1008.

# %% id="c005" nbgrader={"grade": false, "grade_id": "absmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
def absmax_quantize(x, bits=8):
    """Symmetric per-tensor quantization. Returns (codes, scale)."""
    ### BEGIN SOLUTION
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    scale = x.abs().max() / qmax
    if scale == 0:
        return torch.zeros_like(x, dtype=torch.int8), scale
    codes = torch.clamp(torch.round(x / scale), -qmax, qmax).to(torch.int8)
    return codes, scale
    ### END SOLUTION


def absmax_dequantize(codes, scale):
    """codes * scale, as floats."""
    ### BEGIN SOLUTION
    return codes.float() * scale
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "absmax_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_x = torch.tensor([0.1, 3.2, -1.7])
_codes, _scale = absmax_quantize(_x, 8)
check_close(_scale, 3.2 / 127, "absmax_quantize([0.1, 3.2, -1.7], 8): scale = 3.2 / 127", rtol=1e-6,
            mistakes={MISTAKES["absmax_128"]: 3.2 / 128})
check_equal(_codes, torch.tensor([4, 127, -67]), "absmax_quantize([0.1, 3.2, -1.7], 8): codes",
            mistakes={MISTAKES["absmax_128"]: torch.tensor([4, 127, -68])})
check_close(absmax_dequantize(_codes, _scale)[0], 0.1008, "the lecture notes' example: 0.1 dequantizes to",
            atol=5e-5)
_codes, _scale = absmax_quantize(torch.tensor([-1.4, 0.25, 0.66]), 4)
check_equal(_codes, torch.tensor([-7, 1, 3]), "absmax_quantize([-1.4, 0.25, 0.66], 4): codes (qmax = 7)")
check_close(_scale, 0.2, "absmax_quantize([-1.4, 0.25, 0.66], 4): scale", rtol=1e-6)
_codes, _scale = absmax_quantize(torch.zeros(5), 4)
_x_hat = absmax_dequantize(_codes, _scale)
check_equal(_codes, torch.zeros(5), "absmax_quantize(zeros): codes")
check_equal(_x_hat, torch.zeros(5), "absmax_dequantize of an all-zero tensor (no NaN)")
check_raises(lambda: absmax_quantize(torch.ones(3), 1), ValueError, "absmax_quantize with bits=1")
check_raises(lambda: absmax_quantize(torch.ones(3), 9), ValueError, "absmax_quantize with bits=9")

# %% [markdown] id="c007"
# ## Exercise 2 — Zero-point (asymmetric) quantization (3 points)
#
# Zero-point quantization uses all `2**b` codes, `qmin = -2**(b-1)` to `qmax = 2**(b-1) - 1`, and maps the
# data's range onto them. Widen the range to include 0, so that 0 is represented exactly:
#
# * `lo = min(x.min(), 0)`, `hi = max(x.max(), 0)`;
# * `scale = (hi - lo) / (2**b - 1)` (a 0-d tensor);
# * `zero_point = qmin - round(lo / scale)`, an integer (the code of the real value 0);
# * `codes = clamp(round(x / scale) + zero_point, qmin, qmax)`;
# * dequantize: `x_hat = (codes - zero_point) * scale`.
#
# Raise `ValueError` for `bits` outside 2..8; an all-zero tensor must dequantize to zeros (no NaN; use
# `zero_point = qmin` and codes `qmin` when the scale is 0).
#
# The lecture notes' example: max 3.2, min -3.0, 8 bits: 255 / 6.2 = 41.13 steps per unit (our scale is the
# inverse, 6.2 / 255), zero point -round(41.13 · -3.0) - 128 = -5, and 0.1 → round(41.13 · 0.1 - 5) = -1.

# %% id="c008" nbgrader={"grade": false, "grade_id": "zeropoint", "locked": false, "schema_version": 3, "solution": true, "task": false}
def zeropoint_quantize(x, bits=8):
    """Asymmetric per-tensor quantization. Returns (codes, scale, zero_point)."""
    ### BEGIN SOLUTION
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    lo = torch.clamp(x.min(), max=0)
    hi = torch.clamp(x.max(), min=0)
    scale = (hi - lo) / (qmax - qmin)
    if scale == 0:
        return torch.full_like(x, qmin, dtype=torch.int8), scale, qmin
    zero_point = int(qmin - torch.round(lo / scale))
    codes = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax).to(torch.int8)
    return codes, scale, zero_point
    ### END SOLUTION


def zeropoint_dequantize(codes, scale, zero_point):
    """(codes - zero_point) * scale, as floats."""
    ### BEGIN SOLUTION
    return (codes.float() - zero_point) * scale
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "zeropoint_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_codes, _scale, _zp = zeropoint_quantize(torch.tensor([0.1, 3.2, -3.0]), 8)
check_close(1 / torch.as_tensor(_scale), 41.129, "zeropoint_quantize([0.1, 3.2, -3.0], 8): 1 / scale (steps per unit)",
            rtol=1e-4)
check_equal(int(_zp), -5, "zeropoint_quantize([0.1, 3.2, -3.0], 8): zero point")
check_equal(_codes, torch.tensor([-1, 127, -128]), "zeropoint_quantize([0.1, 3.2, -3.0], 8): codes")
check_close(zeropoint_dequantize(_codes, _scale, _zp), torch.tensor([4.0, 132.0, -123.0]) * 6.2 / 255,
            "zeropoint_dequantize of those codes: (codes - zero_point) * scale, every element (127 + 5 = 132 does "
            "not fit in an int8: subtract in a wider type)", rtol=1e-5)
# all positive data: the range is widened to include 0 (lo = 0), so 0 maps to qmin
_codes, _scale, _zp = zeropoint_quantize(torch.tensor([1.0, 2.0, 3.0]), 2)
check_close(_scale, 1.0, "zeropoint_quantize([1, 2, 3], 2): scale = (3 - 0) / 3", rtol=1e-6)
check_equal(int(_zp), -2, "zeropoint_quantize([1, 2, 3], 2): zero point (= qmin, since lo = 0)")
check_equal(_codes, torch.tensor([-1, 0, 1]), "zeropoint_quantize([1, 2, 3], 2): codes")
_codes, _scale, _zp = zeropoint_quantize(torch.zeros(4), 8)
check_equal(int(_zp), -128, "zeropoint_quantize(zeros, 8): zero point (= qmin when the scale is 0)")
check_equal(_codes, torch.full((4,), -128), "zeropoint_quantize(zeros, 8): codes (all qmin)")
check_equal(zeropoint_dequantize(_codes, _scale, _zp), torch.zeros(4), "zero-point round trip of an all-zero tensor")
check_raises(lambda: zeropoint_quantize(torch.ones(3), 0), ValueError, "zeropoint_quantize with bits=0")

# %% [markdown] id="c010"
# ## Exercise 3 — Per-group absmax quantization (3 points, contract)
#
# One scale for a whole weight matrix lets its single largest value set the step for everybody. Per-group
# quantization gives each run of `group_size` **consecutive** weights of a row its own absmax scale (GPTQ
# and AWQ use 128 [@frantar2023gptq; @lin2024awq], GGUF's Q4_0 32; notebook 02, section 3).
#
# **Contract.** `group_quantize(w, bits, group_size)` returns `(codes, scales)`:
#
# * takes `w`, a 2-D float tensor `[rows, cols]`; `bits` in 2..8; `group_size`, a positive int that divides `cols`;
# * `scales`: float, shape `[rows, cols // group_size]`; `scales[i, j]` belongs to the group
#   `w[i, j*group_size:(j+1)*group_size]` and is its absmax step, `max|group| / qmax` with `qmax = 2**(bits-1) - 1`;
# * `codes`: integer, the shape of `w`, in `-qmax..qmax`: each weight's code on its group's grid (rounded to nearest);
# * invariants: `|w - group_dequantize(codes, scales, group_size)| <= scale / 2` element-wise (each weight's
#   group scale); the largest-magnitude weight of each group is reproduced exactly (up to float rounding);
#   an all-zero group gets scale 0 and codes 0 (no NaN); `w` is not modified;
# * no Python loop over rows or groups (a 4096 × 4096 weight has 131,072 groups of 128);
# * raises `ValueError` if `group_size` does not divide `cols` (or is not a positive int), or `bits` is not in 2..8.
#
# `group_dequantize(codes, scales, group_size)` returns the float tensor `[rows, cols]` of each code times its
# group's scale.
#
# <details><summary>Hint 1: one group per row of a 3-D view</summary>
#
# `w.reshape(rows, cols // group_size, group_size)` puts each group of consecutive values on the last
# dimension (row-major order keeps a row's values together). Which reshape would mix values of different
# groups?
# </details>
#
# <details><summary>Hint 2: the recipe</summary>
#
# 1. `groups = w.reshape(rows, cols // group_size, group_size)`;
# 2. `scales = groups.abs().amax(dim=-1) / qmax`, shape `[rows, n_groups]`;
# 3. divide each group by its scale (`scales.unsqueeze(-1)`), using 1 where the scale is 0, round, clamp to
#    `-qmax..qmax`, reshape back to `[rows, cols]`;
# 4. dequantize: reshape the codes the same way, multiply by `scales.unsqueeze(-1)`, reshape back.
# </details>

# %% id="c011" nbgrader={"grade": false, "grade_id": "group", "locked": false, "schema_version": 3, "solution": true, "task": false}
def group_quantize(w, bits, group_size):
    """Absmax quantization with one scale per group of `group_size` consecutive values of each row.
    Returns (codes [rows, cols], scales [rows, cols // group_size])."""
    ### BEGIN SOLUTION
    rows, cols = w.shape
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or cols % group_size:
        raise ValueError(f"group_size must be a positive int that divides the {cols} columns, got {group_size!r}")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    groups = w.reshape(rows, cols // group_size, group_size)
    scales = groups.abs().amax(dim=-1) / qmax                    # [rows, n_groups]
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.clamp(torch.round(groups / safe.unsqueeze(-1)), -qmax, qmax)
    return codes.reshape(rows, cols).to(torch.int8), scales
    ### END SOLUTION


def group_dequantize(codes, scales, group_size):
    """Each code times the scale of its group."""
    ### BEGIN SOLUTION
    rows, cols = codes.shape
    groups = codes.float().reshape(rows, cols // group_size, group_size)
    return (groups * scales.unsqueeze(-1)).reshape(rows, cols)
    ### END SOLUTION


# %% id="c012" nbgrader={"grade": true, "grade_id": "group_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_w = torch.tensor([[0.4, -1.0, 0.2, 0.05],
                   [3.0, 0.0, -0.7, 0.7],
                   [0.0, 0.0, 0.0, 0.0]])
_codes, _scales = group_quantize(_w, 4, 2)
check_shape(_scales, (3, 2), "group_quantize(w [3, 4], 4 bits, group_size=2): scales")
check_close(_scales, torch.tensor([[1.0, 0.2], [3.0, 0.7], [0.0, 0.0]]) / 7, "group_quantize(...): scales = group absmax / 7",
            rtol=1e-6, mistakes={MISTAKES["group_strided"]: torch.tensor([[0.4, 1.0], [3.0, 0.7], [0.0, 0.0]]) / 7})
check_equal(_codes, torch.tensor([[3, -7, 7, 2], [7, 0, -7, 7], [0, 0, 0, 0]]), "group_quantize(...): codes")
_w_hat = group_dequantize(_codes, _scales, 2)
check_close(_w_hat[0], torch.tensor([3 / 7, -1.0, 0.2, 0.4 / 7]), "group_dequantize(...): first row", rtol=1e-6)
check_equal(_w_hat[2], torch.zeros(4), "group_dequantize: an all-zero row stays zero (no NaN)")
# one group per row = one scale per row
_codes, _scales = group_quantize(_w, 8, 4)
check_close(_scales[:, 0], torch.tensor([1.0, 3.0, 0.0]) / 127, "group_quantize(w, 8, group_size=4): one scale per row",
            rtol=1e-6)
check_raises(lambda: group_quantize(_w, 4, 3), ValueError, "group_quantize with group_size=3 on 4 columns")
check_raises(lambda: group_quantize(_w, 9, 2), ValueError, "group_quantize with bits=9")

# %% [markdown] id="c013"
# ## Exercise 4 — Packing two int4 codes per byte (2 points)
#
# PyTorch has no 4-bit dtype, so 4-bit codes (-8..7) are stored two per byte:
#
# * `pack_int4(codes)`: `codes` is an integer tensor `[..., 2n]` with values in -8..7; return a `torch.uint8`
#   tensor `[..., n]` whose byte `j` holds `codes[..., 2j]` in its **low** nibble (bits 0-3) and
#   `codes[..., 2j+1]` in its **high** nibble (bits 4-7). A negative code is stored as its 4-bit two's
#   complement: `code & 0xF` (for example -2 → `0b1110` = 14).
# * `unpack_int4(packed)`: the exact inverse, returning integer codes in -8..7 (a nibble of 8 or more
#   stands for `nibble - 16`).
#
# Example: codes `[1, -2]` → one byte `0xE1` (low nibble 1, high nibble 14).

# %% id="c014" nbgrader={"grade": false, "grade_id": "packing", "locked": false, "schema_version": 3, "solution": true, "task": false}
def pack_int4(codes):
    """[..., 2n] codes in -8..7 -> [..., n] uint8, element 2j in the low nibble."""
    ### BEGIN SOLUTION
    nib = (codes.to(torch.int16) & 0xF).to(torch.uint8)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)
    ### END SOLUTION


def unpack_int4(packed):
    """[..., n] uint8 -> [..., 2n] codes in -8..7."""
    ### BEGIN SOLUTION
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    low = torch.where(low >= 8, low - 16, low)
    high = torch.where(high >= 8, high - 16, high)
    return torch.stack([low, high], dim=-1).flatten(-2)
    ### END SOLUTION


# %% id="c015" nbgrader={"grade": true, "grade_id": "packing_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_p = pack_int4(torch.tensor([1, -2, 7, -8], dtype=torch.int8))
check_equal(_p.dtype, torch.uint8, "pack_int4(...).dtype")
check_equal(_p, torch.tensor([0xE1, 0x87]), "pack_int4([1, -2, 7, -8]): bytes")
_all = torch.arange(-8, 8, dtype=torch.int8)
check_equal(unpack_int4(pack_int4(_all)), _all, "unpack_int4(pack_int4(every code -8..7))")
check_equal(unpack_int4(torch.tensor([0xE1], dtype=torch.uint8)), torch.tensor([1, -2]), "unpack_int4([0xE1])")
_c = torch.tensor([[1, 2, 3, 4, 5, 6], [-1, -2, -3, -4, -5, -6]], dtype=torch.int8)
check_shape(pack_int4(_c), (2, 3), "pack_int4 of a [2, 6] tensor")
check_equal(unpack_int4(pack_int4(_c)), _c, "round trip of a [2, 6] tensor")

# %% [markdown] id="c016"
# ## Exercise 5 — SQNR (1 point)
#
# The signal-to-quantization-noise ratio in decibels:
# `SQNR = 10 · log10( sum(x²) / sum((x - x_hat)²) )`. Return a Python float, and `math.inf` when `x_hat`
# equals `x` exactly (no noise).

# %% id="c017" nbgrader={"grade": false, "grade_id": "sqnr", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sqnr_db(x, x_hat):
    """Signal-to-quantization-noise ratio in dB."""
    ### BEGIN SOLUTION
    signal = float((x.double() ** 2).sum())
    noise = float(((x.double() - x_hat.double()) ** 2).sum())
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise)
    ### END SOLUTION


# %% id="c018" nbgrader={"grade": true, "grade_id": "sqnr_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
_x = torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=torch.float64)
check_close(sqnr_db(_x, _x * 1.1), 20.0, "sqnr_db(x, 1.1 x): the noise is 1% of the signal power", rtol=1e-9)
check_close(sqnr_db(_x, _x + 1.0), 10 * math.log10(30 / 4), "sqnr_db([1, -2, 3, -4], x + 1)", rtol=1e-9)
check_equal(sqnr_db(_x, _x.clone()), math.inf, "sqnr_db(x, x) (no noise)")

# %% [markdown] id="c018a"
# ## Exercise 6 — NF4: a 16-level codebook, blockwise (4 points, contract)
#
# A uniform grid spends as many of its 16 levels on the rare tails of a weight distribution as on its crowded
# middle. NF4 ([@dettmers2023qlora]; notebook 02, section 9) puts its 16 levels at quantiles of the normal distribution instead, scaled into [-1, 1]. They
# are given: `NF4` (setup cell), a sorted float32 tensor of 16 values, `NF4[0] = -1`, `NF4[7] = 0`,
# `NF4[15] = 1`, unevenly spaced. A weight is stored as the index (0..15) of a level, in blocks of
# `blocksize` consecutive values, each block with its absmax.
#
# **Contract.** `nf4_quantize(x, blocksize=64)` returns `(codes, absmax)`:
#
# * takes `x`, a float tensor of any shape whose number of elements is a multiple of `blocksize`; the
#   blocks are `blocksize` consecutive values of `x.reshape(-1)` (row-major order);
# * `absmax`: float32, shape `[x.numel() // blocksize]`, the largest `|x|` of each block;
# * `codes`: an integer tensor (uint8 is natural) of the shape of `x`, values in 0..15: for each value, the
#   index of the NF4 level **nearest** to `x / absmax` of its block (ties: either neighbour);
# * an all-zero block has absmax 0 and codes 7 (the level 0), with no NaN anywhere;
# * no Python loop over blocks or values; `x` is not modified;
# * raises `ValueError` if `blocksize` is not a positive int or does not divide `x.numel()`.
#
# `nf4_dequantize(codes, absmax, blocksize=64)` returns float32 values of the shape of `codes`: each code's
# level times its block's absmax. Invariants the tests check: the value of largest magnitude of each block
# comes back exactly (`NF4[0]` and `NF4[15]` are -1 and 1), 0 comes back as 0, and every value comes back
# within half the gap between the two levels around `x / absmax`, times the absmax. The grader compares
# with `course_lib.quant.nf4_quantize` (bitsandbytes' format, without its packing) on tensors of its own.
#
# <details><summary>Hint 1: nearest, not next</summary>
#
# The levels are sorted but not evenly spaced, so `round(x * 7)` does not give the index. Two ways to the
# nearest level: the `argmin` over the 16 levels of `|x / absmax - NF4|` (a `[n, 16]` table: fine, 16 is
# small), or `torch.bucketize` on the 15 **midpoints** `(NF4[:-1] + NF4[1:]) / 2`. What does `bucketize` on the
# levels themselves return?
# </details>
#
# <details><summary>Hint 2: the recipe</summary>
#
# 1. `blocks = x.reshape(-1, blocksize)`; `absmax = blocks.abs().amax(dim=1)`;
# 2. `scaled = blocks / absmax[:, None]`, dividing by 1 where the absmax is 0;
# 3. `codes = torch.bucketize(scaled, (NF4[:-1] + NF4[1:]) / 2)`, reshaped to `x.shape`, as uint8;
# 4. dequantize: `NF4[codes.long()].reshape(-1, blocksize) * absmax[:, None]`, reshaped to `codes.shape`.
# </details>

# %% id="c018b" nbgrader={"grade": false, "grade_id": "nf4", "locked": false, "schema_version": 3, "solution": true, "task": false}
def nf4_quantize(x, blocksize=64):
    """Blockwise NF4: (codes in 0..15 with the shape of x, absmax [numel // blocksize] float32)."""
    ### BEGIN SOLUTION
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
        raise ValueError(f"blocksize must be a positive int, got {blocksize!r}")
    if x.numel() % blocksize:
        raise ValueError(f"blocksize={blocksize} does not divide the {x.numel()} elements of x")
    blocks = x.detach().reshape(-1, blocksize).float()
    absmax = blocks.abs().amax(dim=1)
    safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    scaled = blocks / safe[:, None]
    codes = torch.bucketize(scaled, (NF4[:-1] + NF4[1:]) / 2)
    return codes.reshape(x.shape).to(torch.uint8), absmax
    ### END SOLUTION


def nf4_dequantize(codes, absmax, blocksize=64):
    """Each code's NF4 level times its block's absmax, float32, shaped like codes."""
    ### BEGIN SOLUTION
    vals = NF4[codes.long()].reshape(-1, blocksize)
    return (vals * absmax.float()[:, None]).reshape(codes.shape)
    ### END SOLUTION


# %% id="c018c" nbgrader={"grade": true, "grade_id": "nf4_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
_x = torch.tensor([[0.5, -1.0, 0.02, 0.2], [0.0, 0.0, 0.0, 0.0], [2.0, -0.39, 0.31, 1.3]])
_codes, _absmax = nf4_quantize(_x, blocksize=4)
check_close(_absmax, torch.tensor([1.0, 0.0, 2.0]), "nf4_quantize(x [3, 4], blocksize=4): absmax per block of 4")
# 0.5 is nearest to level 0.4407 (index 12), 0.02 to 0.0 (7), 0.2 to 0.1609 (9); in block 3, -0.39 / 2 = -0.195
# is nearest to -0.1848 (5), 0.31 / 2 = 0.155 to 0.1609 (9), 1.3 / 2 = 0.65 to 0.7230 (14)
check_equal(torch.as_tensor(_codes).long(), torch.tensor([[12, 0, 7, 9], [7, 7, 7, 7], [15, 5, 9, 14]]),
            "nf4_quantize(x [3, 4], blocksize=4): codes (the index of the nearest level)",
            mistakes={MISTAKES["nf4_bucketize"]: torch.tensor([[13, 0, 8, 10], [7, 7, 7, 7], [15, 5, 9, 14]])})
check_shape(torch.as_tensor(_codes), (3, 4), "nf4_quantize(x [3, 4]): codes")
_x_hat = nf4_dequantize(_codes, _absmax, blocksize=4)
check_close(_x_hat, NF4[torch.tensor([[12, 0, 7, 9], [7, 7, 7, 7], [15, 5, 9, 14]])] * torch.tensor([[1.0], [0.0], [2.0]]),
            "nf4_dequantize(codes, absmax, blocksize=4)", rtol=1e-6)
check_equal(_x_hat[1], torch.zeros(4), "nf4_dequantize of an all-zero block (zeros, no NaN)")
check_equal(_x_hat[2, 0], torch.tensor(2.0), "the largest value of a block comes back exactly")
check_raises(lambda: nf4_quantize(torch.ones(10), 4), ValueError, "nf4_quantize(10 values, blocksize=4)")
check_raises(lambda: nf4_quantize(torch.ones(8), 0), ValueError, "nf4_quantize(x, blocksize=0)")
print("Exercise 6: visible tests passed")

# %% [markdown] id="c018d"
# ## Exercise 7 — Predict a format's bits on a real tensor (2 points)
#
# Notebook 02 prices formats per weight on tensors whose size is a multiple of every block. A real checkpoint
# is not so tidy: a row of 11,008 weights (Llama-2-7B's MLP) is not a multiple of 256, a bias or a norm has a
# few hundred weights, and QLoRA [@dettmers2023qlora] stores its scales themselves quantized. Predict the
# storage exactly, for a given tensor.
#
# Write `predict_bits_per_weight(bits, group_size=None, scale_bits=16, numel=None, scale_group=None, outer_bits=32)`:
#
# * **the format**: every weight a `bits`-bit code; every run of `group_size` consecutive weights (the
#   flattened tensor cut from the start; the last run may be shorter) shares one scale of `scale_bits` bits.
#   `group_size=None` means one scale for the whole tensor. With `scale_group` (double quantization), the
#   scales are themselves grouped the same way, `scale_group` consecutive scales per group, and each group of
#   scales stores one `outer_bits` scale; the tensor then also stores one `outer_bits` offset (the mean
#   subtracted from the scales before they are quantized, as QLoRA does);
# * **returns** the bits per weight (a float): all the bits the tensor stores, divided by its `numel`
#   weights. With `numel=None`, the limit for a very long tensor (the per-tensor numbers, one scale or one
#   offset, count 0);
# * **raises** `ValueError` for `bits < 1`, a `group_size`, `numel` or `scale_group` that is not None or a
#   positive int, or a `scale_group` without a `group_size`.
#
# The grader draws its own formats and tensor sizes and compares with the exact number of bits the format
# stores, as defined above: nothing is padded to whole bytes, and `bits`, `scale_bits` and `outer_bits` may
# be any positive numbers (a 12.5-bit scale is an average over scales of mixed widths). The visible tests
# check units, bounds and limits; the last cell measures the bytes your own functions store on a real weight
# matrix and prints them beside your predictions.
#
# <details><summary>Hint 1: count, then divide</summary>
#
# Count what the tensor stores (codes, scales, outer scales, the offset) as whole items, then divide by the
# weights. Pitfall: a tensor whose length is not a multiple of the group still stores a scale for its short
# last group; dividing the length by the group size does not count it.
# </details>
#
# <details><summary>Hint 2: the limit</summary>
#
# For a very long tensor, the items stored once per tensor vanish per weight, and the short last groups do
# too. Pitfall: forgetting that the outer scales are shared by `group_size × scale_group` weights each.
# </details>

# %% id="c018e" nbgrader={"grade": false, "grade_id": "predict_bits_per_weight", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_bits_per_weight(bits, group_size=None, scale_bits=16, numel=None, scale_group=None, outer_bits=32):
    """Storage bits per weight: codes, one scale per group of weights, optionally grouped (double quantized)
    scales with one outer scale per group of scales and a per-tensor offset; exact for `numel` weights."""
    ### BEGIN SOLUTION
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits!r}")
    for name, value in (("group_size", group_size), ("numel", numel), ("scale_group", scale_group)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be None or a positive int, got {value!r}")
    if scale_group is not None and group_size is None:
        raise ValueError("scale_group needs a group_size (scales to group)")
    if numel is None:                                     # a long tensor: per-tensor items vanish, groups are full
        if group_size is None:
            return float(bits)
        outer = 0.0 if scale_group is None else outer_bits / (group_size * scale_group)
        return bits + scale_bits / group_size + outer
    scales = 1 if group_size is None else -(-numel // group_size)        # a short last group has a scale too
    total = bits * numel + scale_bits * scales
    if scale_group is not None:
        total += outer_bits * (-(-scales // scale_group)) + outer_bits  # outer scales, and the offset
    return total / numel
    ### END SOLUTION


# %% id="c018f" nbgrader={"grade": true, "grade_id": "predict_bits_per_weight_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _bpw(*args, **kw):
    got = predict_bits_per_weight(*args, **kw)
    check_equal(isinstance(got, (int, float)) and not isinstance(got, bool), True,
                f"predict_bits_per_weight{args, kw} returns a number of bits per weight, got {got!r}")
    return float(got)


for _g, _sb in ((32, 16), (64, 32), (128, 16)):
    _long = _bpw(4, _g, _sb)
    check_equal(4 < _long <= 4 + _sb, True, f"group {_g}, {_sb}-bit scales: between the codes alone (4) and a "
                f"scale per weight, got {_long}; if it is 4: {MISTAKES['bits_no_scales']}")
    check_close(_bpw(4, _g, _sb, numel=_g * 10**6), _long, f"a tensor of a million groups of {_g}: the long-tensor "
                "limit", rtol=1e-9)
    check_equal(_bpw(4, _g, _sb, numel=_g * 1000 + 1) > _bpw(4, _g, _sb, numel=_g * 1000), True,
                f"one weight more than 1000 groups of {_g} costs more per weight (a whole scale for one weight)")
_single = _bpw(4, 64, 8, scale_group=256)
check_equal(4 < _single < _bpw(4, 64, 32), True, "NF4-like blocks of 64 with 8-bit scales grouped by 256 cost "
            "less than fp32 scales, more than the codes alone")
check_equal(_bpw(8, numel=10) > _bpw(8), True, "ten weights with one per-tensor scale: the scale counts")
check_raises(lambda: predict_bits_per_weight(4, 0), ValueError, "predict_bits_per_weight(4, group_size=0)")
check_raises(lambda: predict_bits_per_weight(4, None, scale_group=256), ValueError,
             "predict_bits_per_weight(4, group_size=None, scale_group=256)")
print("Exercise 7: visible tests passed")

# %% [markdown] id="c019"
# ## Try it on a real weight matrix (not graded)
#
# Your functions on the course model's first MLP up-projection: per tensor against per group, 2 to 8 bits.
# Notice what each extra bit adds, and what per-group scales add at each width.

# %% id="c020"
import os

try:
    if os.environ.get("NBGRADER_EXECUTION"):
        raise RuntimeError("skipped while grading")
    from course_lib.models import load

    _model, _ = load("tiny", device="cpu")
    W = _model.model.layers[0].mlp.up_proj.weight.detach().float()
    for bits in range(2, 9):
        c, s = absmax_quantize(W, bits)
        gc, gs = group_quantize(W, bits, 32)
        print(f"{bits} bits: per tensor {sqnr_db(W, absmax_dequantize(c, s)):6.2f} dB, "
              f"per group of 32 {sqnr_db(W, group_dequantize(gc, gs, 32)):6.2f} dB")
    print("packed 4-bit codes take", pack_int4(absmax_quantize(W, 4)[0]).numel(), "bytes for", W.numel(), "weights")
    # predicted, then measured: the bytes your functions' outputs take, stored as the formats store them
    gc, gs = group_quantize(W, 4, 128)
    measured_g128 = 8 * (pack_int4(gc).numel() + gs.numel() * 2) / W.numel()      # packed codes + fp16 scales
    nc, na = nf4_quantize(W, 64)
    measured_nf4 = 8 * (pack_int4(nc.to(torch.int8) - 8).numel() + na.numel() * 4) / W.numel()  # + fp32 absmax
    print(f"int4, group 128, fp16 scales: predicted {predict_bits_per_weight(4, 128, 16):.3f} bits/weight, "
          f"measured {measured_g128:.3f}")
    print(f"NF4, block 64, fp32 absmax:   predicted {predict_bits_per_weight(4, 64, 32):.3f} bits/weight, "
          f"measured {measured_nf4:.3f}; SQNR NF4 {sqnr_db(W, nf4_dequantize(nc, na, 64)):.2f} dB "
          f"vs int4 absmax group 64 {sqnr_db(W, group_dequantize(*group_quantize(W, 4, 64), 64)):.2f} dB")
except NotImplementedError:
    print("Finish the exercises above first.")
except RuntimeError as e:
    print(e)

# %% [markdown] id="c021"
# ## Going further
#
# * The rule of thumb "6.02 dB per bit + 1.76 dB" is for a full-scale sine wave. Predict the SQNR of absmax
#   int8 on 4096 values drawn from N(0, 1), whose absmax is about 3.87 σ, from the uniform noise model
#   (noise power Δ²/12), and check it with your functions.
# * On Gaussian data NF4 beats int4 absmax with the same block of 64. Does it on uniform data in [-1, 1]?
#   Why?
# * How many GB does Llama-2-7B (6,738,415,616 parameters) take in fp16, int4 with group 128 and fp16
#   scales, GGUF Q4_0, and NF4 with double quantization (4 + 8/64 + 32/(64·256) bits per weight)?
# * Exercise 4 packs element 2j in the low nibble; bitsandbytes (NF4) puts the first element in the high
#   nibble, and Q4_0 pairs element j with element j + 16. Does the order change the memory or the error?
#   What does it change?

# %% [markdown] id="cw02p"
# ## Exercise 8 — Written analysis: the bits you pay and the error you get (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run "Try it on a real weight matrix"
# first (it is skipped while grading), then answer in 100 to 200 words, about **your** printout:
#
# 1. how many dB does one more bit add, per tensor and per group of 32? Quote two rows, compare with the
#    uniform-noise model's 6.02 dB per bit, and say where and why your numbers depart from it;
# 2. how many dB do per-group scales gain over one scale per tensor, and is that gain the same at every
#    width? Explain it (what sets absmax's step, and what one large weight does to it), and say at which
#    widths the gain matters for a model and why;
# 3. compare NF4 with int4 absmax at the same block size: which has the higher SQNR on this matrix, why, and
#    did your predicted bits per weight match the measured ones (why must they)?
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw02" nbgrader={"grade": true, "grade_id": "written_bits_and_error", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on a 2-core CPU, torch 2.13; your
# numbers will differ: what matters is how you explain them.)*
#
# From 6 to 7 bits my per-tensor SQNR went from 26.33 to 32.46 dB and per group of 32 from 33.06 to 39.22: about
# 6 dB per bit, as the uniform model says: one more bit divides absmax's step, max|w| / (2^(b-1) - 1), by about
# 2, and the noise power Δ²/12 by 4. It departs in two ways. At low widths a bit adds more than 6.02 dB (3 to 4
# bits: 6.07 to 13.38, 7.3 dB) because the symmetric grid drops a code: the step shrinks by 7/3, not 2 (7.4 dB);
# 6.02 is only the limit. At 2 bits per tensor the model fails: the levels are -max, 0 and max, the largest weight
# of the whole matrix sets the step, nearly every weight rounds to 0, the error is the weight itself, and 0.24 dB
# is barely better than zeroing the matrix (0 dB).
#
# A group of 32 has its own maximum, usually far below the one large weight that sets the matrix's, so its
# step is smaller: a constant 6.7 dB gain from 3 to 8 bits (20.11 against 13.38 at 4 bits), the same noise
# power divided by about 4.7 at every width. That gain matters most at low widths: at 8 bits both errors are
# negligible, at 4 bits groups beat per-tensor 5 bits (20.02 dB) for 0.5 bit of fp16 scale per weight. At 2 bits
# the gap narrows to 3.4 dB (3.60 against 0.24): groups zero most of their weights too.
#
# NF4 beat int4 absmax with blocks of 64 by 1.48 dB (20.67 against 19.19): its 16 levels are quantiles of a
# normal distribution, dense near zero where most of these roughly Gaussian weights lie, while int4's 15 are
# evenly spaced up to the block's maximum. The predicted and measured bits per weight agree exactly (4.125 and
# 4.500 both times) because both count the same stored bytes, codes plus scales: an accounting identity, not a
# model of behaviour.

# %% [markdown] id="c022" tags=["answer-key"]
# ### Answer key
#
# * The step is Δ = absmax / 127 ≈ 3.87 σ / 127, the noise power Δ²/12 and the signal power σ², so
#   SQNR = 10 log10(12 · 127² / 3.87²) ≈ **41.1 dB** (measured: 41.1 dB on 16 rows of 4096 values, seed 0),
#   9 dB below 49.9 dB: a Gaussian's peak is 3.9 σ from its mean where a sine's is only √2 times its RMS,
#   so most codes go unused. Each bit still adds 6.02 dB.
# * No: on uniform data int4 absmax (group 64) gets about **23.1 dB** and NF4 about **20.8 dB** (on Gaussian
#   data: NF4 20.7 dB against 19.3 dB). Uniform data fill a uniform grid evenly, which is its best case; NF4
#   crowds its levels near 0 where uniform data are no denser than anywhere else, and leaves wide gaps near
#   ±1 (0.72 to 1.0) where they are as dense.
# * fp16: 6.738e9 × 2 = **13.48 GB**; int4-g128: 4.125 bits, **3.47 GB**; Q4_0: 4.5 bits, **3.79 GB**;
#   NF4 with double quantization: 4.127 bits, **3.48 GB** (NF4 with fp32 absmax, 4.5 bits: 3.79 GB).
# * Neither: every order stores two 4-bit codes per byte. The order is part of the file format: a reader
#   that unpacks in another order puts every weight in the wrong place (tensors of the right size and
#   nonsense values), so a kernel must match its format byte for byte. Q4_0's order lets a SIMD kernel
#   unpack 16 low nibbles and 16 high nibbles with two wide operations.

