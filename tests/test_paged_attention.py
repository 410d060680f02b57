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
from device_tools import needs_triton_gpu, tol_for

from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache
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
    # "auto" is the vectorized torch backend on CPU (triton on CUDA): equal up to rounding
    torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens, backend="auto"),
                               paged_attention_reference(q, kp, vp, tables, lens), rtol=1e-5, atol=1e-5)


TORCH_CASES = [  # B, H, K, Dh, block_size, lengths: GQA groups 1/2/4/8 and MQA, head dims 64/128/odd,
    (2, 4, 4, 64, 16, [1, 33]),                 # G=1 (MHA), a length-1 row
    (3, 8, 4, 128, 8, [17, 1, 64]),             # G=2, Dh=128
    (2, 16, 4, 80, 32, [100, 31]),              # G=4, Dh=80 (not a power of two), bs=32
    (2, 16, 2, 64, 1, [5, 12]),                 # G=8, bs=1
    (3, 8, 1, 24, 16, [16, 47, 2]),             # MQA (one KV head), Dh=24
    (4, 12, 3, 40, 8, [9, 24, 1, 15]),          # G=4, Dh=40, a mix of partial and full blocks
]


@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_backend_equals_reference_and_sdpa(case):
    B, H, K, Dh, bs, lengths = case
    q, k, v, kp, vp, tables, lens = random_case(B, H, K, Dh, bs, lengths, seed=1000 + sum(lengths) * Dh)
    got = paged_attention(q, kp, vp, tables, lens, backend="torch")
    assert got.shape == (B, H, Dh) and got.dtype == q.dtype
    ref = paged_attention_reference(q, kp, vp, tables, lens)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, sdpa_decode(q, k, v, lengths), rtol=1e-5, atol=1e-5)
    scale = 0.3                                                     # a caller's scale is honoured
    torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens, scale, backend="torch"),
                               paged_attention_reference(q, kp, vp, tables, lens, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_torch_backend_half_precision(dtype, tol):
    lengths = [37, 1, 16]
    q, k, v, kp, vp, tables, lens = random_case(3, 8, 2, 64, 16, lengths, seed=11, dtype=dtype)
    got = paged_attention(q, kp, vp, tables, lens, backend="torch")
    assert got.dtype == dtype
    want = sdpa_decode(q.float(), k.float(), v.float(), lengths)
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def test_torch_backend_ignores_unused_table_entries():
    """Entries past a row's last used block may hold anything (-1, huge): they are never read."""
    lengths = [5, 30]
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 16, 8, lengths, seed=12)
    junk = tables.clone()
    junk[0, 1:] = torch.tensor([-1, 10 ** 6, 7])[: junk.shape[1] - 1]
    want = sdpa_decode(q, k, v, lengths)
    torch.testing.assert_close(paged_attention(q, kp, vp, junk, lens, backend="torch"), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_attention(q, kp, vp, junk, lens, backend="reference"), want,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_attention(q, kp, vp, junk, lens, backend="torch", validate=True), want,
                               rtol=1e-5, atol=1e-5)


def test_cheap_checks_always_sync_checks_on_request():
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 8, 4, [5, 3], seed=13)
    for backend in ("torch", "auto"):                  # shapes, dtypes, devices: always
        with pytest.raises(ValueError, match="q must be"):
            paged_attention(q[0], kp, vp, tables, lens, backend=backend)
        with pytest.raises(ValueError, match="multiple of kv heads"):
            paged_attention(q[:, :3], kp, vp, tables, lens, backend=backend)
        with pytest.raises(ValueError, match="v_pool"):
            paged_attention(q, kp, vp.half(), tables, lens, backend=backend)
        with pytest.raises(ValueError, match="block_tables must be an integer"):
            paged_attention(q, kp, vp, tables.float(), lens, backend=backend)
        with pytest.raises(ValueError, match="context_lens must be an integer"):
            paged_attention(q, kp, vp, tables, lens[:1], backend=backend)
        with pytest.raises(ValueError, match="head_dim"):
            paged_attention(q[..., :4], kp, vp, tables, lens, backend=backend)
        # the checks that read the tables on the host: only with validate=True
        with pytest.raises(ValueError, match=r"context_lens\[0\]=-1 is outside \[0, "):
            paged_attention(q, kp, vp, tables, torch.tensor([-1, 3], dtype=torch.int32), backend=backend,
                            validate=True)
        with pytest.raises(ValueError, match="outside the pool"):
            paged_attention(q, kp, vp, tables + 100, lens, backend=backend, validate=True)
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention(q, kp, vp, tables, lens, num_splits=0)
    with pytest.raises(ValueError, match="backend"):
        paged_attention(q, kp, vp, tables, lens, backend="cuda")


