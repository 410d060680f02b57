# %% [markdown] id="c002"
# # Module 01 — Where the time goes
#
# Generating text runs a model in two very different regimes:
#
# * **Prefill.** The whole prompt (L tokens) goes through the model in one forward pass. Every weight
#   matrix multiplies an `[L, D]` block of activations: many FLOPs for every byte read from memory.
# * **Decode.** Each step adds *one* token per sequence. Every weight matrix is still read from memory in
#   full, but it now multiplies a single row: about one FLOP per byte. The arithmetic units wait for memory.
#
# This notebook puts numbers on that picture. For every operation of a Llama-style layer we count FLOPs,
# bytes moved and their ratio, the **arithmetic intensity** (FLOP/byte); we place the operations on the
# **roofline** of real GPUs (T4, L4, A100, H100, H200, B200, MI300X) and of your own machine; we compare
# predicted and measured step times; and we find the batch size at which decoding stops being memory-bound.
#
# We start from the simplified per-operation tables that course notes commonly use, reproduce them exactly,
# and then refine them: these tables count multiply-adds instead of FLOPs and elements instead of bytes, and scale attention scores by
# 1/√D instead of 1/√(head dim).

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()          # True under the tests (COURSE_QUICK=1): small sizes on a CPU
SEQ_LEN = 128 if QUICK else 448         # prompt length for the bundled model (its context is 512)
DECODE_CONTEXT = 64 if QUICK else 256   # tokens in the KV cache when we time one decode step
BATCHES = [1, 8, 32] if QUICK else [1, 2, 4, 8, 16, 32, 64]  # decode batch sweep on this machine
REPEATS = 5 if QUICK else 20            # timed runs per measurement (after warm-up)
BIG_MODEL = "llama-2-7b"                 # analytic only: a published architecture, no weights needed
BIG_SEQ = 1024

# %% id="c004"
import math
import time
from fractions import Fraction

import matplotlib.pyplot as plt
import sympy
import torch
import torch.nn.functional as F
from IPython.display import Markdown, display

from course_lib.env import capabilities
from course_lib.models import LlamaConfig, as_config, load
from course_lib.perf.claims import timing_claim
from course_lib.device_bench import (count_ops, decode_step_call, forward_call, measure_device, op_overhead,
                                     time_decode_step)
from course_lib.perf.hardware import GPUS, hardware_table
from course_lib.perf.intensity import intensity_table
from course_lib.perf.notes_forms import notes_table
from course_lib.perf.roofline import (COMPUTE_BOUND, MEMORY_BOUND, analyze, classify, critical_batch,
                                      decode_critical_batch, min_decode_latency, ridge_point)
from course_lib.perf.timing import benchmark, compare
from course_lib.viz import RooflineExplorer, plot_decode_batch, plot_roofline

caps = capabilities()
print(f"device: {caps.device} ({caps.device_name}), torch {caps.torch}, quick mode: {QUICK}")

# %% [markdown] id="c005"
# ## 1. Prefill and decode, measured
#
# We load the course's bundled model (a small Llama; its configuration is printed below) and time two
# things on this machine:
#
# * a **prefill**: one forward pass over `SEQ_LEN` prompt tokens;
# * a **decode step**: one new token whose attention reads a KV cache already holding the prompt.
#   (`decode_step_call` runs the prompt once, keeps its keys and values, and then times
#   `model(new_token, cache=...)`: a true one-token forward, not a recomputation of the whole prompt.)

# %% id="c006"
model, tokenizer = load("tiny")
cfg = model.config
dev = model.device
print(f"bundled model on {dev}: {model.num_parameters() / 1e6:.2f} M parameters, {cfg}")

# timed interleaved (one call of each per round), each by its fastest run: see Module 00, section 5
pd = compare({"prefill": forward_call(model, SEQ_LEN), "decode step": decode_step_call(model, context=SEQ_LEN)},
             warmup=2, repeats=REPEATS, device=dev)
t_prefill, t_decode = pd.time("prefill"), pd.time("decode step")
print(f"prefill of {SEQ_LEN} tokens: {t_prefill * 1e3:.1f} ms  ->  {t_prefill / SEQ_LEN * 1e3:.3f} ms per token")
print(f"one decode step:         {t_decode * 1e3:.1f} ms  ->  {t_decode * 1e3:.3f} ms per token")
print(f"a decoded token costs {t_decode / (t_prefill / SEQ_LEN):.1f}x a prompt token on this run")
timing_claim("a prompt token is cheaper than a generated one", held=t_prefill / SEQ_LEN < t_decode,
             measured=f"{t_prefill / SEQ_LEN * 1e3:.3f} ms per prompt token, {t_decode * 1e3:.3f} ms per decoded "
                      f"token; {pd.note()}");

# %% [markdown] id="c007"
# A prompt token is much cheaper than a generated one (the factor of this run is printed above), although
# both go through the same layers with the same weights. The rest of the notebook explains why, first with
# those simplified tables.
#
# ## 2. The simplified tables, reproduced exactly
#
# The tables analyse one layer of a transformer with multi-head attention (all projections `D × D`), a
# `4D` relu MLP, sequence length `L`, model dimension `D = n_h × H` (`H` = head dimension). For each
# operation they divide the **work**, counted in multiply-adds, by the **traffic**, counted in elements of
# the inputs and output. Attention rows are per head. `notes_table` rebuilds them row by row, and
# since it only uses `+` and `×`, we can feed it sympy symbols and compare with the printed closed forms.

