"""Module 07 edge cases against torch's SDPA (issue 30): tiled attention with a key padding mask, causal or
not, at query lengths below, at and above the tile; flash-decoding and paged decoding with sequence lengths
0, 1 and S (an empty sequence attends to nothing: a zero row) on every backend, and bad lengths refused with
a ValueError naming the argument. The Triton kernels run under the interpreter in a fresh process, on small
shapes (the interpreter is slow)."""
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import (combine_splits, flash_decode_torch, reference_attention, split_partials,
                                  tiled_attention)
from course_lib.paged import contiguous_to_paged, paged_attention, paged_attention_reference

ROOT = Path(__file__).resolve().parents[1]


def sdpa_masked(q, k, v, causal=False, key_padding_mask=None):
    """Oracle: torch SDPA on K/V repeated per query head with an explicit bottom-right causal mask and the
    padding mask; the natural log-sum-exp from torch.logsumexp. A row that may read no key is set to zeros
    here (the course's rule), so the oracle does not depend on how a torch version fills such rows."""
    B, H, T, Dh = q.shape
    K, S = k.shape[1], k.shape[2]
    kr, vr = k.float().repeat_interleave(H // K, 1), v.float().repeat_interleave(H // K, 1)
    allowed = torch.ones(B, 1, T, S, dtype=torch.bool)
    if causal:
        allowed = allowed & (torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T))
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q.float(), kr, vr, attn_mask=allowed)
    out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    scores = (q.float() @ kr.transpose(-1, -2)) / math.sqrt(Dh)
    return out, torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), -1)


def sdpa_decode(q, k, v, lengths):
    """Oracle for one decode query per sequence: SDPA on the first lengths[b] keys of row b; zeros for 0."""
    B, H, Dh = q.shape
    G = H // k.shape[1]
    out = torch.zeros(B, H, Dh)
    for b, n in enumerate(lengths):
        if n:
            kb, vb = (x[b, :, :n].float().repeat_interleave(G, 0)[None] for x in (k, v))
            out[b] = F.scaled_dot_product_attention(q[b].float()[None, :, None], kb, vb)[0, :, 0]
    return out


def padding(B, S, g, fully_padded_row=False):
    """A [B, S] bool mask (True = a real key): row 0 all real, then right padding, left padding with holes,
    and (optionally) a row of padding only."""
    pad = torch.ones(B, S, dtype=torch.bool)
    if B > 1:
        pad[1, S - max(1, S // 3):] = False
    if B > 2:
        pad[2, :min(4, S - 1)] = False
        pad[2] &= torch.rand(S, generator=g) > 0.2
    if fully_padded_row:
        pad[-1] = False
    return pad


# query lengths around block_q = 8: below, equal, above (not a multiple), a multiple; keys as many, more
# (a cache: the queries are the last T positions), fewer (non-causal only); block_k = 5 divides none
TILE_SHAPES = [(T, S) for T in (3, 8, 13, 16) for S in (T, T + 6)] + [(13, 5), (16, 1)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "[B, S]", "[1, S]", "a fully padded row"])
def test_tiled_and_reference_equal_sdpa_with_padding(causal, mask_kind):
    g = torch.Generator().manual_seed(sum(map(ord, mask_kind)) + causal)
    for (T, S), (H, K) in ((ts, hk) for ts in TILE_SHAPES for hk in ((4, 2), (2, 2))):
        if causal and T > S:
            continue
        B = 3
        q = torch.randn(B, H, T, 16, generator=g)
        k, v = torch.randn(B, K, S, 16, generator=g), torch.randn(B, K, S, 16, generator=g)
        pad = {"none": None, "[B, S]": padding(B, S, g), "[1, S]": padding(1, S, g) | (torch.arange(S) % 3 != 1),
               "a fully padded row": padding(B, S, g, fully_padded_row=True)}[mask_kind]
        want, want_lse = sdpa_masked(q, k, v, causal, None if pad is None else pad.expand(B, S))
        what = f"T={T} S={S} H={H} K={K} causal={causal} mask {mask_kind}"
        ref, ref_lse = reference_attention(q, k, v, causal=causal, key_padding_mask=pad, return_lse=True)
        torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"reference, {what}: {m}")
        torch.testing.assert_close(ref_lse, want_lse, rtol=1e-5, atol=1e-5)
        for bq, bk in ((8, 5), (4, 16), (64, 64)):
            got, lse = tiled_attention(q, k, v, causal=causal, key_padding_mask=pad, block_q=bq, block_k=bk,
                                       return_lse=True)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"tiled block_q={bq} block_k={bk}, {what}: {m}")
            torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
        if mask_kind == "a fully padded row":
            assert torch.equal(ref[-1], torch.zeros_like(ref[-1])) and torch.isneginf(ref_lse[-1]).all()


