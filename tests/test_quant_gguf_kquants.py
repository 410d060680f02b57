"""GGUF k-quants Q4_K / Q6_K: decoders bit-exact against the gguf package's reference, encoders checked by
round trip, by their error against the 32-value formats, and by the layout rules.

The installed gguf package (0.19) has k-quant *decoders* only (``gguf.quants.quantize`` raises
NotImplementedError for Q4_K / Q6_K): every byte string our encoders write is decoded by gguf's decoder to
exactly what ours decodes. The encoders' bytes themselves are compared with ggml's reference algorithm
(``quantize_row_q4_K_ref`` / ``quantize_row_q6_K_ref``) compiled from C in tests/test_quant_gguf_c_reference.py.
"""
import numpy as np
import pytest
import torch

from course_lib.quant import describe_block, gguf_bits_per_weight, gguf_dequantize, gguf_quantize
from course_lib.quant.gguf import (BLOCK_BYTES, _pack_k4_scales, dequantize_q4_k, dequantize_q6_k, quantize_q4_k,
                                   quantize_q6_k)

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402

TYPES = {"q4_k": gguf.GGMLQuantizationType.Q4_K, "q6_k": gguf.GGMLQuantizationType.Q6_K}
D_OFFSETS = {"q4_k": (0, 2), "q6_k": (208,)}               # where the fp16 super-block scales sit


def _inputs():
    g = torch.Generator().manual_seed(1)
    yield "normal", torch.randn(8, 512, generator=g)
    yield "small-scale 3-D", torch.randn(2, 3, 256, generator=g) * 1e-3
    yield "uniform positive", torch.rand(4, 256, generator=g) * 3          # min 0 side: dmin matters
    yield "shifted", torch.randn(4, 256, generator=g) - 2.0
    z = torch.randn(4, 512, generator=g)
    z[0] = 0
    z[1, :32] = 0                                               # one empty Q4_K sub-block
    z[2, 256:272] = 0                                           # one empty Q6_K sub-block
    z[3, :256] = -0.75                                          # constant negative super-block
    yield "zeros and constants", z
    h = torch.randn(4, 256, generator=g) * 0.01
    h[0, 5], h[1, 100], h[2, 255] = 50.0, -80.0, 300.0          # one outlier per super-block
    yield "outliers", h
    t = torch.randn(3, 8, 256, generator=g)
    yield "heavy tails", t[0] / (t[1] ** 2 / 2 + t[2] ** 2 / 2).sqrt()       # Student t, 2 degrees of freedom


