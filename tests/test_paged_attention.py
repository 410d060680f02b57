"""Module 06: paged attention (PyTorch reference, Triton decode kernel) == contiguous attention (SDPA),
and the course model generating through paged memory == the contiguous cache."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from course_lib.kvcache import ContiguousCache, generate_with_cache
from course_lib.models import load
from course_lib.paged import (BlockManager, KVPool, PagedCache, contiguous_to_paged, paged_attention,
                              paged_attention_reference)

ROOT = Path(__file__).resolve().parents[1]


def sdpa_decode(q, k, v, lengths):
    """Contiguous oracle: torch SDPA per sequence on K/V [B, K, S, Dh] cut to its length."""
    B, H, Dh = q.shape
    G = H // k.shape[1]
    out = []
    for b in range(B):
        kb = k[b, :, :lengths[b]].repeat_interleave(G, 0)[None]
        vb = v[b, :, :lengths[b]].repeat_interleave(G, 0)[None]
        out.append(F.scaled_dot_product_attention(q[b][None, :, None], kb, vb)[0, :, 0])
    return torch.stack(out)


def random_case(B, H, K, Dh, bs, lengths, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    k = torch.randn(B, K, S, Dh, generator=g).to(device, dtype)
    v = torch.randn(B, K, S, Dh, generator=g).to(device, dtype)
    q = torch.randn(B, H, Dh, generator=g).to(device, dtype)
    kp, vp, tables, lens = contiguous_to_paged(k, v, lengths, bs, generator=g)
    return q, k, v, kp, vp, tables, lens


CASES = [  # B, H, K, Dh, block_size, lengths
    (1, 4, 4, 16, 4, [1]),
    (3, 8, 2, 32, 16, [16, 17, 5]),       # exactly one block, one over, a partial one
    (4, 6, 3, 24, 8, [40, 8, 1, 23]),      # head_dim not a power of two, GQA 2
    (2, 4, 1, 8, 1, [7, 3]),               # block size 1, MQA
]


@pytest.mark.parametrize("case", CASES)
def test_reference_equals_sdpa(case):
    B, H, K, Dh, bs, lengths = case
    q, k, v, kp, vp, tables, lens = random_case(B, H, K, Dh, bs, lengths, seed=sum(lengths))
    torch.testing.assert_close(paged_attention_reference(q, kp, vp, tables, lens), sdpa_decode(q, k, v, lengths),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(paged_attention(q, kp, vp, tables, lens, backend="auto"),
                       paged_attention_reference(q, kp, vp, tables, lens))


def test_blocks_really_are_scattered():
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 8, 4, [12, 9], seed=1)
    flat = tables[:, :3].flatten().tolist()
    assert flat != sorted(flat) and len(set(flat)) == 6


def test_bad_arguments_raise():
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 8, 4, [5, 3], seed=2)
    with pytest.raises(ValueError, match="q must be"):
        paged_attention_reference(q[0], kp, vp, tables, lens)
    with pytest.raises(ValueError, match="context_lens"):
        paged_attention_reference(q, kp, vp, tables, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="context_lens"):
        paged_attention_reference(q, kp, vp, tables, torch.tensor([50, 3]))
    with pytest.raises(ValueError, match="outside the pool"):
        paged_attention_reference(q, kp, vp, tables + 100, lens)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        paged_attention_reference(q[:, :3], kp, vp, tables, lens)
    with pytest.raises(ValueError, match="dtype"):
        paged_attention_reference(q.double(), kp, vp, tables, lens)
    with pytest.raises(ValueError, match="backend"):
        paged_attention(q, kp, vp, tables, lens, backend="cuda")


TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from test_paged_attention import CASES, random_case, sdpa_decode
    from course_lib.paged.triton_paged import paged_attention_triton
    for case in CASES + [(2, 4, 2, 16, 4, [9, 4], torch.float16)]:
        B, H, K, Dh, bs, lengths = case[:6]
        dtype = case[6] if len(case) > 6 else torch.float32
        q, k, v, kp, vp, tables, lens = random_case(B, H, K, Dh, bs, lengths, seed=7, dtype=dtype)
        got = paged_attention_triton(q, kp, vp, tables, lens)
        want = sdpa_decode(q.float(), k.float(), v.float(), lengths)
        tol = 2e-3 if dtype == torch.float16 else 1e-5
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    print("TRITON_INTERPRET_OK")
""")


