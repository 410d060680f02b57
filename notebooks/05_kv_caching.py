# %% [markdown] id="c002"
# # Module 05 · KV caching
#
# A decoder produces one token per forward pass, and every new token attends to all the tokens before
# it. The keys and values of those earlier tokens do not change when a token is appended (causal
# attention: a token never looks ahead), so recomputing them at every step is pure waste. A **KV cache**
# keeps them: the prompt is processed once (*prefill*), then each step feeds only the newest token
# (*decode*) and appends its key and value to the cache.
#
# In this notebook, with the course's own Llama-style model (`course_lib.models`) and cache library
# (`course_lib.kvcache`):
#
# 1. build a cache from scratch and check that cached generation gives **exactly** the tokens of
#    recomputation;
# 2. measure the cost of one token as the position grows, with and without the cache;
# 3. derive the memory formula, check it against the real tensors' bytes, and apply it to published models;
# 4. study the variants that shrink the cache: GQA/MQA, sliding windows, attention sinks, heavy hitters
#    (H2O), int8/int4 quantization, a multi-tier cache and a latent (MLA-style) cache, and measure what
#    each one costs in quality on held-out text.
#
# Every number below is computed in this notebook; every claim is an `assert`, except timings: those depend
# on the machine and on what else it is doing, so each is measured interleaved and shown as a claim with this
# run's numbers and their spread (it says so when it did not hold on a run).

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
TIMING_POSITIONS = [16, 64, 160, 320, 480] if QUICK else [16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 504]
TIMING_REPEATS = 5 if QUICK else 15             # timed runs per step; the fastest counts (least disturbed)
GEN_TOKENS = 24 if QUICK else 96            # tokens generated in the end-to-end comparison
QUALITY_TOKENS = 160 if QUICK else 511      # held-out tokens streamed through each cache
QUALITY_TEXTS = 1 if QUICK else 4
BUDGET = 48 if QUICK else 128               # tokens a bounded cache may keep
GQA_FILES = 2 if QUICK else 16              # held-out files scored for the GQA/MQA comparison
GQA_CHARS = 6000 if QUICK else 10**9        # characters kept per file
SINK_TOKENS = 520 if QUICK else 1200        # generated with a sink cache, past the 512-token context
COMPILE_STEPS = 4 if QUICK else 16         # decode steps traced by torch.compile in section 5

# %% id="c004"
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_lib.generation import generate
from course_lib.kvcache import (ContiguousCache, FP8Cache, H2OCache, LatentCache, MultiTierCache, QuantBlock,
                                QuantizedCache, SinkCache, SlidingWindowCache, StaticCache, fit_latent,
                                kv_cache_bytes, kv_table, regroup_kv_heads, rotate_keys, stream_score)
from course_lib.models import flops_per_token, load, preset
from course_lib.models.corpus import load_split
from course_lib.perf.quality import score_texts
from course_lib.perf.claims import timing_claim
from course_lib.perf.tables import format_records
from course_lib.perf.timing import compare

torch.manual_seed(0)
device = course_lib.env.device()
model, tok = load("tiny", device=device)
tok.model_max_length = 10**9        # we cut the texts ourselves; silence the length warning
cfg = model.config
print(f"model {model.name} on {device}: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads, "
      f"{cfg.num_key_value_heads} KV heads of {cfg.head_dim}, context {cfg.max_position_embeddings}, "
      f"{model.num_parameters() / 1e6:.2f}M parameters")


# %% [markdown] id="c005"
# ## 1. Generation without a cache
#
# The baseline re-runs the whole sequence for every new token and keeps only the last position's
# logits. Greedy decoding (take the argmax) makes the output deterministic, so two implementations can be
# compared token for token.

# %% id="c006"
@torch.no_grad()
def greedy_recompute(model, ids, n):
    """n greedy tokens; every step runs the full sequence again."""
    chosen_by = []
    for _ in range(n):
        logits = model(ids)[:, -1]                       # [B, V], all earlier positions recomputed
        chosen_by.append(logits)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(chosen_by, dim=1)


# %% [markdown] id="c007"
# ## 2. A KV cache from scratch
#
# Inside each attention layer the model computes `q, k, v` for the new tokens, rotates `q` and `k` with
# RoPE, and then calls `cache.update(k, v, layer)`. The cache returns the keys and values of **all** the
# tokens so far, shape `[batch, kv_heads, seq, head_dim]`, and attention runs the new queries against
# them. Before the layers run, the model asks `cache.get_seq_length()` to know at which position the new
# tokens start. That is the whole contract; a minimal cache is a list of tensors per layer, grown with
# `torch.cat` along the sequence axis:

# %% id="c008"
class TinyCache:
    def __init__(self):
        self.k, self.v = [], []                          # one [B, K, S, Dh] tensor per layer

    def update(self, k, v, layer):
        if layer == len(self.k):                         # first call for this layer: the prompt
            self.k.append(k)
            self.v.append(v)
        else:                                            # later calls: append along the seq axis
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        return self.k[layer], self.v[layer]

    def get_seq_length(self):
        return self.k[0].shape[2] if self.k else 0


@torch.no_grad()
def greedy_cached(model, ids, n, cache):
    """Prefill once, then one token per step."""
    logits = model(ids, cache=cache)[:, -1]              # prefill: the whole prompt, fills the cache
    chosen_by = []
    for step in range(n):
        chosen_by.append(logits)
        nxt = logits.argmax(-1, keepdim=True)            # [B, 1]
        ids = torch.cat([ids, nxt], dim=1)
        if step < n - 1:
            logits = model(nxt, cache=cache)[:, -1]      # decode: only the new token goes in
    return ids, torch.stack(chosen_by, dim=1)


# %% [markdown] id="c009"
# Cached generation must equal recomputation: the same greedy tokens, and logits equal up to float
# rounding (the two paths add the same numbers in a different order). We check our `TinyCache`, the
# library's `ContiguousCache` and its preallocated `StaticCache`, with batch 1 and batch 2.

