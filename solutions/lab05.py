# %% [markdown] id="c002"
# # Lab 05 · KV caching
#
# In this lab you write the pieces of Module 05 yourself:
#
# * **Part A (3 points): the memory formula.** How many bytes a KV cache takes, and how many sequences
#   fit on a GPU.
# * **Part B (4 points, contract): a KV cache.** The `update` / `get_seq_length` contract the course model
#   calls, checked against recomputation with the real model.
# * **Part C (5 points, contract): a bounded cache with attention sinks** (StreamingLLM
#   [@xiao2024efficient]): keep the first `sinks` tokens forever and a window of the most recent ones; you design it from
#   its contract, and the real model checks it against the definition of windowed attention.
# * **Part D (1 point): predict** what a long context's cache holds on each GPU of a tensor-parallel
#   deployment with FP8 keys, then measure your caches.
# * **Part E (2 points): a written analysis** of the formula's bytes against your caches' tensors.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, the grader calls your functions and drives your caches on
#   inputs of its own (random shapes, updates and prompts drawn for you, and a grid of edge cases) and compares
#   them with the course's reference implementation, so make it correct in general.
# * Use plain Python and `torch`. Do not import the answers from `course_lib.kvcache`: the grader flags an
#   answer that imports a reference, and while it grades, the references are not in the library.
# * Everything runs on a CPU in seconds. Total: 15 points, 2 of them a written analysis your
#   instructor grades (Part E).

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os

import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.models import load

model, tok = load("tiny", device="cpu")
cfg = model.config

# What the known wrong answers mean (the tests name them when your answer matches one).
MISTAKES = {
    "one_factor": "the formula counts the keys only: every token stores a key AND a value vector per KV head "
                  "and layer, a factor 2; see notebook 05, section '4. How much memory the cache takes'",
    "length_per_update": "get_seq_length() counts every layer's update: one forward updates all L layers with "
                         "the same T tokens, so the sequence grows by T, not L*T (the model takes the next "
                         "token's position from it); see notebook 05, section '2. A KV cache from scratch'",
    "window_off_by_one": "the new token was not counted in its own window: a query attends to at most W "
                         "non-sink tokens ITSELF INCLUDED, so it sees the last W - 1 stored ones plus itself, "
                         "and the cache keeps W; see notebook 05, section '6.2 Sliding window'",
    "sinks_dropped": "the sinks were evicted with the window (or never kept): the first `sinks` tokens of the "
                     "sequence stay in the cache forever; see notebook 05, section '6.3 Attention sinks "
                     "(StreamingLLM)'",
    "seen_vs_stored": "get_seq_length() returned the tokens stored: with absolute positions the next token's "
                      "position is the number of tokens seen, stored or evicted; see notebook 05, section "
                      "'6.2 Sliding window'",
    "kv_one_size": "keys and values counted at one size: with FP8 keys and bf16 values each side has its own "
                   "bytes per number (a key costs head_dim x key_bytes, a value head_dim x value_bytes); see "
                   "notebook 05, sections '4. How much memory the cache takes' and '6.5 Quantized KV: int8 and int4'",
    "tp_fraction_heads": "with more GPUs than KV heads, each GPU was given num_key_value_heads / tp of a head; a "
                         "KV head cannot be cut (its head_dim numbers are read whole by its query heads), so a "
                         "GPU whose query heads read one KV head keeps a whole copy of it; see notebook 11, "
                         "section '3 · Sharding the course's Llama'",
    "tp_not_split": "the whole cache was counted on every GPU: tensor parallelism gives each GPU only the KV "
                    "heads its query heads read; see notebook 11, section '3 · Sharding the course's Llama'",
}


# %% [markdown] id="c004"
# ## Part A · The memory formula (3 points)
#
# Every layer stores, for every token of every sequence, one key vector and one value vector per KV head,
# each of `head_dim` numbers. Implement
#
# `kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, batch=1, bytes_per_element=2)`
#
# returning the number of bytes as an `int` (`bytes_per_element` is 2 for fp16/bf16, 4 for fp32, 1 for
# int8, 0.5 for int4). Raise a `ValueError` when `num_layers`, `num_kv_heads` or `head_dim` is not a
# positive integer, or `tokens` or `batch` is negative.
#
# Then implement `max_sequences(gpu_bytes, weight_bytes, num_layers, num_kv_heads, head_dim, tokens,
# bytes_per_element=2)`: how many whole sequences of `tokens` tokens fit in the memory left after the
# weights (0 if none; ignore everything else a real server needs).
#
# Example: Llama-2-7B [@touvron2023llama] (32 layers, 32 KV heads of 128) in fp16 needs 512 KiB per token, so a 4096-token
# sequence needs exactly 2 GiB.

