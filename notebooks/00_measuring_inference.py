# %% [markdown] id="c002"
# # Module 00 · Measuring inference
#
# Every later module of this course claims that something makes inference faster, smaller or
# cheaper. Before we believe any of it we need to *measure*, and measuring inference has traps:
# the first call is not like the others, a GPU runs asynchronously, one number hides the slow
# requests, and "tokens per second" means three different things depending on who says it.
#
# In this notebook you will:
#
# 1. check what your machine can do and meet the course's models (the **model zoo**);
# 2. time a model call **properly** (warm-up, synchronization, medians) and see why the first call is slow;
# 3. generate text and measure **TTFT**, **TPOT**, end-to-end latency and **tokens/s** from per-token timestamps;
# 4. summarize many requests with **p50 / p90 / p99**;
# 5. turn throughput into **cost per 1M tokens**;
# 6. account for **memory**, and check a claim often repeated in course notes and tutorials: *"no_grad reduces memory usage by ~30–50%"*;
# 7. see how **temperature, top-k and top-p** shape the distribution a token is drawn from (lab 00 asks you
#    to write them).
#
# Everything runs on a laptop CPU in a minute or two; on a GPU, the same cells measure the GPU.

# %% id="c003" tags=["parameters"]
import course_lib.env

import torch

QUICK = course_lib.env.quick()  # True under the tests (COURSE_QUICK=1): small sizes
SMALL = QUICK or not torch.cuda.is_available()  # a CPU uses the small sizes too (the full ones take many minutes)
PROMPT_TOKENS = 32 if SMALL else 128      # prompt length of the single measured generation
NEW_TOKENS = 24 if SMALL else 128         # tokens it generates
PLOT_NEW_TOKENS = 96 if SMALL else 256    # a longer generation for the per-token latency plot
N_REQUESTS = 10 if SMALL else 64          # requests in the percentile experiment
MAX_REQUEST_TOKENS = 16 if SMALL else 96  # longest output of those requests
REPEATS = 7 if SMALL else 30              # timed repeats per benchmark
PREFILL_LENGTHS = [16, 64, 160] if SMALL else [16, 64, 128, 256, 448]
GRAD_LENGTHS = [16, 64, 256] if SMALL else [16, 64, 128, 256, 512]
PRICE_PER_HOUR = 2.00  # $/hour of the machine you would rent: an ASSUMPTION, put in your own price
SEED = 0

# %% id="c004"
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from course_lib import env
from course_lib.generation import generate
from course_lib.models import HUB, LlamaConfig, load, names
from course_lib.perf import metrics as M
from course_lib.perf.memory import (autograd_saved_bytes, format_bytes, model_weight_bytes, parameter_bytes,
                                    peak_memory)
from course_lib.perf.claims import timing_claim
from course_lib.perf.timing import benchmark, compare

torch.manual_seed(SEED)
rng = np.random.default_rng(SEED)
DEVICE = env.device()
ON_GPU = DEVICE.type == "cuda"
print(f"device: {DEVICE}, quick mode: {QUICK}, small sizes: {SMALL}")

# %% [markdown] id="c005"
# ## 1. Setup check
#
# `course_lib.env.capabilities()` reports what this machine offers: the device, whether bf16 runs in
# hardware (a T4 only *emulates* it), and which optional packages are importable. The `course doctor`
# command prints the same kind of report in a terminal. Every number below depends on this line, so
# write it next to any result you share.

# %% id="c006"
caps = env.capabilities()
for key, value in caps.as_dict().items():
    print(f"{key:>20}: {value}")

# %% [markdown] id="c007"
# ## 2. The model zoo
#
# The course works offline on two small Llama-style models that ship inside `course_lib`
# (a *target* and a much smaller *draft* with the same tokenizer, used together in Module 08), and on
# the SmolLM2 family from the Hugging Face hub when a network is there. Loading is also the first
# thing that takes time, so we time it.

# %% id="c008"
print("registry:", names())
t0 = time.perf_counter()
model, tok = load("tiny", device=DEVICE)
load_s = time.perf_counter() - t0
draft, _ = load("tiny-draft", device=DEVICE)
print(f"loaded 'tiny' in {load_s * 1e3:.0f} ms")

rows = []
for name, m in [("tiny", model), ("tiny-draft", draft)]:
    c = m.config
    rows.append((name, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                 c.vocab_size, c.max_position_embeddings, m.num_parameters(), model_weight_bytes(m)))
    assert m.num_parameters() == c.num_parameters()  # the config's formula counts the real module
print(f"{'model':<12}{'layers':>7}{'hidden':>7}{'heads':>6}{'kv':>4}{'vocab':>7}{'ctx':>6}"
      f"{'params':>12}{'weights':>12}")
for r in rows:
    print(f"{r[0]:<12}{r[1]:>7}{r[2]:>7}{r[3]:>6}{r[4]:>4}{r[5]:>7}{r[6]:>6}{r[7]:>12,}{format_bytes(r[8]):>12}")
ratio_draft = rows[0][7] / rows[1][7]
print(f"the draft has {ratio_draft:.1f}x fewer parameters than the target")

# %% [markdown] id="c009"
# The hub models are far larger. We do not need to download them to know their size: the parameter
# count follows from the architecture in each model's published `config.json`, with the same formula
# `LlamaConfig.num_parameters()` that we just checked against the bundled models.

# %% id="c010"
SMOLLM2_CONFIGS = {  # from HuggingFaceTB/SmolLM2-*/config.json (all tie embeddings, vocab 49152)
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3),
    "smollm2-360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                         num_attention_heads=15, num_key_value_heads=5),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32),
}
hub_params = {}
for name, kw in SMOLLM2_CONFIGS.items():
    cfg = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True, **kw)
    hub_params[name] = cfg.num_parameters()
    print(f"{name:<14} {HUB[name]:<30} {hub_params[name] / 1e6:8.1f} M params, "
          f"{format_bytes(parameter_bytes(hub_params[name], 'fp16'))} in fp16")
# the names are honest: each count is within 1% of the size in the name
for name, nominal in [("smollm2-135m", 135e6), ("smollm2-360m", 360e6), ("smollm2-1.7b", 1.7e9)]:
    assert abs(hub_params[name] / nominal - 1) < 0.01, name
print(f"smollm2-135m is {hub_params['smollm2-135m'] / rows[0][7]:.0f}x the bundled target")

# %% [markdown] id="c011"
# Asking for a hub model works the same way. Without a network (or with `COURSE_OFFLINE=1`), `load`
# says so in one line and hands back the bundled stand-in, so every notebook still runs.