def test_padding_masks_the_api_does_not_take_are_refused():
    """key_padding_mask is a bool [B, S] (or [1, S], one mask for the batch): a [B, 1, 1, S] or [B, T, S]
    mask, an additive float mask, an integer mask, the wrong length or batch raise a ValueError naming it."""
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    ok = torch.ones(2, 9, dtype=torch.bool)
    for bad in (ok[:, None, None, :], ok[:, None, :].expand(2, 6, 9), torch.zeros(2, 9), ok.int(),
                ok[:, :8], torch.ones(3, 9, dtype=torch.bool)):
        for fn in (reference_attention, tiled_attention):
            with pytest.raises(ValueError, match="key_padding_mask"):
                fn(q, k, v, key_padding_mask=bad)


# --- decode: sequence lengths ---------------------------------------------------------------------------
def decode_case(B, H, K, S, Dh, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Dh, generator=g), torch.randn(B, K, S, Dh, generator=g),
            torch.randn(B, K, S, Dh, generator=g))


def test_flash_decode_torch_lengths_0_1_S():
    """Every split count, lengths 0, 1 and S among others: flash_decode_torch == SDPA per sequence ==
    reference_attention with the lengths as a padding mask; an empty sequence gets an exact zero row."""
    S = 23
    lengths = [0, 1, S, 11, 0, S - 1, 2]
    q, k, v = decode_case(len(lengths), 8, 2, S, 16, seed=40)
    want = sdpa_decode(q, k, v, lengths)
    pad = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    ref = reference_attention(q[:, :, None], k, v, key_padding_mask=pad)[:, :, 0]
    torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-5)
    for ns in (1, 2, 3, 7, S + 3):                 # S + 3: more splits than keys, many empty
        for lens in (lengths, torch.tensor(lengths)):
            got = flash_decode_torch(q, k, v, num_splits=ns, lengths=lens)
            assert not got.isnan().any(), f"NaN with {ns} splits"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.equal(got[4], got[0])


def test_combine_splits_of_nothing_is_zero():
    m = torch.full((2, 3, 4), float("-inf"))
    l, acc = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, 5)
    for base2 in (False, True):
        assert torch.equal(combine_splits(m, l, acc, base2=base2), torch.zeros(2, 3, 5))


def test_bad_decode_lengths_raise_naming_lengths():
    S = 10
    q, k, v = decode_case(3, 4, 2, S, 8, seed=41)
    cases = [([4, -1, 3], r"lengths\[1\]=-1.*\[0, 10\]"), ([4, 11, 3], r"lengths\[1\]=11.*\[0, 10\]"),
             ([4, 3], r"lengths.*3 values"), (torch.tensor([4.0, 2.0, 3.0]), "lengths.*integer"),
             ([4, 2.5, 3], "lengths.*integer"), ([True, 2, 3], "lengths.*integer"),
             (torch.tensor([[4, 2, 3]]), "lengths.*3 values")]
    for lens, match in cases:
        with pytest.raises(ValueError, match=match):
            flash_decode_torch(q, k, v, lengths=lens)
        with pytest.raises(ValueError, match=match):
            split_partials(q, k, v, 2, lengths=lens)


