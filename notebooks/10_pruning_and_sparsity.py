# %% [markdown] id="c002"
# # Module 10 · Pruning, sparsity and mixture of experts
#
# A trained model has many weights that matter little. **Pruning** removes them: single weights
# (unstructured), fixed patterns (2:4, which NVIDIA's sparse tensor cores run), or whole heads, neurons and
# layers (structured, which gives a smaller dense model). **Mixture of experts** goes the other way: many
# more weights, but each token uses only a few of them. **Sparse attention** lets each token look at a few
# other tokens instead of all of them.
#
# Everything here is measured on the course's `tiny` model (Module 00) with `course_lib.sparsity`:
#
# 1. magnitude pruning, ours and `torch.nn.utils.prune`, global and per layer;
# 2. Wanda (weight x activation) and the 2:4 pattern; what sparse storage really saves;
# 3. structured pruning that shrinks the model, with importance by weight norm and by a Taylor score;
# 4. prune -> fine-tune: held-out bits per byte against sparsity for three methods, and the notes'
#    "30-90% parameter reduction" claim checked on this model;
# 5. mixture of experts: top-k routing, load balancing, capacity and a batched dispatch;
# 6. sparse attention patterns (sliding window, global tokens, random blocks) imposed on the trained model.
#
# Every number below is computed in this notebook; every claim is an `assert`, except timings: those depend
# on the machine and on what else it is doing, so each is measured interleaved and shown as a claim with this
# run's numbers and their spread (it says so when it did not hold on a run).

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
HELD_FILES = 1 if QUICK else 10          # held-out files scored (bits per byte)
HELD_CHARS = 1500 if QUICK else 20000    # characters kept per held-out file
TRAIN_FILES = 10 if QUICK else 200       # training-split files for fine-tuning and calibration
CALIB = 4 if QUICK else 32               # calibration windows (Wanda norms, Taylor scores)
SPARSITIES = (0.3, 0.6) if QUICK else (0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)   # one-shot magnitude table
SWEEP = (0.5,) if QUICK else SPARSITIES  # targets of the prune -> fine-tune sweep
FT_STEPS = 2 if QUICK else 100           # fine-tuning steps per round
ROUNDS = 1 if QUICK else 3               # prune -> fine-tune rounds to reach a sparsity
FT_BATCH, FT_SEQ = (4, 64) if QUICK else (8, 256)
MOE_STEPS = 40 if QUICK else 400         # steps of the small MoE training run
WINDOWS = (16, 64) if QUICK else (8, 16, 32, 64, 128, 256)

# %% id="c004"
import copy
import time

import matplotlib.pyplot as plt
import torch

from course_lib import sparsity as S
from course_lib.distill import token_stream
from course_lib.models import load
from course_lib.models.corpus import load_split
from course_lib.perf.claims import timing_claim
from course_lib.perf.quality import bits_per_byte
from course_lib.perf.timing import compare

torch.manual_seed(0)
device = course_lib.env.device()
model, tok = load("tiny", device=device)
tok.model_max_length = 10**9
cfg = model.config
heldout = [t[:HELD_CHARS] for t in load_split("heldout", max_files=HELD_FILES)]
stream = token_stream(tok, load_split("train", max_files=TRAIN_FILES))
g = torch.Generator(device="cpu").manual_seed(0)
starts = torch.randint(0, stream.numel() - 129, (CALIB,), generator=g, device="cpu")
calib = torch.stack([stream[i:i + 129] for i in starts.tolist()]).to(device)      # [CALIB, 129]
dense_bpb = bits_per_byte(model, tok, heldout, progress=False)
prunable = S.projection_params(cfg)
print(f"tiny: {model.num_parameters() / 1e6:.2f}M parameters, {prunable / 1e6:.2f}M of them in the decoder's "
      f"projections (what we prune); held-out: {sum(map(len, heldout))} characters, {dense_bpb:.3f} bits/byte")

