# %% [markdown] id="c002"
# # Module 12 · Compilers and the whole system
#
# Eleven modules made one part of inference faster at a time. This last one looks at the whole system:
# what a compiler does to a decode step, what a server around the engine looks like, and how much each
# optimization of the course is worth when they are stacked on one model and measured in one run.
#
# 1. **Kernels of one decode step**, eager and compiled with `torch.compile`: counted, and the fused
#    RMSNorm and SiLU-gate kernels read in the code inductor generated;
# 2. **graph breaks** (found with `torch._dynamo.explain`, then removed) and **recompiles**;
# 3. is compiling worth it here? Compile time against the time saved per token; **launch overhead and
#    CUDA graphs** (measured on a GPU, explained on a CPU);
# 4. **a real server**: `course serve`'s OpenAI-compatible endpoint, started inside this notebook, queried
#    with the official `openai` client, put under a short load test, and watched through `/metrics`;
# 5. **the capstone**: the optimizations stacked on the bundled model, each one's share of the total
#    speed-up (a waterfall), and the cost per 1M tokens at each step;
# 6. **hardware choice** for a 7B and a 70B model, and the deployment stack in production.
#
# Everything is measured on the machine that runs the notebook; the numbers in the prose are the ones
# this run computed.

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
MAX_NEW_TOKENS = 32 if QUICK else 128         # tokens per prompt in the capstone
N_PROMPTS = 4 if QUICK else 12                # prompts in the capstone (one user at a time, then batched)
STEP_TIMINGS = 10 if QUICK else 50            # decode steps timed per mode
LOAD_SECONDS = 3.0 if QUICK else 15.0         # length of the load test
CONCURRENCY = 4 if QUICK else 8               # concurrent clients in the load test
PRICE_PER_HOUR = 0.10                         # $/hour assumed for this machine (a small cloud CPU VM)

# %% id="c004"
import contextlib
import math
import time
from concurrent.futures import ThreadPoolExecutor

import matplotlib.pyplot as plt
import torch
from torch._dynamo.utils import counters

from course_lib.capstone import INT8_STEP, attribution_table, hardware_choice, run_capstone, waterfall
from course_lib.compile_tools import (count_compiles, count_decode_kernels, explain_breaks, launch_overhead,
                                      profile_ops, rms_norm, silu_gate, time_decode_steps)
from course_lib.generation import generate
from course_lib.perf.claims import timing_claim
from course_lib.perf.timing import compare
from course_lib.kvcache import StaticCache
from course_lib.models import LlamaForCausalLM, as_config, load

torch.set_num_threads(1) if QUICK else None
device = course_lib.env.device()
model, tokenizer = load("tiny", device=device)
draft, _ = load("tiny-draft", device=device)
model.eval(), draft.eval()
cfg = model.config
print(f"device: {device}; model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
      f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")

# %% [markdown] id="c005"
# ## 1. The kernels of one decode step
#
# In eager mode PyTorch runs the model one operator at a time: every `aten::` call is at least one
# kernel, which on a GPU is one launch and on a CPU one loop over memory. RMSNorm alone is six of them
# (`pow`, `mean`, `add`, `rsqrt`, `mul`, `mul`), each reading its input from memory and writing its output
# back.
#
# `torch.compile` works in two stages [@ansel2024pytorch]. **Dynamo** reads the Python bytecode of the step and records the
# tensor operations into one graph (an FX graph). **Inductor** turns that graph into code: it keeps the
# matmuls as library calls ("extern kernels": oneDNN/MKL on a CPU, cuBLAS on a GPU) and *fuses* the
# pointwise and reduction operations between them into generated kernels (C++ with OpenMP on a CPU, Triton
# on a GPU) that read each input once and keep the intermediates in registers.
#
# `count_decode_kernels` counts both sides for one decode step (batch 1, a static KV cache of 256 slots):
# the top-level `aten::` ops the profiler sees in the eager step, and the kernel calls in the `call()`
# function of the code inductor generated for the compiled step. This is the notebook's only compile
# (the first one on a machine takes a minute on two CPU cores; inductor caches it on disk); the capstone
# below reuses it.

# %% id="c006"
t0 = time.perf_counter()
kc = count_decode_kernels(model)
t_compile = time.perf_counter() - t0
graphs_after_compile = counters["stats"]["unique_graphs"]
for row in kc.table():
    print(f"{row['step']:9s} {row['kernels']:4d} kernels  ({row['what is counted']})")
print(f"compiled in {t_compile:.1f} s (this run; less when inductor's disk cache already holds the step)")
print(f"eager / compiled = {kc.eager / kc.compiled:.1f}x fewer kernels per decode step on {device.type}")
# the matmuls stay library calls on both sides, so the ratio is below the fusion's own: on an H100 (torch
# 2.11, 2026-11-28) 291 eager CUDA launches against 105 compiled
assert kc.eager > 2 * kc.compiled and graphs_after_compile >= 1

kinds = {"matmul (extern)": sum(c.startswith("extern_kernels") for c in kc.compiled_calls),
         "fused (generated)": sum(c.startswith(("cpp_fused", "triton")) for c in kc.compiled_calls)}
kinds["aten fallback"] = len(kc.compiled_calls) - sum(kinds.values())
top = kc.eager_ops.most_common(8)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [2, 1]})
a1.barh([n.removeprefix("aten::") for n, _ in top][::-1], [v for _, v in top][::-1], color="tab:gray")
a1.set_title(f"eager: {kc.eager} ops, the 8 most frequent")
a2.bar(list(kinds), list(kinds.values()), color=["tab:blue", "tab:green", "tab:orange"])
a2.set_title(f"compiled: {kc.compiled} kernel calls")
a2.tick_params(axis="x", rotation=15)
fig.tight_layout()
plt.show()
print(f"{kinds['matmul (extern)']} matmul calls = 7 per layer x {cfg.num_hidden_layers} layers + the LM head "
      f"({7 * cfg.num_hidden_layers + 1}); everything else fits in {kinds['fused (generated)']} generated kernels")

