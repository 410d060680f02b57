# %% [markdown] id="c002"
# # Lab 03 — Quantizing LLMs: GPTQ's column loop and SmoothQuant's smoothing
#
# Two pieces of module 03 that are easy to get subtly wrong, and one prediction:
#
# 1. **GPTQ** [@frantar2023gptq] (6 points, contract): you design GPTQ's column loop from its contract:
#    quantize a weight matrix one column at a time and push each column's rounding error onto the columns
#    not yet quantized, through the inverse Hessian, with groups.
# 2. **SmoothQuant's smoothing** [@xiao2023smoothquant] (4 points): per-channel scales that move the
#    activations' outliers into the weights without changing the layer's function.
# 3. **Predict: bits per parameter** (1 point): what a group layout costs a whole checkpoint of another
#    shape, before you measure a packed layer.
#
# * Fill in each function where it says `YOUR CODE HERE` (remove the `raise NotImplementedError()`).
# * Run the test cell under it. When the lab is graded, the grader calls your functions on inputs of its own
#   (random layers and calibration sets drawn for you, and a grid of edge cases) and compares them with
#   `course_lib.quant`, so write the general code, and your own: an answer that imports the reference is
#   flagged, and while grading, the references are not in the library at all.
# * Conventions (those of `course_lib.quant`): an `nn.Linear` weight is `W [out, in]`, the layer computes
#   `y = x @ W.T` for inputs `x [n, in]`.
#
# 4 exercises: 6 + 4 + 1 + 2 (written, graded by your instructor) = 13 points.

# %% id="c003"
import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape, diagnose

# What the known wrong answers mean (the tests and the grader name them when your answer matches one).
MISTAKES = {
    "full_inverse": "the error was spread with the entries of the full inverse H^-1 ([H^-1]_jj and row j of "
                    "H^-1): those are right for column 0 only. Once columns 0..j-1 are fixed, the remaining "
                    "columns need the inverse of H restricted to them, and row j of the upper Cholesky factor U "
                    "of H^-1 (H^-1 = U^T U) holds exactly that: err = (w_j - q_j) / U_jj, then "
                    "w_k -= err * U_jk for k > j; see notebook 03, section '6. GPTQ: error feedback through "
                    "the inverse Hessian'",
    "no_feedback": "each column was rounded on its own (plain round-to-nearest): GPTQ feeds every column's "
                   "rounding error forward to the columns not yet quantized; see notebook 03, section "
                   "'6. GPTQ: error feedback through the inverse Hessian'",
    "grid_from_original": "each group's grid was computed from the original columns: GPTQ computes it from the "
                          "columns as they are when the loop reaches the group's first column, after the error "
                          "of the columns before has been fed into them (their range has moved); see the "
                          "contract's *Returns*",
    "smooth_direction": "the weight was divided by s, like the activations: x's channel j is divided by s_j, "
                        "so W's input column j must be multiplied by s_j for (x / s) @ W_smoothed.T to equal "
                        "x @ W.T; see notebook 03, section '4. SmoothQuant: migrate the difficulty into the "
                        "weights'",
    "zero_point_forgotten": "the zero point's bits were not counted: an asymmetric grid stores a scale and a "
                            "zero point per group; see notebook 03, section '1. Weight-only: W8A16 and W4A16 "
                            "round-to-nearest'",
    "model_all_quantized": "the whole model was priced at the quantized layers' bits: the embedding, the LM head "
                           "(unless tied) and the norms stay at full precision, and with a large vocabulary they "
                           "are a large share of a small model; see notebook 03, section '1. Weight-only: W8A16 "
                           "and W4A16 round-to-nearest'",
    "head_counted_twice": "a tied LM head was counted as a second matrix: it is the embedding itself, stored once",
}


def rtn_column(w, scale, zero, bits):
    """Round-to-nearest of one column w [out, 1] on the grid (codes - zero) * scale, codes in the signed
    range of `bits` bits; returns the dequantized column [out, 1]. scale, zero: [out, 1]."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    codes = torch.clamp(torch.round(w / scale) + zero, qmin, qmax)
    return (codes - zero) * scale


def grid(W, bits):
    """One asymmetric grid per row of W [out, k]: scale [out, 1] and zero [out, 1]."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo, hi = W.amin(1, keepdim=True).clamp(max=0), W.amax(1, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / (qmax - qmin)).clamp(min=1e-8)
    return scale, torch.clamp(qmin - torch.round(lo / scale), qmin, qmax)