# %% id="c010"
g = torch.Generator().manual_seed(0)
for batch in (1, 2):
    prompt = torch.randint(1, cfg.vocab_size, (batch, 12), generator=g).to(device)
    want_ids, want_logits = greedy_recompute(model, prompt, GEN_TOKENS)
    for name, cache in [("TinyCache", TinyCache()), ("ContiguousCache", ContiguousCache()),
                        ("StaticCache", StaticCache.for_model(model, batch, 12 + GEN_TOKENS))]:
        if name == "TinyCache":
            ids, logits = greedy_cached(model, prompt, GEN_TOKENS, cache)
        else:
            out = generate(model, prompt, GEN_TOKENS, cache=cache, return_logits=True)  # the library's loop
            ids = torch.cat([prompt, out.tokens.view(batch, -1).to(device)], dim=1)    # new tokens [n] or [B, n]
            logits = out.logits.view(batch, GEN_TOKENS, -1)
        diff = (logits - want_logits).abs().max().item()
        assert torch.equal(ids, want_ids), f"{name}: different tokens"
        assert diff < 1e-3, f"{name}: logits differ by {diff}"
        print(f"batch {batch}  {name:16s} identical tokens, max |logit difference| = {diff:.1e}")

# %% [markdown] id="c011"
# ## 3. What one token costs, with and without the cache
#
# Without a cache, the step that produces token n+1 runs the model over all n+1 tokens: every linear
# layer processes n+1 rows, and attention compares n+1 queries with up to n+1 keys. With a cache the step
# processes one row, and attention compares one query with n+1 cached keys.
#
# We time one step at several positions. For the cached step we fill a `StaticCache` once and rewind it
# (`crop`) before each timed call, so every call sees exactly n cached tokens (the rewound positions
# still hold the same keys and values, which the step rewrites identically). At each position the two
# steps are timed interleaved (`compare`, Module 00), each by its fastest run. The FLOP counts come from
# the model's configuration (`flops_per_token`, 2 FLOPs per multiply-add).
#
# How much work a step must do before its cost shows depends on the device. On a CPU one sequence is
# enough: the arithmetic is the cost. On a GPU a step of this small model at batch 1 is a few hundred
# kernel launches that take the same time whatever the position (the step is *launch-bound*), so there
# the cell first finds the smallest batch (copies of the same sequence) at which the longest recompute
# step costs clearly more than the shortest, prints it with the device, and times the table at that batch.

# %% id="c012"
L = max(TIMING_POSITIONS) + 1
ids = torch.randint(1, cfg.vocab_size, (1, L), generator=torch.Generator().manual_seed(1)).to(device)


def recompute_step(x, n):
    with torch.no_grad():
        model(x[:, :n + 1])


# The timing batch: 1 on a CPU, where batch 1 already shows the work (the table below measures it); on a
# GPU doubled until the longest recompute step costs over 4x the shortest (until the arithmetic outweighs
# the launches), at most 64: the end-to-end recompute below runs the whole sequence at this batch for
# every token, and at 256 on an H100 shared with other notebooks it ran out of memory.
lo, hi = min(TIMING_POSITIONS), max(TIMING_POSITIONS)
TIMING_BATCH, growth = 1, {}
while device.type != "cpu":
    x = ids.repeat(TIMING_BATCH, 1)
    ends = compare({"lo": lambda: recompute_step(x, lo), "hi": lambda: recompute_step(x, hi)}, warmup=1,
                   repeats=TIMING_REPEATS, device=device)
    growth[TIMING_BATCH] = ends.time("hi") / ends.time("lo")
    if growth[TIMING_BATCH] > 4 or TIMING_BATCH >= 64:
        break
    TIMING_BATCH *= 2
print(f"on {device.type}: " + (", ".join(f"recompute at position {hi} / at position {lo} = {r:.1f}x at batch {b}"
                                          for b, r in growth.items()) or "one sequence shows the work")
      + f"  -> timing batch {TIMING_BATCH}")

ids = ids.repeat(TIMING_BATCH, 1)                        # [TIMING_BATCH, L], the same sequence in every row
static = StaticCache.for_model(model, TIMING_BATCH, L)
with torch.no_grad():
    model(ids[:, :-1], cache=static)                     # all positions cached once


def cached_step(n):
    static.crop(n)                                       # exactly n tokens cached
    with torch.no_grad():
        model(ids[:, n:n + 1], cache=static)


rows, spreads = [], []
for n in sorted(TIMING_POSITIONS, reverse=True):        # longest first: crop() only shortens the cache
    step = compare({"recompute": lambda: recompute_step(ids, n), "cached": lambda: cached_step(n)}, warmup=1,
                   repeats=TIMING_REPEATS, device=device)
    t_full, t_cache = step.time("recompute"), step.time("cached")
    spreads.append(step.spread)
    f_full = sum(flops_per_token(cfg, context=t + 1) for t in range(n + 1))   # per sequence
    f_cache = flops_per_token(cfg, context=n + 1)
    rows.append({"position": n, "recompute ms": 1e3 * t_full, "cached ms": 1e3 * t_cache,
                 "time ratio": t_full / t_cache, "recompute MFLOP": f_full / 1e6, "cached MFLOP": f_cache / 1e6,
                 "FLOP ratio": f_full / f_cache})
rows.sort(key=lambda r: r["position"])
print(format_records(rows))

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
pos = [r["position"] for r in rows]
ax1.plot(pos, [r["recompute ms"] for r in rows], "o-", label="no cache (recompute)")
ax1.plot(pos, [r["cached ms"] for r in rows], "s-", label="KV cache")
ax1.set(xlabel="position of the new token", ylabel="ms per step (fastest of the runs)",
        title=f"measured on {device.type}, batch {TIMING_BATCH}")
ax2.plot(pos, [r["recompute MFLOP"] for r in rows], "o-", label="no cache")
ax2.plot(pos, [r["cached MFLOP"] for r in rows], "s-", label="KV cache")
ax2.set(xlabel="position of the new token", ylabel="MFLOP per token", title="computed from the config")
for ax in (ax1, ax2):
    ax.legend()
plt.tight_layout()
plt.show()

# %% id="c013"
first, last = rows[0], rows[-1]
where = f"on {device.type} at batch {TIMING_BATCH}"
noise = f"fastest of {TIMING_REPEATS} interleaved runs, spread up to {max(spreads):.0%}"
timing_claim(f"the recompute step's cost grows with the position: over 2x from position {first['position']} to "
             f"{last['position']}", held=last["recompute ms"] > 2 * first["recompute ms"],
             measured=f"{first['recompute ms']:.2f} ms and {last['recompute ms']:.2f} ms {where}; {noise}")
timing_claim(f"at position {last['position']} the cached step is over 2x cheaper than recomputing",
             held=last["time ratio"] > 2, measured=f"recompute {last['recompute ms']:.2f} ms, cached "
                                                   f"{last['cached ms']:.2f} ms {where}; {noise}")
