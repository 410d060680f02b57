# %% [markdown] id="c002"
# # Lab 02 — Quantization fundamentals
#
# In this lab you write the core of integer quantization from module 02: absmax (symmetric) and
# zero-point (asymmetric) quantization and their inverses, per-group scales, packing two 4-bit codes
# into one byte, and the SQNR error metric.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it: the visible tests check fixed examples and tell you what was expected.
#   When the lab is graded, more tests run on random tensors of random shapes, so write the general
#   code, not the examples' answers.
# * Use PyTorch (`torch.round`, `torch.clamp`, `amax`, `reshape`, ...); no loops over elements needed.
# * Conventions (the same as `course_lib.quant`): the **scale** is the step size Δ, the real value of one
#   integer step, so `x ≈ codes * scale`. Round with `torch.round`. Codes may be any integer dtype
#   (`torch.int8` is natural); scales are float tensors.
#
# 5 exercises: 3 + 3 + 3 + 2 + 1 = 12 points.

# %% id="c003"
import math
import time

import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape


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
check_equal(_codes, torch.tensor([4, 127, -67]), "absmax_quantize([0.1, 3.2, -1.7], 8): codes")
check_close(_scale, 3.2 / 127, "absmax_quantize([0.1, 3.2, -1.7], 8): scale = 3.2 / 127", rtol=1e-6)
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
### BEGIN HIDDEN TESTS
import course_lib.quant as _ref

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)


