# Source of the notebook beside this file (same name, .ipynb). After editing it, run
#     python tools/nb.py sync --from-py
# (tools/nb.py describes the format; the build adds the Colab badge and install cells).

# %% [markdown] id="c002"
# # 03 · Quantizing LLMs
#
# Module 02 quantized single tensors. Here we quantize a whole language model, the course's bundled
# `tiny` Llama (4.7 M parameters, trained on Python's standard library), with every post-training method
# of the lecture notes, each built from scratch in `course_lib.quant`:
#
# 1. **weight-only** W8A16 / W4A16 round-to-nearest (RTN) with group scales, packed int4, measured bytes;
# 2. **activations**: dynamic per-token int8 (W8A8) and the **outlier channels** of the real model;
# 3. **LLM.int8()**: outlier columns in floating point, the rest int8, checked against `bitsandbytes`;
# 4. **SmoothQuant**: move the activations' difficulty into the weights, then W8A8;
# 5. **AWQ**: a *searched* per-channel scale folded into the previous op;
# 6. **GPTQ**: second-order error feedback through the inverse Hessian;
# 7. **one table**: method, bits, measured weight bytes, held-out bits per byte, decode ms/token, and a plot.
#
# Every method is one call, `quantize_model(model, method, ...)`, which swaps the model's `nn.Linear`s for
# quantized modules (the approach of gpt-fast's quantization handlers).

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()            # True under the tests (COURSE_QUICK=1): small sizes
CALIB_BATCHES = 8 if QUICK else 32         # calibration windows (training split) for SmoothQuant, AWQ, GPTQ
CALIB_LEN = 256                            # tokens per window
HELD_FILES = 3 if QUICK else 12            # held-out files scored for bits per byte
HELD_CHARS = 3000 if QUICK else 20000      # characters kept of each
AWQ_GRID = 10 if QUICK else 20             # alphas tried per scaling group
AWQ_ROWS = 512 if QUICK else 4096          # calibration tokens used by the AWQ search
DECODE_TOKENS = 16 if QUICK else 64        # tokens timed for decode ms/token
GROUP = 128                                # group size of the 4-bit formats
SEED = 0

# %% id="c004"
import copy
import logging

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import course_lib.quant as Q
from course_lib.models import load
from course_lib.perf.quality import bits_per_byte
from course_lib.quant_eval import (Variant, calibration_batches, compare, decode_ms_per_token, heldout_texts,
                                   table_markdown)

# bitsandbytes' CPU backend logs a warning when an optional 4-bit kernel cannot be fetched; we use int8 only.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward"))

torch.manual_seed(SEED)
model, tok = load("tiny", device="cpu")
calib = calibration_batches(tok, CALIB_BATCHES, CALIB_LEN, seed=SEED)
texts = heldout_texts(HELD_FILES, HELD_CHARS)
held_ids = [torch.tensor([tok(t, add_special_tokens=False, verbose=False)["input_ids"][:CALIB_LEN]]) for t in texts]
prompt = held_ids[0][0, :32]
fp_bpb = bits_per_byte(model, tok, texts, progress=False)
print(f"QUICK={QUICK}: {CALIB_BATCHES} x {CALIB_LEN} calibration tokens, {len(texts)} held-out texts; "
      f"fp32 held-out bits/byte {fp_bpb:.4f}")

# %% [markdown] id="c005"
# ## 1. Weight-only: W8A16 and W4A16 round-to-nearest
#
# Each weight row is cut into groups of `GROUP` input columns; each group gets a scale (stored fp16) and,
# asymmetric, a zero point (int8): $w \approx (q - z)\,s$. 4-bit codes are packed two per byte with
# module 02's `pack_int4`. The activations stay in 16/32 bits: the layer dequantizes and multiplies.
# What does a layer really take? We measure the bytes of its `state_dict`, and check them against the
# formula codes + scales + zero points.