timing_claim("the FLOP savings exceed the measured speed-up", held=last["FLOP ratio"] > last["time ratio"],
             measured=f"{last['FLOP ratio']:.0f}x fewer FLOPs, {last['time ratio']:.1f}x less time; {noise}")
linear_share = flops_per_token(cfg, context=0) * (last["position"] + 1) / (last["recompute MFLOP"] * 1e6)
assert linear_share > 0.5, "at this size the linear layers dominate the recompute FLOPs"
assert last["cached MFLOP"] < 1.5 * first["cached MFLOP"], "the cached step's FLOPs grow only through attention"
print(f"linear layers: {linear_share:.0%} of the recompute FLOPs at position {last['position']}")
print(f"{where}, this run: recompute grows {last['recompute ms'] / first['recompute ms']:.1f}x from position "
      f"{first['position']} to {last['position']}; at position {last['position']}: {last['time ratio']:.1f}x "
      f"faster with the cache, {last['FLOP ratio']:.0f}x fewer FLOPs")

# %% [markdown] id="c014"
# > **Claim checked.** Course notes often say the cache turns the per-token cost "from O(n²) into O(n)".
# > More precisely: without a cache, step n costs O(n·d²) in the linear layers plus O(n²·d) in attention;
# > with a cache it costs O(d²) plus O(n·d). In the FLOP column the linear layers dominate at this
# > model's size (d = 256, n ≤ 512), so the recompute cost grows about linearly with n and the cached cost
# > is almost flat. The measured speed-up is far smaller than the FLOP ratio: one-token steps are
# > dominated by fixed costs (reading every weight once, launching each operation), not by arithmetic.
# > That is the memory-bound decode regime of Module 01, and why the cache alone does not make decode fast.
# > On a GPU the fixed cost is so large for this model that at batch 1 even the recompute step hardly
# > grows with the position (the growth printed above); the claim holds once a step has enough work,
# > which is the batch the table was measured at.
#
# End to end, for a whole generation (at the timing batch; where batch 1 was launch-bound, after a long
# prompt, so that the recompute steps are the ones the table shows costing several cached steps):

# %% id="c015"
E2E_PROMPT = 32 if TIMING_BATCH == 1 else L - 1 - GEN_TOKENS
prompt = ids[:, :E2E_PROMPT]                             # [TIMING_BATCH, E2E_PROMPT]
# interleaved, the fastest of 3 runs after a warm-up: the least disturbed by whatever else the machine is doing
e2e = compare({"recompute": lambda: greedy_recompute(model, prompt, GEN_TOKENS),
               "cached": lambda: generate(model, prompt, GEN_TOKENS, cache="contiguous")},
              warmup=1, repeats=3, device=device)
t_rec, t_cac = e2e.time("recompute"), e2e.time("cached")
print(f"on {device.type}, batch {TIMING_BATCH}: {GEN_TOKENS} tokens after a {E2E_PROMPT}-token prompt: "
      f"recompute {t_rec:.2f} s, cached {t_cac:.2f} s ({t_rec / t_cac:.1f}x on this run)")
timing_claim(f"cached generation is faster end to end on {device.type} at batch {TIMING_BATCH}", held=t_cac < t_rec,
             measured=e2e.describe(unit="s"));

# %% [markdown] id="c016"
# ## 4. How much memory the cache takes
#
# Every layer stores one key and one value vector per KV head for every token of every sequence:
#
# $$\text{bytes} = 2 \times \text{layers} \times \text{kv\_heads} \times \text{head\_dim} \times
#   \text{bytes per element} \times \text{tokens} \times \text{batch}$$
#
# (the 2 is K and V). We check it against the bytes of the tensors a real cache holds after generating.

