# %% [markdown] id="c002"
# # 02 · Quantization fundamentals
#
# Module 01 showed that decoding one token at a time is **memory bound**: every step streams all the
# weights from memory, so the time per token is roughly *bytes of weights / memory bandwidth*. Fewer
# bytes per weight means faster decoding and bigger models on the same GPU. That is what quantization
# buys, and this notebook builds it from the ground up:
#
# 1. what a number format is (FP32, FP16, BF16, FP8 E4M3/E5M2, INT8, INT4, NF4), bit by bit;
# 2. **absmax** (symmetric) and **zero-point** (asymmetric) quantization, with two worked examples of the kind found in course notes;
# 3. **granularity**: one scale per tensor, per channel or per group, and what each costs;
# 4. **outliers**, the reason for per-group scales (and, in module 03, for LLM.int8 and SmoothQuant);
# 5. **clipping**, error metrics (MSE, SQNR), **int4 bit packing**, **memory arithmetic** for 7B/70B models;
# 6. real **block formats**: GGUF Q8_0 / Q4_0 byte for byte, **NF4** with double quantization, and the
#    microscaling FP4 formats **MXFP4** and **NVFP4**;
# 7. an interactive explorer on a real weight matrix of the course model.
#
# Everything runs on a CPU. All the code lives in `course_lib.quant`; the cells below call it and check
# every claim with a computed number or an `assert`.

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()           # True under the tests (COURSE_QUICK=1): small sizes
N_RANDOM = 20_000 if QUICK else 1_000_000  # size of the synthetic test tensors
CLIP_STEPS = 36 if QUICK else 141          # clip ratios tried by the MSE search
LAYER = 0                                  # which decoder layer's weights we study
MX_ALL_LAYERS = not QUICK                  # section 11: every layer's linear weights, or layer LAYER's only
SEED = 0

# %% id="c004"
import logging
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import course_lib.quant as Q
from course_lib.models import LlamaConfig, load
from course_lib.viz.quant import QuantExplorer, plot_bit_layouts

# On CPUs with AVX512-BF16, importing bitsandbytes makes its CPU backend try to load an optional 4-bit
# matmul kernel from the Hugging Face Hub ("kernels-community", through the `kernels` package, which the
# course does not install) and log a warning when that fails. Section 9 only uses bitsandbytes'
# quantize_4bit, which does not need that kernel: drop that one message, keep all the others.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward"))

torch.manual_seed(SEED)
gen = torch.Generator().manual_seed(SEED)
print(f"QUICK={QUICK}, N_RANDOM={N_RANDOM:,}, torch {torch.__version__}")

# %% [markdown] id="c005"
# ## 1. A number format is a rule from bits to values
#
# A binary floating-point number splits its bits into three fields: a **sign** `s`, an **exponent** field
# `E` with `e` bits, and a **mantissa** (fraction) field `M` with `m` bits. With a fixed **bias** `b`:
#
# | exponent field | value |
# |---|---|
# | `0 < E < all ones` (normal) | $(-1)^s \cdot (1 + M/2^m) \cdot 2^{E-b}$ |
# | `E = 0` (subnormal, and zero) | $(-1)^s \cdot (0 + M/2^m) \cdot 2^{1-b}$ |
# | `E = all ones` | inf or NaN (IEEE-style formats) |
#
# The exponent sets the **range** (how large and how small), the mantissa sets the **precision** (how
# many values per power of two). Let us take 0.1 apart in FP16: 5 exponent bits, 10 mantissa bits, bias 15.

# %% id="c006"
d = Q.decode_bits(Q.encode_bits(0.1, "fp16"), "fp16")
print("bits      ", d.bitstring, " (sign | exponent | mantissa)")
print("fields     sign", d.sign, "| E =", d.exponent_field, f"(2^{d.exponent_field} - bias 15 = 2^{d.exponent})",
      "| M =", d.mantissa_field)
print("value     ", d.formula(), "=", repr(d.value))
assert d.value == float(torch.tensor(0.1, dtype=torch.float16))   # our decoder agrees with torch
assert (d.exponent, d.mantissa_field) == (-4, 614)                 # 0.1 = 1.599609375 * 2^-4 in FP16
print(f"0.1 is not representable: FP16 stores it with a relative error of {abs(d.value - 0.1) / 0.1:.1e}")

# %% [markdown] id="c007"
# The same value in each float format the course uses. Red = sign, blue = exponent, green = mantissa:

# %% id="c008"
fig = plot_bit_layouts(0.1)
plt.show()
for key in ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]:
    v = Q.decode_bits(Q.encode_bits(0.1, key), key).value
    print(f"{Q.get_format(key).name:9s} stores 0.1 as {v:.10f}  (relative error {abs(v - 0.1) / 0.1:.1e})")

# %% [markdown] id="c009"
# ### The formats side by side
#
# Every number in this table is computed from the bit layout by `course_lib.quant.formats` (none is typed
# in), and the cell after it checks them against `torch.finfo`, which knows FP32, FP16, BF16 and both FP8s.
# "spacing near 1" is the gap between 1.0 and the next value (machine epsilon, $2^{-m}$): the relative
# precision. INT8 and INT4 count in units of a separately stored scale; NF4 in units of a block's absmax.

# %% id="c010"
display(Markdown(Q.formats_table_markdown()))

# %% id="c011"
for key in ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]:
    f = Q.FORMATS[key]
    if f.torch_dtype is None:
        print(f"{f.name}: this torch has no dtype to compare with")
        continue
    fi = torch.finfo(f.torch_dtype)
    assert (f.max_value, f.min_normal, f.spacing_near_one) == (fi.max, fi.smallest_normal, fi.eps), key
    assert f.min_subnormal == fi.smallest_normal * fi.eps
print("layout arithmetic == torch.finfo for FP32, FP16, BF16, FP8 E4M3, FP8 E5M2")

# BF16 keeps FP32's range with 8 bits of precision; FP16 has 3 more mantissa bits but overflows at 65504.
assert torch.isinf(torch.tensor(70000.0).half()) and not torch.isinf(torch.tensor(70000.0).bfloat16())
assert Q.FORMATS["bf16"].spacing_near_one / Q.FORMATS["fp16"].spacing_near_one == 8
print("70000 in FP16:", torch.tensor(70000.0).half().item(), "| in BF16:", torch.tensor(70000.0).bfloat16().item())

# %% [markdown] id="c012"
# **FP8** comes in two flavours that split the same 8 bits differently: **E4M3** (more precision, max 448;
# the "fn" variant has no infinities, which frees the top exponent for numbers) is used for weights and
# activations, **E5M2** (more range, max 57344) for gradients [@micikevicius2022fp8]. Floats keep the
# *relative* gap between neighbours roughly constant; integers keep the *absolute* gap constant. The plot shows every positive
# value of each 8-bit format and the relative gap to its neighbour (INT8 codes scaled so its max is 448).

# %% id="c013"
fig, ax = plt.subplots(figsize=(9, 3.2))
for key, label in [("fp8_e4m3", "FP8 E4M3"), ("fp8_e5m2", "FP8 E5M2"), ("int8", "INT8 (x 448/127)")]:
    v = Q.representable_values(key)
    if key == "int8":
        v = v * 448 / 127
    v = v[v > 0]
    gap = (v[1:] - v[:-1]) / v[:-1]
    ax.loglog(v[:-1].numpy(), gap.numpy(), ".", ms=4, label=f"{label}: {len(v)} positive values")
