"""INT4 packing (exact round trip, the byte layout) and memory arithmetic (7B / 70B, scale overhead)."""
import pytest
import torch

from course_lib.models import LlamaConfig
from course_lib.quant import (absmax_quantize, memory_table, memory_table_markdown, pack_int4, unpack_int4,
                              weight_bytes)
from course_lib.quant.memory import GB, WEIGHT_FORMATS, WeightFormat, bits_per_weight


@pytest.mark.parametrize("order", ["low_first", "high_first"])
@pytest.mark.parametrize("signed", [True, False])
def test_round_trip_exact(order, signed):
    g = torch.Generator().manual_seed(0)
    lo, hi = (-8, 8) if signed else (0, 16)
    for shape in [(2,), (5, 64), (3, 4, 10)]:
        codes = torch.randint(lo, hi, shape, generator=g, dtype=torch.int8)
        packed = pack_int4(codes, signed=signed, order=order)
        assert packed.dtype == torch.uint8 and packed.shape == (*shape[:-1], shape[-1] // 2)
        back = unpack_int4(packed, signed=signed, order=order)
        assert back.dtype == torch.int8 and torch.equal(back, codes)
    every = torch.arange(lo, hi, dtype=torch.int64)                 # every code, other dtype in
    assert torch.equal(unpack_int4(pack_int4(every, signed, order), signed, order).long(), every)


def test_byte_layout():
    codes = torch.tensor([1, -2, 7, -8], dtype=torch.int8)
    # -2 is 0b1110 in 4-bit two's complement; element 0 in the low nibble
    assert pack_int4(codes).tolist() == [0xE1, 0x87]
    assert pack_int4(codes, order="high_first").tolist() == [0x1E, 0x78]
    assert pack_int4(torch.tensor([3, 12]), signed=False).tolist() == [0xC3]
    assert unpack_int4(torch.tensor([0xE1], dtype=torch.uint8)).tolist() == [1, -2]
    assert unpack_int4(torch.tensor([0xE1], dtype=torch.uint8), signed=False).tolist() == [1, 14]


def test_packs_real_quantized_codes_in_half_the_bytes():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    q = absmax_quantize(w, 4, "group", group_size=32)
    packed = pack_int4(q.codes)
    assert packed.numel() == q.codes.numel() // 2
    assert torch.equal(unpack_int4(packed), q.codes)


def test_packing_bad_input():
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.zeros(3, dtype=torch.int8))
    with pytest.raises(ValueError, match="-8..7"):
        pack_int4(torch.tensor([8, 0]))
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.tensor([-1, 0]), signed=False)
    with pytest.raises(TypeError, match="integer"):
        pack_int4(torch.zeros(4))
    with pytest.raises(TypeError, match="uint8"):
        unpack_int4(torch.zeros(4, dtype=torch.int8))
    with pytest.raises(ValueError, match="order"):
        pack_int4(torch.zeros(4, dtype=torch.int8), order="middle")


def test_memory_arithmetic():
    assert weight_bytes(7e9, "fp32") / GB == pytest.approx(28.0)   # the lecture notes' "28 GB" is FP32
    assert weight_bytes(7e9, "fp16") / GB == pytest.approx(14.0)
    assert weight_bytes(7e9, "int8") / GB == pytest.approx(7.0)
    assert weight_bytes(7e9, "int4") / GB == pytest.approx(3.5)
    assert bits_per_weight("int4-g128") == pytest.approx(4.125)
    assert weight_bytes(7e9, "int4-g128") / GB == pytest.approx(3.609375)
    assert weight_bytes(70e9, "int4-g128") / GB == pytest.approx(36.09375)
    assert weight_bytes(70e9, "fp16") / GB == pytest.approx(140.0)
    assert bits_per_weight(4, group_size=128, scale_bits=16) == pytest.approx(4.125)
    assert bits_per_weight(4, group_size=64, scale_bits=16, zero_point_bits=4) == pytest.approx(4 + 20 / 64)
    assert bits_per_weight("q8_0") == 8.5 and bits_per_weight("q4_0") == 4.5 and bits_per_weight("nf4") == 4.5
    assert bits_per_weight("nf4-dq") == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))   # 4.127
    rows = memory_table()
    by = {r["key"]: r for r in rows}
    assert by["fp16"]["7B"] == pytest.approx(14.0) and by["int4-g128"]["70B"] == pytest.approx(36.09375)
    md = memory_table_markdown(rows)
    assert "7B (GB)" in md and md.count("\n") == len(rows) + 2
    with pytest.raises(ValueError):
        weight_bytes(7e9, "int3")
    with pytest.raises(ValueError):
        WeightFormat("bad", 0)


def test_llama_7b_parameter_count():
    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False)
    n = cfg.num_parameters()
    assert n == 6_738_415_616
    assert weight_bytes(n, "fp16") / GB == pytest.approx(13.48, abs=0.01)
    assert set(WEIGHT_FORMATS) >= {"fp32", "fp16", "int8", "int4", "int4-g128"}