# %% [markdown] id="c005"
# ## 1. Magnitude pruning
#
# The simplest rule: the smallest weights matter least, so set them to zero. *Global* pruning ranks all
# projection weights together (layers whose weights are small lose more); *per layer* removes the same
# share everywhere. A mask is held on the model as a parametrization (`weight * mask`), so a later
# fine-tuning step cannot bring a pruned weight back.
#
# PyTorch's own route is `torch.nn.utils.prune`. Ours must give the same masks:

# %% id="c006"
for scope in ("global", "layer"):
    for amount in (0.5,):
        ours, theirs = S.magnitude_masks(model, amount, scope), S.torch_prune_masks(model, amount, scope)
        assert all(torch.equal(ours[n], theirs[n]) for n in ours)
print("magnitude_masks == torch.nn.utils.prune masks (global and per layer, 50%)")

# %% [markdown] id="c007"
# > **Claim checked.** A snippet met in course notes prunes with `prune.l1_unstructured(module.weight,
# > name="weight", amount=0.3)`. The first argument must be the **module** (`prune.l1_unstructured(module,
# > name="weight", amount=0.3)`): the function adds `weight_orig` and `weight_mask` to it and a hook that
# > recomputes `weight`. Given the tensor, it fails:

# %% id="c008"
import torch.nn.utils.prune as prune

lin = copy.deepcopy(model.model.layers[0].mlp.up_proj)
try:
    prune.l1_unstructured(lin.weight, name="weight", amount=0.3)
    raise AssertionError("the notes' call should not work")
except (AttributeError, TypeError) as e:
    print(f"prune.l1_unstructured(module.weight, ...) -> {type(e).__name__}: {e}")
prune.l1_unstructured(lin, name="weight", amount=0.3)
print(f"prune.l1_unstructured(module, ...) -> {float((lin.weight == 0).float().mean()):.3f} of the weights zero")
assert abs(float((lin.weight == 0).float().mean()) - 0.3) < 1e-3

# %% [markdown] id="c009"
# Global against per-layer, with no fine-tuning at all:

# %% id="c010"
one_shot = {}
for scope in ("global", "layer"):
    for s in SPARSITIES:
        m = S.magnitude_prune(copy.deepcopy(model), s, scope)
        one_shot[(scope, s)] = bits_per_byte(m, tok, heldout, progress=False)
print(f"{'sparsity':>8s} {'global':>8s} {'per layer':>10s}   (bits/byte; dense {dense_bpb:.3f})")
for s in SPARSITIES:
    print(f"{s:8.0%} {one_shot[('global', s)]:8.3f} {one_shot[('layer', s)]:10.3f}")
assert all(one_shot[("global", s)] >= dense_bpb - 1e-3 for s in SPARSITIES)
assert one_shot[("global", SPARSITIES[-1])] > one_shot[("global", SPARSITIES[0])]
per_layer = S.sparsity(S.magnitude_prune(copy.deepcopy(model), SPARSITIES[-1], "global"))["per_layer"]
lo, hi = min(per_layer, key=per_layer.get), max(per_layer, key=per_layer.get)
print(f"global {SPARSITIES[-1]:.0%}: least pruned {lo} ({per_layer[lo]:.0%}), most pruned {hi} ({per_layer[hi]:.0%})")

# %% [markdown] id="c011"
# ## 2. Wanda and the 2:4 pattern
#
# Magnitude ignores what a weight multiplies. **Wanda** [@sun2024simple] scores weight *W_ij* by
# |W_ij| · ‖X_j‖₂, the norm of its input feature over a few calibration tokens, and compares weights within
# each output row. It needs one forward pass, no gradient and no weight update.
#
# How many weights a row loses: **int(s · in)**, truncated, as the authors' code does (`prune_wanda` in
# locuslab/wanda sorts each row's scores and prunes the first `int(W_metric.shape[1] * sparsity_ratio)`).
# `torch.nn.utils.prune`, and our magnitude pruning with it, rounds instead; the two counts differ whenever
# s · in rounds up (as for a `down_proj` row at 35%, below).
#
# **2:4** keeps exactly 2 of every 4 consecutive weights of a row. NVIDIA's sparse tensor cores (Ampere and
# later) store the 2 values plus 2-bit positions and run the matmul at up to twice the dense rate
# [@mishra2021accelerating].

