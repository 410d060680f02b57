# %% [markdown] id="c002"
# # Lab 05 · KV caching
#
# In this lab you write the pieces of Module 05 yourself:
#
# * **Part A (3 points): the memory formula.** How many bytes a KV cache takes, and how many sequences
#   fit on a GPU.
# * **Part B (4 points): a KV cache.** The `update` / `get_seq_length` contract the course model calls,
#   checked against recomputation with the real model.
# * **Part C (3 points): a sliding-window cache.** Keep exactly the last `window` tokens.
#
# How it works:
#
# * Write your code between the `# YOUR CODE HERE` markers (delete the `raise NotImplementedError()`).
# * Each part is followed by a test cell. Run it: the tests you see check fixed examples and tell you
#   what was expected and what came. When grading, **hidden tests** also check your code on fresh random
#   inputs against the course's reference implementation, so make it correct in general.
# * Use plain Python and `torch`. Do not import the answers from `course_lib.kvcache`: the hidden tests
#   check that the code is your own.
# * Everything runs on a CPU in seconds. Total: 10 points.

# %% id="c003" nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import time

import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape
from course_lib.models import load

model, tok = load("tiny", device="cpu")
cfg = model.config


def _own_work(obj, name):
    """The grader's check that `obj` (a function or a class) is the student's own, not course_lib's."""
    if getattr(obj, "__module__", None) != "__main__":
        raise AssertionError(f"{name} must be defined in this notebook, not imported "
                             f"(it comes from {getattr(obj, '__module__', '?')})")
    fns = [obj] if callable(obj) and not isinstance(obj, type) else [
        f for f in vars(obj).values() if callable(f) and hasattr(f, "__code__")]
    for fn in fns:
        for ref in fn.__code__.co_names:
            val = fn.__globals__.get(ref)
            mod = getattr(val, "__module__", None) or getattr(val, "__name__", "")
            if isinstance(mod, str) and mod.startswith("course_lib.kvcache"):
                raise AssertionError(f"{name} uses {ref} from {mod}: write it yourself")
    if isinstance(obj, type) and any(b.__module__.startswith("course_lib.kvcache") for b in obj.__mro__):
        raise AssertionError(f"{name} must not inherit from course_lib.kvcache")


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
# Example: Llama-2-7B (32 layers, 32 KV heads of 128) in fp16 needs 512 KiB per token, so a 4096-token
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
check_equal(kv_cache_bytes(32, 32, 128, 1), 512 * 1024, "kv_cache_bytes(32, 32, 128, 1) (Llama-2-7B, one token, fp16)")
check_equal(kv_cache_bytes(32, 32, 128, 4096), 2 * 2**30, "kv_cache_bytes(32, 32, 128, 4096)")
check_equal(kv_cache_bytes(32, 8, 128, 4096, batch=8), 4 * 2**30, "kv_cache_bytes(32, 8, 128, 4096, batch=8) (Llama-3-8B)")
check_equal(kv_cache_bytes(6, 2, 32, 10, 3, 4), 2 * 6 * 2 * 32 * 4 * 10 * 3, "kv_cache_bytes(6, 2, 32, 10, 3, 4)")
check_equal(kv_cache_bytes(32, 8, 128, 1000, bytes_per_element=0.5), 32 * 8 * 128 * 1000,
            "kv_cache_bytes(32, 8, 128, 1000, bytes_per_element=0.5) (int4)")
check_equal(kv_cache_bytes(32, 8, 128, 0), 0, "kv_cache_bytes(32, 8, 128, 0) (no tokens yet)")
check_raises(lambda: kv_cache_bytes(0, 8, 128, 10), ValueError, "kv_cache_bytes(0, 8, 128, 10) (no layers)")
check_raises(lambda: kv_cache_bytes(32, 8, 128, -1), ValueError, "kv_cache_bytes(32, 8, 128, -1)")
check_raises(lambda: kv_cache_bytes(32, 8, 128, 10, batch=-2), ValueError, "kv_cache_bytes(32, 8, 128, 10, batch=-2)")
# the formula against the bytes of a real cache of the course model (fp32: 4 bytes per number)
_k = [torch.zeros(2, cfg.num_key_value_heads, 7, cfg.head_dim) for _ in range(2 * cfg.num_hidden_layers)]
check_equal(kv_cache_bytes(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 7, 2, 4),
            sum(t.numel() * t.element_size() for t in _k), "kv_cache_bytes for the course model (7 tokens, batch 2, fp32)")
