"""MXFP4 (OCP MX v1.0) and NVFP4: the E2M1 element, the E8M0 and E4M3 scales, the block conversions.

Outside oracles: PyTorch's float8_e8m0fnu and float8_e4m3fn casts (the scales' bit patterns), ml_dtypes'
float4_e2m1fn where installed (the elements), and in every case an independent nearest-value search on the
16-value table with the spec's tie rule (to the code whose mantissa bit is 0)."""
import math

import pytest
import torch

from course_lib.quant.mx import (E2M1_VALUES, E4M3_MAX, MXFP4Tensor, e2m1_decode, e2m1_encode, e2m1_values,
                                 e8m0_decode, e8m0_encode, mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize,
                                 nvfp4_quantize, pack_fp4, unpack_fp4)

TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]        # the spec's FP4 E2M1 magnitudes, codes 0..7


def nearest_even(v: torch.Tensor) -> torch.Tensor:
    """Oracle for E2M1 rounding, written differently from the library: the value of the nearest entry of
    the table (saturating at 6); on a tie the entry with an even code (mantissa bit 0)."""
    grid = torch.tensor(TABLE, dtype=torch.float64)
    a = v.double().abs().clamp(max=6.0).reshape(-1, 1)
    d = (a - grid).abs()                                              # [n, 8]
    best = d.min(dim=1, keepdim=True).values
    tied = d == best
    even = tied & (torch.arange(8) % 2 == 0)
    idx = torch.where(even.any(dim=1), even.float().argmax(dim=1), tied.float().argmax(dim=1))
    return (grid[idx] * torch.where(torch.signbit(v.double().reshape(-1)), -1.0, 1.0)).reshape(v.shape)


def test_e2m1_table_and_every_code_round_trips():
    vals = e2m1_values()
    assert vals[:8].tolist() == TABLE and (-vals[8:]).tolist() == TABLE and list(E2M1_VALUES) == TABLE
    assert torch.signbit(vals[8]) and vals[8] == 0                    # code 8 is -0
    codes = torch.arange(16)
    assert torch.equal(e2m1_encode(e2m1_decode(codes)).long(), codes)   # every representable value, exactly
    assert torch.equal(e2m1_decode(codes), vals)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_e2m1_rounds_every_midpoint_to_even_and_saturates(sign):
    # midpoint -> the neighbour whose code is even (mantissa bit 0)
    mid = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    v = torch.tensor(list(mid), dtype=torch.float32) * sign
    got = e2m1_decode(e2m1_encode(v))
    assert got.tolist() == [sign * w for w in mid.values()]
    eps = 2.0 ** -12                                                 # just off the midpoint: plain nearest
    above = e2m1_decode(e2m1_encode(v + sign * eps)).abs().tolist()
    assert above == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    below = e2m1_decode(e2m1_encode(v - sign * eps)).abs().tolist()
    assert below == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    big = torch.tensor([6.0, 6.5, 7.0, 8.0, 1e6, 3e38]) * sign         # saturate (clamp) at 6
    assert e2m1_decode(e2m1_encode(big)).tolist() == [6.0 * sign] * 6
    assert e2m1_encode(big).tolist() == [7 if sign > 0 else 15] * 6


def test_e2m1_matches_the_nearest_even_search_on_a_dense_grid():
    v = torch.linspace(-8, 8, 32001, dtype=torch.float32)
    assert torch.equal(e2m1_decode(e2m1_encode(v)).double(), nearest_even(v))


def test_e2m1_matches_ml_dtypes_float4_e2m1fn():
    ml_dtypes = pytest.importorskip("ml_dtypes")     # the dev extra installs it
    v = torch.linspace(-8, 8, 32001, dtype=torch.float32)
    got = e2m1_decode(e2m1_encode(v)).double()
    import numpy as np
    ref = v.numpy().astype(ml_dtypes.float4_e2m1fn)
    assert torch.equal(torch.from_numpy(ref.astype(np.float32)).double(), got)
    assert torch.equal(torch.from_numpy(ref.view(np.uint8).astype(np.int64)), e2m1_encode(v).long())


def test_e2m1_refuses_nan_and_inf_and_bad_codes():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="NaN"):
            e2m1_encode(torch.tensor([1.0, bad]))
    with pytest.raises(ValueError, match="0..15"):
        e2m1_decode(torch.tensor([3, 16]))
    with pytest.raises(TypeError, match="integer"):
        e2m1_decode(torch.tensor([1.0]))


