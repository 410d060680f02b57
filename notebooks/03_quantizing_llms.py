# %% [markdown] id="c002"
# # 03 · Quantizing LLMs
#
# Module 02 quantized single tensors. Here we quantize a whole language model, the course's bundled
# `tiny` Llama (4.7 M parameters, trained on Python's standard library), with every post-training method
# of the lecture notes, each built from scratch in `course_lib.quant`:
#
# 1. **weight-only** W8A16 / W4A16 round-to-nearest (RTN) with group scales, packed int4, measured bytes;
# 2. **activations**: dynamic per-token int8 (W8A8) and the **outlier channels** of the real model;
# 3. **LLM.int8()** [@dettmers2022llmint8]: outlier columns in floating point, the rest int8, checked
#    against `bitsandbytes`;
# 4. **SmoothQuant** [@xiao2023smoothquant]: move the activations' difficulty into the weights, then W8A8;
# 5. **AWQ** [@lin2024awq]: a *searched* per-channel scale folded into the previous op;
# 6. **GPTQ** [@frantar2023gptq]: second-order error feedback through the inverse Hessian;
# 7. **GGUF k-quants** (Q4_K, Q6_K) [@gerganov2023llamacpp]: super-blocks with quantized scales, and what
#    the "K" is not;
# 8. **FP8** E4M3 / E5M2 [@micikevicius2022fp8] against int8;
# 9. **quantization-aware training**: fake quantization with a straight-through estimator;
# 10. **layer-wise mixed precision** from a sensitivity scan, under a byte budget;
# 11. **fast weight-only kernels**: int8 / int4 matmuls that read the packed weights;
# 12. **bitsandbytes** int8 and NF4 (double quantization) through transformers, and the CPU paths they take;
# 13. **one table**: method, bits, measured weight bytes, held-out bits per byte, decode ms/token, and a plot.
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
DECODE_TOKENS = 8 if QUICK else 64         # tokens timed for decode ms/token
GROUP = 128                                # group size of the 4-bit formats
KQ_ROWS = 64 if QUICK else 1024            # rows of the random 1024-wide tensor for the k-quant comparison
QAT_STEPS = 12 if QUICK else 200           # QAT fine-tuning steps (4 x 128 tokens each)
SCAN_BITS = (4, 3) if QUICK else (8, 4, 3)  # bit widths of the sensitivity scan
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
from course_lib.quant.transform import to_fast_weight_only, to_fp8, to_gguf, to_mixed
from course_lib.quant_eval import (Variant, calibration_batches, compare, heldout_texts,
                                   table_markdown)

# On AVX512-BF16 CPUs bitsandbytes tries an optional downloadable 4-bit kernel (the `kernels` package) and logs a
# warning when it is missing; it then uses the fused kernel of its own library (section 12).
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
# 6.7 B parameters on [@dettmers2022llmint8]). The `down_proj` inputs (after SiLU · up) are large
# everywhere, not in a few channels. Per-token int8 of the activations, on real inputs: the error of W8A8
# against W8A16 on the norm-fed layer with the largest outlier ratio.

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
# Dettmers et al. [@dettmers2022llmint8] split the input features: the columns where some token has |x| ≥ 6 are
# multiplied in floating point, the rest in int8 (per-token scales for x, per-row scales for W). The weights are
# stored once, in int8. Our reference (`LLMInt8Linear`) and `bitsandbytes.nn.Linear8bitLt` on the same real inputs:

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
# For each input channel j, $s_j = \max|X_j|^{\alpha} / \max|W_{:,j}|^{1-\alpha}$ [@xiao2023smoothquant]; dividing the
# activations by s (folded into the RMSNorm gain, or the previous linear's rows) and multiplying the weight columns by
# s leaves the product unchanged. First the check that matters: the smoothed model, **before** quantization, computes
# the same function.

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
# AWQ [@lin2024awq] protects the weight columns that meet large activations by scaling them up before
# rounding:
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
# yet quantized, $F = \{j, j+1, \dots\}$: $w_k \mathrel{-}= \frac{w_j - q_j}{[H_F^{-1}]_{jj}}[H_F^{-1}]_{jk}$,
# where $H_F^{-1}$ is the inverse of $H$ restricted to those columns, not the full inverse's entries (after
# the first column they differ: quantizing a column removes it from the problem). Recomputing an inverse per
# column would cost $O(d^4)$; the upper Cholesky factor $U$ of $H^{-1}$ ($H^{-1} = U^\top U$) holds every
# step's row at once: row $j$ of $U$ is row $j$ of $H_F^{-1}$ divided by $\sqrt{[H_F^{-1}]_{jj}}$, so
# $U_{jk}/U_{jj} = [H_F^{-1}]_{jk}/[H_F^{-1}]_{jj}$, the ratio the update needs [@frantar2023gptq]. The next
# cell checks this on
# this layer's Hessian. Damping, lazy batches, groups, act-order and dead columns are in
# `course_lib/quant/gptq.py`. The objective, layer by layer, on calibration and held-out inputs:

# %% id="c025"
lins = Q.named_linears(model)
hess = Q.input_hessians(model, calib, list(lins))
# The identity above, on the first layer's (damped) Hessian, in float64: U's row ratios are those of the
# inverse restricted to the remaining columns; the full inverse's are not (after column 0).
_H = hess[next(iter(lins))][0].double()
_H = _H + 0.01 * _H.diagonal().mean() * torch.eye(_H.shape[0], dtype=_H.dtype)
_U = torch.linalg.cholesky(torch.linalg.inv(_H), upper=True)
_full = torch.linalg.inv(_H)
for _j in (0, 1, _H.shape[0] // 2):
    _HF = torch.linalg.inv(_H[_j:, _j:])
    _ok = torch.allclose(_U[_j, _j:] / _U[_j, _j], _HF[0] / _HF[0, 0], rtol=1e-6, atol=1e-9)
    _dev = float(((_full[_j, _j:] / _full[_j, _j]) - _HF[0] / _HF[0, 0]).abs().max())
    assert _ok, f"column {_j}: U's row ratio differs from the restricted inverse's"
    print(f"column {_j:3d}: U[j,k]/U[j,j] = [H_F^-1]_jk/[H_F^-1]_jj: {_ok}; the full inverse's ratio is off by "
          f"up to {_dev:.3g}")
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

# %% [markdown] id="c027a"
# ## 7. GGUF k-quants: super-blocks with quantized scales
#
# Q4_0 stores one fp16 scale per 32 weights (module 02 reads it back from a block's bytes). The k-quants of
# llama.cpp [@gerganov2023llamacpp] group 256 weights into a
# *super-block* and quantize the per-sub-block scales themselves: Q4_K keeps, for each of 8 sub-blocks of
# 32, a 6-bit scale and a 6-bit minimum (an affine code, `x ~ d*sc*q - dmin*m`) plus two fp16 numbers for
# the whole super-block: 144 bytes per 256 weights, the same 4.5 bits per weight as Q4_0. Q6_K uses
# 16 sub-blocks of 16 with int8 scales and 6-bit codes: 210 bytes, 6.5625 bits per weight. The encoder
# searches each sub-block's scale (and min) for the least weighted squared error instead of taking the absmax.

# %% id="c027b"
from course_lib.quant import gguf_bits_per_weight, gguf_dequantize, gguf_quantize, sqnr_db
from course_lib.quant.gguf import BLOCK_BYTES

w = torch.randn(KQ_ROWS, 1024, generator=torch.Generator().manual_seed(0))
kq_rows = []
for fmt in ["q4_0", "q4_k", "q6_k", "q8_0"]:
    data = gguf_quantize(w, fmt)
    kq_rows.append({"format": fmt.upper(), "bytes/block": BLOCK_BYTES[fmt], "bits/weight": gguf_bits_per_weight(fmt),
                    "bytes": data.numel(), "SQNR dB": round(sqnr_db(w, gguf_dequantize(data, fmt)), 2)})
for r in kq_rows:
    print(r)
kq = {r["format"]: r for r in kq_rows}
assert BLOCK_BYTES["q4_k"] == 144 and BLOCK_BYTES["q6_k"] == 210
assert kq["Q4_K"]["bytes"] == kq["Q4_0"]["bytes"]              # same bytes ...
assert kq["Q4_K"]["SQNR dB"] > kq["Q4_0"]["SQNR dB"] + 0.5     # ... less error: searched scales and mins
assert kq["Q6_K"]["SQNR dB"] > kq["Q4_K"]["SQNR dB"] + 9        # two more bits: ~6 dB each, minus scale overhead

# %% [markdown] id="c027c"
# > **Claim checked: "Q4_K_M: 4-bit quantization with K-means clustering."** No clustering happens in
# > llama.cpp's k-quants. The K names the super-block family (`QK_K = 256` values per super-block); every
# > value is still an affine integer code with a scale (and a min) found by a small grid search per
# > sub-block. The `_S` / `_M` / `_L` suffix belongs to a *file type*, a per-tensor mix: `Q4_K_M` stores
# > most tensors in Q4_K and some sensitive ones (parts of `attn_v` and `ffn_down`) in Q6_K. The cell below
# > checks both halves: every decoded Q4_K sub-block lies exactly on an evenly spaced grid of 16 levels
# > (a k-means codebook would not be evenly spaced), and our decoder agrees bit for bit with the `gguf`
# > package's.

# %% id="c027d"
import numpy as np

from course_lib.quant import describe_block

info = describe_block(gguf_quantize(w[0, :256], "q4_k"), "q4_k")
vals = np.array(info["values"], dtype=np.float32).reshape(8, 32)
codes = np.array(info["codes"]).reshape(8, 32)
for j in range(8):
    step = np.float32(info["d"] * info["scales"][j])
    offset = np.float32(info["dmin"] * info["mins"][j])
    assert np.allclose(vals[j], step * codes[j] - offset, atol=1e-6)   # an evenly spaced grid: affine, not k-means
try:
    import gguf
    ref = gguf.quants.dequantize(gguf_quantize(w, "q4_k").numpy(), gguf.GGMLQuantizationType.Q4_K)
    assert np.array_equal(ref, gguf_dequantize(gguf_quantize(w, "q4_k"), "q4_k").numpy())
    print("decode bit-exact against the gguf package's Q4_K reference")
except ImportError:
    print("gguf package not installed: the bit-exact check is in tests/test_quant_gguf_kquants.py")

# %% [markdown] id="c027e"
# ## 8. FP8: a logarithmic grid
#
# FP8 E4M3 [@micikevicius2022fp8] has 3 mantissa bits, so the step between neighbours is 2^-3 of the power of two
# below the value, wherever the value sits: relative to a value 1.m x 2^e it is 2^-3 / 1.m, 12.5% just above a power
# of two (1.m = 1) down to 6.7% just below the next (1.m = 1.875, the largest mantissa). Rounding to the nearest
# costs at most half a step, and the worst case is a value exactly halfway between two neighbours a and a + s:
# its error s/2, relative to the value itself, is (s/2) / (a + s/2). With s = 2^-3 x 2^e:
#
# * just above a power of two (a = 2^e): 2^-4 / (1 + 2^-4) = **1/17, about 5.9%**, the largest relative error of
#   any normal E4M3 value (the unit roundoff u / (1 + u) with u = 2^-4);
# * just below the next (a = 1.875 x 2^e): 2^-4 / (1.875 + 2^-4) = **1/31, about 3.2%**.
#
# So the worst rounding error is 3.2% to 5.9% of the value, depending on where in its binade the value sits;
# subnormals (below 2^-6) have a fixed absolute step and larger relative errors. (Halving the steps instead,
# 12.5% / 2 and 6.7% / 2, gives 6.25% and 3.3%: the errors relative to the lower neighbour, not to the
# value.) The cell below computes the spacing of every normal E4M3 value and then rounds a dense sweep of
# values through PyTorch's float8 cast. int8's step is fixed in absolute terms. On a bell-shaped tensor int8 wins (more levels where the values are); with heavy
# tails and one scale per tensor FP8 wins, since its outliers do not stretch the step of the small values. E5M2 trades
# a mantissa bit for range: about 6 dB worse.

# %% id="c027f"
import math

from course_lib.quant import fp8_error_rows

e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
normal = e4m3[(e4m3 >= 2.0 ** -6) & e4m3.isfinite()].unique()           # positive normal values, sorted
gap_rel = (normal[1:] - normal[:-1]) / normal[:-1]                       # step to the next value, per value
mant = normal[:-1] / 2.0 ** normal[:-1].log2().floor()                   # 1.m of each value
assert torch.allclose(gap_rel, 2.0 ** -3 / mant)                         # step = 2^-3 / 1.m
assert abs(gap_rel.max() - 0.125) < 1e-9 and abs(gap_rel.min() - 0.125 / 1.875) < 1e-9
mid = (normal[1:] + normal[:-1]) / 2                                     # the halfway points
worst = (normal[1:] - normal[:-1]) / 2 / mid                             # their error, relative to themselves
assert abs(worst.max() - 1 / 17) < 1e-7 and abs(worst.min() - 1 / 31) < 1e-7
sweep = torch.logspace(-6, math.log2(448), 200_001, base=2.0, dtype=torch.float64)   # the normal range
rel = ((sweep.to(torch.float8_e4m3fn).double() - sweep).abs() / sweep)
assert rel.max() <= 1 / 17 + 1e-12 and rel.max() > 1 / 17 - 1e-4      # the cast's worst case is 1/17
print(f"E4M3: {normal.numel()} positive normal values up to {normal.max():.0f}; step to the next value "
      f"{gap_rel.min():.2%} to {gap_rel.max():.2%} of the value; worst rounding error, relative to the value: "
      f"{worst.min():.2%} (just below a power of two) to {worst.max():.2%} (just above); measured on "
      f"{sweep.numel():,} values through torch's float8 cast: at most {rel.max():.2%}")

g = torch.Generator().manual_seed(1)
z = torch.randn(3, 256, 512, generator=g)
tensors = {"gaussian": z[0], "heavy-tailed (Student t, 2 dof)": z[0] / (z[1] ** 2 / 2 + z[2] ** 2 / 2).sqrt()}
fp8_db = {}
for name, x in tensors.items():
    for r in fp8_error_rows(x):
        fp8_db[(name, r["format"], r["granularity"])] = r["sqnr_db"]
        print(f"{name:34s} {r['format']:9s} per {r['granularity']:6s}  SQNR {r['sqnr_db']:5.1f} dB")
assert fp8_db[("gaussian", "int8", "row")] > fp8_db[("gaussian", "fp8 e4m3", "row")]
heavy = "heavy-tailed (Student t, 2 dof)"
assert fp8_db[(heavy, "fp8 e4m3", "tensor")] > fp8_db[(heavy, "int8", "tensor")] + 10
assert 4 < fp8_db[("gaussian", "fp8 e4m3", "row")] - fp8_db[("gaussian", "fp8 e5m2", "row")] < 8

# %% [markdown] id="c027g"
# ## 9. Quantization-aware training
#
# PTQ rounds the trained weights once. QAT rounds them in every forward pass and lets the loss move the
# float weights so that their *rounded* values work; the rounding's zero gradient is replaced by the
# identity (the straight-through estimator), as in the simulated quantization of [@jacob2018quantization].
# Here: int3 with one scale per row, the tiny model, `QAT_STEPS` steps of
# 4 x 128 tokens (12 in quick mode, 200 in full) distilling from the float model, held-out bits per byte before
# and after. (In production:
# torchao's `torchao.quantization.qat`; `torch.ao.quantization` is the deprecated CNN-era workflow
# [@pytorch2026quantization].)

# %% id="c027h"
from course_lib.quant_eval import qat_vs_ptq

qat = qat_vs_ptq(bits=3, group_size=None, steps=QAT_STEPS, lr=1e-4, texts=texts, progress=False)
print(f"bits per byte: fp32 {qat['fp32']:.4f}   PTQ int3 {qat['ptq']:.4f}   QAT int3 {qat['qat']:.4f}   "
      f"-> QAT closes {qat['recovered']:.0%} of the PTQ gap")
assert qat["ptq"] > qat["fp32"] and qat["qat"] < qat["ptq"]

# %% [markdown] id="c027i"
# ## 10. Which layers can take fewer bits? A sensitivity scan, then a bit allocation
#
# Quantize one decoder layer at a time (its 7 linears, group RTN, groups of 16), measure held-out bits per
# byte, put the weights back. Then choose {8, 4, 3} bits per layer to minimize the summed increase under a
# byte budget: a small knapsack, solved exactly (and tested against brute force).

# %% id="c027j"
from course_lib.quant import allocate_bits, allocation_cost, layer_groups
from course_lib.quant_eval import heldout_bpb, sensitivity_bpb

scan = sensitivity_bpb(model, tok, texts[:1], bits=SCAN_BITS, progress=False)
layers = list(scan["delta"])
fig, ax = plt.subplots(figsize=(6, 3))
for b, mk in [(3, "o-"), (4, "s-"), (8, "^-")][: len(next(iter(scan["delta"].values())))]:
    ax.plot(range(len(layers)), [scan["delta"][l][b] for l in layers], mk, label=f"int{b}")
ax.set_xlabel("decoder layer quantized alone")
ax.set_ylabel("held-out bits/byte increase")
ax.legend()
plt.show()
size = scan["size"]
budget = sum(size.values()) * 3.5 / 8                        # 3.5 bits per weight on average
alloc = allocate_bits(scan["delta"], size, budget)
mix_bytes, predicted = allocation_cost(alloc, scan["delta"], size)
naive = {g: (4 if k % 2 else 3) for k, g in enumerate(layers)}  # the same bytes, ignoring the scan
print("allocation:", alloc, f" predicted increase {predicted:.4f} vs alternating 3/4 bits "
      f"{allocation_cost(naive, scan['delta'], size)[1]:.4f}")
assert mix_bytes <= budget and predicted <= allocation_cost(naive, scan["delta"], size)[1] + 1e-12
mixed_model = to_mixed(load("tiny", device="cpu", verbose=False)[0], alloc, layer_groups(model))
naive_model = to_mixed(load("tiny", device="cpu", verbose=False)[0], naive, layer_groups(model))
bpb_mix, bpb_naive = heldout_bpb(mixed_model, tok, texts[:1]), heldout_bpb(naive_model, tok, texts[:1])
print(f"measured: allocated {bpb_mix:.4f}, alternating {bpb_naive:.4f} bits/byte (base {scan['base']:.4f})")
assert bpb_mix <= bpb_naive + 0.005                          # the additive model's choice holds up when measured

# %% [markdown] id="c027k"
# ## 11. Fast weight-only decode
#
# At batch 1, decode reads every weight once per token: fewer weight bytes should mean less time, but only
# if the kernel dequantizes inside the matmul. torch ships such kernels (`torch._weight_int8pack_mm`,
# `torch._weight_int4pack_mm` and its CPU twin). One layer of SmolLM2-1.7B's GEMVs (hidden 2048,
# intermediate 8192) on this machine; gpt-fast reports 1.48x (int8) and 1.88x (int4) over bf16 for a whole
# Llama-2-7B on an A100.

# %% id="c027l"
from course_lib.env import device as best_device
from course_lib.quant import GPT_FAST_A100, decode_gemv_benchmark

dev = best_device()
h, i = (512, 2048) if QUICK and dev.type == "cpu" else (2048, 8192)
fast_rows = decode_gemv_benchmark(h, i, repeats=3 if QUICK else 9, device=dev)
for r in fast_rows:
    print(r)
speed = {r["weights"].split()[0]: r["speed-up vs 16-bit"] for r in fast_rows}
base_dtype = fast_rows[0]["weights"]                            # bf16, or fp16 on a GPU without bf16 (a T4)
print(f"on {dev.type}: int8 {speed.get('int8')}x, int4 {speed.get('int4')}x vs {base_dtype}; "
      f"gpt-fast A100: int8 {GPT_FAST_A100['int8']}x, int4 {GPT_FAST_A100['int4']}x")
mb = {r["weights"].split()[0]: r["MB/layer"] for r in fast_rows}
assert mb["int8"] < 0.52 * mb[base_dtype]                     # the bytes halve; the time is what we measured

# %% [markdown] id="c027m"
# ## 12. bitsandbytes int8 and NF4 (double quantization)
#
# `BitsAndBytesConfig(load_in_8bit=True)` (LLM.int8 [@dettmers2022llmint8]) and `load_in_4bit=True,
# bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True` (QLoRA's NF4 and double quantization
# [@dettmers2023qlora]; module 02 takes both apart). Where transformers refuses (it asks for `accelerate`, even on a
# CPU), the same bitsandbytes modules are put in by hand; the route taken is printed. Their rows join the table below.
#
# **What bitsandbytes (0.50) computes on a CPU**, read from its code:
#
# * **int8** (`Linear8bitLt`, inference). The weight is stored as int8 rows, one absmax scale per row. At
#   each call, on an fp16 copy of the input, every column holding a value of magnitude at least the
#   threshold (6) is set aside; the rest is quantized per token to int8 and multiplied by the int8 weight
#   into int32 (`torch._int_mm` on a CPU with AVX-512, otherwise an fp32 matmul of the integer values), then
#   rescaled by both absmaxes. The set-aside columns, in the input's own precision, are multiplied by the
#   *dequantized* int8 weight columns (the float weight is gone) and added. One path on every CPU.
# * **NF4** (`Linear4bit`), two paths. *Dequantize*: each call decodes the double-quantized block scales,
#   dequantizes the whole weight to the compute dtype (fp32 here) and runs an ordinary matmul. *Packed*:
#   where a module's flag `support_avx512bf16_for_cpu` is set (bitsandbytes sets it on CPUs with
#   AVX512-BF16, the only ones for which it registers its fused 4-bit kernel), the first forward in eval
#   mode without gradients rewrites the weight in place (codes interleaved in blocks of 32 output rows, the
#   double quantization undone, block scales kept in bf16); from then on every call runs the fused kernel,
#   in bf16.
# * That rewrite needs the output size N to be a multiple of 32 and the input size K a multiple of the
#   64-weight quantization block. The bundled model's MLP is 688 wide (688 = 21 × 32 + 16 = 10 × 64 + 48),
#   so `gate_proj`/`up_proj` (N = 688) and `down_proj` (K = 688) cannot take it: left to itself, bitsandbytes
#   crashes on them at the first forward on an AVX512-BF16 CPU. The course decides every layer's path once,
#   when the model is loaded (`course_lib.quant_eval.route_bnb_cpu`): `"auto"` keeps bitsandbytes' choice
#   and sends the layers the rewrite cannot take to the dequantize path (`"dequantize"` forces it
#   everywhere; `"packed"` is refused where it cannot run).
# * **The bytes** in the rows are the state dict's: bitsandbytes' storage format (4-bit codes, an 8-bit
#   scale per block of 64, those scales' own fp32 scales and code table, a little metadata). Its
#   `state_dict()` turns a rewritten layer back into that format before it is read, so the packed layout
#   never shows there; what the packed path holds in memory is measured in the next cell.

# %% id="c027n"
from course_lib.quant_eval import bnb_rows

bnb = None
try:
    bnb = bnb_rows(texts=texts)
    for r in bnb:
        print(f"{r['method']:34s} {r['bytes'] / 1e6:6.2f} MB  {r['bpb']:.4f} bits/byte  ({r['route']}) "
              f"CPU paths: {r['paths'] or '-'}")
    assert bnb[1]["bytes"] < 0.4 * bnb[0]["bytes"] and abs(bnb[1]["bpb"] - bnb[0]["bpb"]) < 0.01
    assert bnb[2]["bytes"] < 0.75 * bnb[1]["bytes"]
except ImportError as e:
    print("bitsandbytes is not installed here:", e)

# %% [markdown] id="c027o"
# Which path each NF4 layer takes on **this** machine, and why (the routing's answer, one line per kind of
# layer: every decoder layer has the same shapes), then what one forward does to the bytes held in memory.

# %% id="c027p"
from course_lib.quant.linear import state_dict_bytes
from course_lib.quant_eval import bnb_int8_cpu_matmul, bnb_packed_cpu_kernel, bnb_resident_bytes, load_bnb

if bnb is not None:
    import bitsandbytes
    import bitsandbytes.functional as bnbF

    nf4, info = load_bnb("nf4")
    print(f"bitsandbytes {bitsandbytes.__version__}; fused 4-bit CPU kernel registered here (AVX512-BF16): "
          f"{bnb_packed_cpu_kernel()}; int8 matmul here: {bnb_int8_cpu_matmul()}")
    kinds = {}
    for name, r in info["cpu_paths"].items():
        kinds.setdefault(name.rsplit(".", 1)[1], (nf4.get_submodule(name), r))
    for kind, (layer, r) in kinds.items():
        print(f"  {kind:9s} N={layer.out_features:4d} K={layer.in_features:4d}  {r.path:10s}  {r.why}")
    # bitsandbytes' rewrite itself (private, plain PyTorch, so it runs on any CPU) on copies of the 688-wide layers
    for kind in ("up_proj", "down_proj"):
        w = kinds[kind][0].weight
        try:
            bnbF._convert_weight_packed_for_cpu(w.data.clone(), copy.deepcopy(w.quant_state))
            failed = None
        except (AssertionError, RuntimeError) as e:
            failed = f"{type(e).__name__}: {e}"
        print(f"bitsandbytes' packed rewrite of {kind}: {failed}")
        assert failed, kind
    paths = [r.path for r in info["cpu_paths"].values()]
    mlp = [r.path for n, r in info["cpu_paths"].items() if ".mlp." in n]
    assert set(mlp) == {"dequantize"}                     # the 688-wide layers, on every CPU
    assert paths.count("packed") == (4 * nf4.config.num_hidden_layers if bnb_packed_cpu_kernel() else 0)

    packed = [nf4.get_submodule(n) for n, r in info["cpu_paths"].items() if r.path == "packed"]
    n_weights = sum(m.out_features * m.in_features for m in packed)
    held = lambda: bnb_resident_bytes(torch.nn.ModuleList(packed))
    # the state dict's bytes, and those of its per-layer metadata entry (quant_state.bitsandbytes__nf4: JSON text)
    sd_bytes = lambda: (state_dict_bytes(nf4), sum(v.numel() for k, v in nf4.state_dict().items()
                                                   if k.endswith("bitsandbytes__nf4")))
    before, sd_before, all_before = held(), sd_bytes(), bnb_resident_bytes(nf4)
    with torch.no_grad():
        nf4(held_ids[0])                                  # the first forward: packed layers are rewritten
    after, all_after = held(), bnb_resident_bytes(nf4)
    if packed:
        assert all(m.weight.quant_state.packing_format_for_cpu for m in packed)
        assert all(m.weight.quant_state.absmax.dtype == torch.bfloat16 for m in packed)   # scales now bf16
        print(f"{len(packed)} packed layers hold {before * 8 / n_weights:.3f} bits/weight in bitsandbytes' format, "
              f"{after * 8 / n_weights:.3f} rewritten ({after - before:+,} bytes)")
        sd_after = sd_bytes()                             # state_dict() turns them back into the stored format
        assert not any(m.weight.quant_state.packing_format_for_cpu for m in packed)
        assert sd_after[0] - sd_after[1] == sd_before[0] - sd_before[1]     # the tensors: the same bytes
        print(f"state-dict bytes: {sd_before[0]:,} before the forward, {sd_after[0]:,} after: the tensors take the "
              f"same bytes; the JSON metadata went from {sd_before[1]:,} to {sd_after[1]:,} bytes (bitsandbytes "
              "re-computes the scales' offset when it converts back)")
    else:
        print(f"no layer takes the packed path on this CPU: the NF4 layers hold {all_before:,} bytes in memory "
              f"before the forward and {all_after:,} after")
        assert all_after == all_before

# %% [markdown] id="c028"
# ## 13. One table
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
    Variant("W8A8 per-token", 8, lambda m: Q.quantize_model(m, "w8a8", inplace=True)),
    Variant("SmoothQuant W8A8", 8, lambda m: Q.quantize_model(m, "smoothquant", calib=calib[:4], inplace=True)),
    Variant("LLM.int8", 8, lambda m: Q.quantize_model(m, "llm_int8", inplace=True)),
    # sections 7-11
    Variant("GGUF Q4_K", 4.5, lambda m: to_gguf(m, "q4_k")),
    Variant("FP8 E4M3 W8A8", 8, lambda m: to_fp8(m, "e4m3", "row")),
    Variant("int8 weight-only, fused kernel", 8, lambda m: to_fast_weight_only(m, 8)),
    Variant("QAT int3 per row", 3, lambda m: qat["model"]),
    Variant("mixed {8,4,3} from the scan", sum(size[g] * b for g, b in alloc.items()) / sum(size.values()),
            lambda m: mixed_model),
]
if not QUICK:   # rows left out of the quick run (CPU time): act-order, the Q4_K_M mix, the fused int4 kernel
    VARIANTS += [
        Variant(f"GPTQ W4A16 g{GROUP} act-order", 4, lambda m: Q.quantize_model(m, "gptq", bits=4, group_size=GROUP,
                                                                             calib=calib, act_order=True, inplace=True)),
        Variant("GGUF Q4_K_M-style mix (Q6_K v_proj, down_proj)", 5.0,
                lambda m: to_gguf(m, "q4_k", mix={"v_proj": "q6_k", "down_proj": "q6_k"})),
        Variant(f"int4 weight-only g{GROUP}, fused kernel", 4, lambda m: to_fast_weight_only(m, 4, GROUP)),
    ]