print("Part A (formula): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.kvcache import kv_cache_bytes as _ref_bytes

_own_work(kv_cache_bytes, "kv_cache_bytes")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _ in range(100):
    _a = [int(torch.randint(1, 100, (1,), generator=_g)) for _ in range(3)]
    _t, _b = int(torch.randint(0, 200000, (1,), generator=_g)), int(torch.randint(0, 64, (1,), generator=_g))
    _e = [0.5, 1, 2, 4][int(torch.randint(0, 4, (1,), generator=_g))]
    check_equal(kv_cache_bytes(*_a, _t, _b, _e), _ref_bytes(*_a, _t, _b, _e),
                f"kv_cache_bytes{(*_a, _t, _b, _e)} (random, seed {_seed})")
for _bad in ((-3, 8, 128, 5), (32, -1, 128, 5), (32, 8, 0, 5), (32, 8, 128, -7)):
    check_raises(lambda: kv_cache_bytes(*_bad), ValueError, f"kv_cache_bytes{_bad}")
### END HIDDEN TESTS

# %% id="c007" nbgrader={"grade": true, "grade_id": "max_sequences_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# an 80 GB GPU holding Llama-2-7B in fp16 (13.5e9 bytes of weights): 4096-token sequences of 2 GiB each
check_equal(max_sequences(80e9, 13.5e9, 32, 32, 128, 4096), 30, "max_sequences(80e9, 13.5e9, 32, 32, 128, 4096)")
check_equal(max_sequences(80e9, 13.5e9, 32, 8, 128, 4096), 123, "max_sequences(80e9, 13.5e9, 32, 8, 128, 4096) (GQA)")
check_equal(max_sequences(16e9, 15e9, 32, 32, 128, 4096), 0, "max_sequences(16e9, 15e9, 32, 32, 128, 4096) (nothing fits)")
check_equal(max_sequences(2 * 2**30, 0, 32, 32, 128, 4096), 1, "max_sequences(2 GiB, 0, ...) (exactly one)")
print("Part A (max_sequences): visible tests passed")
### BEGIN HIDDEN TESTS
_own_work(max_sequences, "max_sequences")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _ in range(100):
    _L, _K, _D = (int(torch.randint(1, 81, (1,), generator=_g)), int(torch.randint(1, 33, (1,), generator=_g)),
                  int(torch.randint(1, 5, (1,), generator=_g)) * 32)
    _t = int(torch.randint(1, 200000, (1,), generator=_g))
    _gpu, _w = float(torch.randint(8, 200, (1,), generator=_g)) * 1e9, float(torch.rand(1, generator=_g)) * 100e9
    _per = 2 * _L * _K * _D * 2 * _t
    check_equal(max_sequences(_gpu, _w, _L, _K, _D, _t), max(0, int((_gpu - _w) // _per)),
                f"max_sequences({_gpu:.3g}, {_w:.3g}, {_L}, {_K}, {_D}, {_t}) (random, seed {_seed})")
### END HIDDEN TESTS

# %% [markdown] id="c008"
# ## Part B · A KV cache (4 points)
#
# Inside each attention layer, the course model computes the keys and values of the **new** tokens,
# `k` and `v` of shape `[batch, kv_heads, T, head_dim]` (keys already rotated by RoPE), and calls
#
#     k_all, v_all = cache.update(k, v, layer)
#
# expecting back the keys and values of **all** tokens so far, `[batch, kv_heads, S, head_dim]` with the
# new ones last. Before the first layer runs it calls `cache.get_seq_length()` to know the position of
# the first new token (0 for an empty cache). Layers are updated in order 0, 1, ..., L-1 at every forward.
#
# Implement `KVCache` that keeps one key tensor and one value tensor per layer and grows them along the
# sequence axis. (`torch.cat` is fine.)

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
check_equal(c.get_seq_length(), 3, "get_seq_length() after a 3-token prefill")
k2, v2 = torch.full((1, 2, 1, 4), 100.), torch.full((1, 2, 1, 4), -100.)
ka, va = c.update(k2, v2, 0)
check_shape(ka, (1, 2, 4, 4), "k_all after one more token at layer 0")
check_equal(ka[:, :, :3], k1, "k_all[:, :, :3] (the prefill's keys, unchanged)")
check_equal(ka[:, :, 3:], k2, "k_all[:, :, 3:] (the new key comes last)")
check_equal(va[:, :, 3:], v2, "v_all[:, :, 3:] (the new value comes last)")
check_shape(c.update(k2, v2, 1)[0], (1, 2, 4, 4), "k_all of layer 1 after one more token")
check_equal(c.get_seq_length(), 4, "get_seq_length() after prefill + 1 token")
print("Part B (contract): visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.kvcache import ContiguousCache as _Ref

_own_work(KVCache, "KVCache")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _trial in range(20):
    _B, _K, _D, _L = (int(torch.randint(1, 4, (1,), generator=_g)), int(torch.randint(1, 5, (1,), generator=_g)),
                      int(torch.randint(1, 9, (1,), generator=_g)), int(torch.randint(1, 4, (1,), generator=_g)))
    _mine, _ref = KVCache(), _Ref()
    for _step in range(int(torch.randint(1, 6, (1,), generator=_g))):
        _T = int(torch.randint(1, 5, (1,), generator=_g))
        check_equal(_mine.get_seq_length(), _ref.get_seq_length(), f"get_seq_length() before step {_step} (seed {_seed})")
        for _layer in range(_L):
            _k, _v = torch.randn(_B, _K, _T, _D, generator=_g), torch.randn(_B, _K, _T, _D, generator=_g)
            _a, _b = _mine.update(_k, _v, _layer), _ref.update(_k, _v, _layer)
            _what = f"update at step {_step}, layer {_layer}, k of shape {(_B, _K, _T, _D)} (seed {_seed})"
            check_equal(_a[0], _b[0], "k_all of " + _what)
            check_equal(_a[1], _b[1], "v_all of " + _what)
    check_equal(_mine.get_seq_length(), _ref.get_seq_length(), f"get_seq_length() at the end (seed {_seed})")
### END HIDDEN TESTS

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
### BEGIN HIDDEN TESTS
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _B in (1, 2):
    _p = torch.randint(1, cfg.vocab_size, (_B, int(torch.randint(1, 20, (1,), generator=_g))), generator=_g)
    check_equal(greedy_cached(_p, 8, KVCache()), greedy_recompute(_p, 8),
                f"greedy tokens with your KVCache, random prompt of shape {tuple(_p.shape)} (seed {_seed})")
    _c = KVCache()
    with torch.no_grad():
        _full = model(_p)
        if _p.shape[1] > 1:
            model(_p[:, :-1], cache=_c)
        _last = model(_p[:, -1:], cache=_c)
    check_close(_last[:, -1], _full[:, -1], f"last-token logits through your cache (seed {_seed})", rtol=1e-4, atol=1e-4)
### END HIDDEN TESTS

# %% [markdown] id="c013"
# ## Part C · A sliding-window cache (3 points)
#
# A sliding window of size `W` keeps only recent tokens: a new token attends to at most `W` tokens,
# **itself included**, and after every update the cache holds exactly `min(tokens seen, W)` tokens.
#
# Implement `SlidingWindowKVCache(window)` with, for each layer:
#
# * `update(k, v, layer)` with `T` new tokens: return the concatenation of the **last `W - 1` stored
#   tokens** (fewer if fewer are stored; none if `W == 1`) and the `T` new ones; then keep only the last
#   `W` tokens of that concatenation.
#   (For a decode step, `T = 1`, this is exactly "the last W tokens including the new one". For `T > 1` the
#   model would also need a banded mask; the library's version provides it. You only handle the cache.)
# * `get_seq_length()`: the position the next token gets, i.e. how many tokens have been **seen** so far
#   (keys keep their absolute RoPE positions), not how many are stored.
# * `stored_length(layer=0)`: how many tokens the layer holds.
#
# Raise a `ValueError` if `window` is not an integer >= 1.

# %% id="c014" nbgrader={"grade": false, "grade_id": "window_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class SlidingWindowKVCache:
    def __init__(self, window):
        ### BEGIN SOLUTION
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.window = window
        self.k, self.v, self.seen = [], [], []
        ### END SOLUTION

    def update(self, k, v, layer):
        ### BEGIN SOLUTION
        if layer == len(self.k):
            self.k.append(k[:, :, :0])
            self.v.append(v[:, :, :0])
            self.seen.append(0)
        keep = self.window - 1                                  # old tokens the first new one may see
        start = max(0, self.k[layer].shape[2] - keep)
        old_k, old_v = self.k[layer][:, :, start:], self.v[layer][:, :, start:]
        k_all = torch.cat([old_k, k], dim=2)
        v_all = torch.cat([old_v, v], dim=2)
        self.k[layer] = k_all[:, :, -self.window:]
        self.v[layer] = v_all[:, :, -self.window:]
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


w = SlidingWindowKVCache(4)
ka, _ = w.update(tokens(0, 3), tokens(0, 3), 0)                 # a 3-token prompt
check_equal(ka.flatten().tolist(), [0, 1, 2], "keys returned for a 3-token prompt (window 4)")
check_equal(w.stored_length(), 3, "stored_length() after 3 tokens (window 4)")
for t in range(3, 7):                                            # decode tokens 3, 4, 5, 6
    ka, _ = w.update(tokens(t, t + 1), tokens(t, t + 1), 0)
check_equal(ka.flatten().tolist(), [3, 4, 5, 6], "keys returned when token 6 arrives (window 4: itself + 3 before)")
check_equal(w.stored_length(), 4, "stored_length() after 7 tokens (window 4)")
check_equal(w.get_seq_length(), 7, "get_seq_length() after 7 tokens (tokens seen, not stored)")
ka, _ = w.update(tokens(7, 10), tokens(7, 10), 0)                # 3 tokens at once
check_equal(ka.flatten().tolist(), [4, 5, 6, 7, 8, 9], "keys returned for tokens 7, 8, 9 at once (3 old + 3 new)")
check_equal(w.stored_length(), 4, "stored_length() after 10 tokens")
one = SlidingWindowKVCache(1)
one.update(tokens(0, 2), tokens(0, 2), 0)
check_equal(one.update(tokens(2, 3), tokens(2, 3), 0)[0].flatten().tolist(), [2], "window 1: a token sees only itself")
check_raises(lambda: SlidingWindowKVCache(0), ValueError, "SlidingWindowKVCache(0)")
print("Part C: visible tests passed")
### BEGIN HIDDEN TESTS
from course_lib.kvcache import SlidingWindowCache as _RefW

_own_work(SlidingWindowKVCache, "SlidingWindowKVCache")
_seed = time.time_ns() % 2**32
_g = torch.Generator().manual_seed(_seed)
for _trial in range(30):
    _W = int(torch.randint(1, 9, (1,), generator=_g))
    _B, _K, _D = int(torch.randint(1, 3, (1,), generator=_g)), int(torch.randint(1, 3, (1,), generator=_g)), 4
    _mine, _ref = SlidingWindowKVCache(_W), _RefW(_W)
    for _step in range(int(torch.randint(1, 12, (1,), generator=_g))):
        _T = int(torch.randint(1, 6, (1,), generator=_g)) if torch.rand(1, generator=_g) < 0.3 else 1
        for _layer in range(2):
            _k, _v = torch.randn(_B, _K, _T, _D, generator=_g), torch.randn(_B, _K, _T, _D, generator=_g)
            _a, _b = _mine.update(_k, _v, _layer), _ref.update(_k, _v, _layer)
            _what = f"window {_W}, step {_step} with {_T} new tokens, layer {_layer} (seed {_seed})"
            check_equal(_a[0], _b[0], "keys returned, " + _what)
            check_equal(_a[1], _b[1], "values returned, " + _what)
            check_equal(_mine.stored_length(_layer), _ref.stored_length(_layer), "stored_length, " + _what)
        check_equal(_mine.get_seq_length(), _ref.get_seq_length(), f"get_seq_length, window {_W} (seed {_seed})")
### END HIDDEN TESTS