ax.set_xlabel("value")
ax.set_ylabel("relative gap to the next value")
ax.legend(fontsize=8)
ax.set_title("floats: constant relative precision; integers: constant absolute precision", fontsize=10)
plt.show()
e4 = Q.representable_values("fp8_e4m3")
normal = e4[(e4 >= Q.FORMATS["fp8_e4m3"].min_normal) & (e4 > 0)]
assert float(((normal[1:] - normal[:-1]) / normal[:-1]).max()) <= 2 ** -3   # <= 12.5% for every normal E4M3
print("largest relative gap between normal E4M3 values:",
      float(((normal[1:] - normal[:-1]) / normal[:-1]).max()), "| INT8 between codes 1 and 2: 100%")

# %% [markdown] id="c014"
# ## 2. From floats to integers: absmax and zero-point quantization
#
# Integer formats have no exponent, so we store one floating-point **scale** next to many integer **codes**.
# In `course_lib.quant` the scale is the **step size** Δ (the real value of one integer step):
#
# * **absmax (symmetric)**, `b` bits: $q_{max} = 2^{b-1}-1$, $\Delta = \max|x| / q_{max}$,
#   $q = \mathrm{round}(x/\Delta)$, $\hat x = q\,\Delta$. Zero maps to code 0; the grid is symmetric.
# * **zero-point (asymmetric)**: $\Delta = (\max x - \min x)/(2^b-1)$, zero point
#   $z = q_{min} - \mathrm{round}(\min x / \Delta)$, $q = \mathrm{round}(x/\Delta) + z$, $\hat x = (q - z)\,\Delta$.
#   All $2^b$ codes cover exactly the data's range (widened to include 0, so 0 stays exact).
#
# Course notes often write the same thing with the inverse scale (steps per unit: $127/\max|x|$,
# $255/(\max-\min)$). Two typical worked examples, reproduced exactly:

# %% id="c015"
# absmax: absolute maximum 3.2, INT8. 0.1 -> round(0.1 * 127 / 3.2) = 4 -> 4 * 3.2 / 127 = 0.1008
qa = Q.absmax_quantize(torch.tensor([0.1, 3.2, -1.7]), bits=8)
x_hat = qa.dequantize()
print("codes", qa.codes.tolist(), "| scale (step)", qa.scale.item(), "= 3.2/127 | steps per unit", 1 / qa.scale.item())
print("0.1 ->", qa.codes[0].item(), "->", round(x_hat[0].item(), 4), " error", x_hat[0].item() - 0.1)
assert qa.codes[0].item() == 4 and round(x_hat[0].item(), 4) == 0.1008

# zero-point: max 3.2, min -3.0. scale 255 / 6.2 = 41.13, zero point -round(41.13 * -3.0) - 128 = -5, 0.1 -> -1
qz = Q.zeropoint_quantize(torch.tensor([0.1, 3.2, -3.0]), bits=8)
print("steps per unit", round(1 / qz.scale.item(), 2), "| zero point", qz.zero_point.item(),
      "| codes", qz.codes.tolist(), "| 0.1 dequantizes to", round(qz.dequantize()[0].item(), 4))
assert round(1 / qz.scale.item(), 2) == 41.13 and qz.zero_point.item() == -5 and qz.codes[0].item() == -1

# %% [markdown] id="c016"
# > **Claim checked.** A version of this absmax example met in course notes says it "implies an error of 0.008". The computed error is
# > 0.1008 − 0.1 = **0.0008** (0.00079 to five decimals): ten times smaller. It is also below half a step,
# > Δ/2 = 3.2/254 = 0.0126, the most round-to-nearest can ever be off.

# %% id="c017"
err = x_hat[0].item() - 0.1
assert round(err, 4) == 0.0008 and err < qa.scale.item() / 2
print(f"error {err:.5f} (not 0.008); half a step is {qa.scale.item() / 2:.4f}")

# %% [markdown] id="c018"
# **When does zero-point win?** When the data is lopsided. After a ReLU or for |x|, all values are
# positive: absmax spends half of its codes on negative values that never occur, zero-point uses them all.
# (For weights, which are centred on zero, the two are close.) A 3-bit picture, then the numbers:

# %% id="c019"
pos = torch.randn(N_RANDOM, generator=gen).abs()
fig, axes = plt.subplots(1, 2, figsize=(10, 2.6), sharey=True)
for ax, scheme in zip(axes, ["absmax", "zeropoint"]):
    q = Q.quantize(pos, 3, scheme)
    lo, hi = Q.qrange(3, symmetric=scheme == "absmax")
    zp = q.zero_point.item() if q.zero_point is not None else 0
    grid = (torch.arange(lo, hi + 1) - zp) * q.scale.item()
    ax.hist(pos.numpy(), bins=100, color="#5080c0")
    ax.vlines(grid.numpy(), 0, 1, transform=ax.get_xaxis_transform(), color="#d04040")
    used = int((grid >= -1e-9).sum())
    ax.set_title(f"{scheme}, 3 bits: {used} of {len(grid)} levels cover the data; "
                 f"SQNR {Q.sqnr_db(pos, q.dequantize()):.1f} dB", fontsize=9)
plt.show()
s_abs = {b: Q.sqnr_db(pos, Q.fake_quantize(pos, b, "absmax")) for b in (3, 4, 8)}
s_zp = {b: Q.sqnr_db(pos, Q.fake_quantize(pos, b, "zeropoint")) for b in (3, 4, 8)}
for b in s_abs:
    print(f"{b} bits on |x|: absmax {s_abs[b]:5.2f} dB   zero-point {s_zp[b]:5.2f} dB")
    assert s_zp[b] > s_abs[b] + 4          # about one bit's worth (6 dB) better on one-sided data

# %% [markdown] id="c020"
# ### Measuring error
#
# * **MSE** $= \mathrm{mean}((x-\hat x)^2)$ and **max error** $= \max|x-\hat x|$;
# * **SQNR** (signal-to-quantization-noise ratio) $= 10\log_{10}\left(\sum x^2 / \sum (x-\hat x)^2\right)$ dB:
#   scale-free, so tensors of different sizes compare. Each extra bit halves Δ, quarters the noise power
#   and adds $20\log_{10}2 = 6.02$ dB. Measured on Gaussian data:

# %% id="c021"
g_data = torch.randn(N_RANDOM, generator=gen)
bits_range = list(range(2, 9))
sq = [Q.sqnr_db(g_data, Q.fake_quantize(g_data, b)) for b in bits_range]
slopes = [sq[i + 1] - sq[i] for i in range(len(sq) - 1)]
print("SQNR (dB) at 2..8 bits:", [round(v, 2) for v in sq])
print("gain per extra bit     :", [round(v, 2) for v in slopes])
assert all(abs(s - Q.DB_PER_BIT) < 0.6 for s in slopes[3:])   # 5 -> 8 bits: the 6.02 dB/bit rule

# %% [markdown] id="c022"
# ## 3. Granularity: one scale per tensor, per channel, or per group
#
# One scale for a whole matrix is cheap but lets the largest value anywhere set the step for everyone.
# Finer granularity gives each part its own range:
#
# * **per tensor**: one scale;
# * **per channel**: one scale per output channel (row of an `nn.Linear` weight `[out, in]`, `axis=0`);
# * **per group**: each row cut into groups of `group_size` consecutive inputs (`axis=-1`), one scale
#   each: GPTQ/AWQ use 128 [@frantar2023gptq; @lin2024awq], GGUF's Q4_0 and Q8_0 32 [@ggml2023gguf],
#   NF4 64 [@dettmers2023qlora].
#
# We use a real weight matrix: the up-projection of the course model's first MLP (`load("tiny")`).

