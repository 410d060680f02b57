"""GGUF Q8_0 / Q4_0: byte-exact against the gguf package's reference quantizers, plus the layout rules."""
import numpy as np
import pytest
import torch

from course_lib.quant import (describe_block, dequantize_q4_0, dequantize_q8_0, gguf_dequantize, gguf_quantize,
                              quantize_q4_0, quantize_q8_0)

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402

TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def _inputs():
    g = torch.Generator().manual_seed(0)
    yield "normal", torch.randn(16, 256, generator=g)
    yield "small-scale", torch.randn(4, 96, generator=g) * 1e-3
    yield "3-D", torch.randn(2, 3, 64, generator=g) * 5
    yield "uniform", torch.rand(8, 128, generator=g) * 2 - 1
    z = torch.randn(4, 128, generator=g)
    z[0] = 0
    z[2, 32:64] = 0
    yield "all-zero blocks", z
    h = torch.randn(4, 128, generator=g) * 0.01
    h[0, 5] = 1000.0                                        # one huge value in a block
    h[1, 40] = -3000.0                                      # ... negative (Q4_0: d > 0)
    h[2, 70] = 20000.0
    yield "one huge value", h
    t = torch.zeros(1, 32)
    t[0, :8] = torch.tensor([127.0, 0.5, 1.5, -2.5, -0.5, 63.5, -126.5, 2.5])   # exact .5 ties for Q8_0
    yield "ties", t
    s = torch.randn(2, 64, generator=g)
    s[0, 3], s[0, 9] = 2.0, -2.0                             # +-max tie: the first one wins
    yield "sign tie", s


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_bit_exact_against_gguf(fmt):
    for name, x in _inputs():
        ours = gguf_quantize(x, fmt)
        ref = ref_quantize(x.numpy(), TYPES[fmt])
        assert ours.dtype == torch.uint8 and tuple(ours.shape) == ref.shape, name
        assert np.array_equal(ours.numpy(), ref), f"{fmt} bytes differ on {name}"
        ours_dq = gguf_dequantize(torch.from_numpy(ref), fmt)
        assert np.array_equal(ours_dq.numpy(), ref_dequantize(ref, TYPES[fmt])), name


def test_block_sizes_and_bits_per_weight():
    x = torch.randn(3, 64)
    assert quantize_q8_0(x).shape == (3, 2 * 34)
    assert quantize_q4_0(x).shape == (3, 2 * 18)
    assert 34 * 8 / 32 == 8.5 and 18 * 8 / 32 == 4.5


def test_q4_0_layout_by_hand():
    x = torch.zeros(32)
    x[0], x[16], x[31] = -8.0, 4.0, 7.0                     # largest magnitude -8 -> d = -8 / -8 = 1
    block = quantize_q4_0(x)
    info = describe_block(block, "q4_0")
    assert info["d"] == 1.0
    assert block[:2].tolist() == [0x00, 0x3C]               # fp16 1.0 = 0x3C00, little-endian
    # element 0 (code 0) in the low nibble of byte 0, element 16 (code 12) in its high nibble
    assert block[2].item() == 0 | (12 << 4)
    assert block[2 + 15].item() == 8 | (15 << 4)            # element 15 is 0 -> 8, element 31 is 7 -> 15
    assert info["codes"][0] == 0 and info["codes"][16] == 12 and info["codes"][31] == 15
    assert dequantize_q4_0(block).tolist() == x.tolist()
    neg = quantize_q4_0(-x)                                 # largest magnitude now +8 -> d = -1
    assert describe_block(neg, "q4_0")["d"] == -1.0


def test_q8_0_layout_and_zero_block():
    x = torch.zeros(32)
    x[1] = 2.54                                             # d = 0.02; fp16 rounding of d shows in the decode
    b = quantize_q8_0(x)
    info = describe_block(b, "q8_0")
    assert info["codes"][1] == 127 and info["d"] == float(torch.tensor(2.54 / 127).half())
    assert len(info["hex"].split()) == 34
    z = quantize_q8_0(torch.zeros(2, 32))
    assert z.abs().sum() == 0 and dequantize_q8_0(z).abs().sum() == 0
    z4 = quantize_q4_0(torch.zeros(32))
    # d = 0 / -8 = -0.0; codes 8 = zero
    assert z4[:2].tolist() == [0x00, 0x80] and all(v == 0x88 for v in z4[2:].tolist())
    assert dequantize_q4_0(z4).abs().sum() == 0