# %% id="c012"
x_calib = calib[:, :-1]
norms = S.input_norms(model, x_calib)
name = "model.layers.0.mlp.down_proj"
w = model.get_submodule(name).weight
m_mag = S.magnitude_masks(model, 0.5, "layer")[name]
m_wanda = S.wanda_mask(w, norms[name], sparsity=0.5)
print(f"{name}: input norms range {norms[name].min():.2f} .. {norms[name].max():.2f}; Wanda and magnitude "
      f"(50%) disagree on {(m_mag ^ m_wanda).float().mean():.1%} of the weights")
n_in = w.shape[1]
per_row = (~S.wanda_mask(w, norms[name], sparsity=0.35)).sum(dim=1)     # weights removed in each row
assert (per_row == int(0.35 * n_in)).all() and int(0.35 * n_in) != round(0.35 * n_in)   # truncated, not rounded
print(f"Wanda at 35% removes {int(per_row[0])} of {n_in} weights in every row: int(0.35 * {n_in}) = "
      f"{int(0.35 * n_in)}, where round would give {round(0.35 * n_in)}")
wanda24 = S.wanda_masks(model, x_calib, n=2, m=4)
assert all(S.is_nm(mk, 2, 4, exact=True) for mk in wanda24.values())       # exactly 2 of every 4
rows = {}
for label, masks in (("magnitude 50% (per layer)", S.magnitude_masks(model, 0.5, "layer")),
                     ("Wanda 50% (per row)", S.wanda_masks(model, x_calib, sparsity=0.5)),
                     ("magnitude 2:4", {n: S.nm_mask(l.weight.abs(), 2, 4) for n, l in S.prunable_linears(model).items()}),
                     ("Wanda 2:4", wanda24)):
    rows[label] = bits_per_byte(S.apply_masks(copy.deepcopy(model), masks), tok, heldout, progress=False)
    print(f"{label:28s} {rows[label]:.3f} bits/byte (dense {dense_bpb:.3f})")
assert rows["Wanda 2:4"] < rows["magnitude 2:4"]

# %% [markdown] id="c013"
# What sparse storage saves. A weight matrix of the `tiny` MLP in fp16:

# %% id="c014"
R, C = cfg.intermediate_size, cfg.hidden_size
dense_b = S.dense_bytes(R, C, 2)
print(f"{'format':32s} {'bytes':>9s} {'vs dense':>9s}")
for label, b in (("dense fp16", dense_b), ("CSR, 50% zeros (int32 idx)", S.csr_bytes(R, C, 0.5)),
                 ("CSR, 90% zeros (int32 idx)", S.csr_bytes(R, C, 0.1)), ("2:4 compressed", S.semi_structured_bytes(R, C))):
    print(f"{label:32s} {b:9.0f} {b / dense_b:9.3f}")
print(f"CSR beats dense only below {S.csr_break_even_density():.0%} density (above {1 - S.csr_break_even_density():.0%} zeros)")
assert S.csr_bytes(R, C, 0.5) > dense_b and S.semi_structured_bytes(R, C) / dense_b == 0.5625

# %% [markdown] id="c015"
# Unstructured 50% sparsity *costs* memory in CSR (every kept fp16 value carries a 4-byte index), and a
# CPU or GPU matmul does not get faster from scattered zeros. 2:4 saves 44% of the memory and, on sparse
# tensor cores, time. The speed needs a GPU (compute capability ≥ 8.0):

# %% id="c016"
speed = S.semi_structured_speed(rows=4096, cols=4096, tokens=4096) if not QUICK else None
if speed:
    print(f"{speed['device']}: dense {speed['dense_ms']:.3f} ms, 2:4 {speed['sparse_ms']:.3f} ms, "
          f"{speed['speedup']:.2f}x")
else:
    print("no sparse tensor cores here (or quick mode): run this cell with QUICK = False on a GPU of compute "
          "capability >= 8.0 to time dense against 2:4 (the ideal is 2x on the matmul's math)")