# %% id="c023"
model, tok = load("tiny", device="cpu")
W = model.model.layers[LAYER].mlp.up_proj.weight.detach().float()
print(f"{model.name}: layers.{LAYER}.mlp.up_proj.weight, shape {tuple(W.shape)} = [out, in]")
for kw in [dict(granularity="tensor"), dict(granularity="channel"),
           dict(granularity="group", group_size=128), dict(granularity="group", group_size=32)]:
    q = Q.absmax_quantize(W, 4, **kw)
    print(f"{str(kw):50s} scale shape {tuple(q.scale.shape)!s:11s} {q.bits_per_value():.3f} bits/weight "
          f"(fp16 scales), SQNR {Q.sqnr_db(W, q.dequantize()):5.2f} dB")

# %% [markdown] id="c024"
# SQNR against bits for each granularity and both schemes on this matrix (the dashed line is the
# 6.02 dB/bit slope):

# %% id="c025"
configs = {"per tensor": dict(granularity="tensor"), "per channel": dict(granularity="channel"),
           "group 128": dict(granularity="group", group_size=128), "group 32": dict(granularity="group", group_size=32)}
curves = {}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
for ax, scheme in zip(axes, ["absmax", "zeropoint"]):
    for name, kw in configs.items():
        curves[scheme, name] = [Q.sqnr_db(W, Q.fake_quantize(W, b, scheme, **kw)) for b in bits_range]
        ax.plot(bits_range, curves[scheme, name], "o-", ms=3, label=name)
    ref = curves[scheme, "per tensor"]
    ax.plot(bits_range, [ref[-1] - Q.DB_PER_BIT * (8 - b) for b in bits_range], "k--", lw=0.7)
    ax.set_title(f"{scheme}: SQNR vs bits", fontsize=10)
    ax.set_xlabel("bits")
axes[0].set_ylabel("SQNR (dB)")
axes[0].legend(fontsize=8)
plt.show()
for (scheme, name), c in curves.items():
    assert all(c[i + 1] > c[i] for i in range(len(c) - 1)), (scheme, name)   # more bits, less error
for scheme in ["absmax", "zeropoint"]:
    assert all(g > t for g, t in zip(curves[scheme, "group 32"], curves[scheme, "per tensor"]))
print("4-bit absmax SQNR:", {n: round(curves['absmax', n][2], 2) for n in configs})

# %% [markdown] id="c026"
# Smaller groups cost more scales: each fp16 scale adds 16/group_size bits per weight. The trade-off at
# 3 and 4 bits on the same matrix (the largest group is a whole row, i.e. per channel):

# %% id="c027"
sizes = [s for s in (8, 16, 32, 64, 128, W.shape[1]) if W.shape[1] % s == 0]
fig, ax = plt.subplots(figsize=(7, 3.2))
by_size = {}
for b in (3, 4):
    by_size[b] = [Q.sqnr_db(W, Q.fake_quantize(W, b, granularity="group", group_size=s)) for s in sizes]
    ax.semilogx(sizes, by_size[b], "o-", base=2, label=f"{b}-bit absmax")
    for s, v in zip(sizes, by_size[b]):
        ax.annotate(f"{b + 16 / s:.2f}b", (s, v), textcoords="offset points", xytext=(0, 5), fontsize=7)
ax.set_xlabel("group size (labels: bits per weight with fp16 scales)")
ax.set_ylabel("SQNR (dB)")
ax.legend()
plt.show()
for b in (3, 4):
    assert by_size[b][0] > by_size[b][-1]        # the smallest groups beat one scale per row
print({b: [round(v, 2) for v in by_size[b]] for b in by_size}, "for group sizes", sizes)

# %% [markdown] id="c028"
# ## 4. Outliers: why one value can ruin a whole tensor
#
# Trained LLMs have a few weights and, much more so, a few **activation channels** that are tens of times
# larger than the rest [@dettmers2022llmint8]. With one scale, the largest value sets Δ for
# everybody. Here is one planted weight, 20 times the largest weight of our matrix, at 4 bits:

# %% id="c029"
W_out = W.clone()
W_out[0, 0] = 20 * W.abs().max()
others = torch.ones_like(W, dtype=torch.bool)
others[0, 0] = False     # judge the damage on all the *other* weights
print(f"the outlier is {float(W_out[0, 0] / W.std()):.0f} standard deviations of the other weights")

rows = []
for name, kw in [("per tensor", dict(granularity="tensor")), ("group 128", dict(granularity="group", group_size=128))]:
    clean = Q.fake_quantize(W, 4, **kw)[others]
    hit = Q.fake_quantize(W_out, 4, **kw)[others]
    rows.append((name, Q.sqnr_db(W[others], clean), Q.sqnr_db(W[others], hit),
                 float((clean == 0).float().mean()), float((hit == 0).float().mean())))
    print(f"{name:10s}: SQNR of the other weights {rows[-1][1]:5.2f} -> {rows[-1][2]:5.2f} dB; "
          f"weights rounded to 0: {rows[-1][3]:.0%} -> {rows[-1][4]:.0%}")
(_, t0, t1, _, z1), (_, g0, g1, _, _) = rows
# per tensor: half a step is now 20 * max / 7 / 2 > max, so every other weight rounds to 0 (SQNR 0 dB)
assert z1 == 1.0 and abs(t1) < 1e-9
# per group: only the outlier's own group (row 0, columns 0..127) changes; all the others are untouched
outside = torch.ones_like(others)
outside[0, :128] = False
g = dict(granularity="group", group_size=128)
assert torch.equal(Q.fake_quantize(W, 4, **g)[outside], Q.fake_quantize(W_out, 4, **g)[outside])
print(f"group 128: {int(outside.sum()):,} of {W.numel() - 1:,} other weights quantize exactly as before")

# %% [markdown] id="c030"
# Per-group scales contain the damage to one group. **Activations** are harder: an outlier *feature*
# (a column of the activation matrix `X [tokens, features]`) hits every token, and activations are
# quantized on the fly, per token (row), while the matmul `X @ W.T` wants scales along rows of X and rows
# of W, not along features. Two fixes, built in module 03, in a synthetic preview:
#
# * **LLM.int8()** [@dettmers2022llmint8] pulls the few outlier feature columns out and multiplies them in
#   16-bit; the rest is int8.
# * **SmoothQuant** [@xiao2023smoothquant] divides each feature of X by $s_j$ and multiplies the matching
#   column of W by $s_j$: the product is unchanged in exact arithmetic, and the outliers move from
#   activations into the weights.

# %% id="c031"
g2 = torch.Generator().manual_seed(SEED + 1)
X = torch.randn(256, 512, generator=g2)
X[:, [7, 300]] *= 40                               # two outlier feature channels
Wl = torch.randn(384, 512, generator=g2) * 0.02     # a linear layer [out, in]
Y = X @ Wl.T


def int8_matmul(x, w):
    """Per-token int8 activations times per-channel int8 weights (dequantized, to measure the error)."""
    return Q.fake_quantize(x, 8, granularity="channel", axis=0) @ Q.fake_quantize(w, 8, granularity="channel", axis=0).T


