"""Module 05 variants: sliding window, sinks (RoPE positions), H2O, quantized, multi-tier, latent, GQA/MQA."""
import math
import time

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import apply_rope, rope_cos_sin
from course_lib.generation import generate
from course_lib.kvcache import (ContiguousCache, H2OCache, KVCache, LatentCache, MultiTierCache, QuantBlock,
                                QuantizedCache, SinkCache, SlidingWindowCache, dequantize_minmax, fit_latent,
                                pack_uint4, quantize_minmax, regroup_kv_heads, rotate_keys, stream_score,
                                unpack_uint4)
from course_lib.models import LlamaConfig, LlamaForCausalLM, load
from device_tools import assert_greedy_match, tol_for


@pytest.fixture(scope="module")
def model(device):
    m, _ = load("tiny", device=device)
    return m


@pytest.fixture(scope="module")
def small(device):
    """A random small model with a short context (64) and MHA-style 4 heads / 2 KV heads."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval().to(device)   # initialised on the CPU: the same weights everywhere


def generate_through(model, prompt, n, cache):
    """``generate`` (greedy) through `cache` as (ids [B, T + n] with the prompt in front, logits [B, n, V])."""
    out = generate(model, prompt, n, cache=cache, return_logits=True)
    tokens, logits = out.tokens, out.logits
    if tokens.dim() == 1:                                  # one request: [n] and [n, V]
        tokens, logits = tokens[None], logits[None]
    return torch.cat([prompt, tokens.to(prompt.device)], dim=1), logits


def ids_for(n, vocab=2048, seed=0, device="cpu"):
    """[1, n] token ids drawn on the CPU (the same ids on every device), on `device`."""
    return torch.randint(1, vocab, (1, n), generator=torch.Generator().manual_seed(seed)).to(device)


def band_mask(n, window, sinks=0, device="cpu"):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) & ((j < sinks) | (i - j < window))


def assert_same_generation(got, want, device, what=""):
    """generate_through(...) outputs of two caches that must agree: identical
    tokens and logits within 1e-4 on the CPU; on CUDA identical up to a near-tie (device_tools)."""
    (got_ids, got_logits), (want_ids, want_logits) = got, want
    T = want_ids.shape[1] - want_logits.shape[1]
    for row in range(want_ids.shape[0]):
        assert_greedy_match(got_ids[row, T:], want_ids[row, T:], want_logits[row], device, got_logits[row],
                            what=f"{what} row {row}", cpu_tol=dict(rtol=1e-4, atol=1e-4))


def stream_logits(model, ids, cache, prefill=1, chunk=1):
    out, a = [], 0
    steps = [prefill] + [chunk] * ids.shape[1]
    with torch.no_grad():
        for s in steps:
            if a >= ids.shape[1]:
                break
            b = min(a + s, ids.shape[1])
            out.append(model(ids[:, a:b], cache=cache, attn_mask=cache.attn_mask(b - a, ids.device)))
            a = b
    return torch.cat(out, dim=1)


# --- sliding window and sinks -------------------------------------------------------------------------
@pytest.mark.parametrize("window,sinks,prefill,chunk", [(8, 0, 1, 1), (8, 0, 13, 5), (5, 3, 1, 1), (6, 2, 20, 3)])
def test_window_cache_equals_banded_attention(small, window, sinks, prefill, chunk, device):
    """Absolute positions: streaming through the cache == one forward with the banded (+ sinks) mask."""
    ids = ids_for(40, 97, seed=window, device=device)
    cache = SlidingWindowCache(window, sinks=sinks)
    got = stream_logits(small, ids, cache, prefill, chunk)
    with torch.no_grad():
        want = small(ids, attn_mask=band_mask(40, window, sinks, device))
    torch.testing.assert_close(got, want, **tol_for(device, dict(rtol=1e-4, atol=1e-5)))


def test_window_keeps_exact_token_count():
    W, s = 4, 2
    c = SlidingWindowCache(W, sinks=s)
    seen = 0
    for T in (1, 1, 3, 1, 7, 1, 1, 2):
        k = torch.arange(seen, seen + T, dtype=torch.float32).view(1, 1, T, 1).expand(1, 1, T, 2).contiguous()
        ka, _ = c.update(k, k.clone(), 0)
        seen += T
        assert c.stored_length() == min(seen, s + W)
        stored = c.layers[0].k[0, 0, :, 0].tolist()
        assert stored == [float(x) for x in list(range(min(seen, s))) + list(range(max(s, seen - W), seen))]
        # a decode step attends to the sinks + W - 1 previous + itself
        if T == 1 and seen > s + W:
            assert ka.shape[2] == s + W
    assert c.get_seq_length() == seen


def test_sink_cache_without_eviction_equals_contiguous(model, device):
    prompt = ids_for(10, seed=1, device=device)
    want = generate_through(model, prompt, 8, cache=ContiguousCache())
    got = generate_through(model, prompt, 8, cache=SinkCache(window=40, sinks=4))
    assert_same_generation(got, want, device, "sink cache")


def test_rotate_keys_composes_and_inverts():
    k = torch.randn(2, 3, 5, 16)
    p = torch.tensor([0, 3, 7, 100, 511])
    back = rotate_keys(rotate_keys(k, p), -p)
    torch.testing.assert_close(back, k, rtol=1e-5, atol=1e-4)
    twice = rotate_keys(rotate_keys(k, p), p)
    torch.testing.assert_close(twice, rotate_keys(k, 2 * p), rtol=1e-4, atol=1e-4)


def test_sink_cache_rope_positions_are_cache_indices(model, device):
    """Keys are cached after RoPE; the sink cache re-positions them. At layer 0 a key depends only on its
    token and its position, so every returned key must equal RoPE(k_proj(token)) at its cache index."""
    cfg = model.config
    W, s = 6, 3
    cache = SinkCache(window=W, sinks=s)
    ids = ids_for(30, seed=5, device=device)[0]
    seen_k = {}

    class Spy(KVCache):  # passes everything on to the cache and keeps what layer 0 gets back
        def update(self, k, v, layer, q=None):
            out = cache.update(k, v, layer, q=q)
            if layer == 0:
                seen_k["k"] = out[0]
            return out

        def get_seq_length(self):
            return cache.get_seq_length()

    spy = Spy()
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        for t in range(30):
            model(ids[t:t + 1][None], cache=spy)
            kept = list(range(min(t + 1, s))) + list(range(max(s, t + 1 - W), t + 1))
            x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids[kept]))[None]
            k = attn.k_proj(x).view(1, len(kept), cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
            cos, sin = rope_cos_sin(torch.arange(len(kept), device=device)[None], cfg.head_dim, cfg.rope_theta)
            torch.testing.assert_close(seen_k["k"], apply_rope(k, cos, sin),
                                       **tol_for(device, dict(rtol=1e-4, atol=1e-4)))
            assert cache.get_seq_length() <= s + W - 1           # positions stay bounded


def test_sink_cache_runs_past_the_model_context(small, device):
    """The small model has a 64-token context; a repositioned sink cache generates 150 tokens anyway,
    while absolute positions (the plain window) hit the model's position limit."""
    prompt = ids_for(5, 97, seed=2, device=device)
    cache = SinkCache(window=16, sinks=4)
    out, _ = generate_through(small, prompt, 150, cache=cache)
    assert out.shape == (1, 155) and cache.stored_length() == 20 and cache.get_seq_length() == 19
    with pytest.raises(ValueError, match="context"):
        generate_through(small, prompt, 150, cache=SlidingWindowCache(16))