# %% id="c005" nbgrader={"grade": false, "grade_id": "memory_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, batch=1, bytes_per_element=2):
    """Bytes of the K and V caches of `batch` sequences of `tokens` tokens."""
    ### BEGIN SOLUTION
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name, value in (("tokens", tokens), ("batch", batch)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(2 * num_layers * num_kv_heads * head_dim * bytes_per_element * tokens * batch)
    ### END SOLUTION


def max_sequences(gpu_bytes, weight_bytes, num_layers, num_kv_heads, head_dim, tokens, bytes_per_element=2):
    """How many sequences of `tokens` tokens fit in gpu_bytes - weight_bytes."""
    ### BEGIN SOLUTION
    free = gpu_bytes - weight_bytes
    per_seq = kv_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, 1, bytes_per_element)
    return max(0, int(free // per_seq)) if per_seq else 0
    ### END SOLUTION


# %% id="c006" nbgrader={"grade": true, "grade_id": "memory_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_equal(kv_cache_bytes(32, 32, 128, 1), 512 * 1024, "kv_cache_bytes(32, 32, 128, 1) (Llama-2-7B, one token, fp16)",
            mistakes={MISTAKES["one_factor"]: 256 * 1024})
check_equal(kv_cache_bytes(32, 32, 128, 4096), 2 * 2**30, "kv_cache_bytes(32, 32, 128, 4096)")
check_equal(kv_cache_bytes(32, 8, 128, 4096, batch=8), 4 * 2**30, "kv_cache_bytes(32, 8, 128, 4096, batch=8) (Llama-3-8B)")
check_equal(kv_cache_bytes(6, 2, 32, 10, 3, 4), 2 * 6 * 2 * 32 * 4 * 10 * 3, "kv_cache_bytes(6, 2, 32, 10, 3, 4)")
check_equal(kv_cache_bytes(32, 8, 128, 1000, bytes_per_element=0.5), 32 * 8 * 128 * 1000,
            "kv_cache_bytes(32, 8, 128, 1000, bytes_per_element=0.5) (int4)")
check_equal(kv_cache_bytes(32, 8, 128, 0), 0, "kv_cache_bytes(32, 8, 128, 0) (no tokens yet)")
check_equal(type(kv_cache_bytes(32, 8, 128, 1000, bytes_per_element=0.5)).__name__, "int",
            "the type of kv_cache_bytes(..., bytes_per_element=0.5): bytes are a whole number, an int")
check_raises(lambda: kv_cache_bytes(0, 8, 128, 10), ValueError, "kv_cache_bytes(0, 8, 128, 10) (no layers)")
check_raises(lambda: kv_cache_bytes(32, 8, 128, -1), ValueError, "kv_cache_bytes(32, 8, 128, -1)")
check_raises(lambda: kv_cache_bytes(32, 8, 128, 10, batch=-2), ValueError, "kv_cache_bytes(32, 8, 128, 10, batch=-2)")
# the formula against the bytes of a real cache of the course model (fp32: 4 bytes per number)
_k = [torch.zeros(2, cfg.num_key_value_heads, 7, cfg.head_dim) for _ in range(2 * cfg.num_hidden_layers)]
check_equal(kv_cache_bytes(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 7, 2, 4),
            sum(t.numel() * t.element_size() for t in _k), "kv_cache_bytes for the course model (7 tokens, batch 2, fp32)")
print("Part A (formula): visible tests passed")

# %% id="c007" nbgrader={"grade": true, "grade_id": "max_sequences_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# an 80 GB GPU holding Llama-2-7B in fp16 (13.5e9 bytes of weights): 4096-token sequences of 2 GiB each
check_equal(max_sequences(80e9, 13.5e9, 32, 32, 128, 4096), 30, "max_sequences(80e9, 13.5e9, 32, 32, 128, 4096)")
check_equal(max_sequences(80e9, 13.5e9, 32, 8, 128, 4096), 123, "max_sequences(80e9, 13.5e9, 32, 8, 128, 4096) (GQA)")
check_equal(max_sequences(16e9, 15e9, 32, 32, 128, 4096), 0, "max_sequences(16e9, 15e9, 32, 32, 128, 4096) (nothing fits)")
check_equal(max_sequences(2 * 2**30, 0, 32, 32, 128, 4096), 1, "max_sequences(2 GiB, 0, ...) (exactly one)")
print("Part A (max_sequences): visible tests passed")

# %% [markdown] id="c008"
# ## Part B · A KV cache (4 points, contract)
#
# Inside each attention layer, the course model computes the keys and values of the **new** tokens and
# hands them to the cache it was given (`model(ids, cache=c)`). Write `KVCache`, a cache that keeps every
# token.
#
# **Contract.** The one the course model calls (Hugging Face's shape):
#
# * `update(k, v, layer)`: `k`, `v` of shape `[batch, kv_heads, T, head_dim]` hold the T new tokens of
#   `layer` (keys already rotated by RoPE at their positions). *Returns* `(k_all, v_all)`, the keys and values
#   of **all** tokens of that layer so far, `[batch, kv_heads, S, head_dim]`, in order, the new ones last;
#   the tokens stored before are returned unchanged.
# * `get_seq_length()`: how many tokens the sequence holds, i.e. the position of the next new token (0 for
#   an empty cache). The model calls it once per forward, before layer 0.
# * *Call order*: at every forward the model updates layers 0, 1, ..., L-1 in order, each with the same T
#   tokens; the first forward meets an empty cache (you may not know L in advance).
# * *Invariant*: generating with the cache gives exactly the tokens of recomputing the whole sequence.
# * *Memory*: what it stores grows by T tokens per layer and forward, nothing else.
#
# The grader drives your cache and `course_lib.kvcache.ContiguousCache` with the same random updates, and
# feeds random sequences through your cache in the real model (a prompt in one forward, then token by token),
# comparing the logits of every position with recomputation. (`torch.cat` is fine.)

# %% id="c009" nbgrader={"grade": false, "grade_id": "cache_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class KVCache:
    def __init__(self):
        ### BEGIN SOLUTION
        self.k, self.v = [], []
        ### END SOLUTION

    def update(self, k, v, layer):
        ### BEGIN SOLUTION
        if layer == len(self.k):
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        return self.k[layer], self.v[layer]
        ### END SOLUTION

    def get_seq_length(self):
        ### BEGIN SOLUTION
        return self.k[0].shape[2] if self.k else 0
        ### END SOLUTION


# %% id="c010" nbgrader={"grade": true, "grade_id": "cache_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
c = KVCache()
check_equal(c.get_seq_length(), 0, "get_seq_length() of an empty cache")
k1, v1 = torch.arange(24.).view(1, 2, 3, 4), -torch.arange(24.).view(1, 2, 3, 4)
for layer in range(2):
    ka, va = c.update(k1, v1, layer)
check_shape(ka, (1, 2, 3, 4), "update(k [1, 2, 3, 4], v, layer=1) on an empty cache returns k_all of shape")
check_equal(c.get_seq_length(), 3, "get_seq_length() after a 3-token prefill (2 layers updated)",
            mistakes={MISTAKES["length_per_update"]: 6})
k2, v2 = torch.full((1, 2, 1, 4), 100.), torch.full((1, 2, 1, 4), -100.)
ka, va = c.update(k2, v2, 0)
check_shape(ka, (1, 2, 4, 4), "k_all after one more token at layer 0")
check_equal(ka[:, :, :3], k1, "k_all[:, :, :3] (the prefill's keys, unchanged)")
check_equal(ka[:, :, 3:], k2, "k_all[:, :, 3:] (the new key comes last)")
check_equal(va[:, :, 3:], v2, "v_all[:, :, 3:] (the new value comes last)")
check_shape(c.update(k2, v2, 1)[0], (1, 2, 4, 4), "k_all of layer 1 after one more token")
check_equal(c.get_seq_length(), 4, "get_seq_length() after prefill + 1 token",
            mistakes={MISTAKES["length_per_update"]: 8})
print("Part B (contract): visible tests passed")

# %% [markdown] id="c011"
# The real test: generating with your cache must give exactly the tokens of recomputation. The loop
# below prefills the prompt once, then feeds one token per step.

# %% id="c012" nbgrader={"grade": true, "grade_id": "cache_model_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
@torch.no_grad()
def greedy_recompute(ids, n):
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@torch.no_grad()
def greedy_cached(ids, n, cache):
    logits = model(ids, cache=cache)[:, -1]
    for step in range(n):
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if step < n - 1:
            logits = model(nxt, cache=cache)[:, -1]
    return ids


prompt = torch.tensor([[5, 17, 300, 42, 1000, 7]])
check_equal(greedy_cached(prompt, 10, KVCache()), greedy_recompute(prompt, 10),
            "greedy tokens with your KVCache vs recomputation (prompt [5, 17, 300, 42, 1000, 7], 10 tokens)")
print("Part B (model): visible tests passed")

# %% [markdown] id="c013"
# ## Part C · A bounded cache with attention sinks (5 points, contract)
#
# A cache that keeps every token grows without bound. A **sliding window** of size W keeps only recent
# tokens; StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention Sinks"
# [@xiao2024efficient])
# adds **attention sinks**: trained models park much attention on the first few tokens whatever they are,
# so those `sinks` tokens are never evicted. Write `SinkKVCache(window, sinks=0)` (with `sinks=0` it is the
# plain sliding window).
#
# **Contract.** The conventions of notebook 05's window and sink caches (sections 6.2 and 6.3), with absolute positions:
#
# * *Window*: a new token attends to the sinks and to at most `window` = W non-sink tokens, **itself
#   included**. The first `sinks` tokens of the sequence are the sinks.
# * `update(k, v, layer)` with T new tokens `[batch, kv_heads, T, head_dim]`: *returns* the keys and values
#   the new tokens attend to, in sequence order: the stored sinks, the last W - 1 stored non-sink tokens
#   (fewer if fewer are stored, none if W = 1), then the T new ones. *After it* the layer holds exactly the
#   first `min(seen, sinks)` tokens ever seen and the last W non-sink ones: `min(seen, sinks + W)` tokens.
# * *Positions*: keys arrive rotated by RoPE at their absolute positions and keep them (no re-rotation).
#   `get_seq_length()` is the position of the next token: how many tokens have been **seen**, stored or not.
#   `stored_length(layer=0)` is how many tokens the layer holds (0 before its first update).
# * *Memory bound*: between forwards each layer holds at most `sinks + W` tokens, whatever the length of the
#   sequence.
# * *Refuses* (`ValueError`): `window` not an int ≥ 1, `sinks` not an int ≥ 0.
# * *Invariant* checked with the real model: feeding a sequence through the cache (a prompt of at most W
#   tokens, then one token per forward) gives the logits of one forward of the whole sequence under the
#   **banded** mask, where query i sees key j when j ≤ i and (j < sinks or i − j < W). (A prefill longer
#   than W would need that banded mask too; the library's cache provides it; yours need not.)
#
# The grader drives your cache and `course_lib.kvcache.SlidingWindowCache(window, sinks,
# reposition=False)` with the same random updates (some of several tokens), and checks the real model with
# random windows, sinks and prompts.
#
# <details><summary>Hint 1: one update, step by step</summary>
#
# Per layer keep the stored keys and values and the count of tokens seen. In `update`:
#
# 1. split what is stored into the sinks (the first `min(stored, sinks)`) and the rest;
# 2. of the rest (n tokens), keep the last W − 1: `rest[:, :, max(0, n - (W - 1)):]` (not `rest[:, :, -(W - 1):]`,
#    which keeps everything when W = 1);
# 3. return `cat([sinks, those, new])`;
# 4. what stays: the first `sinks` tokens of *that* concatenation if they are sinks (with few tokens seen, new
#    tokens can be sinks too: compare their positions with `sinks`), and the last W of the non-sinks.
# </details>
#
# <details><summary>Hint 2: StreamingLLM's positions</summary>
#
# StreamingLLM itself re-positions: it gives the sinks positions 0..s−1 and the window the positions right
# after, so a stream can run past the model's context (`course_lib.kvcache.SinkCache`, `reposition=True`;
# notebook 05, 6.3). This part keeps absolute positions, like Mistral's sliding window: positions keep
# growing, and our model refuses positions past 512.
# </details>

# %% id="c014" nbgrader={"grade": false, "grade_id": "window_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class SinkKVCache:
    def __init__(self, window, sinks=0):
        ### BEGIN SOLUTION
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be an int >= 0, got {sinks!r}")
        self.window, self.sinks = window, sinks
        self.k, self.v, self.seen = [], [], []
        ### END SOLUTION

    def update(self, k, v, layer):
        ### BEGIN SOLUTION
        if layer == len(self.k):
            self.k.append(k[:, :, :0])
            self.v.append(v[:, :, :0])
            self.seen.append(0)
        n = self.k[layer].shape[2]
        s = min(n, self.sinks)                                  # stored sinks: the first tokens ever seen
        start = max(s, n - (self.window - 1))                   # non-sinks the first new token may see
        idx = list(range(s)) + list(range(start, n))
        k_all = torch.cat([self.k[layer][:, :, idx], k], dim=2)
        v_all = torch.cat([self.v[layer][:, :, idx], v], dim=2)
        # what stays: the sinks (the first `sinks` tokens ever seen, new ones included while the sequence
        # is shorter than that) and the last `window` non-sinks
        n_sink = min(self.sinks, self.seen[layer] + k.shape[2])
        keep = list(range(n_sink)) + list(range(n_sink, k_all.shape[2]))[-self.window:]
        self.k[layer], self.v[layer] = k_all[:, :, keep], v_all[:, :, keep]
        self.seen[layer] += k.shape[2]
        return k_all, v_all
        ### END SOLUTION

    def get_seq_length(self):
        ### BEGIN SOLUTION
        return self.seen[0] if self.seen else 0
        ### END SOLUTION

    def stored_length(self, layer=0):
        ### BEGIN SOLUTION
        return self.k[layer].shape[2] if layer < len(self.k) else 0
        ### END SOLUTION


# %% id="c015" nbgrader={"grade": true, "grade_id": "window_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def tokens(a, b):
    """Keys whose single channel holds the token's position a..b-1: easy to read back."""
    return torch.arange(a, b, dtype=torch.float32).view(1, 1, b - a, 1)


w = SinkKVCache(4)                                               # a plain window of 4, no sinks
ka, _ = w.update(tokens(0, 3), tokens(0, 3), 0)                 # a 3-token prompt
check_equal(ka.flatten().tolist(), [0, 1, 2], "keys returned for a 3-token prompt (window 4)")
check_equal(w.stored_length(), 3, "stored_length() after 3 tokens (window 4)")
for t in range(3, 7):                                            # decode tokens 3, 4, 5, 6
    ka, _ = w.update(tokens(t, t + 1), tokens(t, t + 1), 0)
check_equal(ka.flatten().tolist(), [3, 4, 5, 6], "keys returned when token 6 arrives (window 4: itself + 3 before)",
            mistakes={MISTAKES["window_off_by_one"]: [2, 3, 4, 5, 6]})
check_equal(w.stored_length(), 4, "stored_length() after 7 tokens (window 4)")
check_equal(w.get_seq_length(), 7, "get_seq_length() after 7 tokens (tokens seen, not stored)",
            mistakes={MISTAKES["seen_vs_stored"]: 4})
ka, _ = w.update(tokens(7, 10), tokens(7, 10), 0)                # 3 tokens at once
check_equal(ka.flatten().tolist(), [4, 5, 6, 7, 8, 9], "keys returned for tokens 7, 8, 9 at once (3 old + 3 new)")
check_equal(w.stored_length(), 4, "stored_length() after 10 tokens")
one = SinkKVCache(1)
one.update(tokens(0, 2), tokens(0, 2), 0)
check_equal(one.update(tokens(2, 3), tokens(2, 3), 0)[0].flatten().tolist(), [2], "window 1: a token sees only itself")
# two sinks and a window of 3
sk = SinkKVCache(3, sinks=2)
sk.update(tokens(0, 1), tokens(0, 1), 0)                         # a 1-token prompt: token 0 is a sink
for t in range(1, 9):
    ka, _ = sk.update(tokens(t, t + 1), tokens(t, t + 1), 0)
check_equal(ka.flatten().tolist(), [0, 1, 6, 7, 8], "keys returned when token 8 arrives (sinks 2, window 3)",
            mistakes={MISTAKES["window_off_by_one"]: [0, 1, 5, 6, 7, 8], MISTAKES["sinks_dropped"]: [6, 7, 8]})
check_equal(sk.stored_length(), 5, "stored_length() after 9 tokens (sinks 2 + window 3)")
ka, _ = sk.update(tokens(9, 11), tokens(9, 11), 0)               # 2 tokens at once
check_equal(ka.flatten().tolist(), [0, 1, 7, 8, 9, 10], "keys returned for tokens 9, 10 at once (sinks 2, window 3)")
check_raises(lambda: SinkKVCache(0), ValueError, "SinkKVCache(0)")
check_raises(lambda: SinkKVCache(4, sinks=-1), ValueError, "SinkKVCache(4, sinks=-1)")
print("Part C: visible tests passed")

# %% [markdown] id="c016"
# The invariant on the real model: a sequence fed through your cache (the prompt in one forward, then one
# token per forward) must give the logits of one forward of the whole sequence under the banded mask.

# %% id="c017" nbgrader={"grade": true, "grade_id": "window_model_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def band(n, window, sinks):
    """The definition: query i sees key j when j <= i and (j < sinks or i - j < window). [n, n] bool."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & ((j < sinks) | (i - j < window))


@torch.no_grad()
def streamed_logits(ids, prompt_len, cache):
    """Logits of every position of ids [B, N]: the first prompt_len tokens in one forward, then one by one."""
    out = [model(ids[:, :prompt_len], cache=cache)]
    for t in range(prompt_len, ids.shape[1]):
        out.append(model(ids[:, t:t + 1], cache=cache))
    return torch.cat(out, dim=1)


_ids = torch.randint(1, cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
with torch.no_grad():
    _want = model(_ids, attn_mask=band(24, 6, 2))
    _wrong = {MISTAKES["window_off_by_one"]: model(_ids, attn_mask=band(24, 7, 2)),
              MISTAKES["sinks_dropped"]: model(_ids, attn_mask=band(24, 6, 0))}
_c = SinkKVCache(6, sinks=2)
check_close(streamed_logits(_ids, 4, _c), _want, "logits of 24 tokens streamed through SinkKVCache(6, sinks=2) vs "
            "one forward under the banded mask", atol=1e-3, rtol=0, mistakes=_wrong)
check_equal([_c.stored_length(l) for l in range(cfg.num_hidden_layers)], [8] * cfg.num_hidden_layers,
            "stored_length(layer) of every layer after 24 tokens (sinks 2 + window 6)")
print("Part C (model): visible tests passed")

# %% [markdown] id="c018"
# ## Part D · Predict: a long context's cache on each GPU (1 point)
#
# Notebook 05 costs a cache on one GPU with one number format. A deployment mixes them: a GQA model whose
# keys are stored in FP8 (1 byte per number) while the values stay in bf16 (2 bytes), serving 128K-token
# contexts under **tensor parallelism** over `tp` GPUs (module 11). Tensor parallelism splits each attention
# layer by heads: every GPU computes some of the query heads, and it must hold the keys and values of every
# KV head those query heads read. A KV head is never cut in pieces: its `head_dim` numbers belong together.
# What a GPU holds is what decides whether the batch fits, so predict it per GPU.
#
# Write `predict_cache_bytes(config, tokens, window=None, sinks=0, batch=1, key_bytes=2, value_bytes=2, tp=1)`:
#
# * **takes** a model `config` (`num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
#   `head_dim`), `tokens` seen by each of `batch` sequences, the cache (`window=None`: the full cache of Part B;
#   otherwise Part C's sink cache of `window` and `sinks`), the bytes of one stored number of a key
#   (`key_bytes`) and of a value (`value_bytes`), and the number of GPUs `tp` the heads are split over;
# * **returns** the bytes of keys and values held by the GPU that holds the most, as an `int`;
# * **assumes** the split is even: `tp` divides `num_attention_heads` (every GPU computes whole query heads),
#   and `tp` divides `num_key_value_heads` or `num_key_value_heads` divides `tp` (more GPUs than KV heads, as
#   with an 8-KV-head model on 16 GPUs); every GPU holds every sequence;
# * **raises** `ValueError` if `tp` is not an int >= 1 or splits the KV heads unevenly (neither divides the
#   other), if `key_bytes` or `value_bytes` is not > 0, if `window` is neither `None` nor an int >= 1, or if
#   `sinks` is not an int >= 0.
#
# The grader draws its own models, formats and GPU counts. The visible tests check units and what must hold
# whatever the formula; the cell after them measures the bytes of your two caches' tensors (one GPU, one
# format) and shows them next to your prediction.
#
# <details><summary>Hint 1: keys and values in different formats</summary>
#
# Part A's formula counts keys and values alike, and its factor 2 is exactly "a key and a value". With two
# formats, count each side on its own. Pitfall: scaling Part A's total by one of the two sizes.
# </details>
#
# <details><summary>Hint 2: heads per GPU</summary>
#
# Ask, for one GPU, which KV heads its query heads read. While there are more KV heads than GPUs, the GPUs
# share the KV heads out. Pitfall: a GPU count larger than the KV heads does not leave a GPU with a fraction
# of a head; ask what a GPU whose query heads all read one KV head must hold.
# </details>

# %% id="c019" nbgrader={"grade": false, "grade_id": "predict_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_cache_bytes(config, tokens, window=None, sinks=0, batch=1, key_bytes=2, value_bytes=2, tp=1):
    """Bytes of keys and values held by the fullest of `tp` GPUs after `tokens` tokens of `batch` sequences."""
    ### BEGIN SOLUTION
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"sinks must be an int >= 0, got {sinks!r}")
    for name, value in (("key_bytes", key_bytes), ("value_bytes", value_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    kv_heads = config.num_key_value_heads
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or (kv_heads % tp and tp % kv_heads):
        raise ValueError(f"tp must be an int >= 1 that divides num_key_value_heads={kv_heads} or is a "
                         f"multiple of it, got {tp!r}")
    held = tokens if window is None else min(tokens, sinks + window)
    heads = max(1, kv_heads // tp)     # more GPUs than KV heads: each GPU keeps a whole copy of the one it reads
    # Part A counts a key and a value of one size; at two sizes, its mean per number gives the same total
    return kv_cache_bytes(config.num_hidden_layers, heads, config.head_dim, held, batch, (key_bytes + value_bytes) / 2)
    ### END SOLUTION


# %% id="c020" nbgrader={"grade": true, "grade_id": "predict_bytes_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from types import SimpleNamespace


def _shape(L, H, K, Dh):
    return SimpleNamespace(num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=K, head_dim=Dh)


def _bytes_of(config, tokens, **kw):
    got = predict_cache_bytes(config, tokens, **kw)
    check_equal(type(got).__name__, "int", f"predict_cache_bytes(..., {tokens}, {kw}) returns an int of bytes")
    return got


_gqa = _shape(32, 32, 8, 128)                      # a Llama-3-8B-like shape: 8 KV heads for 32 query heads
_one_gpu = _bytes_of(_gqa, 4096)
check_equal(_one_gpu, kv_cache_bytes(32, 8, 128, 4096), "one GPU, bf16 keys and values: your Part A's formula")
_fp8 = _bytes_of(_gqa, 4096, key_bytes=1)
check_equal(_one_gpu // 2 < _fp8 < _one_gpu, True, f"FP8 keys, bf16 values: strictly between an all-FP8 and an "
            f"all-bf16 cache (got {_fp8:,} bytes, all-bf16 {_one_gpu:,}); if it is not: {MISTAKES['kv_one_size']}")
_per_gpu = [_bytes_of(_gqa, 131072, key_bytes=1, tp=tp) for tp in (1, 2, 4, 8, 16, 32)]
check_equal(all(a >= b for a, b in zip(_per_gpu, _per_gpu[1:])), True,
            f"more GPUs never hold more each: {[f'{b:,}' for b in _per_gpu]} bytes at tp = 1, 2, ..., 32")
check_equal(all(b * tp >= _per_gpu[0] for b, tp in zip(_per_gpu, (1, 2, 4, 8, 16, 32))), True,
            "the GPUs together hold at least the whole cache (every KV head is somewhere)")
check_equal(_per_gpu[-1] > 0, True, "32 GPUs for 8 KV heads: each GPU still holds some cache")
check_equal(_bytes_of(_gqa, 9000, window=1020, sinks=4, tp=4), _bytes_of(_gqa, 1024, tp=4),
            "a sink cache of 4 + 1020 tokens holds as much as a full cache of 1024 tokens",
            mistakes={MISTAKES["sinks_dropped"]: _bytes_of(_gqa, 1020, tp=4)})
check_raises(lambda: predict_cache_bytes(_gqa, 10, tp=3), ValueError, "predict_cache_bytes(8 KV heads, tp=3)")
check_raises(lambda: predict_cache_bytes(_gqa, 10, key_bytes=0), ValueError, "predict_cache_bytes(..., key_bytes=0)")
check_raises(lambda: predict_cache_bytes(cfg, 10, window=0), ValueError, "predict_cache_bytes(cfg, 10, window=0)")
print("Part D: visible tests passed")

# %% [markdown] id="c021"
# ## Measure: the bytes your caches hold (not graded)
#
# Generate 40 tokens with each of your caches, then add up the bytes of the tensors they hold (found by
# walking their attributes). `storage` counts the memory behind those tensors: a slice of a bigger tensor
# keeps the whole of it alive, which the formula does not see.

# %% id="c022"
def _tensors(obj, seen=None):
    """Every tensor reachable from obj through attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return []
    return [t for x in items for t in _tensors(x, seen)]


if os.environ.get("NBGRADER_EXECUTION"):        # a measurement, not a test: the grader skips it
    print("the measurement is skipped while grading")
else:
    try:
        _prompt = torch.tensor([[5, 17, 300, 42, 1000, 7]])
        print(f"{'cache':<26}{'tokens':>8}{'predicted bytes':>17}{'measured':>10}{'storage':>10}")
        for _name, _cache, _kw in [("KVCache", KVCache(), {}), ("SinkKVCache(16, sinks=4)", SinkKVCache(16, sinks=4),
                                                                 {"window": 16, "sinks": 4})]:
            with torch.no_grad():
                _logits = model(_prompt, cache=_cache)[:, -1]
                for _ in range(40 - _prompt.shape[1]):
                    _logits = model(_logits.argmax(-1, keepdim=True), cache=_cache)[:, -1]
            _ts = _tensors(_cache)
            _measured = sum(t.numel() * t.element_size() for t in _ts)
            _storage = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _ts}.values())
            _predicted = predict_cache_bytes(cfg, _cache.get_seq_length(), batch=1, key_bytes=4, value_bytes=4, **_kw)
            print(f"{_name:<26}{_cache.get_seq_length():>8}{_predicted:>17,}{_measured:>10,}{_storage:>10,}")
    except NotImplementedError:
        print("Finish the exercises above first.")

