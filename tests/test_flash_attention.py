"""Module 07: reference attention == SDPA; online softmax == softmax on any split; tiled attention ==
reference (lengths not tile multiples, causal, GQA, padding); the IO model == the counted loads; the
Triton forward kernel and flash-decoding == reference (interpreter on CPU, real sizes on a GPU); SDPA
backends and flash-attn reported."""
import ast
import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from device_tools import needs_triton_gpu

from course_lib.attention import (LOOP_ORDERS, IOCounter, combine_splits, count_io, flash_attention_io,
                                  flash_attn_status,
                                  flash_backend_reason, flash_decode_torch, flash_io_theta, hf_attn_implementation,
                                  io_reduction, io_reduction_limit, merge_softmax_stats, online_softmax,
                                  online_softmax_stats,
                                  reference_attention, scores_bytes, sdpa_backend_report, sdpa_default_backend,
                                  softmax_stats_update, split_partials, sram_tiles, standard_attention_io,
                                  tiled_attention)
from course_lib.attention.flash_decoding import split_bounds
from course_lib.attention.online_softmax import split_sizes

ROOT = Path(__file__).resolve().parents[1]


def qkv(B, H, K, T, S, Dh, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g).to(device, dtype)
    k = torch.randn(B, K, S, Dh, generator=g).to(device, dtype)
    v = torch.randn(B, K, S, Dh, generator=g).to(device, dtype)
    return q, k, v


def sdpa_oracle(q, k, v, causal=False, key_padding_mask=None):
    """torch SDPA with K/V repeated per query head and an explicit bottom-right mask."""
    G = q.shape[1] // k.shape[1]
    T, S = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        mask = pad if mask is None else mask & pad
    return F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1),
                                          v.float().repeat_interleave(G, 1), attn_mask=mask)


SHAPES = [  # B, H, K, T, S, Dh
    (1, 2, 2, 1, 1, 8),          # one token
    (2, 4, 4, 37, 37, 16),       # MHA, length not a multiple of anything
    (2, 8, 2, 29, 29, 32),       # GQA 4
    (1, 6, 1, 5, 70, 24),        # MQA, a cache: 5 new queries after 65 keys, odd head dim
    (3, 4, 2, 64, 64, 64),       # exact tile multiples
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_reference_equals_sdpa(shape, causal):
    q, k, v = qkv(*shape, seed=sum(shape))
    torch.testing.assert_close(reference_attention(q, k, v, causal=causal), sdpa_oracle(q, k, v, causal),
                               rtol=1e-5, atol=1e-5)


def test_reference_padding_mask_and_the_course_attention():
    q, k, v = qkv(2, 4, 2, 9, 9, 16, seed=3)
    pad = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    torch.testing.assert_close(reference_attention(q, k, v, causal=True, key_padding_mask=pad),
                               sdpa_oracle(q, k, v, True, pad), rtol=1e-5, atol=1e-5)
    from course_lib.attention import attention        # the model's attention (SDPA, causal, GQA)
    torch.testing.assert_close(reference_attention(q, k, v, causal=True), attention(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [1, 3])
def test_course_attention_takes_a_backend_output_that_is_not_contiguous(monkeypatch, T):
    """CUDA's memory-efficient and cuDNN SDPA backends return [B, K, G*T, Dh] as a transposed view of a
    [B, G*T, K, Dh] buffer; the grouped-query path must reshape it, not view it (an H100 run of the serving
    bench failed there). Played on the CPU by a backend that returns the same layout."""
    import course_lib.attention.sdpa as sdpa
    real = F.scaled_dot_product_attention

    def transposed_layout(*args, **kwargs):
        out = real(*args, **kwargs)
        return out.transpose(1, 2).contiguous().transpose(1, 2)      # same values, the CUDA backends' strides

    q, k, v = qkv(2, 8, 2, T, 11, 16, seed=T)
    expected = reference_attention(q, k, v, causal=True)
    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", transposed_layout)
    assert not transposed_layout(q.reshape(2, 2, 4 * T, 16), k, v).is_contiguous()   # the folded GQA rows
    torch.testing.assert_close(sdpa.attention(q, k, v), expected, rtol=1e-5, atol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = qkv(1, 2, 2, 4, 4, 8, seed=4)
    pad = torch.tensor([[False, False, True, True]])       # causal rows 0 and 1 see only padding
    out, lse = reference_attention(q, k, v, causal=True, key_padding_mask=pad, return_lse=True)
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2])) and torch.isinf(lse[:, :, :2]).all()
    tiled, tlse = tiled_attention(q, k, v, causal=True, key_padding_mask=pad, block_q=2, block_k=2, return_lse=True)
    torch.testing.assert_close(tiled, out)
    torch.testing.assert_close(tlse, lse)