def hessian(X):
    """H = 2/n X^T X for calibration inputs X [n, in]: the Hessian of GPTQ's objective."""
    return 2 * X.T @ X / X.shape[0]


def output_error(W, W_q, X):
    """||X W^T - X W_q^T||^2 / n: what GPTQ minimizes."""
    return float((X @ (W - W_q).T).pow(2).sum() / X.shape[0])


# %% [markdown] id="c004"
# ## Exercise 1 — GPTQ (6 points, contract)
#
# GPTQ quantizes one linear layer so that its **outputs** on calibration inputs `X [n, in]` change as little
# as possible: it minimizes $\lVert XW^\top - XW_q^\top\rVert^2$, whose Hessian in each row of W is
# $H = \frac{2}{n}X^\top X$ (`hessian(X)` above). Write `gptq(W, H, bits=4, group_size=None, percdamp=0.01)`.
#
# **Contract.**
#
# * *Takes* `W [out, in]` (float), `H [in, in]` (symmetric positive semi-definite, from `hessian`), `bits`
#   (an int in 2..8), `group_size` (`None`: one grid per row for the whole row; an int g ≥ 1: the columns in
#   groups of g, the last one possibly shorter, one grid per row and group) and `percdamp` (in [0, 1)):
#   before anything else, λ = `percdamp` · mean(diag H) is added to H's diagonal (damping keeps H invertible).
# * *Returns* the dequantized weight `[out, in]` (float32). Every entry lies on its row's grid for its group,
#   `grid(...)` of that group's columns, computed from the columns **as they are when the loop reaches the
#   group's first column** (already updated by the error of the columns before). The caller's `W` is unchanged.
# * *Invariant* (what makes it GPTQ): columns are quantized left to right, each with `rtn_column` on its grid;
#   once column j is rounded, its rounding error is spread over the columns not yet quantized (j+1, ...) so
#   that the objective stays the smallest possible given the columns fixed so far. That optimal update uses
#   the inverse of H **restricted to the columns not yet quantized**, a different matrix at every step; all
#   of them are read off one matrix, the upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU, U upper triangular).
#   Column 0 is plain round-to-nearest (it has received no error yet).
# * *Refuses* (`ValueError`): `H` not `[in, in]`, `bits` not an int in 2..8, `group_size` neither `None` nor an
#   int ≥ 1, `percdamp` outside [0, 1).
# * *Cost*: O(in³) for the factorization plus O(out · in²) for the loop; no [in, in] matrix per column.
#
# The grader runs your `gptq` on random layers, calibration sets, bit widths and group sizes, and on an edge
# grid (one column, groups of one, a last group shorter than the others, 2 and 8 bits, no damping), against
# `course_lib.quant.gptq_quantize` (the same algorithm with lazy batch updates; no act-order): every entry
# within one grid step of it (a rounding tie may flip), and the same output error within 5 %.
#
# <details><summary>Hint 1: the factor</summary>
#
# Damp H, then `torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)` is U
# (the inverse through H's own Cholesky factor, which is more stable than `torch.linalg.inv`).
# </details>
#
# <details><summary>Hint 2: the loop, line by line</summary>
#
# On a copy of W, for j = 0, 1, ..., in-1:
#
# 1. if j starts a group (j % g == 0, or j == 0 without groups): `scale, zero = grid(W[:, j:j+g], bits)`;
# 2. `q = rtn_column(W[:, j:j+1], scale, zero, bits)` (on the *current*, already updated column);
# 3. `err = (W[:, j:j+1] - q) / U[j, j]`;
# 4. error feedback: `W[:, j+1:] -= err @ U[j:j+1, j+1:]` (every later column absorbs part of the error);
# 5. column j of the result is `q`.
#
# Why U's rows: after columns 0..j-1 are fixed, the optimal update for the remaining columns is
# `(w_j - q_j) / [H_F⁻¹]_jj · [H_F⁻¹]_j,:` with F = {j, ..., in-1}; eliminating one column at a time
# (Gaussian elimination of H⁻¹) turns these rows into the rows of U, scaled by U_jj.
# </details>

