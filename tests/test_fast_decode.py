"""The fast decode path (issue 11): generate through a KV cache, and the decode step compiled whole.

Checked on the CPU in CI (dynamo's graph capture is the same on every device; inductor makes C++ code
here), and on a GPU with CUDA graphs when one is present (the `gpu` tests).
"""
import pytest
import torch
from torch._dynamo.utils import counters

from course_lib.generation import decode_step, generate
from course_lib.kvcache import ContiguousCache, StaticCache
from course_lib.models import LlamaConfig, LlamaForCausalLM, load


@pytest.fixture(scope="module")
def tiny():
    model, _ = load("tiny", device="cpu")
    return model


def prompts(n, length, seed, vocab=2048):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randint(1, vocab, (length,), generator=g, device="cpu") for _ in range(n)]


@pytest.mark.parametrize("cache", ["contiguous", "static"])
def test_cached_generate_equals_recompute(tiny, cache):
    for p in prompts(3, 11, seed=1):
        want, _ = generate(tiny, p, 24)
        got, trace = generate(tiny, p, 24, cache=cache)
        assert torch.equal(got, want), f"{cache}: {got.tolist()} != {want.tolist()}"
        assert len(trace) == 24


def test_seeded_sampling_is_the_same_through_every_cache(tiny):
    p = prompts(1, 9, seed=2)[0]
    draws = [generate(tiny, p, 20, temperature=1.0, top_k=50, cache=c,
                      generator=torch.Generator(device="cpu").manual_seed(7))[0]
             for c in (None, "contiguous", "static")]
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])


def test_cache_arguments_are_checked(tiny):
    p = prompts(1, 5, seed=3)[0]
    with pytest.raises(ValueError, match="cache must be"):
        generate(tiny, p, 3, cache="paged")
    with pytest.raises(ValueError, match="StaticCache"):
        generate(tiny, p, 3, cache=ContiguousCache(), compile="eager")
    full = StaticCache.for_model(tiny, 1, 8)
    with pytest.raises(ValueError, match="max_len"):
        generate(tiny, p, 10, cache=full)
    used = ContiguousCache()
    with torch.no_grad():
        tiny(p[None], cache=used)
    with pytest.raises(ValueError, match="empty"):
        generate(tiny, p, 3, cache=used)
    with pytest.raises(TypeError, match="generator"):
        generate(tiny, p, 3, temperature=1.0, generator=7)
    with pytest.raises(TypeError, match="compile"):
        generate(tiny, p, 3, compile=1.5)


def test_static_cache_positions_stay_on_the_device(tiny):
    cache = StaticCache.for_model(tiny, 2, 32)
    ids = torch.randint(1, 2048, (2, 6), generator=torch.Generator(device="cpu").manual_seed(4), device="cpu")
    with torch.no_grad():
        tiny(ids, cache=cache)
    assert all(isinstance(p, torch.Tensor) and p.dim() == 0 for p in cache.pos)
    assert torch.equal(cache.positions(3), torch.tensor([6, 7, 8]))
    assert cache.get_seq_length() == 6 and cache.lengths == [6] * tiny.config.num_hidden_layers
    with pytest.raises(ValueError, match="context"):
        StaticCache.for_model(tiny, 1, tiny.config.max_position_embeddings + 1)


def _decode_with_counters(model, prompt, n, backend):
    """Greedy decode through a compiled step; after two warm-up steps any recompile is an error."""
    torch._dynamo.reset()
    counters.clear()
    out, trace = generate(model, prompt, 2, cache="static", compile=backend)       # compiles
    with torch._dynamo.config.patch(error_on_recompile=True):
        out, trace = generate(model, prompt, n, cache="static", compile=backend)   # reuses, never recompiles
    return out


def test_compiled_step_is_one_graph_without_breaks_or_recompiles(tiny):
    p = prompts(1, 12, seed=5)[0]
    want, _ = generate(tiny, p, 40, cache="static")
    got = _decode_with_counters(tiny, p, 40, backend="eager")
    assert dict(counters["graph_break"]) == {}, f"graph breaks: {dict(counters['graph_break'])}"
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(got, want)


def test_compiled_step_handles_gqa_mqa_and_batch():
    torch.manual_seed(0)
    for heads, kv in ((4, 4), (4, 2), (4, 1)):
        cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=64)
        model = LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 97, (3, 7), device="cpu")
        eager, compiled = StaticCache.for_model(model, 3, 32), StaticCache.for_model(model, 3, 32)
        step = decode_step(model, compile="eager")
        with torch.no_grad():
            a = model(ids, cache=eager)[:, -1:]
            b = model(ids, cache=compiled)[:, -1:]
            for _ in range(5):
                nxt = a.argmax(-1)
                a = model(nxt, cache=eager)
                b = step(nxt, cache=compiled)
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_inductor_compiled_greedy_equals_eager_on_cpu(tiny):
    """The same step through inductor's generated C++ (about half a minute of compiling on 2 cores)."""
    p = prompts(1, 10, seed=6)[0]
    want, _ = generate(tiny, p, 30, cache="static")
    got = _decode_with_counters(tiny, p, 30, backend=True)
    assert dict(counters["graph_break"]) == {}
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_step_equals_eager(tiny, dtype):
    """On a GPU: reduce-overhead (CUDA graphs), zero graph breaks, no recompile, greedy == eager."""
    model, _ = load("tiny", device="cuda", dtype=dtype)
    p = prompts(1, 12, seed=8)[0]
    want, _ = generate(model, p, 64, cache="static")
    got = _decode_with_counters(model, p, 64, backend=True)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    # inductor falls back to plain kernel launches (correct, but launch-bound) when it cannot capture
    # the step, e.g. over an input mutation it does not support: the position's in-place add must pass
    assert counters["inductor"]["cudagraph_skips"] == 0, "the decode step was not captured as a CUDA graph"
    # inductor fuses (and so rounds) differently from eager: equal tokens, up to a first difference that
    # must be a near-tie of the eager logits (exactly equal in float32 in practice)
    from device_tools import assert_greedy_match
    with torch.no_grad():
        seq = torch.cat([p, want]).to("cuda")[None]
        want_logits = model(seq)[0, len(p) - 1:len(p) - 1 + len(want)]
    assert_greedy_match(got, want, want_logits, "cuda", dtype=dtype, what=f"compiled vs eager, {dtype}")
    with pytest.raises(ValueError, match="generator"):
        generate(model, p, 3, temperature=1.0, generator=torch.Generator(device="cpu"))