def test_window_cache_validation():
    for bad in (dict(window=0), dict(window=2.5), dict(window=4, sinks=-1)):
        with pytest.raises(ValueError):
            SlidingWindowCache(**bad)


# --- H2O ----------------------------------------------------------------------------------------------
def h2o_reference(qs, ks, heavy, recent, group):
    """Plain loops: per (kv head), accumulate attention, keep top-`heavy` older + last `recent`.
    qs: list of [H, Dh] rotated queries, ks: list of [K, Dh] keys, one per step."""
    K = ks[0].shape[0]
    kept = [[] for _ in range(K)]   # per head: list of [orig index, score]
    for t, (q, k) in enumerate(zip(qs, ks)):
        for h in range(K):
            kept[h].append([t, 0.0])
            keys = torch.stack([ks[i][h] for i, _ in kept[h]])
            for g in range(group):
                w = torch.softmax(keys @ q[h * group + g] / math.sqrt(q.shape[-1]), dim=0)
                for e, wi in zip(kept[h], w.tolist()):
                    e[1] += wi
            if len(kept[h]) > heavy + recent:
                old, rec = kept[h][:-recent] if recent else kept[h], kept[h][-recent:] if recent else []
                top = sorted(sorted(old, key=lambda e: -e[1])[:heavy], key=lambda e: e[0])
                kept[h] = top + rec
    return [[i for i, _ in kh] for kh in kept]