# %% [markdown] id="c023"
# ## Going further
#
# 1. **Past the context.** Our model refuses positions past 512, so your `SinkKVCache` cannot stream
#    forever. How does StreamingLLM's re-positioning (notebook 05, section 6.3) change `update` and
#    `get_seq_length` so that a stream of 10 000 tokens runs with a 64-token cache?
# 2. **A long context.** Llama-3-8B has 32 layers and 8 KV heads of 128. How many bytes does its fp16 KV cache
#    take for one sequence of 131 072 tokens, and with 4 sinks and a window of 4092?
# 3. **Heavy hitters.** H2O [@zhang2023h2o] keeps the most-attended tokens instead of the
#    first ones. What does its cache need from the model that yours does not, and what does that cost?

# %% [markdown] id="cw05p"
# ## Part E · Written analysis: the formula's bytes against your tensors (2 points)
#
# Graded by your instructor against a rubric, not by the tests. Run the measurement cell above first (it
# is skipped while grading), then answer in 100 to 200 words, about **your** table:
#
# 1. quote, for each of your two caches, the predicted bytes, the measured bytes and the storage;
# 2. explain every place where two of the three numbers differ, from how your cache keeps its tensors (what a
#    slice, a view, `torch.cat` and a preallocated buffer each keep alive); if all three agree, say which of
#    your implementation choices made that so, and what other natural choice would have broken it;
# 3. say which of the three numbers limits how many sequences fit on a real GPU, and what else the formula does
#    not see there.
#
# A full answer (2 points) does all three with your own numbers; explaining without them earns at most 1.