def test_e8m0_against_torch_float8_e8m0fnu():
    if not hasattr(torch, "float8_e8m0fnu"):
        pytest.skip(f"torch {torch.__version__} has no float8_e8m0fnu")
    every = torch.arange(256, dtype=torch.uint8)
    ref = every.view(torch.float8_e8m0fnu).to(torch.float32)
    got = e8m0_decode(every)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)) and bool(torch.isnan(got[255]))
    assert torch.equal(got[:255], ref[:255])                         # 2^-127 (a float32 subnormal) .. 2^127
    e = torch.arange(-127, 128, dtype=torch.float64)
    bits = e8m0_encode(e)
    assert torch.equal(bits, torch.exp2(e).to(torch.float32).to(torch.float8_e8m0fnu).view(torch.uint8))
    assert bits[0] == 0 and bits[127] == 127 and bits[-1] == 254
    nan_bits = e8m0_encode(torch.tensor([math.nan, math.inf, -math.inf, 128.0, -128.0]))
    assert nan_bits.tolist() == [255] * 5
    assert torch.tensor(math.nan).to(torch.float8_e8m0fnu).view(torch.uint8) == 255   # torch agrees on NaN
    with pytest.raises(ValueError, match="power of two"):
        e8m0_encode(torch.tensor([0.5]))


def test_fp4_packing_low_nibble_first():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(unpack_fp4(packed), codes)
    with pytest.raises(ValueError, match="even"):
        pack_fp4(torch.tensor([1, 2, 3], dtype=torch.uint8))


def _spec_mxfp4(x: torch.Tensor):
    """The OCP algorithm written out with Python floats, block by block (the oracle for mxfp4_quantize)."""
    scales, vals = [], []
    for row in x.double().reshape(-1, 32).tolist():
        amax = max(abs(v) for v in row)
        e = -127 if amax == 0 else max(-127, math.frexp(amax)[1] - 1 - 2)      # floor(log2 amax) - emax_elem
        scales.append(e + 127)
        vals.append([w * 2.0 ** e for w in nearest_even(torch.tensor([v / 2.0 ** e for v in row])).tolist()])
    return torch.tensor(scales, dtype=torch.uint8), torch.tensor(vals, dtype=torch.float64)


def test_mxfp4_follows_the_spec_algorithm_block_by_block():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 64, generator=g) * torch.exp2(torch.randint(-20, 20, (24, 1), generator=g)).float()
    x[0, :32] = torch.tensor([7.0] + [0.1] * 31)      # a maximum with mantissa > 1.5: clamped to 6 * 2^0
    x[1, :32] = torch.tensor([(k % 13 - 6) / 2 for k in range(32)])      # midpoints at the scale 2^0
    x[2] = 0                                           # all-zero blocks
    q = mxfp4_quantize(x)
    ref_scales, ref_vals = _spec_mxfp4(x)
    assert torch.equal(q.scales.reshape(-1), ref_scales)
    assert torch.equal(q.dequantize(torch.float64).reshape(-1, 32), ref_vals)
    assert q.scales[0, 0] == 127 and q.dequantize()[0, 0] == 6.0         # 7 clamps to 6 at X = 1
    assert torch.equal(q.scales[2], torch.zeros(2, dtype=torch.uint8))    # 2^-127 for an all-zero block
    assert bool((q.codes()[2] == 0).all()) and bool((q.dequantize()[2] == 0).all())
    assert torch.equal(mxfp4_dequantize(q), q.dequantize())
    if hasattr(torch, "float8_e8m0fnu"):     # the stored bytes are the E8M0 patterns torch gives the scales
        xs = torch.exp2(q.scales.double() - 127).to(torch.float32).to(torch.float8_e8m0fnu).view(torch.uint8)
        assert torch.equal(xs, q.scales)


def test_mxfp4_tiny_blocks_clamp_to_the_smallest_scale():
    x = torch.full((1, 32), 2.0 ** -140)
    x[0, 0] = 2.0 ** -139
    q = mxfp4_quantize(x)
    assert q.scales.item() == 0                                        # shared_exp -141 < -127: clamp
    assert bool((q.dequantize() == 0).all())                           # 2^-139 / 2^-127 rounds to 0