@pytest.mark.slow
def test_triton_kernel_under_the_interpreter():
    """The Triton decode kernel on CPU tensors: TRITON_INTERPRET=1 must be set before triton is imported,
    so it runs in a fresh process."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    script = TRITON_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "TRITON_INTERPRET_OK" in res.stdout, res.stdout + res.stderr


@pytest.mark.gpu
def test_triton_kernel_on_cuda():
    pytest.importorskip("triton")
    from course_lib.paged.triton_paged import paged_attention_triton
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 2e-3)):
        lengths = [1, 16, 17, 300, 1000, 4096, 33, 511]
        q, k, v, kp, vp, tables, lens = random_case(8, 32, 8, 128, 16, lengths, seed=3, dtype=dtype, device="cuda")
        kp, vp, tables, lens = kp.cuda(), vp.cuda(), tables.cuda(), lens.cuda()
        got = paged_attention_triton(q, kp, vp, tables, lens)
        torch.testing.assert_close(got.float(), sdpa_decode(q.float(), k.float(), v.float(), lengths), rtol=tol, atol=tol)
        torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens), got)


# --- the course model on paged memory -----------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    m, _ = load("tiny", device="cpu")
    return m


def paged_greedy(model, cache, seqs, steps):
    """Greedy decode of several sequences of different lengths in one batch through a PagedCache."""
    cache.set_active(list(seqs))
    logits_seen = {s: [] for s in seqs}
    with torch.no_grad():
        for s, prompt in seqs.items():                 # prefill one by one (what was not cached)
            cache.set_active([s])
            skip = cache.computed[s]
            logits = model(torch.tensor(prompt[skip:])[None], cache=cache)[:, -1]
            logits_seen[s].append(logits[0])
        cache.set_active(list(seqs))
        for _ in range(steps):
            nxt = [int(logits_seen[s][-1].argmax()) for s in seqs]
            cache.append(list(seqs), nxt)
            T = 1
            logits = model(torch.tensor(nxt)[:, None], cache=cache, positions=cache.positions(T),
                           attn_mask=cache.attn_mask(T))[:, -1]
            for i, s in enumerate(seqs):
                logits_seen[s].append(logits[i])
    return {s: torch.stack(v) for s, v in logits_seen.items()}


def test_model_through_paged_memory_equals_contiguous(model):
    g = torch.Generator().manual_seed(4)
    prompts = {f"r{i}": torch.randint(1, 2048, (n,), generator=g).tolist() for i, n in enumerate((5, 12, 8))}
    mgr = BlockManager(40, 4)
    cache = PagedCache(mgr, KVPool.for_model(model, 40, 4))
    for s, p in prompts.items():
        assert cache.add_sequence(s, p) == 0
    got = paged_greedy(model, cache, prompts, 6)
    for s, p in prompts.items():
        ids, want = generate_with_cache(model, torch.tensor(p)[None], 7, cache=ContiguousCache(), return_logits=True)
        torch.testing.assert_close(got[s], want[0], rtol=1e-4, atol=1e-4)
        assert mgr.num_tokens(s) == len(p) + 6
    mgr.check_invariants()


def test_prefix_cache_skips_prefill_and_gives_the_same_logits(model):
    g = torch.Generator().manual_seed(5)
    system = torch.randint(1, 2048, (11,), generator=g).tolist()
    a, b = system + [7, 8, 9], system + [10, 11]
    mgr = BlockManager(30, 4, prefix_caching=True)
    cache = PagedCache(mgr, KVPool.for_model(model, 30, 4))
    cache.add_sequence("a", a)
    paged_greedy(model, cache, {"a": a}, 2)
    assert cache.add_sequence("b", b) == 8            # two full blocks of the system prompt
    got = paged_greedy(model, cache, {"b": b}, 3)["b"]
    _, want = generate_with_cache(model, torch.tensor(b)[None], 4, return_logits=True)
    torch.testing.assert_close(got, want[0], rtol=1e-4, atol=1e-4)
    mgr.check_invariants()


def test_parallel_sampling_with_fork_and_copy_on_write(model):
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(1, 2048, (10,), generator=g).tolist()   # 2 full blocks + 2 tokens
    mgr = BlockManager(30, 4)
    cache = PagedCache(mgr, KVPool.for_model(model, 30, 4))
    cache.add_sequence("p", prompt)
    cache.set_active(["p"])
    with torch.no_grad():
        model(torch.tensor(prompt)[None], cache=cache)
    firsts = [11, 22, 33]
    for i in range(3):
        cache.fork("p", f"c{i}")
    used_before = mgr.num_used_blocks
    cache.free("p")
    assert mgr.num_used_blocks == used_before          # the children still hold every block
    children = {f"c{i}": prompt + [t] for i, t in enumerate(firsts)}
    cache.append(list(children), firsts)               # each child writes into the shared partial block
    assert mgr.cow_copies == 2                         # the last writer owns the original alone
    cache.set_active(list(children))
    with torch.no_grad():
        logits = model(torch.tensor(firsts)[:, None], cache=cache, positions=cache.positions(1),
                       attn_mask=cache.attn_mask(1))[:, -1]
    for i, (s, seq) in enumerate(children.items()):
        with torch.no_grad():
            want = model(torch.tensor(seq)[None])[:, -1]
        torch.testing.assert_close(logits[i:i + 1], want, rtol=1e-4, atol=1e-4)
    assert mgr.block_table("c0")[:2] == mgr.block_table("c1")[:2] == mgr.block_table("c2")[:2]
    mgr.check_invariants()


def test_paged_cache_errors(model):
    mgr = BlockManager(4, 4)
    cache = PagedCache(mgr, KVPool.for_model(model, 4, 4))
    cache.add_sequence("a", [1, 2, 3])
    cache.add_sequence("b", [1])
    cache.set_active(["a"])
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
    cache.set_active(["a", "b"])
    with pytest.raises(ValueError, match="different lengths"):
        cache.get_seq_length()
    cache.set_active(["a"])
    with pytest.raises(ValueError, match="registered"):
        with torch.no_grad():
            model(torch.tensor([[4]]), cache=cache)      # token 4 was never appended
    with pytest.raises(ValueError):
        PagedCache(mgr, KVPool.for_model(model, 5, 4))