def test_reference_lse_and_scores_bytes():
    q, k, v = qkv(1, 2, 1, 6, 6, 8, seed=5)
    _, lse = reference_attention(q, k, v, return_lse=True)
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    assert scores_bytes(4096, heads=32, bytes_per_element=2) == 32 * 4096 * 4096 * 2


def test_online_softmax_equals_softmax_on_any_split():
    g = torch.Generator().manual_seed(6)
    for trial in range(20):
        n = int(torch.randint(1, 200, (1,), generator=g))
        x = torch.randn(3, n, generator=g) * float(torch.rand(1, generator=g) * 30)
        cuts = sorted(set(torch.randint(1, n, (int(torch.randint(0, 6, (1,), generator=g)),), generator=g).tolist())) \
            if n > 1 else []
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
        torch.testing.assert_close(online_softmax(x, sizes), x.softmax(-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(online_softmax(x, 7), x.softmax(-1), rtol=1e-5, atol=1e-6)
        m, l = online_softmax_stats(x, sizes)
        torch.testing.assert_close(m, x.max(-1).values)
        torch.testing.assert_close(torch.log(l) + m, torch.logsumexp(x, -1), rtol=1e-5, atol=1e-5)


def test_forgetting_the_rescale_is_wrong():
    """The running sum must be rescaled when the max grows: a row whose max arrives late shows it."""
    x = torch.tensor([[0.0, 1.0, 5.0, 2.0]])
    m, l = torch.tensor([-math.inf]), torch.tensor([0.0])
    m_bad, l_bad = m, l
    for piece in (x[:, :2], x[:, 2:]):
        m, l = softmax_stats_update(m, l, piece)
        m_new = torch.maximum(m_bad, piece.max(-1).values)
        l_bad = l_bad + torch.exp(piece - m_new[:, None]).sum(-1)          # no exp(m_old - m_new)
        m_bad = m_new
    assert torch.allclose(l, torch.exp(x - 5).sum(-1)) and not torch.allclose(l_bad, l, rtol=1e-3)


def test_merge_stats_and_masked_pieces():
    x = torch.randn(4, 30)
    m1, l1 = online_softmax_stats(x[:, :11], 4)
    m2, l2 = online_softmax_stats(x[:, 11:], 5)
    m, l = merge_softmax_stats(m1, l1, m2, l2)
    torch.testing.assert_close(m + torch.log(l), torch.logsumexp(x, -1))
    y = x.clone()
    y[:, :10] = -math.inf                                    # a fully masked first piece
    torch.testing.assert_close(online_softmax(y, 10), y.softmax(-1))


def test_split_sizes_errors():
    assert split_sizes(10, 4) == [4, 4, 2] and split_sizes(5, [2, 3]) == [2, 3]
    with pytest.raises(ValueError, match="splits"):
        split_sizes(5, [2, 2])
    with pytest.raises(ValueError, match="splits"):
        split_sizes(5, 0)
    with pytest.raises(TypeError, match="splits"):
        split_sizes(5, 2.0)


TILED_CASES = [  # shape, block_q, block_k
    ((2, 4, 4, 37, 37, 16), 8, 16),
    ((2, 8, 2, 29, 29, 32), 16, 8),
    ((1, 6, 1, 5, 70, 24), 4, 32),        # cache: T < S, causal diagonal offset
    ((1, 2, 2, 50, 50, 8), 7, 5),         # tile sizes that are not powers of two
    ((2, 4, 2, 33, 33, 16), 64, 64),      # one tile larger than the sequence
]


@pytest.mark.parametrize("shape,bq,bk", TILED_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_equals_reference(shape, bq, bk, causal):
    q, k, v = qkv(*shape, seed=sum(shape) + bq)
    ref, ref_lse = reference_attention(q, k, v, causal=causal, return_lse=True)
    got, lse = tiled_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, return_lse=True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_tiled_half_precision_and_padding(device):
    q, k, v = qkv(2, 4, 2, 21, 21, 16, seed=8, dtype=torch.bfloat16, device=device)
    pad = torch.ones(2, 21, dtype=torch.bool, device=device)
    pad[1, 15:] = False
    got = tiled_attention(q, k, v, causal=True, key_padding_mask=pad, block_q=8, block_k=8)
    assert got.dtype == torch.bfloat16 and got.device.type == device.type
    torch.testing.assert_close(got.float(), reference_attention(q, k, v, True, pad).float(), rtol=1e-2, atol=1e-2)


def test_io_counter_matches_the_io_model():
    """tiled_attention's IOCounter, the loop counter of its order and the closed form agree exactly."""
    for N, d, bq, bk, causal in ((64, 16, 16, 16, False), (70, 8, 16, 8, True), (100, 32, 25, 25, True),
                                 (37, 16, 8, 16, True), (37, 16, 64, 64, False)):
        q, k, v = qkv(2, 4, 2, N, N, d, seed=N)
        c = IOCounter()
        tiled_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, counter=c)
        model = flash_attention_io(N, d, block_q=bq, block_k=bk, causal=causal)
        loops = count_io(N, d, bq, bk, "query_outer", causal)
        per_head = 2 * 4
        assert c.reads == model["reads"] * per_head and c.o_writes == model["writes"] * per_head, (c, model)
        assert (c.q_reads, c.k_reads, c.v_reads, c.o_writes) == tuple(
            per_head * loops[x] for x in ("q_reads", "k_reads", "v_reads", "o_writes"))
    # standard attention: 4 N d + 4 N^2 elements
    assert standard_attention_io(1024, 64)["total"] == 4 * 1024 * 64 + 4 * 1024 ** 2


@pytest.mark.parametrize("order", LOOP_ORDERS)
def test_closed_forms_equal_the_loop_counts(order):
    """On random shapes, tiles that do not divide N, causal or not: the closed form is the loops' count."""
    rng = random.Random(order)
    for _ in range(60):
        N, d = rng.randint(1, 300), rng.choice([1, 8, 16, 64])
        bq, bk, causal = rng.randint(1, 80), rng.randint(1, 80), rng.random() < 0.5
        loops, closed = count_io(N, d, bq, bk, order, causal), flash_attention_io(N, d, bq, bk, causal=causal,
                                                                                   order=order)
        assert (loops["reads"], loops["writes"]) == (closed["reads"], closed["writes"]), (N, d, bq, bk, causal)


def test_algorithm_1_counted_term_by_term():
    """The paper's loop order on N = 1024, d = 64, B_r = 64, B_c = 256 (4 key tiles): K and V once, the
    initial O, l, m written once, and per key tile Q, O, l, m read and O, l, m written over all N rows."""
    N, d, T_c = 1024, 64, 4
    c = count_io(N, d, 64, 256, "kv_outer")
    assert c["k_reads"] == c["v_reads"] == N * d
    assert c["q_reads"] == c["o_reads"] == T_c * N * d and c["stats_reads"] == T_c * 2 * N
    assert c["o_writes"] == N * d + T_c * N * d and c["stats_writes"] == 2 * N + T_c * 2 * N
    assert c["total"] == N * d + 2 * N + 2 * N * d + T_c * (3 * N * d + 4 * N)
    causal = count_io(N, d, 64, 256, "kv_outer", causal=True)      # key tile j: the query tiles from 4j on
    assert causal["q_reads"] == d * sum(N - 256 * j for j in range(T_c))


def test_io_model_tile_sizes_are_the_papers():
    """Dao et al. 2022, Algorithm 1: B_c = ceil(M / 4d), B_r = min(ceil(M / 4d), d) with the key tiles outside;
    the query-outer order swaps the roles. Every d-wide tile and the score tile fit in about M/4."""
    for d, M in ((64, 48 * 1024), (128, 116736), (128, 32768), (256, 116736), (80, 1000)):
        b_r, b_c = sram_tiles(d, M, "kv_outer")
        assert b_c == math.ceil(M / (4 * d)) and b_r == min(b_c, d), (d, M, b_r, b_c)
        assert sram_tiles(d, M, "query_outer") == (b_c, b_r)
        assert b_r * b_c <= M / 4 + d and b_r * d <= M / 4 + d and b_c * d <= M / 4 + d
        io = flash_attention_io(1000, d, sram_elements=M, order="kv_outer")
        assert (io["block_q"], io["block_k"]) == (min(b_r, 1000), min(b_c, 1000))
    with pytest.raises(ValueError, match="order"):
        sram_tiles(64, 4096, "inner")


@pytest.mark.parametrize("order", LOOP_ORDERS)
def test_io_model_is_theta_n2d2_over_m_and_grows_with_m(order):
    """Theorem 2: tiled IO is Theta(N^2 d^2 / M) for every M in the paper's range: the ratio to N^2 d^2 / M
    settles at a constant (12 for the paper's order, 8 for the query-outer one) at any SRAM size, so the
    reduction over standard attention grows like M / d^2 and does not grow with N (not a factor of sqrt(N))."""
    for d in (64, 128):
        constant = {"kv_outer": 12 + 16 / d, "query_outer": 8}[order]     # kv_outer: + l and m, 16 N^2 d / M
        for M in (8 * d * d, 32 * d * d, 128 * d * d):
            N = 2 ** 18
            ratio = flash_attention_io(N, d, sram_elements=M, order=order)["total"] / flash_io_theta(N, d, M)
            assert abs(ratio / constant - 1) < 0.05, (order, d, M, ratio)
            reductions = [io_reduction(n, d, M, order) for n in (2 ** 14, 2 ** 16, 2 ** 18)]
            limit = io_reduction_limit(d, M, order)
            assert abs(reductions[-1] / limit - 1) < 0.02, (reductions, limit)
            assert reductions[-1] / reductions[0] < 1.25           # sqrt(N) would be 4x over these lengths
        limits = [io_reduction_limit(d, M, order) for M in (8 * d * d, 32 * d * d, 128 * d * d)]
        assert limits[1] / limits[0] > 3.5 and limits[2] / limits[1] > 3.5          # ~ x4 per x4 of SRAM
    # the numbers: an H100 SM (228 KB, fp16) at d = 128; the paper's A100 SRAM (192 KB per SM) at d = 64
    assert abs(io_reduction_limit(128, 116736, "kv_outer") - 116736 / (3 * 128 ** 2)) < 0.05
    assert 7.5 < io_reduction_limit(64, 98304, "kv_outer") < 8.1


def test_io_model_errors():
    with pytest.raises(ValueError, match="block_q or sram_elements"):
        flash_attention_io(10, 4)
    with pytest.raises(ValueError, match="seq_len"):
        standard_attention_io(0, 4)
    with pytest.raises(ValueError, match="order"):
        count_io(10, 4, 2, 2, "q_outer")
    with pytest.raises(ValueError, match="order"):
        flash_attention_io(10, 4, 2, order="kv")


def test_combine_splits_equals_full_attention():
    q, k, v = qkv(2, 8, 2, 1, 53, 16, seed=9)
    qd = q[:, :, 0]
    want = reference_attention(q, k, v)[:, :, 0]
    for ns in (1, 2, 5, 60):                     # 60 > 53 keys: empty splits weigh nothing
        m, l, acc = split_partials(qd, k, v, ns)
        torch.testing.assert_close(combine_splits(m, l, acc), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(combine_splits(m * math.log2(math.e), l, acc, base2=True), want, rtol=1e-5,
                                   atol=1e-5)
    assert split_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]


def test_flash_decode_torch_with_lengths():
    q, k, v = qkv(3, 4, 2, 1, 40, 16, seed=10)
    lens = [40, 1, 17]
    got = flash_decode_torch(q[:, :, 0], k, v, num_splits=3, lengths=lens)
    for b, n in enumerate(lens):
        want = reference_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])[0, :, 0]
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-5)


