"""Number formats: the layout arithmetic against torch.finfo, and the bit decoder against torch's own
interpretation of every FP16, BF16 and FP8 bit pattern."""
import math

import pytest
import torch

from course_lib.quant import (FORMATS, decode_bits, encode_bits, formats_table_markdown, get_format,
                              representable_values)
from course_lib.quant.formats import formats_table_rows

FLOATS = ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


@pytest.mark.parametrize("key", FLOATS)
def test_layout_numbers_match_torch_finfo(key):
    f = FORMATS[key]
    if f.torch_dtype is None:
        pytest.skip("this torch has no such dtype")
    fi = torch.finfo(f.torch_dtype)
    assert f.bits == fi.bits
    assert f.max_value == fi.max
    assert f.min_normal == fi.smallest_normal
    assert f.spacing_near_one == fi.eps
    assert f.min_subnormal == fi.smallest_normal * fi.eps  # one mantissa step at the smallest exponent
    # the smallest subnormal really is representable and half of it is not
    t = torch.tensor([f.min_subnormal, f.min_subnormal / 2.1], dtype=torch.float64).to(f.torch_dtype).double()
    assert t[0].item() == f.min_subnormal and t[1].item() == 0.0


def test_known_values():
    assert FORMATS["fp8_e4m3"].max_value == 448 and FORMATS["fp8_e5m2"].max_value == 57344
    assert FORMATS["fp16"].max_value == 65504
    assert FORMATS["int8"].min_value == -128 and FORMATS["int8"].max_value == 127
    assert FORMATS["int4"].min_value == -8 and FORMATS["int4"].max_value == 7
    assert get_format("e4m3") is FORMATS["fp8_e4m3"] and get_format("float16") is FORMATS["fp16"]


def _torch_values(key):
    f = FORMATS[key]
    n = 1 << f.bits
    pats = torch.arange(n, dtype=torch.int64)
    if f.bits == 16:
        pats = ((pats ^ 0x8000) - 0x8000).to(torch.int16)  # same bits, as signed int16
    else:
        pats = pats.to(torch.uint8)
    return pats.view(f.torch_dtype).double()


@pytest.mark.parametrize("key", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_decoder_agrees_with_torch_on_every_pattern(key):
    f = FORMATS[key]
    if f.torch_dtype is None:
        pytest.skip("this torch has no such dtype")
    ref = _torch_values(key)
    ours = torch.tensor([decode_bits(p, f).value for p in range(1 << f.bits)], dtype=torch.float64)
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    assert torch.equal(ours[ok], ref[ok])
    # signed zeros too
    assert math.copysign(1, decode_bits(1 << (f.bits - 1), f).value) == -1


def test_decoder_fp32_sample_and_fields():
    g = torch.Generator().manual_seed(0)
    pats = torch.randint(0, 2 ** 32, (3000,), generator=g, dtype=torch.int64)
    ref = ((pats ^ 0x80000000) - 0x80000000).to(torch.int32).view(torch.float32).double()
    ours = torch.tensor([decode_bits(int(p), "fp32").value for p in pats], dtype=torch.float64)
    ok = ~torch.isnan(ref)
    assert torch.equal(torch.isnan(ours), torch.isnan(ref)) and torch.equal(ours[ok], ref[ok])
    d = decode_bits(encode_bits(0.1, "fp16"), "fp16")          # 0.1 = 1.6 * 2^-4 in FP16
    assert (d.sign, d.exponent_field, d.exponent, d.mantissa_field, d.kind) == (0, 11, -4, 614, "normal")
    assert d.bitstring == "0|01011|1001100110"
    assert d.value == float(torch.tensor(0.1).half())
    assert decode_bits(0x7F, "fp8_e4m3").kind == "nan"     # S.1111.111: the only NaN of E4M3 (per sign)
    assert decode_bits(0x7E, "fp8_e4m3").value == 448
    assert decode_bits(0x7C, "fp8_e5m2").kind == "inf"
    assert decode_bits(0x01, "fp8_e4m3").kind == "subnormal"


@pytest.mark.parametrize("key", FLOATS)
def test_encode_decode_round_trip(key):
    f = FORMATS[key]
    if f.torch_dtype is None:
        pytest.skip("this torch has no such dtype")
    for v in [0.1, -1.5, 3.0, f.min_normal, f.min_subnormal, f.max_value, -f.max_value]:
        expect = torch.tensor([v], dtype=torch.float64).to(f.torch_dtype).double().item()
        assert decode_bits(encode_bits(v, f), f).value == expect


def test_representable_value_counts():
    e4m3 = representable_values("fp8_e4m3")
    e5m2 = representable_values("fp8_e5m2")
    assert e4m3.numel() == 253          # 256 patterns - 2 NaN - the duplicate zero
    assert e5m2.numel() == 247          # 256 - 6 NaN - 2 inf - duplicate zero
    assert float(e4m3.max()) == 448 and float(e5m2.max()) == 57344
    assert representable_values("int4").tolist() == list(range(-8, 8))
    assert representable_values("nf4").numel() == 16


def test_formats_table_rows_and_markdown():
    rows = formats_table_rows()
    names = [r["format"] for r in rows]
    assert names == ["FP32", "FP16", "BF16", "FP8 E4M3", "FP8 E5M2", "INT8", "INT4", "NF4"]
    by = {r["format"]: r for r in rows}
    assert by["BF16"]["layout"] == "1-8-7" and by["FP16"]["max"] == 65504
    assert by["INT4"]["min"] == -8 and by["NF4"]["max"] == 1.0
    md = formats_table_markdown(rows)
    assert md.count("\n") == len(rows) + 1 and "448" in md


def test_bad_format_arguments():
    with pytest.raises(ValueError):
        get_format("fp7")
    with pytest.raises(TypeError):
        get_format(3)
    with pytest.raises(ValueError):
        decode_bits(256, "fp8_e4m3")
    with pytest.raises(ValueError):
        decode_bits(1, "int8")
    with pytest.raises(ValueError):
        representable_values("fp32")