# %% id="c017"
for batch, n_new, dtype in ((1, 20, torch.float32), (3, 7, torch.float32)):
    cache = ContiguousCache()
    prompt = torch.randint(1, cfg.vocab_size, (batch, 9), generator=g).to(device)
    generate(model, prompt, n_new, cache=cache)
    tokens = cache.get_seq_length()
    real = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    formula = kv_cache_bytes(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, tokens, batch,
                             bytes_per_element=torch.finfo(dtype).bits // 8)
    assert real == formula == cfg.kv_cache_bytes(tokens, batch, 4)
    print(f"batch {batch}, {tokens} tokens: tensors hold {real:,} bytes = formula {formula:,}")
per_token = cfg.kv_cache_bytes(1, 1, 4)
print(f"this model: {per_token:,} bytes per token in fp32; its full 512-token context: "
      f"{cfg.kv_cache_bytes(512, 1, 4) / 2**20:.1f} MiB per sequence")

# %% [markdown] id="c018"
# The same formula for published models, in fp16 (2 bytes per element), at a 4096-token context for one
# sequence and for a batch of 8. Llama-2-7B uses multi-head attention (one KV head per query head),
# Llama-3-8B grouped-query attention (8 KV heads for 32 query heads), Falcon-7B multi-query attention
# (a single KV head), DeepSeek-V2 multi-head latent attention (one 512-number latent + a 64-number RoPE
# key per token and layer).

# %% id="c019"
models = ["llama-2-7b", "llama-3-8b", "mistral-7b", "falcon-7b", "llama-2-70b", "deepseek-v2"]
cols = ["model", "attention", "layers", "kv_heads", "head_dim", "KiB/token", "cache GiB", "weights GiB", "cache/weights"]
for batch in (1, 8):
    print(f"--- 4096 tokens, batch {batch}, fp16")
    print(format_records([{k: r[k] for k in cols} for r in kv_table(models, tokens=4096, batch=batch)]))
print("--- long context: 131072 tokens (128K), batch 1, fp16")
long = kv_table(["llama-3.1-8b", "deepseek-v2"], tokens=131072)
mha_like = kv_cache_bytes(32, 32, 128, 131072) / 2**30   # Llama-2-7B's MHA shape at 128K
print(format_records([{k: r[k] for k in cols} for r in long]))
print(f"(the same 8B-class model with MHA, 32 KV heads, would need {mha_like:.0f} GiB)")

# %% id="c020"
L2, L3, FAL = preset("llama-2-7b"), preset("llama-3-8b"), preset("falcon-7b")
assert L2.kv_cache_bytes(4096) == 2 * 2**30                          # 512 KiB/token x 4096 = 2 GiB
assert L2.kv_bytes_per_token() == 4 * L3.kv_bytes_per_token()        # GQA: 32 -> 8 KV heads
assert L2.kv_bytes_per_token() == 64 * FAL.kv_bytes_per_token()      # MQA: 1 head of 64 vs 32 of 128
rows8 = {r["model"]: r for r in kv_table(models, tokens=4096, batch=8)}
assert rows8["Llama-2-7B"]["cache/weights"] > 1                      # the cache outgrows the weights
assert long[0]["cache GiB"] == 16.0 and mha_like == 64.0
print("checked: 2 GiB per 4K-token Llama-2-7B sequence; GQA 4x and MQA 64x smaller per token; at batch 8 "
      "the MHA cache is larger than the model; 16 GiB for one 128K-token Llama-3.1-8B sequence")

# %% [markdown] id="c021"
# Two lessons. The cache, not the weights, limits how many sequences fit on a GPU and how long they can
# be. And the number of KV heads is the strongest lever: everything below trades some quality for less
# of this memory.
#
# ## 5. The static (preallocated) cache
#
# `ContiguousCache` grows with `torch.cat`, which copies the whole layer cache at every step and changes
# tensor addresses. `StaticCache` allocates `[batch, kv_heads, max_len, head_dim]` per layer once and
# writes each token in place; the addresses never change, which is what CUDA graphs and `torch.compile`
# need (Module 12). The price: the whole `max_len` is reserved from the start, whether the sequence uses
# it or not - the waste Module 06 measures and removes with paging.

# %% id="c022"
static = StaticCache.for_model(model, batch=1, max_len=cfg.max_position_embeddings)
ptr = static.k[0].data_ptr()
generate(model, prompt[:1], 20, cache=static)
assert static.k[0].data_ptr() == ptr                                   # written in place
print(f"{static.get_seq_length()} tokens cached: {static.used_nbytes():,} bytes used, "
      f"{static.nbytes():,} bytes reserved ({static.used_nbytes() / static.nbytes():.1%} in use)")
assert static.nbytes() == cfg.kv_cache_bytes(cfg.max_position_embeddings, 1, 4)

# %% [markdown] id="c022b"
# Why fixed addresses and shapes matter: `torch.compile` traces the decode step into a graph and reuses it
# as long as its guards hold (the same shapes, the same Python values read). CUDA graphs go further and
# replay recorded kernels on recorded addresses, so they need one fixed shape. We count the graphs
# dynamo makes for `COMPILE_STEPS` decode steps with `dynamic=False` (fixed shapes, what CUDA graphs
# need). Through `StaticCache` the step has the same shapes at every token (attention reads all `max_len`
# slots, with the unwritten ones masked) and the position is a tensor on the device, not a Python int:
# one graph. Through `ContiguousCache` the keys grow by one each step: a new graph per token, until dynamo
# stops at its recompile limit and runs the step uncompiled. The `eager` backend only traces (seconds
# here); inductor would turn the same graphs into kernels, and `generate(..., compile=True)` does that
# for the static one (Module 12).

# %% id="c022c"
import torch._dynamo
from torch._dynamo.utils import counters


def graphs_for(cache, steps=COMPILE_STEPS):
    """Graphs and graph breaks dynamo makes for `steps` greedy decode steps through `cache`."""
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(model.forward, backend="eager", dynamic=False)
    with torch.no_grad():
        logits = model(prompt[:1], cache=cache)[:, -1]                    # prefill, not compiled
        for _ in range(steps):
            logits = step(logits.argmax(-1, keepdim=True), cache=cache)[:, -1]
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
static_graphs, static_breaks = graphs_for(StaticCache.for_model(model, 1, prompt.shape[1] + COMPILE_STEPS + 1))
growing_graphs, growing_breaks = graphs_for(ContiguousCache())
torch._dynamo.reset()
print(f"{COMPILE_STEPS} decode steps, dynamic=False: StaticCache {static_graphs} graph ({static_breaks} breaks), "
      f"ContiguousCache {growing_graphs} graphs (recompile limit {limit})")
assert static_graphs == 1 and static_breaks == 0
assert growing_graphs >= min(COMPILE_STEPS, limit)

# %% [markdown] id="c023"
# ## 6. Smaller caches
#
# Held-out text for the measurements: Python standard-library files the model never trained on
# (`load_split("heldout")`).

# %% id="c024"
heldout = load_split("heldout")
stream_ids = []
for text in heldout:
    t_ids = [tok.eos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    if len(t_ids) >= QUALITY_TOKENS:
        stream_ids.append(torch.tensor(t_ids[:QUALITY_TOKENS]))
    if len(stream_ids) == QUALITY_TEXTS:
        break
stream_bytes = sum(len(tok.decode(s[1:]).encode("utf-8")) for s in stream_ids)
print(f"{len(stream_ids)} held-out sequences of {QUALITY_TOKENS} tokens ({stream_bytes:,} bytes)")

# %% [markdown] id="c025"
# ### 6.1 GQA and MQA: fewer KV heads
#
# Multi-query attention (MQA) [@shazeer2019fast] gives all query heads one shared K/V head; grouped-query
# attention (GQA) [@ainslie2023gqa] one per group. The cache shrinks by the same factor. Our model has 8 query heads and 2 KV heads. We
# convert it both ways with `regroup_kv_heads`: to 8 KV heads by *repeating* each of the 2 four times (an MHA
# model whose 8 KV heads are 2 groups of 4 identical copies: it computes the same function as before, with
# four times the cache), and to 1 KV head by
# *mean-pooling* the K and V projections of the two groups (what the GQA paper starts from before a short
# re-training; without it, the drop measured here is an upper bound). Quality: bits per byte of held-out
# text (lower is better), scored in 512-token windows.
#
# > **Claim checked.** Course notes list Shazeer (2019) among the KV-caching papers. It is the
# > multi-query attention paper: it takes the KV cache as given (incremental decoding already reuses the
# > keys and values) and makes it smaller by sharing one K/V head, because decode is bound by reading it.

# %% id="c026"
files = [t[:GQA_CHARS] for t in heldout[:GQA_FILES]]
rows = []
for heads in (cfg.num_attention_heads, cfg.num_key_value_heads, 1):
    m = regroup_kv_heads(model, heads)
    bpb = score_texts(m, tok, files, progress=False).bits_per_byte
    rows.append({"KV heads": heads, "kind": {8: "MHA", 2: "GQA (as trained)", 1: "MQA (pooled)"}[heads],
                 "bytes/token": m.config.kv_cache_bytes(1, 1, 4), "bits/byte": bpb})
print(format_records(rows, floatfmt=".4f"))
assert abs(rows[0]["bits/byte"] - rows[1]["bits/byte"]) < 1e-4       # repeating heads changes nothing
assert rows[0]["bytes/token"] == 4 * rows[1]["bytes/token"] == 8 * rows[2]["bytes/token"]
print(f"pooling 2 -> 1 KV heads halves the cache and changes bits/byte by "
      f"{rows[2]['bits/byte'] - rows[1]['bits/byte']:+.4f}")

# %% [markdown] id="c027"
# ### 6.2 Sliding window
#
# Keep only the `W` most recent tokens: a query attends to at most `W` tokens, itself included, and the
# cache never holds more than `W`. The off-by-one matters: after any update the cache holds exactly
# `min(tokens seen, W)` tokens. For a prefill of more than `W` tokens the model needs a *banded* causal mask
# (each query sees its own window), which the cache provides (`cache.attn_mask(T)`).
#
# > **Claim checked.** A common sketch of sliding-window attention slices `key[:, -window:]` once for
# > all queries. That is right for a single decode query but wrong for a prefill: earlier queries would
# > see keys after them and lose keys inside their own window. The check below compares token-by-token
# > decoding through the window cache with one forward pass under the banded mask (the definition).

# %% id="c028"
W = 16
win_ids = stream_ids[0][None, :64].to(device)
cache = SlidingWindowCache(W)
with torch.no_grad():
    streamed = torch.cat([model(win_ids[:, t:t + 1], cache=cache) for t in range(64)], dim=1)
    i, j = torch.arange(64)[:, None], torch.arange(64)[None, :]
    banded = model(win_ids, attn_mask=((j <= i) & (i - j < W)).to(device))
    chunked_cache = SlidingWindowCache(W)
    chunked = torch.cat([model(win_ids[:, a:b], cache=chunked_cache, attn_mask=chunked_cache.attn_mask(b - a, device))
                         for a, b in ((0, 24), (24, 48), (48, 64))], dim=1)      # prefill in chunks
assert (streamed - banded).abs().max() < 1e-3 and (chunked - banded).abs().max() < 1e-3
assert cache.stored_length() == W and cache.get_seq_length() == 64
print(f"window {W}: cache holds {cache.stored_length()} of 64 tokens; streaming and chunked prefill both "
      "equal the banded-mask forward")

# %% [markdown] id="c029"
# With this plain window, keys keep their absolute positions, so the positions keep growing. Our model
# was trained with a 512-token context, and `generate` refuses a request that needs positions beyond it:

# %% id="c030"
try:
    generate(model, prompt[:1], 600, cache=SlidingWindowCache(W))
    raise AssertionError("expected generate to refuse positions past the context")
except ValueError as e:
    print("ValueError:", e)

# %% [markdown] id="c031"
# ### 6.3 Attention sinks (StreamingLLM)
#
# Trained models put a large share of attention on the first few tokens whatever they are ("attention
# sinks" [@xiao2024efficient]); evicting them hurts more than evicting anything else. A sink cache keeps the first `s` tokens
# forever plus a window of recent ones.
#
# **RoPE positions.** Keys reach the cache already rotated by RoPE at their position. To run past the
# context, StreamingLLM gives positions *inside the cache*: sinks at 0..s-1, the window right after, the
# new token last, so no position ever exceeds `s + W`. A cached key must then be moved when it slides
# left. Our choice: the cache undoes the model's rotation once when a key arrives (a rotation by `-p`;
# RoPE rotations compose by adding angles) and stores the un-rotated key; each update rotates the kept
# keys at their current cache index. Each key is rotated exactly twice, so no error piles up, and the
# model only has to take the next position from `get_seq_length()`, which it does by default.

# %% id="c032"
k = torch.randn(1, 2, 5, cfg.head_dim)
p = torch.tensor([3, 10, 77, 200, 511])
assert torch.allclose(rotate_keys(rotate_keys(k, p), -p), k, atol=1e-4)              # undo works
assert torch.allclose(rotate_keys(rotate_keys(k, p), -p + 2), rotate_keys(k, torch.full_like(p, 2)),
                      atol=1e-4)                                                       # move to position 2
sink = SinkCache(window=BUDGET - 4, sinks=4)
long_out = generate(model, prompt[:1, :8], SINK_TOKENS, cache=sink).tokens   # [SINK_TOKENS] new tokens
assert 8 + long_out.shape[0] == 8 + SINK_TOKENS > cfg.max_position_embeddings
assert sink.stored_length() == BUDGET and sink.get_seq_length() < BUDGET
print(f"generated {SINK_TOKENS} tokens (context {cfg.max_position_embeddings}) with a cache of "
      f"{sink.stored_length()} tokens: 4 sinks + {BUDGET - 4} recent; largest position used "
      f"{sink.get_seq_length()}")

# %% [markdown] id="c033"
# ### 6.4 Heavy hitters (H2O)
#
# H2O [@zhang2023h2o] keeps the `recent` newest tokens plus the `heavy` tokens that have received the most attention so
# far (summed over every query since they arrived), separately for each layer and KV head. It needs the
# attention weights, so the contract hands every cache the new tokens' rotated queries too,
# `cache.update(k, v, layer, q=q)` with `q` of shape `[batch, heads, T, head_dim]` (the caches above
# ignore it): the cache computes softmax(q·kᵀ/√d) for the new queries against the keys it returns and
# adds each key's weight to its score. That repeats the attention's work; a real implementation takes the
# weights from the attention kernel. Keys keep absolute positions.

# %% id="c034"
h2o = H2OCache(heavy=BUDGET // 2, recent=BUDGET // 2)
res = stream_score(model, stream_ids[0], h2o)
kept = h2o.layers[0].k.shape[2]
assert kept == BUDGET and all(st.k.shape[2] == BUDGET for st in h2o.layers)
print(f"after {QUALITY_TOKENS} tokens each layer/head keeps {kept}: {BUDGET // 2} heavy hitters + "
      f"{BUDGET // 2} recent")

# %% [markdown] id="c035"
# ### 6.5 Quantized KV: int8 and int4
#
# Store the cache in 8 or 4 bits with a scale and a zero point (min-max, asymmetric). *How* to group
# matters (KIVI [@liu2024kivi]): in trained models a few key **channels** are large for every token, so keys get one
# scale per channel (over a group of tokens), while values have no such structure and get one scale per
# **token**. The newest tokens stay in full precision until a whole group can be quantized, which also
# keeps the most attended-to recent tokens exact.
#
# Why per channel: a planted outlier channel (50x larger, the pattern of real keys) with 4 bits.

# %% id="c036"
kk = torch.randn(1, 1, 32, 32, generator=g)
kk[..., 5] *= 50
blk = QuantBlock.from_kv(kk, kk.clone(), bits=4)        # keys per channel; the same data as "values" per token
k_hat, v_hat = blk.dequantize()
others = [c for c in range(32) if c != 5]
e_chan = (k_hat - kk)[..., others].abs().mean().item()
e_tok = (v_hat - kk)[..., others].abs().mean().item()
print(f"mean error on the normal channels: per-channel scales {e_chan:.3f}, per-token scales {e_tok:.3f}")
assert e_chan * 5 < e_tok

# the bundled model's own keys: how uneven are the channels? (depends on training; printed, not asserted)
ref = ContiguousCache()
with torch.no_grad():
    model(stream_ids[0][None, :128].to(device), cache=ref)
ch = ref.k[2][0, 0].abs().amax(0)
print(f"layer 2, head 0 keys: largest channel max |k| / median channel = {(ch.max() / ch.median()).item():.1f}")

# %% [markdown] id="c037"
# ### 6.6 A multi-tier cache
#
# Generalizing: the newest tokens in full precision, the next ones in int8, everything older in int4
# (a tier can also be bounded, dropping its oldest groups). Groups move down a tier as they age and are
# re-quantized on the way.
#
# > **Claim checked.** Course notes describe a "Multi-tier KV cache (Qwen-2)". Nothing of the kind is
# > documented for Qwen2: its technical report [@yang2024qwen2] describes grouped-query attention and, for
# > long context, Dual Chunk Attention with YaRN, and the Hugging Face Qwen2 code keeps an ordinary,
# > unquantized cache in the model's dtype (with an optional sliding window on some layers). How the cache is stored is the
# > serving engine's choice, not the model's, as with paging (Module 06). The idea comes from research on
# > KV quantization: KIVI [@liu2024kivi] keeps the newest tokens in full precision and the older ones in
# > 2 bits, the two-tier case of the cache below; the third tier (int8 between them) is our
# > generalization. We drop the Qwen-2 label.

# %% id="c038"
tier = MultiTierCache(recent=32, tiers=((64, 8), (None, 4)), group=16)
stream_score(model, stream_ids[0], tier)
fp_n, t8, t4 = tier.tier_lengths()
assert fp_n + t8 + t4 == QUALITY_TOKENS - 1 and 32 <= fp_n < 48 and t8 <= 64
print(f"{QUALITY_TOKENS - 1} tokens: {fp_n} full precision, {t8} int8, {t4} int4; "
      f"{tier.nbytes() / cfg.kv_cache_bytes(QUALITY_TOKENS - 1, 1, 4):.1%} of the fp32 cache")

# %% [markdown] id="c039"
# ### 6.7 A latent (MLA-style) cache
#
# DeepSeek's multi-head latent attention [@deepseekai2024deepseekv2] caches one low-dimensional vector per token and layer and
# rebuilds K and V from it with a learned up-projection (which it folds into the attention matrices;
# RoPE gets a separate small key). Our model was not trained that way, so we fit the best linear
# compression after the fact: principal component analysis of each layer's `[k; v]` (keys before RoPE,
# all KV heads: 2 × 2 × 32 = 128 numbers per token) on training text. The cache stores the top-`r`
# coordinates and re-applies RoPE when it rebuilds the keys. Full rank must be exact; fewer dimensions keep
# less of the variance:

# %% id="c040"
train_texts = load_split("train", max_files=40)
calib = []
for text in train_texts:
    t_ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(t_ids) >= 256:
        calib.append(torch.tensor([tok.eos_token_id] + t_ids[:255]))
    if len(calib) == (4 if QUICK else 16):
        break
proj = fit_latent(model, calib)
full_dim = proj[0].rank
lat = LatentCache(proj, cfg.rope_theta)
with torch.no_grad():
    model(stream_ids[0][None, :128].to(device), cache=lat)
k_rebuilt, _ = lat.kv(0)                                                   # layer 0, rebuilt from the latents
assert (k_rebuilt - ref.k[0]).abs().max() < 1e-3
print(f"full rank {full_dim}: keys rebuilt exactly (max error {(k_rebuilt - ref.k[0]).abs().max():.1e})")
# variance kept per rank, from each layer's projection of the held-out keys/values
for r in (16, 32, 64, 96):
    kept_var = []
    for layer in range(cfg.num_hidden_layers):
        pos = torch.arange(128)
        k0 = rotate_keys(ref.k[layer], -pos)
        xs = torch.cat([k0[0].transpose(0, 1).reshape(128, -1), ref.v[layer][0].transpose(0, 1).reshape(128, -1)], 1)
        xc = xs - proj[layer].mean
        kept_var.append(((xc @ proj[layer].basis[:, :r]).pow(2).sum() / xc.pow(2).sum()).item())
    print(f"rank {r:3d} ({r / full_dim:.0%} of the memory): {sum(kept_var) / len(kept_var):.1%} of the held-out variance kept")

# %% [markdown] id="c041"
# ## 7. Quality and memory, side by side
#
# Each cache is used as in generation: the held-out text is fed one token at a time and every next-token
# prediction sees only what the cache kept (`stream_score`). We report bits per byte (lower is better),
# the change against the full cache, and the cache's memory at the end relative to the full fp32 cache.
# Bounded caches keep `BUDGET` tokens; the quantized caches keep the 16 to 31 newest tokens in full
# precision (groups of 16) and quantize the rest. The FP8 caches store every token as FP8 E4M3 (3 mantissa
# bits, largest value 448 [@micikevicius2022fp8]) times a float32 scale `amax / 448`, with no full-precision
# tokens: one scale per token and KV head (computed from that token's `head_dim` values), or one per layer and
# KV head fixed by the layer's first update (here the first token) and saturating past it. The second is
# *static* like a serving engine's scale, but set from one token where an engine's comes from calibration:
# vLLM's default FP8 cache keeps one `k_scale` and one `v_scale` per attention layer, 1.0 unless a
# checkpoint's calibrated scales (or a one-off estimate at warm-up) replace it, and per-KV-head scales only
# from an offline calibration [@vllm2026quantized]. The first is *dynamic*, and vLLM has it too: its
# `fp8_per_token_head` (and `int8_per_token_head`) cache dtypes store one float32 scale per token **and KV
# head**, for K and for V, each the absmax of that head's `head_dim` values divided by the format's maximum,
# the same grouping as ours, not one scale shared across a token's KV heads (`KVQuantMode` in
# `vllm/v1/kv_cache_interface.py`, whose page size adds 2 × block × KV heads float32 scales, and
# `_reshape_cache_per_token_head` in `vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`, one
# program per (token, KV head); read in November 2026).
# First, a check of the harness itself: streaming through the full cache must give the loss of one
# ordinary forward pass.

# %% id="c042"
with torch.no_grad():
    one_pass = sum(F.cross_entropy(model(s[None, :-1].to(device))[0].float(), s[1:].to(device),
                                   reduction="sum").item() for s in stream_ids)

variants = {
    "full (fp32)": lambda: ContiguousCache(),
    f"sliding window {BUDGET}": lambda: SlidingWindowCache(BUDGET),
    f"sinks 4 + window {BUDGET - 4}": lambda: SinkCache(BUDGET - 4, sinks=4),
    f"H2O {BUDGET // 2} heavy + {BUDGET // 2} recent": lambda: H2OCache(BUDGET // 2, BUDGET // 2),
    "int8 (16 recent fp)": lambda: QuantizedCache(8, residual=16, group=16),
    "int4 (16 recent fp)": lambda: QuantizedCache(4, residual=16, group=16),
    "multi-tier fp/int8/int4": lambda: MultiTierCache(16, ((64, 8), (None, 4)), group=16),
    "fp8 E4M3, per-token scales": lambda: FP8Cache("token"),
    "fp8 E4M3, per-head scales": lambda: FP8Cache("head"),
    "latent r=64 (MLA-style)": lambda: LatentCache(proj, cfg.rope_theta, rank=64),
    "latent r=32 (MLA-style)": lambda: LatentCache(proj, cfg.rope_theta, rank=32),
}
mqa = regroup_kv_heads(model, 1)
full_bytes = cfg.kv_cache_bytes(QUALITY_TOKENS - 1, 1, 4)
table, t0 = [], time.perf_counter()
for name, make in list(variants.items()) + [("MQA (pooled heads), full cache", None)]:
    nll, mem = 0.0, 0
    for s in stream_ids:
        r = stream_score(mqa, s, ContiguousCache()) if make is None else stream_score(model, s, make())
        nll += r.nll_nats
        mem = max(mem, r.final_nbytes)
    table.append({"cache": name, "bits/byte": nll / math.log(2) / stream_bytes, "memory": mem / full_bytes})
base = table[0]["bits/byte"]
for row in table:
    row["change"] = row["bits/byte"] - base
print(format_records([{"cache": r["cache"], "bits/byte": r["bits/byte"], "change": r["change"],
                     "memory vs full": f"{r['memory']:.1%}"} for r in table], floatfmt=".4f"))
print(f"({time.perf_counter() - t0:.0f} s)")

# %% id="c043"
by = {r["cache"]: r for r in table}
assert abs(base - one_pass / math.log(2) / stream_bytes) < 1e-4          # the harness is exact
bounded = [f"sliding window {BUDGET}", f"sinks 4 + window {BUDGET - 4}", f"H2O {BUDGET // 2} heavy + {BUDGET // 2} recent"]
for name in bounded:
    assert abs(by[name]["memory"] - BUDGET / (QUALITY_TOKENS - 1)) < 1e-9  # exactly BUDGET tokens kept
assert by["int4 (16 recent fp)"]["memory"] < by["int8 (16 recent fp)"]["memory"] < 0.5
assert by["latent r=32 (MLA-style)"]["memory"] == 0.25 and by["latent r=64 (MLA-style)"]["memory"] == 0.5
assert by["MQA (pooled heads), full cache"]["memory"] == 0.5
# FP8: 1 byte per element against 4, plus a 4-byte scale per Dh elements (per token) or per layer (per head)
Dh, n_cached = cfg.head_dim, QUALITY_TOKENS - 1
assert by["fp8 E4M3, per-token scales"]["memory"] == (Dh + 4) / (4 * Dh)             # 36/128 = 28.125%
assert by["fp8 E4M3, per-head scales"]["memory"] == (Dh * n_cached + 4) / (4 * Dh * n_cached)
# quality, measured here (bits/byte against fp32): per-token +0.0010 quick, +0.0013 full size; per-head, its
# scale set by the first token, -0.0062 quick and +0.0137 full size: bounds with a margin of 2x or more
assert abs(by["fp8 E4M3, per-token scales"]["change"]) < 0.005
assert abs(by["fp8 E4M3, per-head scales"]["change"]) < 0.03
if not QUICK:   # four 511-token texts: enough text to tell the small differences apart (see below)
    for name in bounded:
        assert by[name]["change"] > 0, f"{name}: {by[name]['change']:+.4f} bits/byte against the full cache"
ranked = sorted(table[1:], key=lambda r: r["change"])
print(f"on this model and text: smallest change {ranked[0]['cache']} ({ranked[0]['change']:+.4f} bits/byte), "
      f"largest {ranked[-1]['cache']} ({ranked[-1]['change']:+.4f})")

# %% [markdown] id="c043b"
# > **Claim checked.** Course notes say that KV-cache optimization (sinks, sliding window, pruning,
# > compression) "reduces memory usage by 20-70%". Measured with the caches above, no constant fits. A
# > bounded cache (window, sinks, H2O) that keeps `B` of `n` tokens saves `1 - B/n` of the cache: nothing
# > while `n <= B`, 70% in the quick run (48 of 159 tokens kept), 75% at full size (128 of 510), and
# > almost all of it far past the budget; it grows with the context without limit. Quantization and fewer
# > dimensions save a fraction fixed by the format (MQA and a rank-64 latent: half; rank 32: three
# > quarters; int8 and int4 less than the bits alone say, because of the scales and the full-precision
# > recent tokens), and the baseline matters: against an fp16 cache, which is what models are served
# > with, a quantized cache saves much less than against our fp32 one. Read as a share of *all* inference
# > memory (weights plus cache), the number moves with batch and context: for Llama-2-7B in fp16 the
# > cache is 2% of it for one 512-token sequence, 14% for one 4096-token sequence and 84% for 32 of them
# > (computed below from the model's shape), so what removing most of the cache saves can be almost
# > nothing or most of the memory.

# %% id="c043c"
n_cached = QUALITY_TOKENS - 1
saves = {r["cache"]: 1 - r["memory"] for r in table[1:]}
print(format_records([{"cache": name, "cache memory saved": f"{s:.1%}"} for name, s in saves.items()]))
for name in bounded:                                   # a budget of B tokens out of n saves 1 - B/n
    assert abs(saves[name] - (1 - BUDGET / n_cached)) < 1e-9
assert saves["latent r=32 (MLA-style)"] == 0.75 and saves["MQA (pooled heads), full cache"] == 0.5
int8_vs_fp16 = 1 - 2 * by["int8 (16 recent fp)"]["memory"]    # the same bytes against half the baseline
print(f"int8 against an fp16 cache instead of our fp32 one: saves {int8_vs_fp16:.1%}, "
      f"not {saves['int8 (16 recent fp)']:.1%}")
for name, bits in (("int8 (16 recent fp)", 8), ("int4 (16 recent fp)", 4)):
    assert by[name]["memory"] > bits / 32, \
        f"{name}: expected more than {bits}/32 of the fp32 cache (scales, recent tokens)"
window = 4096                                          # a bounded cache of 4096 tokens, at growing contexts
print("a 4096-token window saves " + ", ".join(f"{max(0.0, 1 - window / n):.0%} at {n:,} tokens"
                                               for n in (2048, 8192, 32768, 131072)))

# The cache's share of inference memory (fp16 weights + fp16 cache), Llama-2-7B
shares = {}
for batch, tokens in ((1, 512), (1, 4096), (32, 4096)):
    r = kv_table(["llama-2-7b"], tokens=tokens, batch=batch)[0]
    shares[batch, tokens] = r["cache GiB"] / (r["cache GiB"] + r["weights GiB"])
    print(f"Llama-2-7B, batch {batch:2d} x {tokens} tokens: cache {r['cache GiB']:5.2f} GiB + weights "
          f"{r['weights GiB']:.2f} GiB -> the cache is {shares[batch, tokens]:.1%} of the memory")
assert shares[1, 512] < 0.03 and 0.13 < shares[1, 4096] < 0.15 and shares[32, 4096] > 0.83

# %% [markdown] id="c044"
# How to read the table. Memory is exact by construction (asserted above); quality is what this model
# gives on this text, and it depends on the model: a model trained with a sliding window (Mistral 7B, a
# window of 4096 tokens [@jiang2023mistral]) or
# with a latent (DeepSeek) pays far less for it than one converted after the fact, as here. The quantized
# caches keep every token and lose only precision; the bounded ones (window, sinks, H2O) keep a fixed
# number of tokens, so their memory stays flat however long the text is - the property that lets a chat
# run forever - while their quality depends on how much the model needs the evicted tokens. At full size
# (four 511-token texts, a budget of 128 tokens) every bounded cache scores worse than the full one
# (asserted above when `QUICK` is off): the bundled model was trained on windows of its whole 512-token
# context, so what lies beyond the window still helps it predict. The differences are small (hundredths of
# a bit per byte), so the quick run's single 160-token text is too little evidence to order them: there
# a window can come out a few thousandths ahead or behind, depending on the text.
#
# FP8 keeps every token and saves a fraction fixed by the format: 72% of our fp32 cache with a scale per token
# (44% of an fp16 one), 75% with a scale per head (50% of fp16). With a scale per token it costs about a
# thousandth of a bit per byte on this model (asserted under 0.005); in the quick run that is more than int8
# with its 16 exact recent tokens (E4M3 has 3 mantissa bits, int8 256 levels between each token's min and max). A per-head scale fixed by one token saturates the
# larger values that come later; serving engines calibrate a static scale instead (section 7's note): vLLM's
# FP8 cache (`kv_cache_dtype="fp8"`) keeps one scale per K and V tensor of a layer by default, 1.0 unless
# calibrated; `calculate_kv_scales=True` estimates it once during warm-up, and per-head scales need an
# offline calibration with llm-compressor [@vllm2026quantized].
#
# ## Summary
#
# * A KV cache computes each token's keys and values once; cached greedy generation is token-for-token
#   identical to recomputation (checked for three caches, our `TinyCache` and the library's
#   `ContiguousCache` and `StaticCache`, each at batch 1 and batch 2).
# * Per step it removes the work on all earlier positions (the FLOP ratio grows with the position); the
#   measured speed-up is smaller because one-token steps are dominated by fixed costs.
# * Its memory is 2 × layers × kv_heads × head_dim × bytes × tokens × batch - at long context or large
#   batch it exceeds the weights, so the serving engine's memory management (Module 06) matters.
# * Fewer KV heads (GQA/MQA/MLA), fewer tokens (window, sinks, H2O) and fewer bits (int8/int4, FP8, tiers)
#   all shrink it; the table above measures the price of each on held-out text.

# %% [markdown] id="further-reading"
# ## Further reading
#
# Used in this notebook:
#
# * *Fast Transformer Decoding: One Write-Head is All You Need* [@shazeer2019fast]: multi-query attention.
# * *GQA* [@ainslie2023gqa]: grouped-query attention, and mean-pooled KV heads as the start of uptraining.
# * *Efficient Streaming Language Models with Attention Sinks* [@xiao2024efficient]: sinks plus a window, with
#   positions given inside the cache (StreamingLLM).
# * *H2O* [@zhang2023h2o]: keeping the recent tokens and the heavy hitters of accumulated attention.
# * *KIVI* [@liu2024kivi]: keys quantized per channel, values per token.
# * *FP8 Formats for Deep Learning* [@micikevicius2022fp8]: the E4M3 encoding of the FP8 cache (section 7).
# * vLLM's *Quantized KV Cache* documentation [@vllm2026quantized]: how a serving engine scales its FP8 cache.
# * *DeepSeek-V2* [@deepseekai2024deepseekv2]: multi-head latent attention, a learned low-rank cache.
# * *Mistral 7B* [@jiang2023mistral]: a model trained with a sliding window and a rolling-buffer cache.
# * *Qwen2 Technical Report* [@yang2024qwen2]: Qwen2's attention (GQA, Dual Chunk Attention with YaRN),
#   checked against the notes' "multi-tier" label (6.6).
#
# To go further:
#
# * *Efficiently Scaling Transformer Inference* [@pope2023efficiently]: multi-query attention and the KV
#   cache at the scale of a 540B model served on many chips.
# * *Efficient Memory Management for Large Language Model Serving with PagedAttention* [@kwon2023efficient]:
#   once the cache is as small as it will get, how a server hands its memory out (Module 06).