def test_contiguous_to_paged_round_trip():
    lengths = [9, 1, 16]
    q, k, v, kp, vp, tables, lens = random_case(3, 4, 2, 8, 4, lengths, seed=14)
    assert tables.dtype == lens.dtype == torch.int32 and lens.tolist() == lengths
    from course_lib.paged import gather_kv
    for b, n in enumerate(lengths):
        assert torch.equal(gather_kv(kp, tables[b], n), k[b, :, :n])
        assert torch.equal(gather_kv(vp, tables[b], n), v[b, :, :n])
    with pytest.raises(ValueError, match="lengths"):
        contiguous_to_paged(k, v, [9, -1, 16], 4)


def test_blocks_really_are_scattered():
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 8, 4, [12, 9], seed=1)
    flat = tables[:, :3].flatten().tolist()
    assert flat != sorted(flat) and len(set(flat)) == 6


def test_bad_arguments_raise():
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 8, 4, [5, 3], seed=2)
    with pytest.raises(ValueError, match="q must be"):
        paged_attention_reference(q[0], kp, vp, tables, lens)
    with pytest.raises(ValueError, match=r"context_lens\[0\]=-1"):
        paged_attention_reference(q, kp, vp, tables, torch.tensor([-1, 3]))
    with pytest.raises(ValueError, match=r"context_lens\[0\]=50"):
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
    import sys, torch, triton
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from test_paged_attention import CASES, random_case, sdpa_decode
    from course_lib.paged import paged_attention
    from course_lib.paged.triton_paged import paged_attention_triton
    TOL = {{torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}}
    extra = [(2, 4, 2, 16, 4, [9, 4], torch.float16),          # 4 blocks per 16-token tile
             (3, 8, 2, 24, 8, [33, 1, 16], torch.bfloat16),     # bf16, odd head_dim, length 1
             (2, 16, 2, 64, 32, [70, 33], torch.float32),       # G=8, block 32 > default tile 16
             (2, 4, 4, 16, 16, [50, 3], torch.float32),         # MHA (G=1)
             (2, 4, 2, 16, 5, [23, 7], torch.float32)]          # block 5: not a power of two
    for i, case in enumerate(CASES + extra):
        B, H, K, Dh, bs, lengths = case[:6]
        dtype = case[6] if len(case) > 6 else torch.float32
        q, k, v, kp, vp, tables, lens = random_case(B, H, K, Dh, bs, lengths, seed=7 + i, dtype=dtype)
        want = sdpa_decode(q.float(), k.float(), v.float(), lengths)
        tol = TOL[dtype]
        one = paged_attention_triton(q, kp, vp, tables, lens)
        assert one.dtype == dtype and one.shape == q.shape
        torch.testing.assert_close(one.float(), want, rtol=tol, atol=tol)
        for splits in ((2,) if i % 2 else (3,)):                # split-KV == non-split (and == SDPA)
            got = paged_attention_triton(q, kp, vp, tables, lens, num_splits=splits)
            torch.testing.assert_close(got.float(), one.float(), rtol=tol, atol=tol)
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    # more splits than tiles (empty splits), a 32-token tile, the dispatcher with validate=True
    q, k, v, kp, vp, tables, lens = random_case(3, 8, 2, 32, 4, [45, 2, 17], seed=5)
    want = sdpa_decode(q, k, v, [45, 2, 17])
    for kw in (dict(num_splits=8), dict(tile_n=32), dict(tile_n=32, num_splits=2)):
        torch.testing.assert_close(paged_attention_triton(q, kp, vp, tables, lens, **kw), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens, backend="triton", validate=True,
                                               num_splits=2), want, rtol=1e-5, atol=1e-5)
    # the compiled path's runtime trip count: interpreters whose scalars convert to int (not triton 3.6
    # with NumPy >= 2.4, see triton_online_softmax's docstring) can run it too
    from course_lib.attention import triton_online_softmax
    triton_online_softmax.STATIC_LOOP_IN_INTERPRETER = False
    try:
        for splits in (1, 3):
            torch.testing.assert_close(paged_attention_triton(q, kp, vp, tables, lens, num_splits=splits), want,
                                       rtol=1e-5, atol=1e-5)
        print("RUNTIME_LOOP_OK")
    except Exception as e:
        if "0-dimensional" not in str(e):
            raise
        print("RUNTIME_LOOP_UNSUPPORTED", triton.__version__)
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
    if "RUNTIME_LOOP_UNSUPPORTED" in res.stdout:
        import triton
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
        assert version < (3, 9), "only old interpreters may refuse a tensor loop bound"