def test_h2o_matches_reference_on_random_queries():
    torch.manual_seed(0)
    B, K, G, Dh, steps, heavy, recent = 1, 2, 2, 8, 14, 3, 2
    cache = H2OCache(heavy, recent)
    qs, ks = [], []
    for t in range(steps):
        q = torch.randn(B, K * G, 1, Dh) * 2                  # the rotated queries the model passes
        k = torch.randn(B, K, 1, Dh)
        qs.append(q[0, :, 0])
        ks.append(k[0, :, 0])
        cache.update(k, k.clone(), 0, q=q)
        assert cache.stored_length() == min(t + 1, heavy + recent)
    want = h2o_reference(qs, ks, heavy, recent, G)
    for h in range(K):
        got = [next(i for i, kk in enumerate(ks) if torch.equal(kk[h], row)) for row in cache.layers[0].k[0, h]]
        assert got == want[h]


def test_h2o_keeps_a_heavy_hitter():
    """A key every query attends to strongly survives, however old."""
    cache = H2OCache(heavy=1, recent=2)
    Dh = 4
    hot = torch.tensor([5.0, 0, 0, 0]).view(1, 1, 1, Dh)
    for t in range(10):
        k = hot if t == 0 else torch.randn(1, 1, 1, Dh) * 0.1
        cache.update(k, k.clone(), 0, q=torch.tensor([3.0, 0, 0, 0]).view(1, 1, 1, Dh))
    assert torch.equal(cache.layers[0].k[0, 0, 0], hot[0, 0, 0])


def test_h2o_with_model(model, device):
    prompt = ids_for(12, seed=7, device=device)
    want = generate_through(model, prompt, 6, cache=ContiguousCache())
    got = generate_through(model, prompt, 6, cache=H2OCache(heavy=20, recent=20))
    assert_same_generation(got, want, device, "H2O under budget")   # budget not reached: exact on the CPU
    cache = H2OCache(heavy=4, recent=4)
    r = stream_score(model, ids_for(40, seed=8, device=device)[0], cache)
    assert cache.stored_length() == 8 and r.final_nbytes == cache.nbytes()
    assert all(t.device == prompt.device for st in cache.layers for t in (st.k, st.v, st.score))
    k = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="needs q"):                  # scoring needs the queries
        H2OCache(2, 2).update(k, k, 0)
    for bad in (torch.randn(1, 3, 3, 8), torch.randn(1, 4, 2, 8), torch.randn(4, 3, 8)):
        with pytest.raises(ValueError, match="q must be"):           # 3 heads for 2 KV heads, T, rank
            H2OCache(2, 2).update(k, k, 0, q=bad)
    with pytest.raises(ValueError):
        H2OCache(0, 0)


