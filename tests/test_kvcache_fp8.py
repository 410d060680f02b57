"""Module 05: the FP8 (E4M3) KV cache, against the E4M3 definition, torch's cast and the fp32 cache."""
import pytest
import torch

from course_lib.kvcache import ContiguousCache, FP8Cache, fp8_kv_dequantize, fp8_kv_quantize
from course_lib.models import load

E4M3 = getattr(torch, "float8_e4m3fn", None)
pytestmark = pytest.mark.skipif(E4M3 is None, reason="this torch has no float8_e4m3fn")


def e4m3_table():
    """All 256 E4M3 (fn) values from the bit layout (OCP FP8 / Micikevicius et al. 2022): sign, 4 exponent
    bits (bias 7), 3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN; no infinities."""
    vals = []
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            vals.append(float("nan"))
            continue
        mag = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        vals.append(-mag if s else mag)
    return torch.tensor(vals, dtype=torch.float64)


def test_torch_e4m3_cast_matches_the_bit_definition():
    table = e4m3_table()
    got = torch.arange(256, dtype=torch.uint8).view(E4M3).double()
    nan = table.isnan()
    assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan], table[~nan])
    assert table[~nan].max() == 448


@pytest.mark.parametrize("scales", ["token", "head"])
def test_round_trip_is_nearest_e4m3_value_and_within_2_to_minus_4(scales):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, 16, generator=g) * torch.logspace(-3, 3, 16)   # channels over six decades
    scale = None
    if scales == "head":
        amax = x.abs().amax(dim=(0, 2, 3), keepdim=True)
        scale = amax / 448
    data, s = fp8_kv_quantize(x, scale)
    assert data.dtype == E4M3 and data.shape == x.shape
    assert s.shape == ((2, 3, 40, 1) if scales == "token" else (1, 3, 1, 1))
    # the element oracle: every code is the E4M3 value nearest x / scale (no ties among random floats)
    grid = e4m3_table()
    grid = grid[~grid.isnan()].unique()
    y = (x.double() / s.double()).clamp(-448, 448)
    nearest = grid[(y[..., None] - grid).abs().argmin(-1)]
    assert torch.equal(data.double(), nearest)
    # relative error <= 2^-4 (half of the 2^-3 step) where x / scale is normal (>= 2^-6); below, the
    # subnormal step 2^-9 of the scale bounds the absolute error by half of it
    x_hat = fp8_kv_dequantize(data, s)
    err = (x_hat - x).abs()
    normal = y.abs() >= 2.0 ** -6
    assert normal.float().mean() > 0.5
    assert (err[normal] <= (2.0 ** -4 + 1e-6) * x.abs()[normal]).all()
    assert (err[~normal] <= (2.0 ** -10 + 1e-6) * s.expand_as(x)[~normal]).all()
    assert (err / x.abs()).max() > 2.0 ** -6      # the bound is not slack by orders of magnitude


def test_scale_edge_cases():
    x = torch.zeros(1, 2, 3, 8)
    x[0, 1, 0] = torch.linspace(-1e30, 1e30, 8)        # very large magnitudes
    x[0, 1, 1] = torch.linspace(-1e-30, 1e-30, 8)      # very small (normal in fp32)
    x[0, 1, 2] = 3.0                                    # constant row: every element is the amax
    data, s = fp8_kv_quantize(x)
    assert torch.equal(s[0, 0], torch.ones(3, 1))       # all-zero rows: scale 1, zeros back exactly
    x_hat = fp8_kv_dequantize(data, s)
    assert torch.isfinite(x_hat).all() and torch.equal(x_hat[0, 0], x[0, 0])
    nz = x != 0
    assert ((x_hat - x).abs()[nz] <= 2.0 ** -4 * x.abs()[nz]).all()
    torch.testing.assert_close(s[0, 1, :, 0], torch.tensor([1e30, 1e-30, 3.0]) / 448)
    torch.testing.assert_close(x_hat[0, 1, 2], x[0, 1, 2])   # the amax maps to 448, exact up to fp32 rounding