plain = Q.sqnr_db(Y, int8_matmul(X, Wl))
cols = torch.zeros(512, dtype=torch.bool)
cols[[7, 300]] = True
mixed = Q.sqnr_db(Y, int8_matmul(X[:, ~cols], Wl[:, ~cols]) + X[:, cols] @ Wl[:, cols].T)
s = (X.abs().amax(0) / Wl.abs().amax(0)).sqrt()     # SmoothQuant's migration strength 0.5
assert torch.allclose((X / s) @ (Wl * s).T, Y, rtol=1e-4, atol=1e-4)    # the same product in float
smooth = Q.sqnr_db(Y, int8_matmul(X / s, Wl * s))
print(f"W8A8 output SQNR: plain {plain:.1f} dB | outlier columns in 16-bit (LLM.int8 idea) {mixed:.1f} dB"
      f" | smoothed (SmoothQuant idea) {smooth:.1f} dB")
assert mixed > plain + 10 and smooth > plain + 5

# %% [markdown] id="c032"
# ## 5. Clipping: give up the extremes to refine the middle
#
# Absmax makes sure no value is clipped, but for bell-shaped data the extreme values are rare: shrinking
# the range to `clip_ratio × absmax` saturates a few values and refines the step for all the others.
# Two ways to choose the ratio: a **percentile** of |x| (cheap, a guess), or a **search** for the ratio with
# the lowest MSE (what AWQ does per group [@lin2024awq]). On Gaussian data and on our weight matrix, at 3 and 4 bits:

# %% id="c033"
grid = torch.linspace(0.3, 1.0, CLIP_STEPS)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
best = {}
for ax, (name, data) in zip(axes, [("Gaussian", g_data), ("up_proj weight", W)]):
    for b in (3, 4):
        r, ratios, curve = Q.search_clip_ratio(data, bits=b, grid=grid)
        best[name, b] = (r, float(curve.min()), float(curve[-1]))
        ax.plot(ratios.numpy(), (curve / curve[-1]).numpy(), label=f"{b} bits: best ratio {r:.2f}")
    p = Q.percentile_clip_ratio(data, 99.9)
    ax.axvline(p, color="gray", ls=":", label=f"99.9th percentile: {p:.2f}")
    ax.set_title(f"{name} (per tensor)", fontsize=10)
    ax.set_xlabel("clip ratio (1 = absmax)")
    ax.set_ylabel("MSE / MSE without clipping")
    ax.legend(fontsize=8)
plt.show()
for (name, b), (r, m_best, m_none) in best.items():
    print(f"{name:15s} {b} bits: best ratio {r:.2f}, MSE {m_best / m_none:.0%} of no clipping")
    assert m_best <= m_none
assert best["Gaussian", 3][0] < 0.9 and best["Gaussian", 3][1] < 0.8 * best["Gaussian", 3][2]

per, _, _ = Q.search_clip_ratio(W, bits=4, granularity="group", group_size=128, grid=grid, per_scale=True)
m0 = Q.mse(W, Q.fake_quantize(W, 4, granularity="group", group_size=128))
m1 = Q.mse(W, Q.fake_quantize(W, 4, granularity="group", group_size=128, clip_ratio=per))
print(f"group 128, 4 bits, one searched ratio per group: MSE {m1 / m0:.0%} of no clipping "
      f"(ratios from {float(per.min()):.2f} to {float(per.max()):.2f})")
assert m1 <= m0

# %% [markdown] id="c034"
# ## 6. INT4 bit packing
#
# PyTorch has no 4-bit dtype: 4-bit codes live in `int8` tensors, wasting half of every byte. Packing puts
# two codes in one byte (here element `2j` in the low nibble, `2j+1` in the high nibble; negative codes as
# 4-bit two's complement). Unpacking sign-extends them back. The layout is a convention that kernels and
# file formats must match exactly (bitsandbytes puts the *first* code in the *high* nibble; GGUF's Q4_0,
# next section, yet another way).

# %% id="c035"
q4 = Q.absmax_quantize(W, 4, granularity="group", group_size=128)
packed = Q.pack_int4(q4.codes)
print("codes :", q4.codes[0, :8].tolist())
print("bytes :", [f"0x{v:02x}" for v in packed[0, :4].tolist()])
assert torch.equal(Q.unpack_int4(packed), q4.codes)                      # exact round trip
assert packed.numel() * 8 == q4.codes.numel() * 4                         # 4 bits per code, exactly
print(f"int8 storage {q4.codes.numel():,} bytes -> packed {packed.numel():,} bytes "
      f"(+ {q4.scale.numel() * 2:,} bytes of fp16 scales)")

# %% [markdown] id="c036"
# ## 7. Memory arithmetic for 7B and 70B models
#
# bytes = parameters × bits per weight / 8, where the bits per weight include the scales (and zero points):
# INT4 with one fp16 scale per group of 128 costs 4 + 16/128 = 4.125 bits. GB = 10⁹ bytes.

# %% id="c037"
rows = Q.memory_table({"7B": 7e9, "70B": 70e9})
display(Markdown(Q.memory_table_markdown(rows)))
by = {r["key"]: r for r in rows}
assert (by["fp32"]["7B"], by["fp16"]["7B"], by["int4"]["7B"]) == (28.0, 14.0, 3.5)
assert abs(by["int4-g128"]["7B"] - 3.609) < 1e-3 and by["fp16"]["70B"] == 140.0

# %% [markdown] id="c038"
# Real models are not round numbers. The parameter counts from the architectures (LLaMA-7B; Llama-2-70B
# with grouped-query attention), computed by the course's `LlamaConfig`:

# %% id="c039"
llama7 = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False)
llama70 = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False)
real = {"LLaMA-7B": llama7.num_parameters(), "Llama-2-70B": llama70.num_parameters()}
print({k: f"{v / 1e9:.2f}B parameters" for k, v in real.items()})
display(Markdown(Q.memory_table_markdown(Q.memory_table(real, formats=("fp32", "fp16", "int8", "int4-g128")))))
emb7 = 2 * 32000 * 4096                                   # input embedding + output head of LLaMA-7B
int4_keep_emb = Q.weight_bytes(real["LLaMA-7B"] - emb7, "int4-g128") + Q.weight_bytes(emb7, "fp16")
print(f"LLaMA-7B, INT4 g128 with embedding and head kept in FP16: {int4_keep_emb / 1e9:.2f} GB")
fits_80gb = {k: Q.weight_bytes(real["Llama-2-70B"], k) / 1e9 < 80 for k in ("fp16", "int8", "int4-g128")}
print("Llama-2-70B weights fit one 80 GB GPU:", fits_80gb)
assert fits_80gb == {"fp16": False, "int8": True, "int4-g128": True}

# %% [markdown] id="c040"
# > **Claim checked.** A figure often quoted in tutorials: *"LLaMA 7B from 28GB (FP16) to 4GB (INT4)"*.
# > 28 GB is the **FP32** size (7·10⁹ × 4 bytes); in **FP16** the weights take **14 GB** (13.5 GB for the real
# > 6.74 B parameters). For 7·10⁹ parameters INT4 is 3.5 GB for the codes alone and 3.6 GB with group-128
# > fp16 scales; the real LLaMA-7B with its embedding and output head kept in FP16 (common practice) takes
# > 3.9 GB, so "4 GB" is a fair rounding. The reduction from FP16 to INT4 is then about 3.5x, not the 7x
# > that "28 → 4" suggests.

# %% id="c041"
assert Q.weight_bytes(7e9, "fp32") / 1e9 == 28 and Q.weight_bytes(7e9, "fp16") / 1e9 == 14
assert 13.4 < Q.weight_bytes(real["LLaMA-7B"], "fp16") / 1e9 < 13.6
assert 3.8 < int4_keep_emb / 1e9 < 4.0
ratio = Q.weight_bytes(real["LLaMA-7B"], "fp16") / int4_keep_emb
print(f"FP16 -> INT4 (g128, FP16 embeddings): {ratio:.2f}x smaller")
assert 3.3 < ratio < 3.7