# %% id="c008"
L, D, H = sympy.symbols("L D H", positive=True, integer=True)
# the right-hand sides printed in the tables, typed in here (row number -> intensity)
NOTES = {
    "prefill": {1: L * D / (2 * L + D), 2: L * D / (2 * L + D), 3: L * D / (2 * L + D),
                7: L * H / (2 * H + L), 8: L * H / (2 * H + L), 10: L * D / (2 * L + D),
                11: 4 * L * D / (5 * L + 4 * D), 13: 4 * L * D / (5 * L + 4 * D)},
    "decode": {1: D / (2 + D), 2: D / (2 + D), 4: D / (2 + D),
               9: (H + L * H) / (2 * H + L + L * H + 1), 10: (H + L * H) / (2 * H + L + L * H + 1),
               12: D / (2 + D), 13: 4 * D / (5 + 4 * D), 15: 4 * D / (5 + 4 * D)},
}
for phase in ("prefill", "decode"):
    sym = notes_table(phase, L, D, head_dim=H)
    checked = 0
    for row in sym:
        if row.no in NOTES[phase]:
            assert sympy.cancel(row.intensity - NOTES[phase][row.no]) == 0, (phase, row.no)
            checked += 1
        else:
            assert row.intensity is None  # the rows the tables mark '-' (partition, merge, concat, relu)
    print(f"{phase}: {len(sym)} rows, {checked} closed forms equal to the tables' symbolically")
    print("   e.g. row", sym[0].no, ":", sym[0].computation, " intensity =", sympy.factor(sym[0].intensity))

# %% [markdown] id="c009"
# With numbers: a layer with Llama-7B's sizes (`D = 4096`, 32 heads) and a prompt of 2048 tokens. The
# intensities are exact fractions; the last column is the formula the tables print.

# %% id="c010"
notes_pre = notes_table("prefill", 2048, 4096, num_heads=32)
notes_dec = notes_table("decode", 2048, 4096, num_heads=32)
display(notes_pre)
display(notes_dec)
assert notes_pre[0].intensity == Fraction(2048 * 4096, 2 * 2048 + 4096) == 1024
assert notes_dec[0].intensity == Fraction(4096, 4098)
print(f"prefill Q projection: {float(notes_pre[0].intensity):.0f} multiply-adds per element; "
      f"decode: {float(notes_dec[0].intensity):.4f}")

# %% [markdown] id="c011"
# The tables' conclusion already shows: in prefill a projection does about `L·D/(2L+D)` ≈ 1000 units of
# work per unit of traffic; in decode `D/(D+2)` < 1. The next two sections check the tables' shortcuts and
# then count what a real model does.
#
# ## 3. Claim checked: what the simplified tables leave out
#
# > **Claim checked.** These tables count work in *multiply-adds* and traffic in *elements*, and write the
# > attention scale as `1/√D`.
# >
# > * A multiply-add is **two** floating-point operations, and GPU peaks (312 TFLOP/s on an A100) count
# >   both: real work is `2·M·N·K` for an `[M, K] × [K, N]` matmul.
# > * Memory moves **bytes**: an element is 4 bytes in fp32, 2 in fp16/bf16, 1 in int8/fp8.
# > * In fp16 the two factors of 2 cancel, so the tables' numbers happen to be right in FLOP/byte — but
# >   only in fp16: in fp32 they are 2× too high, in int8 2× too low.
# > * Scores are scaled by `1/√(head dim)` [@vaswani2017attention], not `1/√D`: with `1/√D` the logits of
# >   every head are `√n_h` times too small, so the softmax is flatter than the model expects; for random
# >   queries and keys it is nearly uniform (a trained model's peaked heads flatten less: both measured below).
# > * And the architecture moved on: Llama models use grouped-query attention (fewer K/V heads than
# >   query heads, so smaller K/V projections and KV cache), a SwiGLU MLP with three matrices, RMSNorm,
# >   rotary embeddings, and an LM head over the vocabulary. The refined table below counts all of them.
#
# The first three points, computed on the tables' own sizes (multi-head attention, `D × D` projections, a
# `4D`-wide MLP: the real table's up and down projections are the tables' two MLP matrices):

# %% id="c012"
notes_arch = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                         intermediate_size=4 * 4096, num_hidden_layers=1, name="tables' layer")
notes = notes_table("prefill", 2048, 4096, num_heads=32)
pairs = {1: "q_proj", 2: "k_proj", 3: "v_proj", 10: "o_proj", 11: "up_proj", 13: "down_proj"}
for dtype, factor in (("fp16", 1), ("fp32", 0.5), ("int8", 2)):
    real = intensity_table(notes_arch, "prefill", 2048, dtype=dtype)
    for no, name in pairs.items():
        s, r = notes[no - 1], real[name]
        assert r.flops == 2 * s.flops                          # FLOPs = 2 x multiply-adds
        assert r.bytes == s.bytes * {"fp16": 2, "fp32": 4, "int8": 1}[dtype]  # bytes = elements x size
        assert math.isclose(r.intensity, float(s.intensity) * factor, rel_tol=1e-12)
    print(f"{dtype}: real FLOP/byte = {factor} x the tables' number, e.g. Q projection "
          f"{real['q_proj'].intensity:.1f} vs {float(notes[0].intensity):.1f}")

