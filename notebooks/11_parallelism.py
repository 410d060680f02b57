# %% [markdown] id="c002"
# # 11 · Parallelism: tensor and pipeline parallel inference on `torch.distributed`
#
# A model too big for one GPU, or too slow on one, is split over several. Two ways to cut it:
#
# * **tensor parallelism (TP)** splits every layer: each GPU holds a slice of every weight matrix, all
#   GPUs work on every token, and they exchange partial results (an **all-reduce**) twice per layer;
# * **pipeline parallelism (PP)** splits the stack: each GPU holds some whole layers, and activations
#   flow from one GPU to the next; to keep them all busy a batch is cut into **micro-batches**.
#
# We build both on the engine people use, `torch.distributed`: several real processes forming a
# process group, **gloo** on a CPU (so this runs on a laptop or Colab) and **NCCL** on GPUs. In this
# notebook:
#
# 1. the column-parallel / row-parallel pair, by hand, and why the row-parallel bias is added once;
# 2. a real process group from a notebook: `launch`, timeouts, and what happens when a rank fails;
# 3. the course's Llama sharded over 2 and 4 ranks (heads, grouped-query KV heads, a fused QKV split
#    before sharding), with equal logits, batches and cached decoding; then the same with PyTorch's
#    production API, `parallelize_module`;
# 4. the cost: bytes all-reduced, bytes per GPU, time per token over NVLink, PCIe and Ethernet, and the
#    lecture notes' "175B on 16 GPUs" checked in bytes;
# 5. time per token measured at TP = 1, 2, 4 on this machine, against the model;
# 6. pipeline parallelism: stages, micro-batches and the measured bubble against `(p-1)/(m+p-1)`;
# 7. expert parallelism's all-to-all and its imbalance, and context parallelism's ring attention, checked
#    against simulations of the collectives.
#
# ZeRO [@rajbhandari2020zero] and FSDP (sharding *training* state: optimizer moments, gradients, parameters
# gathered on use) are named in the notes beside TP and PP; for inference they reduce to sharded weights gathered per
# layer, and we do not build them here.

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
TIMING_TOKENS = 12 if QUICK else 64          # decode steps timed per run
TIMING_REPEATS = 3 if QUICK else 7
TIMING_HIDDEN = 256 if QUICK else 1024       # hidden size of the model timed at TP = 1, 2, 4
TIMING_LAYERS = 4 if QUICK else 8
MICRO_BATCHES = (1, 2, 4, 8) if QUICK else (1, 2, 4, 8, 16)
STAGE_SLEEP_S = 0.02                         # a stage's "kernel" per micro-batch in the measured pipeline

# %% id="c004"
import copy
import os
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_lib.attention import reference_attention
from course_lib.models.config import LlamaConfig, as_config, preset
from course_lib.parallel import (LINKS, ColumnParallelLinear, ModelSpec, RankFailed, RowParallelLinear,
                                 allreduce_time, bubble_formula, bubble_fraction, check_tp_degree, ep_dispatch_rows,
                                 ep_moe_layer_comm, failing_worker, gpipe_schedule, launch, linear_pair_check,
                                 load_imbalance, notes_example, per_gpu_memory, pipeline_run, rank_loads,
                                 ring_allreduce_bytes, ring_attention_comm, ring_attention_overlap, sequence,
                                 shard_fused_qkv, shard_range, simulate_ep_dispatch, simulate_ring_attention,
                                 time_model, tp_check, tp_comm_per_token, tp_degrees, tp_step_time, tp_timing)
from course_lib.perf.claims import timing_claim
from course_lib.perf.hardware import get_gpu
from course_lib.perf.tables import format_table
from course_lib.sparsity.moe import MoEMLP

torch.set_num_threads(1)
torch.manual_seed(0)
CORES = os.cpu_count()
print(f"{CORES} CPU cores here; CUDA GPUs: {torch.cuda.device_count()}")

# %% [markdown] id="c005"
# ## 1 · Two ways to split a linear layer
#
# A linear layer is `y = x Wᵀ + b` with `W` of shape `[out, in]`. Split it over `p` ranks:
#
# * **column-parallel**: rank `r` keeps the rows `r·out/p … (r+1)·out/p` of `W` (a slice of the
#   *outputs*, called "columns" after `Wᵀ`) and the same slice of `b`; from the whole `x` it computes its
#   slice of `y`. No communication.
# * **row-parallel**: rank `r` keeps the columns `r·in/p …` of `W` (a slice of the *inputs*); from its
#   slice of `x` it computes a **partial sum** of the whole `y`. Summing the partial sums over the ranks
#   (an all-reduce) gives `y`. The bias belongs to the sum: it is added **once**, after it.
#
# Megatron-LM's trick [@shoeybi2019megatron]: a column-parallel layer leaves each rank exactly the slice
# of the hidden activations that a row-parallel layer needs next. An MLP (up: column, down: row) costs **one**
# all-reduce, and so does attention (Q, K, V: column by heads; O: row). Check it in one process first,
# playing all ranks in turn:

# %% id="c006"
p = 4
lin1, lin2 = torch.nn.Linear(12, 16), torch.nn.Linear(16, 6)
x = torch.randn(3, 12)                                           # [batch, in]
ref = lin2(F.relu(lin1(x)))                                      # the unsharded MLP

