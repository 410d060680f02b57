"""NF4: the codebook from normal quantiles, blockwise quantization and double quantization, against
bitsandbytes' CPU implementation (quantize_4bit / dequantize_4bit, quant_type="nf4", blocksize=64)."""
import pytest
import torch

from course_lib.quant import nf4_codebook, nf4_quantize
from course_lib.quant.nf4 import NF4_OFFSET, dynamic_map, nf4_dequantize


def test_codebook_construction():
    cb = nf4_codebook()
    assert cb.shape == (16,) and cb.dtype == torch.float32
    assert torch.all(cb[1:] > cb[:-1])                          # sorted, distinct
    assert cb[0] == -1 and cb[-1] == 1 and cb[7] == 0           # zero is exactly representable
    assert (cb > 0).sum() == 8 and (cb < 0).sum() == 7          # asymmetric halves
    assert NF4_OFFSET == pytest.approx(0.9677083, abs=1e-7)
    # positive levels are normal quantiles, rescaled: ppf(p_i) / ppf(offset)
    p = torch.linspace(0.9677083, 0.5, 9, dtype=torch.float64)[:-1]
    expect = torch.special.ndtri(p) / torch.special.ndtri(p[0])
    assert torch.allclose(cb[8:].double().flip(0), expect, atol=1e-6)
    with pytest.raises(ValueError):
        nf4_codebook(offset=1.0)


def test_bits_per_value_and_all_zero():
    x = torch.randn(64 * 512, generator=torch.Generator().manual_seed(0))
    assert nf4_quantize(x).bits_per_value() == 4.5
    assert nf4_quantize(x, double_quant=True).bits_per_value() == pytest.approx(4.127, abs=1e-3)
    z = nf4_quantize(torch.zeros(3, 64))
    assert torch.all(z.codes() == 7) and torch.equal(z.dequantize(), torch.zeros(3, 64))
    z2 = nf4_quantize(torch.zeros(3, 64), double_quant=True)
    assert torch.equal(z2.dequantize(), torch.zeros(3, 64))


def test_nf4_beats_int4_absmax_on_normal_data():
    from course_lib.quant import fake_quantize, mse
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
    m_nf4 = mse(x, nf4_quantize(x, 64).dequantize())
    m_int4 = mse(x, fake_quantize(x, 4, "absmax", "group", group_size=64))
    assert m_nf4 < m_int4


def test_nf4_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        nf4_quantize(torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError):
        nf4_quantize(torch.arange(64))
    with pytest.raises(ValueError, match="empty"):
        nf4_quantize(torch.empty(0))
    with pytest.raises(ValueError, match="blocksize"):
        nf4_quantize(torch.randn(64), blocksize=0)
    with pytest.raises(TypeError):
        nf4_dequantize(torch.zeros(3))


bnb_F = pytest.importorskip("bitsandbytes.functional")


def test_same_codebook_and_dynamic_map_as_bitsandbytes():
    ref = bnb_F.get_4bit_type("nf4", device="cpu")
    assert torch.allclose(nf4_codebook(), ref, atol=1e-7, rtol=0)   # equal to the last bit in practice
    assert torch.allclose(dynamic_map(), bnb_F.create_dynamic_map(signed=True), atol=0, rtol=0)