def test_bad_arguments_raise():
    q, k, v = qkv(1, 4, 2, 4, 4, 8, seed=11)
    with pytest.raises(ValueError, match="multiple"):
        reference_attention(q, k[:, :1].expand(1, 3, 4, 8), v[:, :1].expand(1, 3, 4, 8))
    with pytest.raises(TypeError, match="dtype"):
        tiled_attention(q, k.double(), v)
    with pytest.raises(ValueError, match="causal"):
        reference_attention(q, k[:, :, :2], v[:, :, :2], causal=True)
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="key_padding_mask"):
        reference_attention(q, k, v, key_padding_mask=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="q must be 4-D"):
        reference_attention(q[0], k, v)
    with pytest.raises(ValueError, match="num_splits"):
        flash_decode_torch(q[:, :, 0], k, v, num_splits=0)


def test_sdpa_backends_reported_on_this_device():
    q, k, v = qkv(1, 2, 2, 32, 32, 16, seed=12)
    rows = {r["backend"]: r for r in sdpa_backend_report(q, k, v, causal=True)}
    assert set(rows) == {"math", "flash", "efficient", "cudnn"}
    assert rows["math"]["ok"] and all(r["ok"] or r["reason"] for r in rows.values())
    assert sdpa_default_backend(q, k, v, causal=True) in ("math", "flash", "efficient", "cudnn")
    if not torch.cuda.is_available():
        assert not rows["efficient"]["ok"] and "CUDA" in rows["efficient"]["reason"]