# %% id="c005" nbgrader={"grade": false, "grade_id": "gptq_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gptq(W, H, bits=4, group_size=None, percdamp=0.01):
    """GPTQ of W [out, in] given the Hessian H [in, in] of its inputs. Returns the dequantized weight."""
    ### BEGIN SOLUTION
    n_in = W.shape[1]
    if not isinstance(H, torch.Tensor) or H.shape != (n_in, n_in):
        raise ValueError(f"H must have shape ({n_in}, {n_in}), got "
                         f"{tuple(H.shape) if isinstance(H, torch.Tensor) else type(H).__name__}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size < 1):
        raise ValueError(f"group_size must be None or an int >= 1, got {group_size!r}")
    if not 0 <= percdamp < 1:
        raise ValueError(f"percdamp must be in [0, 1), got {percdamp!r}")
    g = group_size or n_in
    H = H.float() + percdamp * torch.diag(H.float()).mean() * torch.eye(n_in)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)  # H^-1 = U^T U
    W = W.clone().float()
    Q = torch.zeros_like(W)
    for j in range(n_in):
        if j % g == 0:                       # a new group: its grid from the columns as updated so far
            scale, zero = grid(W[:, j:j + g], bits)
        q = rtn_column(W[:, j:j + 1], scale, zero, bits)
        err = (W[:, j:j + 1] - q) / U[j, j]
        W[:, j + 1:] -= err @ U[j:j + 1, j + 1:]
        Q[:, j:j + 1] = q
    return Q
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "gptq_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# A 2 x 4 layer, 3 bits, groups of 2; the expected values come from course_lib.quant.gptq_quantize.
_W = torch.tensor([[0.30, -0.42, 0.17, 0.05], [-0.21, 0.08, 0.44, -0.35]])
_X = torch.tensor([[1.0, 0.9, 0.2, -0.3], [0.5, 0.6, -1.0, 0.2], [-0.8, -0.7, 0.4, 1.0], [0.3, 0.1, 0.9, -0.6],
                   [1.2, 1.0, -0.2, 0.1]])
_W0 = _W.clone()
_Wq = gptq(_W, hessian(_X), bits=3, group_size=2)
check_shape(_Wq, (2, 4), "gptq(W [2, 4], H [4, 4], bits=3, group_size=2)")
check_equal(_W, _W0, "the caller's W after gptq (work on a copy)")
check_close(_Wq[:, 0], _W[:, 0].new_tensor([0.3085714579, -0.2071428448]),
            "column 0 of gptq(...) (no error has reached it: round-to-nearest on the first group's grid)", atol=1e-6)
check_close(_Wq, torch.tensor([[0.3085714579, -0.4114286006, 0.1783830523, 0.0509665869],
                               [-0.2071428448, 0.0828571394, 0.4505820870, -0.3379365802]]),
            "gptq(W [2, 4], H, bits=3, group_size=2)", atol=1e-5,
            mistakes={MISTAKES["full_inverse"]: torch.tensor([[0.3085714579, -0.4114286006, 0.1713626981, 0.0489607714],
                                                              [-0.2071428448, 0.0828571394, 0.4516781271, -0.3387585878]]),
                      MISTAKES["no_feedback"]: torch.tensor([[0.3085714579, -0.4114286006, 0.1700000018, 0.0485714301],
                                                             [-0.2071428448, 0.0828571394, 0.4514285624, -0.3385714293]])})
# on a wider layer with correlated inputs: below round-to-nearest, on the grid, refusing a wrong H
_gen = torch.Generator().manual_seed(0)
_W = torch.randn(6, 12, generator=_gen) * 0.1
_X = torch.randn(64, 12, generator=_gen) @ torch.randn(12, 12, generator=_gen)
_Wq = gptq(_W, hessian(_X), bits=4)
_s, _z = grid(_W, 4)
_rtn = torch.cat([rtn_column(_W[:, j:j + 1], _s, _z, 4) for j in range(12)], dim=1)
_e_gptq, _e_rtn = output_error(_W, _Wq, _X), output_error(_W, _rtn, _X)
assert _e_gptq < _e_rtn, (f"GPTQ's output error {_e_gptq:.4g} must be below round-to-nearest's {_e_rtn:.4g}: "
                          f"{diagnose(_Wq, {MISTAKES['no_feedback']: _rtn}) or 'is each column error fed forward?'}")