# %% id="c006"
up = model.model.layers[0].mlp.up_proj                 # [688, 256]
rows = []
for bits, gs in [(8, None), (4, GROUP), (4, 32)]:
    ql = Q.QuantLinear.from_linear(up, bits=bits, group_size=gs)
    measured = Q.state_dict_bytes(ql)
    n_groups = -(-up.in_features // (gs or up.in_features))
    formula = up.out_features * (up.in_features * bits // 8 + n_groups * (2 + 1))
    assert measured == formula
    err = (ql.dequantize_weight() - up.weight).pow(2).mean().sqrt().item()
    rows.append(f"| {bits} | {gs or 'row'} | {measured:,} | {measured * 8 / up.weight.numel():.3f} | {err:.2e} |")
fp_bytes = up.weight.numel() * 4
display(Markdown(f"`layers.0.mlp.up_proj`, fp32: {fp_bytes:,} bytes\n\n| bits | group | measured bytes | "
                 "bits/weight | RMS error |\n|---|---|---|---|---|\n" + "\n".join(rows)))

# %% [markdown] id="c007"
# The extra 0.19 bits per weight at group 128 are the fp16 scale and int8 zero point of each group
# (24 bits / 128). The whole model: `quantize_model` leaves the tied `lm_head` (it *is* the embedding
# matrix) in fp32, as is common practice, and swaps the other 42 linears.

# %% id="c008"
sizes = {"fp32": Q.state_dict_bytes(model)}
for bits in (8, 4):
    qm = Q.quantize_model(model, "rtn", bits=bits, group_size=GROUP)
    sizes[f"W{bits}A16"] = Q.state_dict_bytes(qm)
    print(f"W{bits}A16 RTN: {sizes[f'W{bits}A16']:,} bytes; {type(qm.model.layers[0].mlp.up_proj).__name__} "
          f"{qm.model.layers[0].mlp.up_proj.extra_repr()}")
print(f"fp32: {sizes['fp32']:,} bytes (embedding = lm_head: {model.lm_head.weight.numel() * 4:,})")
assert sizes["W4A16"] < sizes["W8A16"] < sizes["fp32"] / 2

# %% [markdown] id="c009"
# ## 2. Activations and their outliers
#
# W8A8 quantizes the activations too, so the matmul can run on int8 tensor cores: each token (row) gets
# its own scale, computed on the fly (*dynamic* per-token quantization). One large channel sets the scale
# for the whole row, and the other channels lose precision. Does our model have such channels? We record
# max |x| per input channel of every linear on real text:

# %% id="c010"
absmax = Q.activation_absmax(model, calib[:2])
report = Q.outlier_report(absmax, top=3)
show = [r for r in report if r["layer"].endswith(("q_proj", "gate_proj", "down_proj"))]
head = list(show[0])
display(Markdown("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" +
                 "\n".join("| " + " | ".join(str(r[h]) for h in head) + " |" for r in show)))
# the linears fed by an RMSNorm read the residual stream: is one channel the largest in most of them?
normed = [r for r in report if r["layer"].endswith(("q_proj", "gate_proj"))]
tops = [r["channels"][0] for r in normed]
channel = max(set(tops), key=tops.count)
worst = max(normed, key=lambda r: r["max/median"])
print(f"channel {channel} is the largest input of {tops.count(channel)} of the {len(normed)} norm-fed linears; "
      f"largest ratio {worst['max/median']}x the median channel ({worst['layer']})")
assert tops.count(channel) > len(normed) / 2 and worst["max/median"] > 2.5

# %% id="c011"
fig, ax = plt.subplots(figsize=(9, 3))
for name in ["model.layers.0.self_attn.q_proj", "model.layers.3.mlp.gate_proj", "model.layers.3.mlp.down_proj"]:
    a = absmax[name].sort(descending=True).values
    ax.semilogy(a.numpy(), label=name.replace("model.", ""))
ax.set_xlabel("input channel (sorted by max |x|)")
ax.set_ylabel("max |x| on calibration text")
ax.legend(fontsize=8)
ax.set_title("a few channels are far larger than the rest", fontsize=10)
plt.show()

# %% [markdown] id="c012"
# One residual-stream channel stands out in every layer, at a few times the median: the same phenomenon as
# in large LLMs, much milder (Dettmers et al. report channels 20x and more above the rest from about
# 6.7 B parameters on). The `down_proj` inputs (after SiLU · up) are large everywhere, not in a few channels.
# Per-token int8 of the activations, on real inputs: the error of W8A8 against W8A16 on the norm-fed layer
# with the largest outlier ratio.

# %% id="c013"
lin = model.get_submodule(worst["layer"])
x = Q.capture_inputs(model, calib[:2], [worst["layer"]])[worst["layer"]]
ref = lin(x).detach()
rel = lambda y: ((y - ref).norm() / ref.norm()).item()
e_w8a8 = rel(Q.W8A8Linear.from_linear(lin)(x))
e_w8a16 = rel(Q.QuantLinear.from_linear(lin, bits=8, group_size=None)(x))
print(f"{worst['layer']}: relative output error W8A16 {e_w8a16:.2e}, W8A8 {e_w8a8:.2e}")
assert e_w8a8 > e_w8a16

# %% [markdown] id="c014"
# ## 3. LLM.int8(): keep the outlier columns in floating point
#
# Dettmers et al. (2022) split the input features: the columns where some token has |x| ≥ 6 are multiplied
# in floating point, the rest in int8 (per-token scales for x, per-row scales for W). The weights are stored
# once, in int8. Our reference (`LLMInt8Linear`) and `bitsandbytes.nn.Linear8bitLt` on the same real inputs:

# %% id="c015"
import bitsandbytes as bnb

ours = Q.LLMInt8Linear.from_linear(lin, threshold=6.0)
xh = x[:256].half().float()                          # bitsandbytes quantizes fp16 inputs
y_ours = ours(xh)
b = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=False, has_fp16_weights=False, threshold=6.0)
b.weight = bnb.nn.Int8Params(lin.weight.data.half().float().clone(), requires_grad=False, has_fp16_weights=False)
with torch.no_grad():
    y_bnb = b(xh).float()
n_out = ours.last_outliers.numel()
diff = ((y_ours - y_bnb).norm() / y_bnb.norm()).item()
e_mixed = rel(ours(x))
print(f"{n_out} outlier columns of {lin.in_features} (threshold 6); ours vs bitsandbytes: relative "
      f"difference {diff:.1e}; LLM.int8 error {e_mixed:.2e} vs plain W8A8 {e_w8a8:.2e}")
assert diff < 1e-2 and e_mixed <= e_w8a8 * 1.01

# %% [markdown] id="c016"
# The tests (`tests/test_quant_llm.py`) check the agreement element by element within one int8 step of x:
# bitsandbytes takes each token's scale over every value below the threshold, our reference over the
# columns that really take the int8 path. How many outlier columns a model has depends on its scale: the
# paper found them emerging around 6.7 B parameters; our 4.7 M model has few in its norm-fed layers, while
# the threshold 6 sends most `down_proj` columns (large everywhere) to the floating-point path: a fixed
# threshold is tuned for large models.

# %% [markdown] id="c017"
# ## 4. SmoothQuant: migrate the difficulty into the weights
#
# For each input channel j, $s_j = \max|X_j|^{\alpha} / \max|W_{:,j}|^{1-\alpha}$; dividing the activations
# by s (folded into the RMSNorm gain, or the previous linear's rows) and multiplying the weight columns by s
# leaves the product unchanged. First the check that matters: the smoothed model, **before** quantization,
# computes the same function.

# %% id="c018"
smoothed = copy.deepcopy(model)
scales = Q.smooth_model(smoothed, calib[:4], alpha=0.5)
with torch.no_grad():
    l0, l1 = model(held_ids[0]), smoothed(held_ids[0])
print(f"{len(scales)} smoothed groups; max |logit difference| of the smoothed fp model: {(l0 - l1).abs().max():.1e}")
torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-4)