# %% id="c012"
hub_model, _ = load("smollm2-135m", device=DEVICE)
print("got:", hub_model.name, f"({hub_model.num_parameters() / 1e6:.1f} M params)")
del hub_model

# %% [markdown] id="c013"
# ## 3. Timing done right
#
# Three rules, all implemented in `course_lib.perf.timing.benchmark`:
#
# * **Warm up.** The first calls pay one-time costs: lazy initialization, memory the allocator has not
#   reserved yet, kernel selection, and on a GPU the CUDA context and library handles.
# * **Synchronize.** A GPU queues work and returns at once; a clock read without
#   `torch.cuda.synchronize()` (or CUDA events) measures the *launch*, not the work.
# * **Repeat and report the median with its spread** (IQR). The mean is pulled by the occasional
#   slow call (another process, a page fault, a frequency change); the median is not.
#
# First, the cold call. No forward pass has run in this process yet, so the next cell's first call
# is truly the first.

# %% id="c014"
prompt_ids = torch.randint(0, model.config.vocab_size, (1, PROMPT_TOKENS), device=DEVICE)


def forward_ids(ids):
    with torch.inference_mode():
        return model(ids)


def forward():
    return forward_ids(prompt_ids)


call_ms = []
for _ in range(10):
    t0 = time.perf_counter()
    forward()
    env.sync(DEVICE)
    call_ms.append((time.perf_counter() - t0) * 1e3)
warm = benchmark(forward, warmup=3, repeats=REPEATS, device=DEVICE)
cold_ratio = call_ms[0] / (warm.median * 1e3)
print(f"first call: {call_ms[0]:.2f} ms   calls 2-10: {np.median(call_ms[1:]):.2f} ms (median)")
print(f"benchmark:  {warm}")
print(f"the first call took {cold_ratio:.1f}x the warm median")
if cold_ratio < 1.5:
    print("(small here: this machine's one-time costs are of the order of its call-to-call noise)")

fig, ax = plt.subplots(figsize=(6, 2.6))
ax.plot(range(1, 11), call_ms, "o-", label="consecutive calls")
ax.axhline(warm.median * 1e3, color="gray", ls="--", label="warm median")
ax.set(xlabel="call #", ylabel="ms", title=f"forward pass on {DEVICE.type}, {PROMPT_TOKENS} tokens")
if cold_ratio > 10:
    ax.set_yscale("log")  # on a GPU the first call can be orders of magnitude slower
else:
    ax.set_ylim(bottom=0)
ax.legend()
plt.show()

# %% [markdown] id="c015"
# How much slower the first call is depends on the machine: the ratio is printed above. On a CPU, for a
# model this small, it is usually modest. On a GPU the first call also loads kernels lazily and sets up
# the math libraries' handles and workspaces (and the very first CUDA call of a process creates the
# context), so the gap can be much larger: run this notebook on a GPU and compare. Either way, a
# single unwarmed measurement is not a measurement.
#
# The second rule only matters on a GPU. The next cell shows the difference there, and says what it
# would show when there is no GPU.

# %% id="c016"
if ON_GPU:
    big = torch.randn(4096, 4096, device=DEVICE)
    (big @ big).sum().item()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        big @ big
    launch_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    work_ms = (time.perf_counter() - t0) * 1e3
    print(f"10 matmuls 4096x4096: {launch_ms:.2f} ms before synchronizing, {work_ms:.2f} ms after")
    timing_claim("the clock read before synchronizing misses most of the work", held=work_ms > 2 * launch_ms,
                 measured=f"{launch_ms:.2f} ms before synchronize(), {work_ms:.2f} ms after")
else:
    print("No GPU here. On a GPU this cell times 10 large matmuls twice: right after queuing them\n"
          "(a fraction of a millisecond: only the launches) and after torch.cuda.synchronize() (the\n"
          "real work, many milliseconds). On a CPU every operation finishes before it returns.")

# %% id="c017"
print(f"mean {warm.mean * 1e3:.2f} ms, median {warm.median * 1e3:.2f} ms, min {warm.min * 1e3:.2f} ms, "
      f"max {max(warm.times) * 1e3:.2f} ms, IQR {warm.iqr * 1e3:.2f} ms")
assert warm.min <= warm.median <= max(warm.times)

# %% [markdown] id="c018"
# ## 4. One generation, measured
#
# `course_lib.generation.generate` is the simplest possible decoding loop: run the model on the whole
# sequence, take the logits of the last position, pick a token (greedy here), append it, repeat. It
# records a `TokenEvent(index, token_id, time)` when each token is ready on the host and can call
# your `callback` with it, which is how a streaming server would forward tokens to a user.
#
# From these timestamps (`start` = when the request began, `t_0 ... t_{n-1}` = when tokens were ready):
#
# | metric | definition | what it measures |
# |---|---|---|
# | **TTFT** (time to first token) | `t_0 - start` | queueing (none here) + the prefill, whose forward pass yields the first token's logits, + sampling it: how long a user stares at nothing |
# | **TPOT** (time per output token) | `(t_{n-1} - t_0) / (n - 1)` | the mean gap between tokens after the first (= mean inter-token latency) |
# | **E2E latency** | `t_{n-1} - start` | the whole request; `E2E = TTFT + (n-1)·TPOT` |
# | **tokens/s** (per request) | `n / E2E` | what one user sees, prefill included |
# | decode rate | `1 / TPOT` | tokens/s once the first token is out |
#
# TPOT divides by `n - 1`, not `n`: there are `n - 1` gaps between `n` tokens, and the first token's
# time is already TTFT. The prefill *is* the first step: its forward pass over the prompt gives the logits
# of the first new token, so TTFT holds no separate decode step. A server adds the time a request waits in
# its queue (Module 09), and a TTFT measured at the client also holds detokenization and the network.
# These are the names serving systems are judged by: DistServe, for one, gives each request a TTFT target
# for its prefill and a TPOT target for its decode, and counts as *goodput* the requests served within
# both [@zhong2024distserve]. The model we use is a placeholder-sized model: the *text* it writes is not the
# point here, the timings are.

# %% id="c019"
from course_lib.models.corpus import load_split

heldout = load_split("heldout", max_files=4)
heldout_ids = tok("\n".join(heldout[:4]), add_special_tokens=False, verbose=False)["input_ids"]
print(f"{len(heldout_ids):,} held-out tokens to cut prompts from")
prompt = heldout_ids[:PROMPT_TOKENS]