class _H2OLoops(KVCache):
    """H2O as per-head Python loops, an oracle independent of H2OCache: it ignores the q the model passes
    and takes the queries from forward hooks on each layer's q_proj (rotated here), so it also checks that
    the model passes the right ones. Returns each layer's kept + new keys in H2OCache's order (older first)."""

    def __init__(self, model, heavy, recent):
        self.cfg, self.heavy, self.recent = model.config, heavy, recent
        self.q, self.tok, self.kept = {}, [], []   # tok[l][i] = (k, v) [K, Dh]; kept[l][h] = [[i, score]]
        self.handles = [layer.self_attn.q_proj.register_forward_hook(
            lambda mod, inp, out, i=i: self.q.__setitem__(i, out.detach()))
            for i, layer in enumerate(model.model.layers)]

    def remove_hooks(self):
        for h in self.handles:
            h.remove()

    def get_seq_length(self):
        return len(self.tok[0]) if self.tok else 0

    def stored_length(self, layer=0):                     # stream_score reports these two
        return len(self.kept[layer][0]) if self.kept else 0

    def nbytes(self):
        return 0

    def update(self, k, v, layer, q=None):
        B, K, T, Dh = k.shape
        H = self.cfg.num_attention_heads
        G = H // K
        if layer == len(self.tok):
            self.tok.append([]), self.kept.append([[] for _ in range(K)])
        start = len(self.tok[layer])
        q = self.q.pop(layer).view(B, T, H, Dh).transpose(1, 2)
        cos, sin = rope_cos_sin(torch.arange(start, start + T, device=k.device)[None], Dh, self.cfg.rope_theta)
        q = apply_rope(q, cos, sin)[0]                                   # [H, T, Dh]
        self.tok[layer] += [(k[0, :, t], v[0, :, t]) for t in range(T)]
        ks, vs = [], []
        for h in range(K):
            old = self.kept[layer][h]
            entries = old + [[start + t, 0.0] for t in range(T)]
            keys = torch.stack([self.tok[layer][i][0][h] for i, _ in entries])   # [S, Dh]
            ks.append(keys), vs.append(torch.stack([self.tok[layer][i][1][h] for i, _ in entries]))
            for t in range(T):                           # new query t sees the old keys and new 0..t
                for g in range(G):
                    w = torch.softmax(keys[:len(old) + t + 1].float() @ q[h * G + g, t].float() / math.sqrt(Dh), 0)
                    for e, wi in zip(entries, w.tolist()):
                        e[1] += wi
            if len(entries) > self.heavy + self.recent:
                cand = entries[:len(entries) - self.recent]
                rec = entries[len(entries) - self.recent:]
                top = sorted(sorted(cand, key=lambda e: -e[1])[:self.heavy], key=lambda e: e[0])
                entries = top + rec
            self.kept[layer][h] = entries
        return torch.stack(ks)[None], torch.stack(vs)[None]