names = [n for g in Q.scaling_groups(model) for n, _ in g.linears]
xa, xb = Q.capture_inputs(model, held_ids[:1], names), Q.capture_inputs(smoothed, held_ids[:1], names)
errs = []
for n in names:   # each against its own fp output (an up_proj's output is itself divided by the next s)
    r0, r1 = model.get_submodule(n)(xa[n]).detach(), smoothed.get_submodule(n)(xb[n]).detach()
    e0 = (Q.W8A8Linear.from_linear(model.get_submodule(n))(xa[n]) - r0).norm() / r0.norm()
    e1 = (Q.W8A8Linear.from_linear(smoothed.get_submodule(n))(xb[n]) - r1).norm() / r1.norm()
    errs.append((e0.item(), e1.item()))
better = sum(e1 < e0 for e0, e1 in errs)
print(f"W8A8 layer error on held-out text: smoothing lowers it in {better} of {len(errs)} linears "
      f"(mean {sum(e for e, _ in errs) / len(errs):.2e} -> {sum(e for _, e in errs) / len(errs):.2e})")
assert better > len(errs) / 2

# %% [markdown] id="c019"
# > **Claim checked.** The lecture notes' SmoothQuant sketch sets `s = X_abs_max ** alpha`: without the
# > weight term $\max|W_j|^{1-\alpha}$ it does not *balance* the two ranges (with it, α = 0.5 makes
# > max|X_j|/s_j = max|W_j|·s_j), and it shows no check that the smoothed model equals the original. The
# > scale must multiply the weight's **input** axis (the columns of an `nn.Linear` weight [out, in]); the
# > wrong axis changes the function, which the allclose check above would catch.

