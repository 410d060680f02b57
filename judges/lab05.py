"""Lab 05's judge: the KV memory formula, a full cache and a sink cache driven update by update, the same caches
inside the course model, and the predicted bytes.

Parts B and C send scripts of updates: the keys carry their token's position in channel 0, so a wrong window
reads as the positions it returned; every update's keys and values are compared with `course_lib.kvcache`'s
cache driven with the same updates here. The model parts load the bundled model in the kernel (a library call)
and feed a sequence through the student's cache there, the prompt in one forward and then token by token (the
continuation drawn, as a prompt is); the logits of every position come back and are compared with one
forward of the whole sequence here, under the causal mask (Part B) or the banded mask that defines windowed
attention (Part C). The memory parts use the student's Part A, so Part A's mistake is planted in them too
(charged once, in Part A).
"""
import math
from dataclasses import asdict
from functools import lru_cache

import torch

from course_grading.judging import Judge, call, ref
from course_lib.checks import check_close, check_equal
from course_lib.kvcache.base import ContiguousCache
from course_lib.kvcache.window import SlidingWindowCache
from course_lib.models import LlamaForCausalLM, bundled_path
from course_lib.models.config import kv_cache_bytes, preset

judge = Judge(references={
    "memory_tests": ["course_lib.models.config.kv_cache_bytes"],
    "max_sequences_tests": ["course_lib.models.config.kv_cache_bytes"],
    "cache_tests": ["course_lib.kvcache.base.ContiguousCache"],
    "cache_model_tests": ["course_lib.kvcache.base.ContiguousCache"],
    "window_tests": ["course_lib.kvcache.window.SlidingWindowCache", "course_lib.kvcache.window.SinkCache"],
    "window_model_tests": ["course_lib.kvcache.window.SlidingWindowCache", "course_lib.kvcache.window.SinkCache"],
    "predict_bytes_tests": ["course_lib.models.config.kv_cache_bytes"],
})


def randn(t, *shape):
    return torch.randn(*shape, generator=t.torch_generator())


# ---------------------------------------------------------------------------------------------------
# Part A: the memory formula