# %% [markdown] id="c041a"
# > **Claim checked.** The notes credit INT4 with "higher throughput" as if the arithmetic got faster. An
# > H100 has **no INT4 tensor cores**: NVIDIA's H100 datasheet lists tensor-core rates for FP64, TF32,
# > BF16/FP16, FP8 and INT8, and no INT4 line (the course's hardware table, `course_lib.perf.hardware`,
# > copies those rows and refuses `int4` for the H100, below). INT4 tensor-core operations exist on Turing
# > (T4) and Ampere (A100: 1,248 dense INT4 TOPS in its datasheet), and Blackwell adds FP4. What weight-only
# > INT4 (W4A16: GPTQ, AWQ, NF4) really speeds up is **memory-bound decode**: the weights are unpacked to
# > 16-bit inside the kernel and multiplied in FP16/BF16, so the arithmetic is no faster; what shrinks is the
# > bytes read per token. The bound, for LLaMA-7B on an H100 at batch 1 (every weight read once per token):

# %% id="c041b"
from course_lib.perf.hardware import get_gpu

h100_hw = get_gpu("H100-SXM")
try:
    h100_hw.peak_flops("int4")
    raise AssertionError("the hardware table lists no INT4 rate for the H100")
except ValueError as e:
    print("ValueError:", e)
t16 = Q.weight_bytes(real["LLaMA-7B"], "fp16") / h100_hw.bandwidth
t4 = int4_keep_emb / h100_hw.bandwidth
print(f"weights read per token at {h100_hw.bandwidth / 1e12:.2f} TB/s: FP16 {t16 * 1e3:.2f} ms, INT4 g128 "
      f"{t4 * 1e3:.2f} ms -> at most {t16 / t4:.1f}x faster decode at batch 1, from bytes alone")
assert abs(t16 / t4 - ratio) < 1e-9          # the speedup bound is the byte ratio, not an arithmetic rate

# %% [markdown] id="c042"
# ## 8. Block formats: GGUF Q8_0 and Q4_0, byte for byte
#
# llama.cpp's [@gerganov2023llamacpp] GGUF files [@ggml2023gguf] store quantized tensors as **blocks of
# 32 values**, each block an fp16 scale `d` followed by the codes:
#
# | format | bytes per block | codes | decode |
# |---|---|---|---|
# | Q8_0 | 2 + 32 = 34 | `round(x / d)`, int8, `d = absmax / 127` | `q · d` |
# | Q4_0 | 2 + 16 = 18 | `min(15, trunc(x/d + 8.5))` in 0..15, `d = m / -8` | `(q - 8) · d` |
#
# For Q4_0, `m` is the value of largest magnitude **with its sign**: it lands exactly on code 0 (= -8 · d),
# and the 16 codes -8..7 are spent on the side that needs them. The 16 bytes of nibbles hold elements 0..15
# in their **low** halves and elements 16..31 in their **high** halves. `course_lib.quant.gguf` writes these
# bytes exactly; here is the first block of a row of our matrix, taken apart:

# %% id="c043"
row = W[:2, :64]                                     # 2 rows x 2 blocks
b4 = Q.quantize_q4_0(row)
b8 = Q.quantize_q8_0(row)
print("Q4_0 bytes per row:", b4.shape[1], "= 2 blocks x 18 | Q8_0:", b8.shape[1], "= 2 blocks x 34")
info = Q.describe_block(b4[0, :18], "q4_0")
print("block hex   :", info["hex"])
print("d (fp16)    :", info["d"], "= (largest-magnitude value) / -8 =", float(row[0, :32][row[0, :32].abs().argmax()]) / -8)
print("codes 0..31 :", info["codes"])
first = b4[0, 2].item()
assert first & 0xF == info["codes"][0] and first >> 4 == info["codes"][16]   # low nibble: element 0, high: 16
assert 18 * 8 / 32 == 4.5 and 34 * 8 / 32 == 8.5                            # bits per weight
assert torch.allclose(Q.dequantize_q4_0(b4), row, atol=abs(info["d"]) * 8)

# %% id="c044"
try:
    import gguf
    from gguf.quants import quantize as gguf_ref_quantize
    for fmt, qtype in [("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0)]:
        ref = gguf_ref_quantize(W.numpy(), qtype)
        assert (Q.gguf_quantize(W, fmt).numpy() == ref).all()
    print("byte-identical to the gguf package's reference quantizers (Q8_0 and Q4_0) on the whole matrix")
except ImportError:
    print("(the `gguf` package is not installed; the course tests check byte equality against it)")

# %% [markdown] id="c045"
# How good are they? On Gaussian data and on our matrix, against our INT4 absmax with the same 32-blocks:

# %% id="c046"
for name, data in [("Gaussian", g_data.reshape(-1, 32 * 25)), ("up_proj weight", W)]:
    res = {"Q8_0 (8.5 b)": Q.sqnr_db(data, Q.dequantize_q8_0(Q.quantize_q8_0(data))),
           "Q4_0 (4.5 b)": Q.sqnr_db(data, Q.dequantize_q4_0(Q.quantize_q4_0(data))),
           "INT4 absmax g32 (4.5 b)": Q.sqnr_db(data, Q.fake_quantize(data, 4, granularity="group", group_size=32))}
    print(f"{name:15s}", " | ".join(f"{k}: {v:.2f} dB" for k, v in res.items()))
    if name == "Gaussian":
        assert res["Q4_0 (4.5 b)"] > res["INT4 absmax g32 (4.5 b)"]   # 16 levels instead of 15, no wasted code

# %% [markdown] id="c046a"
# > **Claim checked.** The lecture notes describe Q4_0 as "4-bit with 32-bit block scaling". The 32 is the
# > **block size**: 32 weights share one scale, and that scale is an **fp16** number (2 bytes), not a 32-bit
# > one. A block is 2 + 16 = 18 bytes for 32 weights: 4.5 bits per weight (an fp32 scale would make it 20
# > bytes, 5 bits). The cell reads the scale back from the first two bytes of a block as an fp16 and checks the
# > block size against the `gguf` package's table.

# %% id="c046b"
import numpy as np

from course_lib.quant.gguf import BLOCK_BYTES

d_bytes = b4[0, :2].numpy().tobytes()                      # the block's first two bytes
d_fp16 = np.frombuffer(d_bytes, dtype=np.float16)[0]
print(f"Q4_0 block: {BLOCK_BYTES['q4_0']} bytes per 32 weights; scale bytes {d_bytes.hex()} read as fp16 = "
      f"{float(d_fp16)}; describe_block's d = {info['d']}")
assert float(d_fp16) == info["d"] and BLOCK_BYTES["q4_0"] == 18 and b4.shape[1] == 2 * 18   # fp16 scale
assert 18 * 8 / 32 == 4.5
try:
    import gguf
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_0] == (32, 18)    # (weights, bytes) per block
    print("gguf's table: Q4_0 =", gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_0],
          "(weights, bytes) per block")
except ImportError:
    print("(the `gguf` package is not installed)")