# %% [markdown] id="c013"
# The scale: draw random queries and keys with unit-variance entries (the regime the `1/√d` scaling is
# designed for) for a model with `D = 4096` and 32 heads (`head dim = 128`), and look at the softmax over
# 2048 keys.

# %% id="c014"
torch.manual_seed(0)
Dm, n_h, keys = 4096, 32, 2048
Dh = Dm // n_h
q = torch.randn(1, n_h, 1, Dh)
k = torch.randn(1, n_h, keys, Dh)
entropies = {}
for name, scale in (("1/sqrt(head_dim)", Dh ** -0.5), ("1/sqrt(D) (tables)", Dm ** -0.5)):
    logits = (q @ k.transpose(-1, -2)) * scale
    p = logits.softmax(-1)
    entropies[name] = float(-(p * p.log()).sum(-1).mean())
    print(f"{name:>18}: logit std {logits.std():.3f}, softmax entropy {entropies[name]:.3f} "
          f"(uniform would be {math.log(keys):.3f}), largest weight {p.max():.4f}")
assert entropies["1/sqrt(D) (tables)"] > 0.99 * math.log(keys) > entropies["1/sqrt(head_dim)"]
# torch's scaled_dot_product_attention (which the course model calls) uses 1/sqrt(head_dim) by default
v = torch.randn(1, n_h, keys, Dh)
sdpa = F.scaled_dot_product_attention(q, k, v)
assert torch.allclose(sdpa, ((q @ k.transpose(-1, -2)) * Dh ** -0.5).softmax(-1) @ v, atol=1e-5)
assert not torch.allclose(sdpa, ((q @ k.transpose(-1, -2)) * Dm ** -0.5).softmax(-1) @ v, atol=1e-3)
std_head = float((q @ k.transpose(-1, -2) * Dh ** -0.5).std())
std_d = float((q @ k.transpose(-1, -2) * Dm ** -0.5).std())
assert 0.8 < std_head < 1.2 and math.isclose(std_head / std_d, math.sqrt(n_h), rel_tol=1e-5)

# %% [markdown] id="c015"
# For these **random** queries and keys, `1/√D` gives logits with a standard deviation of about
# `1/√32 ≈ 0.18` instead of 1, and attention weights within 1% of uniform in entropy: attention can hardly
# single out a key. That is the regime of a freshly initialized model, not of a trained one: training makes
# the dot products of some query-key pairs far larger than random ones (heads that look at the previous
# token, at a delimiter, at the first token), so a trained head is peaked, and shrinking its logits
# `√n_h`-fold flattens it without making it uniform. (A model *trained* with `1/√D` would simply learn
# larger queries and keys: the constant only matters against the one the weights were trained with.) The
# bundled model's own heads on held-out text, with the scale it was trained with and with one `√n_h` times
# smaller, as the tables' `1/√D` would be (its `n_h = 8`, so `√8`, not `√32`), beside random queries and keys
# of the same shape:

# %% id="c015a"
from course_lib.kvcache import ContiguousCache
from course_lib.models.corpus import load_split


class KeepQueries(ContiguousCache):
    """A KV cache that also keeps each layer's queries (after RoPE), to recompute the model's attention."""

    def __init__(self):
        super().__init__()
        self.q = []

    def update(self, k, v, layer, q=None):
        self.q.append(q)
        return super().update(k, v, layer, q)