# %% [markdown] id="c007"
# ### Fusion, read in the generated code
#
# Inductor names each generated kernel after the operations it fused. Among this step's kernels there is
# one with `mean`, `pow`, `rsqrt` and `mul` in its name (RMSNorm, usually together with the residual `add`
# before it) and one with `silu` and `mul` (the SwiGLU gate between the MLP's matmuls). Here are the eager
# ops of the same two functions, and the generated C++ (or Triton) of the gate:

# %% id="c008"
x, w = torch.randn(1, 1, cfg.hidden_size, device=device), torch.ones(cfg.hidden_size, device=device)
g = torch.randn(1, 1, cfg.intermediate_size, device=device)
norm_ops, _ = profile_ops(rms_norm, x, w)
gate_ops, _ = profile_ops(silu_gate, g, g)
norm_k = [k for k in kc.fused if all(op in k for op in ("mean", "pow", "rsqrt", "mul"))]
gate_k = [k for k in kc.fused if "silu" in k and "mul" in k]
print(f"RMSNorm eager: {sum(norm_ops.values())} ops {sorted(norm_ops)}")
print(f"  compiled: one kernel per norm, e.g. {norm_k[0]}  ({len(norm_k)} such kernels)")
print(f"SiLU gate eager: {sum(gate_ops.values())} ops {sorted(gate_ops)}")
print(f"  compiled: {gate_k[0]}")
assert norm_k and gate_k and sum(norm_ops.values()) >= 5 and sum(gate_ops.values()) >= 2

src = kc.code
start = src.index(gate_k[0])
body = src[start:start + 2500]
lines = [ln for ln in body.splitlines() if ln.strip()][:28]
print("\n".join(lines))

# %% [markdown] id="c009"
# The gate's kernel is one loop over the intermediate dimension: it loads `gate` and `up`, computes
# `gate * sigmoid(gate) * up` in registers (vectorized on a CPU), and stores the product once. Eager mode
# writes `silu(gate)` to memory and reads it back for the multiply. On a GPU the Triton version is the
# same loop, one program per block of elements.
#
# ## 2. Graph breaks
#
# Dynamo can only put into the graph what it can trace. A `.item()` or `int(tensor)` (the value is needed
# in Python, so the device must finish first), an `if` on a tensor's value, a `print` of a tensor, a call
# into a library dynamo does not know: each ends the graph there, runs that bit in plain Python, and starts
# a new graph after it. The step still works, but it is now several smaller graphs (less fusion, no single
# CUDA graph) with a host sync in between. `torch._dynamo.explain` runs the function once under dynamo,
# without generating code, and reports the graphs and the reason for each break.
#
# A decode step written the natural way, with a break, and the same step without it (a tiny one-layer model
# keeps `explain` fast):

# %% id="c010"
torch.manual_seed(0)
small = LlamaForCausalLM(as_config(dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        max_position_embeddings=64))).eval().to(device)


def step_with_break(model, tok, cache):
    logits = model(tok, cache=cache)[:, -1]           # [1, V]
    next_id = logits.argmax().item()                 # a Python int: the device syncs, the graph ends here
    return torch.tensor([[next_id]], device=tok.device)


def step_without_break(model, tok, cache):
    return model(tok, cache=cache)[:, -1].argmax(-1, keepdim=True)     # [1, 1], stays a tensor


def fresh_cache():
    cache = StaticCache.for_model(small, 1, 32)
    with torch.inference_mode():
        small(torch.tensor([[1, 2, 3]], device=device), cache=cache)
    return cache


reports = {}
for fn in (step_with_break, step_without_break):
    with torch.inference_mode():
        reports[fn.__name__] = explain_breaks(fn, small, torch.tensor([[3]], device=device), fresh_cache())
    r = reports[fn.__name__]
    print(f"{fn.__name__:20s} graphs {r['graph_count']}, breaks {r['graph_break_count']}")
    for reason in r["break_reasons"]:
        print("   ", reason)
assert reports["step_with_break"]["graph_break_count"] >= 1 and reports["step_without_break"]["graph_break_count"] == 0
with torch.inference_mode():
    same = torch.equal(step_with_break(small, torch.tensor([[3]], device=device), fresh_cache()),
                       step_without_break(small, torch.tensor([[3]], device=device), fresh_cache()))
print("same next token:", same)
assert same