@pytest.mark.parametrize("double_quant", [False, True])
def test_matches_bitsandbytes(double_quant):
    """Without double quantization: identical codes, packed bytes, absmax and dequantized values.

    With it: the 4-bit codes and packed bytes are still identical (both quantize with the full-precision
    absmax), but bitsandbytes' CPU kernel for the 8-bit blockwise step does not always pick the nearest
    entry of the dynamic code (about 0.1% of the scales, 1 in 32 in one case here, come out 1-2 codes off; ours takes
    the exact
    nearest, so its scale error is never larger). Stated tolerance for the dequantized tensors under
    double quantization: 0.5% of the tensor's absmax (observed about 0.1%)."""
    g = torch.Generator().manual_seed(2)
    cases = [torch.randn(8, 256, generator=g), torch.randn(3, 100, generator=g) * 0.02,
             torch.randn(7, generator=g), torch.randn(64 * 300, generator=g),   # > 256 blocks: 2 DQ blocks
             torch.cat([torch.zeros(64), torch.randn(128, generator=g)])]
    for x in cases:
        packed, state = bnb_F.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=double_quant)
        ours = nf4_quantize(x, blocksize=64, double_quant=double_quant)
        # same 4-bit codes, packed the same way (first code in the high nibble)
        assert torch.equal(ours.packed, packed.reshape(-1))
        ref = bnb_F.dequantize_4bit(packed, state).reshape(x.shape)
        if not double_quant:
            assert torch.equal(ours.absmax, state.absmax)
            assert torch.equal(ours.dequantize(), ref)
            continue
        assert torch.equal(ours.absmax2, state.state2.absmax)
        assert ours.offset == pytest.approx(float(state.offset), rel=1e-6)
        diff = ours.absmax_codes.long() - state.absmax.long()   # every block, degenerate ones included
        assert int((diff != 0).sum()) <= max(1, diff.numel() // 100)
        assert diff.numel() == 0 or int(diff.abs().max()) <= 2
        true_absmax = nf4_quantize(x, blocksize=64).absmax
        ref_scales = bnb_F.dequantize_blockwise(state.absmax, state.state2) + state.offset
        assert torch.all((ours.scales() - true_absmax).abs() <= (ref_scales - true_absmax).abs() + 1e-7)
        assert torch.allclose(ours.dequantize(), ref, rtol=0, atol=5e-3 * float(x.abs().max()))


def _planted_block(absmax: float, mids: torch.Tensor):
    """absmax itself, then every scaled codebook midpoint (as float32 mid * absmax) and its neighbours 1 ulp
    either side; also the number of them where x / absmax and x * (1 / absmax) fall on different sides."""
    a = torch.tensor(absmax, dtype=torch.float32)
    x = mids * a
    x = torch.stack([torch.nextafter(x, -2 * a), x, torch.nextafter(x, 2 * a)], dim=1).reshape(-1)
    flips = int((torch.bucketize(x / a, mids) != torch.bucketize(x * (1.0 / a), mids)).sum())
    return torch.cat([a[None], x]), flips


def test_partial_last_block_rounds_like_bitsandbytes():
    """bitsandbytes (backends/default/ops.py, quantize_4bit) scales full blocks by x * (1/absmax) but the
    partial last block by x / absmax; they differ by 1 ulp for some x, and on a codebook midpoint 1 ulp
    changes the code. Values planted on and around the midpoints, in a full block and in a partial one."""
    code = bnb_F.get_4bit_type("nf4", device="cpu")
    mids = (code[:-1] + code[1:]) / 2
    full, flips_full = _planted_block(0.9137, mids)       # 46 values: padded to one full block of 64
    part, flips_part = _planted_block(1.3, mids)          # 46 values + 1 zero: a partial block of 47
    assert flips_full > 0 and flips_part > 0              # the two roundings really disagree here
    g = torch.Generator().manual_seed(3)
    cases = [torch.cat([full, torch.zeros(64 - full.numel()), part, torch.zeros(1)]),   # n = 111, odd
             torch.cat([torch.randn(64, generator=g), -part]),                            # n = 110
             torch.cat([torch.randn(128, generator=g), torch.zeros(10)])]                 # all-zero partial block
    for x in cases:
        assert x.numel() % 64
        packed, state = bnb_F.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=False)
        ours = nf4_quantize(x, blocksize=64)
        assert torch.equal(ours.packed, packed.reshape(-1))
        assert torch.equal(ours.absmax, state.absmax)     # an all-zero partial block: 1e-38, as bitsandbytes
        assert torch.equal(ours.dequantize(), bnb_F.dequantize_4bit(packed, state).reshape(x.shape))