def test_triton_backend_needs_cuda_or_the_interpreter():
    pytest.importorskip("triton")
    from course_lib.paged import triton_paged
    if triton_paged.interpreting():
        pytest.skip("TRITON_INTERPRET is set in this process")
    q, k, v, kp, vp, tables, lens = random_case(2, 4, 2, 8, 4, [5, 3], seed=15)
    with pytest.raises(ValueError, match="CUDA"):
        paged_attention(q, kp, vp, tables, lens, backend="triton")


# The ahead-of-time builds of every kernel for sm_75, sm_80 and sm_90: tests/test_triton_targets.py.


def test_num_splits_heuristic():
    pytest.importorskip("triton")
    from course_lib.paged.triton_paged import choose_num_splits
    assert choose_num_splits(32, 8, 2048, num_sms=132) == 1          # 256 programs fill an H100
    s = choose_num_splits(1, 8, 32768, num_sms=132)                   # 8 programs: split the sequence
    assert 8 <= s <= 32
    assert choose_num_splits(1, 8, 256, num_sms=132) == 1             # too short to split
    assert choose_num_splits(2, 4, 1024, num_sms=132) == 4            # capped by 256 tokens per split


# Tolerances on CUDA, against an fp32 oracle fed the same (rounded) inputs: fp32 runs its dots in IEEE
# fp32 (not tf32); fp16/bf16 round p to the input dtype before p @ V and round the output (bf16 keeps 8
# mantissa bits: |error| ~ 5e-4 on these outputs of magnitude ~0.1, emulated on CPU).
GPU_TOL = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 4e-3}


def _cuda_case(B, H, K, Dh, bs, lengths, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = max(lengths)
    k = torch.randn(B, K, S, Dh, generator=g, device="cuda").to(dtype)
    v = torch.randn(B, K, S, Dh, generator=g, device="cuda").to(dtype)
    q = torch.randn(B, H, Dh, generator=g, device="cuda").to(dtype)
    kp, vp, tables, lens = contiguous_to_paged(k, v, lengths, bs, generator=torch.Generator().manual_seed(seed))
    assert {t.device.type for t in (kp, vp, tables, lens)} == {"cuda"}
    return q, k, v, kp, vp, tables, lens


@pytest.mark.gpu
@needs_triton_gpu
def test_triton_kernel_on_cuda():
    pytest.importorskip("triton")
    from course_lib.paged.triton_paged import paged_attention_triton
    lengths = [1, 16, 17, 300, 1000, 4096, 33, 511]
    for dtype, tol in GPU_TOL.items():
        q, k, v, kp, vp, tables, lens = _cuda_case(8, 32, 8, 128, 16, lengths, seed=3, dtype=dtype)
        want = sdpa_decode(q.float(), k.float(), v.float(), lengths)
        got = paged_attention_triton(q, kp, vp, tables, lens, num_splits=1)
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
        for splits, tile in ((None, None), (3, 64), (16, 32)):         # fixed tiles: no autotune per split
            got = paged_attention_triton(q, kp, vp, tables, lens, num_splits=splits, tile_n=tile)
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens),
                                   paged_attention_triton(q, kp, vp, tables, lens))
        torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens, backend="torch").float(), want,
                                   rtol=tol, atol=tol)


@pytest.mark.gpu
@needs_triton_gpu
def test_paged_attention_at_the_h100_size():
    """B=32, H=32, K=8, Dh=128, 2048 tokens each, bf16, block 16: the kernel (split and not) and the torch
    backend == the fp32 reference; neither triton nor torch backend syncs with the host."""
    pytest.importorskip("triton")
    from course_lib.paged.triton_paged import paged_attention_triton
    for dtype in (torch.bfloat16, torch.float16):
        tol = GPU_TOL[dtype]
        lengths = [2048] * 32
        q, k, v, kp, vp, tables, lens = _cuda_case(32, 32, 8, 128, 16, lengths, seed=4, dtype=dtype)
        want = paged_attention_reference(q.float(), kp.float(), vp.float(), tables, lens)
        outs = {s: paged_attention_triton(q, kp, vp, tables, lens, num_splits=s, tile_n=None if s is None else 64)
                for s in (None, 1, 2, 8)}
        outs["torch"] = paged_attention(q, kp, vp, tables, lens, backend="torch")
        for name, got in outs.items():
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")                  # any host sync now raises
        try:
            paged_attention(q, kp, vp, tables, lens, backend="triton")     # its autotune ran above
            paged_attention(q, kp, vp, tables, lens, backend="torch")
        finally:
            torch.cuda.set_sync_debug_mode("default")


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
        want = generate(model, p, 7, cache=ContiguousCache(), return_logits=True).logits   # [7, V]
        torch.testing.assert_close(got[s], want, rtol=1e-4, atol=1e-4)
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
    want = generate(model, b, 4, cache="contiguous", return_logits=True).logits           # [4, V]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
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