# %% [markdown] id="c011"
# `torch.compile(..., fullgraph=True)` is documented to turn a graph break into an error, and the course's
# `decode_step` compiles with it. Does it catch this break? The `"eager"` backend traces without
# generating code, so the check costs a trace, not a compile:

# %% id="c012"
try:
    with torch.inference_mode():
        torch.compile(step_with_break, backend="eager", fullgraph=True)(small, torch.tensor([[3]], device=device),
                                                                        fresh_cache())
    raised = None
except Exception as e:          # torch._dynamo.exc.Unsupported (its class moves between versions)
    raised = f"{type(e).__name__}: {str(e).splitlines()[0][:110]}"
print("fullgraph=True on the step with a break ->", raised or "ran without an error")
print("so check a step with explain (graph_break_count == 0), as the lab does" if raised is None else
      "fullgraph=True refuses the break; explain still tells you where it is")


# %% [markdown] id="c013"
# ## 3. Recompiles
#
# A compiled graph is guarded: on every call dynamo checks that shapes, dtypes, the device and the Python
# values it specialized on are the ones it compiled for. A failed guard means a new compile. Two common
# cases in decoding:
#
# * **A growing shape.** A decode step over a cache that grows by one token each step has a new shape
#   every step. With `dynamic=False` that is one compile per token; by default dynamo compiles the first
#   shape statically, then on the second marks the changing dimension dynamic and compiles one graph for
#   all sizes (slower code than a static one, but one compile).
# * **A Python int position.** An `int` argument is specialized: `pos=5` and `pos=6` are different graphs.
#   The fix is a tensor position (or a static cache that holds the position as a tensor).
#
# `count_compiles` counts the graphs dynamo hands to a backend that only counts (no code generation):

# %% id="c014"
def norm_a(x, w):           # separate functions: dynamo remembers "this dimension changes" per function
    return rms_norm(x, w)


def norm_b(x, w):
    return rms_norm(x, w)


def rope_int(x, pos: int):
    return x * math.cos(pos * 0.01)


def rope_tensor(x, pos: torch.Tensor):
    return x * torch.cos(pos * 0.01)


growing = [(torch.randn(1, n, 8), torch.ones(8)) for n in range(3, 9)]
recompiles = {
    "growing length, dynamic=False": count_compiles(norm_a, growing, dynamic=False),
    "growing length, default": count_compiles(norm_b, growing),
    "int position, dynamic=False": count_compiles(rope_int, [(torch.randn(4), p) for p in range(6)], dynamic=False),
    "tensor position, dynamic=False": count_compiles(rope_tensor, [(torch.randn(4), torch.tensor(float(p)))
                                                                   for p in range(6)], dynamic=False),
}
for k, v in recompiles.items():
    print(f"{k:32s} {v} graphs for 6 calls")
assert recompiles["growing length, dynamic=False"] == 6 and recompiles["growing length, default"] == 2
assert recompiles["int position, dynamic=False"] == 6 and recompiles["tensor position, dynamic=False"] == 1

# %% [markdown] id="c015"
# With a real inductor compile each of those graphs costs seconds to a minute, so a step that recompiles
# per token is far slower than eager. To see recompiles in your own code, run with
# `TORCH_LOGS=recompiles` (it prints the guard that failed) or read `torch._dynamo.utils.counters`.
#
# ## 4. Is the compile worth it here? Launch overhead and CUDA graphs
#
# The same decode step, eager and compiled, timed on this machine (median of a few steps through a static
# cache), and the break-even point: how many tokens must be generated before the time saved pays for the
# compile.

# %% id="c016"
modes = ("eager", "compiled-no-graphs", "compiled") if device.type == "cuda" else ("eager", "compiled")
step_s = time_decode_steps(model, modes=modes, steps=STEP_TIMINGS)
for m in modes:
    print(f"{m:20s} {step_s[m] * 1e3:7.2f} ms per step")
saved = step_s["eager"] - step_s["compiled"]
per_op_us = step_s["eager"] / kc.eager * 1e6
print(f"compiled / eager: x{step_s['eager'] / step_s['compiled']:.2f} per step; "
      f"eager costs {per_op_us:.1f} us per aten op on average")
if saved > 0:
    print(f"break-even: {t_compile / saved:,.0f} tokens to pay back this run's {t_compile:.1f} s compile "
          f"({MAX_NEW_TOKENS} tokens per prompt in the capstone save {MAX_NEW_TOKENS * saved * 1e3:.1f} ms each)")
else:
    print("the compiled step is not faster here: the compile never pays back on this machine")

# %% [markdown] id="c017"
# Read the per-op number: the tiny model's matmuls are small (hidden size 256), so most of an eager step
# is PyTorch's per-operator overhead (Python, the dispatcher, allocating each output), a few microseconds
# each, times the op count of section 1. Fusion removes most of those ops, which is where the compiled
# step's gain comes from on a CPU. But the gain per token is small in absolute terms, so the compile pays
# back only after the number of tokens printed above: a server that runs for days amortizes it; a short
# notebook generation does not.
#
# **On a GPU** the same overhead has a name: *launch overhead*. Each kernel launch costs the CPU a few
# microseconds while the GPU finishes a tiny kernel faster than that, so a small model's step is a chain of
# launches with the GPU idle in between (launch-bound). Fusion cuts the number of launches; **CUDA
# graphs** go further: the whole step is recorded once and replayed with a single launch [@nvidia2025cuda]. That needs fixed
# addresses and shapes, which is why the course's static cache keeps its tensors in place and the position
# as a tensor: `decode_step` then compiles with `mode="reduce-overhead"` (inductor + CUDA graphs). The next
# cell measures one launch and the three step times on a GPU; on a CPU there are no launches and it says so.