def relative_entropy(q, k, scale):
    """Causal softmax(q k^T * scale) per query: entropy / log(number of keys), averaged over heads and queries
    (1 = uniform); q [1, H, T, Dh], k [1, K, T, Dh] (GQA: each KV head serves H/K query heads)."""
    T = q.shape[2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = ((q @ k.transpose(-1, -2)).float() * scale).masked_fill(~causal, float("-inf")).softmax(-1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)[..., 1:]                 # the first query has a single key
    return float((ent / torch.arange(2, T + 1, device=q.device).log()).mean())


ATTN_TOKENS = 128 if QUICK else 256
text_ids = tokenizer(load_split("heldout")[0], add_special_tokens=False, verbose=False)["input_ids"][:ATTN_TOKENS]
kept = KeepQueries()
with torch.no_grad():
    model(torch.tensor([text_ids], device=dev), cache=kept)
n_h_m, Dh_m = cfg.num_attention_heads, cfg.head_dim
scales = {"1/sqrt(head_dim)": Dh_m ** -0.5, f"sqrt({n_h_m}) x smaller": Dh_m ** -0.5 / math.sqrt(n_h_m)}
g_attn = torch.Generator(device=dev).manual_seed(0)
rand_q = torch.randn(kept.q[0].shape, generator=g_attn, device=dev)
rand_k = torch.randn(kept.k[0].shape, generator=g_attn, device=dev)
attn_rel = {}
for name, scale in scales.items():
    attn_rel["trained", name] = sum(relative_entropy(q, k, scale) for q, k in zip(kept.q, kept.k)) / len(kept.q)
    attn_rel["random", name] = relative_entropy(rand_q, rand_k, scale)
    print(f"{name:>20}: entropy / uniform, trained heads (mean of {len(kept.q)} layers) "
          f"{attn_rel['trained', name]:.2f}, random q and k {attn_rel['random', name]:.2f}")
small = f"sqrt({n_h_m}) x smaller"
assert attn_rel["random", small] > 0.95                    # random: the smaller scale is nearly uniform
assert attn_rel["trained", "1/sqrt(head_dim)"] < 0.5       # trained heads are peaked ...
assert attn_rel["trained", "1/sqrt(head_dim)"] < attn_rel["trained", small] < 0.85   # ... flatter, not uniform

# %% [markdown] id="c015b"
# The smaller scale flattens the trained heads (their entropy rises) but leaves them well short of uniform,
# while the same scale makes random queries and keys all but uniform. Either way the FLOP and byte counts do
# not change (a scale is one multiplication per score), which is why the tables still hold.
#
# ## 4. The refined table: FLOPs and bytes of a real model
#
# `intensity_table(model, phase, seq_len, batch, dtype)` counts every operation of the course's Llama
# layer: norms, Q/K/V projections with the real number of K/V heads, rotary embeddings, writing the KV
# cache, the two attention matmuls per head with the real head dim, softmax, the output projection,
# residual adds, the SwiGLU MLP (gate, up, down), and, once per model, the embedding lookup, the final
# norm and the LM head. Bytes assume every op reads its inputs and writes its output (no fusion). `count`
# is how many times the op runs in one forward pass.
#
# The bundled model first, in its own dtype (fp32 here), prefill of `SEQ_LEN` tokens and one decode step
# after them:

# %% id="c016"
dtype_local = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[model.dtype]
tiny_pre = intensity_table(cfg, "prefill", SEQ_LEN, dtype=dtype_local)
tiny_dec = intensity_table(cfg, "decode", SEQ_LEN, dtype=dtype_local)
display(tiny_pre)
display(tiny_dec)

# %% [markdown] id="c017"
# Are these FLOPs right? PyTorch has an independent counter, `torch.utils.flop_counter.FlopCounterMode`,
# which counts each matmul it sees as `2·M·N·K`. With the math backend of `scaled_dot_product_attention`
# the two attention matmuls are visible to it too. It counts only matmuls, so we compare with the
# table's matmul FLOPs (weights + attention); the elementwise ops are conventions (see
# `course_lib.perf.ops.ELEMENTWISE_FLOPS`) and a small share anyway.

# %% id="c018"
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from course_lib.kvcache import FixedPrefixCache

ids = torch.randint(0, cfg.vocab_size, (2, SEQ_LEN), device=dev)
with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
    model(ids)
table_flops = intensity_table(cfg, "prefill", SEQ_LEN, batch=2).matmul_flops()
print(f"prefill, batch 2: FlopCounterMode {counter.get_total_flops():,} FLOPs, table {table_flops:,}")
assert counter.get_total_flops() == table_flops

cache = FixedPrefixCache.from_prompt(model, ids)
with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
    model(ids[:, :1], cache=cache)
table_flops = intensity_table(cfg, "decode", SEQ_LEN, batch=2).matmul_flops()
print(f"decode,  batch 2: FlopCounterMode {counter.get_total_flops():,} FLOPs, table {table_flops:,}")
assert counter.get_total_flops() == table_flops
elementwise_share = sum(r.total_flops for r in tiny_pre if r.kind == "elementwise") / tiny_pre.flops
print(f"elementwise ops (not counted by FlopCounterMode): {elementwise_share:.2%} of the prefill's FLOPs")
assert elementwise_share < 0.05

# %% [markdown] id="c019"
# Exactly equal, in both phases. Now a real-size model, Llama-2-7B (`D = 4096`, 32 layers, 32 heads,
# SwiGLU with 11008 hidden units, vocabulary 32000), in fp16 with a 1024-token prompt. Only its
# architecture is needed, not its weights.

# %% id="c020"
big = as_config(BIG_MODEL)
big_pre = intensity_table(big, "prefill", BIG_SEQ, dtype="fp16")
big_dec = intensity_table(big, "decode", BIG_SEQ, dtype="fp16")
display(big_dec)
print(f"{big.name}: {big.num_parameters() / 1e9:.2f} B parameters")
print(f"prefill of {BIG_SEQ} tokens: {big_pre.flops / 1e12:.1f} TFLOP, {big_pre.bytes / 1e9:.1f} GB, "
      f"{big_pre.intensity:.0f} FLOP/byte")
print(f"one decode step:         {big_dec.flops / 1e9:.1f} GFLOP, {big_dec.bytes / 1e9:.1f} GB, "
      f"{big_dec.intensity:.2f} FLOP/byte")
weights_share = big_dec.weight_bytes() / big_dec.bytes
kv_share = big_dec.kv_bytes() / big_dec.bytes
print(f"decode bytes: {weights_share:.1%} weights, {kv_share:.1%} KV cache, the rest activations")
for r in big_dec:
    if r.kind == "matmul":
        assert r.intensity < 1.0        # fp16, batch 1: 2 FLOPs per 2-byte weight, a little less
for name in ("q_proj", "gate_proj", "down_proj"):
    assert big_pre[name].intensity > 500
assert weights_share > 0.9

# %% [markdown] id="c021"
# In decode every weight matrix does one multiply-add per weight it reads: 2 FLOPs per 2 bytes in fp16,
# an intensity just below 1. More than 90% of the bytes are weights; the KV cache grows with the context
# and the batch (module 05). In prefill the same matrices reach intensities in the hundreds.
#
# ## 5. Rooflines: T4, L4, A100, H100, H200, B200, MI300X and this machine
#
# A device with peak `P` FLOP/s and memory bandwidth `W` bytes/s can run an op of intensity `I` at most
# at `min(P, I·W)`: the **roofline** model [@williams2009roofline]. The two limits meet at the **ridge
# point** `P/W`: below it an op is memory-bound, above it compute-bound. The table (dense tensor-core rates, no sparsity; sources in
# `course_lib/perf/hardware.py`) follows. Two newer devices close it.
#
# NVIDIA's B200 (Blackwell) adds tensor cores for 4-bit floating point (FP4, twice its FP8 rate; the fp4
# column) and 2.3 times the H100's bandwidth [@nvidia2024hgxb200]. AMD's MI300X has more memory (192 GB) and
# more bandwidth than an H100 or H200, and a different software stack, ROCm instead of CUDA (PyTorch and
# Triton support it): it has no CUDA compute capability, its "SM" column counts compute units and its shared
# memory is the LDS of a CU [@amd2024instinct].

# %% id="c022"
display(Markdown(hardware_table()))
for g in GPUS.values():
    print(f"{g.name:>10}: ridge {ridge_point(g, 'fp16'):5.0f} FLOP/byte in fp16"
          + (f", {ridge_point(g, 'fp8'):5.0f} in fp8" if g.fp8 else ""))
assert 150 < min(ridge_point(g) for g in GPUS.values()) and max(ridge_point(g) for g in GPUS.values()) < 410

# %% [markdown] id="c023"
# Every one of these GPUs needs about 150–400 FLOPs per byte to keep its tensor cores busy. Now the same
# for this machine: `measure_device` times a large memory copy (bytes read + written per second) and a
# matmul (FLOP/s). On a CPU it measures fp32 only; on a GPU also fp16 (and bf16 where the hardware has it).

# %% id="c024"
t0 = time.perf_counter()
local = measure_device()
print(f"{local.name}: copy {local.bandwidth_gbs:.1f} GB/s, matmul "
      + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in local.peak_tflops.items())
      + f", ridge {local.ridge_point(local.default_dtype):.1f} FLOP/byte ({time.perf_counter() - t0:.1f} s)")