check_close(_Wq, (torch.round(_Wq / _s + _z) - _z) * _s, "every entry lies on its row's grid", atol=1e-6, rtol=0)
check_raises(lambda: gptq(_W, hessian(_X)[:5, :5]), ValueError, "gptq with H of shape [5, 5] for W [6, 12]")
check_raises(lambda: gptq(_W, hessian(_X), bits=1), ValueError, "gptq with bits=1")
check_raises(lambda: gptq(_W, hessian(_X), group_size=0), ValueError, "gptq with group_size=0")
print(f"output error: GPTQ {_e_gptq:.4g} < RTN {_e_rtn:.4g}")

# %% [markdown] id="c007"
# ## Exercise 2 — SmoothQuant's smoothing (4 points)
#
# For a linear layer `W [out, in]` and the calibration activations' per-channel maxima
# `x_absmax [in]` (max over tokens of |x_j|), SmoothQuant's scale per **input channel** j is
#
# $$s_j = \frac{\max|X_j|^{\alpha}}{\max_o |W_{o,j}|^{1-\alpha}}$$
#
# (the weight's maximum over its **column** j). Return `(s, W_smoothed)` with `W_smoothed = W * s` along the
# input axis, so that `(x / s) @ W_smoothed.T == x @ W.T`. Clamp both maxima to at least `1e-5` before
# the powers (a dead channel must not divide by zero). Raise `ValueError` if `alpha` is not in [0, 1].

# %% id="c008" nbgrader={"grade": false, "grade_id": "smooth_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def smooth(x_absmax, W, alpha=0.5):
    """SmoothQuant's per-input-channel scales s [in] and the smoothed weight [out, in]."""
    ### BEGIN SOLUTION
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    a = x_absmax.float().clamp(min=1e-5)
    w = W.abs().amax(dim=0).float().clamp(min=1e-5)
    s = a.pow(alpha) / w.pow(1 - alpha)
    return s, W * s[None, :]
    ### END SOLUTION


# %% id="c009" nbgrader={"grade": true, "grade_id": "smooth_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
_W = torch.tensor([[0.5, -0.1, 2.0], [0.25, 0.2, -1.0]])
_a = torch.tensor([4.0, 100.0, 1.0])
_s, _Ws = smooth(_a, _W, 0.5)
check_close(_s, torch.tensor([2.0 / 0.5 ** 0.5, 10.0 / 0.2 ** 0.5, 1.0 / 2.0 ** 0.5]),
            "smooth([4, 100, 1], W, 0.5): s_j = sqrt(max|x_j|) / sqrt(max over column j of |W|)", rtol=1e-5)
check_close(_Ws, _W * _s, "W_smoothed: each input column j times s_j", rtol=1e-6,
            mistakes={MISTAKES["smooth_direction"]: _W / _s})
_x = torch.tensor([[1.0, -90.0, 0.5], [-4.0, 3.0, 1.0]])
check_close((_x / _s) @ _Ws.T, _x @ _W.T, "(x / s) @ W_smoothed.T equals x @ W.T (the function is unchanged)",
            rtol=1e-5, atol=1e-6)
check_close(smooth(_a, _W, 0.0)[0], 1 / _W.abs().amax(0), "alpha = 0: s_j = 1 / max|W_:,j|", rtol=1e-6)
check_raises(lambda: smooth(_a, _W, 1.5), ValueError, "smooth with alpha=1.5")