# %% [markdown] id="c020"
# ## 5. AWQ: search the scale
#
# AWQ protects the weight columns that meet large activations by scaling them up before rounding:
# $s = \overline{|x|}^{\alpha}$, normalized, and it **searches** α on a grid, measuring each trial's output
# error on calibration data. Each trial quantizes a scaled *copy*, so the weights are unchanged between
# trials; the winner is folded into the previous op. α = 0 is plain RTN, so the search can only help on the
# calibration data. The loss curve of one group:

# %% id="c021"
xs = Q.capture_inputs(model, calib[:2], ["model.layers.2.mlp.down_proj"], max_rows=AWQ_ROWS)
w_down = model.model.layers[2].mlp.down_proj.weight
before = w_down.detach().clone()
res = Q.awq_search_group([w_down], xs["model.layers.2.mlp.down_proj"], bits=4, group_size=GROUP, n_grid=AWQ_GRID)
assert torch.equal(w_down, before)                                # restored: trials worked on copies
fig, ax = plt.subplots(figsize=(6, 2.8))
ax.plot(res.grid, res.losses, "o-")
ax.set_xlabel("alpha")
ax.set_ylabel("output MSE (calibration)")
ax.set_title(f"AWQ search, layers.2.mlp.down_proj: best alpha {res.alpha:.2f}", fontsize=10)
plt.show()
print(f"loss at alpha 0 (RTN) {res.losses[0]:.3e}, at the best alpha {min(res.losses):.3e}")
assert min(res.losses) <= res.losses[0]

# %% [markdown] id="c022"
# > **Claim checked.** The lecture notes' "AWQ implementation (simplified)" multiplies the weights by an
# > importance score and divides after dequantizing: there is **no search**, and nothing bounds the result
# > by RTN. Scaling by the importance itself (α = 1) is the last point of the curve above: here it costs
# > more error than the searched α (printed below).