def paged_case(lengths, S, bs, seed, H=8, K=2, Dh=16):
    q, k, v = decode_case(len(lengths), H, K, S, Dh, seed)
    kp, vp, tables, lens = contiguous_to_paged(k, v, lengths, bs, generator=torch.Generator().manual_seed(seed))
    return q, k, v, kp, vp, tables, lens


def test_paged_lengths_0_1_S_on_the_torch_backends(monkeypatch):
    S, bs = 21, 4
    lengths = [0, 1, S, 9, 0, 16]
    q, k, v, kp, vp, tables, lens = paged_case(lengths, S, bs, seed=42)
    want = sdpa_decode(q, k, v, lengths)
    for got in (paged_attention_reference(q, kp, vp, tables, lens),
                paged_attention(q, kp, vp, tables, lens, backend="torch"),
                paged_attention(q, kp, vp, tables, lens, backend="torch", validate=True)):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.equal(got[4], got[0])
    # the torch backend's zero rows do not rest on this torch's SDPA: before 2.5 a fully masked row was NaN
    import course_lib.paged.attention as paged_module
    sdpa_now = paged_module.attention

    def sdpa_before_2_5(q, k, v, attn_mask=None, scale=None):
        out = sdpa_now(q, k, v, attn_mask, scale=scale)
        return out.masked_fill(~attn_mask.any(-1, keepdim=True), float("nan"))

    monkeypatch.setattr(paged_module, "attention", sdpa_before_2_5)
    torch.testing.assert_close(paged_attention(q, kp, vp, tables, lens, backend="torch"), want, rtol=1e-5, atol=1e-5)
    # every row empty: the table of a batch that owns no block still has one (unused) column
    q, k, v, kp, vp, tables, lens = paged_case([0, 0], 5, bs, seed=43)
    assert tables.shape == (2, 1)
    for backend in ("reference", "torch"):
        assert torch.equal(paged_attention(q, kp, vp, tables, lens, backend=backend, validate=True),
                           torch.zeros_like(q))


def test_bad_paged_lengths_raise_or_are_clamped_unvalidated():
    """Outside [0, max_blocks * block_size]: a ValueError naming context_lens, the row and the range (the
    reference always; the torch backend with validate=True). Unvalidated (no host sync) a length is clamped
    into that range: never NaN, never a read outside the table."""
    S, bs = 10, 4
    q, k, v, kp, vp, tables, lens = paged_case([10, 3, 7], S, bs, seed=44)
    cap = tables.shape[1] * bs                                             # 12
    for bad, row in ((-1, 1), (cap + 1, 2)):
        b_lens = lens.clone()
        b_lens[row] = bad
        match = rf"context_lens\[{row}\]={bad}.*\[0, .*{cap}\]"
        with pytest.raises(ValueError, match=match):
            paged_attention_reference(q, kp, vp, tables, b_lens)
        with pytest.raises(ValueError, match=match):
            paged_attention(q, kp, vp, tables, b_lens, backend="torch", validate=True)
        got = paged_attention(q, kp, vp, tables, b_lens, backend="torch")
        c_lens = b_lens.clamp(0, cap)
        torch.testing.assert_close(got, paged_attention_reference(q, kp, vp, tables, c_lens), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="lengths"):
        contiguous_to_paged(k, v, [10, -1, 7], bs)
    with pytest.raises(ValueError, match="lengths"):
        contiguous_to_paged(k, v, [10, 11, 7], bs)