# %% [markdown] id="c047"
# ## 9. NF4: a codebook shaped like the weights
#
# Uniform grids spend as many levels on the rare tails as on the crowded middle. NF4 (QLoRA,
# [@dettmers2023qlora]) instead takes
# its 16 levels at **quantiles of the standard normal distribution**, so that each level covers about the same
# share of normally distributed weights, then scales them into [-1, 1]. Two details:
#
# * **0 must be exact** (and 16 is even, so a symmetric grid cannot contain it): the halves are asymmetric,
#   8 positive levels at the normal quantiles of 9 probabilities evenly spaced from `offset` down to 0.5
#   (0.5 dropped), 7 negative levels from 8 such probabilities, plus 0 itself: 8 + 7 + 1 = 16.
# * The quantile of probability 1 is infinite, so the top probability is `offset` = 1 − ½(1/30 + 1/32) =
#   0.9677, then everything is divided by the largest level.
#
# A tensor is quantized in **blocks of 64**: divide by the block's absmax, replace each value by the index of
# the nearest level, keep the fp32 absmax: 4 + 32/64 = 4.5 bits per weight.

# %% id="c048"
cb = Q.nf4_codebook()
print("NF4 levels:", [round(v, 4) for v in cb.tolist()])
assert cb[7] == 0 and (cb > 0).sum() == 8 and (cb < 0).sum() == 7 and cb[0] == -1 and cb[-1] == 1
zq = torch.linspace(-3, 3, 400)
pdf = torch.exp(-zq ** 2 / 2) / math.sqrt(2 * math.pi)
top = float(torch.special.ndtri(torch.tensor(0.9677083, dtype=torch.float64)))
fig, ax = plt.subplots(figsize=(9, 2.8))
ax.plot(zq.numpy(), pdf.numpy(), color="gray", label="N(0, 1) density")
ax.vlines((cb * top).numpy(), 0, 0.2, color="#d04040", label="NF4 levels (x 1.85)")
ax.vlines((torch.arange(-7, 8) / 7 * top).numpy(), 0.2, 0.4, color="#5080c0", label="INT4 absmax levels")
ax.legend(fontsize=8)
ax.set_title("NF4 puts its levels where normal data is dense", fontsize=10)
plt.show()

# %% id="c049"
x_norm = torch.randn(N_RANDOM // 64 * 64, generator=gen)
nf = Q.nf4_quantize(x_norm, blocksize=64)
nf_dq = Q.nf4_quantize(x_norm, blocksize=64, double_quant=True)
cmp = {"NF4 block 64": Q.sqnr_db(x_norm, nf.dequantize()),
       "NF4 + double quant": Q.sqnr_db(x_norm, nf_dq.dequantize()),
       "INT4 absmax group 64": Q.sqnr_db(x_norm, Q.fake_quantize(x_norm, 4, granularity="group", group_size=64))}
print("Gaussian data:", " | ".join(f"{k} {v:.2f} dB" for k, v in cmp.items()))
print(f"bits per weight: NF4 {nf.bits_per_value():.3f}, with double quantization {nf_dq.bits_per_value():.3f}")
assert cmp["NF4 block 64"] > cmp["INT4 absmax group 64"]
assert abs(cmp["NF4 block 64"] - cmp["NF4 + double quant"]) < 0.1
w_nf = Q.sqnr_db(W, Q.nf4_quantize(W).dequantize())
w_int4 = Q.sqnr_db(W, Q.fake_quantize(W, 4, granularity="group", group_size=64))
print(f"up_proj weight: NF4 {w_nf:.2f} dB vs INT4 absmax g64 {w_int4:.2f} dB")

# %% [markdown] id="c050"
# **Double quantization.** The fp32 absmax of every 64 weights costs 0.5 bits per weight. QLoRA quantizes
# these scales too, "with 8-bit floats with a blocksize of 256" [@dettmers2023qlora]. What bitsandbytes does
# (`quantize_4bit(..., compress_statistics=True)`, which `bnb_4bit_use_double_quant=True` switches on):
# subtract the mean of the absmax values (the **offset**, kept in fp32), then `quantize_blockwise` the
# centred values in blocks of 256, each block divided by its own absmax (fp32) and rounded to the nearest
# entry of bitsandbytes' **dynamic 8-bit map**. That map is a float-like code, not an int8 grid: one sign
# bit, then a decimal exponent written as a run of zero bits ended by a 1, and the remaining bits a linear
# fraction in [0.1, 1]. Each extra zero divides the value by 10 and costs a fraction bit, so per sign there
# are 64 codes in [0.1, 1), 32 in [0.01, 0.1), ... down to 1 code below 1e-6, plus 0 and 1 (counted below).
# It is signed, which is why the offset matters: the scales are all positive, and without centring them
# the 127 negative codes would never be used. Cost:
# 4 + 8/64 + 32/(64·256) = 4.127 bits per weight, for an SQNR change of a few hundredths of a dB (above).
# On a 70B model:

# %% id="c051"
from course_lib.quant.nf4 import dynamic_map

code8 = dynamic_map()                                # bitsandbytes' signed "dynamic" 8-bit code, 256 values
pos = code8[code8 > 0]
decades = [int(((pos >= 10.0 ** -(k + 1)) & (pos < 10.0 ** -k)).sum()) for k in range(7)]
print(f"dynamic map: {code8.numel()} codes in [{code8.min():.3f}, {code8.max():.0f}], {int((code8 < 0).sum())} "
      f"negative; positive codes per decade [0.1, 1), [0.01, 0.1), ...: {decades}, smallest {pos.min():.1e}")
assert code8.numel() == 256 and int((code8 < 0).sum()) == 127
assert decades == [64, 32, 16, 8, 4, 2, 1]                   # one fraction bit fewer per decade
try:
    import bitsandbytes.functional as bnbF
    assert torch.equal(code8, bnbF.create_dynamic_map().cpu())     # the same table as bitsandbytes'
except ImportError:
    pass
saved = Q.weight_bytes(70e9, "nf4") - Q.weight_bytes(70e9, "nf4-dq")
print(f"offset = {nf_dq.offset:.4f} (mean absmax); 70B parameters: NF4 {Q.weight_bytes(70e9, 'nf4') / 1e9:.1f} GB, "
      f"with double quantization {Q.weight_bytes(70e9, 'nf4-dq') / 1e9:.1f} GB, saving {saved / 1e9:.2f} GB")
assert 3.2 < saved / 1e9 < 3.3

# %% id="c052"
try:
    import bitsandbytes.functional as bnbF
    packed_ref, state = bnbF.quantize_4bit(x_norm, blocksize=64, quant_type="nf4")
    assert torch.equal(cb, bnbF.get_4bit_type("nf4", device="cpu"))
    assert torch.equal(nf.packed, packed_ref.reshape(-1)) and torch.equal(nf.absmax, state.absmax)
    print("same codebook, same packed bytes and absmax as bitsandbytes.functional.quantize_4bit (nf4, block 64)")
except ImportError:
    print("(bitsandbytes is not installed; the course tests compare with it)")

# %% [markdown] id="c053"
# ## 10. Explore: quantize a real weight matrix yourself
#
# Pick a weight matrix of layer `LAYER`, the number of bits, symmetric or asymmetric, the granularity, the
# group size (the options are the divisors of the input dimension) and a clip ratio. The left plot shows the
# weights and the grid of the group holding the largest |w|; the middle one the staircase `w → ŵ`; the right
# one the error. Things to try: 3 bits per tensor vs per group 32; the clip ratio at 3 bits; zero-point vs
# absmax per tensor.

# %% id="c054"
explorer = QuantExplorer.from_model(model, layer=LAYER, matrix=f"layers.{LAYER}.mlp.up_proj", bits=4,
                                    granularity="group", group_size=64)
explorer

# %% [markdown] id="c055"
# The widget's logic is plain Python, so a cell can drive it too. The up-projection at 3 bits, per tensor
# then per group 32:

# %% id="c056"
explorer.set(bits=3, granularity="tensor")          # like moving the controls, with one redraw
s_tensor = explorer.stats["sqnr_db"]
explorer.set(granularity="group", group_size=32)    # (setting one control's .value works too)
s_group = explorer.stats["sqnr_db"]
print(f"{explorer.matrix.value}, 3 bits: per tensor {s_tensor:.2f} dB, group 32 {s_group:.2f} dB "
      f"({explorer.stats['bits_per_weight']:.2f} bits/weight)")
assert s_group > s_tensor

# %% [markdown] id="c056a"
# ## 11. Microscaling FP4: MXFP4 and NVFP4
#
# Q4_0 and NF4 pay 16 or 32 bits for each block's scale. The Open Compute Project's **microscaling (MX)**
# formats make the scale one byte and the element a tiny float [@ocp2023microscaling; @rouhani2023microscaling].
# **MXFP4** stores blocks of 32 **FP4 E2M1** elements (1 sign, 2 exponent, 1 mantissa bit: ±{0, 0.5, 1, 1.5,
# 2, 3, 4, 6}, no infinity, no NaN) and one **E8M0** scale per block: 8 exponent bits and nothing else, the
# value $2^{E-127}$, with E = 0xFF meaning NaN. That is 4 + 8/32 = **4.25 bits per weight**. The
# specification's conversion of a block $V_1..V_{32}$ (rounding to nearest, ties to even, as IEEE casts do):
#
# $$\text{shared\_exp} = \lfloor \log_2 \max_i |V_i| \rfloor - 2, \qquad X = 2^{\text{shared\_exp}}, \qquad
#   P_i = \text{E2M1}(V_i / X)\ \text{(round to nearest even, clamped to } \pm 6)$$
#
# (2 is the exponent of E2M1's largest value, 6 = 1.5·2²), and a block decodes to $X \cdot P_i$, or to NaN
# throughout when $X$ is NaN: that is how a NaN or an infinity in the input survives. The power-of-two scale
# puts the block's maximum anywhere in [4, 8): a maximum whose mantissa is above 1.5 is **clamped** to 6.
#
# **NVFP4** [@alvarez2025introducing] keeps the E2M1 elements and changes the scale: blocks of 16, an FP8
# **E4M3** scale per block (3 mantissa bits, so not a power of two) and one FP32 scale per tensor that
# brings the block scales into E4M3's range: tensor scale = amax / (6 · 448), block scale =
# E4M3((block amax / 6) / tensor scale). The block's maximum lands near 6. Cost: 4 + 8/16 = **4.5 bits**.
#
# These are not curiosities: gpt-oss ships its mixture-of-experts weights, over 90% of its parameters, in
# MXFP4 at 4.25 bits per parameter, which is what lets the 120B model fit one 80 GB GPU [@openai2025gptoss];
# and Blackwell GPUs' tensor cores multiply FP4 operands with these block scales directly
# [@nvidia2024blackwell; @alvarez2025introducing]. On a CPU we emulate the formats: `course_lib.quant.mx`
# encodes and decodes them exactly as defined (its tests compare with PyTorch's E8M0 and E4M3 casts and with
# `ml_dtypes`' E2M1). Its docstring records where it agrees with the spec authors' library, microxcaling, and
# with torchao's `to_mx`, and where they differ: microxcaling takes `floor(log2(max))` in float32, which for
# a block maximum a few ulps below a power of two rounds up and doubles the scale (shown in the cell
# below); torchao's releases up to 0.18.0 give a block holding an infinity a finite scale, and divide the
# blocks of the smallest scale, 2^-127, by 2^-126 (its main branch now does as the spec and we do). First
# the element and one block:

# %% id="c056b"
from course_lib.quant.mx import e2m1_decode, e2m1_encode, e2m1_values, mxfp4_quantize, nvfp4_quantize

print("E2M1, codes 0..15:", e2m1_values().tolist())
mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
rounded = e2m1_decode(e2m1_encode(mids)).tolist()
print("midpoints", mids.tolist(), "->", rounded, "(ties go to the even code; 7 saturates to 6)")
assert rounded == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]

