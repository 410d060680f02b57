# %% [markdown] id="c002"
# # Module 06 · PagedAttention
#
# A server decodes many sequences at once, and none of them knows in advance how long it will get: a
# request asks for "at most 1024 new tokens" and may stop after 40. Module 05 showed that the KV cache,
# not the weights, decides how many sequences fit in memory. So how that memory is handed out decides the
# batch size, and with it the throughput.
#
# Before vLLM [@kwon2023efficient], serving systems gave each request one **contiguous** region big enough
# for the longest output it might produce. PagedAttention borrows the operating system's answer to the same problem,
# virtual memory: cut the KV memory into fixed-size **blocks**, give each sequence a **block table**
# (logical block -> physical block, like a page table), allocate a block only when the previous one is
# full, and let attention read K/V through the table. This notebook builds and measures all of it with
# `course_lib.paged`:
#
# 1. the waste of contiguous reservation vs paging on a realistic workload (internal and external
#    fragmentation), with the block size as a knob;
# 2. the block allocator and block tables, running out of blocks, preemption;
# 3. attention through a block table (PyTorch reference, Triton kernel), and the course model generating
#    from paged memory;
# 4. copy-on-write for parallel sampling and beam search, and prefix caching with hashed blocks;
# 5. an interactive visualizer.

# %% id="c003" tags=["parameters"]
import course_lib.env

QUICK = course_lib.env.quick()
N_REQUESTS = 150 if QUICK else 1000          # requests in the simulated workload
MEMORY_SLOTS = 16384 if QUICK else 65536     # KV memory of the simulated server, in token slots
BLOCK_SIZE = 16
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
SAMPLES = 4                                  # parallel samples in the copy-on-write demo
SAMPLE_TOKENS = 12 if QUICK else 48

# %% id="c004"
import os
import subprocess
import sys
import textwrap

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache
from course_lib.models import load
from course_lib.perf.tables import format_records
from course_lib.paged import (BlockManager, KVPool, OutOfBlocks, PagedCache, PagingError, contiguous_to_paged,
                              paged_attention_reference, simulate_waste)
from course_lib.perf.workload import limited_workload
from course_lib.viz.paged import PagedVisualizer

device = course_lib.env.device()
model, tok = load("tiny", device=device)
cfg = model.config
print(f"model {model.name} on {device}")

# %% [markdown] id="c005"
# ## 1. Where contiguous reservation wastes memory
#
# A seeded synthetic workload shaped like chat traces: prompt and output lengths are log-normal (many
# short, a long tail), and each request carries an API-style `max_new_tokens` limit (256 to 2048) that
# its real output rarely reaches.

# %% id="c006"
workload = limited_workload(N_REQUESTS, seed=0)
P = torch.tensor([r.prompt_tokens for r in workload], dtype=torch.float)
O = torch.tensor([r.output_tokens for r in workload], dtype=torch.float)
M = torch.tensor([r.max_new_tokens for r in workload], dtype=torch.float)
print(f"{N_REQUESTS} requests: prompt median {P.median():.0f} (max {P.max():.0f}), output median {O.median():.0f} "
      f"(max {O.max():.0f}), max_new_tokens mean {M.mean():.0f}; outputs use {(O / M).mean():.0%} of their limit")
fig, ax = plt.subplots(figsize=(7, 3))
ax.hist([P.numpy(), O.numpy()], bins=40, label=["prompt tokens", "output tokens"])
ax.set(xlabel="tokens", ylabel="requests", title="workload lengths")
ax.legend()
plt.show()

# %% [markdown] id="c007"
# We serve this workload twice on the same simulated server (`MEMORY_SLOTS` token slots of KV memory,
# first come first served, one token per running request per step), and account for every slot at every
# step:
#
# * **used**: holds a token's K/V;
# * **reserved**: reserved by a contiguous request for tokens it will produce later;
# * **internal fragmentation**: allocated but never filled - the part of a contiguous reservation beyond
#   the request's real length, or the unfilled tail of a paged sequence's last block;
# * **external fragmentation**: free memory nobody can use - the next request does not fit in any free
#   hole although the free total would be enough.
#
# Contiguous: each request reserves its maximum length in one piece, first fit - either
# `prompt + max_new_tokens` (its own limit) or the model's whole 2048-token context (every reservation the
# same size). Paged: blocks of `BLOCK_SIZE` slots, one more whenever the last fills; when a step finds no
# free block the newest request is **preempted** (its blocks freed; it is re-queued and recomputed later).