generate(model, prompt, 2)  # warm-up (rule 1)
streamed = []
tokens, trace = generate(model, prompt, NEW_TOKENS, eos_token_id=None,
                         callback=lambda e: streamed.append(f"{e.elapsed * 1e3:7.1f} ms  token {e.index:>2}: "
                                                            f"{tok.decode([e.token_id])!r}"))
print("\n".join(streamed[:4] + ["  ..."] + streamed[-2:]))

# %% id="c020"
m1 = trace.metrics()
print(f"prompt {trace.prompt_tokens} tokens, generated {m1.n_tokens}")
print(f"TTFT          {m1.ttft * 1e3:8.2f} ms")
print(f"TPOT          {m1.tpot * 1e3:8.2f} ms/token")
print(f"E2E latency   {m1.e2e * 1e3:8.2f} ms")
print(f"tokens/s      {m1.tokens_per_second:8.1f}   (per request, prefill included)")
print(f"decode rate   {1 / m1.tpot:8.1f} tokens/s after the first")
assert math.isclose(m1.e2e, m1.ttft + (m1.n_tokens - 1) * m1.tpot, rel_tol=1e-9)
assert math.isclose(m1.tpot, np.mean(trace.inter_token_latencies), rel_tol=1e-9)

# %% [markdown] id="c021"
# ## 5. TTFT vs TPOT
#
# TTFT is dominated by the **prefill**: the model reads the whole prompt before it can say anything,
# so TTFT grows with the prompt. Each later token is one **decode** step. Our loop has no KV cache
# (Module 05 adds one), so every decode step re-reads the whole sequence and is itself a little prefill:
# where compute dominates (a CPU), later tokens cost more than early ones, as checked below.
#
# Comparisons like these are where a busy machine (a browser, a second job, a shared cloud VM) misleads:
# a burst of background load during one measurement and not the other can reverse the result. So the
# candidates are timed **interleaved** (`course_lib.perf.timing.compare`: one call of each per round, in
# rotating order, so a burst hits all of them alike), and each is represented by its **fastest** run, the
# least disturbed. The verdict is shown as a *claim* with the numbers and their spread: a claim that did not
# hold on a run says so instead of stopping the notebook. First, TTFT against prompt length (the time of
# `generate(prompt, 1)`: the prefill and the first token):

# %% id="c022"
prefill = compare({f"{L} tokens": (lambda L=L: generate(model, heldout_ids[:L], 1)) for L in PREFILL_LENGTHS},
                  warmup=1, repeats=3, device=DEVICE)
ttft_ms = [prefill.time(f"{L} tokens") * 1e3 for L in PREFILL_LENGTHS]
for L, t in zip(PREFILL_LENGTHS, ttft_ms):
    print(f"prompt {L:>4} tokens: TTFT {t:7.2f} ms")
longer, growth = PREFILL_LENGTHS[-1] / PREFILL_LENGTHS[0], ttft_ms[-1] / ttft_ms[0]
print(f"{longer:.0f}x the prompt -> {growth:.1f}x the TTFT on this run")
if DEVICE.type == "cpu":  # the work is the cost
    timing_claim("a longer prompt takes longer to prefill", held=ttft_ms[-1] > ttft_ms[0],
                 measured=prefill.describe())
else:
    # On a GPU this small model's prefill is bound by kernel launches at these lengths: the TTFT grows
    # far less than the prompt (Module 01 measures where the arithmetic starts to show).
    timing_claim(f"on {DEVICE.type} the prefill is launch-bound here: {longer:.0f}x the prompt, less than "
                 f"{longer / 2:.0f}x the TTFT", held=growth < longer / 2, measured=prefill.describe())

# %% [markdown] id="c023"
# Now one longer generation, and the latency of every token. The first bar is the TTFT; the others are
# the inter-token latencies. One generation is one run: a burst of background load shows up as a few tall
# bars (or a tall stretch) wherever it happened, so the claim after the plot is measured separately, by
# timing the step that makes an early token against the one that makes the last, interleaved.