def test_mxfp4_the_smallest_scale_divides_by_exactly_2_to_the_minus_127():
    # shared_exp = -125 - 2 = -127: E = 0, and 1.5 * 2^-125 / 2^-127 = 6 exactly (torchao 0.18.0 divides by
    # 2^-126 here and stores 3: the block decodes to half; the module docstring says who does what)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 1.5 * 2.0 ** -125, 2.0 ** -127
    q = mxfp4_quantize(x)
    assert q.scales.item() == 0 and q.codes()[0, 0, :2].tolist() == [7, 2]  # codes of 6 and 1
    assert torch.equal(q.dequantize(), x)


@pytest.mark.parametrize("k", [-50, -1, 3, 20, 100])
def test_mxfp4_shared_exponent_is_exact_just_below_a_power_of_two(k):
    # the largest float32 below 2^k: floor(log2) is k - 1, though float32's log2 may round it to k (as
    # microxcaling's floor(log2) in float32 does); the block maximum then lands in [4, 8) and clamps to 6
    top = torch.nextafter(torch.tensor(2.0 ** k), torch.tensor(0.0))
    x = torch.zeros(1, 32)
    x[0, 0] = top
    q = mxfp4_quantize(x)
    assert q.scales.item() == (k - 1) - 2 + 127
    assert q.dequantize()[0, 0].item() == 6 * 2.0 ** (k - 3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_mxfp4_nan_and_inf_make_a_nan_scale_and_a_nan_block(bad):
    x = torch.randn(2, 96, generator=torch.Generator().manual_seed(3))
    x[1, 40] = bad
    q = mxfp4_quantize(x)
    assert q.scales[1, 1] == 0xFF and int((q.scales == 0xFF).sum()) == 1
    d = q.dequantize()
    assert bool(torch.isnan(d[1, 32:64]).all())                        # the whole block, whatever its codes
    assert not bool(torch.isnan(d[:, :32]).any()) and not bool(torch.isnan(d[0]).any())


def test_a_nan_scale_decodes_every_code_to_nan():
    codes = torch.arange(32).remainder(16).to(torch.uint8).reshape(1, 32)
    q = MXFP4Tensor(packed=pack_fp4(codes), scales=torch.tensor([[0xFF]], dtype=torch.uint8),
                    shape=torch.Size([1, 32]), dtype=torch.float32)
    assert bool(torch.isnan(q.dequantize()).all())


def test_bits_per_value_and_padding():
    x = torch.randn(8, 128)
    assert mxfp4_quantize(x).bits_per_value() == 4 + 8 / 32                      # 4.25
    assert nvfp4_quantize(x).bits_per_value() == 4 + 8 / 16 + 32 / x.numel()    # 4.5 + the FP32 tensor scale
    assert nvfp4_quantize(x).storage_bits() == 4 * x.numel() + 8 * x.numel() // 16 + 32
    y = torch.randn(3, 70)                                  # 70 = 2 blocks of 32 + 6: a padded third block
    q = mxfp4_quantize(y)
    assert q.scales.shape == (3, 3) and q.dequantize().shape == y.shape
    assert q.bits_per_value() == (3 * 96 * 4 + 3 * 3 * 8) / (3 * 70)
    assert torch.equal(q.dequantize()[:, :64], mxfp4_quantize(y[:, :64]).dequantize())
    n = nvfp4_quantize(y)
    assert n.block_scales.shape == (3, 5) and n.dequantize().shape == y.shape


def test_nvfp4_scales_are_the_e4m3_casts_of_the_recipe():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 64, generator=g) * torch.logspace(-3, 1, 16)[:, None]
    x[5, 16:32] = 0                                          # one all-zero block
    q = nvfp4_quantize(x)
    amax = x.abs().max()
    assert q.tensor_scale == amax / (6 * 448) and q.tensor_scale.dtype == torch.float32
    block_amax = x.reshape(16, 4, 16).abs().amax(dim=-1)
    want = (block_amax / 6) / q.tensor_scale                            # float32, as the recipe computes it
    assert q.block_scales.dtype == torch.float8_e4m3fn
    assert torch.equal(q.block_scales.view(torch.uint8), want.clamp(max=448).to(torch.float8_e4m3fn).view(torch.uint8))
    assert q.block_scales.float().max() == E4M3_MAX                     # the tensor's max block uses all of E4M3
    assert q.block_scales[5, 1].float() == 0 and bool((q.dequantize()[5, 16:32] == 0).all())
    # the codes: round to nearest even of x / (block_scale * tensor_scale), saturating at 6
    s = q.block_scales.double() * q.tensor_scale.double()
    ratio = x.double().reshape(16, 4, 16) / torch.where(s > 0, s, 1.0).unsqueeze(-1)
    assert torch.equal(e2m1_decode(q.codes()).double(), nearest_even(ratio))
    assert torch.allclose(q.dequantize(torch.float64).reshape(16, 4, 16), nearest_even(ratio) * s.unsqueeze(-1))
    assert torch.equal(nvfp4_dequantize(q), q.dequantize())
    i = x.abs().argmax()                                                 # the tensor's amax comes back
    assert torch.isclose(q.dequantize().reshape(-1)[i].abs(), amax, rtol=2 ** -20)