partials = []
for r in range(p):
    col = ColumnParallelLinear.from_linear(lin1, r, p)           # W1 rows r: [16/p, 12], b1 slice
    row = RowParallelLinear.from_linear(lin2, r, p)              # W2 columns r: [6, 16/p], b2 whole
    h_r = F.relu(col(x))                                         # [3, 16/p]: this rank's hidden slice
    partials.append(F.linear(h_r, row.weight))                   # [3, 6]: a partial sum, no bias
    print(f"rank {r}: W1 shard {tuple(col.weight.shape)}, W2 shard {tuple(row.weight.shape)}")

y = sum(partials) + lin2.bias                                    # all-reduce, then the bias once
wrong = sum(part + lin2.bias for part in partials)               # the bias on every rank before the sum
print(f"bias once:       max |y - ref| = {(y - ref).abs().max():.2e}")
print(f"bias every rank: max |y - ref| = {(wrong - ref).abs().max():.2f}, = (p-1)·|b| at most "
      f"{((p - 1) * lin2.bias).abs().max():.2f}")
assert torch.allclose(y, ref, atol=1e-5)
assert torch.allclose(wrong - ref, (p - 1) * lin2.bias.expand_as(ref), atol=1e-5)

# %% [markdown] id="c007"
# The split survives the ReLU between the two layers because the ReLU acts element by element, so each rank
# applies it to its own slice (so do GELU and SwiGLU's `silu(gate) * up`, with gate and up split the same
# way). A layer norm between them would need the whole row, and a collective.
#
# ## 2 · A real process group, from a notebook
#
# `course_lib.parallel.launch(worker, world_size, args)` starts `world_size` Python processes, makes them
# one process group over a free local port (gloo here), runs `worker(*args)` in each, and returns what
# each rank returned. What it takes care of, since a notebook is an unforgiving place for processes:
#
# * the worker is sent **by reference** (module and name), so it must live in an importable module: a
#   function defined in a cell is refused with a message (lab 11 shows how to send a cell's source instead);
# * every collective has a **timeout** (`init_process_group(timeout=...)`), so a rank waiting for a peer
#   that never comes raises instead of hanging the kernel;
# * a rank that raises sends its traceback back; the others are killed and `RankFailed` names the rank;
# * the processes are always joined or killed, also when you interrupt the cell (`KeyboardInterrupt`).
#
# The first launch of a session waits a few seconds: a clean *fork server* process imports torch once;
# each launch then forks its ranks from it. `linear_pair_check` is the section above with real ranks:
# each rank holds only its shards and `dist.all_reduce` sums the partial results.

# %% id="c008"
t = time.perf_counter()
pair = launch(linear_pair_check, 2, args=(12, 16, 6))
print(f"2 ranks, {time.perf_counter() - t:.1f} s including start-up")
for r, res in enumerate(pair):
    print(f"rank {r}: shards {res['shard_shapes']}, max |diff| {res['max_abs_diff']:.1e}; "
          f"bias on every rank: off by {res['bias_every_rank_off_by']:.2f}")
assert all(res["max_abs_diff"] < 1e-4 and res["bias_every_rank_error"] < 1e-4 for res in pair)

# %% [markdown] id="c009"
# When a rank fails, the others would wait forever in their next collective. `launch` reports the failing
# rank with its traceback and stops the rest; a rank stuck in a collective its peers never join is ended
# by the timeout (here 3 s):

# %% id="c010"
for kwargs, timeout in ((dict(bad_rank=1), 30), (dict(bad_rank=-1, hang_rank=0), 3)):
    t = time.perf_counter()
    try:
        launch(failing_worker, 2, kwargs=kwargs, timeout=timeout)
    except RankFailed as e:
        last = e.detail.strip().splitlines()[-1]
        print(f"RankFailed after {time.perf_counter() - t:.1f} s: rank {e.rank}: ...{last[-90:]}"
              + (f" (then ranks {e.others}, which lost their peer)" if e.others else ""))
        failed = e
assert failed.rank == 0 and "Timed out" in str(failed)

# %% [markdown] id="c011"
# ## 3 · Sharding the course's Llama
#
# `shard_model(model, world_size)` (run inside each rank) replaces, in every layer:
#
# * attention by `ShardedAttention`: rank `r` gets query heads `r·H/p …` and **KV heads** `r·K/p …`.
#   With grouped-query attention, query head `h` reads KV head `h // (H/K)`; cutting both head lists into
#   `p` equal runs keeps every query head with its KV head on the same rank, **if `p` divides `K`**.
#   (With fewer KV heads than ranks, the KV heads would have to be replicated; we refuse instead.) Q, K and
#   V are one fused column-parallel matrix, **split into Q, K, V before sharding**; O is row-parallel.
# * the MLP by `ShardedMLP`: gate and up column-parallel, down row-parallel.
#
# The embedding, the norms and the LM head stay whole on every rank. The model's forward, its KV cache
# contract and the generate loop do not change: each rank's cache holds its `K/p` KV heads.
#
# The bundled model decides which degrees work:

# %% id="c012"
tiny = as_config("tiny")
print(f"tiny: {tiny.num_attention_heads} query heads, {tiny.num_key_value_heads} KV heads, "
      f"MLP width {tiny.intermediate_size}: TP degrees {tp_degrees(tiny)}")
try:
    check_tp_degree(tiny, 4)
except ValueError as e:
    print("TP=4:", e)
assert tp_degrees(tiny) == [1, 2]