def _check_codes(got, ref, what):
    """Codes equal the reference (a rare +-1 near an exact .5 tie is tolerated)."""
    got = torch.as_tensor(got)
    check_shape(got, ref.shape, what)
    diff = (got.long() - ref.long()).abs()
    if int(diff.max()) > 1 or int((diff > 0).sum()) > max(1, diff.numel() // 1000):
        check_equal(got, ref, what)


for _ in range(20):
    _shape = [int(s) for s in torch.randint(1, 40, (int(torch.randint(1, 4, (1,), generator=_g)),), generator=_g)]
    _bits = int(torch.randint(2, 9, (1,), generator=_g))
    _x = torch.randn(_shape, generator=_g) * float(torch.rand(1, generator=_g) * 10 + 1e-3)
    _what = f"absmax_quantize(x of shape {tuple(_shape)}, bits={_bits}) (random test, seed {_seed})"
    _r = _ref.absmax_quantize(_x, _bits)
    _codes, _scale = absmax_quantize(_x, _bits)
    check_close(torch.as_tensor(_scale).reshape(()), _r.scale.reshape(()), _what + ": scale", rtol=1e-6)
    _check_codes(_codes, _r.codes, _what + ": codes")
    check_close(absmax_dequantize(_codes, _scale), _r.dequantize(), _what + ": dequantized",
                atol=float(_r.scale) * 1.001 + 1e-12, rtol=0)
### END HIDDEN TESTS

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
check_close(zeropoint_dequantize(_codes, _scale, _zp)[0], 4 * 6.2 / 255, "0.1 dequantizes to (-1 + 5) * 6.2/255",
            rtol=1e-5)
# all positive data: the range is widened to include 0 (lo = 0), so 0 maps to qmin
_codes, _scale, _zp = zeropoint_quantize(torch.tensor([1.0, 2.0, 3.0]), 2)
check_close(_scale, 1.0, "zeropoint_quantize([1, 2, 3], 2): scale = (3 - 0) / 3", rtol=1e-6)
check_equal(int(_zp), -2, "zeropoint_quantize([1, 2, 3], 2): zero point (= qmin, since lo = 0)")
check_equal(_codes, torch.tensor([-1, 0, 1]), "zeropoint_quantize([1, 2, 3], 2): codes")
_codes, _scale, _zp = zeropoint_quantize(torch.zeros(4), 8)
check_equal(zeropoint_dequantize(_codes, _scale, _zp), torch.zeros(4), "zero-point round trip of an all-zero tensor")
check_raises(lambda: zeropoint_quantize(torch.ones(3), 0), ValueError, "zeropoint_quantize with bits=0")
### BEGIN HIDDEN TESTS
import course_lib.quant as _ref

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _shape = [int(s) for s in torch.randint(1, 40, (int(torch.randint(1, 4, (1,), generator=_g)),), generator=_g)]
    _bits = int(torch.randint(2, 9, (1,), generator=_g))
    _x = torch.randn(_shape, generator=_g) * float(torch.rand(1, generator=_g) * 10 + 1e-3)
    _x = _x + float(torch.randn(1, generator=_g)) * float(_x.abs().max())     # shifted: lopsided ranges too
    _what = f"zeropoint_quantize(x of shape {tuple(_shape)}, bits={_bits}) (random test, seed {_seed})"
    _r = _ref.zeropoint_quantize(_x, _bits)
    _codes, _scale, _zp = zeropoint_quantize(_x, _bits)
    check_close(torch.as_tensor(_scale).reshape(()), _r.scale.reshape(()), _what + ": scale", rtol=1e-6)
    check_equal(int(_zp), int(_r.zero_point), _what + ": zero point")
    _got = torch.as_tensor(_codes)
    check_shape(_got, _r.codes.shape, _what + ": codes")
    _diff = (_got.long() - _r.codes.long()).abs()
    if int(_diff.max()) > 1 or int((_diff > 0).sum()) > max(1, _diff.numel() // 1000):
        check_equal(_got, _r.codes, _what + ": codes")
    check_close(zeropoint_dequantize(_codes, _scale, _zp), _r.dequantize(), _what + ": dequantized",
                atol=float(_r.scale) * 1.001 + 1e-12, rtol=0)
### END HIDDEN TESTS

# %% [markdown] id="c010"
# ## Exercise 3 — Per-group absmax quantization (3 points)
#
# One scale for a whole weight matrix lets its single largest value set the step for everybody. Per-group
# quantization cuts each **row** of a 2-D weight `w [rows, cols]` into groups of `group_size` **consecutive**
# values and gives each group its own absmax scale (GPTQ and AWQ use 128, GGUF 32):
#
# * `scales` has shape `[rows, cols // group_size]`: `scales[i, j]` belongs to `w[i, j*group_size:(j+1)*group_size]`;
# * `codes` has the shape of `w`; within each group, the absmax rule of exercise 1 (`qmax = 2**(bits-1) - 1`);
# * an all-zero group gets scale 0 and codes 0 (no NaN);
# * raise `ValueError` if `group_size` does not divide `cols`.
#
# `group_dequantize(codes, scales, group_size)` returns the float tensor `codes * scale` of each element's
# group. Hint: `w.reshape(rows, cols // group_size, group_size)` puts each group on the last dimension.

# %% id="c011" nbgrader={"grade": false, "grade_id": "group", "locked": false, "schema_version": 3, "solution": true, "task": false}
def group_quantize(w, bits, group_size):
    """Absmax quantization with one scale per group of `group_size` consecutive values of each row.
    Returns (codes [rows, cols], scales [rows, cols // group_size])."""
    ### BEGIN SOLUTION
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"group_size={group_size} does not divide the {cols} columns")
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
            rtol=1e-6)
check_equal(_codes, torch.tensor([[3, -7, 7, 2], [7, 0, -7, 7], [0, 0, 0, 0]]), "group_quantize(...): codes")
_w_hat = group_dequantize(_codes, _scales, 2)
check_close(_w_hat[0], torch.tensor([3 / 7, -1.0, 0.2, 0.4 / 7]), "group_dequantize(...): first row", rtol=1e-6)
check_equal(_w_hat[2], torch.zeros(4), "group_dequantize: an all-zero row stays zero (no NaN)")
# one group per row = one scale per row
_codes, _scales = group_quantize(_w, 8, 4)
check_close(_scales[:, 0], torch.tensor([1.0, 3.0, 0.0]) / 127, "group_quantize(w, 8, group_size=4): one scale per row",
            rtol=1e-6)