# %% id="c023"
s1 = Q.awq_scale_candidates(xs["model.layers.2.mlp.down_proj"].abs().mean(0), 1.0)
c, s_, z = Q.rtn_quantize_weight(w_down.detach() * s1, 4, GROUP)
g = Q.group_index(w_down.shape[1], GROUP)
w1 = (c - z[:, g]) * s_[:, g] / s1
x_dn = xs["model.layers.2.mlp.down_proj"]
loss_alpha1 = (x_dn @ (w1 - w_down.detach()).T).pow(2).mean().item()
print(f"alpha = 1 (the notes' rule): {loss_alpha1:.3e}; searched alpha {res.alpha:.2f}: {min(res.losses):.3e}; "
      f"RTN {res.losses[0]:.3e}")
assert loss_alpha1 > min(res.losses)

# %% [markdown] id="c024"
# ## 6. GPTQ: error feedback through the inverse Hessian
#
# For one layer, GPTQ minimizes $\lVert XW^\top - XW_q^\top \rVert^2$ with $H = 2X^\top X$ from calibration
# inputs. It quantizes one column at a time and spreads that column's rounding error over the columns not
# yet quantized, $w_k \mathrel{-}= \frac{w_j - q_j}{[H^{-1}]_{jj}}[H^{-1}]_{jk}$: the rows of the upper
# Cholesky factor of $H^{-1}$ hold these updates. Damping, lazy batches, groups, act-order and dead columns
# are in `course_lib/quant/gptq.py`. The objective, layer by layer, on calibration and held-out inputs:

# %% id="c025"
lins = Q.named_linears(model)
hess = Q.input_hessians(model, calib, list(lins))
held_x = Q.capture_inputs(model, held_ids, list(lins))
ratio_cal, ratio_held = [], []
for name, l in lins.items():
    w = l.weight.detach()
    r = Q.gptq_quantize(w, hess[name][0], bits=4, group_size=GROUP)
    c, s_, z = Q.rtn_quantize_weight(w, 4, GROUP)
    g = Q.group_index(w.shape[1], GROUP)
    w_rtn = (c - z[:, g]) * s_[:, g]
    ratio_cal.append(Q.hessian_error(w, r.weight, hess[name][0]) / Q.hessian_error(w, w_rtn, hess[name][0]))
    ratio_held.append(Q.layer_output_error(w, r.weight, held_x[name]) / Q.layer_output_error(w, w_rtn, held_x[name]))
fig, ax = plt.subplots(figsize=(10, 3))
ax.bar(range(len(lins)), ratio_cal, width=0.4, label="calibration")
ax.bar([i + 0.4 for i in range(len(lins))], ratio_held, width=0.4, label="held-out")
ax.axhline(1, color="k", lw=0.8)
ax.set_xticks(range(len(lins)), [n.replace("model.layers.", "").replace("self_attn.", "").replace("mlp.", "")
                                 for n in lins], rotation=90, fontsize=6)
ax.set_ylabel("GPTQ error / RTN error")
ax.legend(fontsize=8)
plt.show()
print(f"GPTQ / RTN layer output error: calibration max {max(ratio_cal):.2f} (mean {sum(ratio_cal) / len(ratio_cal):.2f}), "
      f"held-out max {max(ratio_held):.2f} (mean {sum(ratio_held) / len(ratio_held):.2f})")
assert max(ratio_cal) < 1

# %% [markdown] id="c026"
# On held-out inputs GPTQ stays below RTN at every layer once the calibration set is large and varied
# enough (the tests use 32 windows of 256 tokens from 200 files); with few windows the wide `down_proj`
# layers (688 inputs) over-fit their calibration Hessian. (Printed above: the held-out maximum at this size.)
#
# > **Claim checked.** The notes' "simplified GPTQ" spreads the error with `H[j, j+1:] / H[j, j]`, the
# > Hessian itself, not its inverse, and calls GPTQ "gradient-based". GPTQ is second-order and uses
# > $H^{-1}$ (through the Cholesky factor). The notes' rule, written out below, on one layer:

# %% id="c027"
def notes_rule(w, H, bits=4, group_size=GROUP):      # the notes' loop, with our RTN grid per group
    w = w.clone().float()
    q = torch.zeros_like(w)
    for j in range(w.shape[1]):
        if j % group_size == 0:
            s, z = Q.weight_qparams(w[:, j:j + group_size], bits)
        qj = (torch.clamp(torch.round(w[:, j:j + 1] / s) + z, -8, 7) - z) * s
        q[:, j:j + 1] = qj
        w[:, j + 1:] -= (w[:, j:j + 1] - qj) * H[j, j + 1:] / H[j, j]
    return q

name = "model.layers.2.mlp.gate_proj"
w, H = lins[name].weight.detach(), hess[name][0]
c, s_, z = Q.rtn_quantize_weight(w, 4, GROUP)
w_rtn = (c - z[:, Q.group_index(w.shape[1], GROUP)]) * s_[:, Q.group_index(w.shape[1], GROUP)]
e = {k: Q.hessian_error(w, v, H) for k, v in [("RTN", w_rtn), ("notes' rule (H)", notes_rule(w, H)),
                                               ("GPTQ (H^-1)", Q.gptq_quantize(w, H, 4, GROUP).weight)]}
print(", ".join(f"{k}: {v:.3e}" for k, v in e.items()))
assert e["notes' rule (H)"] > e["RTN"] > e["GPTQ (H^-1)"]

# %% [markdown] id="c028"
# ## 7. One table
#
# Every variant is a `Variant(name, bits, transform)`; `compare` gives each a fresh copy of the model and
# measures the state-dict bytes, held-out bits per byte and decode time (greedy, KV cache, CPU here). The
# reference layers dequantize their weights at every call, so on a CPU they are *slower* than fp32: speed
# needs kernels that read the packed weights directly (int8/int4 weight-only matmul on a GPU).
# More rows are more entries of `VARIANTS`.

# %% id="c029"
VARIANTS = [
    Variant("fp32", 32, lambda m: m),
    Variant("bf16", 16, lambda m: m.to(torch.bfloat16)),
    Variant("RTN W8A16", 8, lambda m: Q.quantize_model(m, "rtn", bits=8, group_size=None, inplace=True)),
    Variant(f"RTN W4A16 g{GROUP}", 4, lambda m: Q.quantize_model(m, "rtn", bits=4, group_size=GROUP, inplace=True)),
    Variant(f"AWQ W4A16 g{GROUP}", 4, lambda m: Q.quantize_model(m, "awq", bits=4, group_size=GROUP, calib=calib,
                                                              n_grid=AWQ_GRID, inplace=True)),
    Variant(f"GPTQ W4A16 g{GROUP}", 4, lambda m: Q.quantize_model(m, "gptq", bits=4, group_size=GROUP, calib=calib,
                                                               inplace=True)),
    Variant(f"GPTQ W4A16 g{GROUP} act-order", 4, lambda m: Q.quantize_model(m, "gptq", bits=4, group_size=GROUP,
                                                                         calib=calib, act_order=True, inplace=True)),
    Variant("W8A8 per-token", 8, lambda m: Q.quantize_model(m, "w8a8", inplace=True)),
    Variant("SmoothQuant W8A8", 8, lambda m: Q.quantize_model(m, "smoothquant", calib=calib[:4], inplace=True)),
    Variant("LLM.int8", 8, lambda m: Q.quantize_model(m, "llm_int8", inplace=True)),
]
table = compare(model, tok, VARIANTS, texts, prompt_ids=prompt, decode_tokens=DECODE_TOKENS)
display(Markdown(table_markdown(table, note="CPU; bits/byte on held-out stdlib files; lm_head (tied) in fp32")))