# %% id="c018"
if device.type == "cuda":
    per_launch = launch_overhead(device)
    print(f"one (almost) empty kernel launch: {per_launch * 1e6:.1f} us")
    print(f"eager step: {kc.eager} launches x {per_launch * 1e6:.1f} us = {kc.eager * per_launch * 1e3:.2f} ms "
          f"of launches alone; measured step {step_s['eager'] * 1e3:.2f} ms")
    print(f"CUDA graphs: x{step_s['compiled-no-graphs'] / step_s['compiled']:.2f} over compiled without graphs, "
          f"x{step_s['eager'] / step_s['compiled']:.2f} over eager")
else:
    print("no GPU here: launch overhead and CUDA graphs are skipped. On a GPU this cell measures one launch "
          "(a few us on an H100) and shows the tiny model's step dropping several-fold with CUDA graphs, "
          "because its eager step is hundreds of launches of tiny kernels.")

# %% [markdown] id="c019"
# > **Claim checked.** The lecture notes say operator fusion "reduces memory transfers and kernel launch
# > overhead". Both are true on a GPU, but the notes give no number and no condition. Measured here: the
# > step goes from the eager op count to the compiled kernel count of section 1; on a CPU there are no
# > launches, and what fusion saves is per-operator dispatch overhead, the per-token gain printed above. For
# > a model whose matmuls dominate (a 7B model on a GPU at batch 1 is bound by reading its weights, Module
# > 01) fusion only touches the small remainder between the matmuls, so the gain shrinks. A compile also has
# > a cost (the seconds printed in section 1) that pays back only over many tokens.
#
# ## 5. A real server
#
# `course serve` puts an OpenAI-compatible HTTP API (FastAPI + uvicorn) in front of the course's
# continuous-batching engine of Module 09 (paged KV cache of Module 06): `/v1/completions`,
# `/v1/chat/completions` (both with streaming as server-sent events), `/v1/models` and `/metrics`. One
# thread owns the engine and runs its steps; each HTTP request gets its own queue of tokens, so streams
# cannot mix. From a shell: `course serve --model tiny --port 8000`. Here it runs in a background thread of
# this notebook on a free localhost port, and the official `openai` client talks to it as it would to any
# OpenAI-compatible service:

# %% id="c020"
import httpx
import openai

from course_lib.perf.metrics import format_summary
from course_lib.serving.loadtest import load_test
from course_lib.serving.server import build_app, serve_in_thread
from course_lib.serving.server_metrics import parse_metrics

servers = contextlib.ExitStack()
app = build_app("tiny", device=device, num_blocks=128, max_batch=8)
base_url = servers.enter_context(serve_in_thread(app))
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
print("serving at", base_url, "models:", [m.id for m in client.models.list().data])

r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0)
print(f"completion: {r.choices[0].text!r} ({r.usage.completion_tokens} tokens, {r.choices[0].finish_reason})")
alone = generate(model, tokenizer.encode("Once upon a time"), 20, cache="contiguous").tokens.tolist()
assert r.choices[0].text == tokenizer.decode(alone[:r.usage.completion_tokens])   # the server = generate, greedy

chunks = []
for ch in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Tell me a story"}],
                                         max_tokens=12, temperature=0, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        chunks.append(ch.choices[0].delta.content)
print(f"chat, streamed in {len(chunks)} chunks: {''.join(chunks)!r}")
assert len(chunks) >= 2

try:
    client.completions.create(model="tiny", prompt="hi", max_tokens=0)
    bad = None
except openai.BadRequestError as e:
    bad = e
print(f"max_tokens=0 -> HTTP {bad.status_code}: {bad.body['message']}")
assert bad is not None and bad.status_code == 400


# %% [markdown] id="c020a"
# ### A client that leaves
#
# A user closes the tab in the middle of a long answer. Nothing tells the engine but the connection: the
# server waits for the ASGI `http.disconnect` message of each request (as vLLM's OpenAI server does) and
# then **aborts** the request in the engine, whose KV blocks go back to the pool before the next step; a
# server that did not would generate all the remaining tokens for nobody, holding their blocks. Below, a
# client asks for 400 tokens, reads three chunks and closes the stream; `/metrics` counts the abort, and
# the tokens generated stay far below 400. The server also bounds what one client can cost everybody else:
# a request body over `max_body_bytes` (1 MiB by default) gets a 413 before it is parsed, and prompts are
# tokenized in a worker thread, not on the event loop that answers every other client.

# %% id="c020b"
def server_metrics():
    return parse_metrics(httpx.get(base_url + "/metrics").text)


before = server_metrics()
stream = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=400, temperature=0,
                                   stream=True)