def bytes_case(t, what, got, want):
    """An int of bytes, with Part A's one-factor mistake (the keys only) planted."""
    check_equal(got, want, what, mistakes={t.mistake("one_factor"): want // 2})
    t.expect(type(got) is int, f"{what}: expected an int of bytes, got {type(got).__name__} {got!r}")


@judge.part("memory_tests", groups={"values": 3, "errors": 1})
def memory(t):
    grid = [(32, 32, 128, 1, 1, 2), (32, 32, 128, 4096, 1, 2), (32, 8, 128, 4096, 8, 2), (6, 2, 32, 10, 3, 4),
            (32, 8, 128, 1000, 1, 0.5), (32, 8, 128, 0, 1, 2), (32, 8, 128, 10, 0, 2), (1, 1, 1, 1, 1, 0.5),
            (3, 5, 7, 9, 11, 0.5), (1, 1, 1, 1, 1, 1), (80, 64, 128, 131_072, 64, 4)]
    drawn = [(t.rng.randint(1, 99), t.rng.randint(1, 99), t.rng.randint(1, 99), t.rng.randint(0, 199_999),
              t.rng.randint(0, 63), t.rng.choice([0.5, 1, 2, 4])) for _ in range(90)]
    for args in grid + drawn:
        what = f"kv_cache_bytes{args}"
        with t.case(what, group="values"):
            bytes_case(t, what, t.call("kv_cache_bytes", *args), kv_cache_bytes(*args))
    cfg = preset("tiny")
    what = "kv_cache_bytes for the course model (7 tokens, batch 2, fp32)"
    with t.case(what, group="values"):
        args = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 7, 2, 4)
        bytes_case(t, what, t.call("kv_cache_bytes", *args), kv_cache_bytes(*args))
    for args, kwargs in (((0, 8, 128, 10), {}), ((-3, 8, 128, 5), {}), ((32, -1, 128, 5), {}), ((32, 8, 0, 5), {}),
                         ((2.5, 8, 128, 5), {}), ((32, 8, 128, -1), {}), ((32, 8, 128, -7), {}),
                         ((32, 8, 128, 10), {"batch": -2})):
        what = f"kv_cache_bytes{args + tuple(f'{k}={v!r}' for k, v in kwargs.items())}"
        with t.case(what, group="errors"):
            t.raises(t.outcome("kv_cache_bytes", *args, **kwargs), "ValueError", what=what)


def number(x) -> str:
    """An int in full (a byte more or less matters), a float short."""
    return f"{x:,}" if isinstance(x, int) else f"{x:.6g}"


@judge.part("max_sequences_tests")
def max_sequences(t):
    per_7b = kv_cache_bytes(32, 32, 128, 4096)
    grid = [(80e9, 13.5e9, 32, 32, 128, 4096, 2), (80e9, 13.5e9, 32, 8, 128, 4096, 2),
            (16e9, 15e9, 32, 32, 128, 4096, 2), (2 * 2**30, 0, 32, 32, 128, 4096, 2),
            (7 * per_7b + 10**9, 10**9, 32, 32, 128, 4096, 2),          # exactly 7 fit
            (7 * per_7b + 10**9 - 1, 10**9, 32, 32, 128, 4096, 2),      # one byte short of 7
            (40e9, 70e9, 32, 8, 128, 4096, 2),                          # the weights alone do not fit
            (24e9, 4e9, 28, 4, 128, 32_768, 0.5), (141e9, 16e9, 32, 8, 128, 128_000, 1), (1e6, 0, 1, 1, 64, 1, 4)]
    drawn = []
    for _ in range(90):
        L, K, D = t.rng.randint(1, 80), t.rng.randint(1, 32), 32 * t.rng.randint(1, 4)
        tokens, gpu, weights = t.rng.randint(1, 199_999), t.rng.randint(8, 199) * 1e9, t.rng.uniform(0, 100e9)
        drawn.append((gpu, weights, L, K, D, tokens, t.rng.choice([0.5, 1, 2, 4])))
    for gpu, weights, L, K, D, tokens, bpe in grid + drawn:
        per = kv_cache_bytes(L, K, D, tokens, 1, bpe)
        want = max(0, int((gpu - weights) // per))
        what = f"max_sequences({number(gpu)}, {number(weights)}, {L}, {K}, {D}, {tokens}, bytes_per_element={bpe})"
        with t.case(what):
            check_equal(t.call("max_sequences", gpu, weights, L, K, D, tokens, bpe), want, what,
                        mistakes={t.mistake("one_factor"): max(0, int((gpu - weights) // (per // 2)))})


# ---------------------------------------------------------------------------------------------------
# Part B: the full cache

def position_keys(t, B, K, start, T, D):
    """Keys [B, K, T, D] whose channel 0 holds each token's position, the others drawn; values drawn."""
    k = randn(t, B, K, T, D)
    k[..., 0] = torch.arange(start, start + T, dtype=torch.float32)
    return k, randn(t, B, K, T, D)


def positions(keys) -> list:
    return [int(p) for p in torch.as_tensor(keys)[0, 0, :, 0].round().tolist()]


def update_checks(t, what, got, want, wrong=None):
    """One update's (k_all, v_all) against the reference's: the positions of the keys first (what a wrong
    window shows), then every number."""
    t.expect(isinstance(got, (tuple, list)) and len(got) == 2, f"{what}: expected (k_all, v_all), got {got!r}"[:300])
    k, v = got
    t.expect(len(getattr(k, "shape", ())) == 4, f"{what}: expected k_all of shape [batch, kv_heads, S, head_dim], "
                                                f"got {tuple(getattr(k, 'shape', ())) or type(k).__name__}")
    check_equal(positions(k), positions(want[0]), f"positions of the keys returned by {what}",
                mistakes={m: positions(w) for m, w in (wrong or {}).items()})
    check_equal(k, want[0], f"k_all returned by {what}")
    check_equal(v, want[1], f"v_all returned by {what}")


def cache_script(t, B, K, D, L, forwards):
    """A full-cache script: before each forward get_seq_length(), then the forward's update of every layer; the
    length at the end. Returns (ops, the reference's expected results)."""
    ops, ref_cache, want, seen = [call("KVCache", store="c", send=False)], ContiguousCache(), [], 0
    for T in forwards:
        ops.append(call("$c.get_seq_length"))
        want.append(("length", ref_cache.get_seq_length()))
        for layer in range(L):
            k, v = position_keys(t, B, K, seen, T, D)
            ops.append(call("$c.update", k, v, layer))
            want.append((f"update(k [{B}, {K}, {T}, {D}], v, layer={layer}) after {seen} tokens",
                         tuple(x.clone() for x in ref_cache.update(k, v, layer))))
        seen += T
    ops.append(call("$c.get_seq_length"))
    want.append(("length", ref_cache.get_seq_length()))
    return ops, want


@judge.part("cache_tests")
def cache(t):
    scripts = [(1, 2, 4, 2, [3, 1]),        # the visible example's shapes
               (1, 1, 2, 1, [1, 1, 1]),     # one layer, a one-token prompt
               (2, 3, 5, 4, [5, 1, 1, 3, 1]),  # a chunk of 3 after decoding
               (3, 1, 1, 3, [2, 2, 2, 1]), (1, 4, 8, 6, [7] + [1] * 6)]
    for _ in range(15):
        scripts.append((t.rng.randint(1, 3), t.rng.randint(1, 4), t.rng.randint(1, 8), t.rng.randint(1, 3),
                        [t.rng.randint(1, 4) for _ in range(t.rng.randint(1, 5))]))
    for B, K, D, L, forwards in scripts:
        ops, want = cache_script(t, B, K, D, L, forwards)
        label = f"KVCache, {L} layer(s), batch {B}, {K} KV head(s) of {D}, forwards of {forwards} tokens"
        with t.case(label):
            got = t.run(ops)
            got[0].get()
            for o, (what, expected) in zip(got[1:], want):
                if what == "length":
                    tokens = expected
                    check_equal(o.get(), tokens, f"{label}: get_seq_length() with {tokens} tokens in the cache",
                                mistakes={t.mistake("length_per_update"): tokens * L} if L > 1 else None)
                else:
                    update_checks(t, f"{label}: {what}", o.get(), expected)


# ---------------------------------------------------------------------------------------------------
# the course model, in the kernel and here

MODEL_OPS = [call("lib:course_lib.models.bundled_path", "tiny", store="path", send=False),
             call("lib:course_lib.models.LlamaForCausalLM.from_pretrained", ref("path"), store="model", send=False),
             call("$model.requires_grad_", False, send=False)]


@lru_cache(maxsize=1)
def course_model():
    model = LlamaForCausalLM.from_pretrained(bundled_path("tiny"))
    return model.requires_grad_(False)


@torch.no_grad()
def logits_here(ids, positions=None, attn_mask=None):
    return course_model()(ids, positions=positions, attn_mask=attn_mask)


def misplaced(forwards, start_of):
    """The positions a cache whose get_seq_length() is wrong gives the tokens: each forward's from
    start_of(the tokens before it) on. One forward at these positions is the whole stream through that cache."""
    out, a = [], 0
    for T in forwards:
        out += range(start_of(a), start_of(a) + T)
        a += T
    return torch.tensor(out)


def stream_ops(ids, forwards, cache_op):
    """The kernel's script: the model, the student's cache, one forward per chunk of `forwards` tokens."""
    ops, a = MODEL_OPS + [cache_op], 0
    for T in forwards:
        ops.append(call("$model", ids[:, a:a + T], cache=ref("c")))
        a += T
    return ops


def streamed_logits(what, results):
    logits = [o.get() for o in results]
    shapes = [tuple(getattr(x, "shape", ())) for x in logits]
    if not all(len(s) == 3 for s in shapes):
        raise AssertionError(f"{what}: the model's forwards returned logits of shapes {shapes}")
    return torch.cat([torch.as_tensor(x) for x in logits], dim=1)


def check_logits(got, want, what, planted, **tolerance):
    """check_close, the planted mistakes' logits (`planted()`: forwards of the model here) computed only for an
    answer that fails."""
    try:
        check_close(got, want, what, **tolerance)
    except AssertionError:
        check_close(got, want, what, mistakes=planted(), **tolerance)


def token_ids(t, B, N):
    return torch.randint(1, 2048, (B, N), generator=t.torch_generator())


@judge.part("cache_model_tests")
def cache_model(t):
    # (the tokens, the tokens per forward): a prompt, then its continuation token by token (the logits of every
    # position are compared, which is stronger than comparing the greedy tokens they choose)
    visible = torch.cat([torch.tensor([[5, 17, 300, 42, 1000, 7]]), token_ids(t, 1, 9)], dim=1)
    cases = [(visible, [6] + [1] * 9), (token_ids(t, 1, 8), [1] * 8),          # a one-token prompt
             (token_ids(t, 2, 13), [7, 3, 1, 1, 1])]                           # a chunk of 3 after the prompt
    for B in (1, 2):
        P = t.rng.randint(1, 19)
        cases.append((token_ids(t, B, P + 7), [P] + [1] * 7))
    for ids, forwards in cases:
        what = (f"the logits of {ids.shape[1]} tokens (batch {ids.shape[0]}) fed through your KVCache in forwards of "
                f"{forwards} tokens, against one forward of the whole sequence")
        with t.case(what):
            got = t.run(stream_ops(ids, forwards, call("KVCache", store="c", send=False)))
            got[len(MODEL_OPS)].get()

            def planted():                                  # get_seq_length() counting every layer's update
                layers = course_model().config.num_hidden_layers
                try:
                    return {t.mistake("length_per_update"): logits_here(ids, misplaced(forwards, lambda a: layers * a))}
                except ValueError:                          # its positions ran past the model's context
                    return {}
            check_logits(streamed_logits(what, got[len(MODEL_OPS) + 1:]), logits_here(ids), what, planted, rtol=1e-4,
                         atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# Part C: the sink cache

def window_script(t, W, S, B, K, forwards, layers=2, D=4):
    """A sink-cache script: after each layer's update its stored_length, after each forward get_seq_length().
    Returns (ops, the expected results, each with the planted mistakes' values)."""
    ops = [call("SinkKVCache", W, sinks=S, store="c", send=False), call("$c.get_seq_length")]
    mine, wide = SlidingWindowCache(W, sinks=S), SlidingWindowCache(W + 1, sinks=S)
    nosink = SlidingWindowCache(W, sinks=0)
    want, seen = [("length", 0, None)], 0
    for T in forwards:
        for layer in range(layers):
            k, v = position_keys(t, B, K, seen, T, D)
            ops += [call("$c.update", k, v, layer), call("$c.stored_length", layer)]
            expected = mine.update(k, v, layer)
            wrong = {t.mistake("window_off_by_one"): wide.update(k, v, layer)[0],
                     t.mistake("sinks_dropped"): nosink.update(k, v, layer)[0]}
            want.append((f"update of tokens {seen}..{seen + T - 1} at layer {layer}", expected, wrong))
            want.append((f"stored_length({layer}) after tokens 0..{seen + T - 1}", mine.stored_length(layer), None))
        seen += T
        ops.append(call("$c.get_seq_length"))
        want.append(("length", seen, {t.mistake("seen_vs_stored"): mine.stored_length()}))
    return ops, want


@judge.part("window_tests", groups={"scripts": 3, "errors": 1})
def window(t):
    # (window, sinks, batch, kv heads, tokens per forward)
    scripts = [(4, 0, 1, 1, [3, 1, 1, 1, 1, 3]), (1, 0, 1, 1, [2, 1]), (3, 2, 1, 1, [1] * 9 + [2]),   # the visible ones
               (1, 3, 1, 2, [1] * 7), (2, 3, 2, 1, [2, 4, 1, 1, 1]),   # new tokens that are sinks, across the boundary
               (2, 0, 1, 1, [5, 1, 1]), (1, 0, 1, 1, [3, 3, 1]),       # forwards longer than the window
               (8, 0, 1, 1, [3, 1, 1]),                                 # a window never full
               (2, 1, 2, 2, [1] * 30)]
    for _ in range(31):
        forwards = [t.rng.randint(1, 5) if t.rng.random() < 0.3 else 1 for _ in range(t.rng.randint(1, 13))]
        scripts.append((t.rng.randint(1, 8), t.rng.randint(0, 3), t.rng.randint(1, 2), t.rng.randint(1, 2), forwards))
    for W, S, B, K, forwards in scripts:
        ops, want = window_script(t, W, S, B, K, forwards)
        label = f"SinkKVCache({W}, sinks={S}), batch {B}, {K} KV head(s), forwards of {forwards} tokens"
        with t.case(label, group="scripts"):
            got = t.run(ops)
            got[0].get()
            for o, (what, expected, wrong) in zip(got[1:], want):
                if what == "length":
                    check_equal(o.get(), expected, f"{label}: get_seq_length() after {expected} tokens (tokens seen)",
                                mistakes=wrong)
                elif what.startswith("stored_length"):
                    check_equal(o.get(), expected, f"{label}: {what}")
                else:
                    update_checks(t, f"{label}: {what}", o.get(), expected, wrong)
    for args, kwargs in (((0,), {}), ((-1,), {}), ((2.5,), {}), ((4,), {"sinks": -1}), ((3,), {"sinks": 1.5})):
        what = f"SinkKVCache{args + tuple(f'{k}={v!r}' for k, v in kwargs.items())}"
        with t.case(what, group="errors"):
            t.raises(t.outcome("SinkKVCache", *args, **kwargs), "ValueError", what=what)


def band(n, window, sinks):
    """The definition: query i sees key j when j <= i and (j < sinks or i - j < window). [n, n] bool."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & ((j < sinks) | (i - j < window))


@judge.part("window_model_tests")
def window_model(t):
    visible = torch.randint(1, 2048, (1, 24), generator=torch.Generator().manual_seed(5))
    cases = [(6, 2, visible, 4), (1, 0, None, 1), (1, 2, None, 1), (3, 0, None, 3), (5, 3, None, 2)]
    for _ in range(2):
        W, S = t.rng.randint(2, 8), t.rng.randint(0, 3)
        cases.append((W, S, None, t.rng.randint(1, W)))
    for W, S, ids, P in cases:
        if ids is None:
            B, N = t.rng.randint(1, 2), t.rng.randint(W + S + 3, 27)
            ids = token_ids(t, B, N)
        B, N = ids.shape
        layers = course_model().config.num_hidden_layers
        what = (f"the logits of {N} tokens (batch {B}) streamed through SinkKVCache({W}, sinks={S}), a prompt of {P} "
                "then one token per forward, against one forward under the banded mask")
        with t.case(what):
            ops = stream_ops(ids, [P] + [1] * (N - P), call("SinkKVCache", W, sinks=S, store="c", send=False))
            ops += [call("$c.get_seq_length")] + [call("$c.stored_length", layer) for layer in range(layers)]
            got = t.run(ops)
            got[len(MODEL_OPS)].get()

            def planted():
                stored = misplaced([P] + [1] * (N - P), lambda a: min(a, S + W))   # positions from the tokens stored
                return {t.mistake("window_off_by_one"): logits_here(ids, attn_mask=band(N, W + 1, S)),
                        t.mistake("sinks_dropped"): logits_here(ids, attn_mask=band(N, W, 0)),
                        t.mistake("seen_vs_stored"): logits_here(ids, stored, band(N, W, S))}
            check_logits(streamed_logits(what, got[len(MODEL_OPS) + 1:-layers - 1]),
                         logits_here(ids, attn_mask=band(N, W, S)), what, planted, atol=1e-3, rtol=0)
            check_equal(got[-layers - 1].get(), N, f"get_seq_length() after {what}",
                        mistakes={t.mistake("seen_vs_stored"): min(N, S + W)})
            check_equal([o.get() for o in got[-layers:]], [min(N, S + W)] * layers,
                        f"stored_length(layer) of every layer after {what}")


# ---------------------------------------------------------------------------------------------------
# Part D: predict the bytes

def config_fields(L, K, Dh):
    """A LlamaConfig's fields with these layers, KV heads and head dim (two query heads per KV head)."""
    return dict(num_hidden_layers=L, num_attention_heads=2 * K, num_key_value_heads=K, head_dim=Dh,
                hidden_size=2 * K * Dh)


def heads_on_fullest_gpu(kv_heads: int, tp: int) -> int:
    """KV heads the fullest of `tp` GPUs holds, by enumeration: query head h reads KV head h // (H / K); a GPU
    holds every KV head its query heads (an even run of H / tp) read. With H = lcm(K, tp) query heads the
    runs are whole; a KV head read on two GPUs is a copy on each."""
    H = kv_heads * tp // math.gcd(kv_heads, tp)
    group, run = H // kv_heads, H // tp
    return max(len({h // group for h in range(r * run, (r + 1) * run)}) for r in range(tp))


def expected_bytes(L, K, Dh, held, batch, kb, vb, tp):
    """The fullest GPU's key and value bytes: the course's formula (`kv_cache_bytes`, one size per number) on
    the heads that GPU holds, once for the keys and once for the values (each half of its K-and-V count)."""
    heads = heads_on_fullest_gpu(K, tp)
    return (kv_cache_bytes(L, heads, Dh, held, batch, kb) + kv_cache_bytes(L, heads, Dh, held, batch, vb)) // 2


def draw_deployment(t):
    """A model shape, a cache, formats and a GPU count that splits the query heads evenly and the KV heads
    evenly (either way)."""
    K = t.rng.choice([1, 2, 4, 8, 16, 32])
    fields = config_fields(t.rng.randint(1, 80), K, 32 * t.rng.randint(1, 4))
    fields["num_attention_heads"] = K * t.rng.choice([1, 2, 4, 8])
    H = fields["num_attention_heads"]      # every GPU computes whole query heads, as the contract assumes
    tp = t.rng.choice([d for d in (1, 2, 4, 8, 16, 32, 64) if (K % d == 0 or d % K == 0) and H % d == 0])
    window = None if t.rng.random() < 0.5 else t.rng.randint(1, 8191)
    kb, vb = t.rng.choice([(1, 2), (2, 1), (1, 1), (2, 2), (0.5, 2), (1, 4), (4, 4)])
    tokens = t.rng.choice([t.rng.randint(0, 131_072), 131_072, 2 ** t.rng.randint(10, 20)])
    return fields, tokens, window, t.rng.randint(0, 8), t.rng.randint(1, 8), kb, vb, tp


@judge.part("predict_bytes_tests", groups={"values": 3, "errors": 1})
def predict_bytes(t):
    llama3 = config_fields(32, 8, 128) | {"num_attention_heads": 32, "hidden_size": 4096}
    llama7b = config_fields(32, 32, 128) | {"num_attention_heads": 32, "hidden_size": 4096}
    tiny = {k: v for k, v in asdict(preset("tiny")).items() if k != "name"}
    # (config, tokens, window, sinks, batch, key bytes, value bytes, tp): the deployments of the question
    # (FP8 keys at 128K under TP=8 and past the KV heads), then edges: one GPU, MQA, tp = K, window not filled
    grid = [(llama3, 131072, None, 0, 1, 1, 2, 8), (llama3, 131072, None, 0, 4, 1, 2, 16),
            (llama3, 131072, 4092, 4, 8, 1, 1, 32), (llama3, 4096, None, 0, 1, 2, 2, 1),
            (llama7b, 4096, 1020, 4, 1, 2, 2, 4), (llama7b, 100, 1020, 4, 1, 1, 2, 2),
            (tiny, 100, 32, 4, 2, 4, 4, 1), (tiny, 36, 32, 4, 1, 4, 1, 2), (tiny, 0, 8, 2, 1, 2, 1, 4),
            (tiny, 50, 1, 0, 3, 2, 0.5, 1), (config_fields(1, 1, 2) | {"num_attention_heads": 8, "hidden_size": 16},
                                               7, None, 3, 5, 1, 2, 8),
            (config_fields(2, 1, 64), 1000, None, 0, 1, 1, 2, 1)]
    grid += [draw_deployment(t) for _ in range(40)]
    for fields, tokens, window, sinks, batch, kb, vb, tp in grid:
        L, K, Dh = fields["num_hidden_layers"], fields["num_key_value_heads"], fields["head_dim"]
        held = tokens if window is None else min(tokens, sinks + window)
        want = expected_bytes(L, K, Dh, held, batch, kb, vb, tp)
        what = (f"predict_cache_bytes(config with {L} layers, {fields['num_attention_heads']} query heads, {K} KV "
                f"heads of {Dh}, {tokens} tokens, window={window}, sinks={sinks}, batch={batch}, key_bytes={kb}, "
                f"value_bytes={vb}, tp={tp})")
        with t.case(what, group="values"):
            o = t.run([call("lib:course_lib.models.config.LlamaConfig", store="cfg", send=False, **fields),
                       call("predict_cache_bytes", ref("cfg"), tokens, window, sinks, batch, kb, vb, tp)])[-1]
            wrong = {t.mistake("one_factor"): want // 2,
                     t.mistake("kv_one_size"): float(expected_bytes(L, K, Dh, held, batch, kb, kb, tp)),
                     t.mistake("tp_fraction_heads"): 2 * L * K / tp * Dh * held * batch * (kb + vb) / 2,
                     t.mistake("tp_not_split"): float(expected_bytes(L, K, Dh, held, batch, kb, vb, 1))}
            if window is not None:
                wrong[t.mistake("sinks_dropped")] = float(expected_bytes(L, K, Dh, min(tokens, window), batch,
                                                                         kb, vb, tp))
            check_equal(o.get(), want, what, mistakes={k: v for k, v in wrong.items() if v != want})
            t.expect(type(o.get()) is int, f"{what}: expected an int of bytes, got {type(o.get()).__name__}")
    llama3_bad = [("window=0", {"window": 0}), ("window=-4", {"window": -4}), ("window=2.5", {"window": 2.5}),
                  ("sinks=-1", {"window": 8, "sinks": -1}), ("sinks=1.5", {"window": 8, "sinks": 1.5}),
                  ("tp=3 (8 KV heads)", {"tp": 3}), ("tp=12 (8 KV heads)", {"tp": 12}), ("tp=0", {"tp": 0}),
                  ("tp=2.0", {"tp": 2.0}), ("key_bytes=0", {"key_bytes": 0}), ("value_bytes=-2", {"value_bytes": -2})]
    for what, kwargs in llama3_bad:
        with t.case(f"predict_cache_bytes(cfg, 10, {what})", group="errors"):
            o = t.run([call("lib:course_lib.models.config.LlamaConfig", store="cfg", send=False, **llama3),
                       call("predict_cache_bytes", ref("cfg"), 10, **kwargs)])[-1]
            t.raises(o, "ValueError", what=f"predict_cache_bytes(cfg, 10, {what})")


def mutants():
    """Planted wrong answers for the round trips (tests/test_judges.py, tests/test_grading.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from judge_tools import solution_with
    return [
        ("the KV memory formula forgets the factor 2 (K and V are both cached; charged in Part A, not again in "
         "max_sequences and the prediction), and get_seq_length counts every layer's update (charged in Part B's "
         "script, not again with the model)",
         {"memory_answer": solution_with("lab05", "memory_answer", {
             "    return int(2 * num_layers * num_kv_heads": "    return int(num_layers * num_kv_heads"}),
          "cache_answer": '''\
class KVCache:
    def __init__(self):
        self.k, self.v, self.n = [], [], 0

    def update(self, k, v, layer):
        if layer == len(self.k):
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        self.n += k.shape[2]
        return self.k[layer], self.v[layer]

    def get_seq_length(self):
        return self.n
'''},
         ["one_factor", "length_per_update"]),
        ("the sink cache does not count the new token in its own window (W stored tokens + the new one)",
         {"window_answer": solution_with("lab05", "window_answer", {
             "        start = max(s, n - (self.window - 1))": "        start = max(s, n - self.window)"})},
         ["window_off_by_one"]),
        ("the sink cache drops its sinks with the window, and get_seq_length() returns the tokens stored",
         {"window_answer": solution_with("lab05", "window_answer", {
             "        self.window, self.sinks = window, sinks": "        self.window, self.sinks = window, 0",
             "        return self.seen[0] if self.seen else 0": "        return self.k[0].shape[2] if self.k else 0"})},
         ["sinks_dropped", "seen_vs_stored"]),
        ("the predicted cache counts values at the keys' size, and splits the KV heads over the GPUs as fractions "
         "of a head when there are more GPUs than heads (Part D, the prediction)",
         {"predict_bytes": solution_with("lab05", "predict_bytes", {
             "    heads = max(1, kv_heads // tp)": "    heads = kv_heads / tp",
             "    return kv_cache_bytes(config.num_hidden_layers, heads, config.head_dim, held, batch, "
             "(key_bytes + value_bytes) / 2)":
             "    return int(2 * config.num_hidden_layers * heads * config.head_dim * held * batch * key_bytes)"})},
         ["kv_one_size", "tp_fraction_heads"]),
    ]


# The written part, graded by the instructor (course_grading/manual.py): its rubric lives here, never in
# the student's notebook; the feedback page shows it with the instructor's score and comment.
WRITTEN = {
    "written_cache_bytes": {"points": 2, "rubric": [
        (1, "quotes their own predicted, measured and storage bytes for both caches and explains each "
            "difference (or the agreement) from how their cache holds its tensors (slice or view keeps its "
            "base alive; concatenation copies; preallocation reserves capacity)"),
        (1, "says storage (not the formula) bounds the batch on a device and names something else the formula"
            " misses there (allocator caching, transient copies during cat, preallocated maximum length)"),
    ]},
}