# a fused QKV weight [(H + 2K)·Dh, D], sharded the wrong way and the right way
H, K, Dh, D = 4, 2, 3, 5
w_qkv = torch.cat([torch.full((H * Dh, D), 1.0), torch.full((K * Dh, D), 2.0), torch.full((K * Dh, D), 3.0)])
naive = w_qkv.chunk(2)[0][:, 0]                                  # 1 = Q row, 2 = K row, 3 = V row
right = shard_fused_qkv(w_qkv, H, K, Dh, 0, 2)[:, 0]
print("rank 0, naive chunk:", naive.int().tolist())
print("rank 0, split first:", right.int().tolist())
assert set(naive.tolist()) == {1.0} and right.tolist().count(2.0) == right.tolist().count(3.0) == (K // 2) * Dh

# %% [markdown] id="c013"
# Now the real thing: on each rank, the full model's logits and greedy cached decoding (a batch of 3
# prompts, a `ContiguousCache` per rank) next to the sharded model's, for our `shard_model` and for
# PyTorch's production API (next cell). TP=4 needs a model whose KV heads divide by 4: a small random
# one with 8 query heads and 4 KV heads.

# %% id="c014"
SMALL = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128)
t = time.perf_counter()
tp2 = launch(tp_check, 2, args=(ModelSpec("tiny"),), kwargs=dict(batch=3, prompt_len=8, new_tokens=6, dtensor=True))
tp4 = launch(tp_check, 4, args=(ModelSpec(config=SMALL, seed=1),), kwargs=dict(batch=3, prompt_len=8, new_tokens=6))
print(f"{time.perf_counter() - t:.1f} s")
rows = []
for name, out in (("tiny, TP=2", tp2), ("small GQA, TP=4", tp4)):
    for tag in ("ours", "dtensor"):
        if tag in out[0]:
            r = out[0][tag]
            rows.append([name, tag, f"{r['forward_max_abs_diff']:.1e}", f"{r['decode_max_abs_diff']:.1e}",
                         r["tokens_equal"], r["same_on_all_ranks"],
                         f"{r['params_per_rank'] / out[0]['params_full']:.0%}"])
print(format_table(["model", "sharding", "max |Δ logits| forward", "max |Δ logits| decode", "same tokens",
                    "same on all ranks", "params per rank"], rows, fmt="text"))
for out in (tp2, tp4):
    for res in out:
        for tag in ("ours", "dtensor"):
            if tag in res:
                assert res[tag]["forward_max_abs_diff"] < 1e-4 and res[tag]["decode_max_abs_diff"] < 1e-4
                assert res[tag]["tokens_equal"] and res[tag]["same_on_all_ranks"]

# %% [markdown] id="c015"
# The logits differ from the single-process model by float32 rounding only (the partial sums are added
# in another order), every rank ends with bitwise the same logits (the all-reduce gives all of them the
# same sum), and greedy decoding through the sharded KV caches gives the same tokens. A rank holds well
# over `1/p` of the parameters: the embedding (tied with the LM head) is replicated, and in the tiny
# model it is a large share.
#
# **The production API.** `parallelize_dtensor` (in `course_lib/parallel/shard.py`) is the same split
# with `torch.distributed.tensor.parallel`: a device mesh over the ranks and one plan per layer,
#
# ```python
# plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
#         "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
#         "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
# parallelize_module(layer, init_device_mesh("cpu", (world_size,)), plan)
# ```
#
# The weights become `DTensor`s that know how they are sharded; `RowwiseParallel` inserts the all-reduce.
# One thing it cannot know: our attention reshapes its output by the config's head count, so each
# attention module is told its local counts (`H/p`, `K/p`), as torchtitan does. Q, K and V are separate
# matrices in this model, so `ColwiseParallel` on each splits them by heads; a fused QKV matrix would
# need the split-first rule above. The row "dtensor" shows the same logits.
#
# ## 4 · What it costs
#
# **Communication.** A ring all-reduce of `N` bytes over `p` ranks has each rank send `2(p-1)/p · N`
# bytes, in `2(p-1)` steps (a reduce-scatter, then an all-gather). When the ranks are joined by
# point-to-point links and do the additions themselves, no all-reduce algorithm can send less per rank
# [@patarasuk2009bandwidth]. That assumption is the whole bound: a switch that adds changes it. With
# in-network reduction each rank sends its `N` bytes once into the switch, the switch sums what arrives and
# sends the sum back, so each rank sends `N`, not `2(p-1)/p · N`, close to half at large `p`. InfiniBand
# switches do it with SHARP, reducing on a tree of switches [@graham2016scalable], and the NVSwitch of H100
# systems with NVLink SHARP [@nvidia2022upgrading], which NCCL uses for its all-reduce as the NVLS algorithm
# where the hardware has it. With TP, every layer all-reduces the activations `[tokens, D]` twice. Per
# generated token of Llama-2-70B in bf16, at TP=8:

# %% id="c016"
llama70 = preset("llama-2-70b")
comm = tp_comm_per_token(llama70, 8, bpe=2)
print(f"Llama-2-70B: D = {llama70.hidden_size}, {llama70.num_hidden_layers} layers; per token at TP=8: "
      f"{comm['allreduces']} all-reduces of {comm['message_bytes'] / 1024:.0f} KiB, each rank sends "
      f"{comm['sent_bytes'] / 2**20:.2f} MiB")
IN_SWITCH = 1.0                     # in-network reduction: each rank sends its tensor once, the switch adds
for pp_ in (2, 4, 8, 64):
    ring = ring_allreduce_bytes(1.0, pp_)
    print(f"  all-reduce over p={pp_:>2}: each rank sends {ring:.3f} x the tensor on a ring, {IN_SWITCH:.0f} x "
          f"through a reducing switch (ratio {ring / IN_SWITCH:.2f})")