def test_flash_backend_reason_and_flash_attn_status():
    why = flash_backend_reason((7, 5))
    assert why and "8.0" in why and "T4" in why
    assert flash_backend_reason((8, 0)) is None and flash_backend_reason((9, 0), torch.bfloat16) is None
    assert "fp16 or bf16" in flash_backend_reason((8, 6), torch.float32)
    assert flash_backend_reason(None) is None
    usable, line = flash_attn_status()
    assert "\n" not in line and line.startswith("flash-attn")
    assert hf_attn_implementation() == ("flash_attention_2" if usable else "sdpa")


# --- the Triton kernels under the interpreter (a fresh process: TRITON_INTERPRET before triton) ---------
TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch, triton
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from test_flash_attention import qkv
    from course_lib.attention import reference_attention
    from course_lib.attention.triton_flash import flash_attention_triton, flash_decode_triton
    from course_lib.attention import triton_online_softmax

    def check_kernels():
        TOL = {{torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}}
        cases = [((2, 4, 2, 37, 37, 64), torch.float16, {{}}),            # GQA 2, Dh 64, not tile multiples
                 ((1, 2, 2, 20, 20, 128), torch.bfloat16, {{}}),          # Dh 128, bf16
                 ((1, 4, 1, 5, 45, 24), torch.float32, {{}}),             # MQA, cache offset, odd Dh
                 ((1, 2, 2, 48, 48, 16), torch.float32, dict(block_m=32, block_n=16)),   # several diagonal tiles
                 ((1, 2, 1, 33, 33, 16), torch.float32, dict(block_m=16, block_n=32))]   # BLOCK_N > BLOCK_M
        for i, (shape, dtype, kw) in enumerate(cases):
            q, k, v = qkv(*shape, seed=20 + i, dtype=dtype)
            for causal in (False, True):
                want, want_lse = reference_attention(q.float(), k.float(), v.float(), causal=causal, return_lse=True)
                got, lse = flash_attention_triton(q, k, v, causal=causal, return_lse=True, **kw)
                assert got.dtype == dtype and got.shape == q.shape
                torch.testing.assert_close(got.float(), want, rtol=TOL[dtype], atol=TOL[dtype])
                torch.testing.assert_close(lse, want_lse, rtol=1e-3, atol=1e-3)
            qd = q[:, :, 0].contiguous()
            want = reference_attention(qd[:, :, None].float(), k.float(), v.float())[:, :, 0]
            one = flash_decode_triton(qd, k, v)
            torch.testing.assert_close(one.float(), want, rtol=TOL[dtype], atol=TOL[dtype])
            for splits in (2, 5):
                got = flash_decode_triton(qd, k, v, num_splits=splits)
                torch.testing.assert_close(got.float(), want, rtol=TOL[dtype], atol=TOL[dtype])
        # lengths per sequence, more splits than tiles, a fixed tile
        q, k, v = qkv(3, 8, 2, 1, 50, 32, seed=30)
        lens = torch.tensor([50, 1, 17])
        for kw in (dict(num_splits=8), dict(num_splits=2, tile_n=32), dict()):
            got = flash_decode_triton(q[:, :, 0], k, v, lengths=lens, **kw)
            for b, n in enumerate(lens.tolist()):
                want = reference_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])[0, :, 0]
                torch.testing.assert_close(got[b], want, rtol=2e-5, atol=2e-5)
        try:
            flash_attention_triton(q, k, v, block_m=24)
            raise AssertionError("block_m=24 accepted")
        except ValueError as e:
            assert "block_m" in str(e)

    check_kernels()          # the interpreter's loops: host-known bounds, every mask (see triton_online_softmax)
    # the compiled path's loops (runtime bounds: the causal tile skipping, each split's own tiles):
    # interpreters whose scalars convert to int (not triton 3.6 with NumPy >= 2.4) run them too
    triton_online_softmax.STATIC_LOOP_IN_INTERPRETER = False
    try:
        check_kernels()
        print("RUNTIME_LOOP_OK")
    except Exception as e:
        if "0-dimensional" not in str(e):
            raise
        print("RUNTIME_LOOP_UNSUPPORTED", triton.__version__)
    print("TRITON_FLASH_OK")