blk = W[0, :32]
mx1 = mxfp4_quantize(blk)
amax, X = float(blk.abs().max()), float(mx1.scale_values())
print(f"MXFP4 block W[0, :32]: max |w| = {amax:.5f} = 2^{math.log2(amax):.2f} -> shared_exp = "
      f"floor({math.log2(amax):.2f}) - 2 = {round(math.log2(X))}, X = {X:.6g} (E8M0 byte {int(mx1.scales)})")
print("  |w| / X :", [round(v, 2) for v in (blk.abs() / X)[:8].tolist()], "...")
print("  codes   :", mx1.codes().reshape(-1)[:8].tolist(), "...  values", e2m1_decode(mx1.codes().reshape(-1)[:8]).tolist())
assert X == 2.0 ** (math.floor(math.log2(amax)) - 2) and int(mx1.scales) == round(math.log2(X)) + 127
assert 4 <= amax / X < 8                          # the block maximum lands in E2M1's top binade
below8 = torch.nextafter(torch.tensor(8.0), torch.tensor(0.0))        # 8 - 2^-21, the float32 just below 8
exact = int(torch.frexp(below8).exponent) - 1                          # its binary exponent: floor(log2) = 2
shared_below8 = int(mxfp4_quantize(below8.expand(32)).scales) - 127
print(f"max = 8 - 2^-21: floor(log2) = {exact}; float32 log2 gives {torch.log2(below8).item()!r} on this machine "
      f"(floor {int(torch.log2(below8).floor())}); mxfp4_quantize's shared_exp = {shared_below8} = {exact} - 2")
assert exact == 2 and shared_below8 == exact - 2
nv1 = nvfp4_quantize(blk)
print(f"NVFP4, same 32 weights = 2 blocks of 16: tensor scale {float(nv1.tensor_scale):.3g}, E4M3 block scales "
      f"{nv1.block_scales.float().tolist()}; max |w| / scale = "
      f"{[round(float(blk[i * 16:(i + 1) * 16].abs().max()) / float(s), 3) for i, s in enumerate(nv1.scale_values())]}")

# %% [markdown] id="c056c"
# Now every linear weight of layer `LAYER` (all six layers when `MX_ALL_LAYERS`), against the formats of
# sections 8 and 9. For a fair comparison every format cuts each matrix into the same blocks of B
# consecutive weights (row-major, as NF4 does; the down-projection's rows of 688 are not a multiple of 32),
# at B = 32 and B = 16, and the table states each format's bits per weight, scales included: INT4 absmax
# with an fp16 scale per block (15 levels), NF4 with an fp32 absmax per block (bitsandbytes' layout),
# MXFP4, NVFP4, and one hybrid that isolates the scale's effect: MX's power-of-two E8M0 rule on blocks of 16.

# %% id="c056d"
from course_lib.modules import layer_index, named_linears

mats = {n: model.get_submodule(n).weight.detach().float() for n in named_linears(model)
        if MX_ALL_LAYERS or layer_index(n) == LAYER}


def int4_block(w, b):
    return Q.fake_quantize(w.reshape(-1, b), 4, granularity="channel", axis=0).reshape(w.shape), 4 + 16 / b


def nf4_block(w, b):
    q = Q.nf4_quantize(w, blocksize=b)
    return q.dequantize(), q.bits_per_value()


def mx_block(w, b):
    q = mxfp4_quantize(w.reshape(-1, b), block_size=b)
    return q.dequantize().reshape(w.shape), q.bits_per_value()


