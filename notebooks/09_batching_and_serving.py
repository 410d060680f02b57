# %% [markdown] id="c002"
# # Module 09 · Batching and serving
#
# Modules 01 and 05 showed that a decode step is memory-bound: it reads every weight once whatever the
# batch size, so serving 32 users at once costs little more than serving one. Batching is how a server
# turns that into throughput. But requests do not come in neat batches: they arrive at random times, with
# prompts of 20 or 2000 tokens, and want 5 or 500 tokens back. *How* the server forms batches decides
# its throughput, its latency, and how many users it keeps within their latency target.
#
# This notebook measures that with a **discrete-event simulator** (`course_lib.serving`), then with a
# real small engine:
#
# 1. workloads: random arrivals (steady and bursty) and long-tailed lengths;
# 2. a step-cost model: how long one engine step takes, calibrated on this machine or predicted from
#    the roofline of Module 01;
# 3. why static batching wastes the GPU (padding and waiting), measured;
# 4. iteration-level (continuous) batching, KV-block admission and preemption;
# 5. latency CDFs, throughput vs offered load, SLOs and goodput;
# 6. chunked prefill and prefill/decode disaggregation;
# 7. an interactive explorer;
# 8. the real engine (paged KV + continuous batching) against static batching, and what the KV cache
#    changes in a simplified continuous-batching sketch of the kind found in tutorials.

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
N_REQUESTS = 150 if QUICK else 800            # requests per simulated workload
RATES = [1, 2, 4, 8, 16, 32] if QUICK else [1, 2, 4, 8, 12, 16, 24, 32, 48]   # offered loads (req/s)
GPU, MODEL = "A100-40GB", "llama-2-7b"         # the simulated server
CALIB_REPEATS = 1 if QUICK else 5             # timing repeats of the local calibration
ENGINE_REQUESTS = 16 if QUICK else 64         # requests served by the real engine

# %% id="c004"
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from course_lib.models import as_config, load
from course_lib.perf import compare, get_gpu, timing_claim
from course_lib.serving import (ChunkedPrefill, ContinuousBatching, Disaggregated, DynamicBatching, StaticBatching,
                                StepCostModel, check_invariants, format_summary, make_workload,
                                max_blocks_used, simulate, sweep_load)
from course_lib.viz.serving import ServingExplorer, plot_latency_cdf, plot_load_sweep, plot_timeline

torch.set_num_threads(1) if QUICK else None
device = course_lib.env.device()
print("device:", device)

# %% [markdown] id="c005"
# ## 1. Workloads
#
# Two things describe a serving workload: **when** requests arrive and **how long** they are.
#
# * Arrivals. Independent users give a *Poisson process*: the gaps between arrivals are exponential,
#   their standard deviation equals their mean (coefficient of variation, CV = 1). Real traffic is
#   **burstier** (a batch job fires 50 requests, a page loads and sends 10): we model it with gamma gaps of
#   the same mean and a CV above 1, i.e. many tiny gaps and a few long silences.
# * Lengths. Prompt and output lengths are long-tailed: most are short, a few are very long. A lognormal
#   (clipped to the context window) captures that; `make_workload(lengths_table=...)` samples an
#   empirical table instead, and `save_trace` / `load_trace` store a workload as JSON lines or CSV so a
#   run can be replayed.

# %% id="c006"
steady = make_workload(N_REQUESTS, rate=8.0, arrival="poisson", seed=0)
bursty = make_workload(N_REQUESTS, rate=8.0, arrival="bursty", cv=3.0, seed=0)


def cv(reqs):
    gaps = np.diff([r.arrival_s for r in reqs])
    return gaps.std() / gaps.mean()


p = np.array([r.prompt_tokens for r in steady])
o = np.array([r.output_tokens for r in steady])
print(f"inter-arrival CV: poisson {cv(steady):.2f}, bursty {cv(bursty):.2f}")
print(f"prompt tokens  p50 {np.median(p):.0f}  p90 {np.percentile(p, 90):.0f}  max {p.max()}")
print(f"output tokens  p50 {np.median(o):.0f}  p90 {np.percentile(o, 90):.0f}  max {o.max()}")
assert cv(bursty) > 1.5 * cv(steady)
assert o.max() > 3 * np.median(o)          # the long tail that static batching will pad to

fig, axes = plt.subplots(1, 2, figsize=(10, 2.8))
for name, reqs in (("poisson", steady), ("bursty (CV 3)", bursty)):
    axes[0].plot([r.arrival_s for r in reqs], np.arange(len(reqs)), label=name)
axes[0].set_xlabel("time (s)"); axes[0].set_ylabel("requests arrived"); axes[0].legend()
axes[1].hist(o, bins=40, color="C1"); axes[1].set_xlabel("output tokens"); axes[1].set_ylabel("requests")
plt.tight_layout(); plt.show()

# %% [markdown] id="c007"
# ## 2. What one engine step costs
#
# The simulator advances in engine **steps** (one forward pass over the batch). A step processes some
# prompt tokens (prefill) and some decoding sequences (one token each), whose attention reads their KV
# caches. `StepCostModel` says how long that takes:
#
# `step = overhead + max(fixed + per_token·n + per_seq·decodes + per_context_token·context, compute_per_token·n)`
#
# Two ways to get the numbers:
#
# * `StepCostModel.from_roofline(gpu, model)`: Module 01's roofline. A step reads all the weights once
#   (`fixed` = weight bytes / bandwidth) and every sequence's KV cache (`per_context_token` = KV bytes per
#   token / bandwidth), and computes 2 × params FLOPs per token (`compute_per_token` = 2 × params / peak).
#   Decode is memory-bound (the first term wins), a big prefill compute-bound (the max flips).
# * `StepCostModel.calibrate_local(model)`: time real steps of the bundled model on *this* machine (a few
#   batch sizes and context lengths, with a KV cache) and fit the linear terms by least squares.