""")


@pytest.mark.slow
def test_triton_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    script = TRITON_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "TRITON_FLASH_OK" in res.stdout, res.stdout + res.stderr
    if "RUNTIME_LOOP_UNSUPPORTED" in res.stdout:
        import triton
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
        assert version < (3, 9), "only old interpreters may refuse a tensor loop bound"


def test_triton_kernels_need_cuda_or_the_interpreter():
    pytest.importorskip("triton")
    from course_lib.attention import triton_flash
    if triton_flash.interpreting():
        pytest.skip("TRITON_INTERPRET is set in this process")
    q, k, v = qkv(1, 2, 2, 4, 4, 16, seed=13)
    with pytest.raises(ValueError, match="CUDA"):
        triton_flash.flash_attention_triton(q, k, v)
    with pytest.raises(ValueError, match="CUDA"):
        triton_flash.flash_decode_triton(q[:, :, 0], k, v)


def test_paged_and_flash_decoding_share_one_reduction():
    pytest.importorskip("triton")
    from course_lib.attention import triton_flash, triton_splitkv
    from course_lib.paged import triton_paged
    assert triton_paged.combine_splits_triton is triton_splitkv.combine_splits_triton
    assert triton_flash.combine_splits_triton is triton_splitkv.combine_splits_triton
    assert not hasattr(triton_flash, "combine_splits_kernel")       # no private copy


def _triton_jit_functions() -> dict[str, ast.FunctionDef]:
    """Every @triton.jit function of course_lib, by name (names are unique: tests/triton_aot.py keys on them)."""
    found = {}
    for path in sorted((ROOT / "course_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).startswith("triton.jit")
                                                         for d in node.decorator_list):
                found[node.name] = node
    return found


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(n.func).rpartition(".")[2] for n in ast.walk(fn) if isinstance(n, ast.Call)}


def test_the_three_kernels_share_one_tile_step():
    """The online-softmax tile step (a tl.dot for the scores, exp2 rescaling) is written once: the forward,
    flash-decoding and the paged decode kernel reach ``online_softmax_tile``, no other @triton.jit function
    does both a tl.dot and an exp2, both decode kernels end in ``store_split``, and log2(e) is written once.
    (The backward kernels, ``triton_flash_backward``, recompute P from the saved log-sum-exp, with no running
    max: not this step; their dots go through ``_bwd_dot``.)"""
    jit = _triton_jit_functions()

    def reaches(kernel, target):
        seen, todo = set(), [kernel]
        while todo:
            name = todo.pop()
            if name == target:
                return True
            if name not in seen and name in jit:
                seen.add(name)
                todo.extend(_calls(jit[name]))
        return False

    for kernel in ("_flash_fwd_kernel", "_flash_decode_kernel", "_paged_decode_kernel"):
        assert reaches(kernel, "online_softmax_tile"), f"{kernel} does not call the shared tile step"
    for kernel in ("_flash_decode_kernel", "_paged_decode_kernel"):
        assert reaches(kernel, "store_split"), f"{kernel} does not end in the shared store_split"
    steps = sorted(name for name, fn in jit.items() if {"dot", "exp2"} <= _calls(fn))
    assert steps == ["online_softmax_tile"], \
        f"the tile step written again in {sorted(set(steps) - {'online_softmax_tile'})}: call online_softmax_tile"
    copies = [str(p.relative_to(ROOT)) for p in (ROOT / "course_lib").rglob("*.py") if "1.442695" in p.read_text()]
    assert copies == ["course_lib/attention/triton_online_softmax.py"], f"log2(e) written in {copies}"
    pytest.importorskip("triton")
    from course_lib.attention import triton_flash, triton_online_softmax
    from course_lib.paged import triton_paged
    assert triton_flash.interpreting is triton_paged.interpreting is triton_online_softmax.interpreting
    assert triton_flash.LOG2E is triton_paged.LOG2E is triton_online_softmax.LOG2E


# The ahead-of-time builds of every kernel for sm_75, sm_80 and sm_90: tests/test_triton_targets.py.


# --- GPU: real sizes, and the speed goal ----------------------------------------------------------------
GPU_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.gpu
@needs_triton_gpu
def test_triton_forward_on_cuda_at_real_sizes():
    pytest.importorskip("triton")
    from course_lib.attention.triton_flash import flash_attention_triton, flash_decode_triton
    for dtype, tol in GPU_TOL.items():
        for (B, H, K, T, S, Dh) in ((2, 16, 4, 1000, 1000, 64), (1, 32, 8, 2048, 2048, 128), (2, 8, 8, 77, 300, 128)):
            q, k, v = qkv(B, H, K, T, S, Dh, seed=T, dtype=dtype, device="cuda")
            for causal in (False, True):
                want = reference_attention(q, k, v, causal=causal).float()
                got = flash_attention_triton(q, k, v, causal=causal)
                torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
            qd = q[:, :, -1].contiguous()
            want = reference_attention(qd[:, :, None], k, v)[:, :, 0].float()
            for splits in (1, 4, 16):
                torch.testing.assert_close(flash_decode_triton(qd, k, v, num_splits=splits).float(), want,
                                           rtol=tol, atol=tol)


@pytest.mark.gpu
@needs_triton_gpu
def test_triton_forward_speed_goal():
    """Sequence 4096, head dim 128, bf16, causal: >= 50% of the device's dense bf16 peak (from the
    hardware table) and within 1.3x of SDPA's flash backend. Devices not in the table are skipped."""
    pytest.importorskip("triton")
    from course_lib.attention.backends import run_backend
    from course_lib.attention.triton_flash import flash_attention_triton
    from course_lib.perf.hardware import get_gpu
    from course_lib.perf.timing import compare
    try:
        spec = get_gpu(torch.cuda.get_device_name())
    except ValueError:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in the hardware table")
    if not spec.supports("bf16"):
        pytest.skip(f"{spec.name} has no bf16 tensor cores")
    B, H, N, Dh = 4, 32, 4096, 128
    q, k, v = qkv(B, H, H, N, N, Dh, seed=0, dtype=torch.bfloat16, device="cuda")
    flops = 4 * B * H * N * N * Dh / 2                      # causal: half of the 2 matmuls' 2 N^2 d each
    flash_attention_triton(q, k, v, causal=True)           # autotune
    # interleaved (a clock or power change hits both), median of 30 CUDA-event timings each
    both = compare({"triton": lambda: flash_attention_triton(q, k, v, causal=True),
                    "sdpa": lambda: run_backend("flash", q, k, v, causal=True)}, warmup=5, repeats=30, device=q.device)
    t_triton, t_sdpa = both.time("triton", "median"), both.time("sdpa", "median")
    share = flops / t_triton / spec.peak_flops("bf16")
    print(f"{spec.name}: triton {flops / t_triton / 1e12:.0f} TFLOP/s ({share:.0%} of peak), "
          f"SDPA flash {flops / t_sdpa / 1e12:.0f} TFLOP/s")
    assert share >= 0.5, f"Triton forward at {share:.0%} of the bf16 peak, goal 50%"
    assert t_triton <= 1.3 * t_sdpa, f"Triton {t_triton * 1e3:.2f} ms vs SDPA flash {t_sdpa * 1e3:.2f} ms"


def test_attention_bench_runs_and_names_the_device(tmp_path):
    """bench/attention.py at a small size: every row timed and checked against the reference; on CPU the
    Triton row is skipped with the reason recorded (on CUDA it runs, with the share of the peak)."""
    env = dict(os.environ, COURSE_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1")
    args = ["--seq", "48", "80", "--batch", "1", "--heads", "2", "--head-dim", "32", "--dtype", "fp32",
            "--repeats", "2"]
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    import json
    data = json.loads(next(tmp_path.glob("attention-*.json")).read_text())
    names = {r["impl"] for r in data["rows"]}
    assert data["device"] and {"sdpa math", "tiled (PyTorch loop)"} <= names
    assert ("triton" in data["skipped"]) == ("triton (course)" not in names)
    assert [r["seq"] for r in data["rows"]].count(80) == len(data["rows"]) // 2
    for r in data["rows"]:
        assert r["time_ms"] > 0 and r["TFLOP/s"] > 0 and float(r["max_err"]) < 1e-4
        assert (r["peak_%"] is None) == (data["peak_tflops"] is None)