# %% [markdown] id="c012"
# ## Exercise 3 — Predict: a whole checkpoint's bits per parameter (1 point)
#
# A GPTQ (or round-to-nearest) layer stores, per weight, its `bits`-bit code, and per group of `group_size`
# weights of a row one scale (`scale_bits`) and, for an asymmetric grid, one zero point (`zero_point_bits`).
# But a quantized checkpoint is more than its quantized layers: `quantize_model` swaps the decoder's linears
# and keeps the rest at full precision (section 1 of notebook 03 measures this on the course model). What a
# "4-bit" model of another shape really costs per parameter is what decides whether it fits.
#
# Write `predict_bits_per_weight(bits, group_size, scale_bits=16, zero_point_bits=0, config=None, keep_bits=16)`:
#
# * with `config=None`: the average bits one quantized weight costs, scales and zero points included (the
#   groups fill the rows); `group_size=None` (one grid per row of thousands of weights) counts the per-row
#   numbers as negligible;
# * with a `config` (a `LlamaConfig`: `vocab_size`, `hidden_size`, `intermediate_size`, `num_hidden_layers`,
#   `num_attention_heads`, `num_key_value_heads`, `head_dim`, `tie_word_embeddings`): the average bits per
#   parameter of the whole model when every linear of every decoder layer (q, k, v, o; gate, up, down) is
#   quantized so, each of their weights costing what it costs with `config=None`, and every other parameter
#   (the embedding, the LM head, the RMSNorm weights: two vectors per layer and the final one) stays at
#   `keep_bits` bits. A tied LM head is the embedding itself. Mind `head_dim`: the attention projections map
#   `hidden_size` to heads × `head_dim`, which need not equal `hidden_size`;
# * raises `ValueError` if `bits` is not an int >= 1 or `group_size` is neither `None` nor an int >= 1.
#
# The grader draws its own model shapes and layouts and compares your number with the exact count's to a
# relative 1e-9: every parameter counts, the smallest vector included. The visible tests check bounds and
# limits.
#
# <details><summary>Hint: two kinds of parameters</summary>
#
# Split the parameters into the ones quantized and the ones kept, cost each at its own bits, and divide by
# all of them. Pitfall: in a small model (or one with a large vocabulary) the kept matrices are far from
# negligible; and a tied head is stored once.
# </details>

# %% id="c013" nbgrader={"grade": false, "grade_id": "predict_bits", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_bits_per_weight(bits, group_size, scale_bits=16, zero_point_bits=0, config=None, keep_bits=16):
    """Average bits per weight of a group layout (codes, each group's scale and zero point); with a config,
    per parameter of the whole model whose decoder linears use it while the rest stays at keep_bits."""
    ### BEGIN SOLUTION
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < 1:
        raise ValueError(f"bits must be an int >= 1, got {bits!r}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be None or an int >= 1, got {group_size!r}")
    per = float(bits) if group_size is None else bits + (scale_bits + zero_point_bits) / group_size
    if config is None:
        return per
    c = config
    D, F_, V, Dh = c.hidden_size, c.intermediate_size, c.vocab_size, c.head_dim
    linear = c.num_hidden_layers * (2 * D * c.num_attention_heads * Dh + 2 * D * c.num_key_value_heads * Dh + 3 * D * F_)
    kept = c.num_hidden_layers * 2 * D + D + V * D * (1 if c.tie_word_embeddings else 2)   # norms; embedding, head
    return (linear * per + kept * keep_bits) / (linear + kept)
    ### END SOLUTION


# %% id="c014" nbgrader={"grade": true, "grade_id": "predict_bits_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from course_lib.models.config import LlamaConfig

_per = predict_bits_per_weight(4, 128, 16, 8)
check_equal(4 < _per < predict_bits_per_weight(4, 32, 16, 8) < 16, True, "int4, groups of 128 with a scale and a "
            "zero point: above the codes' 4 bits, below groups of 32")
check_equal(predict_bits_per_weight(4, 128, 16, 8) > predict_bits_per_weight(4, 128, 16), True,
            f"a zero point costs bits too; if not: {MISTAKES['zero_point_forgotten']}")
check_close(predict_bits_per_weight(3, None), 3.0, "predict_bits_per_weight(3, None) (per-row grids: negligible)")
_small = dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2)
_model = [predict_bits_per_weight(4, 128, 16, 8, LlamaConfig(num_hidden_layers=L, **_small)) for L in (2, 8, 32)]
check_equal(_per < _model[0] < 16, True, f"a 2-layer model with a 32K vocabulary: between its quantized layers' "
            f"bits and the kept bits, got {_model[0]:.4f}; if it is {_per}: {MISTAKES['model_all_quantized']}")