# %% id="c008"
cost = StepCostModel.from_roofline(GPU, MODEL)
shape = as_config(MODEL)
gpu = get_gpu(GPU)
print(cost.source)
print(f"decode, batch 1, 512 cached tokens : {1e3 * cost.decode_time(1, 512):6.2f} ms")
print(f"decode, batch 32, 512 cached tokens: {1e3 * cost.decode_time(32, 512):6.2f} ms")
print(f"prefill of 1024 tokens             : {1e3 * cost.prefill_time(1024):6.2f} ms")
# batching is nearly free for decode: 32 sequences cost far less than 32 single steps
assert cost.decode_time(32, 512) < 4 * cost.decode_time(1, 512)

# the KV pool: what is left of the GPU memory (90% of it) after the fp16 weights, in blocks of 16 tokens
BLOCK = 16
kv_per_block = shape.kv_cache_bytes(BLOCK, 1, bytes_per_element=2)   # fp16
NUM_BLOCKS = int((0.9 * gpu.memory_gb * 1e9 - 2 * shape.num_parameters()) // kv_per_block)
print(f"KV pool: {NUM_BLOCKS} blocks of {BLOCK} tokens = {NUM_BLOCKS * BLOCK} tokens "
      f"({kv_per_block / 2**20:.0f} MiB per block)")

# %% id="c009"
t0 = time.perf_counter()
model, tok = load("tiny", device=device)
local = StepCostModel.calibrate_local(model, repeats=CALIB_REPEATS,
                                      batch_sizes=(1, 4, 8), context_lengths=(32, 160), prefill_lengths=(32, 96, 192))
print(f"calibrated in {time.perf_counter() - t0:.1f} s: {local.source}")
print(f"fixed {1e3 * local.fixed_s:.2f} ms, per token {1e6 * local.per_token_s:.0f} us, "
      f"per sequence {1e6 * local.per_seq_s:.0f} us, per context token {1e9 * local.per_context_token_s:.0f} ns")
print(" kind     batch  tokens  measured ms  fitted ms")
for kind, B, C, t in local.samples:
    fit = local.prefill_time(C) if kind == "prefill" else local.decode_time(B, C)
    print(f" {kind:8s} {B:5d} {C:7d} {1e3 * t:12.2f} {1e3 * fit:10.2f}")

# %% [markdown] id="c010"
# The fit is only as good as the timings on a shared machine, but its shape is the point: the fixed
# part of a step (running through all the layers and weights) is large next to the extra cost of one more
# sequence. That is why batching pays. From here on the simulated server is the 7B model on the GPU above
# (`cost`); the calibrated model of your machine works the same way (`simulate(..., cost=local)`).

# %% [markdown] id="c011"
# ## 3. Why static batching wastes the GPU
#
# **Static batching** (what `model.generate(batch)` does) waits until it has a full batch, pads every
# prompt to the longest one, and runs until the *longest* output is finished; rows that are done keep
# computing padding, and requests that arrive meanwhile wait for the whole batch. **Dynamic batching**
# starts as soon as the engine is free with whatever is waiting, but a batch still runs to its end.
# Both waste compute two ways, which the simulator counts:
#
# * **padding**: the share of computed token slots that belong to no request (`padding_waste`);
# * **waiting**: time a request spends queued before its batch starts (part of its TTFT).

# %% id="c012"
LOAD = 8.0
reqs = make_workload(N_REQUESTS, rate=LOAD, seed=1)
policies = {"static": StaticBatching(max_batch=16, timeout_s=1.0), "dynamic": DynamicBatching(max_batch=16),
            "continuous": ContinuousBatching(max_batch=16)}
runs = {name: simulate(reqs, pol, cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK) for name, pol in policies.items()}
summ = {name: r.summary() for name, r in runs.items()}
for name, r in runs.items():
    assert check_invariants(r, reqs) == []
    print(format_summary(summ[name]))
st, co = summ["static"], summ["continuous"]
print(f"\nstatic batching computes {st['padding_waste']:.0%} padding; continuous {co['padding_waste']:.0%}")
print(f"same batch size 16: continuous serves {co['throughput_tok_s'] / st['throughput_tok_s']:.1f}x the tokens/s "
      f"of static batching at {LOAD:g} req/s")
assert st["padding_waste"] > 0.3 and co["padding_waste"] == 0
assert co["throughput_tok_s"] > 1.5 * st["throughput_tok_s"]
assert co["ttft_p50"] < st["ttft_p50"]

# %% id="c013"
fig, axes = plt.subplots(2, 1, figsize=(10, 9))
t_end = max(r.finish for r in sorted(runs["static"].records, key=lambda r: r.start)[:30])
plot_timeline(runs["static"], ax=axes[0], max_requests=30, t_max=t_end)
plot_timeline(runs["continuous"], ax=axes[1], max_requests=30, t_max=t_end)
plt.tight_layout(); plt.show()

# %% [markdown] id="c014"
# Read the static chart row by row: grey is waiting (for the batch to fill, then for the previous batch
# to end), pink is a finished request whose row still occupies the batch (padding), until the longest
# request in its batch is done. In the continuous chart a request starts as soon as there is room, and
# leaves the moment it is done.
#
# ## 4. Iteration-level scheduling, KV blocks and preemption
#
# **Continuous batching** (Orca's *iteration-level scheduling* [@yu2022orca], vLLM's scheduler
# [@kwon2023efficient]) re-forms the batch at **every step**: finished requests leave, waiting ones join,
# and a prefill can run in the same step as the decodes of the others. No padding, no waiting for stragglers.
#
# What limits admission is KV memory (Module 06). With paged KV, a request holding c tokens needs
# ⌈c / block_size⌉ blocks and gets one more block each time the last one fills. The scheduler
# (`fcfs_schedule`, the reference) does, every step:
#
# 1. **grow**: each running request (oldest first) gets the block its next token needs; if none is
#    free, the **newest** running request is **preempted**: its blocks are freed and it goes back to the
#    **head** of the queue, to be prefilled again later with the tokens it had already generated
#    (*recompute*, as vLLM's current engine does; the box below says what changed there);
# 2. **admit** waiting requests in arrival order (first come, first served: no overtaking) while their
#    prompt's blocks fit and the batch has room.
#
# > **Claim checked: "vLLM can also swap the blocks to CPU memory."** True of vLLM's first engine, not of
# > the current one. The PagedAttention paper describes two ways to evict a request, *swapping* its blocks
# > to CPU memory and *recomputing* them later, and compares their cost [@kwon2023efficient]. vLLM's V0
# > engine kept both (`PreemptionMode.SWAP` and `RECOMPUTE`): recompute by default, swap by default only
# > for requests with several sequences sharing blocks (parallel sampling, beam search: vLLM never
# > implemented recomputing those), or when `--preemption-mode swap` asked for it; `swap_space` set the
# > CPU memory. The V1 engine (vLLM's default since v0.8, 2025; the only engine since v0.11, late 2025,
# > when V0's code was removed) preempts **only by recomputation**: its scheduler pops the last-admitted
# > running request (FCFS), frees its KV blocks, resets its computed-token count to 0 and puts it back at
# > the head of the waiting queue (`_preempt_request` in `vllm/v1/core/sched/scheduler.py`, read in
# > November 2026); V1 refused `--preemption-mode` (it fell back to V0), and `swap_space` is deprecated
# > and ignored. One refinement our simulator leaves out: with prefix caching on (V1's default), the freed
# > full blocks stay in the cache until another request needs the memory, so a resumed request may find
# > part of its prefix still there and recompute less. Offloading KV to CPU memory now lives in KV
# > connectors, for reuse across requests, not in preemption.
#
# Admission does not reserve room for future tokens, so a tight pool over-admits and then preempts. A
# scarce pool shows it:

# %% id="c015"
heavy = make_workload(N_REQUESTS // 2, rate=40.0, seed=2, max_context=2048)
pool = {}
for blocks in (NUM_BLOCKS, 400, 200):
    r = simulate(heavy, ContinuousBatching(max_batch=64), cost=cost, num_blocks=blocks, block_size=BLOCK)
    bad = check_invariants(r, heavy)
    assert bad == [], bad                        # every request done, FCFS kept, no block over-subscribed
    assert max_blocks_used(r) <= blocks
    pool[blocks] = r
    s = r.summary()
    print(f"{blocks:5d} blocks: peak used {max_blocks_used(r):5d}, preemptions {s['preemptions']:4d}, "
          f"throughput {s['throughput_tok_s']:6.0f} tok/s, mean batch {s['mean_batch']:.1f}, e2e p90 {s['e2e_p90']:.1f} s")
assert pool[200].summary()["preemptions"] > 0 and pool[NUM_BLOCKS].summary()["preemptions"] == 0
assert pool[200].summary()["throughput_tok_s"] < pool[NUM_BLOCKS].summary()["throughput_tok_s"]

fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
r = pool[200]
axes[0].step([s.t0 for s in r.steps], [s.blocks_used for s in r.steps], where="post")
axes[0].axhline(200, color="red", ls="--", label="pool")
for t, *_ in r.preemptions:
    axes[0].axvline(t, color="C3", alpha=0.15, lw=0.8)
axes[0].set_xlabel("time (s)"); axes[0].set_ylabel("KV blocks used"); axes[0].legend()
axes[0].set_title("200 blocks: usage (red lines = preemptions)", fontsize=10)
plot_timeline(r, ax=axes[1], max_requests=25)
plt.tight_layout(); plt.show()

# %% [markdown] id="c016"
# Preempted requests (red) lose their KV cache and pay their prefill again, but nothing deadlocks: the
# oldest requests always keep their blocks, so the queue drains. The invariants checked above
# (`check_invariants`) are also the simulator's tests: no step uses more blocks than the pool, every
# request emits exactly its output tokens, first admissions follow arrival order, preempted requests
# resume before any new one starts, time never runs backwards.
#
# ## 5. Latency distributions and offered load
#
# One number per policy hides the story. Users feel the **tail**: the CDF of TTFT (time to first token)
# and end-to-end latency shows the p50 / p90 / p99 together.

# %% id="c017"
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
plot_latency_cdf(runs, "ttft", ax=axes[0])
plot_latency_cdf(runs, "e2e", ax=axes[1])
plt.tight_layout(); plt.show()
for name in runs:
    print(f"{name:10s} TTFT p50 {summ[name]['ttft_p50']:7.2f} s  p99 {summ[name]['ttft_p99']:7.2f} s   "
          f"e2e p99 {summ[name]['e2e_p99']:7.1f} s")

# %% [markdown] id="c018"
# Now sweep the **offered load** (requests per second) for every policy. A policy's throughput grows with
# the load until the server saturates; past that point the queue grows without bound and latency
# explodes. The higher a policy's saturation point, the more users one GPU serves.

# %% id="c019"
SLO = dict(ttft_slo=1.0, tpot_slo=0.05)       # first token within 1 s, then at least 20 tokens/s
sweep_policies = {"static": StaticBatching(16, 1.0), "dynamic": DynamicBatching(16),
                  "continuous": ContinuousBatching(64), "chunked": ChunkedPrefill(64, 512),
                  "disaggregated (2 GPUs)": Disaggregated(1, 1, transfer_s_per_token=shape.kv_cache_bytes(1, 1) / 25e9,
                                                          max_batch=64)}
t0 = time.perf_counter()
rows = sweep_load(lambda rate: make_workload(N_REQUESTS, rate, seed=3), sweep_policies, RATES, cost=cost,
                  num_blocks=NUM_BLOCKS, block_size=BLOCK, **SLO)
print(f"{len(rows)} simulations in {time.perf_counter() - t0:.1f} s")
plot_load_sweep(rows, latency="e2e_p90")
plt.tight_layout(); plt.show()


def at(label, rate, key):
    return next(r[key] for r in rows if r["label"] == label and r["rate"] == rate)


top = RATES[-1]
print(f"at {top} req/s: static {at('static', top, 'throughput_tok_s'):.0f} tok/s, "
      f"continuous {at('continuous', top, 'throughput_tok_s'):.0f} tok/s")
assert at("continuous", top, "throughput_tok_s") > 2 * at("static", top, "throughput_tok_s")

# %% [markdown] id="c019a"
# > **Claim checked: "continuous batching gives 2-10x throughput."** The number is real somewhere, but it
# > is not a property of continuous batching: it is a ratio between two systems on one workload at one
# > load. The papers report their own (against NVIDIA's FasterTransformer, superseded by TensorRT-LLM since
# > 2023 [@nvidia2023fastertransformer]): Orca measured 36.9x FasterTransformer's throughput at the
# > same latency on GPT-3 175B [@yu2022orca]; vLLM 2-4x FasterTransformer's and Orca's at the same latency,
# > more with longer sequences and larger models [@kwon2023efficient], a gain that comes mostly from
# > fitting more sequences into the KV memory, not from the scheduling alone. The cell below measures what
# > the ratio depends on, on our simulated 7B server, continuous against static batching:
# >
# > * **load**: while both policies keep up they serve everything that arrives, throughput equals the
# >   offered load and the ratio is about 1; a saturated server shows the gap (the sweep above). At light
# >   load a long-tailed workload still shows some: one very long output holds a static batch, and the
# >   requests that arrive meanwhile, for many seconds;
# > * **length spread**: static batching pads every request to its batch's longest prompt and output, so
# >   the ratio grows with the spread of the output lengths (lognormal sigma below; 0 = equal outputs);
# > * **batch cap and memory**: with the same cap of 16 the ratio is the padding and waiting saved; letting
# >   the continuous server batch as many requests as its KV pool admits adds the memory effect on top.

# %% id="c019b"
N_RATIO = 150                                           # the simulation is seeded: same numbers in both modes
ratio_rows = []
for sigma in (0.0, 0.8, 1.2):
    for rate in (RATES[0], 40.0):                       # well below and well above saturation
        wl = make_workload(N_RATIO, rate, output_sigma=sigma, seed=5)
        s_st, s_co = (simulate(wl, pol, cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK).summary()
                      for pol in (StaticBatching(16, 1.0), ContinuousBatching(16)))
        ratio_rows.append({"output sigma": sigma, "req/s": rate, "static tok/s": round(s_st["throughput_tok_s"]),
                           "continuous tok/s": round(s_co["throughput_tok_s"]),
                           "ratio": round(s_co["throughput_tok_s"] / s_st["throughput_tok_s"], 2),
                           "note": f"static padding {s_st['padding_waste']:.0%}"})
wl = make_workload(N_RATIO, 40.0, seed=5)
s_st = simulate(wl, StaticBatching(16, 1.0), cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK).summary()
cap_ratio = {}
for cap in (16, 64, 256):
    s_co = simulate(wl, ContinuousBatching(cap), cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK).summary()
    cap_ratio[cap] = s_co["throughput_tok_s"] / s_st["throughput_tok_s"]
    ratio_rows.append({"output sigma": 0.8, "req/s": 40.0, "static tok/s": round(s_st["throughput_tok_s"]),
                       "continuous tok/s": round(s_co["throughput_tok_s"]), "ratio": round(cap_ratio[cap], 2),
                       "note": f"cap {cap}, mean batch {s_co['mean_batch']:.0f}"})
print(" ".join(f"{k:>16s}" for k in ratio_rows[0]))
for r in ratio_rows:
    print(" ".join(f"{str(v):>16s}" for v in list(r.values())[:-1]), " ", r["note"])
low = [r["ratio"] for r in ratio_rows[:6] if r["req/s"] == RATES[0]]
high = [r["ratio"] for r in ratio_rows[:6] if r["req/s"] == 40.0]
print(f"light load: ratios {low}; saturated, same cap 16: {high}; saturated, cap 16/64/256: "
      f"{[round(v, 2) for v in cap_ratio.values()]}")
assert all(lo < hi for lo, hi in zip(low, high))   # for every length spread the gap needs load
assert low[0] < 1.1                                # equal outputs, light load: no gap to speak of
assert high == sorted(high)                        # saturated, it grows with the spread of the outputs
assert cap_ratio[256] > cap_ratio[16]              # a larger batch (KV memory permitting) adds to it

# %% [markdown] id="c019c"
# So on one simulated GPU the same two policies give anything from about 1x (light load, equal lengths)
# to several times (saturated, long-tailed outputs, a large KV pool; the table prints this run's): "2-10x"
# is a range of workloads, not a constant. Quote a speed-up with its baseline, its workload, its load and
# its latency target.

# %% [markdown] id="c020"
# ## 6. SLOs and goodput
#
# A service promises a **service-level objective** (SLO), e.g. "first token within 1 s and at least 20
# tokens/s afterwards" (TTFT ≤ 1 s, TPOT ≤ 50 ms). **Goodput** counts only the requests that met the SLO,
# per second [@zhong2024distserve]. Throughput can keep rising while goodput collapses: the server is busy,
# but with answers that come too late.

# %% id="c021"
print("goodput (req/s meeting TTFT <= 1 s and TPOT <= 50 ms) / offered load")
print("policy                  " + "".join(f"{r:>7g}" for r in RATES))
for label in sweep_policies:
    print(f"{label:24s}" + "".join(f"{at(label, r, 'goodput_req_s'):7.2f}" for r in RATES))
fig, ax = plt.subplots(figsize=(5.5, 3.4))
for label in sweep_policies:
    ax.plot(RATES, [at(label, r, "slo_attainment") for r in RATES], marker="o", label=label)
ax.set_xlabel("offered load (req/s)"); ax.set_ylabel("share of requests meeting the SLO"); ax.legend(fontsize=7)
plt.tight_layout(); plt.show()
best = max(RATES, key=lambda r: at("continuous", r, "goodput_req_s"))
print(f"continuous: goodput peaks at {at('continuous', best, 'goodput_req_s'):.2f} req/s (offered {best}); "
      f"static never exceeds {max(at('static', r, 'goodput_req_s') for r in RATES):.2f} req/s")
assert max(at("continuous", r, "goodput_req_s") for r in RATES) > 3 * max(at("static", r, "goodput_req_s") for r in RATES)
assert all(r["goodput_req_s"] <= r["requests_per_s"] + 1e-9 for r in rows)

# %% [markdown] id="c022"
# ## 7. Chunked prefill
#
# In plain continuous batching a newly admitted prompt is prefilled whole, *in the same step* as everyone
# else's decode. A 3000-token prompt makes that step long, so every decoding user sees a hiccup: the
# time between two of their tokens jumps. **Chunked prefill** gives each step a token budget: first one
# token per decoding request, then prompt chunks with what is left (Sarathi-Serve's stall-free batching
# [@agrawal2024taming]). A long prompt is spread over
# several steps, each of bounded length. The price: that prompt's own first token comes a little later.

# %% id="c023"
long_prompts = make_workload(N_REQUESTS // 2, rate=4.0, seed=4, prompt_median=1500, prompt_sigma=0.6,
                             output_median=64, output_sigma=0.5, max_context=4096)
plain = simulate(long_prompts, ContinuousBatching(64), cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK)
chunk = simulate(long_prompts, ChunkedPrefill(64, token_budget=256), cost=cost, num_blocks=NUM_BLOCKS,
                 block_size=BLOCK)
sp, sc = plain.summary(), chunk.summary()
for s in (sp, sc):
    print(f"{s['policy']:10s} TPOT p50 {1e3 * s['tpot_p50']:6.1f} ms  p99 {1e3 * s['tpot_p99']:6.1f} ms   "
          f"TTFT p50 {1e3 * s['ttft_p50']:6.0f} ms   throughput {s['throughput_tok_s']:.0f} tok/s")
assert sc["tpot_p99"] < sp["tpot_p99"]
longest = max(s.t1 - s.t0 for s in plain.steps), max(s.t1 - s.t0 for s in chunk.steps)
print(f"longest step: {1e3 * longest[0]:.0f} ms unchunked, {1e3 * longest[1]:.0f} ms chunked")
assert longest[1] < longest[0]
plot_latency_cdf({"continuous": plain, "chunked (256)": chunk}, "tpot")
plt.show()

# %% [markdown] id="c024"
# ## 8. Prefill/decode disaggregation
#
# Chunking limits the interference between prefill and decode; **disaggregation** removes it
# [@zhong2024distserve]. One pool of workers only prefills, another only decodes; after its prefill a request's KV cache is shipped to a
# decode worker (here over a 25 GB/s link: the time is proportional to the prompt's KV bytes). Each pool
# can be sized and batched for its own phase (prefill is compute-bound, decode memory-bound). To be fair
# the comparison uses the same two GPUs: disaggregated (1 prefill + 1 decode worker) against two
# independent continuous-batching replicas, each given every other request.

# %% id="c025"
link = 25e9                                   # bytes/s between the GPUs
per_tok = shape.kv_cache_bytes(1, 1) / link
print(f"KV transfer: {shape.kv_cache_bytes(1, 1) / 2**10:.0f} KiB per prompt token -> "
      f"{1e3 * per_tok * 1500:.0f} ms for a 1500-token prompt")
dis = simulate(long_prompts, Disaggregated(1, 1, transfer_s_per_token=per_tok, max_batch=64), cost=cost,
               num_blocks=NUM_BLOCKS, block_size=BLOCK)
assert check_invariants(dis, long_prompts) == []
halves = [simulate(long_prompts[k::2], ContinuousBatching(64), cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK)
          for k in (0, 1)]


def later_gaps(records):
    """Gaps between consecutive tokens from the 2nd token on (the decode phase proper)."""
    return [b - a for r in records for a, b in zip(r.times[1:], r.times[2:])]


def first_gaps(records):
    return [r.times[1] - r.times[0] for r in records if r.n_tokens > 1]


rep_records = [r for h in halves for r in h.records]
for name, recs in (("2 continuous replicas", rep_records), ("disaggregated 1P + 1D", dis.records)):
    print(f"{name:22s}: gap token 1->2 p50 {1e3 * np.median(first_gaps(recs)):5.1f} ms, later gaps p99 "
          f"{1e3 * np.percentile(later_gaps(recs), 99):5.1f} ms, max {1e3 * max(later_gaps(recs)):5.0f} ms; "
          f"TPOT p99 {1e3 * np.percentile([r.tpot for r in recs if r.tpot is not None], 99):5.1f} ms; "
          f"TTFT p50 {1e3 * np.median([r.ttft for r in recs]):4.0f} ms")
assert max(later_gaps(dis.records)) < max(later_gaps(rep_records))          # no prefill stalls the decoders
assert np.median(first_gaps(dis.records)) > np.median(first_gaps(rep_records))   # the KV transfer sits here
assert len(dis.preemptions) == 0

# %% [markdown] id="c026"
# The decode worker never runs a prompt, so once decoding has started its token gaps stay flat: no step
# ever waits for someone else's 3000-token prefill (the mixed replicas' longest gap is that prefill). But
# the KV transfer sits between a request's first and second token, so for a short answer to a long
# prompt it dominates the *mean* TPOT: disaggregation trades the prefill stalls for a transfer, and the
# link speed decides the deal. In production it pays when prompts are long, TPOT targets tight and the
# link fast (NVLink, InfiniBand); for short prompts one mixed pool with chunked prefill is simpler and
# just as good. The next cell makes "the link speed decides" a number.
#
# ### Which link, which prompt length: the crossover
#
# Take the interconnect table of Module 11 (`course_lib.parallel.cost.LINKS`: bandwidth and per-message
# latency) and ship a prompt of P tokens over each link: transfer(P) = latency + P × KV bytes per token /
# bandwidth. Compare the worst gap a token waits under each design (the same two GPUs, as above):
#
# * **mixed replicas**: a decoding request waits for a step that also prefills someone's P-token prompt,
#   `cost.step_time(P, 1, ...)`: the *stall* a prefill causes;
# * **disaggregated**: no step ever holds a prompt, but a request's first gap is its own transfer, plus
#   waiting for the decode step in flight and then its own step: transfer(P) + 2 × decode step.
#
# Both grow linearly in P once the prefill is compute-bound (2 × params / peak seconds per token against
# KV bytes per token / bandwidth), so disaggregation can only win when the link moves a token's KV faster
# than the GPU computes it, bandwidth > KV bytes per token × peak / (2 × params), and then only beyond
# the prompt length where the slope pays back the two decode steps [@zhong2024distserve; @patel2024splitwise].
# A fixed-length workload (40 requests, 32 output tokens) at each prompt length, every link, simulated:

# %% id="c026a"
from course_lib.parallel.cost import LINKS   # the interconnect table of Module 11 (composed here: serving
#                                              takes seconds per token, not a Link)

kv_tok = shape.kv_cache_bytes(1, 1)                  # bytes of KV per token, fp16
DIS_PROMPTS = [256, 1024, 4096]


def transfer_s(P, link):
    return link.latency + P * kv_tok / link.bandwidth


def model_gaps(P, link):
    """Cost model: (worst gap with mixed replicas, worst gap disaggregated), seconds."""
    return cost.step_time(P, 1, 2 * P + 1), transfer_s(P, link) + 2 * cost.decode_time(1, P)


def all_gaps(records):
    return [b - a for r in records for a, b in zip(r.times, r.times[1:])]


print(f"break-even bandwidth: {kv_tok / cost.compute_s_per_token / 1e9:.1f} GB/s "
      f"(KV {kv_tok / 2**10:.0f} KiB/token, prefill {1e6 * cost.compute_s_per_token:.1f} us/token)")
agree = []
for P in DIS_PROMPTS:
    wl = make_workload(40, rate=4.0, seed=5, lengths_table=[(P, 32)], max_context=P + 32)
    reps = [r for k in (0, 1) for r in simulate(wl[k::2], ContinuousBatching(64), cost=cost,
                                                num_blocks=NUM_BLOCKS, block_size=BLOCK).records]
    rep_gap = max(all_gaps(reps))
    print(f"P={P:4d}: 2 replicas worst gap {1e3 * rep_gap:6.1f} ms (model {1e3 * model_gaps(P, LINKS['pcie5'])[0]:5.1f})"
          f", TTFT p50 {1e3 * np.median([r.ttft for r in reps]):4.0f} ms")
    for key, link in LINKS.items():
        d = simulate(wl, Disaggregated(1, 1, transfer_s_per_token=kv_tok / link.bandwidth,
                                       transfer_latency_s=link.latency, max_batch=64, prefill_token_budget=None),
                     cost=cost, num_blocks=NUM_BLOCKS, block_size=BLOCK)
        assert check_invariants(d, wl) == []
        m_rep, m_dis = model_gaps(P, link)
        dis_gap = max(all_gaps(d.records))
        agree.append((m_dis < m_rep) == (dis_gap < rep_gap))
        print(f"   {link.name:24s} transfer {1e3 * transfer_s(P, link):6.1f} ms: disaggregated worst gap "
              f"{1e3 * dis_gap:6.1f} ms (model {1e3 * m_dis:6.1f}), TTFT p50 "
              f"{1e3 * np.median([r.ttft for r in d.records]):4.0f} ms -> {'disagg' if dis_gap < rep_gap else 'replicas'}")


def crossover(link, p_max=16384):
    """Shortest prompt from which the cost model prefers disaggregation over `link` (None: never)."""
    return next((P for P in range(16, p_max + 1, 16) if model_gaps(P, link)[1] < model_gaps(P, link)[0]), None)


for key, link in LINKS.items():
    P = crossover(link)
    print(f"{link.name:24s} {link.bandwidth / 1e9:6.1f} GB/s: disaggregation wins from "
          + (f"P = {P} tokens" if P else "no prompt length up to 16384 tokens"))
assert all(agree)                                         # the cost model's verdict is the simulation's
assert crossover(LINKS["ethernet-10g"]) is None and crossover(LINKS["nvlink4"]) < crossover(LINKS["pcie4"])
assert 256 < crossover(LINKS["nvlink4"]) < 1024 and crossover(LINKS["pcie5"]) < 4096

# %% [markdown] id="c026b"
# The condition, for this model on this GPU: disaggregation beats two mixed replicas on the worst token
# gap (what a TPOT target feels) when **the link is faster than the break-even bandwidth** (KV bytes per
# token × peak / (2 × params): a 10 Gb/s Ethernet never pays, 100 Gb/s sits so close to it that no
# realistic prompt is long enough) **and the prompt
# is longer than the crossover** (a short prompt's prefill rides inside a memory-bound decode step, so it
# stalls nobody, while the transfer and the extra step still cost). TTFT barely moves at this load: the
# prefill itself takes the same time on either side; disaggregation's single prefill worker serves all the
# prompts, twice a replica's share, so at higher load its TTFT is the first to grow, which is why
# DistServe and Splitwise size the two pools separately [@zhong2024distserve; @patel2024splitwise].
#
# ### KV offload: swap or recompute a preempted request
#
# When the KV pool runs out, the scheduler preempts (Section 4). `simulate(..., preemption="swap",
# host_blocks=..., swap_s_per_token=..., swap_latency_s=...)` models vLLM V0's other mode (the box in
# Section 4): the victim's blocks are copied to a host-memory pool over a link and copied back when it
# resumes, each copy added to the step that issues it; `preemption="recompute"` (the default, V1's only
# mode) drops them and prefills prompt + generated tokens again [@kwon2023efficient]. Per preemption of a
# request holding c tokens:
#
# * recompute costs the extra time of a c-token prefill in a step: **nothing** while c × 2 × params / peak
#   fits under the memory-bound decode step, then about c × 2 × params / peak (it grows with the context);
# * swap costs **2 × (latency + c × KV bytes per token / bandwidth)**, out and back, from the first token.
#
# Over PCIe 5 (64 GB/s) the swap's slope is below the recompute's, so swap wins for long contexts and
# recompute for short ones. A burst of 40 requests into a pool that holds only a few of them:

# %% id="c026c"
pcie = LINKS["pcie5"]
swap_kw = dict(swap_s_per_token=kv_tok / pcie.bandwidth, swap_latency_s=pcie.latency)
makespan = {}
for label, (P, O, blocks) in {"short (64 + 192)": (64, 192, 60), "long (1536 + 256)": (1536, 256, 500)}.items():
    wl = make_workload(40, rate=50.0, seed=6, lengths_table=[(P, O)], max_context=P + O)
    c = P + O // 2                                           # a victim's typical context
    m_rec = cost.step_time(c, 1, 2 * c + 1) - cost.decode_time(1, c)
    m_swap = 2 * (pcie.latency + c * kv_tok / pcie.bandwidth)
    runs = {"recompute": simulate(wl, ContinuousBatching(64), cost=cost, num_blocks=blocks, block_size=BLOCK),
            "swap": simulate(wl, ContinuousBatching(64), cost=cost, num_blocks=blocks, block_size=BLOCK,
                             preemption="swap", host_blocks=4 * blocks, **swap_kw)}
    for mode, r in runs.items():
        assert check_invariants(r, wl) == []
        makespan[label, mode] = max(x.finish for x in r.records)
        print(f"{label:18s} {mode:9s}: {len(r.preemptions):3d} preemptions, {len(r.swaps):3d} copies, all served "
              f"in {makespan[label, mode]:6.2f} s, TPOT p50 {1e3 * r.summary()['tpot_p50']:5.1f} ms")
    print(f"{'':18s} model, per preemption of {c} tokens: recompute {1e3 * m_rec:5.1f} ms, swap {1e3 * m_swap:5.1f} ms")
    assert len(runs["swap"].preemptions) == len(runs["recompute"].preemptions) > 0
    assert (m_swap < m_rec) == (makespan[label, "swap"] < makespan[label, "recompute"])   # model and simulation agree
assert makespan["short (64 + 192)", "recompute"] < makespan["short (64 + 192)", "swap"]
assert makespan["long (1536 + 256)", "swap"] < makespan["long (1536 + 256)", "recompute"]

# %% [markdown] id="c026d"
# What this simulation finds (our model, not a paper's result): with short contexts recompute wins, because
# the re-prefill hides in a memory-bound step and the copies do not; with long contexts swap wins over
# PCIe 5, by the ratio of the slopes (2 × KV bytes / bandwidth against 2 × params / peak per token); over a
# link slower than KV bytes per token × peak / params (about 24 GB/s here: PCIe 4 barely clears it)
# recompute wins at every length. The differences are small next to the preemptions themselves, one reason
# vLLM V1 dropped swapping and spends its effort on not preempting (and on prefix caching, which keeps a
# victim's blocks around when it can).
#
# > **Claim checked: what the PagedAttention paper found about swap and recompute.** Its comparison
# > [@kwon2023efficient, Section 7.3 and Fig. 19] varies the **KV block size**, not the context. Swapping
# > small blocks means many small CPU-GPU copies that do not use the PCIe bandwidth well, so swapping is
# > slow with small blocks; recomputation never touches the blocks, so its cost does not depend on the block
# > size. Recompute is the faster of the two for small blocks and swap for large ones, and for the middle
# > sizes, 16 to 64 tokens per block (vLLM's default is 16), the two perform about the same end to end.
# > Our simulator charges one link latency per copy of a whole request, so the block size never enters its
# > swap cost: the paper's effect would need a cost per block copied, which the model above does not have.
# > The context-length crossover above is a separate effect, and ours.
#
# > **Claim checked: the notes' model labels.** The lecture notes file the techniques of this notebook
# > under models: "Iteration-level Scheduling (DeepSeek)", "Dynamic Batching with Optimized Kernels
# > (GPT-oss)", "Hybrid Approach with Prefill-Decode Separation (Qwen-2)", "PagedAttention (Llama 3 via
# > vLLM)". None is a property of a model, and the notes give no source for the pairings. Iteration-level
# > scheduling is Orca's (2022) [@yu2022orca], paged KV memory vLLM's (2023) [@kwon2023efficient],
# > chunked prefill and disaggregation are serving-system designs [@agrawal2024taming; @zhong2024distserve];
# > all of them live in the serving engine (vLLM, SGLang, TensorRT-LLM; TGI, archived in March 2026
# > [@huggingface2025text]) and serve any decoder, as this
# > notebook's simulator and engine serve ours. The same holds for "block-based KV cache (Llama 3)"
# > (Module 06).
#
# ## 9. Explore
#
# Pick a policy, the offered load and the KV budget; the explorer re-runs the simulation, redraws the
# timeline and prints the metrics. Things to try: static vs continuous at 30 req/s; continuous with 64
# blocks (preemptions); chunked vs continuous.

# %% id="c027"
explorer = ServingExplorer(num_requests=40, rate=8.0, num_blocks=800, cost=cost)
explorer.policy.value = "static"                      # what a click does
assert explorer.state.result.policy == "static"
explorer.policy.value = "continuous"
explorer

# %% [markdown] id="c028"
# ## 10. The real engine
#
# `course_lib.serving.Engine` is a small real server: paged KV memory (Module 06), the FCFS scheduler with
# preemption by recompute, chunked prompts, one batched forward per step (`request.py`, `scheduler.py` and
# `engine.py` in `course_lib/serving/`: the request state, the policy, the loop). Below it serves the same
# workload as our static batching (fixed groups, left padding, a contiguous KV cache, each group runs
# until its longest request ends), both greedy, so their outputs must agree token for token.
#
# > **Claim checked.** A "simplified continuous batching" sketch of the kind found in tutorials concatenates each request's
# > prompt and generated tokens, pads them into one batch and runs the **whole sequence** through the model
# > at every step, keeping no KV cache: every step recomputes every earlier token, so a step costs
# > O(length) tokens of work instead of 1 per request (Module 05). Its padding is on the right with no
# > attention mask, and it reads `logits[i, -1]`: for every row shorter than the longest that is the
# > logit at a padding position, not after the row's last real token. Both are measured below.

# %% id="c029"
g = torch.Generator().manual_seed(0)
V = model.config.vocab_size
short = torch.randint(1, V, (1, 12), generator=g).to(device)
longer = torch.randint(1, V, (1, 20), generator=g).to(device)
padded = torch.cat([short, torch.zeros(1, 8, dtype=torch.long, device=device)], 1)   # right padding (pad_sequence)
with torch.inference_mode():
    batch_logits = model(torch.cat([padded, longer]))
    alone = model(short)[0, -1]
wrong = (batch_logits[0, -1] - alone).abs().max().item()
right = (batch_logits[0, 11] - alone).abs().max().item()
print(f"row 0: logits[i, -1] differs from the unpadded run by {wrong:.2f}; logits[i, len-1] by {right:.1e}")
assert wrong > 1e-2 and right < 1e-3

# what the KV cache changes: one step of the sketch (full padded batch) vs one cached decode step
from course_lib.kvcache import ContiguousCache
B, L = 8, 160
ids = torch.randint(1, V, (B, L), generator=g).to(device)
with torch.inference_mode():
    cache = ContiguousCache()
    model(ids[:, :-1], cache=cache)


def sketch_step():
    model(ids)                                 # recompute all L tokens of all B rows


def cached_step():
    model(ids[:, -1:], cache=cache)            # one new token per row
    cache.crop(L - 1)


with torch.inference_mode():   # interleaved, each by its fastest run (Module 00)
    steps = compare({"the sketch's step": sketch_step, "a cached decode step": cached_step}, warmup=1, repeats=3,
                    device=device)
t_sketch, t_cached = steps.time("the sketch's step"), steps.time("a cached decode step")
print(f"batch {B}, {L} tokens: the sketch's step {1e3 * t_sketch:.1f} ms, a cached decode step {1e3 * t_cached:.1f} ms "
      f"({t_sketch / t_cached:.1f}x on this run), processing {B * L} vs {B} tokens")
timing_claim("a cached decode step costs less than the sketch's step, which recomputes every token",
             held=t_cached < t_sketch, measured=f"batch {B}, {L} tokens: {steps.describe()}");

# %% id="c030"
from course_lib.serving import compare_with_static, synthetic_workload

workload = synthetic_workload(ENGINE_REQUESTS, seed=0, prompt_range=(8, 96), output_range=(4, 48), output_median=16)
t0 = time.perf_counter()
table = compare_with_static(model, workload, batch_size=8, max_batch=16)   # asserts the greedy outputs agree
print(f"served {ENGINE_REQUESTS} requests twice in {time.perf_counter() - t0:.1f} s ({device}, this run)")
print(f"{'system':24s} {'tokens/s':>9s} {'p50 latency s':>14s} {'p90 latency s':>14s} {'speedup':>8s}")
for r in table:
    print(f"{r['system']:24s} {r['tokens_per_s']:9.1f} {r['p50_latency_s']:14.3f} {r['p90_latency_s']:14.3f} {r['speedup']:8.2f}")
assert table[0]["tokens"] == table[1]["tokens"] == sum(r.output_tokens for r in workload)

# %% [markdown] id="c030a"
# ### The engine runs the simulator's policy
#
# The engine does not hold a scheduling rule of its own: every step it shows its queue and its batch to a
# **policy** with the hook of section 4 (`policy(waiting, running, free_blocks, block_size, max_batch) ->
# Decision`), then carries the decision out on its paged cache. Its default is `fcfs_schedule` with a small
# watermark of free blocks; the policy you write in Lab 09 can drive it. Below, a tight pool (preemptions
# happen) served by the default and by a cautious policy that admits at most one request per step: the
# greedy outputs agree token for token, the steps and preemptions do not.

# %% id="c030b"
from course_lib.serving import Decision, Engine, SamplingParams, fcfs_schedule
from course_lib.serving.compare import as_workload


def one_admission_per_step(waiting, running, free_blocks, block_size, max_batch):
    d = fcfs_schedule(waiting, running, free_blocks, block_size, max_batch)
    return Decision(preempt=d.preempt, admit=d.admit[:1])


def serve(policy):
    eng = Engine(model, num_blocks=24, block_size=8, max_batch=8, policy=policy)
    ids = [eng.add_request(prompt, SamplingParams(max_new_tokens=n)) for _, prompt, n in as_workload(workload[:12], V)]
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
    return [eng.output(i).token_ids for i in ids], steps, eng.num_preemptions


runs = {"fcfs_schedule (default)": serve(None), "one admission per step": serve(one_admission_per_step)}
for name, (_, steps, pre) in runs.items():
    print(f"{name:24s} {steps:4d} steps, {pre:3d} preemptions")
outs = [r[0] for r in runs.values()]
same = sum(a == b for a, b in zip(*outs)) / len(outs[0])
print(f"requests with the same greedy tokens under both policies: {same:.0%}")
# a policy changes when requests run, never what they generate; on a CPU token for token, on a GPU up to a
# float near-tie (other batches run other kernels, as Module 09's engine tests allow)
assert same == 1.0 if device.type == "cpu" else same >= 0.9

# %% [markdown] id="c031"
# On a GPU the engine's advantage grows with the batch (a decode step costs about the same for 1 or 16
# rows); on a CPU a step's cost grows with the rows, so the gain is mostly the padding and the waiting
# that static groups carry, as in the simulator. Timings on a shared machine vary from run to run: read
# the ratio, not the absolute numbers, and run `bench/serving.py` for a full measurement.
#
# ## Summary
#
# * Static batching pads to the longest prompt and output and makes requests wait for full batches; on a
#   long-tailed workload most of its compute is padding (measured above).
# * Iteration-level scheduling re-forms the batch every step; KV blocks limit admission; when they run
#   out, the newest request is preempted and recomputed, and the run still completes.
# * Judge a policy by its tail latency and its goodput under an SLO, across offered loads, not by its
#   peak throughput.
# * Chunked prefill bounds step time and so the decode hiccups; disaggregation removes prefill from the
#   decode workers at the price of a KV transfer.

# %% [markdown] id="c032"
# ## Further reading
#
# Used in this notebook:
#
# * [@yu2022orca]: iteration-level scheduling and selective batching (continuous batching).
# * [@kwon2023efficient]: PagedAttention and vLLM; KV blocks, admission, preemption by swap or recompute.
# * [@agrawal2024taming]: chunked prefill with a token budget per step (Sarathi-Serve).
# * [@zhong2024distserve]: prefill/decode disaggregation and goodput under TTFT and TPOT targets.
#
# To go further:
#
# * [@patel2024splitwise]: disaggregation sized by the phases' different compute and power needs.
# * vLLM's V1 scheduler, `vllm/v1/core/sched/scheduler.py` in the vLLM repository: what `fcfs_schedule`
#   does, plus prefix caching, speculative tokens and KV connectors.