print(local.source)
assert local.bandwidth_gbs > 0 and all(v > 0 for v in local.peak_tflops.values())

# %% [markdown] id="c025"
# The rooflines, with Llama-2-7B's [@touvron2023llama] prefill (circles) and decode (crosses) operations
# placed on the A100's (the first device; a measured CPU is dashed and drawn in fp32, the only rate it has):

# %% id="c026"
plot_roofline(["A100-80GB", "T4", "L4", "A100-40GB", "H100-SXM", "H200", "B200", "MI300X", local], "fp16",
              tables=[big_pre, big_dec], title=f"{big.name}, fp16, {BIG_SEQ} tokens")
plt.show()

rows = []
for g in GPUS.values():
    dec_mem = sum(classify(r.intensity, g) == MEMORY_BOUND for r in big_dec)
    pre_comp = [r.name for r in big_pre if r.kind == "matmul" and classify(r.intensity, g) == COMPUTE_BOUND]
    rows.append((g.name, dec_mem, len(big_dec), len(pre_comp)))
    assert dec_mem == len(big_dec)                                           # decode: all memory-bound
    assert len(pre_comp) == sum(1 for r in big_pre if r.kind == "matmul")   # prefill: all matmuls compute-bound
    assert classify(big_pre["softmax"].intensity, g) == MEMORY_BOUND        # ... but not the softmax
for name, m, n, c in rows:
    print(f"{name:>10}: decode {m}/{n} ops memory-bound; prefill {c} weight matmuls compute-bound")

# %% [markdown] id="c027"
# On every GPU of the table, all operations of a batch-1 decode step are memory-bound and all weight
# matmuls of a 1024-token prefill are compute-bound. (The prefill's softmax and elementwise ops stay
# memory-bound; the `L × L` score matrix going through memory is what FlashAttention, module 07, avoids.)
#
# The bundled model on this machine's measured roofline:

# %% id="c028"
plot_roofline([local], local.default_dtype, tables=[intensity_table(cfg, "prefill", SEQ_LEN, dtype=local.default_dtype),
                                                    intensity_table(cfg, "decode", SEQ_LEN, dtype=local.default_dtype)],
              title=f"bundled model on {local.name}")
plt.show()

# %% [markdown] id="c029"
# ## 6. Predicted vs measured on this machine
#
# The roofline predicts a lower bound for each op, `max(FLOPs / peak, bytes / bandwidth)`; summing over
# the ops of a step gives a predicted step time. We use the *measured* peak and bandwidth of this machine
# and compare with the measured times of section 1 (prefill) and of one decode step with a KV cache of
# `DECODE_CONTEXT` tokens (again a true one-token forward through the cache).