def test_gguf_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(torch.randn(4, 40))
    with pytest.raises(ValueError, match="NaN"):
        quantize_q4_0(torch.full((32,), float("nan")))
    with pytest.raises(ValueError, match="overflows fp16"):
        quantize_q8_0(torch.full((32,), 1e7))
    with pytest.raises(ValueError, match="overflows fp16"):
        quantize_q4_0(torch.full((32,), 6e5))
    with pytest.raises(TypeError):
        quantize_q8_0(torch.ones(32, dtype=torch.int32))
    with pytest.raises(ValueError, match="34 bytes"):
        dequantize_q8_0(torch.zeros(33, dtype=torch.uint8))
    with pytest.raises(TypeError):
        dequantize_q4_0(torch.zeros(18))
    with pytest.raises(ValueError):
        gguf_quantize(torch.randn(32), "q4_k")


def test_a_format_is_one_record_in_one_registry():
    """Adding a format is adding one GGUFFormat: quantize, dequantize, bits per weight, describe_block and the
    memory table all follow from it (here a toy format: int8 codes with an fp32 scale per 16 values)."""
    import course_lib.quant.gguf as G
    from course_lib.quant.memory import WeightFormat

    def quantize(x):
        b = x.to(torch.float32).reshape(-1, 16)
        d = b.abs().amax(1, keepdim=True) / 127
        q = torch.round(b / torch.where(d == 0, torch.ones_like(d), d)).to(torch.int8)
        out = torch.cat([d.view(torch.uint8), q.view(torch.uint8)], dim=1)        # 4 + 16 bytes
        return out.reshape(*x.shape[:-1], x.shape[-1] // 16 * 20)

    def unpack(b):
        return {"d": b[:, :4].contiguous().view(torch.float32), "codes": b[:, 4:].contiguous().view(torch.int8)}

    toy = G.GGUFFormat("toy_i8", 16, 20, 8, quantize, unpack, lambda f: f["codes"].float() * f["d"], "toy")
    G.register_format(toy)
    try:
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
        data = G.gguf_quantize(x, "toy_i8")
        assert data.shape == (3, 80) and G.gguf_bits_per_weight("toy_i8") == 10.0
        torch.testing.assert_close(G.gguf_dequantize(data, "toy_i8"), x, atol=float(x.abs().max()) / 127, rtol=0)
        info = G.describe_block(data[0, :20], "toy_i8")
        assert set(info) == {"hex", "values", "d", "codes"} and len(info["codes"]) == 16
        assert info["values"] == G.gguf_dequantize(data[0, :20], "toy_i8").tolist()
        with pytest.raises(ValueError, match="already registered"):
            G.register_format(toy)
    finally:
        del G.GGUF_FORMATS["toy_i8"]
    with pytest.raises(ValueError, match="fmt must be one of"):
        G.gguf_quantize(x, "toy_i8")
    # the memory table's GGUF rows are the records'
    from course_lib.quant.memory import WEIGHT_FORMATS
    for name, f in G.GGUF_FORMATS.items():
        w = WEIGHT_FORMATS[name]
        assert isinstance(w, WeightFormat)
        assert w.bits_per_weight == f.bits_per_weight == G.BLOCK_BYTES[name] * 8 / G.BLOCK_VALUES[name]


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_k", "q6_k"])
def test_describe_block_reads_what_the_decoder_reads(fmt):
    import course_lib.quant.gguf as G
    f = G.GGUF_FORMATS[fmt]
    x = torch.randn(2 * f.block_values, generator=torch.Generator().manual_seed(1))
    data = G.gguf_quantize(x, fmt)
    for i in range(2):
        block = data[i * f.block_bytes:(i + 1) * f.block_bytes]
        info = G.describe_block(block, fmt)
        assert info["values"] == G.gguf_dequantize(block, fmt).tolist()
        assert len(info["codes"]) == f.block_values and isinstance(info["d"], float)
