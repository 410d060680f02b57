"""Module 05 core: the contiguous and static caches, cached generation == recomputation, the memory formula."""
import copy

import pytest
import torch

from course_lib.attention import apply_rope, rope_cos_sin
from course_lib.generation import generate
from course_lib.kvcache import (ContiguousCache, FixedPrefixCache, H2OCache, KVCache, QuantizedCache, SinkCache,
                                SlidingWindowCache,
                               StaticCache, kv_cache_bytes, kv_table, latent_kv_bytes)
from course_lib.models.config import preset
from course_lib.models import LlamaConfig, LlamaForCausalLM, load
from course_lib.paged import PagedCache
from device_tools import assert_greedy_match, tol_for


@pytest.fixture(scope="module")
def model(device):
    torch.manual_seed(0)
    m, _ = load("tiny", device=device)
    return m


def cpu_ids(*shape, seed, high=2048):
    """Token ids drawn on the CPU (the same ids on every device), moved by the caller."""
    return torch.randint(1, high, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def greedy_recompute(model, ids, n):
    """The baseline: run the whole sequence again for every new token."""
    logits_seen = []
    for _ in range(n):
        logits = model(ids)[:, -1]
        logits_seen.append(logits)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(logits_seen, dim=1)


def make_cache(kind, model, batch):
    if kind == "contiguous":
        return ContiguousCache()
    if kind == "static":
        return StaticCache(64)
    return StaticCache.for_model(model, batch, 64)


@pytest.mark.parametrize("kind", ["contiguous", "static", "static-prealloc"])
@pytest.mark.parametrize("batch", [1, 2])
def test_cached_generation_equals_recompute(model, kind, batch, device):
    prompt = cpu_ids(batch, 9, seed=100 + batch, high=model.config.vocab_size).to(device)
    want_ids, want_logits = greedy_recompute(model, prompt, 12)
    cache = make_cache(kind, model, batch)
    out = generate(model, prompt, 12, cache=cache, return_logits=True)
    got_ids = torch.cat([prompt, out.tokens.view(batch, 12).to(device)], dim=1)   # [n] for one request
    got_logits = out.logits.view(batch, 12, -1)
    assert got_ids.shape == want_ids.shape and got_logits.device == prompt.device
    for row in range(batch):   # CPU: identical tokens, logits within 1e-4; CUDA: up to a near-tie (device_tools)
        assert_greedy_match(got_ids[row, 9:], want_ids[row, 9:], want_logits[row], device, got_logits[row],
                            what=f"{kind} row {row}", cpu_tol=dict(rtol=1e-4, atol=1e-4))
    # the last generated token is returned but never fed back: 9 + 12 - 1 tokens cached
    assert cache.get_seq_length() == 9 + 12 - 1


def test_prefill_logits_match_full_forward_in_chunks(model, device):
    ids = cpu_ids(2, 30, seed=3).to(device)
    with torch.no_grad():
        full = model(ids)
        cache = ContiguousCache()
        parts = [model(ids[:, a:b], cache=cache) for a, b in ((0, 7), (7, 8), (8, 30))]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, **tol_for(device, dict(rtol=1e-4, atol=1e-4)))