# %% id="c030"
pdt = local.default_dtype if dtype_local not in local.peak_tflops else dtype_local
pred_prefill = analyze(intensity_table(cfg, "prefill", SEQ_LEN, dtype=dtype_local), local, pdt)
pred_decode = analyze(intensity_table(cfg, "decode", DECODE_CONTEXT, dtype=dtype_local), local, pdt)
meas_decode = time_decode_step(model, context=DECODE_CONTEXT, batch=1, repeats=REPEATS).median

# What else a decode step pays for: the weight matmuls alone (same shapes, nothing else), and the
# number of operations PyTorch dispatches times the fixed cost of one tiny operation.
linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
xs = [torch.randn(1, m.in_features, device=dev, dtype=model.dtype) for m in linears]


@torch.no_grad()
def weight_matmuls_only():
    for m, x in zip(linears, xs):
        m(x)


t_mm = benchmark(weight_matmuls_only, repeats=REPEATS, device=dev).median
new_token = torch.randint(0, cfg.vocab_size, (1, 1), device=dev)
n_ops = count_ops(model, new_token, cache=FixedPrefixCache.from_prompt(model, ids[:1, :DECODE_CONTEXT]))
per_op = op_overhead(dev)

print(f"prefill of {SEQ_LEN} tokens: predicted {pred_prefill.time * 1e3:8.3f} ms, measured {t_prefill * 1e3:8.3f} ms "
      f"(measured / predicted = {t_prefill / pred_prefill.time:.2f})")
print(f"one decode step:       predicted {pred_decode.time * 1e3:8.3f} ms, measured {meas_decode * 1e3:8.3f} ms "
      f"(measured / predicted = {meas_decode / pred_decode.time:.2f})")
print(f"   the {len(linears)} weight matmuls alone (same shapes, nothing else) take {t_mm * 1e3:.3f} ms")
print(f"   the step dispatches {n_ops} PyTorch ops; a trivial op costs {per_op * 1e6:.2f} us here, so at least "
      f"{n_ops * per_op * 1e3:.3f} ms of fixed costs")
other = max(meas_decode - t_mm, 0.0)
print(f"   everything but the weight matmuls: {other * 1e3:.3f} ms for the other {n_ops - len(linears)} ops "
      f"({other / max(n_ops - len(linears), 1) * 1e6:.1f} us each on average)")
print(f"   predicted decode is {pred_decode.share(MEMORY_BOUND):.0%} memory-bound time; "
      f"weights {pred_decode.table.weight_bytes() / 1e6:.1f} MB at {local.bandwidth_gbs:.1f} GB/s")
assert pred_decode.time > 0 and meas_decode > 0 and t_mm > 0

# %% [markdown] id="c031"
# How to read these numbers (they are this run's, on this machine; on a shared machine the spread
# between runs is large):
#
# * **Prefill** is a few big matmuls, the case the roofline is made for: the printed ratio says how
#   close this run came to the measured matmul rate (between 1 and 5 in our runs on a busy 2-core
#   machine).
# * **A decode step of this small model pays for much more than its bytes.** Its weights are a few tens
#   of MB (printed above), which this machine can read in the predicted time. But single-row matmuls
#   such as `[1, 256] × [256, 688]` run well below the copy bandwidth (compare "weight matmuls alone"
#   with the prediction), and the step dispatches hundreds of small operations, each paying a fixed
#   cost in Python, the dispatcher and the allocator. A trivial op's cost times the op count is a lower
#   bound on that; the average over the real non-matmul ops (attention, norms, RoPE, cache
#   concatenation) is printed too and is larger. In our CPU runs the measured step was 5 to 9 times
#   the prediction: for a model this small, fixed per-op costs and slow small matmuls set the step
#   time, not the bandwidth.
# * On a **GPU** the same small model is even further from its roofline: its weights take microseconds to
#   read at terabytes per second, while each of those hundreds of operations is a kernel launch
#   (`op_overhead` measures one when you run this on a GPU). Launch overhead sets the step time there;
#   CUDA graphs and `torch.compile` (module 12) attack exactly that. For a 7B model the weights are 96%
#   of a decode step's bytes (section 4), so they set the bound:

# %% id="c032"
t7 = min_decode_latency(BIG_MODEL, "A100-80GB", "fp16")
print(f"{big.name} fp16 on an A100 80GB: {big.num_parameters() * 2 / 1e9:.1f} GB of weights / "
      f"{GPUS['A100-80GB'].bandwidth_gbs / 1e3:.3f} TB/s = {t7 * 1e3:.2f} ms per token at best "
      f"(at most {1 / t7:.0f} tokens/s for one sequence)")
assert 6.0e-3 < t7 < 7.5e-3
for g in GPUS.values():
    line = ", ".join(f"{dt} {min_decode_latency(BIG_MODEL, g, dt) * 1e3:5.2f} ms" for dt in ("fp16", "int8", "int4"))
    print(f"{g.name:>10}: {line}")
ratio = min_decode_latency(BIG_MODEL, "T4", "fp16") / min_decode_latency(BIG_MODEL, "H200", "int4")
assert math.isclose(ratio, 4 * 4800 / 320)  # 4x fewer bytes, 15x the bandwidth