first = [next(stream) for _ in range(3)]
stream.close()                                       # the client leaves: its connection closes
end = time.monotonic() + 30
while server_metrics()["course_requests_aborted_total"] == before["course_requests_aborted_total"]:
    assert time.monotonic() < end, "the server did not abort the request of the client that left"
    time.sleep(0.01)
after = server_metrics()
spent = after["course_generation_tokens_total"] - before["course_generation_tokens_total"]
print(f"aborted: {after['course_requests_aborted_total'] - before['course_requests_aborted_total']:.0f}; "
      f"tokens generated for it: {spent:.0f} of the 400 asked; KV blocks in use now: "
      f"{after['course_kv_blocks_used']:.0f}")
assert after["course_requests_aborted_total"] - before["course_requests_aborted_total"] == 1
assert spent < 400 // 2 and after["course_kv_blocks_used"] == 0

# %% [markdown] id="c021"
# ### A short load test
#
# `load_test` runs `CONCURRENCY` clients for `LOAD_SECONDS` seconds, each sending greedy streaming
# requests one after the other, and records every stream as a `Trace` (Module 00's request record): time
# to first token and time per output token as the clients see them, HTTP included. It also checks every
# stream against the non-streamed answer for the same prompt: a lost, cut or mixed-up stream is a problem,
# not a statistic. (It is bounded, and only for localhost.) Its event loop runs in a worker thread
# because the notebook's own loop is busy.

# %% id="c022"
load_prompts = ["Once upon a time", "The little dog", "She opened the door and", "In the morning the",
                "Tom and his friend", "The sun was"]
with ThreadPoolExecutor(1) as ex:
    res = ex.submit(load_test, base_url, "tiny", load_prompts, concurrency=CONCURRENCY, duration_s=LOAD_SECONDS,
                    max_tokens=16).result()
print(format_summary(res.summary))
print(f"{len(res.traces)} streams, problems: {res.problems or 'none'}")
assert res.ok, res.problems

# %% [markdown] id="c023"
# ### Monitoring: `/metrics`
#
# The server exposes Prometheus' text format, which a Prometheus server scrapes every few seconds and
# Grafana plots. Gauges say what is happening now (queue length, running requests, KV blocks in use,
# recent throughput); counters only grow (tokens, finished, rejected and aborted requests); histograms count
# latencies into buckets, from which percentiles are estimated. The rejected counter includes the 400
# above, the aborted one the client that left.

# %% id="c024"
text = httpx.get(base_url + "/metrics").text
m = parse_metrics(text)
for name in ("course_queue_length", "course_running_requests", "course_kv_blocks_used", "course_kv_blocks_total",
             "course_generation_tokens_total", "course_time_to_first_token_seconds_count",
             "course_time_to_first_token_seconds_sum"):
    print(f"{name:44s} {m[name]:10.3f}")
print([ln for ln in text.splitlines() if ln.startswith("course_requests_rejected_total{")])
n_finished = sum(v for k, v in m.items() if k.startswith("course_requests_finished_total{"))
ttft_mean = m["course_time_to_first_token_seconds_sum"] / m["course_time_to_first_token_seconds_count"]
print(f"{n_finished:.0f} requests finished; mean server-side TTFT {ttft_mean * 1e3:.1f} ms "
      f"(the clients saw p50 {res.summary['ttft_p50'] * 1e3:.1f} ms, HTTP and streaming included)")
assert n_finished >= len(res.traces) and m["course_kv_blocks_used"] == 0       # idle: every block returned
servers.close()                                                                 # stop the server

# %% [markdown] id="c025"
# ## 6. The capstone: every optimization on one model
#
# `run_capstone` generates `N_PROMPTS` prompts with each step of the stack, in one run, greedy, checking
# that every step produces the same tokens as the KV-cache step:
#
# 1. **no cache**: every token recomputes the whole prefix (Module 00's baseline);
# 2. **KV cache** (Module 05);
# 3. **static cache + compile** (this module): the decode step compiled in section 1, reused here;
# 4. **int8 weights** (Module 03);
# 5. **speculative decoding** (Module 08) with the bundled `tiny-draft`;
# 6. **continuous batching** (Module 09) over the paged KV cache (Module 06): all prompts at once.
#
# Steps 1 to 5 serve one user (prompts one after the other); step 6 serves them together, so its tokens/s
# is the aggregate a server would bill for. Speed-ups multiply, so each step's share of the total is taken
# on a log scale: `log(speed-up of the step) / log(total speed-up)`; the shares add up to 1, and a step that
# slows things down gets a negative share. The cost per 1M tokens at each step is Module 00's formula,
# price per hour / tokens per hour, at `PRICE_PER_HOUR` for this machine.

# %% id="c026"
prompts = [tokenizer.encode(s) for s in (load_prompts * 3)[:N_PROMPTS]]
graphs_before = counters["stats"]["unique_graphs"]
t0 = time.perf_counter()
steps = run_capstone(model, draft, prompts, MAX_NEW_TOKENS)
t_capstone = time.perf_counter() - t0
new_graphs = counters["stats"]["unique_graphs"] - graphs_before
print(f"capstone: {t_capstone:.1f} s, {new_graphs} new compiled graphs (section 1's compile was reused)")
assert new_graphs == 0
for s in steps:
    print(f"{s.name:26s} {s.tokens_per_s:8.1f} tok/s   {s.note}")