# --- the one paged store (course_lib.paged.cache) through the model, on each device -------------------------
# The same PagedCache serves Module 06 and the serving engine: per forward one plan (positions, slot mapping,
# block tables, lengths) on the pool's device; decode through paged_attention, prefill through one gather.

from course_lib.paged import PagingError  # noqa: E402
from course_lib.paged import attention as paged_attention_module  # noqa: E402

CACHE_BACKENDS = ["auto"] + [b for b in ("reference", "torch")
                             if b in getattr(paged_attention_module, "BACKENDS", ("reference",))]


@pytest.fixture(scope="module")
def dev_model(device):
    m, _ = load("tiny", device=device)
    return m


def forward_rows(model, cache, rows, **kw):
    """One forward of rows [(seq, new tokens)] right-padded to the longest; {seq: logits [n, V]}."""
    T = max(n for _, n in rows)
    toks = []
    for s, n in rows:
        start = cache.computed[s]
        toks.append(cache.manager.tokens(s)[start:start + n] + [0] * (T - n))
    cache.set_active([s for s, _ in rows], num_new=[n for _, n in rows])
    with torch.no_grad():
        out = model(torch.tensor(toks, device=model.device), cache=cache, **kw)
    return {s: out[b, :n] for b, (s, n) in enumerate(rows)}


def assert_rows_match_full_forward(model, cache, got, tol):
    """Each row's logits == the model run on its whole sequence so far without any cache."""
    for s, logits in got.items():
        toks = cache.manager.tokens(s)[:cache.computed[s]]
        with torch.no_grad():
            want = model(torch.tensor([toks], device=model.device))[0, -len(logits):]
        torch.testing.assert_close(logits, want, **tol, msg=lambda m: f"sequence {s}: {m}")


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
def test_paged_cache_mixed_batches_equal_the_full_forward(dev_model, backend, monkeypatch):
    """Prefill, ragged prefill chunks (rows right-padded), decode and prefill chunks in one forward,
    decode of rows of different lengths (paged_attention), chunked prefill after cached context."""
    model = dev_model
    tol = tol_for(model.device, dict(rtol=1e-4, atol=1e-4))
    decodes = []
    real = paged_attention_module.paged_attention

    def spy(*args, **kwargs):
        decodes.append(kwargs.get("backend"))
        return real(*args, **kwargs)

    monkeypatch.setattr(paged_attention_module, "paged_attention", spy)
    g = torch.Generator(device="cpu").manual_seed(21)
    prompts = {s: torch.randint(1, 2048, (n,), generator=g, device="cpu").tolist()
               for s, n in (("a", 13), ("b", 22), ("c", 7), ("d", 30))}
    mgr = BlockManager(64, 4)
    cache = PagedCache(mgr, KVPool.for_model(model, 64, 4), backend=backend)
    for s, p in prompts.items():
        assert cache.add_sequence(s, p) == 0
    new = lambda: int(torch.randint(1, 2048, (), generator=g, device="cpu"))  # noqa: E731
    L = model.config.num_hidden_layers

    def step(rows, expect_decode=False, **kw):
        before = len(decodes)
        got = forward_rows(model, cache, rows, **kw)
        assert_rows_match_full_forward(model, cache, got, tol)
        assert len(decodes) - before == (L if expect_decode else 0)
        assert cache._plan is None and cache.num_new is None          # the plan lives for one forward

    step([("a", 13)])                                                 # a plain prefill
    step([("b", 9), ("c", 7)])                                        # ragged first chunks, right-padded
    cache.append(["a"], [new()])
    step([("a", 1), ("b", 13), ("d", 5)])                             # a decode row among prefill chunks
    for _ in range(2):                                                # decode, rows of 14/22/7 (+1) tokens
        cache.append(["a", "b", "c"], [new(), new(), new()])
        step([("a", 1), ("b", 1), ("c", 1)], expect_decode=True)
    step([("d", 10)])                                                 # chunked prefill after cached context
    for _ in range(3):
        cache.append(["a", "c"], [new(), new()])
    step([("a", 3), ("c", 3)])                                        # equal counts, different starts
    cache.append(["a", "b", "c", "d"], [new(), new(), new(), new()])
    step([("a", 1), ("b", 1), ("c", 1), ("d", 16)])                   # 3 decodes + the rest of d's prompt
    cache.append(["a", "b", "c", "d"], [new(), new(), new(), new()])
    cache.set_active(["a", "b", "c", "d"])                            # Module 06's explicit arguments:
    before = len(decodes)                                             # still the paged decode path
    with torch.no_grad():
        out = model(torch.tensor([[t] for t in (mgr.tokens(s)[-1] for s in "abcd")], device=model.device),
                    cache=cache, positions=cache.positions(1), attn_mask=cache.attn_mask(1))
    assert len(decodes) - before == L and set(decodes) == {backend}
    assert_rows_match_full_forward(model, cache, {s: out[b] for b, s in enumerate("abcd")}, tol)
    assert {s: cache.computed[s] for s in "abcd"} == {s: mgr.num_tokens(s) for s in "abcd"}
    mgr.check_invariants()