def nv_block(w, b):
    q = nvfp4_quantize(w.reshape(-1, b), block_size=b)
    return q.dequantize().reshape(w.shape), q.bits_per_value()


variants = [("MXFP4", "E2M1 + E8M0 (power of two)", 32, mx_block),
            ("INT4 absmax", "int4 + fp16", 32, int4_block),
            ("NF4", "codebook + fp32", 32, nf4_block),
            ("NVFP4", "E2M1 + E4M3, FP32 per tensor", 16, nv_block),
            ("E2M1 + E8M0 at 16", "E2M1 + E8M0 (power of two)", 16, mx_block),
            ("INT4 absmax", "int4 + fp16", 16, int4_block),
            ("NF4", "codebook + fp32", 16, nf4_block),
            ("NF4 (bitsandbytes default)", "codebook + fp32", 64, nf4_block)]
n_weights = sum(w.numel() for w in mats.values())
signal = sum(float(w.pow(2).sum()) for w in mats.values())
mx_rows = []
for name, scale, b, fn in variants:
    noise, bits = 0.0, 0.0
    for w in mats.values():
        w_hat, bpw = fn(w, b)
        noise += float((w - w_hat).pow(2).sum())
        bits += bpw * w.numel()
    mx_rows.append(dict(format=name, scale=scale, block=b, bits=bits / n_weights, sqnr=10 * math.log10(signal / noise)))
table = "| format | element + scale | block | bits / weight | SQNR (dB) |\n|---|---|---|---|---|\n"
table += "".join(f"| {r['format']} | {r['scale']} | {r['block']} | {r['bits']:.3f} | {r['sqnr']:.2f} |\n" for r in mx_rows)
display(Markdown(f"{len(mats)} weight matrices, {n_weights:,} weights:\n\n" + table))
sq = {(r["format"], r["block"]): r["sqnr"] for r in mx_rows}
bits = {(r["format"], r["block"]): r["bits"] for r in mx_rows}
assert bits["MXFP4", 32] == 4.25 and abs(bits["NVFP4", 16] - 4.5) < 1e-3         # + 32 bits per matrix
# how many MXFP4 blocks lose their maximum to the clamp (max |w| / X in (6, 8) after rounding to E2M1)
blocks32 = torch.cat([w.reshape(-1, 32) for w in mats.values()])
X32 = mxfp4_quantize(blocks32).scale_values().reshape(-1)        # one scale per row of 32
clipped = float((blocks32.abs().amax(dim=1) / X32 > 6.0).float().mean())
print(f"MXFP4: {clipped:.0%} of the blocks have a maximum above 6·X (|max| / X in (6, 8)): it comes back as 6·X")

# %% [markdown] id="c056e"
# > **Claim checked.** "MXFP4 is as accurate as NVFP4: both are just FP4." They share the element, not the
# > accuracy: on these weights NVFP4's SQNR is well above MXFP4's (the table), for 0.25 more bits per
# > weight. The hybrid row says where the difference comes from. MX's power-of-two rule on blocks of 16 is
# > no better than on blocks of 32: with the floor rule a smaller block mostly means more block maxima above
# > 6·X (the count above), each coming back as 6·X, up to 25% too small. The E4M3 scale, which puts each
# > block's maximum close to 6 instead of anywhere in [4, 8), makes the difference. The second half of the
# > story: at the same 4.5 bits, NVFP4 lands where INT4 absmax with an fp16 scale per 32 and NF4 per 64
# > already were. Its advantage over them is not storage accuracy but the hardware: Blackwell's tensor cores
# > compute with FP4 blocks directly, while INT4 and NF4 weights must be converted first. (Held-out bits per
# > byte is not measured here: on the tiny model each evaluation costs more than this whole section.)

# %% id="c056f"
gain_nv = sq["NVFP4", 16] - sq["MXFP4", 32]
gain_block = sq["E2M1 + E8M0 at 16", 16] - sq["MXFP4", 32]
print(f"NVFP4 - MXFP4: {gain_nv:+.2f} dB; of which the block of 16 under MX's scale rule: {gain_block:+.2f} dB, "
      f"the E4M3 scale: {gain_nv - gain_block:+.2f} dB")
print(f"at 4.5 bits: NVFP4 {sq['NVFP4', 16]:.2f} dB, INT4 absmax g32 {sq['INT4 absmax', 32]:.2f} dB, "
      f"NF4 block 64 {sq['NF4 (bitsandbytes default)', 64]:.2f} dB")
assert gain_nv > 1.0                        # NVFP4 is measurably more accurate than MXFP4
assert gain_block < 0.5 * gain_nv           # ... because of its scale far more than its block size
assert abs(sq["NVFP4", 16] - sq["INT4 absmax", 32]) < 1 and abs(sq["NVFP4", 16] - sq["NF4 (bitsandbytes default)", 64]) < 1
assert sq["INT4 absmax", 16] > sq["INT4 absmax", 32] and sq["NF4", 16] > sq["NF4", 32]   # these do gain from smaller blocks

# %% [markdown] id="c057"
# ## Summary
#
# * A format is a rule from bits to values: exponent bits buy range, mantissa bits buy precision
#   (BF16 = FP32's range at 8-bit precision; FP8 E4M3 vs E5M2).
# * Integer quantization stores codes plus a scale: absmax (symmetric) or zero-point (asymmetric, better
#   for one-sided data). Each bit is worth about 6 dB of SQNR.
# * Granularity decides whose maximum sets the step: per group contains an outlier's damage to its group,
#   for 16/group_size extra bits per weight. Clipping trades a few saturated values for a finer grid.
# * Memory = parameters × bits per weight / 8, scales included: 7B is 28 GB in FP32, 14 GB in FP16,
#   about 3.6 GB in INT4 g128.
# * Real formats fix every detail: GGUF Q4_0's signed max / −8 and nibble order, NF4's normal-quantile
#   codebook with an exact zero and double-quantized scales, MXFP4's E2M1 elements under a power-of-two
#   E8M0 scale per 32 (4.25 bits) and NVFP4's E4M3 scale per 16 (4.5 bits, measurably more accurate).
#
# **Next (module 03):** quantizing whole LLMs: weight-only W4A16 with GPTQ and AWQ, LLM.int8 and
# SmoothQuant for activations, bitsandbytes through transformers, and perplexity against memory and speed.
#
# ## Further reading
#
# Used in this notebook:
#
# * [@micikevicius2022fp8]: the FP8 formats E4M3 and E5M2, and which tensors each is for.
# * [@dettmers2022llmint8]: outlier features in LLM activations, and the mixed-precision fix of section 4.
# * [@xiao2023smoothquant]: migrating the activations' outliers into the weights (section 4's preview).
# * [@dettmers2023qlora]: NF4, its block size of 64, and double quantization (section 9).
# * [@frantar2023gptq; @lin2024awq]: the group size 128 of weight-only INT4, and AWQ's searched scales.
# * [@ggml2023gguf; @gerganov2023llamacpp]: the GGUF block formats Q8_0 and Q4_0 (section 8).
# * [@ocp2023microscaling; @rouhani2023microscaling]: the MX formats, MXFP4's E2M1 elements and E8M0 scale
#   per 32 (section 11).
# * [@alvarez2025introducing]: NVFP4, an E4M3 scale per 16 and a per-tensor FP32 scale (section 11).
#
# To go further:
#
# * [@jacob2018quantization]: integer-only inference with scale and zero point, the scheme behind
#   asymmetric quantization and most int8 deployments.
# * [@gholami2021survey]: a survey of quantization methods for neural network inference.