# %% [markdown] id="c017"
# ## 3. Structured pruning: a smaller model
#
# Removing whole units gives a smaller *dense* model that is faster everywhere. A head writes to the
# residual stream only through its columns of `o_proj`, a neuron through its column of `down_proj`, a layer
# through both: zeroing those (a mask) and deleting them (a smaller `LlamaConfig`) give the same logits.
# With grouped-query attention (`tiny` has 8 query heads sharing 2 KV heads) every kept group must keep the
# same number of query heads, and a group with none left loses its K and V projections too.
#
# Importance: the norm of what a unit writes ("weight"), or the first-order change of the loss if it were
# zeroed, |Σ activation · gradient| ("taylor", one backward pass on calibration text).

# %% id="c018"
scores = {meth: S.unit_importance(model, meth, ids=calib) for meth in ("weight", "taylor")}
plan = S.make_plan(model, scores["taylor"], heads_per_group=2, neurons=cfg.intermediate_size // 2, layers=5)
small = S.shrink(model, plan)
masked = S.masked_copy(model, plan)
with torch.no_grad():
    x = calib[:2, :64]
    diff = (small(x) - masked(x)).abs().max().item()
print(f"kept: layers {plan.layers}, {small.config.num_attention_heads} heads / {small.config.num_key_value_heads} "
      f"KV heads, MLP {small.config.intermediate_size}; {small.num_parameters() / 1e6:.2f}M parameters "
      f"(was {model.num_parameters() / 1e6:.2f}M); max |logit difference| vs the masked model {diff:.1e}")
assert diff < 1e-4 and small.config.num_parameters() == small.num_parameters()
for meth in ("weight", "taylor"):
    p = S.make_plan(model, scores[meth], heads_per_group=2, neurons=cfg.intermediate_size // 2)
    print(f"{meth:6s} importance, half the heads and neurons: {bits_per_byte(S.shrink(model, p), tok, heldout, progress=False):.3f} bits/byte")
print(f"layer scores (taylor): {[round(v, 3) for v in scores['taylor']['layers'].tolist()]}")

# %% id="c019"
x = calib[:1, :128]
with torch.no_grad():   # interleaved, each by its fastest run (Module 00)
    fwd = compare({"dense": lambda: model(x), "pruned": lambda: small(x)}, warmup=1, repeats=5, device=device)
t_dense, t_small = fwd.time("dense"), fwd.time("pruned")
print(f"forward of 128 tokens: dense {t_dense * 1e3:.1f} ms, pruned {t_small * 1e3:.1f} ms "
      f"({t_dense / t_small:.2f}x; {device}, this run)")
timing_claim("the structurally pruned model (a smaller dense model) is faster", held=t_small < t_dense,
             measured=f"forward of 128 tokens on {device}: {fwd.describe()}");

# %% [markdown] id="c020"
# ## 4. Prune -> fine-tune, and the "30-90%" claim
#
# Each method prunes a copy of `tiny` to each sparsity (in `ROUNDS` steps), fine-tunes it `FT_STEPS`
# steps after each (cross entropy on training text with `course_lib.distill.distill`, the masks held) and
# is scored on held-out text. The x axis is the share of the projection weights really gone.

# %% id="c021"
t0 = time.perf_counter()
sweep = S.prune_finetune_sweep(model, tok, heldout, stream, calib, sparsities=SWEEP, steps=FT_STEPS,
                               rounds=ROUNDS, batch_size=FT_BATCH, seq_len=FT_SEQ, lr=1e-4)
print(f"{len(sweep)} runs in {time.perf_counter() - t0:.0f} s")
fig, ax = plt.subplots(figsize=(6, 3.2))
for meth, color in (("magnitude", "C0"), ("wanda", "C1"), ("structured", "C2")):
    r = [{"removed": 0.0, "bpb_pruned": dense_bpb, "bpb_finetuned": dense_bpb}]      # the dense model
    r += [row for row in sweep if row["method"] == meth]
    ax.plot([row["removed"] for row in r], [row["bpb_pruned"] for row in r], "--o", color=color, alpha=0.5,
            label=f"{meth}, pruned")
    ax.plot([row["removed"] for row in r], [row["bpb_finetuned"] for row in r], "-o", color=color,
            label=f"{meth}, + fine-tune")
ax.axhline(dense_bpb, color="k", lw=0.8, label="dense")
ax.set_xlabel("share of projection weights removed"); ax.set_ylabel("held-out bits/byte")
ax.legend(fontsize=7); plt.tight_layout(); plt.show()
for row in sweep:
    print(f"{row['method']:10s} target {row['target']:.0%}: removed {row['removed']:.0%}, "
          f"{row['bpb_pruned']:.3f} -> {row['bpb_finetuned']:.3f} bits/byte")

# %% [markdown] id="c022"
# > **Claim checked.** The notes say pruning gives "30-90% parameter reduction". On `tiny` (a 4.7M
# > parameter model trained to its capacity, with no redundancy to spare) we measure which prunings stay
# > within 5% of the dense model's bits per byte. Large models tolerate more: SparseGPT prunes OPT-175B and
# > BLOOM-176B to 50-60% unstructured with a negligible perplexity increase [@frantar2023sparsegpt], Wanda
# > LLaMA-7B to 65B to 50% at a loss that shrinks with size [@sun2024simple]; but 90% is not free for any
# > model measured here,
# > and the parameters counted must be the ones really removed: 50% unstructured zeros leave the model the
# > same size in memory (section 2) unless stored sparse.

# %% id="c023"
ok = [row for row in sweep if row["bpb_finetuned"] <= dense_bpb * 1.05]
best = max(ok, key=lambda r: r["removed"]) if ok else None
print("within 5% of dense: " + (", ".join(f"{r['method']} {r['removed']:.0%}" for r in ok) or "none"))
worst = max(sweep, key=lambda r: r["removed"])
print(f"the most removed ({worst['method']} {worst['removed']:.0%}): {worst['bpb_finetuned'] / dense_bpb - 1:+.0%} bits/byte")
assert best is None or best["removed"] < 0.9
by = {(r["method"], r["target"]): r for r in sweep}
assert all(by[("structured", s)]["bpb_finetuned"] > by[("wanda", s)]["bpb_finetuned"] for s in SWEEP)
print("at every target, structured pruning (a really smaller model) costs more bits/byte than Wanda's zeros")

# %% [markdown] id="c024"
# ## 5. Mixture of experts
#
# A MoE layer replaces one MLP by E experts and a **router**: each token goes to its top-k experts, their
# outputs mixed by a softmax over the k selected router logits. Three things make it work in practice:
#
# * a **load-balancing loss** E · Σᵢ fᵢ Pᵢ (fᵢ the share of assignments expert i got, Pᵢ its mean router
#   probability; 1 when even) so the router does not send everything to a few experts (the Switch
#   Transformer's auxiliary loss [@fedus2022switch]);
# * a **capacity**: each expert takes at most ⌈cf · N · k / E⌉ tokens per batch, so its matmul has a fixed
#   size; the overflow is **dropped** (first choices are placed before second choices);
# * a **batched dispatch**: sort the assignments by expert, run each expert once on its tokens, scatter back.
#
# > **Claim checked.** The notes' `SparselyGatedMoE` has no forward pass and its `__init__` never calls
# > `super().__init__()`, so assigning `self.experts` raises at construction. Ours is below.

# %% id="c025"
torch.manual_seed(0)
D, F_, E, K = 32, 64, 8, 2
moe = S.MoEMLP(D, F_, E, K, capacity_factor=1.0)
xs = torch.randn(64, D)
w8, idx, probs = moe.router(xs)
cap = S.expert_capacity(64, E, K, 1.0)
y_loop, load_loop, drop_loop = S.dispatch_loop(xs, moe.experts, w8, idx, cap)
y_fast, load_fast, drop_fast = S.dispatch(xs, moe.experts, w8, idx, cap)
assert torch.allclose(y_loop, y_fast, atol=1e-5) and drop_loop == drop_fast
print(f"capacity {cap} per expert; load {load_fast.tolist()}; dropped {drop_fast} of {idx.numel()} assignments; "
      f"batched dispatch == per-token loop")
xb = torch.randn(512, D)
wb, ib, _ = moe.router(xb)
cb = S.expert_capacity(512, E, K, 1.0)
with torch.no_grad():
    disp = compare({"per-token loop": lambda: S.dispatch_loop(xb, moe.experts, wb, ib, cb),
                    "batched": lambda: S.dispatch(xb, moe.experts, wb, ib, cb)}, warmup=1, repeats=3)
t_loop, t_fast = disp.time("per-token loop"), disp.time("batched")
print(f"512 tokens: per-token loop {t_loop * 1e3:.1f} ms, batched {t_fast * 1e3:.1f} ms ({t_loop / t_fast:.1f}x, this run)")
timing_claim("the batched dispatch is faster than the per-token loop", held=t_fast < t_loop,
             measured=f"512 tokens: {disp.describe()}")

dim, hid = cfg.hidden_size, cfg.intermediate_size
print(f"\nper token, D={dim}, expert hidden={hid}:")
print(f"{'layer':34s} {'params':>10s} {'FLOPs/token':>12s}")
print(f"{'dense MLP':34s} {3 * dim * hid:10,d} {S.dense_flops_per_token(dim, hid):12,d}")
print(f"{'MoE 8 experts, top-2':34s} {S.moe_params(dim, hid, 8):10,d} {S.moe_flops_per_token(dim, hid, 8, 2):12,d}")
print(f"{'dense MLP with the MoE params':34s} {3 * dim * hid * 8:10,d} {S.dense_flops_per_token(dim, 8 * hid):12,d}")
ratio = S.dense_flops_per_token(dim, 8 * hid) / S.moe_flops_per_token(dim, hid, 8, 2)
print(f"same parameters, {ratio:.1f}x fewer FLOPs per token (k/E = 1/4, plus the router)")
assert 3.5 < ratio <= 4

# %% [markdown] id="c026"
# A small MoE MLP trained on CPU (inputs from 8 clusters, each with its own target map), with and without
# the balancing loss: the share of assignments each expert gets over training.

# %% id="c027"
hists = {aux: S.train_moe_demo(steps=MOE_STEPS, aux_weight=aux, batch=128, progress=True) for aux in (0.0, 0.1)}
fig, axes = plt.subplots(1, 2, figsize=(10, 2.8), sharey=True)
for ax, (aux, h) in zip(axes, hists.items()):
    ax.stackplot(range(MOE_STEPS), h["load"].T.numpy())
    ax.set_title(f"aux weight {aux}: load per expert", fontsize=9); ax.set_xlabel("step")
plt.tight_layout(); plt.show()
for aux, h in hists.items():
    tail = h["load"][-10:].mean(0)
    print(f"aux {aux}: final MSE {h['loss'][-1]:.3f}, balance loss {sum(h['aux'][-10:]) / 10:.3f} (1 = even), "
          f"busiest expert {tail.max():.1%} (even {1 / 8:.1%}), dropped {sum(h['dropped'][-10:]) / 10:.1%}")
    assert h["loss"][-1] < h["loss"][0]
assert sum(hists[0.1]["aux"][-10:]) <= sum(hists[0.0]["aux"][-10:]) + 0.05

# %% [markdown] id="c028"
# ## 6. Sparse attention patterns
#
# Longformer: each token sees a **sliding window** of recent tokens plus a few **global** tokens
# [@beltagy2020longformer]; BigBird adds **random blocks** [@zaheer2020big]. The cost per head is 4·Dh FLOPs per allowed (query, key) pair, against T(T+1)/2 pairs for
# dense causal attention. The course model already takes a boolean `attn_mask`, so a pattern is imposed by
# wrapping the model (`MaskedAttentionModel`); the default path (SDPA's `is_causal`) is untouched. (Through
# SDPA a mask only hides scores: the *speed* needs a kernel that skips masked blocks.)

# %% id="c029"
T = 128
pats = {"window 16": S.sliding_window_mask(T, 16), "global 4 + window 16": S.sliding_window_mask(T, 16) | S.global_mask(T, 4),
        "BigBird (w16, g4, 2 random blocks of 16)": S.bigbird_mask(T, 16, 4, 16, 2, seed=0)}
fig, axes = plt.subplots(1, 3, figsize=(9, 3))
for ax, (label, mk) in zip(axes, pats.items()):
    ax.imshow(mk.numpy(), cmap="Greys"); ax.set_title(label, fontsize=8); ax.axis("off")
plt.tight_layout(); plt.show()
for label, mk in pats.items():
    c = S.pattern_cost(mk, cfg.head_dim)
    print(f"{label:42s} {c['fraction']:.0%} of dense causal FLOPs and score memory at T={T}")
c512 = S.pattern_cost(S.sliding_window_mask(512, 16), cfg.head_dim)
assert c512["fraction"] < S.pattern_cost(pats["window 16"], cfg.head_dim)["fraction"]   # the saving grows with T

# %% id="c030"
attn_rows = {}
for wdw in WINDOWS:
    mm = S.MaskedAttentionModel(model, lambda T, dev, wdw=wdw: S.sliding_window_mask(T, wdw, dev))
    attn_rows[f"window {wdw}"] = bits_per_byte(mm, tok, heldout, progress=False)
wg = S.MaskedAttentionModel(model, lambda T, dev: S.sliding_window_mask(T, WINDOWS[0], dev) | S.global_mask(T, 4, dev))
attn_rows[f"window {WINDOWS[0]} + 4 global"] = bits_per_byte(wg, tok, heldout, progress=False)
full = S.MaskedAttentionModel(model, lambda T, dev: S.sliding_window_mask(T, cfg.max_position_embeddings, dev))
attn_rows["window = context (dense)"] = bits_per_byte(full, tok, heldout, progress=False)
for label, v in attn_rows.items():
    print(f"{label:28s} {v:.3f} bits/byte")
assert abs(attn_rows["window = context (dense)"] - dense_bpb) < 1e-4
assert attn_rows[f"window {WINDOWS[0]}"] > attn_rows[f"window {WINDOWS[-1]}"] >= dense_bpb - 1e-4

# %% [markdown] id="c031"
# Imposed after training, a short window costs the model quality it never learnt to do without; models
# built for it (Longformer, Mistral's sliding window) are trained with the pattern. The KV cache of a
# window-only pattern is bounded by the window: Module 05's window cache.
#
# ## Summary
#
# * Magnitude pruning is a one-liner in PyTorch (`torch.nn.utils.prune`, called on the *module*); ours gives
#   the same masks. Scattered zeros save neither memory (CSR needs > 67% zeros in fp16) nor time.
# * Wanda's weight x activation score beats magnitude under the 2:4 constraint (measured above; at 50%
#   unstructured the two are close on this small model), and 2:4 is the pattern hardware can use: exactly 2
#   of every 4, 56% of the dense bytes.
# * Structured pruning removes heads (GQA-consistently), neurons and layers, giving a smaller `LlamaConfig`
#   model with the masked model's logits, faster on any device, but it hurts quality most per weight removed.
# * The "30-90%" in the notes is not a property of pruning: measured here, a small model trained to capacity
#   loses quality well before that; fine-tuning recovers part of it.
# * MoE buys parameters without FLOPs (top-2 of 8: 1/4 of the dense FLOPs at the same parameter count), at
#   the price of routing, balance and capacity; the batched dispatch equals the per-token loop.
# * Sparse attention cuts the pairs computed; imposed on a model not trained for it, it costs quality.

# %% [markdown] id="c032"
# ## Further reading
#
# Used in this notebook:
#
# * [@sun2024simple]: Wanda, pruning by weight x activation norm, row by row, without weight updates.
# * [@frantar2023sparsegpt]: SparseGPT, one-shot second-order pruning of 100B-class models.
# * [@mishra2021accelerating]: the 2:4 pattern and NVIDIA's sparse tensor cores.
# * [@fedus2022switch]: Switch Transformers; the load-balancing loss and expert capacity.
# * [@beltagy2020longformer] and [@zaheer2020big]: sliding-window, global and random-block attention.
#
# To go further:
#
# * [@frankle2019lottery]: the lottery ticket hypothesis, sparse subnetworks that train as well as the whole.
# * [@shazeer2017outrageously]: the sparsely-gated mixture-of-experts layer that today's MoE models descend from.