def small_model(device, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval().to(device)     # initialised on the CPU: the same weights everywhere


def test_a_kvcache_gets_the_rotated_queries_in_update(device):
    """The model hands every layer's queries to update(k, v, layer, q=q): [B, H, T, Dh], rotated at the
    new tokens' positions (prefill, then a decode step), and a cache that reads them changes no logit."""
    m = small_model(device)
    cfg = m.config

    class Recording(ContiguousCache):
        def __init__(self):
            super().__init__()
            self.q = {}

        def update(self, k, v, layer, q=None):
            self.q[layer] = q
            return super().update(k, v, layer, q=q)

    raw = {}
    hooks = [layer.self_attn.q_proj.register_forward_hook(lambda mod, i, out, l=l: raw.__setitem__(l, out))
             for l, layer in enumerate(m.model.layers)]
    ids = cpu_ids(2, 7, seed=21, high=cfg.vocab_size).to(device)
    cache, plain = Recording(), ContiguousCache()
    try:
        with torch.no_grad():
            for a, b in ((0, 5), (5, 6), (6, 7)):
                got, want = m(ids[:, a:b], cache=cache), m(ids[:, a:b], cache=plain)
                torch.testing.assert_close(got, want, rtol=0, atol=0)
                cos, sin = rope_cos_sin(torch.arange(a, b, device=device)[None].expand(2, b - a), cfg.head_dim,
                                        cfg.rope_theta)
                for layer in range(cfg.num_hidden_layers):
                    q = cache.q[layer]
                    assert q.shape == (2, cfg.num_attention_heads, b - a, cfg.head_dim), q.shape
                    x = raw[layer].view(2, b - a, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
                    torch.testing.assert_close(q, apply_rope(x, cos, sin),
                                               **tol_for(device, dict(rtol=1e-6, atol=1e-6)))
    finally:
        for h in hooks:
            h.remove()


def test_the_model_takes_update_only_caches_and_refuses_other_objects(device):
    """One place (course_lib.models.llama._as_cache) decides: a KVCache is used as it is, an object with
    only update(k, v, layer) and get_seq_length() (Hugging Face's shape) attends the plain way, and
    anything else is a TypeError."""
    m = small_model(device, seed=1)

    class UpdateOnly:                                   # no attend, no positions, update without q
        def __init__(self):
            self.inner = ContiguousCache()

        def update(self, k, v, layer):
            return self.inner.update(k, v, layer)

        def get_seq_length(self):
            return self.inner.get_seq_length()

    ids = cpu_ids(1, 9, seed=22, high=m.config.vocab_size).to(device)
    duck, plain = UpdateOnly(), ContiguousCache()
    with torch.no_grad():
        for a, b in ((0, 6), (6, 7), (7, 9)):
            torch.testing.assert_close(m(ids[:, a:b], cache=duck), m(ids[:, a:b], cache=plain), rtol=0, atol=0)
        assert duck.get_seq_length() == 9
        for bad in (object(), "contiguous", [ContiguousCache()]):
            with pytest.raises(TypeError, match="cache must be"):
                m(ids, cache=bad)


def test_contiguous_cache_contract_and_shapes():
    c = ContiguousCache()
    assert c.get_seq_length() == 0
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    for layer in range(3):
        ka, va = c.update(k, v, layer)
        assert ka.shape == (2, 3, 5, 4)
    k2, v2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    ka, va = c.update(k2, v2, 0)
    assert ka.shape == (2, 3, 6, 4)
    assert torch.equal(ka[:, :, :5], k) and torch.equal(ka[:, :, 5:], k2) and torch.equal(va[:, :, 5:], v2)
    assert c.get_seq_length() == 6 and c.stored_length(1) == 5


def test_static_cache_writes_in_place_and_reports_reservation():
    c = StaticCache(10)
    k = torch.randn(1, 2, 4, 8)
    ka, _ = c.update(k, k.clone(), 0)
    buf = c.k[0]
    ka2, _ = c.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), 0)
    assert c.k[0].data_ptr() == buf.data_ptr()          # no reallocation
    assert ka2.shape[2] == 5 and torch.equal(ka2[:, :, :4], k)
    assert c.nbytes() == 2 * 1 * 2 * 10 * 8 * 4         # the whole max_len is reserved
    assert c.used_nbytes() == 2 * 1 * 2 * 5 * 8 * 4
    with pytest.raises(ValueError, match="full"):
        c.update(torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), 0)


@pytest.mark.parametrize("bad", [
    lambda c: c.update(torch.randn(2, 3, 4), torch.randn(2, 3, 4), 0),                    # 3-d
    lambda c: c.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 2, 4), 0),              # seq differs
    lambda c: c.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 1),              # layer skipped
    lambda c: c.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4).double(), 0),     # dtype differs
    lambda c: c.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), -1),
])
def test_bad_updates_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad(ContiguousCache())


def test_mismatched_batch_on_second_update_raises():
    c = ContiguousCache()
    c.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    with pytest.raises(ValueError, match="batch"):
        c.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), 0)
    with pytest.raises(TypeError):
        c.update([1], [2], 0)


def test_memory_formula_matches_real_tensor_bytes(model, device):
    cfg = model.config
    for batch, n, dtype in ((1, 17, torch.float32), (3, 5, torch.float16)):
        cache = ContiguousCache()
        m = copy.deepcopy(model).to(dtype)
        with torch.no_grad():
            m(cpu_ids(batch, n, seed=n).to(device), cache=cache)
        real = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
        elem = torch.finfo(dtype).bits // 8
        assert real == cache.nbytes() == cfg.kv_cache_bytes(n, batch, elem)
        assert real == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem * n * batch