assert all("WARNING" not in s.note for s in steps), "a step changed the generated tokens"
rows = attribution_table([s.name for s in steps], [s.seconds / s.tokens if s.tokens else float("nan")
                                                   for s in steps], price_per_hour=PRICE_PER_HOUR)
print(f"\n{'step':26s} {'tok/s':>8s} {'speed-up':>9s} {'cumul.':>7s} {'share':>7s} {'$/1M tok':>9s}")
for r in rows:
    if math.isnan(r["speedup"]):
        print(f"{r['step']:26s} {'skipped':>8s}")
        continue
    print(f"{r['step']:26s} {r['tokens_per_s']:8.1f} {r['speedup']:9.2f} {r['cumulative']:7.2f} "
          f"{r['share']:7.1%} {r['usd_per_1M']:9.3f}")
live = [r for r in rows if not math.isnan(r["speedup"])]
assert abs(sum(r["share"] for r in live) - 1) < 1e-9
waterfall(rows, title=f"Where the speed-up comes from ({device}, {N_PROMPTS} prompts x {MAX_NEW_TOKENS} tokens)")
plt.show()

# %% [markdown] id="c027"
# **The int8 step.** `INT8_STEP` swaps the linears of a copy of the model for Module 03's fused int8
# weight-only linears (`torch._weight_int8pack_mm`) and decodes eagerly with a contiguous cache; it is a
# different model, so its tokens are not compared with the float model's. Whether it speeds decoding up
# depends on the machine: the next cell prints the factor this run measured.
#
# **Reading the table.** Three things the numbers above show on this machine, and why:

# %% id="c028"
by = {s.name: s for s in steps}
print("int8 weights:", "skipped (" + by["int8 weights"].note + ")" if by["int8 weights"].skipped else "measured")
assert (INT8_STEP is None) == by["int8 weights"].skipped
if not by["int8 weights"].skipped:
    i8 = by["int8 weights"].tokens_per_s
    print(f"int8 weights over the KV cache (both eager, like for like): x{i8 / by['KV cache'].tokens_per_s:.2f}")

kv, comp, spec = (by[k].tokens_per_s for k in ("KV cache", "static cache + compile", "speculative (tiny-draft)"))
sc = by["static cache + compile"]
comp_paid = sc.tokens / (sc.seconds + t_compile)         # the same run, with this run's compile time counted
print(f"compile over the KV cache: x{comp / kv:.2f} on {N_PROMPTS} x {MAX_NEW_TOKENS} tokens, compile not counted "
      f"(per step, section 4 measured x{step_s['eager'] / step_s['compiled']:.2f}); counting this run's "
      f"{t_compile:.1f} s compile: x{comp_paid / kv:.2f}")
print(f"speculative over the KV cache (both eager, like for like): x{spec / kv:.2f}; "
      f"over the compiled step before it: x{spec / comp:.2f}")

with torch.inference_mode():
    st = generate(model, prompts[0], MAX_NEW_TOKENS, cache="contiguous", draft=draft).stats
    # the two on one prompt, interleaved, each by its fastest run (Module 00): the capstone ran each once
    one = compare({"KV cache": lambda: generate(model, prompts[0], MAX_NEW_TOKENS, cache="contiguous"),
                   "speculative": lambda: generate(model, prompts[0], MAX_NEW_TOKENS, cache="contiguous", draft=draft)},
                  warmup=0, repeats=3, device=device)
t_one = one.time("KV cache")
draft_share = st.draft_seconds / st.total_seconds
target_per_pass = st.target_seconds / (st.passes + 1)
target_per_token = t_one / MAX_NEW_TOKENS
print(f"speculative pass: {st.tokens_per_pass:.2f} tokens per target forward (acceptance {st.acceptance_rate:.0%}), "
      f"the draft takes {draft_share:.0%} of the time")
print(f"one target forward: {target_per_pass * 1e3:.2f} ms verifying {1 + 4} tokens vs "
      f"{target_per_token * 1e3:.2f} ms per token decoding alone (x{target_per_pass / target_per_token:.2f})")
batch = by["continuous batching"].tokens_per_s
print(f"continuous batching over one user with the KV cache: x{batch / kv:.2f} ({N_PROMPTS} prompts at once)")
if device.type == "cpu":
    timing_claim("on this CPU speculative decoding with tiny-draft is slower than the KV cache alone",
                 held=one.time("speculative") > one.time("KV cache"),
                 measured=f"{MAX_NEW_TOKENS} tokens of one prompt: {one.describe(unit='s', digits=3)}")