# %% id="c024"
short_prompt = heldout_ids[:16]
_, long_trace = generate(model, short_prompt, PLOT_NEW_TOKENS)
itl_ms = np.array(long_trace.inter_token_latencies) * 1e3
per_token_ms = np.concatenate([[long_trace.ttft * 1e3], itl_ms])
q = max(len(itl_ms) // 4, 1)
early, late = np.median(itl_ms[:q]), np.median(itl_ms[-q:])
slope = np.polyfit(np.arange(len(itl_ms)), itl_ms, 1)[0]
print(f"TTFT {per_token_ms[0]:.2f} ms, TPOT {long_trace.tpot * 1e3:.2f} ms")
print(f"this generation: median gap of the first quarter {early:.2f} ms, of the last quarter {late:.2f} ms "
      f"(x{late / early:.2f}); trend {slope * 1e3:+.1f} us per extra token")

fig, ax = plt.subplots(figsize=(7, 3))
ax.bar(np.arange(len(per_token_ms)), per_token_ms, width=1.0, color=["C3"] + ["C0"] * len(itl_ms))
ax.axhline(long_trace.tpot * 1e3, color="k", ls="--", lw=1, label=f"TPOT = {long_trace.tpot * 1e3:.1f} ms")
ax.set(xlabel="output token index (0 = first token: TTFT, in red)", ylabel="latency (ms)",
       title=f"per-token latency, no KV cache, {DEVICE.type}")
ax.legend()
plt.show()
if DEVICE.type == "cpu":
    # on a CPU the work is proportional to the tokens processed, so the growing sequence shows. Without a
    # cache, the step that produces token i is a forward over the prompt and the i tokens before it.
    first_n, last_n = len(short_prompt) + q // 2, len(short_prompt) + PLOT_NEW_TOKENS - 1
    x_first, x_last = (torch.tensor([heldout_ids[:n]], device=DEVICE) for n in (first_n, last_n))
    step = compare({f"an early step ({first_n} tokens)": lambda: forward_ids(x_first),
                    f"the last step ({last_n} tokens)": lambda: forward_ids(x_last)},
                   warmup=1, repeats=REPEATS, device=DEVICE)
    t_first, t_last = step.time(f"an early step ({first_n} tokens)"), step.time(f"the last step ({last_n} tokens)")
    timing_claim("without a cache, a late token costs more than an early one: its step re-reads a longer "
                 "sequence", held=t_last > t_first, measured=step.describe())
else:
    print("(on a GPU this small model is bound by kernel launches, so the growth appears only at "
          "longer contexts)")

# %% [markdown] id="c025"
# ## 6. Many requests: percentiles
#
# One request tells us little about a service. We send `N_REQUESTS` requests with different prompt and
# output lengths (one after another, no queueing: Module 09 adds arrivals and batching) and summarize
# each metric by percentiles. `course_lib.perf.metrics.percentile(values, q)` interpolates linearly
# between sorted values, exactly as `numpy.percentile` does by default.
#
# Read p99 with care: with only a few dozen requests, p99 is essentially the slowest request.
# For tokens/s, the *low* percentiles are the bad ones.

# %% id="c026"
traces = []
for i in range(N_REQUESTS):
    L = int(rng.integers(8, 96 if SMALL else 256))
    offset = int(rng.integers(0, len(heldout_ids) - L))
    n_out = int(rng.integers(2, MAX_REQUEST_TOKENS + 1))
    traces.append(generate(model, heldout_ids[offset:offset + L], n_out)[1])
summary = M.summarize(traces)
print(M.format_summary(summary))

ttfts = [t.ttft for t in traces]
for q in (50, 90, 99):
    assert summary[f"ttft_p{q}"] == np.percentile(ttfts, q)  # the same numbers numpy gives
assert summary["ttft_p50"] <= summary["ttft_p90"] <= summary["ttft_p99"] <= max(ttfts)
print(f"p99 TTFT {summary['ttft_p99'] * 1e3:.2f} ms vs the slowest request {max(ttfts) * 1e3:.2f} ms")

# %% id="c027"
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for ax, key, label in [(axes[0], "ttft", "TTFT (ms)"), (axes[1], "e2e", "end-to-end latency (ms)")]:
    vals = np.sort([getattr(t, key) for t in traces]) * 1e3
    ax.step(vals, np.arange(1, len(vals) + 1) / len(vals), where="post", marker="o", ms=3)
    for q, c in [(50, "C1"), (90, "C2"), (99, "C3")]:
        ax.axvline(summary[f"{key}_p{q}"] * 1e3, color=c, ls="--", label=f"p{q}")
    ax.set(xlabel=label, ylabel="fraction of requests")
    ax.legend()
fig.suptitle(f"{N_REQUESTS} requests")
plt.tight_layout()
plt.show()

# %% [markdown] id="c028"
# ## 7. Cost per 1M tokens
#
# A rented machine costs a fixed price per hour whatever it does, so the cost of a token is the price
# divided by the tokens produced in that hour:
#
# $$\text{cost per 1M tokens} = \frac{\text{price per hour}}{\text{tokens/s} \times 3600} \times 10^6$$
#
# Throughput here is the *aggregate* rate of the machine. Our requests ran one at a time, so it is the
# total tokens over the total busy time. The price is an assumption (`PRICE_PER_HOUR` in the
# parameters); put in what your machine costs.

# %% id="c029"
total_tokens = sum(len(t) for t in traces)
busy_s = sum(t.e2e for t in traces)
throughput = total_tokens / busy_s
cost = M.cost_per_million_tokens(PRICE_PER_HOUR, throughput)
print(f"{total_tokens} tokens in {busy_s:.2f} s busy time: {throughput:.1f} tokens/s")
print(f"at ${PRICE_PER_HOUR:.2f}/hour: ${cost:,.2f} per 1M tokens "
      f"({1e6 / throughput / 3600:.1f} hours of this machine for 1M tokens)")
for speedup in (10, 100):
    print(f"  {speedup:>3}x the throughput at the same price: ${M.cost_per_million_tokens(PRICE_PER_HOUR, throughput * speedup):,.2f}")
assert math.isclose(M.cost_per_million_tokens(PRICE_PER_HOUR, throughput * 10) * 10, cost)

# %% [markdown] id="c030"
# Cost is inversely proportional to throughput: every later module that raises throughput (KV cache,
# quantization, batching, speculative decoding) lowers the cost per token by the same factor, as long
# as it does not need a pricier machine.
#
# ## 8. Memory footprint
#
# The first thing that must fit is the weights: **parameters × bytes per parameter**. A quick table for
# our models, the hub models and a 7B model (weights only: no KV cache, activations or runtime overhead).

# %% id="c031"
DTYPES = ["fp32", "fp16", "bf16", "int8", "int4"]
sizes = {"tiny": rows[0][7], "tiny-draft": rows[1][7], **hub_params, "7B model": 7e9}
print(f"{'model':<14}" + "".join(f"{d:>12}" for d in DTYPES))
for name, n in sizes.items():
    print(f"{name:<14}" + "".join(f"{format_bytes(parameter_bytes(n, d)):>12}" for d in DTYPES))
# a figure often quoted in tutorials, "LLaMA 7B from 28GB (FP16) to 4GB (INT4)": 28 GB is the FP32 size
print(f"7B: fp32 {parameter_bytes(7e9, 'fp32') / 1e9:.0f} GB, fp16 {parameter_bytes(7e9, 'fp16') / 1e9:.0f} GB, "
      f"int4 {parameter_bytes(7e9, 'int4') / 1e9:.1f} GB (decimal GB)")
assert parameter_bytes(7e9, "fp32") == 28e9 and parameter_bytes(7e9, "fp16") == 14e9

# %% [markdown] id="c032"
# The formula is checked against the real module: `model_weight_bytes` adds up the bytes of the
# model's parameters as stored. The bundled models tie the input embedding and the output head (one
# matrix used twice); summing the `state_dict` would count it twice.

# %% id="c033"
w_bytes = model_weight_bytes(model)
naive = sum(t.numel() * t.element_size() for t in model.state_dict().values())
print(f"weights: {format_bytes(w_bytes)}; state_dict sum {format_bytes(naive)} (embedding counted twice)")
assert w_bytes == parameter_bytes(model.num_parameters(), "fp32")
assert naive - w_bytes == model.config.vocab_size * model.config.hidden_size * 4

# %% [markdown] id="c034"
# The *peak* memory of a call adds what it allocates while it runs. On a GPU, PyTorch's allocator
# tracks it exactly (`torch.cuda.max_memory_allocated`). On a CPU there is no such counter: we can read
# the process's resident memory (RSS) before and after the call, and its high-water mark. If the mark
# rose during the call, we know the peak (roughly: whole pages, plus whatever the allocator keeps);
# if not, only the growth, a lower bound. `peak_memory` says which one it measured.

# %% id="c035"
(_, gen_trace), gen_mem = peak_memory(generate, model, prompt, NEW_TOKENS, device=DEVICE)
print(f"generate {NEW_TOKENS} tokens: {gen_mem}")
print(f"for comparison, the weights: {format_bytes(w_bytes)}")
if gen_mem.method == "rss_delta":
    print("(a lower bound: RSS grows only when the allocator asks the OS for new memory, and memory that\n"
          " earlier calls freed is reused. The GPU counter is exact.)")

# %% [markdown] id="c036"
# ## 9. Claim checked: "no_grad reduces memory usage by ~30–50%"
#
# Tutorials usually state this without a measurement. What does `torch.no_grad()` actually do? When a
# tensor that requires a gradient takes part in an operation, autograd records the operation and
# **saves the tensors it needs for the backward pass** (inputs of matmuls, outputs of activations, ...).
# These stay alive as long as the output does. `no_grad` (and the stricter `inference_mode`, which also
# skips version counters) records nothing. Loaded parameters require grad by default, so a plain forward
# pass does record:

# %% id="c037"
print("parameters require grad:", all(p.requires_grad for p in model.parameters()))
w = model_weight_bytes(model)
saved = {}
for L in GRAD_LENGTHS:
    x = heldout_ids[:L]
    x = torch.tensor([x], device=DEVICE)
    with torch.enable_grad():
        _, saved[L] = autograd_saved_bytes(model, x)
    with torch.no_grad():
        _, s_ng = autograd_saved_bytes(model, x)
    with torch.inference_mode():
        _, s_im = autograd_saved_bytes(model, x)
    assert s_ng == 0 and s_im == 0  # nothing is kept for a backward pass
    share = saved[L] / (w + saved[L])
    print(f"{L:>4} tokens: autograd keeps {format_bytes(saved[L]):>10} of activations "
          f"= {share:5.1%} of weights + activations; no_grad keeps 0 B")
assert all(saved[a] < saved[b] for a, b in zip(GRAD_LENGTHS, GRAD_LENGTHS[1:]))  # grows with the tokens
shares = [saved[L] / (w + saved[L]) for L in GRAD_LENGTHS]

# %% [markdown] id="c038"
# So the memory no_grad saves is the saved activations, and their size grows with batch × sequence
# length while the weights stay fixed. The same check with the peak memory counter (exact on a GPU,
# RSS on a CPU), measuring the cheap modes first so that they do not profit from memory the grad run
# left in the allocator. The output is still alive when the measurement ends, and with it the graph:

# %% id="c039"
L = GRAD_LENGTHS[-1]
x = torch.tensor([heldout_ids[:L]], device=DEVICE)


def fwd(mode):
    with mode():
        return model(x)


peaks = {}
for mode in (torch.inference_mode, torch.no_grad, torch.enable_grad):
    out, peaks[mode.__name__] = peak_memory(fwd, mode, device=DEVICE)
    del out
for k, v in peaks.items():
    print(f"{k:>15}: {v}")

# %% [markdown] id="c040"
# And time: without graph recording there is less bookkeeping per operation. The machine may be busy
# with other work, so the three modes are timed **interleaved** with `compare` (one call of each per
# round, in rotating order): a burst of background load then hits all three alike instead of one.

# %% id="c041"
modes = [torch.enable_grad, torch.no_grad, torch.inference_mode]
times = compare({mode.__name__: (lambda mode=mode: fwd(mode)) for mode in modes}, warmup=1, repeats=REPEATS,
                device=DEVICE)
for k, t in times.timings.items():
    print(f"{k:>15}: {t}")
ratio_ng = times["enable_grad"].median / times["no_grad"].median
ratio_im = times["enable_grad"].median / times["inference_mode"].median
print(f"time with the graph / without: {ratio_ng:.2f} (no_grad), {ratio_im:.2f} (inference_mode), {L} tokens, "
      f"on this run ({times.note('median')})")


# %% id="c042"
def activation_bytes_per_token(m, lengths=(GRAD_LENGTHS[0], GRAD_LENGTHS[-1])):
    got = []
    for n in lengths:
        with torch.enable_grad():
            got.append(autograd_saved_bytes(m, torch.tensor([heldout_ids[:n]], device=DEVICE))[1])
    return (got[1] - got[0]) / (lengths[1] - lengths[0])


def shape_term(c):
    """V / L + 12 d: weights (V d + 12 L d^2) over the graph's bytes per token (proportional to L d)."""
    return c.vocab_size / c.num_hidden_layers + 12 * c.hidden_size


per_token = activation_bytes_per_token(model)
break_even = w / per_token  # tokens (batch x length) at which the graph holds as much as the weights
break_even_draft = model_weight_bytes(draft) / activation_bytes_per_token(draft)
lo, hi = min(shares), max(shares)
print(f"Claim checked: 'no_grad reduces memory usage by ~30-50%'.\n"
      f"  Measured on the bundled model ({format_bytes(w)} of weights, batch 1): the activations autograd\n"
      f"  keeps are {lo:.0%} of weights + activations at {GRAD_LENGTHS[0]} tokens and {hi:.0%} at {GRAD_LENGTHS[-1]};\n"
      f"  no_grad and inference_mode keep none. They grow by {format_bytes(per_token)} per token, so they\n"
      f"  equal the weights (a 50% saving) at about {break_even:.0f} tokens of batch x length.\n"
      f"  Verdict: the saving is not a fixed percentage; it is the activation memory, which scales with\n"
      f"  batch x sequence length against a fixed weight size. The break-even follows the model's shape, not\n"
      f"  its size: {break_even_draft:.0f} tokens for the draft ({format_bytes(model_weight_bytes(draft))}), "
      f"{break_even:.0f} for the target.\n"
      f"  Weights are about (V d + 12 L d^2) x 4 bytes and the graph keeps about L d x a constant per token, so\n"
      f"  the break-even goes as V / L + 12 d: {shape_term(draft.config):.0f} for the draft (one layer of width\n"
      f"  {draft.config.hidden_size}), {shape_term(model.config):.0f} for the target ({model.config.num_hidden_layers} layers of width "
      f"{model.config.hidden_size}). Its one layer offsets its\n"
      f"  narrower width, so the two land close; a wider model of the same depth would need more tokens.\n"
      f"  Time: the graph cost {ratio_ng:.2f}x / {ratio_im:.2f}x the no_grad / inference_mode time on this run\n"
      f"  (median of {REPEATS} interleaved, {DEVICE.type}); a time saving is a side effect, not the main point.")
assert lo < hi and all(v == 0 for v in [s_ng, s_im])
# the shape terms differ by 5%; the measured break-evens within 1.5x of each other on every device seen
# (CPU: 148 draft vs 154 target; an H100, where SDPA keeps other tensors: 85 vs 81)
assert abs(math.log(break_even_draft / break_even)) < math.log(1.5)

# %% [markdown] id="c043"
# Whatever the exact share, the rule for inference code is simple: wrap it in `torch.inference_mode()`
# (or `no_grad`); `course_lib.generation.generate` does.

# %% [markdown] id="c043a"
# ## 10. Choosing the next token: temperature, top-k and top-p
#
# Every generation above was **greedy**: the loop took the argmax of the last position's logits. A chat
# model usually *samples* instead: it turns the logits `z` (one score per vocabulary token) into
# probabilities `softmax(z)` and draws a token. Drawing from the full distribution lets the long tail of
# unlikely tokens in, one draw in a while, and one bad token derails the rest of a text. Three knobs shape
# the distribution first (the lab asks you to write each one):
#
# * **temperature** `T`: `softmax(z / T)`. Below 1 it sharpens (`T → 0` is greedy), above 1 it flattens.
# * **top-k** [@fan2018hierarchical]: keep the `k` largest logits,
#   set the others to `-inf` (probability 0), renormalize. A fixed `k` is too many tokens when the model is
#   sure and too few when it hesitates.
# * **top-p**, or nucleus sampling [@holtzman2020curious]: keep the **smallest set of most likely tokens whose total probability reaches `p`**, so the
#   number kept adapts to the model's certainty. Sort the probabilities in decreasing order; a token is kept
#   when the probability of the tokens *before* it is still below `p`. The token that crosses `p` is kept:
#   with probabilities 0.5, 0.3, 0.15, 0.05 and `p = 0.55`, 0.5 alone does not reach 0.55, so the first
#   two are kept. The most likely token is always kept.
#
# The order matters: temperature first, then top-k, then top-p on the scaled logits, then softmax (the order
# Hugging Face uses, and `course_lib.generation.sampling_probs`). Below, the four-token example, then the
# bundled model's next-token distribution after a prompt.

# %% id="c043b"
from course_lib.generation import sampling_probs, top_k_filter, top_p_filter

toy = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
for p in (0.45, 0.55, 0.9, 1.0):
    kept = (~torch.isinf(top_p_filter(toy, p))).sum().item()
    print(f"top-p {p:4}: keeps {kept} of 4 tokens; probabilities {sampling_probs(toy, top_p=p).numpy().round(3)}")
print(f"top-k 2   : keeps 2 of 4 tokens; probabilities {sampling_probs(toy, top_k=2).numpy().round(3)}")
for t in (0.5, 1.0, 2.0):
    print(f"T = {t}   : probabilities {sampling_probs(toy, temperature=t).numpy().round(3)}")
assert torch.equal(torch.isinf(top_p_filter(toy, 0.55)), torch.tensor([False, False, True, True]))
assert torch.equal(torch.isinf(top_k_filter(toy, 2)), torch.tensor([False, False, True, True]))

# %% id="c043c"
with torch.inference_mode():
    next_logits = model(torch.tensor([prompt], device=DEVICE))[0, -1].float().cpu()
probs = torch.softmax(next_logits, -1)
print(f"vocabulary {probs.numel():,} tokens; the most likely has p = {probs.max():.3f}, "
      f"the 10 most likely together {probs.topk(10).values.sum():.3f}")
print(f"{'':>22} {'tokens kept':>12}")
for label, kw in [("T=1, no filter", {}), ("top-k 50", {"top_k": 50}), ("top-p 0.9", {"top_p": 0.9}),
                  ("T=0.7, top-p 0.9", {"temperature": 0.7, "top_p": 0.9}),
                  ("T=1.5, top-p 0.9", {"temperature": 1.5, "top_p": 0.9})]:
    print(f"{label:>22} {int((sampling_probs(next_logits, **kw) > 0).sum()):>12,}")
# top-p adapts: a cooler distribution reaches p with fewer tokens, a warmer one needs more
n_cool, n_warm = ((sampling_probs(next_logits, t, top_p=0.9) > 0).sum() for t in (0.7, 1.5))
assert n_cool <= n_warm
g = torch.Generator().manual_seed(SEED)
draws = torch.multinomial(sampling_probs(next_logits, 0.7, top_p=0.9), 8, replacement=True, generator=g)
print("8 draws at T=0.7, top-p 0.9:", [tok.decode([int(i)]) for i in draws])

# %% [markdown] id="c043e"
# ## 11. Greedy decoding loops: degeneration, measured
#
# Every generation timed above was greedy, and the text it wrote was not the point. Now it is. Read a greedy
# continuation of the bundled model and it soon says the same line again, and again: the model card shows
# such loops. Holtzman et al. named this **degeneration** [@holtzman2020curious]: decoding that *maximizes*
# likelihood (greedy, beam search) gives text that is bland and gets stuck in repetitive loops, even from a
# model that is good by likelihood, while text sampled from the same model does not. Two observations of
# theirs explain it:
#
# * **Repetition feeds itself.** Each time a phrase is repeated, the model finds the next repetition *more*
#   likely, a positive feedback loop. Greedy follows the most likely token, so once a loop starts, it stays.
# * **Human text is not the most likely text.** People write the occasional surprising token; a decoder
#   that never picks anything but the argmax never does. Sampling lets such tokens in; truncating the
#   unreliable tail (top-k, top-p) keeps the ones that derail a text out.
#
# To measure it we need a number for "repeats itself". `course_lib.perf.quality.repeated_ngram_share(tokens,
# n=4)` is the share of a continuation's 4-token windows that already occurred earlier in it: 0 when no
# window repeats, near 1 for a loop (the model card's measure). `distinct_ngrams(tokens, 1)`, distinct-1, is
# the share of distinct tokens: low when a loop recycles a few. Below, continuations of prompts cut from the
# middle of held-out files, decoded greedily, with a **repetition penalty** (explained after the table), and
# sampled at two temperatures and with top-p, each sampled setting with several seeds: one batch, each row
# its own settings and generator.

# %% id="c043f"
from course_lib.perf.quality import distinct_ngrams, repeated_ngram_share

DEGEN_PROMPTS = 6 if SMALL else 12      # held-out files, one prompt from the middle of each
DEGEN_PROMPT_TOKENS = 64 if SMALL else 96
DEGEN_NEW_TOKENS = 48 if SMALL else 64
DEGEN_SEEDS = 2 if SMALL else 5          # seeds per sampled setting
DEGEN_SETTINGS = [  # (label, temperature, top_p, repetition_penalty); temperature 0 is greedy
    ("greedy", 0.0, None, 1.0), ("greedy, penalty 1.2", 0.0, None, 1.2), ("greedy, penalty 1.3", 0.0, None, 1.3),
    ("T=0.7", 0.7, None, 1.0), ("T=1.0", 1.0, None, 1.0), ("T=1.0, top-p 0.9", 1.0, 0.9, 1.0)]

degen_prompts = []
for text in load_split("heldout", max_files=DEGEN_PROMPTS):
    ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    start = max(0, len(ids) // 2 - DEGEN_PROMPT_TOKENS)
    degen_prompts.append(ids[start:start + DEGEN_PROMPT_TOKENS])
assert len({len(p) for p in degen_prompts}) == 1  # one length: a batch without padding
degen_rows = [(label, t, p, r, seed, i) for label, t, p, r in DEGEN_SETTINGS for seed in (range(DEGEN_SEEDS) if t else [0])
        for i in range(len(degen_prompts))]
t0 = time.process_time()
out = generate(model, [degen_prompts[i] for *_, i in degen_rows], DEGEN_NEW_TOKENS, cache="contiguous",
               temperature=[t for _, t, *_ in degen_rows], top_p=[p for _, _, p, *_ in degen_rows],
               repetition_penalty=[r for _, _, _, r, *_ in degen_rows], return_logits=True,
               generator=[torch.Generator(device=DEVICE).manual_seed(1000 * seed + k)
                          for k, (*_, seed, _) in enumerate(degen_rows)])
degen_cpu_s = time.process_time() - t0
degen_tokens = {(label, seed, i): toks.tolist() for (label, *_, seed, i), toks in zip(degen_rows, out.tokens)}
rep4 = {label: [repeated_ngram_share(v) for (lab, *_), v in degen_tokens.items() if lab == label]
        for label, *_ in DEGEN_SETTINGS}
dist1 = {label: [distinct_ngrams(v, 1) for (lab, *_), v in degen_tokens.items() if lab == label]
         for label, *_ in DEGEN_SETTINGS}
print(f"{len(degen_prompts)} prompts of {DEGEN_PROMPT_TOKENS} tokens, {DEGEN_NEW_TOKENS} new tokens, "
      f"{DEGEN_SEEDS} seeds per sampled setting: {len(degen_rows)} rows in {degen_cpu_s:.1f} CPU s")
print(f"{'':>20} {'repeated 4-grams':>17} {'(min - max)':>13} {'distinct-1':>11}")
for label, *_ in DEGEN_SETTINGS:
    v = rep4[label]
    print(f"{label:>20} {np.mean(v):>17.2f} {f'({min(v):.2f} - {max(v):.2f})':>13} {np.mean(dist1[label]):>11.2f}")

fig, ax = plt.subplots(figsize=(8, 3))
for x, (label, *_) in enumerate(DEGEN_SETTINGS):
    ax.bar(x, np.mean(rep4[label]), color="tab:red" if label == "greedy" else "tab:blue", alpha=0.6)
    ax.plot([x] * len(rep4[label]), rep4[label], "k.", alpha=0.5)
ax.set_xticks(range(len(DEGEN_SETTINGS)), [label for label, *_ in DEGEN_SETTINGS], rotation=20, fontsize=8)
ax.set_ylabel("repeated 4-gram share")
ax.set_title("bars: mean over prompts (and seeds); dots: one continuation each")
plt.tight_layout()
plt.show()

# Greedy loops: it repeats far more than every sampled setting (asserted with a margin of 2x: in 8 runs of
# this cell with other generator seeds, on CPython 3.11's held-out files, no sampled mean exceeded 0.08
# against greedy's 0.35), and the penalty cuts its repeats.
greedy_rep = np.mean(rep4["greedy"])
sampled_rep = {label: np.mean(rep4[label]) for label, t, *_ in DEGEN_SETTINGS if t > 0}
assert greedy_rep > 2 * max(sampled_rep.values()), (greedy_rep, sampled_rep)
assert np.mean(rep4["greedy, penalty 1.3"]) < greedy_rep / 2 and np.mean(rep4["greedy, penalty 1.2"]) < greedy_rep
assert np.mean(dist1["greedy"]) < min(np.mean(dist1[label]) for label in sampled_rep)

# %% [markdown] id="c043g"
# The feedback loop shows in the model's own confidence. For each greedy continuation, the probability the
# model gave the token it chose, averaged over the first and over the last quarter of the continuation: as
# the text starts repeating itself, the model grows surer of the repeats.

# %% id="c043h"
greedy_rows = [k for k, (label, *_) in enumerate(degen_rows) if label == "greedy"]
confidence = torch.softmax(out.logits[greedy_rows].float(), -1).amax(-1).cpu()   # [prompts, new tokens]
quarter = DEGEN_NEW_TOKENS // 4
first_q, last_q = confidence[:, :quarter].mean().item(), confidence[:, -quarter:].mean().item()
print(f"greedy: probability of the chosen token, first quarter {first_q:.2f}, last quarter {last_q:.2f} "
      f"({'rose' if last_q > first_q else 'did not rise'} on this run)")
i = int(np.argmax([repeated_ngram_share(degen_tokens[("greedy", 0, i)]) for i in range(len(degen_prompts))]))
print(f"\nprompt {i} ends: {tok.decode(degen_prompts[i][-16:])!r}")
for label, seed in [("greedy", 0), ("greedy, penalty 1.3", 0), ("T=1.0, top-p 0.9", 0)]:
    toks = degen_tokens[(label, seed, i)]
    print(f"--- {label} (repeated 4-grams {repeated_ngram_share(toks):.2f}):\n{tok.decode(toks)}")

# %% [markdown] id="c043i"
# **The repetition penalty** is CTRL's "penalized sampling" [@keskar2019ctrl]: before the next token is
# chosen, the logit of every token in a list of earlier tokens is divided by a penalty `θ > 1` (the
# authors found `θ ≈ 1.2` a good balance). Divided, a *negative* logit grows, which makes the token more
# likely, the opposite of the intent; Hugging Face's implementation therefore multiplies negative logits
# by `θ` and divides positive ones (transformers issue #2302), and so does
# `course_lib.generation.apply_repetition_penalty` (tested against `RepetitionPenaltyLogitsProcessor`).
# `generate(..., repetition_penalty=θ)` applies it at every step, before temperature, top-k and top-p, and
# also to greedy decoding. Three things to know about it:
#
# * **Which** earlier tokens count is where the paper and the libraries part. CTRL's paper discounts the
#   scores of the *previously generated* tokens (its list `g`). Hugging Face's `RepetitionPenaltyLogitsProcessor`
#   penalizes every id of `input_ids`, which for a decoder-only model holds the prompt as well (its docstring
#   says so; recent versions take `prompt_ignore_length` to leave the prompt out), and the course's
#   `generate` follows Hugging Face: every token of the text, the prompt included, once however often it
#   occurred. (The authors' released script, `generation.py` in the salesforce/ctrl repository, also loops
#   over the prompt's positions, skipping newlines: the paper's formula and its code differ here.) Counting
#   the prompt matters most in code, where `self`, `(` and an indentation must recur: the penalty pushes the
#   model away from tokens it *should* repeat. The cell below shows the two sets on the prompt above.
# * It is not shift-invariant. Softmax gives the same distribution for logits `z` and `z + c`, but
#   dividing and multiplying depends on where zero falls, so the same `θ` is a different penalty on
#   another model.
# * It changes the distribution the model was trained to predict: a fix at decoding time, not a better model.
#
# Reading the table: greedy repeats most (the same number for every seed: there is no randomness in it);
# sampling at `T = 1` rarely repeats; `T = 0.7`, a cooler distribution and so closer to greedy, repeats more
# than `T = 1` on these seeds; top-p 0.9 samples from the nucleus only and still avoids the loops. A penalty
# of 1.2 to 1.3 removes most of greedy's repeats and raises distinct-1 to sampling's level. Which text is
# *better* the share cannot tell: it measures repetition, not correctness. And the loops are not a toy's
# quirk: the paper found them in GPT-2 Large, some 160 times the bundled target's size.

# %% id="c043j"
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from course_lib.generation import apply_repetition_penalty

prompt_ids, gen_ids = degen_prompts[i], degen_tokens[("greedy, penalty 1.3", 0, i)]
z = torch.randn(1, model.config.vocab_size, generator=torch.Generator().manual_seed(0))   # any logits do
seen_all = apply_repetition_penalty(z[0], prompt_ids + gen_ids, 1.3)     # Hugging Face's rule, and ours
seen_gen = apply_repetition_penalty(z[0], gen_ids, 1.3)                  # the paper's list: generated only
hf = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt_ids + gen_ids]), z.clone())[0]
assert torch.equal(hf, seen_all)                                         # input_ids include the prompt
n_all, n_gen = int((seen_all != z[0]).sum()), int((seen_gen != z[0]).sum())
assert n_all == len(set(prompt_ids + gen_ids)) and n_gen == len(set(gen_ids)) and n_all >= n_gen
try:                                 # transformers versions with prompt_ignore_length: the paper's set
    hf_gen = RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=len(prompt_ids))(
        torch.tensor([prompt_ids + gen_ids]), z.clone())[0]
    assert torch.equal(hf_gen, seen_gen)
    ignore = "; with prompt_ignore_length it matches the generated-only set"
