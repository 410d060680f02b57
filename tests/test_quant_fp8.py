"""FP8 E4M3 / E5M2 with per-tensor and per-row scales; the FP8 linear (reference, and torch._scaled_mm on GPU)."""
import pytest
import torch

from course_lib.quant import representable_values
from course_lib.quant.fp8 import FP8_MAX, FP8Linear, fp8_dequantize, fp8_error_rows, fp8_quantize, scaled_mm_available

FMTS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["tensor", "row"])
def test_codes_are_a_nearest_grid_point_and_amax_maps_to_max(fmt, gran):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=g) * torch.logspace(-2, 2, 16)[:, None]
    x[3] = 0                                                    # an all-zero row
    q = fp8_quantize(x, fmt, gran)
    assert q.data.dtype == {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    assert q.scale.shape == ((1, 1) if gran == "tensor" else (16, 1))
    grid = representable_values(FMTS[fmt])                      # module 02's table of all fp8 values (oracle)
    y = (x.double() / q.scale.double()).reshape(-1, 1)          # the values the cast rounded
    d = q.data.double().reshape(-1, 1)
    assert bool(torch.isin(d, grid).all())
    nearest = (y - grid[None]).abs().amin(dim=1, keepdim=True)
    assert bool(((y - d).abs() <= nearest + 1e-12).all()), "a code is not the nearest representable value"
    amax = q.data.double().abs().amax(dim=1)
    if gran == "row":
        nz = x.abs().amax(dim=1) > 0
        assert bool((amax[nz] == FP8_MAX[fmt]).all()) and amax[3] == 0
    else:
        assert float(amax.max()) == FP8_MAX[fmt]
    assert torch.equal(fp8_dequantize(q), q.dequantize())
    assert fp8_dequantize(q)[3].abs().sum() == 0


def test_relative_error_bound_per_element():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    for fmt, m_bits, min_sub in (("e4m3", 3, 2.0 ** -9), ("e5m2", 2, 2.0 ** -16)):
        q = fp8_quantize(x, fmt, "row")
        err = (q.dequantize() - x).abs()
        bound = 2.0 ** -(m_bits + 1) * x.abs() + q.scale * min_sub / 2 + 1e-12     # half a step, relative
        assert bool((err <= bound).all()), fmt


def test_fp8_vs_int8_errors():
    g = torch.Generator().manual_seed(2)
    gauss = fp8_error_rows(torch.randn(256, 512, generator=g))
    z = torch.randn(3, 256, 512, generator=g)
    heavy = fp8_error_rows(z[0] / (z[1] ** 2 / 2 + z[2] ** 2 / 2).sqrt())      # Student t, 2 degrees of freedom

    def db(rows, fmt, gran):
        return next(r["sqnr_db"] for r in rows if r["format"] == fmt and r["granularity"] == gran)
    # a bell-shaped tensor: int8's uniform grid has more levels where the values are
    assert db(gauss, "int8", "row") > db(gauss, "fp8 e4m3", "row") + 5
    # heavy tails with one scale: int8's step is set by the outliers, fp8's relative step is not
    assert db(heavy, "fp8 e4m3", "tensor") > db(heavy, "int8", "tensor") + 10
    # fp8's SQNR hardly depends on the distribution; E5M2 has one mantissa bit less: ~6 dB worse
    assert abs(db(gauss, "fp8 e4m3", "tensor") - db(heavy, "fp8 e4m3", "tensor")) < 3
    assert 4 < db(gauss, "fp8 e4m3", "row") - db(gauss, "fp8 e5m2", "row") < 8


@pytest.mark.parametrize("act", [None, "tensor", "row"])
@pytest.mark.parametrize("gran", ["tensor", "row"])
def test_fp8_linear_reference(act, gran):
    g = torch.Generator().manual_seed(3)
    lin = torch.nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=g) * 0.1)
    x = torch.randn(2, 5, 64, generator=g)
    f = FP8Linear.from_linear(lin, "e4m3", gran, act, backend="reference")
    w = fp8_quantize(lin.weight.detach(), "e4m3", gran).dequantize()
    xs = x if act is None else fp8_quantize(x.reshape(-1, 64), "e4m3", act).dequantize().reshape(x.shape)
    expect = xs @ w.t() + lin.bias.detach()
    y = f(x)
    assert y.shape == (2, 5, 48) and torch.allclose(y, expect, atol=1e-5, rtol=1e-5)
    ref = lin(x).detach()
    assert float((y - ref).norm() / ref.norm()) < 0.06
    assert f.weight.element_size() == 1


def test_fp8_bad_input():
    with pytest.raises(ValueError, match="fmt"):
        fp8_quantize(torch.randn(4, 4), "e3m4")
    with pytest.raises(ValueError, match="granularity"):
        fp8_quantize(torch.randn(4, 4), "e4m3", "group")
    with pytest.raises(ValueError, match="NaN"):
        fp8_quantize(torch.full((4, 4), float("nan")))
    with pytest.raises(TypeError):
        FP8Linear.from_linear(torch.nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="in_features"):
        FP8Linear.from_linear(torch.nn.Linear(8, 4))(torch.randn(2, 6))
    if not scaled_mm_available():
        with pytest.raises(RuntimeError, match="scaled_mm"):
            FP8Linear.from_linear(torch.nn.Linear(16, 16), backend="scaled_mm")(torch.randn(2, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("act,gran", [("tensor", "tensor"), ("row", "row"), ("tensor", "row")])
def test_scaled_mm_matches_reference_on_gpu(act, gran):
    if not scaled_mm_available("cuda"):
        pytest.skip("torch._scaled_mm needs compute capability >= 8.9")
    g = torch.Generator(device="cuda").manual_seed(4)
    lin = torch.nn.Linear(256, 128, device="cuda")
    x = torch.randn(32, 256, device="cuda", generator=g)
    fast = FP8Linear.from_linear(lin, "e4m3", gran, act, backend="scaled_mm")
    ref = FP8Linear.from_linear(lin, "e4m3", gran, act, backend="reference")
    y, r = fast(x), ref(x)
    assert torch.allclose(y, r, rtol=2e-2, atol=2e-2 * float(r.abs().max())), float((y - r).abs().max())