def _bnb_state(q):
    """Our NF4Tensor as a bitsandbytes QuantState, to decode it with bitsandbytes' own dequantizer."""
    if not q.double_quant:
        return bnb_F.QuantState(absmax=q.absmax, shape=q.shape, code=q.code, blocksize=q.blocksize,
                                quant_type="nf4", dtype=q.dtype)
    state2 = bnb_F.QuantState(absmax=q.absmax2, code=q.code2, blocksize=q.dq_blocksize, dtype=torch.float32)
    return bnb_F.QuantState(absmax=q.absmax_codes, shape=q.shape, code=q.code, blocksize=q.blocksize,
                            quant_type="nf4", dtype=q.dtype, offset=torch.tensor(q.offset), state2=state2)


def test_all_zero_blocks_store_what_bitsandbytes_stores():
    """All-zero blocks, alone and among normal ones, with and without double quantization: what we store for
    them (absmax; or 8-bit code, absmax2 and offset) equals bitsandbytes' byte for byte, and bitsandbytes'
    dequantizer reads our state back to exactly our values. Under double quantization the cases a
    nearest-entry search gets wrong: a block of 256 scales with no spread (the C kernel divides 0 by 0 and
    stores index 0, not 0.0's index 127) and a subnormal absmax2 (the kernel scales by it unclamped)."""
    g = torch.Generator().manual_seed(4)
    spike = torch.zeros(6, 64)
    spike[:, 9] = torch.tensor([1.5, -1.5, 1.5, 1.5, -1.5, 1.5])            # every block's absmax is 1.5
    spike[:, 20:30] = torch.randn(6, 10, generator=g) * 0.3
    cases = {"zeros 3x64": torch.zeros(3, 64), "zeros, two DQ blocks": torch.zeros(64 * 300),
             "zeros, partial block only": torch.zeros(100),                    # stored 1e-38: absmax2 subnormal
             "zeros among normal blocks": torch.cat([torch.zeros(64), torch.randn(192, generator=g), torch.zeros(64),
                                                     torch.randn(64, generator=g) * 0.02, torch.zeros(70)]),
             "zero second DQ block": torch.cat([torch.randn(64 * 256, generator=g), torch.zeros(64 * 44)]),
             "equal absmax everywhere": spike}
    for name, x in cases.items():
        flat = x.reshape(-1)
        zero = torch.nn.functional.pad(flat, (0, -flat.numel() % 64)).reshape(-1, 64).eq(0).all(dim=1)
        assert bool(zero.any()) or name == "equal absmax everywhere"
        for dq in (False, True):
            packed, state = bnb_F.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=dq)
            ours = nf4_quantize(x, blocksize=64, double_quant=dq)
            assert torch.equal(ours.packed, packed.reshape(-1)), name
            theirs = bnb_F.dequantize_4bit(packed, state).reshape(x.shape)
            read_back = bnb_F.dequantize_4bit(packed, _bnb_state(ours)).reshape(x.shape)
            assert torch.equal(read_back, ours.dequantize()), f"{name}: bitsandbytes reads our state differently"
            if not dq:
                assert torch.equal(ours.absmax, state.absmax), f"{name}: absmax differs"
                assert torch.equal(read_back, theirs), name
                continue
            assert torch.equal(ours.absmax2, state.state2.absmax) and ours.offset == float(state.offset), name
            assert torch.equal(ours.absmax_codes[zero], state.absmax[zero]), f"{name}: zero blocks' 8-bit codes"
            other = ours.absmax_codes[~zero].long() - state.absmax[~zero].long()
            # elsewhere bitsandbytes' binary search is not always the nearest entry (test_matches_bitsandbytes)
            assert int((other != 0).sum()) <= max(1, other.numel() // 100) and bool((other.abs() <= 2).all())
            if torch.equal(ours.absmax_codes, state.absmax):
                assert torch.equal(read_back, theirs), name
            else:
                assert name == "zero second DQ block"           # the one case here with a normal block's quirk