table = compare(model, tok, VARIANTS, texts, prompt_ids=prompt, decode_tokens=DECODE_TOKENS)
# section 12's bitsandbytes models (transformers' model class: no decode timing through the course's loop)
for r in bnb[1:] if bnb else []:
    table.append({"method": r["method"], "bits": 8 if "int8" in r["method"] else 4, "weight bytes": r["bytes"],
                  "held-out bits/byte": r["bpb"], "decode ms/token": None, "quantize s": None})
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
# > `torch.ao.quantization`, itself deprecated: PyTorch's quantization work has moved to **torchao**
# > (`quantize_`, `Int8WeightOnlyConfig`, `Int4WeightOnlyConfig`, its QAT API), and PyTorch's documentation
# > asks users to migrate there before `torch.ao.quantization` is removed [@pytorch2026quantization]. The
# > cell checks the alias:

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
#
# ## Further reading
#
# Used in this notebook:
#
# * [@dettmers2022llmint8]: outlier features and the mixed-precision int8 matmul of section 3.
# * [@xiao2023smoothquant]: the smoothing scale and W8A8 of section 4.
# * [@lin2024awq]: activation-aware scales, searched, for weight-only INT4 (section 5).
# * [@frantar2023gptq]: GPTQ's column-by-column error feedback and its Cholesky form (section 6).
# * [@gerganov2023llamacpp; @ggml2023gguf]: the k-quant formats of section 7.
# * [@micikevicius2022fp8]: E4M3 and E5M2 (section 8).
# * [@jacob2018quantization]: quantization-aware training with simulated quantization (section 9).
# * [@dettmers2023qlora]: NF4 and double quantization as bitsandbytes implements them (section 12).
#
# To go further:
#
# * [@frantar2022optimal]: Optimal Brain Compression, the exact per-weight method GPTQ approximates at scale.
# * [@gholami2021survey]: a survey of quantization for neural network inference.