# --- the Triton kernels under the interpreter (a fresh process: TRITON_INTERPRET before triton) ---------
TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch, triton
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from test_attention_edges import decode_case, paged_case, sdpa_decode
    from course_lib.attention.triton_flash import flash_decode_triton
    from course_lib.paged import paged_attention
    from course_lib.paged.triton_paged import paged_attention_triton

    from course_lib.attention import triton_online_softmax

    def check_lengths():
        def raises(fn, match):
            import re
            try:
                fn()
            except ValueError as e:
                assert re.search(match, str(e)), str(e)
                return
            raise AssertionError("no ValueError for " + match)

        # flash-decoding: 37 keys = 3 tiles of 16, so 2 and 5 splits have full, partial and empty splits
        S = 37
        lengths = [0, 1, S, 17, 0]
        q, k, v = decode_case(len(lengths), 4, 2, S, 16, seed=45)
        want = sdpa_decode(q, k, v, lengths)
        lens = torch.tensor(lengths)
        for ns in (1, 2, 5):
            for validate in (False, True):
                got = flash_decode_triton(q, k, v, lengths=lens, num_splits=ns, validate=validate)
                assert not got.isnan().any(), ("NaN", ns)
                torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
                assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.equal(got[4], got[0])
        for bad, row in ((-20, 1), (S + 1, 3)):
            b = lens.clone()
            b[row] = bad
            raises(lambda: flash_decode_triton(q, k, v, lengths=b, num_splits=2, validate=True),
                   rf"lengths\\[{{row}}\\]={{bad}}.*\\[0, {{S}}\\]")
            clamped = flash_decode_triton(q, k, v, lengths=b.clamp(0, S), num_splits=2)
            torch.testing.assert_close(flash_decode_triton(q, k, v, lengths=b, num_splits=2), clamped)

        # paged: block 4, lengths 0, 1, S; 1 and 3 splits
        S = 21
        lengths = [0, 1, S, 9]
        q, k, v, kp, vp, tables, lens = paged_case(lengths, S, 4, seed=46)
        want = sdpa_decode(q, k, v, lengths)
        for ns in (1, 3):
            for got in (paged_attention_triton(q, kp, vp, tables, lens, num_splits=ns),
                        paged_attention(q, kp, vp, tables, lens, backend="triton", num_splits=ns, validate=True)):
                assert not got.isnan().any(), ("NaN", ns)
                torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
                assert torch.equal(got[0], torch.zeros_like(got[0]))
        cap = tables.shape[1] * 4
        for bad, row in ((-2, 1), (cap + 1, 3)):
            b = lens.clone()
            b[row] = bad
            for fn in (lambda: paged_attention_triton(q, kp, vp, tables, b, validate=True),
                       lambda: paged_attention(q, kp, vp, tables, b, backend="triton", validate=True)):
                raises(fn, rf"context_lens\\[{{row}}\\]={{bad}}")
            for ns in (1, 3):
                torch.testing.assert_close(paged_attention_triton(q, kp, vp, tables, b, num_splits=ns),
                                           paged_attention_triton(q, kp, vp, tables, b.clamp(0, cap), num_splits=ns))

    check_lengths()          # the interpreter's loops: host-known bounds, every mask (see triton_online_softmax)
    # the compiled path's loops (runtime bounds: each split's own tiles, a sequence's own length):
    # interpreters whose scalars convert to int (not triton 3.6 with NumPy >= 2.4) run them too
    triton_online_softmax.STATIC_LOOP_IN_INTERPRETER = False
    try:
        check_lengths()
        print("RUNTIME_LOOP_OK")
    except Exception as e:
        if "0-dimensional" not in str(e):
            raise
        print("RUNTIME_LOOP_UNSUPPORTED", triton.__version__)
    print("TRITON_EDGES_OK")
""")


@pytest.mark.slow
def test_triton_decode_lengths_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    script = TRITON_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "TRITON_EDGES_OK" in res.stdout, res.stdout + res.stderr
    if "RUNTIME_LOOP_UNSUPPORTED" in res.stdout:
        import triton
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
        assert version < (3, 9), "only old interpreters may refuse a tensor loop bound"