def assert_h2o_state_matches(cache, ref, what):
    """Same kept tokens (per layer and KV head) and the same accumulated scores."""
    for layer, st in enumerate(cache.layers):
        for h in range(st.k.shape[1]):
            toks = ref.tok[layer]
            got = [next(i for i, (kk, _) in enumerate(toks) if torch.equal(kk[h], row)) for row in st.k[0, h]]
            want = [i for i, _ in ref.kept[layer][h]]
            assert got == want, f"{what}: layer {layer} head {h} keeps {got}, the loops keep {want}"
            torch.testing.assert_close(st.score[0, h].double().cpu(),
                                       torch.tensor([s for _, s in ref.kept[layer][h]], dtype=torch.float64),
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("heavy,recent", [(4, 3), (5, 0), (0, 4)])
def test_h2o_in_the_model_equals_per_head_loops(small, heavy, recent, device):
    """Fresh random prompts through the small model (prefill, then decode; and chunked streaming): H2OCache
    keeps the same tokens with the same scores as the loops, and gives the same tokens and logits."""
    seed = time.time_ns() % 2**31
    prompt, text = ids_for(9, 97, seed=seed, device=device), ids_for(30, 97, seed=seed + 1, device=device)[0]
    cache = H2OCache(heavy, recent)
    got = generate_through(small, prompt, 14, cache=cache)
    ref = _H2OLoops(small, heavy, recent)
    try:
        want = generate_through(small, prompt, 14, cache=ref)
    finally:
        ref.remove_hooks()
    assert cache.stored_length() == min(22, heavy + recent)
    assert_same_generation(got, want, device, f"H2O generate (seed {seed})")
    assert_h2o_state_matches(cache, ref, f"H2O generate (seed {seed})")
    cache, ref = H2OCache(heavy, recent), _H2OLoops(small, heavy, recent)
    got = stream_score(small, text, cache, prefill=7, chunk=3)
    try:
        want = stream_score(small, text, ref, prefill=7, chunk=3)
    finally:
        ref.remove_hooks()
    torch.testing.assert_close(torch.tensor(got.nll_per_token), torch.tensor(want.nll_per_token),
                               **tol_for(device, dict(rtol=1e-4, atol=1e-4)))
    assert_h2o_state_matches(cache, ref, f"H2O stream (seed {seed})")


# --- quantized ----------------------------------------------------------------------------------------
def test_minmax_quantization_error_and_packing():
    x = torch.randn(2, 3, 16, 8) * 3
    for bits in (8, 4):
        codes, scale, zero = quantize_minmax(x, bits, dim=2)
        assert codes.dtype == torch.uint8 and int(codes.max()) <= 2 ** bits - 1
        assert scale.shape == (2, 3, 1, 8) and scale.dtype == torch.float16
        err = (dequantize_minmax(codes, scale, zero) - x).abs()
        assert (err <= scale.float() / 2 + 1e-2 * scale.float() + 1e-3).all()
        if bits == 4:
            assert torch.equal(unpack_uint4(pack_uint4(codes)), codes)
            assert pack_uint4(codes).shape[-1] == 4 and pack_uint4(codes).dtype == torch.uint8
    with pytest.raises(ValueError):
        quantize_minmax(x, 3, dim=2)


def test_keys_per_channel_survive_an_outlier_channel():
    """One channel 50x larger (as in real K): per-channel scales keep the other channels precise,
    per-token scales do not. This is why keys are quantized per channel and values per token."""
    torch.manual_seed(0)
    k = torch.randn(1, 1, 32, 16)
    k[..., 3] *= 50
    blk = QuantBlock.from_kv(k, k.clone(), 4)
    k_hat, v_hat = blk.dequantize()                    # keys per channel, values (same data) per token
    others = [c for c in range(16) if c != 3]
    err_channel = (k_hat - k)[..., others].abs().mean()
    err_token = (v_hat - k)[..., others].abs().mean()
    assert err_channel * 5 < err_token
    assert blk.k_scale.shape == (1, 1, 1, 16) and blk.v_scale.shape == (1, 1, 32, 1)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_cache_layout_bytes_and_error(bits):
    torch.manual_seed(1)
    B, K, Dh, R, G = 2, 2, 8, 4, 8
    c = QuantizedCache(bits, residual=R, group=G)
    ks, vs = [], []
    for t in range(37):
        k, v = torch.randn(B, K, 1, Dh), torch.randn(B, K, 1, Dh)
        ks.append(k), vs.append(v)
        ka, va = c.update(k, v, 0)
        n_fp, n_q = c.tier_lengths()
        assert n_fp + n_q == t + 1 and n_q % G == 0
        assert R <= n_fp < R + G or t + 1 < R + G
    K_all = torch.cat(ks, 2)
    assert ka.shape == K_all.shape
    torch.testing.assert_close(ka[:, :, -n_fp:], K_all[:, :, -n_fp:])      # recent tokens exact
    n_fp, n_q = c.tier_lengths()
    code_bytes = 2 * B * K * n_q * Dh * bits // 8                             # K and V codes
    scale_bytes = 2 * 2 * B * K * (n_q // G) * Dh + 2 * 2 * B * K * n_q       # fp16 scale + zero
    fp_bytes = 2 * B * K * n_fp * Dh * 4
    assert c.nbytes() == code_bytes + scale_bytes + fp_bytes
    err = (ka - K_all).abs().max()
    assert 0 < err < (0.05 if bits == 8 else 0.8)


def test_int8_closer_than_int4_in_the_model(model, device):
    ids = ids_for(48, seed=9, device=device)
    with torch.no_grad():
        full = stream_logits(model, ids, ContiguousCache())
        e8 = (stream_logits(model, ids, QuantizedCache(8, residual=8, group=8)) - full).abs().max()
        e4 = (stream_logits(model, ids, QuantizedCache(4, residual=8, group=8)) - full).abs().max()
    assert 0 < e8 < e4


def test_multitier_cache_tiers_and_eviction():
    torch.manual_seed(2)
    c = MultiTierCache(recent=4, tiers=((8, 8), (8, 4)), group=4)
    ks = []
    for t in range(40):
        k = torch.randn(1, 1, 1, 8)
        ks.append(k)
        ka, _ = c.update(k, k.clone(), 0)
        fp, t8, t4 = c.tier_lengths()
        assert t8 <= 8 and t4 <= 8 and min(t + 1, 4) <= fp < 4 + 4
    assert c.stored_length() == sum(c.tier_lengths()) <= 4 + 3 + 8 + 8
    assert c.layers[0].dropped == 40 - c.stored_length()
    K_all = torch.cat(ks, 2)[:, :, -ka.shape[2]:]
    fp, t8, t4 = c.tier_lengths()
    err = (ka - K_all).abs()[0, 0].amax(-1)              # per token, oldest first
    assert err[-fp:].max() == 0                          # full precision
    assert err[t4:t4 + t8].max() < err[:t4].max()        # int8 tier closer than the int4 tier
    with pytest.raises(ValueError):
        MultiTierCache(tiers=((None, 8), (8, 4)))
    with pytest.raises(ValueError):
        MultiTierCache(tiers=((10, 8),), group=4)


# --- latent (MLA-style) -------------------------------------------------------------------------------
def test_latent_cache_full_rank_is_exact_and_rank_trades_memory(model, device):
    cfg = model.config
    calib = [ids_for(64, seed=s, device=device)[0] for s in (11, 12)]
    proj = fit_latent(model, calib)
    full_dim = 2 * cfg.num_key_value_heads * cfg.head_dim
    assert proj[0].rank == full_dim
    prompt = ids_for(10, seed=13, device=device)
    want = generate_through(model, prompt, 5, cache=ContiguousCache())
    got = generate_through(model, prompt, 5, cache=LatentCache(proj, cfg.rope_theta))
    for row in range(prompt.shape[0]):   # full rank: a change of basis, exact up to rounding (1e-3 here)
        assert_greedy_match(got[0][row, 10:], want[0][row, 10:], want[1][row], device, got[1][row],
                            what="latent full rank", cpu_tol=dict(rtol=1e-3, atol=1e-3))
    ids = ids_for(30, seed=14, device=device)
    with torch.no_grad():
        ref = ContiguousCache()
        model(ids, cache=ref)
        errs = []
        for r in (full_dim, 48, 16):
            c = LatentCache(proj, cfg.rope_theta, rank=r)
            model(ids, cache=c)
            assert c.nbytes() == cfg.num_hidden_layers * 30 * r * 4
            errs.append((c.kv(0)[1] - ref.v[0]).abs().mean())
    assert errs[0] < 1e-4 < errs[1] < errs[2]
    with pytest.raises(ValueError):
        proj[0].truncate(0)


# --- GQA / MQA ----------------------------------------------------------------------------------------
def test_regroup_kv_heads(model, device):
    cfg = model.config
    ids = ids_for(20, seed=15, device=device)
    with torch.no_grad():
        base = model(ids)
        mha = regroup_kv_heads(model, cfg.num_attention_heads)        # repeat: exactly the same function
        assert mha.device == model.device
        torch.testing.assert_close(mha(ids), base, **tol_for(device, dict(rtol=1e-4, atol=1e-4)))
        mqa = regroup_kv_heads(model, 1)                              # pool: smaller cache, new function
        caches = {}
        for name, m in (("gqa", model), ("mha", mha), ("mqa", mqa)):
            caches[name] = ContiguousCache()
            m(ids, cache=caches[name])
        assert caches["gqa"].k[0].shape[1] == 2 and caches["mqa"].k[0].shape[1] == 1
        assert caches["mha"].nbytes() == 4 * caches["gqa"].nbytes() == 8 * caches["mqa"].nbytes()
        w = model.model.layers[0].self_attn.k_proj.weight.view(2, cfg.head_dim, -1)
        torch.testing.assert_close(mqa.model.layers[0].self_attn.k_proj.weight, w.mean(0))
    assert model.config.num_key_value_heads == 2                      # the original is untouched
    for bad in (3, 0, 16):
        with pytest.raises(ValueError):
            regroup_kv_heads(model, bad)


def test_stream_score_full_cache_equals_one_forward(model, device):
    ids = ids_for(50, seed=16, device=device)[0]
    r = stream_score(model, ids, ContiguousCache(), prefill=5, chunk=4)
    with torch.no_grad():
        nll = F.cross_entropy(model(ids[None])[0, :-1], ids[1:], reduction="sum").item()
    # a sum of 49 losses: CPU kernels agree to 1e-5 relative, CUDA's chunked and full paths to ~1e-4
    assert r.tokens == 49 and math.isclose(r.nll_nats, nll, rel_tol=1e-5 if device.type == "cpu" else 1e-4)