# %% id="c008"
contig = simulate_waste(workload, MEMORY_SLOTS, "contiguous", reserve="request")
contig_ctx = simulate_waste(workload, MEMORY_SLOTS, "contiguous", reserve="context", max_context=2048)
paged = simulate_waste(workload, MEMORY_SLOTS, "paged", block_size=BLOCK_SIZE)
print(format_records([contig.row(), contig_ctx.row(), paged.row()], floatfmt=".1f"))

fig, ax = plt.subplots(figsize=(7, 2.8))
left = [0.0, 0.0, 0.0]
for part, color in (("used", "tab:green"), ("reserved", "tab:orange"), ("internal", "tab:red"),
                    ("external", "tab:gray")):
    vals = [100 * r.fraction(part) for r in (contig_ctx, contig, paged)]
    ax.barh(["contiguous (context)", "contiguous (request)", f"paged (block {BLOCK_SIZE})"], vals, left=left,
            color=color, label=part)
    left = [a + b for a, b in zip(left, vals)]
ax.set(xlabel="% of KV memory held, over the whole run")
ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
plt.tight_layout()
plt.show()

# %% id="c009"
assert paged.waste <= 0.04, paged.waste
assert contig.waste >= 0.60, contig.waste
assert contig_ctx.waste >= 0.60 and contig_ctx.external == 0     # equal-size slots: no holes, more waste
assert paged.reserved == 0 and paged.external == 0 and contig.external > 0
assert paged.finished == contig.finished == contig_ctx.finished == N_REQUESTS
print(f"waste: contiguous per request {contig.waste:.1%} (reserved {contig.fraction('reserved'):.1%}, internal "
      f"{contig.fraction('internal'):.1%}, external {contig.fraction('external'):.1%}); contiguous per context "
      f"{contig_ctx.waste:.1%}; paged {paged.waste:.1%} (all internal, in last blocks)")
print(f"mean batch: contiguous {contig.mean_batch:.1f}, paged {paged.mean_batch:.1f} sequences; steps to serve "
      f"everything: {contig.steps} vs {paged.steps} ({contig.steps / paged.steps:.2f}x); paged preemptions: "
      f"{paged.preemptions}")
assert paged.mean_batch > contig.mean_batch and paged.steps < contig.steps

# %% [markdown] id="c010"
# Paging wastes at most `block_size - 1` slots per sequence, in its last block, and nothing else: no
# reservation for the future and no holes between allocations, because any free block fits anywhere. The
# memory it saves becomes batch size: more sequences decode together and the whole workload is served
# in fewer steps. The price is preemption: the scheduler admits requests optimistically, and when memory
# runs out mid-decode it must evict someone (Module 09's schedulers decide whom).
#
# > **Claim checked.** Course notes describe a "block-based KV cache (Llama 3)" and say paging
# > "prevents fragmentation". Paging belongs to the serving engine (vLLM, SGLang, TensorRT-LLM...; TGI too,
# > archived in March 2026 [@huggingface2025text]), not to a model: it works for any decoder. And it does
# > not remove fragmentation: it removes the external kind and the reservation, and bounds the internal
# > kind to less than one block per sequence - measured above.
#
# ### The block size knob
#
# Small blocks waste less in the last block; large blocks mean shorter block tables and longer contiguous
# reads for the attention kernel (vLLM's default is 16). Expected internal waste: about
# `(block_size - 1) / 2` slots per sequence over its mean length.