# %% id="c030"
by = {r["method"]: r for r in table}
bpb = lambda k: by[k]["held-out bits/byte"]
assert bpb(f"GPTQ W4A16 g{GROUP}") < bpb(f"RTN W4A16 g{GROUP}")
assert bpb(f"AWQ W4A16 g{GROUP}") < bpb(f"RTN W4A16 g{GROUP}"), (bpb(f"AWQ W4A16 g{GROUP}"), bpb(f"RTN W4A16 g{GROUP}"))
assert by[f"RTN W4A16 g{GROUP}"]["weight bytes"] < by["RTN W8A16"]["weight bytes"] < by["bf16"]["weight bytes"]
assert abs(bpb("RTN W8A16") - bpb("fp32")) < 0.01
print(f"4-bit RTN costs {bpb(f'RTN W4A16 g{GROUP}') - bpb('fp32'):+.4f} bits/byte; GPTQ recovers "
      f"{(bpb(f'RTN W4A16 g{GROUP}') - bpb(f'GPTQ W4A16 g{GROUP}')) / (bpb(f'RTN W4A16 g{GROUP}') - bpb('fp32')):.0%} of it, "
      f"AWQ {(bpb(f'RTN W4A16 g{GROUP}') - bpb(f'AWQ W4A16 g{GROUP}')) / (bpb(f'RTN W4A16 g{GROUP}') - bpb('fp32')):.0%}")

# %% id="c031"
fig, ax = plt.subplots(figsize=(7, 4))
for r in table:
    ax.scatter(r["weight bytes"] / 1e6, r["held-out bits/byte"], s=30)
    ax.annotate(r["method"], (r["weight bytes"] / 1e6, r["held-out bits/byte"]), fontsize=7,
                xytext=(4, 3), textcoords="offset points")
ax.set_xscale("log")
ax.set_xlabel("measured weight bytes (MB, log)")
ax.set_ylabel("held-out bits per byte (lower is better)")
ax.set_title("quality vs size of the bundled model", fontsize=10)
plt.show()

# %% [markdown] id="c032"
# > **Claim checked.** The lecture notes quantize with `torch.quantization.quantize_dynamic` and
# > `prepare_qat`. `torch.quantization` is the legacy namespace kept for compatibility; the code lives in
# > `torch.ao.quantization`, and PyTorch's current quantization library is **torchao** (`quantize_`,
# > `Int8WeightOnlyConfig`, `Int4WeightOnlyConfig`, its QAT API). The cell checks the alias:

# %% id="c033"
import torch.ao.quantization as aoq
import torch.quantization as legacy

print("torch.quantization.quantize_dynamic is torch.ao.quantization.quantize_dynamic:",
      legacy.quantize_dynamic is aoq.quantize_dynamic)
assert legacy.quantize_dynamic is aoq.quantize_dynamic
try:
    import torchao  # noqa: F401
    print("torchao is installed:", torchao.__version__)
except ImportError:
    print("torchao is not installed here (pip install torchao); the course's reference code does not need it")

# %% [markdown] id="c034"
# ## Summary
#
# * Weight-only RTN with group scales: W8A16 is lossless here, W4A16 g128 costs a little; the bytes are
#   measured from the state dict (codes + fp16 scales + int8 zero points; g_idx for act-order).
# * Activations have outlier channels; per-token int8 suffers from them. LLM.int8 keeps those columns in
#   floating point (equal to bitsandbytes within one int8 step); SmoothQuant moves them into the weights
#   without changing the fp model.
# * AWQ searches a per-channel scale (never worse than RTN on its calibration loss) and folds it into the
#   previous op; GPTQ feeds each column's error forward through $H^{-1}$ and beats RTN layer by layer.
# * On a CPU the reference layers are slower than fp32: the speed of quantization comes from kernels that
#   read packed weights (a GPU's int8/int4 weight-only matmul).