# %% [markdown] id="c033"
# Smaller weights are faster weights: int4 reads a quarter of the bytes of fp16, which is why
# quantization (modules 02–03) speeds up decoding even when the arithmetic stays in fp16.
#
# ## 7. Batch size and the ridge point
#
# Decoding `B` sequences together reads each weight matrix once for all of them. For a weight matmul
# `[B, d_in] × [d_in, d_out]` with `a` bytes per element:
#
# $$ I(B) = \frac{2\,B\,d_{in}\,d_{out}}{a\,(B\,d_{in} + d_{in}\,d_{out} + B\,d_{out})} $$
#
# It grows almost linearly with `B` while the weights dominate the traffic. Setting `I(B) = P/W` (the
# ridge) and solving gives the batch `B*` where decoding turns compute-bound:
#
# $$ B^* = \frac{R\,a\,d_{in}\,d_{out}}{2\,d_{in}\,d_{out} - R\,a\,(d_{in} + d_{out})}, \qquad R = P/W. $$
#
# For large matrices `B* ≈ R·a/2`: in fp16, about the ridge point itself. This is the reason servers batch
# decode steps, and why at large batch the KV cache's traffic, which batching does not share, takes over
# [@pope2023efficiently].

# %% id="c034"
print(f"{'GPU':>10}  {'ridge fp16':>10}  {'B* 4096x4096':>12}  {'B* ' + big.name + ' step':>22}")
for g in GPUS.values():
    R = ridge_point(g)
    b_sq = critical_batch(4096, 4096, g, "fp16")
    b_model = decode_critical_batch(big, g, "fp16")
    print(f"{g.name:>10}  {R:10.0f}  {b_sq:12.0f}  {b_model:22.0f}")
    assert R < b_sq < 1.3 * R and R < b_model < 1.3 * R
b = decode_critical_batch(big, "A100-80GB")
t_lo = intensity_table(big, "decode", 16, batch=math.floor(b))
t_hi = intensity_table(big, "decode", 16, batch=math.ceil(b))
mm_int = lambda t: sum(r.flops * r.count for r in t if r.kind == "matmul") / sum(r.bytes * r.count for r in t if r.kind == "matmul")  # noqa: E731
assert mm_int(t_lo) < ridge_point("A100-80GB") <= mm_int(t_hi)
print(f"A100 80GB: the weight matmuls of a decode step are memory-bound up to batch {math.floor(b)}, "
      f"compute-bound from batch {math.ceil(b)}")

# %% id="c035"
plot_decode_batch(big, ["T4", "L4", "A100-80GB", "H100-SXM", "H200", "B200", "MI300X"], "fp16")
plt.show()

# %% [markdown] id="c036"
# Two limits to that free lunch, both computed below: attention over the KV cache does **not** get more
# intense with the batch (each sequence reads its own keys and values), and the KV cache of all those
# sequences has to fit in memory.

# %% id="c037"
d1 = intensity_table(big, "decode", BIG_SEQ, batch=1)
d64 = intensity_table(big, "decode", BIG_SEQ, batch=64)
print(f"QK^T intensity: batch 1 {d1['qk'].intensity:.3f}, batch 64 {d64['qk'].intensity:.3f} FLOP/byte; "
      f"q_proj: {d1['q_proj'].intensity:.2f} -> {d64['q_proj'].intensity:.1f}")
assert math.isclose(d1["qk"].intensity, d64["qk"].intensity, rel_tol=1e-9)
assert d64["q_proj"].intensity > 50 * d1["q_proj"].intensity
kv64 = big.kv_cache_bytes(BIG_SEQ + 1, 64, bytes_per_element=2)   # fp16
print(f"KV cache of 64 x {BIG_SEQ} tokens: {kv64 / 1e9:.1f} GB (weights {big.num_parameters() * 2 / 1e9:.1f} GB); "
      f"that step is {d64.kv_bytes() / d64.bytes:.0%} KV-cache traffic")
assert d64.kv_bytes() > d64.weight_bytes()

# %% [markdown] id="c038"
# On this machine: decode steps (one-token forwards through a KV cache of `DECODE_CONTEXT` tokens) with
# growing batches. The time per step grows much more slowly than the batch, so the tokens per second
# grow (the claim below checks it on this run). The roofline bound is printed next to each measurement,
# with this machine's ridge point and the batch where the bundled model's decode would turn compute-bound
# on it.

# %% id="c039"
ctx = DECODE_CONTEXT
batch_steps = compare({f"batch {B}": decode_step_call(model, context=ctx, batch=B) for B in BATCHES},
                      warmup=2, repeats=REPEATS, device=dev)   # interleaved, each by its fastest run
meas = [batch_steps.time(f"batch {B}") for B in BATCHES]
pred = [analyze(intensity_table(cfg, "decode", ctx, batch=B, dtype=dtype_local), local, pdt).time for B in BATCHES]
for B, m, p in zip(BATCHES, meas, pred):
    print(f"batch {B:4d}: measured {m * 1e3:7.2f} ms/step = {B / m:8.0f} tokens/s; roofline {p * 1e3:7.3f} ms/step")