# %% id="c011"
sweep = [simulate_waste(workload, MEMORY_SLOTS, "paged", block_size=bs) for bs in BLOCK_SIZES]
mean_len = paged.used / paged.batch_sum                             # mean length of a running sequence
print(format_records([{"block size": bs, "waste %": 100 * r.waste,
                     "estimate %": 100 * (bs - 1) / 2 / (mean_len + (bs - 1) / 2),
                     "mean batch": r.mean_batch, "steps": r.steps} for bs, r in zip(BLOCK_SIZES, sweep)],
                   floatfmt=".2f"))
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(BLOCK_SIZES, [100 * r.waste for r in sweep], "o-", label="paged")
ax.axhline(100 * contig.waste, color="tab:red", ls="--", label="contiguous")
ax.set(xscale="log", xlabel="block size (tokens)", ylabel="KV memory wasted (%)")
ax.set_xticks(BLOCK_SIZES, [str(b) for b in BLOCK_SIZES])
ax.legend()
plt.show()
waste = {bs: r.waste for bs, r in zip(BLOCK_SIZES, sweep)}
assert waste[1] == 0 and waste[16] <= 0.04 and waste[128] > waste[16] > waste[4]
assert all(w < contig.waste for w in waste.values())

# %% [markdown] id="c012"
# ## 2. Blocks, block tables, and running out
#
# `BlockManager` keeps a free list and a reference count per physical block (`BlockAllocator`), and a
# block table per sequence. A sequence of `n` tokens owns exactly `ceil(n / block_size)` blocks: the next
# block is allocated by the append that finds the last block full - not earlier, not later.

# %% id="c013"
mgr = BlockManager(num_blocks=8, block_size=4)
mgr.add_sequence("a", list(range(10)))
print("a:", mgr.num_tokens("a"), "tokens, table", mgr.block_table("a"))
history = []
for t in range(10, 19):
    mgr.append("a", t)
    history.append((mgr.num_tokens("a"), len(mgr.block_table("a"))))