# %% [markdown] id="c029"
# * **Compile**: the table times the compiled step after its compile (the warm-up call is not timed), and
#   compares it with the KV-cache step, which also changes the cache (contiguous, growing, to static), so
#   its factor can differ from section 4's per-step one. Counting the compile, as a user waiting for a
#   short generation must, the gain shrinks to the last factor printed above (below 1 means the compile
#   cost more than it saved), and a cold compile (about a minute on two CPU cores, against the seconds of
#   a warm disk cache) makes it worse: the break-even of section 4 is thousands of tokens.
# * **int8 weights** pay where decode is bound by reading the weights: one byte instead of two (bf16) or
#   four (fp32) per weight. The bundled model is tiny (its step is dominated by per-operation overhead, as
#   section 4's time per aten op shows), so on this CPU the fused kernel's factor over the KV cache is the
#   one printed above, whatever its sign; at the 1.7B shape Module 03's section 11 measures the same kernel
#   on one layer, and gpt-fast reports x1.48 for int8 weights on Llama-2-7B at batch 1 on an A100 (155.6
#   against 104.9 tokens/s [@pytorchlabs2023gptfast]). The steps after it run the float model
#   again, so the chain compares speculative decoding with the int8 step.
# * **Speculative decoding needs a cheap draft and a cheap verification.** On a GPU, verifying 5 tokens
#   costs about as much as decoding 1 (the weights are read once: memory-bound), so every accepted token is
#   nearly free. On this CPU neither holds: the verification forward costs the multiple of one decode step
#   printed above, the draft is not much cheaper than the target (both are tiny and overhead-bound: its share
#   of the time is printed above), and the tiny draft's acceptance is low, so a pass yields few tokens for
#   its cost. Speculative decoding also runs eager here, so compared
#   with the compiled step right before it in the chain it loses the compile's gain too. A negative share on
#   the waterfall is a finding, not a bug: on a GPU with the 1.7B model and a 135M draft the same step is
#   a win (Module 08).
# * **Batching** serves every running request in one step: the last factor printed above, for `N_PROMPTS`
#   prompts at once. On a CPU a step's cost grows with the rows, so the factor stays below the number of
#   prompts; on a GPU a decode step costs about the same for 1 or 16 rows (memory-bound), so it comes
#   close to the batch size, and it is the only step whose gain grows with the traffic.
#
# > **Claim checked.** The lecture notes' end-to-end exercise asks to apply the optimizations one after the
# > other and "analyze which optimizations contributed most". Two cautions the numbers show. First, shares
# > depend on the order: a step's speed-up is measured on top of what came before (speculative decoding
# > after a compiled step is compared with the compiled step), so the same stack in another order gives
# > other shares; report the order with the table. Second, speed-ups multiply, so shares are only additive on
# > a log scale; a linear split (`(s_i - 1) / (S - 1)`) overstates the late steps. And a technique is not a
# > speed-up by name: on this CPU speculative decoding is slower than the KV cache alone (the claim above
# > checks it on this run).
#
# ## 7. Hardware choice
#
# What would a real model cost? The roofline model of Module 01 gives an upper bound on decode speed from
# the hardware's bandwidth and peak FLOPs. `hardware_choice` assumes: weights in fp16, split over the fewest
# GPUs whose memory (90 % usable) holds the weights and the KV cache of `batch` sequences of 2048 tokens;
# the GPUs work as one (no communication cost: an upper bound); a step reads the weights and the KV cache
# once; prices are assumed on-demand list prices (`GPU_PRICES`, they vary 2x across providers: put in
# yours).

# %% id="c030"
hw = hardware_choice(["llama-2-7b", "llama-2-70b"], batch=1) + hardware_choice(["llama-2-7b", "llama-2-70b"],
                                                                               batch=32)
print(f"{'model':12s} {'GPU':10s} {'batch':>5s} {'GPUs':>4s} {'bound':>7s} {'tok/s':>9s} {'$/hour':>7s} {'$/1M tok':>9s}")
for r in hw:
    print(f"{r['model']:12s} {r['gpu']:10s} {r['batch']:5d} {r['gpus']:4d} {r['bound']:>7s} {r['tokens_per_s']:9.0f} "
          f"{r['usd_per_hour']:7.2f} {r['usd_per_1M']:9.2f}")
best = {(r["model"], r["batch"]): min((x for x in hw if (x["model"], x["batch"]) == (r["model"], r["batch"])),
                                      key=lambda x: x["usd_per_1M"]) for r in hw}
for (mname, b), r in best.items():
    print(f"cheapest per token for {mname} at batch {b}: {r['gpu']} x{r['gpus']} (${r['usd_per_1M']:.2f} per 1M)")
assert all(r["bound"] == "memory" for r in hw if r["batch"] == 1)