assert comm["allreduces"] == 2 * 80 and ring_allreduce_bytes(1.0, 64) < 2
assert ring_allreduce_bytes(1.0, 2) == IN_SWITCH and ring_allreduce_bytes(1.0, 8) == 1.75   # 2(p-1)/p

# %% [markdown] id="c017"
# **Memory per GPU.** TP divides each layer's matrices and the KV cache (each rank keeps `K/p` KV heads);
# PP divides the layers. The embedding and head are whole on each TP rank here:

# %% id="c018"
rows = []
for tp_, pp_ in ((1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (1, 8)):
    m = per_gpu_memory(llama70, tp=tp_, pp=pp_, context=4096, batch=8, bpe=2)
    rows.append([tp_, pp_, f"{m['weights'] / 1e9:.1f}", f"{m['kv'] / 1e9:.1f}", f"{m['total'] / 1e9:.1f}",
                 "yes" if m["total"] < 80e9 * 0.9 else "no"])
print(format_table(["TP", "PP", "weights GB", "KV GB (8 x 4096 tokens)", "total GB", "fits an 80 GB GPU (90%)"],
                   rows, fmt="text"))
assert per_gpu_memory(llama70, tp=1)["weights"] == llama70.num_parameters() * 2

# %% [markdown] id="c019"
# **Time per token.** Decoding at a small batch is memory-bound (Module 01): a step costs about the bytes
# each GPU reads divided by its memory bandwidth, plus `2L` all-reduces over the link between GPUs
# (`allreduce_time = 2(p-1)·latency + 2(p-1)/p · bytes / bandwidth`, nominal link figures in
# `course_lib.parallel.LINKS`). TP divides the bytes, not the number of all-reduces, so the link's
# *latency* is what stops the speed-up:

# %% id="c020"
h100 = get_gpu("H100-SXM")
degrees = [1, 2, 4, 8]
fig, ax = plt.subplots(figsize=(6.5, 3.6))
speedups = {}
for key in ("nvlink4", "pcie4", "ethernet-100g"):
    t = [tp_step_time(llama70, p_, key, h100.bandwidth, context=1024, batch=1)["total_s"] for p_ in degrees]
    speedups[key] = [t[0] / x for x in t]
    ax.plot(degrees, [1e3 * x for x in t], "o-", label=LINKS[key].name)
ax.set_xlabel("tensor-parallel degree p")
ax.set_ylabel("modelled ms per token")
ax.set_title("Llama-2-70B decode, batch 1, H100 memory bandwidth")
ax.set_xticks(degrees)
ax.legend()
plt.show()
for key, s in speedups.items():
    print(f"{LINKS[key].name:24s} speed-up at TP=8: {s[-1]:.1f}x")
assert 8 > speedups["nvlink4"][-1] > speedups["pcie4"][-1] > 1 > speedups["ethernet-100g"][-1]

# %% [markdown] id="c021"
# (At TP=1 the 70B model does not fit one 80 GB GPU in bf16; the point is the modelled time.) Even over
# NVLink, TP=8 is well short of 8 times faster: the bytes divide by 8, the 160 all-reduces per token do
# not, and each pays its latency. Through PCIe less is left, and over Ethernet TP=8 is slower than one GPU.
# This is why TP stays inside one machine (8 GPUs on NVLink) and PP, which sends one activation per
# stage boundary instead of two all-reduces per layer, crosses machines.
#
# > **Claim checked.** The lecture notes: *"175B parameter model, 16 GPUs with tensor parallelism, each
# > GPU handles ~11B parameters."* In parameters, right: GPT-3's 175B / 16 = 10.9B. What a GPU must hold is
# > **bytes**: 21.8 GB of fp16 weights per GPU (43.6 GB in fp32), plus the KV cache, plus activations.
# > And 16 GPUs are two 8-GPU machines: TP=16 puts a network link inside every all-reduce, 192 of them per
# > token. Deployments use TP=8 inside each machine and PP=2 across them. The numbers:

# %% id="c022"
ex = notes_example(gpus=16, bpe=2, batch=8, context=2048)
print(f"GPT-3: {ex['parameters'] / 1e9:.1f}B parameters; per GPU of 16: {ex['params_per_gpu'] / 1e9:.1f}B "
      f"parameters = {ex['weight_bytes_per_gpu'] / 1e9:.1f} GB in fp16, {ex['weight_bytes_per_gpu'] * 2 / 1e9:.1f} GB in fp32")
print(f"KV cache for 8 x 2048 tokens: {ex['kv_bytes_per_gpu'] / 1e9:.1f} GB per GPU")
print(f"{ex['allreduces_per_token']} all-reduces per token; each GPU sends {ex['sent_bytes_per_token'] / 2**20:.1f} MiB")
for k, s in ex["comm_s_per_token"].items():
    print(f"  all-reduce time per token over {LINKS[k].name}: {s * 1e3:.1f} ms")
assert 10.8e9 < ex["params_per_gpu"] < 11.0e9 and 21.6e9 < ex["weight_bytes_per_gpu"] < 22.0e9

# %% [markdown] id="c023"
# > **Claim checked.** The notes file tensor parallelism under "computational efficiency: reduce FLOPs".
# > It does not reduce FLOPs: every multiply-add of the model is still done once, by some GPU, and the
# > all-reduces come on top. It divides the work and the **bytes** each GPU reads per token (and the memory
# > each holds), which is what makes a decode step faster. Counted on the tiny model's shards (every
# > linear layer's weight elements = its multiply-adds per token):

# %% id="c024"
lin_elems = {}
for p_ in (1, 2):
    per_rank = []
    for r in range(p_):
        f = shard_range(tiny.intermediate_size, r, p_)
        qh, kh = shard_range(tiny.num_attention_heads, r, p_), shard_range(tiny.num_key_value_heads, r, p_)
        heads = (qh.stop - qh.start) + 2 * (kh.stop - kh.start)
        attn = heads * tiny.head_dim * tiny.hidden_size + (qh.stop - qh.start) * tiny.head_dim * tiny.hidden_size
        per_rank.append(tiny.num_hidden_layers * (attn + 3 * (f.stop - f.start) * tiny.hidden_size))
    lin_elems[p_] = per_rank
    print(f"TP={p_}: multiply-adds per token in the layers' linears, per rank {per_rank}, in all {sum(per_rank)}")
assert sum(lin_elems[2]) == sum(lin_elems[1]) and max(lin_elems[2]) == lin_elems[1][0] // 2

# %% [markdown] id="c025"
# ## 5 · Measured here: time per token at TP = 1, 2, 4
#
# The same decode loop, sharded over 1, 2 and 4 gloo processes on this machine (one torch thread each),
# against the model `t_p = t_1 / p' + 2L · t_allreduce`, with `t_1` and `t_allreduce` measured and
# `p' = min(p, cores)` (ranks beyond the cores only take turns). On a CPU, gloo's all-reduce goes through
# the operating system's TCP stack and costs far more than NVLink's microseconds (the table measures it),
# and the cores may be shared with other work: read the table as a measurement of *this* machine, where
# the all-reduces, not the arithmetic, decide whether TP pays.

# %% id="c026"
TIMED = LlamaConfig(vocab_size=512, hidden_size=TIMING_HIDDEN, intermediate_size=2 * TIMING_HIDDEN,
                    num_hidden_layers=TIMING_LAYERS, num_attention_heads=8, num_key_value_heads=4,
                    max_position_embeddings=256)
spec = ModelSpec(config=TIMED, seed=0)
timing = {}
for p_ in (1, 2, 4):
    timing[p_] = launch(tp_timing, p_, args=(spec,), kwargs=dict(new_tokens=TIMING_TOKENS, repeats=TIMING_REPEATS))[0]
t1 = timing[1]["step_s"]
rows = []
for p_, res in timing.items():
    pred = time_model(t1, p_, 2 * TIMED.num_hidden_layers, res["allreduce_s"], parallel_cores=CORES)
    rows.append([p_, f"{res['step_s'] * 1e3:.2f}", f"{res['allreduce_s'] * 1e6:.0f}", f"{pred * 1e3:.2f}",
                 f"{res['step_s'] / pred:.2f}"])
print(format_table(["TP", "measured ms/token", "all-reduce µs", "model ms/token", "measured / model"], rows,
                   fmt="text", note=f"CPU, {CORES} cores, gloo, D={TIMING_HIDDEN}, {TIMING_LAYERS} layers"))
assert all(res["step_s"] > 0 and res["allreduce_s"] > 0 for res in timing.values())
nvlink_s = allreduce_time(TIMING_HIDDEN * 4, 2, "nvlink4")
timing_claim("gloo's all-reduce on this CPU costs over 10x NVLink's (model) for the same bytes",
             held=timing[2]["allreduce_s"] > 10 * nvlink_s,
             measured=f"gloo {timing[2]['allreduce_s'] * 1e6:.0f} µs at TP=2, NVLink model {nvlink_s * 1e6:.1f} µs");

# %% [markdown] id="c027"
# On GPUs the same code runs with NCCL, one GPU per rank (`launch(tp_timing, p, backend="nccl")`). This
# cell runs it when the machine has more than one GPU; a single GPU can only measure TP=1.

# %% id="c028"
n_gpu = torch.cuda.device_count()
if n_gpu > 1:
    gpu_spec = ModelSpec(config=preset("smollm2-360m"), seed=0)
    for p_ in [d for d in (1, 2, 4, 8) if d <= n_gpu and d in tp_degrees(gpu_spec.config)]:
        res = launch(tp_timing, p_, args=(gpu_spec,), kwargs=dict(new_tokens=64), backend="nccl")[0]
        print(f"TP={p_} on {p_} GPU(s), NCCL: {res['step_s'] * 1e3:.2f} ms/token, all-reduce {res['allreduce_s'] * 1e6:.0f} µs")
else:
    print(f"{n_gpu} GPU(s) here: with 2 or more, this cell times TP = 1, 2, 4, 8 with NCCL. Expect an "
          f"all-reduce of a few KiB in ~10-30 µs over NVLink, so TP pays off once a step's weight reads "
          f"take well over 2L of those.")

# %% [markdown] id="c029"
# ## 6 · Pipeline parallelism and its bubble
#
# Cut the layers into `p` stages, one per rank. A batch is split into `m` micro-batches: stage `s` runs
# micro-batch `i` once it has finished `i-1` and stage `s-1` has handed over `i`. With equal stage times
# the run takes `m + p - 1` stage-times, each rank is busy for `m` of them, and the idle share, the
# **bubble**, is `(p-1)/(m+p-1)` (GPipe's analysis [@huang2019gpipe]). The ideal schedule:

# %% id="c030"
sch = gpipe_schedule(4, 6)
fig, ax = plt.subplots(figsize=(7, 2.4))
for s, i, a, b in sch:
    ax.barh(s, b - a, left=a, color=plt.cm.tab10(i % 10), edgecolor="k")
    ax.text((a + b) / 2, s, str(i), ha="center", va="center")
ax.set_yticks(range(4), [f"stage {s}" for s in range(4)])
ax.invert_yaxis()
ax.set_xlabel("time (stage-times)")
ax.set_title(f"GPipe forward, p=4, m=6: bubble {bubble_fraction(sch, 4):.3f} = 3/9")
plt.show()
assert abs(bubble_fraction(sch, 4) - bubble_formula(4, 6)) < 1e-12

# %% [markdown] id="c031"
# `pipeline_run` does it with real ranks: rank 0 embeds and runs the first half of the layers, sends the
# activations (`dist.isend`) and goes on with the next micro-batch; rank 1 receives, runs the second half
# and the LM head. Each stage also waits `STAGE_SLEEP_S` per micro-batch: on a GPU a stage's time is
# kernel time, during which the CPU is free; the wait stands for it and makes the measurement mostly
# independent of how busy this machine's cores are. The logits must equal the full model's (asserted), and
# the measured bubble should follow the formula, plus the transfers (a timing: the claims below say whether
# it did on this run):

# %% id="c032"
pipe_spec = ModelSpec(config=SMALL, seed=3)
steps = [(pipeline_run, (pipe_spec, m), dict(batch=max(MICRO_BATCHES), seq=8, stage_sleep_s=STAGE_SLEEP_S))
         for m in MICRO_BATCHES]
pipe = launch(sequence, 2, args=(steps,))[0]
measured = [r["bubble"] for r in pipe]
formula = [r["formula"] for r in pipe]
for r in pipe:
    print(f"m={r['m']:>2}: bubble measured {r['bubble']:.3f}, formula (p-1)/(m+p-1) = {r['formula']:.3f}, "
          f"max |Δ logits| {r['max_abs_diff']:.1e}")
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(MICRO_BATCHES, formula, "o-", label="(p-1)/(m+p-1)")
ax.plot(MICRO_BATCHES, measured, "s--", label="measured, 2 gloo ranks")
ax.set_xscale("log", base=2)
ax.set_xlabel("micro-batches m")
ax.set_ylabel("bubble (idle share)")
ax.legend()
plt.show()
assert all(r["max_abs_diff"] < 1e-4 for r in pipe)
shown = ", ".join(f"m={r['m']}: {r['bubble']:.3f} vs {r['formula']:.3f}" for r in pipe)
timing_claim("the measured bubble follows (p-1)/(m+p-1): within -0.05 to +0.3 (the transfers) of it",
             held=all(f - 0.05 < m_ < f + 0.3 for m_, f in zip(measured, formula)), measured=shown)
timing_claim(f"more micro-batches shrink the bubble: m={MICRO_BATCHES[-1]} idles less than m={MICRO_BATCHES[0]}",
             held=measured[-1] < measured[0], measured=shown);

# %% [markdown] id="c033"
# More micro-batches shrink the bubble, but each is smaller: on a GPU a tiny micro-batch runs at poor
# efficiency, and every boundary costs a transfer. For decoding (one token per step) the pipeline is
# filled with *different requests* rather than slices of one batch.
#
# ## 7 · Expert parallelism and context parallelism: two more collectives
#
# **Expert parallelism (EP).** A mixture-of-experts layer (Module 10) holds `E` expert MLPs; with EP each
# of `p` ranks holds `E/p` whole experts, and each token's `k` assignments travel to the ranks of their
# experts (the *dispatch* all-to-all) and the outputs travel back (the *combine* all-to-all), as GShard
# shards its experts [@lepikhin2021gshard]. An all-to-all of a `B`-byte buffer sends `(p-1)/p · B` per rank
# (the share for the rank's own experts stays). Counting one row per (token, expert) assignment, as we do
# here, is an **upper bound**: when two of a token's `k` experts live on the same rank, a dispatch can send
# the token there once and let that rank hand it to both, as DeepEP's high-throughput kernels do (their
# layout marks, per token, which ranks it goes to: `is_token_in_rank`) [@zhao2025deepep]. That is the mean; the step waits for the **most loaded
# rank**, whose experts compute, and whose links carry, `imbalance = max rank load / mean rank load` times the
# mean. The load is the router's statistic, the one the balancing loss of Switch Transformer
# [@fedus2022switch] pushes towards even. Measured on a small random MoE with the course's router, then
# checked against a simulation that builds each rank's per-destination buffers and counts the bytes moved:

# %% id="c035"
torch.manual_seed(0)
EP, E_, K_, T_RANK = 4, 8, 2, 256                    # ranks, experts, top-k, tokens per rank
moe = MoEMLP(64, 128, num_experts=E_, k=K_, capacity_factor=None)
x_ep = torch.randn(EP * T_RANK, 64)
with torch.no_grad():
    moe(x_ep)
    _, ids_ep, _ = moe.router(x_ep)
load_ep = moe.stats["load"]
assert torch.equal(load_ep, torch.bincount(ids_ep.reshape(-1), minlength=E_))
sim = simulate_ep_dispatch(ids_ep.view(EP, T_RANK, K_), E_, hidden=64, dtype=torch.bfloat16)
ep_small = ep_moe_layer_comm(T_RANK, 64, K_, EP, bpe=2, load=load_ep)
print(f"router load per expert {load_ep.tolist()} -> per rank {rank_loads(load_ep, EP).tolist()}, "
      f"imbalance {ep_small['imbalance']:.2f}")
print(f"dispatch bytes received per rank (simulated): {sim['received']}; model: mean "
      f"{ep_small['sent_bytes_per_alltoall']:.0f}, most loaded {ep_small['max_rank_bytes_per_layer'] / 2:.0f}")
assert sum(sim["received"]) == sum(sim["sent"]) and max(sim["received"]) <= max(sim["rank_load"]) * sim["bytes_per_row"]
assert abs(max(sim["received"]) / (ep_small["max_rank_bytes_per_layer"] / 2) - 1) < 0.15

# the upper bound against a dispatch that sends a token once per destination rank, on this routing and on
# a router skewed towards experts 0 and 1 (both on rank 0, so more tokens have both experts on one rank)
rows_ep = ep_dispatch_rows(ids_ep.view(EP, T_RANK, K_), E_)
assert [b // sim["bytes_per_row"] for b in sim["sent"]] == rows_ep["per_assignment"]   # the simulation's rows
skewed_router = copy.deepcopy(moe.router)
with torch.no_grad():
    skewed_router.gate.weight[:2] += 0.03
    _, ids_skew, _ = skewed_router(x_ep + 0.5)
rows_skew = ep_dispatch_rows(ids_skew.view(EP, T_RANK, K_), E_)
load_skew = torch.bincount(ids_skew.reshape(-1), minlength=E_)
for name, r, ld in (("this router", rows_ep, load_ep), ("skewed router", rows_skew, load_skew)):
    print(f"{name:>13}: rows sent, once per assignment {sum(r['per_assignment'])}, once per (token, rank) "
          f"{sum(r['per_rank'])}: {r['ratio']:.1%} of the bound's bytes (imbalance {load_imbalance(ld, EP):.2f})")
assert rows_skew["ratio"] < rows_ep["ratio"] < 1.0
assert ep_dispatch_rows(ids_ep.view(8, -1, K_), E_)["ratio"] == 1.0   # one expert per rank: nothing to merge

# %% [markdown] id="c036"
# The simulation and the model agree for the most loaded rank (the model assumes its tokens come from all
# ranks alike, so a share `1/p` stays local; the simulation counts what did). Sending a token once per
# destination rank saves what the routing puts on a shared rank: a few percent for this nearly even router
# over 4 ranks of 2 experts, more for the skewed one, whose favourite experts share rank 0, and nothing at
# all with one expert per rank, where a token's `k` distinct experts are always on `k` distinct ranks (the
# table below is that case, so the bound is exact there). Scaled to a layer of
# hidden size 4096 with 8 experts and top-2 routing at EP=8 (one expert per rank), 4096 tokens per rank in
# bf16, evenly routed and with this router's load per expert:

# %% id="c037"
rows = []
for key in ("nvlink4", "infiniband-ndr"):
    even = ep_moe_layer_comm(4096, 4096, 2, 8, bpe=2, link=key)
    skew = ep_moe_layer_comm(4096, 4096, 2, 8, bpe=2, link=key, load=load_ep)     # one expert per rank
    rows.append([LINKS[key].name, f"{even['sent_bytes_per_alltoall'] / 2**20:.0f}", f"{even['comm_s'] * 1e3:.2f}",
                 f"{skew['imbalance']:.2f}", f"{skew['comm_s'] * 1e3:.2f}"])
    assert skew["comm_s"] >= even["comm_s"]                      # the slowest rank sets the step
print(format_table(["link", "MiB sent per all-to-all", "ms per layer (2 all-to-alls), even", "imbalance",
                    "ms per layer, this router"], rows, fmt="text"))
assert ep_moe_layer_comm(4096, 4096, 2, 8)["sent_bytes_per_alltoall"] == 7 / 8 * 4096 * 2 * 4096 * 2

# %% [markdown] id="c038"
# The imbalance multiplies the expert compute too: the most loaded rank runs `imbalance ×` the mean
# number of expert rows. This router is untrained and its inputs random, so its load is close to even, and
# closer over 4 ranks of 2 experts than with one expert per rank: a rank's experts average each other out.
# A router whose load drifts (Module 10 measures it over training) pays the factor on every MoE layer; the
# balancing loss and a capacity factor are what keep it near 1.
#
# **Context parallelism (CP): ring attention.** A prompt of `N` tokens too long for one GPU's attention
# is cut into `p` blocks of `c = N/p` tokens, one per rank. Each rank keeps its block's queries and passes
# its K,V block around a ring: at each of `p` steps it attends to the block it holds and merges the partial
# result by the online-softmax rule of Module 07, then hands the block on [@liu2024ring]. Per layer each rank
# sends `(p-1)` blocks, `(p-1)/p · 2·N·K·Dh·bpe` bytes. The transfer hides behind the block's attention when
# `4c²·H·Dh / F ≥ 2c·K·Dh·bpe / B + latency` (`F` FLOP/s, `B` bytes/s): the block must be long enough.
# First the check, ring attention with `p` simulated ranks in one process against full attention:

# %% id="c039"
torch.manual_seed(0)
q_cp, k_cp, v_cp = torch.randn(1, 4, 48, 16), torch.randn(1, 2, 48, 16), torch.randn(1, 2, 48, 16)
for p_ in (2, 4, 6):
    for causal in (False, True):
        out_cp, sent_cp = simulate_ring_attention(q_cp, k_cp, v_cp, p_, causal=causal)
        err = (out_cp - reference_attention(q_cp, k_cp, v_cp, causal=causal)).abs().max().item()
        assert err < 1e-5 and sent_cp == [ring_attention_comm(48, 2, 16, p_, bpe=4)["sent_bytes_per_layer"]] * p_
    print(f"p={p_}: equal to full attention (causal and not, max error {err:.1e}); each rank passed "
          f"{sent_cp[0]} bytes = (p-1)/p * 2 N K Dh bpe")

# %% [markdown] id="c040"
# Now Llama-3.1-8B (8 KV heads of 128, 32 layers) on a 131072-token prompt in bf16, at CP=8 on H100s:

# %% id="c041"
llama31 = preset("llama-3.1-8b")
N_CP, P_CP = 131072, 8
cp = ring_attention_comm(N_CP, llama31.num_key_value_heads, llama31.head_dim, P_CP, bpe=2,
                         layers=llama31.num_hidden_layers)
print(f"block of {cp['block_tokens']} tokens, K,V {cp['block_bytes'] / 2**20:.0f} MiB; each rank sends "
      f"{cp['sent_bytes_per_layer'] / 2**20:.0f} MiB per layer, {cp['sent_bytes'] / 2**30:.1f} GiB per prompt")
assert cp["sent_bytes_per_layer"] == 7 * 16384 * 2 * 8 * 128 * 2
peak = h100.peak_flops("bf16")
rows = []
for key in ("nvlink4", "pcie5", "infiniband-ndr", "ethernet-100g"):
    ov = ring_attention_overlap(llama31.num_attention_heads, llama31.num_key_value_heads, llama31.head_dim, key,
                                peak, bpe=2, block_tokens=cp["block_tokens"])
    rows.append([LINKS[key].name, ov["min_block_tokens"], P_CP * ov["min_block_tokens"],
                 f"{ov['compute_s'] * 1e3:.2f}", f"{ov['transfer_s'] * 1e3:.2f}", "yes" if ov["overlaps"] else "no"])
print(format_table(["link", "min block (tokens)", f"min prompt at CP={P_CP}", "block compute ms",
                    "block transfer ms", f"hidden at N={N_CP}"], rows, fmt="text"))
assert rows[0][1] < rows[1][1] < rows[2][1] < rows[3][1]

# %% [markdown] id="c042"
# The compute grows as `c²` and the transfer as `c`, so any link hides its transfers behind a long enough
# block; a slower link needs longer blocks, so fewer ranks for the same prompt. At peak FLOP/s the condition
# is the strictest: a real kernel reaches a fraction of the peak, which shortens the minimum block. With a
# causal mask rank `r` sees `r` whole blocks and one half block and skips the rest, so the ranks' work is
# unequal (the last does the most), and reordering the tokens over the ranks is what evens it out.
#
# ## Summary
#
# * Column-parallel then row-parallel: one all-reduce per pair; the row-parallel bias is added once,
#   after the sum (added on every rank it is counted `p` times).
# * Attention shards by whole heads; with GQA the KV heads are divided too, so `p` must divide the KV heads;
#   a fused QKV matrix is split into Q, K, V before sharding. The sharded model gives the same logits,
#   batched and with a KV cache, as does PyTorch's `parallelize_module` with `ColwiseParallel`/`RowwiseParallel`.
# * TP costs `2L` all-reduces per token: bandwidth `2(p-1)/p` of the activations each, and latency
#   `2(p-1)` hops each: keep it on NVLink. PP crosses machines; its bubble is `(p-1)/(m+p-1)`.
# * "11B parameters per GPU" is 22 GB in fp16 before the KV cache: count bytes, not parameters.
# * EP: two all-to-alls per MoE layer of `(p-1)/p` of the routed tokens' bytes each, times the router's
#   imbalance (max rank load / mean); one row per assignment is the upper bound, a token sent once per
#   destination rank moves less when a rank holds several of its experts. CP by ring attention: `(p-1)/p · 2·N·K·Dh·bpe` bytes per rank per
#   layer, hidden behind the blocks' attention once a block holds enough tokens for the link.

# %% [markdown] id="c034"
# ## Further reading
#
# Used in this notebook:
#
# * [@shoeybi2019megatron]: Megatron-LM's column/row-parallel split, one all-reduce per MLP and per attention.
# * [@patarasuk2009bandwidth]: the ring all-reduce and its bandwidth optimality, `2(p-1)/p` of the data per rank.
# * [@huang2019gpipe]: GPipe's micro-batched pipeline and its bubble.
# * [@lepikhin2021gshard; @fedus2022switch]: experts sharded over devices with all-to-all dispatch, and the
#   load statistics that set the slowest rank; [@liu2024ring]: ring attention, K,V blocks passed around a
#   ring while each block's attention runs.
# * [@graham2016scalable; @nvidia2022upgrading]: all-reduce in the switch (InfiniBand SHARP, NVLink SHARP),
#   the case the ring's bound leaves out; [@zhao2025deepep]: DeepEP, expert-parallel dispatch and combine
#   kernels that send a token once per destination rank.
#
# To go further:
#
# * [@narayanan2021efficient]: TP inside a node, PP across nodes, data parallelism on top, and the
#   interleaved schedule that shrinks the bubble, at the scale of thousands of GPUs.
# * [@rajbhandari2020zero]: ZeRO, sharding the training state that TP and PP leave replicated.