except TypeError:
    ignore = " (this transformers has no prompt_ignore_length)"
print(f"prompt {i}: {n_all} token ids penalized with the prompt counted (Hugging Face's default{ignore}), "
      f"{n_gen} from the {len(gen_ids)} generated tokens alone (the paper's list)")

# %% [markdown] id="c043d"
# ## Summary
#
# * Time with warm-up, device synchronization and repeats; report the median and its spread. Compare
#   candidates interleaved, by their fastest runs, and state the result with its noise: on a busy machine
#   a timing claim can fail to hold on one run, which is a measurement to repeat, not an error.
# * Measure a generation from per-token timestamps: TTFT (prefill), TPOT `= (t_last - t_first)/(n-1)`
#   (decode), end-to-end latency `= TTFT + (n-1)·TPOT`, tokens/s.
# * Summarize many requests by p50/p90/p99; p99 of a few dozen requests is nearly the maximum.
# * Cost per 1M tokens = price per hour / (tokens/s × 3600) × 10⁶: cost falls as throughput rises.
# * Sampling: temperature, then top-k (the k largest), then top-p (the smallest set reaching p, the
#   crossing token kept), then softmax; top-p adapts the number of tokens to the model's certainty.
# * Greedy decoding degenerates into loops (measure it: the repeated 4-gram share); sampling, top-p and a
#   repetition penalty (seen tokens' logits: positive ones divided, negative ones multiplied, before
#   temperature) break them, each at a price.
# * Memory = parameters × bytes per parameter for the weights, plus what runs need on top (activations,
#   and from Module 05 the KV cache); the graph that no_grad avoids is part of the second term.
#
# The numbers of this run:

# %% id="c044"
print(f"Summary on {caps.device_name} ({DEVICE.type}):")
print(f"  first call {cold_ratio:.1f}x the warm median")
print(f"  single request: TTFT {m1.ttft * 1e3:.1f} ms, TPOT {m1.tpot * 1e3:.1f} ms, {m1.tokens_per_second:.0f} tokens/s")
print(f"  {N_REQUESTS} requests: p50/p90/p99 TTFT = "
      + " / ".join(f"{summary[f'ttft_p{q}'] * 1e3:.1f}" for q in (50, 90, 99)) + " ms")
print(f"  cost: ${cost:,.2f} per 1M tokens at ${PRICE_PER_HOUR:.2f}/h")
print(f"  weights {format_bytes(w)}; autograd would add {format_bytes(per_token)} per token without no_grad")
print(f"  repeated 4-grams: greedy {greedy_rep:.2f}, sampled at most {max(sampled_rep.values()):.2f}, "
      f"greedy with penalty 1.3 {np.mean(rep4['greedy, penalty 1.3']):.2f}")

# %% [markdown] id="c045"
# Next: **Module 01** splits the time into prefill and decode and asks *why* each costs what it costs
# (FLOPs, bytes and the roofline); **Module 05** removes the recomputation you saw growing in the
# per-token plot.

# %% [markdown] id="further-reading"
# ## Further reading
#
# Used in this notebook:
#
# * *DistServe* [@zhong2024distserve]: TTFT and TPOT as separate latency targets for the prefill and the
#   decode, and goodput, the rate of requests served within both (section 4; Module 09 measures it).
# * *Hierarchical Neural Story Generation* [@fan2018hierarchical]: top-k sampling (section 10).
# * *The Curious Case of Neural Text Degeneration* [@holtzman2020curious]: top-p (nucleus) sampling, and why
#   greedy decoding loops (sections 10 and 11).
# * *CTRL* [@keskar2019ctrl]: the repetition penalty (section 11).
#
# To go further:
#
# * *Making Deep Learning Go Brrrr From First Principles* [@he2022brrr]: compute, memory bandwidth and
#   overhead, the three things a timing can be made of, and why a small model's step is mostly overhead.
# * *Orca* [@yu2022orca]: a server that schedules many requests step by step, where TTFT starts to include
#   queueing (Module 09).