check_raises(lambda: group_quantize(_w, 4, 3), ValueError, "group_quantize with group_size=3 on 4 columns")
### BEGIN HIDDEN TESTS
import course_lib.quant as _ref

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _gs = [4, 8, 16, 32, 64][int(torch.randint(0, 5, (1,), generator=_g))]
    _rows, _ng = int(torch.randint(1, 30, (1,), generator=_g)), int(torch.randint(1, 6, (1,), generator=_g))
    _bits = int(torch.randint(2, 9, (1,), generator=_g))
    _w = torch.randn(_rows, _ng * _gs, generator=_g) * 0.02
    _w[int(torch.randint(0, _rows, (1,), generator=_g)), 0] = 1.0          # an outlier in one group
    _what = (f"group_quantize(w [{_rows}, {_ng * _gs}], bits={_bits}, group_size={_gs}) "
             f"(random test, seed {_seed})")
    _r = _ref.absmax_quantize(_w, _bits, "group", axis=-1, group_size=_gs)
    _codes, _scales = group_quantize(_w, _bits, _gs)
    check_shape(_scales, (_rows, _ng), _what + ": scales")
    check_close(_scales, _r.scale, _what + ": scales", rtol=1e-6)
    _got = torch.as_tensor(_codes)
    check_shape(_got, _r.codes.shape, _what + ": codes")
    _diff = (_got.long() - _r.codes.long()).abs()
    if int(_diff.max()) > 1 or int((_diff > 0).sum()) > max(1, _diff.numel() // 1000):
        check_equal(_got, _r.codes, _what + ": codes")
    check_close(group_dequantize(_codes, _scales, _gs), _r.dequantize(), _what + ": dequantized",
                atol=float(_r.scale.max()) * 1.001, rtol=0)
### END HIDDEN TESTS

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
### BEGIN HIDDEN TESTS
import course_lib.quant as _ref

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _nd = int(torch.randint(1, 4, (1,), generator=_g))
    _shape = [int(s) for s in torch.randint(1, 12, (_nd,), generator=_g)]
    _shape[-1] *= 2
    _c = torch.randint(-8, 8, _shape, generator=_g, dtype=torch.int8)
    _what = f"codes of shape {tuple(_shape)} (random test, seed {_seed})"
    check_equal(pack_int4(_c), _ref.pack_int4(_c), "pack_int4(" + _what + ")")
    check_equal(unpack_int4(pack_int4(_c)), _c, "unpack_int4(pack_int4(" + _what + "))")
    _b = torch.randint(0, 256, _shape[:-1] + [_shape[-1] // 2], generator=_g, dtype=torch.uint8)
    check_equal(unpack_int4(_b), _ref.unpack_int4(_b), f"unpack_int4(random bytes) (seed {_seed})")
### END HIDDEN TESTS

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
### BEGIN HIDDEN TESTS
import course_lib.quant as _ref

_seed = time.time_ns() % 2 ** 31
_g = torch.Generator().manual_seed(_seed)
for _ in range(20):
    _x = torch.randn(int(torch.randint(2, 500, (1,), generator=_g)), generator=_g)
    _noise = float(torch.rand(1, generator=_g)) * 0.5
    _x_hat = _x + _noise * torch.randn(_x.shape, generator=_g)
    check_close(sqnr_db(_x, _x_hat), _ref.sqnr_db(_x, _x_hat), f"sqnr_db(random x, noise {_noise:.3f}) (seed {_seed})",
                rtol=1e-6)
### END HIDDEN TESTS

# %% [markdown] id="c019"
# ## Try it on a real weight matrix (not graded)
#
# Your functions on the course model's first MLP up-projection: per tensor against per group, 2 to 8 bits.
# Notice how each extra bit adds about 6 dB, and how much per-group scales add at low bit widths.

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
except NotImplementedError:
    print("Finish the exercises above first.")
except RuntimeError as e:
    print(e)