print(f"this machine's ridge: {local.ridge_point(pdt):.1f} FLOP/byte -> B* for the bundled model "
      f"{decode_critical_batch(cfg, local, pdt):.1f}")
timing_claim(f"batching raises decode throughput: batch {BATCHES[-1]} decodes over twice the tokens/s of batch "
             f"{BATCHES[0]}", held=BATCHES[-1] / meas[-1] > 2 * BATCHES[0] / meas[0],
             measured=", ".join(f"batch {B} {B / m:.0f} tokens/s" for B, m in zip(BATCHES, meas))
                      + f"; {batch_steps.note()}")

fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(BATCHES, [B / m for B, m in zip(BATCHES, meas)], "o-", label="measured")
ax.loglog(BATCHES, [B / p for B, p in zip(BATCHES, pred)], "s--", label="roofline bound")
ax.set_xlabel("batch size")
ax.set_ylabel("decoded tokens / s")
ax.set_title(f"bundled model, decode after {ctx} tokens, {local.name[:40]}")
ax.legend()
plt.show()

# %% [markdown] id="c040"
# ## 8. Explore
#
# Pick a GPU (or this machine), a number format, a batch size and a sequence length: the explorer
# shows the ridge point, the roofline bound on a prefill and on a decode step of Llama-2-7B, whether
# decode is memory- or compute-bound, the batch size where it turns compute-bound, and whether weights
# plus KV cache fit in the GPU's memory. (It works with ipywidgets 7 and 8; its logic is the plain
# Python class `RooflineExplorer`, so we can also drive it from code, as the asserts below do.)

# %% id="c041"
explorer = RooflineExplorer(BIG_MODEL, devices=[local], gpu="A100-80GB", dtype="fp16", batch=1, seq_len=BIG_SEQ)
explorer

# %% id="c042"
explorer.plot = False   # drive the logic from code without redrawing at every step
r1 = dict(explorer.result)
explorer.gpu.value = "H200"
assert explorer.result["decode_time"] < r1["decode_time"]     # more bandwidth, faster decode
explorer.batch.value = 128
assert explorer.result["decode_tokens_per_s"] > 20 * r1["decode_tokens_per_s"]
explorer.gpu.value = "T4"
explorer.dtype.value = "bf16"
assert not explorer.result["ok"]                                # a T4 has no bf16 tensor cores
print(explorer.result["message"])
explorer.dtype.value = "fp16"
explorer.gpu.value, explorer.batch.value = "A100-80GB", 1     # back to where we started
explorer.plot = True
explorer.update()

# %% [markdown] id="c043"
# ## Summary
#
# * Prefill multiplies each weight by a block of `L` rows; decode by one row per sequence. Per token,
#   prefill was measured much cheaper than decode on this machine (section 1).
# * The simplified per-operation tables are reproduced exactly; in real units (FLOPs, bytes) they need a factor
#   2 on the work and the element size on the traffic, which cancel only in fp16; the score scale is
#   `1/√(head dim)`.
# * A real Llama layer's FLOPs, counted op by op, equal PyTorch's own FLOP counter exactly.
# * All ops of a batch-1 decode step are memory-bound on every GPU of the table; the bound is the
#   weights' bytes over the bandwidth (about 6.6 ms per token for a 7B model in fp16 on an A100 80GB).
# * Batching decode raises the intensity of the weight matmuls roughly in proportion to the batch,
#   until it reaches the ridge point, at a batch a little above the ridge itself in fp16 (for
#   Llama-2-7B from about 160 sequences on an A100 80GB to about 480 on an L4, section 7), but not the
#   intensity of attention over the KV cache, whose traffic then dominates.
#
# Next: module 02 shrinks the bytes (quantization), module 05 manages the KV cache.

# %% id="c044"
print(f"decode / prefill cost per token here: {t_decode / (t_prefill / SEQ_LEN):.1f}x; "
      f"7B fp16 on A100 80GB: >= {t7 * 1e3:.2f} ms/token; "
      f"decode turns compute-bound at batch {decode_critical_batch(big, 'A100-80GB'):.0f} on an A100 "
      f"and {decode_critical_batch(big, 'H100-SXM'):.0f} on an H100 (fp16)")

# %% [markdown] id="further-reading"
# ## Further reading
#
# Used in this notebook:
#
# * *Roofline: An Insightful Visual Performance Model for Multicore Architectures* [@williams2009roofline]:
#   the roofline, `min(peak, intensity × bandwidth)`, and its ridge point (section 5).
# * *Attention Is All You Need* [@vaswani2017attention]: the transformer layer the tables describe and its
#   `1/√(head dim)` score scale (section 3).
# * *Llama 2* [@touvron2023llama]: the 7B model whose sizes the tables and rooflines use.
# * *Efficiently Scaling Transformer Inference* [@pope2023efficiently]: decode as a memory-bound step that
#   batching amortizes, and the KV cache's traffic at large batch (section 7).
#
# To go further:
#
# * *Making Deep Learning Go Brrrr From First Principles* [@he2022brrr]: the same compute / memory /
#   overhead reasoning applied to PyTorch programs, with operator fusion as the cure for memory-bound ops.
# * *Data Movement Is All You Need* [@ivanov2021data]: every operator of a transformer layer classified by
#   its intensity as this notebook does, and how much of the time the memory-bound ones take.