def test_paged_cache_plain_update_contract(device):
    """update() (for callers outside the model): writes, then each row's K/V read back, [B, K, S, Dh]."""
    pool = KVPool(num_layers=2, num_blocks=16, kv_heads=2, block_size=4, head_dim=8, device=device)
    cache = PagedCache(BlockManager(16, 4), pool)
    assert cache.nbytes() == pool.nbytes() == 2 * 2 * 16 * 2 * 4 * 8 * 4
    cache.add_sequence("x", list(range(1, 7)))
    cache.add_sequence("y", [1, 2, 3])
    cache.set_active(["x", "y"], num_new=[6, 3])
    g = torch.Generator(device="cpu").manual_seed(0)
    k, v = (torch.randn(2, 2, 6, 8, generator=g, device="cpu").to(device) for _ in range(2))
    for layer in range(2):
        k_all, v_all = cache.update(k, v, layer)
        assert k_all.shape == (2, 2, 6, 8) and k_all.device == k.device
        assert torch.equal(k_all[0], k[0]) and torch.equal(v_all[1, :, :3], v[1, :, :3])
    assert cache.computed == {"x": 6, "y": 3}
    cache.append(["x", "y"], [7, 4])
    cache.set_active(["x", "y"])
    k2, v2 = (torch.randn(2, 2, 1, 8, generator=g, device="cpu").to(device) for _ in range(2))
    for layer in range(2):
        k_all, v_all = cache.update(k2, v2, layer)
    assert k_all.shape == (2, 2, 7, 8)
    assert torch.equal(k_all[0, :, :6], k[0]) and torch.equal(k_all[0, :, 6], k2[0, :, 0])
    assert torch.equal(v_all[1, :, :3], v[1, :, :3]) and torch.equal(v_all[1, :, 3], v2[1, :, 0])
    assert cache.computed == {"x": 7, "y": 4}
    # misuse: named errors, nothing half-done
    with pytest.raises(PagingError, match="twice"):
        cache.set_active(["x", "x"])
    with pytest.raises(ValueError, match="num_new"):
        cache.set_active(["x", "y"], num_new=[1])
    cache.set_active(["x", "y"], num_new=[1, 1])
    with pytest.raises(ValueError, match="registered"):
        cache.update(k2, v2, 0)
    with pytest.raises(ValueError, match="backend"):
        PagedCache(BlockManager(16, 4), pool, backend="cuda")


@pytest.mark.gpu
@needs_triton_gpu
def test_paged_cache_decodes_with_triton_on_cuda(dev_model, monkeypatch):
    pytest.importorskip("triton")
    model = dev_model
    if model.device.type != "cuda":
        pytest.skip("the CUDA run of this test")
    from course_lib.paged import triton_paged
    calls = []
    real = triton_paged.paged_attention_triton
    monkeypatch.setattr(triton_paged, "paged_attention_triton",
                        lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    g = torch.Generator(device="cpu").manual_seed(3)
    prompts = {s: torch.randint(1, 2048, (n,), generator=g, device="cpu").tolist() for s, n in (("a", 40), ("b", 5))}
    cache = PagedCache(BlockManager(64, 16), KVPool.for_model(model, 64, 16))
    for s, p in prompts.items():
        cache.add_sequence(s, p)
    forward_rows(model, cache, [("a", 40), ("b", 5)])
    assert not calls                                                  # prefill: gather + attention
    cache.append(["a", "b"], [7, 8])
    got = forward_rows(model, cache, [("a", 1), ("b", 1)])
    assert len(calls) == model.config.num_hidden_layers and calls[0] == (2, model.config.num_attention_heads,
                                                                         model.config.head_dim)
    assert_rows_match_full_forward(model, cache, got, tol_for(model.device, dict(rtol=1e-4, atol=1e-4)))