def test_nvfp4_saturates_where_the_e4m3_scale_rounds_down():
    # (amax/6)/t = 448 for the first block; the second block's 4.6 * 16 / 6 = 12.27 rounds down to 12,
    # so its maximum maps to 4.6 / (12 * t) = 6.13 > 6 and saturates to code 7 (6): 6 * 12 * t = 4.5
    x = torch.zeros(1, 32)
    x[0, 0] = 168.0                                   # t = 168 / 2688 = 1/16
    x[0, 16] = 4.6
    q = nvfp4_quantize(x)
    assert q.tensor_scale.item() == 1 / 16 and q.block_scales.float().tolist() == [[448.0, 12.0]]
    assert q.codes()[0, 1, 0] == 7 and q.dequantize()[0, 16].item() == 4.5


def test_nvfp4_degenerate_and_bad_input():
    z = nvfp4_quantize(torch.zeros(2, 32))
    assert z.tensor_scale.item() == 1.0 and bool((z.dequantize() == 0).all())
    x = torch.zeros(1, 32)
    x[0, 0] = 1e4
    x[0, 16] = 1e-6                                   # its scale rounds to 0 in E4M3: the smallest subnormal
    q = nvfp4_quantize(x)
    assert q.block_scales[0, 1].float().item() == 2.0 ** -9
    for bad in (float("nan"), float("inf")):
        y = torch.randn(2, 32)
        y[0, 3] = bad
        with pytest.raises(ValueError, match="NaN"):
            nvfp4_quantize(y)
    with pytest.raises(ValueError, match="block_size"):
        mxfp4_quantize(torch.randn(4, 32), block_size=31)
    with pytest.raises(TypeError):
        mxfp4_quantize([1.0, 2.0])


def test_nvfp4_is_more_accurate_than_mxfp4_on_gaussian_data():
    x = torch.randn(512, 256, generator=torch.Generator().manual_seed(5))

    def sqnr(xh):
        return 10 * math.log10(float(x.pow(2).sum()) / float((x - xh).pow(2).sum()))
    mx, nv = sqnr(mxfp4_quantize(x).dequantize()), sqnr(nvfp4_quantize(x).dequantize())
    assert nv > mx + 1.5, (mx, nv)          # finer block and a non-power-of-two scale
    assert 15 < mx < 22 and 18 < nv < 24    # about 4 bits' worth (6 dB/bit) minus the scale's rounding


def test_memory_presets_match_the_stored_bits():
    from course_lib.quant.memory import bits_per_weight
    x = torch.randn(4, 256)
    assert bits_per_weight("mxfp4") == mxfp4_quantize(x).bits_per_value() == 4.25
    assert bits_per_weight("nvfp4") == 4.5 == nvfp4_quantize(x).bits_per_value() - 32 / x.numel()


def test_mxfp4_float64_input_at_the_top_of_the_e8m0_range():
    x = torch.zeros(2, 32, dtype=torch.float64)
    x[0, 0], x[0, 1] = 2.0 ** 129 * 1.5, 2.0 ** 128          # shared_exp 127: X = 2^127, the largest scale
    x[1, 0] = 2.0 ** 131                                     # shared_exp 129: no E8M0 scale, so NaN
    q = mxfp4_quantize(x)
    assert q.scales[:, 0].tolist() == [254, 255]
    d = q.dequantize()
    assert d.dtype == torch.float64 and d[0, 0] == 6 * 2.0 ** 127 and d[0, 1] == 2.0 ** 128
    assert bool(torch.isnan(d[1]).all())