# %% [markdown] id="c031"
# At batch 1 every GPU is memory-bound, so a token costs (price per hour) / (bandwidth): the card with the
# most bandwidth per dollar wins, and the 70B model needs several cards just to hold its weights. Batching
# multiplies tokens per step at almost the same step time, which divides the cost per token: serving many
# users at once (section 5) is the largest cost lever of all, larger than the choice of card. The bound
# ignores what real servers lose (kernels below peak bandwidth, communication between cards, prefill), so
# read the table as a ranking and an order of magnitude, and measure on the card before you buy.
#
# ## 8. The deployment stack
#
# A request in production passes through more than the engine:
#
# * **client SDK**: retries with backoff, timeouts, streaming; often the `openai` client pointed at your
#   own server, as above;
# * **gateway / load balancer**: authentication, rate limits per user, routing to replicas (ideally
#   KV-cache-aware: send a conversation back to the replica that holds its prefix);
# * **inference server**: the queue, the scheduler (continuous batching), the KV cache manager (paged),
#   streaming, metrics; the engine underneath runs the model with the optimizations of this course;
# * **monitoring**: Prometheus scrapes `/metrics`; alerts on TTFT/TPOT percentiles, queue length and KV
#   usage (a full KV pool means preemptions, Module 09); autoscaling on queue length, not CPU usage.
#
# The servers the lecture notes name, and one they leave out, in our words:
#
# * **vLLM**: an LLM engine and server built around paged attention and continuous batching; OpenAI-
#   compatible API, quantized models, speculative decoding, prefix caching, tensor parallelism; what
#   `course serve` imitates in miniature.
# * **SGLang** [@zheng2024sglang]: an LLM engine and server of the same kind (continuous batching, paged KV,
#   OpenAI-compatible API) whose prefix cache is a radix tree over the cached tokens (RadixAttention,
#   Module 06), with a front-end language for programs that make many generation calls.
# * **TGI** (Hugging Face Text Generation Inference): the same job (continuous batching, paged KV, streaming,
#   Prometheus metrics), built for the Hugging Face Hub's models. **No longer developed**: in maintenance
#   mode since December 2025, its maintainers pointing users to vLLM and SGLang, and archived (read-only)
#   since March 2026 [@huggingface2025text].
# * **Triton Inference Server** (NVIDIA): a general model server (HTTP/gRPC, many models, many frameworks,
#   dynamic batching of whole requests); for LLMs it runs an LLM engine as a backend (TensorRT-LLM or vLLM),
#   which supplies the iteration-level batching.
# * **TorchServe**: PyTorch's general model server (handlers, model archives, request batching); in
#   limited maintenance since February 2025 [@pytorch2025torchserve].
#
# > **Status as of November 2026** (checked on 2026-11-28; projects change, so look at a repository before
# > you build on it). Developed, with releases in 2026: vLLM, SGLang, TensorRT-LLM, and Triton Inference
# > Server with its TensorRT-LLM and vLLM backends. Archived: TGI [@huggingface2025text]. Limited
# > maintenance, no fixes planned, security ones included: TorchServe [@pytorch2025torchserve]. Superseded:
# > NVIDIA's FasterTransformer, the baseline of the Orca and vLLM papers, whose development moved to
# > TensorRT-LLM in 2023 [@nvidia2023fastertransformer].
#
# > **Claim checked.** The notes list "TorchServe (PyTorch native), Triton Inference Server, TensorFlow
# > Serving" as the servers that handle "batching, scheduling, and resource management" for LLMs. Two
# > corrections. The batching those general servers do is request-level (dynamic batching: wait a little,
# > run a batch of whole requests); an LLM server needs iteration-level (continuous) batching and a paged KV
# > cache, which section 5 and Module 09 measured; Triton gets it from an LLM backend. And TorchServe's
# > repository has been marked "Limited Maintenance" since February 2025 (no planned updates or security
# > fixes) [@pytorch2025torchserve]: for new LLM deployments use vLLM, SGLang, or Triton with an LLM backend
# > (not TGI, archived in 2026). TensorFlow Serving serves TensorFlow SavedModels and is not used for
# > today's open LLMs.
#
# ## Summary
#
# * `torch.compile` fuses everything between the matmuls: the decode step went from the eager op count to
#   the compiled kernel count of section 1, with RMSNorm and the SiLU gate each one generated kernel.
# * Graph breaks and recompiles undo it silently: find them with `torch._dynamo.explain`,
#   `TORCH_LOGS=recompiles`, and forbid breaks with `fullgraph=True`; keep shapes static (a static cache, a
#   tensor position).
# * The compile's gain is per-operator overhead: large on a GPU with CUDA graphs for a small model, small on
#   a CPU, and only worth its compile time over many tokens.
# * A server is the engine plus a queue, streaming, error handling and metrics; test it with a real client,
#   under load, checking every stream.
# * Stack the optimizations, measure each in one run, and attribute on a log scale in a stated order: some
#   steps are hardware-dependent, and the numbers, not the names, decide.

# %% [markdown] id="further-reading"
# ## Further reading
#
# Used in this notebook:
#
# * [@ansel2024pytorch]: PyTorch 2, TorchDynamo's graph capture and guards and TorchInductor's fusion.
# * [@nvidia2025cuda]: CUDA graphs, one launch for a recorded sequence of kernels.
# * [@pytorchlabs2023gptfast]: gpt-fast, a decode loop in plain PyTorch with compile, int8/int4 and speculation.
# * [@zheng2024sglang]: SGLang, its RadixAttention prefix cache and its front-end language (section 8).
# * [@huggingface2025text]: TGI's repository, its maintenance-mode notice and its archiving (section 8).
# * [@pytorch2025torchserve]: TorchServe's repository and its limited-maintenance notice (section 8).
# * [@nvidia2023fastertransformer]: FasterTransformer's notice that its development moved to TensorRT-LLM.
#
# To go further:
#
# * [@kwon2023efficient]: the engine behind the servers of section 8 (Module 09 measures its scheduling).
# * [@yu2022orca]: iteration-level scheduling, the batching an LLM server needs and a general model server lacks.