print("(tokens, blocks) after each append:", history)
assert all(blocks == -(-n // 4) for n, blocks in history)
assert [n for (n, b), (_, b_prev) in zip(history[1:], history) if b > b_prev] == [13, 17]   # 4k + 1
mgr.add_sequence("b", list(range(6)))
print("tables:", {s: mgr.block_table(s) for s in ("a", "b")}, "free blocks:", mgr.num_free_blocks)
mgr.free("a")
print("after freeing a: free blocks", mgr.num_free_blocks)
for bad in (lambda: mgr.free("a"), lambda: mgr.allocator.free(0), lambda: mgr.add_sequence("c", []),
            lambda: mgr.blocks_needed("b", -2)):
    try:
        bad()
        raise AssertionError("expected a PagingError")
    except PagingError as e:
        print("PagingError:", e)
mgr.check_invariants()

# %% [markdown] id="c014"
# **Out of blocks** is not a bug but a signal: the manager raises `OutOfBlocks` and changes nothing, and
# the scheduler decides what to do. A minimal decode loop that preempts the newest sequence (recompute
# later) when a step cannot get a block:

# %% id="c015"
mgr = BlockManager(num_blocks=6, block_size=4)
running, waiting, log = ["x", "y", "z"], [], []
for s in running:
    mgr.add_sequence(s, [1, 2, 3])
for step in range(8):
    for s in list(running):
        if s not in running:                                   # preempted earlier in this step
            continue
        try:
            mgr.append(s, step)
        except OutOfBlocks as e:
            before = (mgr.num_free_blocks, mgr.num_tokens(s))
            victim = running.pop()                              # the newest
            mgr.free(victim)
            waiting.append(victim)
            log.append(f"step {step}: {s} needed a block ({e}); preempted {victim}")
            if victim != s:
                mgr.append(s, step)
    mgr.check_invariants()
print("\n".join(log))
print("running:", running, "waiting for recompute:", waiting, "free blocks:", mgr.num_free_blocks)
assert waiting and mgr.num_free_blocks >= 0

# %% [markdown] id="c016"
# ## 3. Attention through a block table
#
# In a decode step each sequence has one query and its K/V spread over blocks anywhere in the pool. The
# reference implementation gathers them into a contiguous tensor through the block table and calls
# ordinary attention; it must equal `torch`'s scaled-dot-product attention on the original contiguous
# K/V. The blocks below are deliberately scattered (a random permutation of the pool).

# %% id="c017"
g = torch.Generator().manual_seed(0)
B, H, K, Dh, bs = 3, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 16
lengths = [37, 16, 5]
k = torch.randn(B, K, max(lengths), Dh, generator=g)
v = torch.randn(B, K, max(lengths), Dh, generator=g)
q = torch.randn(B, H, Dh, generator=g)
k_pool, v_pool, tables, lens = contiguous_to_paged(k, v, lengths, bs, generator=g)
print("block tables (physical blocks, padded):", tables.tolist())
ref = paged_attention_reference(q, k_pool, v_pool, tables, lens)
sdpa = torch.stack([F.scaled_dot_product_attention(
    q[b][None, :, None], k[b, :, :lengths[b]].repeat_interleave(H // K, 0)[None],
    v[b, :, :lengths[b]].repeat_interleave(H // K, 0)[None])[0, :, 0] for b in range(B)])
print(f"max |paged reference - SDPA| = {(ref - sdpa).abs().max():.1e}")
assert torch.allclose(ref, sdpa, atol=1e-5)

# %% [markdown] id="c018"
# The Triton kernel (`course_lib/paged/triton_paged.py`) does not gather: one program per (sequence,
# query head) walks the sequence's block table, loads each block's keys and values in place, and folds
# them into a running softmax (the online softmax of Module 07). On a GPU Triton supports (compute
# capability >= 8.0: an A100, an H100) it runs natively. On a CPU, and on Colab's usual T4 (compute
# capability 7.5, which Triton does not support), we run it under Triton's interpreter instead
# (`TRITON_INTERPRET=1`, which must be set before Triton is imported, hence a separate process); there
# `backend="auto"` takes the vectorized PyTorch path, and on a T4 says so once, in one line.

# %% id="c019"
if course_lib.env.triton_gpu_supported():
    from course_lib.paged.triton_paged import paged_attention_triton
    from course_lib.perf.timing import benchmark
    args = [t.cuda() for t in (q, k_pool, v_pool, tables, lens)]
    out = paged_attention_triton(*args)
    assert torch.allclose(out.cpu(), sdpa, atol=1e-4)
    print(f"Triton on {torch.cuda.get_device_name()}: max error {(out.cpu() - sdpa).abs().max():.1e}, "
          f"{benchmark(paged_attention_triton, *args, device='cuda').median * 1e6:.0f} us per call")
elif course_lib.env.has_package("triton"):
    script = textwrap.dedent("""
        import torch
        from course_lib.paged import contiguous_to_paged, paged_attention_reference
        from course_lib.paged.triton_paged import paged_attention_triton
        g = torch.Generator().manual_seed(0)
        k, v = torch.randn(3, 2, 37, 32, generator=g), torch.randn(3, 2, 37, 32, generator=g)
        q = torch.randn(3, 8, 32, generator=g)
        kp, vp, tb, ln = contiguous_to_paged(k, v, [37, 16, 5], 16, generator=g)
        err = (paged_attention_triton(q, kp, vp, tb, ln) - paged_attention_reference(q, kp, vp, tb, ln)).abs().max()
        print(f"{err.item():.3e}")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    err = float(res.stdout.strip().splitlines()[-1])
    assert err < 1e-4
    print(f"Triton kernel under the CPU interpreter: max |Triton - reference| = {err:.1e}. On a GPU Triton "
          "supports this cell runs it natively and times it.")
    from course_lib.attention import triton_status
    print(triton_status()[1])                            # why not natively here: no CUDA GPU, or a T4
else:
    print("Triton is not installed here; on a GPU with Triton this cell runs and times the kernel.")

# %% [markdown] id="c020"
# ### The course model on paged memory
#
# `PagedCache` puts a `BlockManager` and a pool of physical blocks (`KVPool`, one `[blocks, kv_heads,
# block_size, head_dim]` tensor per layer for K and for V) behind the cache contract of Module 05. The
# model writes each new token's K/V into its slot and reads every sequence back through its block
# table: a decode step with `paged_attention` (the Triton kernel on a GPU Triton supports, a vectorized
# gather on a CPU or a T4: `cache.decode_backend` says which), a prefill with one gather of the rows' blocks. Three prompts of different lengths decode **in one batch**
# (each row gets its own positions and mask); each must produce exactly what it produces alone with a
# contiguous cache. The serving engine of Module 09 runs on this same `PagedCache`.

# %% id="c021"
prompts = {name: torch.randint(1, cfg.vocab_size, (n,), generator=g).tolist()
           for name, n in (("r0", 5), ("r1", 19), ("r2", 9))}
pmgr = BlockManager(num_blocks=64, block_size=4)
cache = PagedCache(pmgr, KVPool.for_model(model, 64, 4))
print("decode attention here:", cache.decode_backend)             # "auto" resolved for this device
assert cache.decode_backend == ("triton" if device.type == "cuda" and course_lib.env.triton_gpu_supported()
                                else "torch")
logits = {}
with torch.no_grad():
    for s, p in prompts.items():                        # prefill each prompt
        cache.add_sequence(s, p)
        cache.set_active([s])
        logits[s] = [model(torch.tensor(p, device=device)[None], cache=cache)[0, -1]]
    cache.set_active(list(prompts))
    for step in range(SAMPLE_TOKENS):                   # decode all three together
        nxt = [int(logits[s][-1].argmax()) for s in prompts]
        cache.append(list(prompts), nxt)
        out = model(torch.tensor(nxt, device=device)[:, None], cache=cache, positions=cache.positions(1),
                    attn_mask=cache.attn_mask(1))
        for i, s in enumerate(prompts):
            logits[s].append(out[i, -1])
for s, p in prompts.items():
    want = generate(model, p, SAMPLE_TOKENS + 1, cache=ContiguousCache(), return_logits=True).logits  # [n, V]
    assert torch.allclose(torch.stack(logits[s]), want, atol=1e-3)
    print(f"{s}: {pmgr.num_tokens(s)} tokens in blocks {pmgr.block_table(s)} - same logits as a contiguous cache")
pmgr.check_invariants()

# %% [markdown] id="c022"
# ## 4. Sharing blocks
#
# ### Copy-on-write: parallel sampling and beam search
#
# Asking for `n` samples of one prompt should not store the prompt `n` times. `fork` gives the child the
# parent's block table and increments each block's reference count. Full blocks are never written again,
# so they stay shared for good; the partial last block is shared until someone appends to it: that
# sequence gets a private copy first (**copy-on-write**), and the manager returns the `(src, dst)` block
# copy the KV memory has to perform.

# %% id="c023"
prompt = torch.randint(1, cfg.vocab_size, (22,), generator=g).tolist()   # 5 full blocks of 4 + 2 tokens
smgr = BlockManager(num_blocks=64, block_size=4)
scache = PagedCache(smgr, KVPool.for_model(model, 64, 4))
scache.add_sequence("prompt", prompt)
scache.set_active(["prompt"])
with torch.no_grad():
    first_logits = model(torch.tensor(prompt, device=device)[None], cache=scache)[0, -1]
samples = [f"sample{i}" for i in range(SAMPLES)]
for s in samples:
    scache.fork("prompt", s)
scache.free("prompt")
print(f"after forking {SAMPLES} samples: {smgr.num_used_blocks} blocks in use "
      f"(independent copies would take {SAMPLES * 6})")
assert smgr.num_used_blocks == 6

gen = torch.Generator().manual_seed(1)
seqs = {s: list(prompt) for s in samples}
last = {s: first_logits for s in samples}
with torch.no_grad():
    for step in range(SAMPLE_TOKENS):
        nxt = [int(torch.multinomial(F.softmax(last[s].float().cpu(), -1), 1, generator=gen)) for s in samples]
        scache.append(samples, nxt)
        scache.set_active(samples)
        out = model(torch.tensor(nxt, device=device)[:, None], cache=scache, positions=scache.positions(1),
                    attn_mask=scache.attn_mask(1))
        for i, s in enumerate(samples):
            seqs[s].append(nxt[i])
            last[s] = out[i, -1]
st = smgr.stats()
print(f"{SAMPLES} samples of {SAMPLE_TOKENS} tokens: {st['blocks_used']} blocks used, {st['sharing_saves_blocks']} "
      f"saved by sharing, {st['cow_copies']} copy-on-write copies")
assert st["cow_copies"] == SAMPLES - 1          # the last writer keeps the original block
assert st["sharing_saves_blocks"] == SAMPLES * 5 - 5
for s in samples:                                # every sample's K/V is right: compare with recomputation
    with torch.no_grad():
        want = model(torch.tensor(seqs[s], device=device)[None])[0, -1]
    assert torch.allclose(last[s], want, atol=1e-3)
print("distinct samples:", len({tuple(x) for x in seqs.values()}), "- each equal to recomputing its own sequence")

# %% [markdown] id="c024"
# Beam search is the same mechanism used harder: at every step each surviving beam forks into candidates
# and the losers are freed; shared prefixes cost nothing and only the blocks where beams diverge are
# copied.

# %% id="c025"
bmgr = BlockManager(num_blocks=200, block_size=4)
bmgr.add_sequence(0, list(range(30)))
beams, next_id, rng = [0], 1, torch.Generator().manual_seed(2)
for step in range(20):
    cands = []
    for b in beams:
        for _ in range(3):                                   # 3 candidates per beam
            bmgr.fork(b, next_id)
            bmgr.append(next_id, int(torch.randint(0, 100, (1,), generator=rng)))
            cands.append(next_id)
            next_id += 1
    for b in beams:
        bmgr.free(b)
    keep = cands[:4]                                         # stand-in for "the 4 best scores"
    for c in cands[4:]:
        bmgr.free(c)
    beams = keep
    bmgr.check_invariants()
st = bmgr.stats()
print(f"4 beams of {bmgr.num_tokens(beams[0])} tokens: {st['blocks_used']} blocks in use instead of "
      f"{4 * -(-bmgr.num_tokens(beams[0]) // 4)}; {st['cow_copies']} copies over 20 steps")
assert st["blocks_used"] < 4 * -(-bmgr.num_tokens(beams[0]) // 4)

# %% [markdown] id="c026"
# ### Prefix caching
#
# Many requests start the same way (a system prompt, a few-shot preamble, a shared document). With
# prefix caching every **full** block gets a **chained hash**: h_i = hash(h_{i-1}, tokens of block i), so
# equal hashes stand for equal *whole prefixes*, not just equal blocks (the K/V of a block depends on
# every token before it). A new request looks its full prompt blocks up and reuses hits instead of
# computing them. A hit is **verified** - the cached block's tokens must equal the request's and its parent
# must be the block matched just before - because a hash collision must never hand out wrong K/V.
# Freed blocks stay in the cache until the allocator needs them again (least recently freed first).

# %% id="c027"
system = torch.randint(1, cfg.vocab_size, (26,), generator=g).tolist()     # 6 full blocks of 4 + 2
pcache = PagedCache(BlockManager(64, 4, prefix_caching=True), KVPool.for_model(model, 64, 4))
computed = {}
for name, question in (("u1", [5, 6, 7]), ("u2", [8, 9]), ("u3", [10, 11, 12, 13])):
    p = system + question
    skip = pcache.add_sequence(name, p)
    pcache.set_active([name])
    with torch.no_grad():
        out = model(torch.tensor(p[skip:], device=device)[None], cache=pcache)[0, -1]
        want = model(torch.tensor(p, device=device)[None])[0, -1]
    assert torch.allclose(out, want, atol=1e-3)
    computed[name] = len(p) - skip
    print(f"{name}: prompt {len(p)} tokens, {skip} found in the prefix cache, {len(p) - skip} computed; "
          f"next-token logits equal a full prefill")
assert computed["u1"] == 29 and computed["u2"] == 28 - 24 and computed["u3"] == 30 - 24
print("prefix-cache hits (blocks):", pcache.manager.prefix_hits)

# a deliberately terrible hash: every block collides. Verification keeps the results right.
weak = BlockManager(16, 4, prefix_caching=True, hash_fn=lambda prev, toks: 0)
weak.add_sequence("a", [1, 2, 3, 4, 5])
assert weak.add_sequence("b", [9, 9, 9, 9, 5]) == 0        # same hash, other tokens: a miss
assert weak.add_sequence("c", [1, 2, 3, 4, 6]) == 4        # a genuine match still hits
weak.check_invariants()
print("with an all-colliding hash: the impostor block was rejected, the genuine prefix reused")

# %% [markdown] id="c028"
# ## 5. The visualizer
#
# Physical blocks on the left (colour = owning sequence; stripes = shared, with the reference count;
# grey = freed but still in the prefix cache), block tables and counters on the right. Add sequences,
# generate, fork one and let both write, share a prompt prefix, finish sequences, and watch utilization,
# waste and sharing change; compare with what a contiguous `max_len` reservation per sequence would waste.

# %% id="c029"
viz = PagedVisualizer(num_blocks=24, block_size=4, max_len=32)
play = viz.state                  # what the buttons act on: a few requests before you take over
a = play.add_sequence(10)         # admitted: 10 prompt tokens fill 2 blocks and part of a third
b = play.add_sequence(7)
play.generate(None, 5)            # both grow; a block is taken exactly when the last one is full
c = play.fork(a)                  # a second sample of a's prompt shares all of a's blocks ...
play.generate(c, 2)               # ... until it writes: copy-on-write of the partial last block
d = play.share_prefix(b, 3)       # a request starting with b's prompt reuses b's full prompt block
play.finish(b)                    # b is done: its other blocks are free, full ones kept in the prefix cache
viz.update()
st = play.stats()
assert play.manager.cow_copies == 1 and play.manager.prefix_hits == 1 and st["blocks_shared"] == 3
assert sum(play.is_cached_free(k) for k in range(play.manager.num_blocks)) == 2
print({k: st[k] for k in ("sequences", "blocks_used", "blocks_shared", "utilization", "contiguous_waste")})
viz

# %% [markdown] id="c030"
# The same actions, scripted, with what each one must do:

# %% id="c031"
tour = PagedVisualizer(num_blocks=24, block_size=4, max_len=32, plot=False, seed=1)
tour.prompt_len.value = 10
tour.add_button.click()                                    # s0: 10 tokens -> 3 blocks
assert tour.state.tables()["s0"] == [0, 1, 2]
tour.fork_button.click()                                   # s1 shares all 3 blocks
assert tour.state.stats()["blocks_shared"] == 3
tour.num_tokens.value = 4
tour.generate_button.click()                               # s1 writes: copy-on-write of the partial block
assert tour.state.manager.cow_copies == 1
tour.seq.value = "s0"
tour.share_button.click()                                  # s2 = s0's prompt + 2 tokens: 2 blocks reused
assert tour.state.manager.prefix_hits == 2
tour.seq.value = "s1"
tour.finish_button.click()
st = tour.state.stats()
print(tour.message.value)
print({k: st[k] for k in ("sequences", "blocks_used", "blocks_shared", "utilization", "contiguous_waste")})
assert st["utilization"] > 1 - st["contiguous_waste"]

# %% [markdown] id="c032"
# ## Summary
#
# * Reserving each request's maximum length contiguously wasted most of the KV memory on this workload
#   (measured above: reservation, internal and external fragmentation); paging wasted a few percent, all
#   in last blocks, and the freed memory turned into a larger batch.
# * A block manager is small: a free list, reference counts, block tables, allocation exactly when a
#   block fills, and `OutOfBlocks` as the signal for the scheduler to preempt.
# * Attention reads K/V through the block table; the reference and the Triton kernel equal contiguous
#   attention, and the model generates the same tokens from paged memory.
# * Reference counts make sharing cheap: fork + copy-on-write for parallel sampling and beam search, and
#   prefix caching with chained, verified block hashes for shared prompts.

# %% [markdown] id="further-reading"
# ## Further reading
#
# Used in this notebook:
#
# * *Efficient Memory Management for Large Language Model Serving with PagedAttention* [@kwon2023efficient]:
#   blocks, block tables, copy-on-write for parallel sampling and beam search, and vLLM.
#
# To go further:
#
# * *Orca* [@yu2022orca]: iteration-level scheduling (continuous batching), the scheduler that allocating
#   blocks on demand serves (Module 09).
# * *SGLang* [@zheng2024sglang]: RadixAttention, prefix caching over a radix tree of cached prefixes instead
#   of a table of block hashes.