check_equal(_model[0] > _model[1] > _model[2], True, f"more layers, the kept embedding weighs less: {_model}")
check_close(predict_bits_per_weight(4, 128, 16, 8, LlamaConfig(num_hidden_layers=4, **_small), keep_bits=_per), _per,
            "keep_bits equal to the layout's bits: the whole model costs the same per parameter")
_untied = LlamaConfig(num_hidden_layers=2, tie_word_embeddings=False, **_small)
check_equal(predict_bits_per_weight(4, 128, 16, 8, _untied) > _model[0], True,
            "an untied LM head is one more kept matrix")
_wide = LlamaConfig(num_hidden_layers=2, head_dim=128, **_small)   # 8 heads x 128 = 1024 wide, not 512
check_equal(predict_bits_per_weight(4, 128, 16, 8, _wide) < _model[0], True,
            "head_dim 128 with 8 heads: q, k, v and o are wider than hidden_size, so more of the model is quantized")
check_raises(lambda: predict_bits_per_weight(4, 0), ValueError, "predict_bits_per_weight(4, 0)")
check_raises(lambda: predict_bits_per_weight(0, 128), ValueError, "predict_bits_per_weight(0, 128)")
print("Exercise 3: visible tests passed")

# %% [markdown] id="c015"
# ## Measure: the bytes of a packed layer (not graded)
#
# `course_lib.quant.QuantLinear` stores a quantized layer the way a kernel reads it: 4-bit codes packed two
# per byte (8-bit codes one per byte), one fp16 scale and one int8 zero point per row and group. Your
# prediction next to the bytes of its buffers, for a 1024 x 1024 layer:

# %% id="c016"
try:
    from course_lib.quant import QuantLinear
    from course_lib.quant.linear import state_dict_bytes

    _lin = torch.nn.Linear(1024, 1024, bias=False)
    print(f"{'layout':<28}{'predicted bits/weight':>24}{'measured':>12}")
    for _b, _gs in [(4, 128), (4, 32), (8, 128)]:
        _m = QuantLinear.from_linear(_lin, bits=_b, group_size=_gs)
        _measured = state_dict_bytes(_m) * 8 / _lin.weight.numel()
        print(f"{f'int{_b}, groups of {_gs}':<28}{predict_bits_per_weight(_b, _gs, 16, 8):>24.4f}{_measured:>12.4f}")
except NotImplementedError:
    print("Finish the exercises above first.")

# %% [markdown] id="c017"
# ## Try it on the course model (not graded)
#
# Your GPTQ (4 bits, groups of 128) on a real layer of the bundled model, with calibration inputs from the training text:
# the output error against round-to-nearest on calibration and on held-out inputs ("held-out" here: other
# windows of the same training text, not used for the Hessian; not the corpus's held-out split).

# %% id="c018"
import os