def test_memory_formula_known_values_and_errors():
    # Llama-2-7B (MHA, 32 layers x 32 heads x 128) in fp16: 512 KiB per token, 2 GiB at 4096 tokens
    assert kv_cache_bytes(32, 32, 128, 1) == 512 * 1024
    assert preset("llama-2-7b").kv_cache_bytes(4096) == 2 * 2**30
    # Llama-3-8B (GQA, 8 KV heads): 4x smaller; Falcon-7B (MQA, 1 head of 64): 8 KiB per token
    assert preset("llama-3-8b").kv_bytes_per_token() * 4 == preset("llama-2-7b").kv_bytes_per_token()
    assert preset("falcon-7b").kv_bytes_per_token() == 8 * 1024
    # DeepSeek-V2 MLA: 60 layers x (512 + 64) x 2 bytes, no factor 2 for K and V
    assert latent_kv_bytes(60, 512, 64, 1) == 60 * 576 * 2
    assert preset("llama-3.1-8b").kv_cache_bytes(131072) == 16 * 2**30
    rows = kv_table(["llama-2-7b", "llama-3-8b", "falcon-7b", "deepseek-v2"], tokens=4096, batch=8)
    assert [r["attention"] for r in rows] == ["MHA", "GQA", "MQA", "MLA"]
    assert rows[0]["cache GiB"] == 16.0 and rows[3]["KiB/token"] == 60 * 576 * 2 / 1024
    # every model's context by default; the weights are num_parameters() (MLA: the published 236B)
    default = {r["model"]: r for r in kv_table()}
    assert default["Llama-3.1-8B"]["tokens"] == 131072 and default["Falcon-7B"]["tokens"] == 2048
    assert default["Llama-2-7B"]["weights GiB"] == preset("llama-2-7b").num_parameters() * 2 / 2**30
    with pytest.raises(ValueError, match="tokens"):
        kv_table(tokens=0)
    with pytest.raises(ValueError, match="num_kv_heads"):
        kv_cache_bytes(32, 0, 128, 10)
    with pytest.raises(ValueError, match="tokens"):
        kv_cache_bytes(32, 8, 128, -1)
    with pytest.raises(ValueError, match="bytes_per_element"):
        kv_cache_bytes(32, 8, 128, 1, bytes_per_element=0)


def test_generate_batch_eos_and_errors():
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(1, 64, (2, 4))
    first = generate(m, prompt, 1, cache="contiguous").tokens[:, -1]     # a batch: tokens [B, n]
    eos = int(first[0])
    out = generate(m, prompt, 6, cache="contiguous", eos_token_id=eos).tokens
    assert (out[0] == eos).all()                        # row 0 stops at once and is padded with eos
    assert out.shape[1] == 6 or (out[1, -1] == eos)     # the batch stops when every row has
    with pytest.raises(ValueError):
        generate(m, prompt[:, :0], 3)
    with pytest.raises(TypeError):
        generate(m, prompt.float(), 3)
    with pytest.raises(ValueError):
        generate(m, prompt, -1)
    assert generate(m, prompt, 0).tokens.shape == (2, 0)


@pytest.mark.parametrize("kind", ["contiguous", "static"])
def test_crop_rewinds_the_cache(model, kind, device):
    ids = cpu_ids(1, 12, seed=8).to(device)
    cache = ContiguousCache() if kind == "contiguous" else StaticCache(32)
    with torch.no_grad():
        model(ids[:, :10], cache=cache)
        first = model(ids[:, 10:12], cache=cache)
        cache.crop(10)
        assert cache.get_seq_length() == 10
        again = model(ids[:, 10:12], cache=cache)
    torch.testing.assert_close(again, first)
    with pytest.raises(ValueError):
        cache.crop(13)