# %% [markdown] id="cw05" nbgrader={"grade": true, "grade_id": "written_cache_bytes", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# *(A model answer, with the numbers of a reference run: the solution notebook on a 2-core CPU, torch 2.13; your
# numbers will differ: what matters is how you explain them.)*
#
# After the 6-token prompt and 34 generated tokens my full cache held 40 tokens: predicted 122,880 bytes,
# measured 122,880, storage 122,880 (2 x 6 layers x 2 KV heads x 32 x 40 tokens x 4 bytes of fp32). My sink cache
# had seen the same 40 tokens (the table's tokens column) but held sinks + window = 4 + 16 = 20: predicted 61,440,
# measured 61,440, storage 61,440. All three agree, for both caches.
#
# The full cache grows with `torch.cat` along the sequence axis, which allocates a new tensor of exactly the
# tokens held and frees the old one, so the formula (2 x layers x KV heads x head_dim x tokens x bytes), the
# tensors' sizes and the memory behind them coincide. My sink cache keeps its tokens with a list of indices,
# `k_all[:, :, keep]`: advanced indexing copies them into a tensor of exactly sinks + window tokens, and the
# `k_all` it was taken from is freed. The natural alternative would break the storage column: keeping the
# window as a slice, `k_all[:, :, -window:]` (possible without sinks), has the formula's size, but its storage
# is the whole tensor it was cut from (after a long prompt's prefill, the whole prompt). A preallocated ring
# buffer (a static cache) would show storage equal to its capacity from the first token.
#
# On a GPU the storage is what counts, and more than it: PyTorch's caching allocator keeps freed blocks,
# `torch.cat` needs the old and the new tensor at once during the copy, and a preallocated cache reserves its
# maximum length per sequence. The formula gives a lower bound on the memory per sequence, never the budget.