def test_per_head_scale_is_fixed_by_the_first_update_and_saturates():
    c = FP8Cache("head")
    k0 = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(1))
    c.update(k0, k0.clone(), 0)
    scale = c.layers[0].k_scale.clone()
    torch.testing.assert_close(scale[0, :, 0, 0], k0.abs().amax(dim=(0, 2, 3)) / 448)
    big = 10 * k0[:, :, :1]                                    # a later token 10x outside the calibrated range
    k_all, _ = c.update(big, big, 0)
    assert torch.equal(c.layers[0].k_scale, scale)             # the scale did not move
    assert torch.isfinite(k_all).all()
    top = 448 * scale.expand_as(big)
    torch.testing.assert_close(k_all[:, :, -1].abs().max(), top.max())   # saturated at 448 x scale
    assert (k_all[:, :, -1].abs() <= top[:, :, 0] * (1 + 1e-6)).all()


@pytest.mark.parametrize("scales", ["token", "head"])
def test_memory_is_one_byte_per_element_plus_scales(scales):
    B, K, Dh, L = 2, 3, 16, 2
    c = FP8Cache(scales)
    for t in (7, 1, 1, 4):
        for layer in range(L):
            c.update(torch.randn(B, K, t, Dh), torch.randn(B, K, t, Dh), layer)
    S = 13
    assert c.get_seq_length() == S and c.stored_length(1) == S
    scale_bytes = 2 * B * K * S * 4 if scales == "token" else 2 * K * 4          # K and V, float32
    assert c.nbytes() == L * (2 * B * K * S * Dh + scale_bytes)
    full = ContiguousCache()
    full.update(torch.randn(B, K, S, Dh), torch.randn(B, K, S, Dh), 0)
    if scales == "token":    # against fp32: (Dh + 4) / (4 Dh) exactly
        assert c.nbytes() / L / full.nbytes() == (Dh + 4) / (4 * Dh)


@pytest.mark.parametrize("scales", ["token", "head"])
def test_attention_output_close_to_the_fp32_cache(scales):
    g = torch.Generator().manual_seed(2)
    B, H, K, Dh = 1, 4, 2, 32
    ref, c = ContiguousCache(), FP8Cache(scales)
    worst = 0.0
    for t in (24, 1, 1, 1):
        q, k, v = (torch.randn(B, n, t, Dh, generator=g) for n in (H, K, K))
        if t == 1:   # decode tokens inside the prompt's range: per-head scales saturate outside it (tested above)
            k, v = 0.5 * k, 0.5 * v
        mask = None if t == 1 else torch.ones(t, t).tril().bool()
        want = ref.attend(q, k, v, 0, mask)
        got = c.attend(q, k, v, 0, mask)
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    assert 0 < worst < 2.0 ** -4


def test_fp8_logits_close_to_the_fp32_cache_in_the_model():
    model, _ = load("tiny", device="cpu")
    ids = torch.randint(1, 2048, (1, 40), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        full = model(ids, cache=ContiguousCache())
        fp8 = model(ids, cache=FP8Cache("token"))
    err = (fp8 - full).abs().max().item()
    assert 0 < err < 0.05 * full.abs().max().item()      # measured: 0.38 of 13.3 (2.9%)


def test_bad_arguments_are_refused():
    for bad in ("tensor", "channel", None, 1):
        with pytest.raises(ValueError, match="scales must be one of 'token', 'head'"):
            FP8Cache(bad)
    c = FP8Cache()
    c.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), 0)
    with pytest.raises(ValueError, match="layer 0 holds"):
        c.update(torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8), 0)
    with pytest.raises(ValueError, match="in order"):
        c.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), 2)
    with pytest.raises(ValueError, match="finite|NaN|inf"):
        c.update(torch.full((1, 2, 1, 8), float("nan")), torch.randn(1, 2, 1, 8), 1)