try:
    if os.environ.get("NBGRADER_EXECUTION"):
        raise RuntimeError("skipped while grading")
    import course_lib.quant as Q
    from course_lib.models import load
    from course_lib.quant_eval import calibration_batches

    _model, _tok = load("tiny", device="cpu")
    _name = "model.layers.1.self_attn.q_proj"
    _b = calibration_batches(_tok, 6, 256, seed=1, max_files=60)
    _xs = Q.capture_inputs(_model, _b, [_name])[_name]
    _cal, _held = _xs[:1024], _xs[1024:]
    W = _model.get_submodule(_name).weight.detach()
    Wq = gptq(W, hessian(_cal), bits=4, group_size=128)
    Wr = torch.cat([rtn_column(W[:, j:j + 1], *grid(W[:, j // 128 * 128:(j // 128 + 1) * 128], 4), 4)
                    for j in range(W.shape[1])], dim=1)
    for what, X in [("calibration", _cal), ("held-out", _held)]:
        print(f"{what}: GPTQ {output_error(W, Wq, X):.4g}, RTN {output_error(W, Wr, X):.4g}")
except NotImplementedError:
    print("Finish the exercises above first.")
except RuntimeError as e:
    print(e)

# %% [markdown] id="c019"
# ## Going further
#
# 1. **Act-order.** GPTQ can quantize the columns in decreasing order of diag(H) instead of left to right
#    (`gptq_quantize(..., act_order=True)`). Why should that lower the output error, and what does it cost a
#    kernel that reads the quantized layer with groups?
# 2. **Damping.** Try `percdamp=0` with fewer calibration rows than input features. What fails, why, and
#    what does GPTQ turn into as `percdamp` grows very large?
# 3. **Bytes of a model.** With your prediction, how many GB do the weights of a 7-billion-parameter model
#    take in int4 with groups of 128, an fp16 scale and an 8-bit zero point per group, against fp16?

# %% [markdown] id="cw03p"
# ## Exercise 4 — Written analysis: GPTQ against round-to-nearest (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run "Try it on the course model" first
# (it is skipped while grading), then answer in 100 to 200 words, about **your** numbers:
#
# 1. quote GPTQ's and round-to-nearest's output error on the calibration inputs and on the held-out inputs,
#    and the ratio GPTQ / RTN for each;
# 2. explain why GPTQ wins on the calibration inputs (what it minimizes, and what it does with each column's
#    rounding error), and why its advantage on held-out inputs is smaller, the same, or larger on your run;
# 3. name one change that would make the held-out gain more reliable, and why it would.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw03" nbgrader={"grade": true, "grade_id": "written_gptq_vs_rtn", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on a 2-core CPU, torch 2.13; your
# numbers will differ: what matters is how you explain them.)*
#
# On my run GPTQ's output error was 0.1466 against RTN's 1.377 on the calibration inputs (ratio 0.106) and
# 0.1823 against 1.396 held out (ratio 0.131): GPTQ wins on both, by a factor of 9.4 on the calibration inputs
# and by less, 7.7, held out.
#
# RTN rounds every weight on its own and ignores the inputs. GPTQ minimizes the layer's output error
# ||WX - ŴX||² on the calibration inputs: it quantizes one column at a time and spreads that column's rounding
# error over the columns not yet quantized, weighted by the inverse Hessian H = 2XXᵀ, so errors along input
# directions that the calibration data excite cancel in the output. That is an optimization on X itself, so it
# is strongest there.
#
# On held-out inputs the compensation is only as good as XXᵀ describes them. Both sets are windows of the same
# Python training text, so their covariances are close and most of the gain remains (RTN's error barely moves,
# 1.377 to 1.396, while GPTQ's grows by a quarter); the part fitted to the calibration batch's own directions
# (1,024 positions, a small sample of them) does not carry over.
#
# More and more varied calibration tokens (several thousand, from the same kind of text the model will see)
# make XXᵀ a better estimate of the inputs' covariance; a larger damping (λI added to H) also trusts its
# small, poorly estimated directions less, trading some calibration gain for held-out robustness.

# %% [markdown] id="c020" tags=["answer-key"]
# ### Answer key
#
# 1. diag(H)_jj = (2/n) Σ x_j² is how much input energy column j carries: its rounding error weighs most in
#    the output. Quantized first, its error is spread over all the other columns, which can still move to
#    compensate; quantized last, nothing is left to absorb it. On a random 256 x 256 layer at 3 bits with
#    inputs whose channel scales vary (log-normal), the output error goes RTN 37.8 → GPTQ 35.6 → GPTQ with
#    act-order 34.0. The cost: a group is no longer a run of adjacent columns. The kernel needs `g_idx`
#    (the group of every column) and a gather of scales per column while dequantizing, or the layer's input
#    channels are permuted once (and the previous layer's outputs with them) so that groups are contiguous
#    again; `QuantLinear` stores `g_idx`.
# 2. H = (2/n) XᵀX has rank at most n: with n < in it is singular, H⁻¹ does not exist and the Cholesky
#    factorization fails (`course_lib.quant.gptq_quantize` raises a `ValueError` that says so). Damping adds
#    λ = percdamp · mean(diag H) to the diagonal, which makes H positive definite. As λ grows, H ≈ λI: its
#    inverse is nearly diagonal, U's off-diagonal entries U_jk (k > j) go to 0 relative to U_jj, no error is
#    fed forward, and GPTQ becomes round-to-nearest. Small damping (1 %) keeps the feedback and the stability.
# 3. 4 + (16 + 8) / 128 = 4.1875 bits per weight: 7·10⁹ · 4.1875 / 8 = 3.66 GB, against 7·10⁹ · 2 = 14 GB in
#    fp16, 3.8 times less (the scales and zero points add 4.7 % to the 3.5 GB of the codes alone).