# %% [markdown] id="c024" tags=["answer-key"]
# ### Answer key
#
# 1. Store keys without their rotation: on arrival, rotate the new keys back by their absolute positions
#    (RoPE rotations compose by adding angles, so rotating by −p undoes p). When returning, rotate the kept
#    keys at their index in the cache: sinks at 0..s−1, the window right after, the new tokens last. Then
#    `get_seq_length()` must return the position the next token gets inside the cache, the number of stored
#    tokens it will attend to (the sinks and at most W − 1 others), not the number seen; the model picks the
#    new tokens' positions from it. Positions stay below sinks + W + T, so the stream never reaches 512.
#    Each key is rotated exactly twice (undo, then at its current index), so no rounding error piles up.
#    `course_lib.kvcache.SinkCache` does this; the notebook streams past the context with it.
# 2. 2 (K and V) x 32 x 8 x 128 x 2 bytes = 128 KiB per token; x 131 072 tokens = 16 GiB (17.2 GB), about as
#    much as the model's weights in fp16 (16 GB). With 4 sinks and a window of 4092 the cache holds 4096 tokens at most:
#    512 MiB, 32 times less, whatever the length of the stream.
# 3. The attention weights: H2O scores every cached token by the attention it has received, summed over
#    every query since it arrived, so the cache needs the new tokens' queries (the course model passes
#    `q` to `update` for this) and evicts per layer and per KV head, each head keeping different tokens.
#    The cost: computing the softmax of q·Kᵀ a second time (or taking it from the attention kernel, which
#    fused kernels such as FlashAttention never materialize), a score per token and head, and a top-k per
#    step. A sink cache needs nothing but positions.