# --- compaction (tree verification keeps the accepted path): the cache's own operation -----------------
def _old_compact_cache(cache, keep):
    """The free function this replaced (speculative/tree.py, then generation.py), verbatim bar validation:
    the oracle the caches' ``compact`` is checked against."""
    keep = torch.as_tensor(keep, dtype=torch.long)
    M = keep.numel()
    for layer in range(len(cache.k)):
        idx = keep.to(cache.k[layer].device)
        k = cache.k[layer].index_select(2, idx)
        v = cache.v[layer].index_select(2, idx)
        if isinstance(cache, StaticCache):
            cache.k[layer][:, :, :M] = k
            cache.v[layer][:, :, :M] = v
        else:
            cache.k[layer], cache.v[layer] = k, v
    if isinstance(cache, StaticCache):
        cache.crop(M)
    return cache


@pytest.mark.parametrize("kind", ["contiguous", "static"])
@pytest.mark.parametrize("seed", range(6))
def test_compact_matches_the_old_compact_cache_on_random_inputs(kind, seed):
    g = torch.Generator().manual_seed(seed)
    B, K, Dh, layers = 1 + seed % 2, 2, 4, 3
    S = int(torch.randint(1, 12, (1,), generator=g))
    make = ContiguousCache if kind == "contiguous" else (lambda: StaticCache(16))
    new, old = make(), make()
    for _ in range(2):                                   # two forwards: the past, then the tree's nodes
        T = max(1, S // 2)
        kv = [(torch.randn(B, K, T, Dh, generator=g), torch.randn(B, K, T, Dh, generator=g)) for _ in range(layers)]
        for cache in (new, old):
            for layer, (k, v) in enumerate(kv):
                cache.update(k, v, layer)
    S = new.get_seq_length()
    keep = torch.randperm(S, generator=g)[:int(torch.randint(0, S + 1, (1,), generator=g))].sort().values
    buffers = [k.data_ptr() for k in new.k] if kind == "static" else None
    assert new.compact(keep) is new
    _old_compact_cache(old, keep)
    assert new.get_seq_length() == old.get_seq_length() == keep.numel()
    for layer in range(layers):
        assert torch.equal(new.k[layer], old.k[layer]) and torch.equal(new.v[layer], old.v[layer])
    if buffers is not None:                              # in place: CUDA graphs keep reading the same buffers
        assert [k.data_ptr() for k in new.k] == buffers


@pytest.mark.parametrize("kind", ["contiguous", "static"])
def test_compact_refuses_bad_positions(kind):
    c = ContiguousCache() if kind == "contiguous" else StaticCache(8)
    c.update(torch.randn(1, 1, 5, 2), torch.randn(1, 1, 5, 2), 0)
    for bad in ([2, 1], [0, 0], [5], [-1], [[0, 1]]):
        with pytest.raises(ValueError, match="keep"):
            c.compact(torch.tensor(bad))
    assert c.get_seq_length() == 5                       # a refused call changes nothing


def test_caches_that_cannot_compact_refuse():
    assert PagedCache.compact is KVCache.compact
    fixed = FixedPrefixCache([torch.randn(1, 1, 3, 2)], [torch.randn(1, 1, 3, 2)])
    for cache in (SlidingWindowCache(4), SinkCache(4, sinks=1), H2OCache(2, 4), QuantizedCache(bits=8), fixed):
        cache.update(torch.randn(1, 1, 3, 2), torch.randn(1, 1, 3, 2), 0, q=torch.randn(1, 1, 3, 2))
        with pytest.raises(TypeError, match=f"{type(cache).__name__} cannot compact"):
            cache.compact(torch.tensor([0, 2]))


def test_fixed_prefix_cache_holds_the_prompt_and_refuses_bad_input():
    k, v = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3)
    cache = FixedPrefixCache([k], [v])
    k_all, v_all = cache.update(torch.ones(2, 1, 1, 3), torch.zeros(2, 1, 1, 3), 0)
    assert torch.equal(k_all, torch.cat([k, torch.ones(2, 1, 1, 3)], dim=2)) and v_all.shape == (2, 1, 5, 3)
    assert cache.get_seq_length() == 4 and cache.nbytes() == 2 * k.numel() * 4   # the new token is not kept
    with pytest.raises(ValueError, match="layer 1"):
        cache.update(torch.ones(2, 1, 1, 3), torch.zeros(2, 1, 1, 3), 1)
    with pytest.raises(ValueError, match="holds"):                   # a different batch than the prompt's
        cache.update(torch.ones(1, 1, 1, 3), torch.zeros(1, 1, 1, 3), 0)
    with pytest.raises(ValueError, match="keys and values"):
        FixedPrefixCache([k], [])