def _random_blocks(fmt, n, seed):
    """Arbitrary bytes with finite fp16 super-block scales: every such byte string is a valid block."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, 256, (n, BLOCK_BYTES[fmt]), generator=g, dtype=torch.uint8)
    for off in D_OFFSETS[fmt]:
        d = (torch.rand(n, generator=g) * 2 - 1) * 4.0
        bits = d.half().view(torch.int16).to(torch.int32) & 0xFFFF
        b[:, off], b[:, off + 1] = (bits & 0xFF).to(torch.uint8), (bits >> 8).to(torch.uint8)
    return b


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_decoder_bit_exact_on_arbitrary_blocks(fmt):
    b = _random_blocks(fmt, 64, seed=3)
    ours = gguf_dequantize(b.reshape(8, -1), fmt)
    ref = ref_dequantize(b.reshape(8, -1).numpy(), TYPES[fmt])
    assert ours.shape == (8, 8 * 256) and np.array_equal(ours.numpy(), ref), f"{fmt} decode differs from gguf"


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_encoder_round_trip_through_the_reference_decoder(fmt):
    for name, x in _inputs():
        data = gguf_quantize(x, fmt)
        assert data.dtype == torch.uint8
        assert tuple(data.shape) == (*x.shape[:-1], x.shape[-1] // 256 * BLOCK_BYTES[fmt]), name
        ref = ref_dequantize(data.numpy(), TYPES[fmt])
        ours = gguf_dequantize(data, fmt)
        assert np.array_equal(ours.numpy(), ref), f"{fmt}: our decode of our bytes differs from gguf's ({name})"
        assert ours.shape == x.shape
        err = (ours - x).abs().amax(dim=-1)                     # a row's worst error vs its spread
        spread = x.amax(dim=-1) - x.amin(dim=-1)
        bound = (0.08 if fmt == "q4_k" else 0.03) * spread + 1e-6
        assert bool((err <= bound).all()), f"{fmt} error too large on {name}: {err.max():.3g}"


def test_gguf_has_no_k_quant_encoder_here():
    # if a later gguf gains one, this test tells us to compare bytes instead of decodes
    with pytest.raises(NotImplementedError):
        ref_quantize(np.zeros((1, 256), np.float32), TYPES["q4_k"])


def test_sizes_and_bits_per_weight():
    assert BLOCK_BYTES["q4_k"] == 144 and BLOCK_BYTES["q6_k"] == 210
    assert quantize_q4_k(torch.randn(2, 512)).shape == (2, 288)
    assert quantize_q6_k(torch.randn(512)).shape == (420,)
    assert gguf_bits_per_weight("q4_k") == 4.5 and gguf_bits_per_weight("q6_k") == 6.5625
    assert gguf_bits_per_weight("q4_0") == 4.5 and gguf_bits_per_weight("q8_0") == 8.5


def test_error_order_against_the_32_value_formats():
    x = torch.randn(32, 512, generator=torch.Generator().manual_seed(5))
    rel = {f: float(((gguf_dequantize(gguf_quantize(x, f), f) - x) ** 2).mean() / (x ** 2).mean())
           for f in ["q4_0", "q4_k", "q6_k", "q8_0"]}
    # same 4.5 bits per weight, but Q4_K's searched (scale, min) pairs beat Q4_0's absmax scale
    assert rel["q4_k"] < 0.85 * rel["q4_0"], rel
    assert rel["q6_k"] < rel["q4_k"] / 8 and rel["q8_0"] < rel["q6_k"], rel


def test_q4_k_scale_packing_matches_gguf_unpacking():
    g = torch.Generator().manual_seed(7)
    ls = torch.randint(0, 64, (32, 8), generator=g, dtype=torch.int32)
    lm = torch.randint(0, 64, (32, 8), generator=g, dtype=torch.int32)
    packed = _pack_k4_scales(ls, lm)
    sc, m = gguf.quants.Q4_K.get_scale_min(packed.numpy())
    assert np.array_equal(sc, ls.numpy()) and np.array_equal(m, lm.numpy())


def test_describe_k_blocks_by_hand():
    x = torch.randn(256, generator=torch.Generator().manual_seed(11))
    i4 = describe_block(quantize_q4_k(x), "q4_k")
    assert len(i4["hex"].split()) == 144 and len(i4["codes"]) == 256
    assert all(0 <= c <= 15 for c in i4["codes"]) and all(0 <= s <= 63 for s in i4["scales"] + i4["mins"])
    assert max(i4["scales"]) == 63                              # the largest sub-block scale sets d = max / 63
    expect = [np.float32(i4["d"] * i4["scales"][j // 32]) * np.float32(i4["codes"][j])
              - np.float32(i4["dmin"] * i4["mins"][j // 32]) for j in range(256)]
    assert np.allclose(expect, i4["values"], atol=1e-6)
    i6 = describe_block(quantize_q6_k(x), "q6_k")
    assert len(i6["hex"].split()) == 210 and all(0 <= c <= 63 for c in i6["codes"])
    assert 128 in [abs(s) for s in i6["scales"]] or -128 in i6["scales"]   # the largest |scale| maps to -128
    expect = [i6["d"] * i6["scales"][j // 16] * (i6["codes"][j] - 32) for j in range(256)]
    assert np.allclose(expect, i6["values"], atol=1e-6)


def test_zero_super_blocks():
    assert quantize_q6_k(torch.zeros(256)).abs().sum() == 0                 # ggml zeroes the whole block
    assert dequantize_q4_k(quantize_q4_k(torch.zeros(2, 256))).abs().sum() == 0
    assert dequantize_q6_k(torch.zeros(210, dtype=torch.uint8)).abs().sum() == 0


def test_k_quant_bad_input():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q4_k(torch.randn(4, 128))
    with pytest.raises(ValueError, match="NaN"):
        quantize_q6_k(torch.full((256,), float("nan")))
    with pytest.raises(ValueError, match="144 bytes"):
        dequantize_q4_k(torch.zeros(145, dtype=torch.uint8))
    with pytest.raises(TypeError):
        dequantize_q6_k(torch.zeros(210))
    with pytest.raises(ValueError, match="fmt must be one of"):
        gguf_quantize(torch.randn(256), "q4_k_m")                # a file type (a mix), not a block format
