"""absmax / zero-point quantization: the lecture notes' worked examples, granularities, bounds, bad input,
error metrics, outliers and clipping."""
import math

import pytest
import torch

from course_lib.quant import (DB_PER_BIT, absmax_quantize, fake_quantize, mse, percentile_clip_ratio, qrange,
                              quantize, search_clip_ratio, sqnr_db, zeropoint_quantize)
from course_lib.quant.core import dequantize, dequantize_codes
from course_lib.quant.metrics import error_report, max_error


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


# --- the lecture notes' worked examples ---------------------------------------------------------------
def test_absmax_worked_example():
    # absmax 3.2, INT8: 0.1 -> round(0.1 * 127 / 3.2) = 4 -> 4 * 3.2 / 127 = 0.1008 (error 0.0008)
    q = absmax_quantize(torch.tensor([0.1, 3.2, -2.0]), bits=8)
    assert q.codes[0].item() == 4
    assert q.codes[1].item() == 127
    assert math.isclose(q.scale.item(), 3.2 / 127, rel_tol=1e-6)
    x_hat = q.dequantize()
    assert round(x_hat[0].item(), 4) == 0.1008
    assert round(x_hat[0].item() - 0.1, 4) == 0.0008   # the notes say "an error of 0.008": 10x too big


def test_zeropoint_worked_example():
    # max 3.2, min -3.0: steps per unit 255 / 6.2 = 41.13 (our scale is the step size, its inverse),
    # zero point -round(41.13 * -3.0) - 128 = 123 - 128 = -5, and 0.1 -> round(41.13 * 0.1 - 5) = -1
    q = zeropoint_quantize(torch.tensor([0.1, 3.2, -3.0]), bits=8)
    assert round(1 / q.scale.item(), 2) == 41.13
    assert q.zero_point.item() == -5
    assert q.codes.tolist() == [-1, 127, -128]
    assert q.dequantize()[0].item() == pytest.approx((-1 + 5) * 6.2 / 255, rel=1e-6)


# --- ranges, bounds, granularity ----------------------------------------------------------------------
@pytest.mark.parametrize("bits", range(2, 9))
def test_code_ranges_and_error_bound(bits):
    x = rand(16, 64, seed=bits)
    qa = absmax_quantize(x, bits)
    lo, hi = qrange(bits, symmetric=True)
    assert (lo, hi) == (-(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1)
    assert qa.codes.dtype == torch.int8 and int(qa.codes.min()) >= lo and int(qa.codes.max()) <= hi
    assert int(qa.codes.abs().max()) == hi          # the absmax element lands on the end code
    assert float((qa.dequantize() - x).abs().max()) <= qa.scale.item() / 2 * (1 + 1e-5)
    qz = zeropoint_quantize(x, bits)
    assert qrange(bits, symmetric=False) == (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    assert int(qz.codes.min()) == -(2 ** (bits - 1)) and int(qz.codes.max()) == 2 ** (bits - 1) - 1
    assert float((qz.dequantize() - x).abs().max()) <= qz.scale.item() / 2 * (1 + 1e-4) + 1e-7


def _naive(x, bits, scheme, blocks):
    """Independent reference: quantize each list of element indices on its own, in float64 Python."""
    out = x.clone().double()
    flat = out.reshape(-1)
    for idx in blocks:
        v = flat[idx]
        if scheme == "absmax":
            qmax = 2 ** (bits - 1) - 1
            s = v.abs().max().item() / qmax
            flat[idx] = (torch.round(v / s).clamp(-qmax, qmax) * s) if s > 0 else v * 0
        else:
            qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
            lo, hi = min(v.min().item(), 0.0), max(v.max().item(), 0.0)
            s = (hi - lo) / (qmax - qmin)
            z = qmin - round(lo / s)
            flat[idx] = (torch.round(v / s) + z).clamp(qmin, qmax).sub(z) * s
    return out


@pytest.mark.parametrize("scheme", ["absmax", "zeropoint"])
def test_granularities_match_a_naive_loop(scheme):
    x = rand(6, 12, dtype=torch.float64, seed=3)
    ids = torch.arange(72).reshape(6, 12)
    cases = [
        (dict(granularity="tensor"), [ids.reshape(-1)], (1, 1)),
        (dict(granularity="channel", axis=0), [ids[i] for i in range(6)], (6, 1)),
        (dict(granularity="channel", axis=1), [ids[:, j] for j in range(12)], (1, 12)),
        (dict(granularity="group", axis=-1, group_size=4),
         [ids[i, k:k + 4] for i in range(6) for k in range(0, 12, 4)], (6, 3)),
        (dict(granularity="group", axis=0, group_size=3),
         [ids[k:k + 3, j] for j in range(12) for k in range(0, 6, 3)], (2, 12)),
    ]
    for kw, blocks, scale_shape in cases:
        q = quantize(x, 3, scheme, **kw)
        assert tuple(q.scale.shape) == scale_shape, kw
        if q.zero_point is not None:
            assert q.zero_point.shape == q.scale.shape
        assert torch.allclose(q.dequantize(), _naive(x, 3, scheme, blocks), atol=1e-12), kw


def test_group_of_whole_row_equals_per_channel():
    x = rand(8, 32, seed=4)
    a = absmax_quantize(x, 4, "group", axis=1, group_size=32)
    b = absmax_quantize(x, 4, "channel", axis=0)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)


def test_three_dimensional_groups():
    x = rand(2, 3, 8, seed=5)
    q = zeropoint_quantize(x, 4, "group", axis=1, group_size=3)
    assert tuple(q.scale.shape) == (2, 1, 8)
    q = zeropoint_quantize(x, 4, "group", axis=-1, group_size=4)
    assert tuple(q.scale.shape) == (2, 3, 2)
    assert torch.allclose(dequantize_codes(q.codes, q.scale, q.zero_point), q.dequantize())


def test_finer_granularity_is_never_worse_here():
    x = rand(64, 256, seed=6)
    errs = [mse(x, fake_quantize(x, 4, granularity="tensor")),
            mse(x, fake_quantize(x, 4, granularity="channel")),
            mse(x, fake_quantize(x, 4, granularity="group", group_size=32))]
    assert errs[0] > errs[1] > errs[2]


def test_zero_is_exact_in_zeropoint_and_range_includes_it():
    x = torch.rand(100, generator=torch.Generator().manual_seed(7)) + 1.0   # all positive
    q = zeropoint_quantize(x, 4)
    assert q.zero_point.item() == -8                # lo = 0 maps to qmin
    x2 = torch.cat([x, torch.zeros(3)])
    q2 = zeropoint_quantize(x2, 4)
    assert torch.all(q2.dequantize()[-3:] == 0)


def test_dtypes_kept():
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        x = rand(4, 8, seed=8).to(dt)
        q = absmax_quantize(x, 8)
        assert q.dequantize().dtype == dt
        assert q.scale.dtype == (torch.float64 if dt == torch.float64 else torch.float32)
    assert absmax_quantize(rand(4, 8), 8).dequantize(torch.float16).dtype == torch.float16


# --- all zeros and bad input --------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["absmax", "zeropoint"])
def test_all_zero_inputs(scheme):
    x = torch.zeros(4, 8)
    q = quantize(x, 4, scheme)
    assert q.scale.item() == 0
    assert torch.equal(q.dequantize(), x) and not torch.isnan(q.dequantize()).any()
    y = rand(4, 8, seed=9)
    y[1] = 0                                         # one all-zero channel among normal ones
    q = quantize(y, 4, scheme, granularity="channel")
    assert q.scale[1].item() == 0 and torch.all(q.dequantize()[1] == 0)
    assert not torch.isnan(q.dequantize()).any()


def test_bad_input():
    x = rand(4, 8)
    for bits in (1, 9, 0, 16):
        with pytest.raises(ValueError, match="bits"):
            absmax_quantize(x, bits)
    for bits in (4.0, True, "4"):
        with pytest.raises(TypeError, match="bits"):
            absmax_quantize(x, bits)
    with pytest.raises(ValueError, match="group_size=3 does not divide"):
        absmax_quantize(x, 4, "group", group_size=3)
    with pytest.raises(ValueError, match="group_size"):
        absmax_quantize(x, 4, "group")
    with pytest.raises(ValueError, match="axis"):
        absmax_quantize(x, 4, "channel", axis=2)
    with pytest.raises(ValueError, match="granularity"):
        absmax_quantize(x, 4, "row")
    with pytest.raises(ValueError, match="scheme"):
        quantize(x, 4, "minmax")
    for r in (0.0, 1.5, -1):
        with pytest.raises(ValueError, match="clip_ratio"):
            absmax_quantize(x, 4, clip_ratio=r)
    with pytest.raises(TypeError, match="x must be a real floating-point"):
        absmax_quantize(torch.arange(8), 4)
    with pytest.raises(TypeError, match="x must be a real floating-point"):
        zeropoint_quantize(torch.ones(4, dtype=torch.complex64), 4)
    with pytest.raises(TypeError, match="x must be a real floating-point"):
        zeropoint_quantize(torch.ones(4, dtype=torch.bool), 4)
    with pytest.raises(TypeError, match="torch.Tensor"):
        absmax_quantize([0.1, 0.2], 4)
    with pytest.raises(ValueError, match="x is empty"):
        absmax_quantize(torch.empty(0, 8), 4)
    y = x.clone()
    y[0, 0], y[1, 1], y[2, 2] = float("nan"), float("inf"), -float("inf")
    with pytest.raises(ValueError, match=r"x contains 1 NaN and 2 Inf"):
        zeropoint_quantize(y, 8)
    with pytest.raises(TypeError):
        dequantize(x)


# --- metrics ------------------------------------------------------------------------------------------
def test_metrics_known_values():
    x = rand(1000, seed=10, dtype=torch.float64)
    x_hat = x * 1.1                                  # noise = 0.01 * signal power -> exactly 20 dB
    assert sqnr_db(x, x_hat) == pytest.approx(20.0, abs=1e-9)
    assert mse(x, x_hat) == pytest.approx(float((0.1 * x.double()) .pow(2).mean()), rel=1e-12)
    assert max_error(x, x_hat) == pytest.approx(float(0.1 * x.double().abs().max()), rel=1e-6)
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(torch.zeros(3), torch.ones(3)) == -math.inf
    rep = error_report(x, x_hat)
    assert set(rep) == {"mse", "rmse", "max_error", "sqnr_db", "rel_rmse"}
    assert rep["rel_rmse"] == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(ValueError, match="same shape"):
        mse(x, x[:10])
    with pytest.raises(ValueError, match="empty"):
        sqnr_db(torch.empty(0), torch.empty(0))


def test_six_db_per_bit():
    x = torch.rand(20000, generator=torch.Generator().manual_seed(11)) * 2 - 1   # uniform: no clipping effects
    s = {b: sqnr_db(x, fake_quantize(x, b, "zeropoint")) for b in range(2, 9)}
    slopes = [s[b + 1] - s[b] for b in range(4, 8)]
    assert all(abs(v - DB_PER_BIT) < 0.3 for v in slopes), slopes


# --- outliers and clipping ----------------------------------------------------------------------------
def test_one_outlier_ruins_per_tensor_not_per_group():
    w = rand(64, 256, seed=12) * 0.02
    w_out = w.clone()
    w_out[3, 17] = 2.0                               # one value 100x the std
    others = torch.ones_like(w, dtype=torch.bool)
    others[3, 17] = False                            # judge what the outlier does to all the *other* weights

    def sqnr_others(x, **kw):
        return sqnr_db(x[others], fake_quantize(x, 4, **kw)[others])

    g = dict(granularity="group", group_size=64)
    assert sqnr_others(w) - sqnr_others(w_out) > 15          # per tensor: the grid got ~20x coarser for all
    assert sqnr_others(w, **g) - sqnr_others(w_out, **g) < 2    # per group: only 63 weights share the damage
    outside = torch.ones_like(others)
    outside[3, 0:64] = False                                     # the outlier's group
    assert torch.equal(fake_quantize(w, 4, **g)[outside], fake_quantize(w_out, 4, **g)[outside])


def test_percentile_and_search_clipping():
    x = rand(64, 256, seed=13)
    r = percentile_clip_ratio(x, 99.0)
    assert 0 < r < 1 and r == pytest.approx(float(torch.quantile(x.abs().reshape(-1), 0.99) / x.abs().max()),
                                              rel=1e-5)
    rg = percentile_clip_ratio(x, 99.0, "group", group_size=64)
    assert rg.shape == (64, 4)
    best, ratios, curve = search_clip_ratio(x, bits=3)
    assert ratios[-1] == 1.0 and best < 1.0
    assert curve.min() <= curve[-1]
    assert mse(x, fake_quantize(x, 3, clip_ratio=best)) == pytest.approx(float(curve.min()), rel=1e-9)
    per, _, _ = search_clip_ratio(x, bits=3, granularity="group", group_size=64, per_scale=True)
    assert per.shape == (64, 4)
    shared, _, c2 = search_clip_ratio(x, bits=3, granularity="group", group_size=64)
    m_per = mse(x, fake_quantize(x, 3, granularity="group", group_size=64, clip_ratio=per))
    assert m_per <= float(c2.min()) + 1e-12
    with pytest.raises(ValueError):
        search_clip_ratio(x, grid=[0.0, 0.5])
    with pytest.raises(ValueError):
        percentile_clip_ratio(x, 0)


# --- devices --------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["absmax", "zeropoint"])
def test_quantization_stays_on_the_data_device(device, scheme):
    """Codes, scales and the dequantized tensor stay on the input's device, with the CPU's error there
    (a code may round the other way at an exact .5 on another device: compare errors, not codes)."""
    from course_lib.quant.nf4 import nf4_dequantize, nf4_quantize
    x = rand(64, 256, seed=21).to(device)
    for kw in (dict(), dict(granularity="group", group_size=64)):
        q = quantize(x, 4, scheme, **kw)
        assert q.codes.device == q.scale.device == x.device
        assert q.zero_point is None or q.zero_point.device == x.device
        err = mse(x, q.dequantize())
        assert q.dequantize().device == x.device
        assert err == pytest.approx(mse(x.cpu(), quantize(x.cpu(), 4, scheme, **kw).dequantize()), rel=1e-3)
    best, ratios, curve = search_clip_ratio(x, bits=3, scheme=scheme, granularity="group", group_size=64,
                                            per_scale=True)
    assert best.device == x.device and best.shape == (64, 4)          # per-scale answer: on the data's device
    assert ratios.device.type == curve.device.type == "cpu"            # the grid and its curve: a host table
    assert mse(x, fake_quantize(x, 3, scheme, "group", group_size=64, clip_ratio=best)) <= float(curve.min()) + 1e-9
    n = nf4_quantize(x, double_quant=True)
    assert n.packed.device == x.device and nf4_dequantize(n).device == x.device


def test_gptq_cholesky_rows_are_the_restricted_inverse_ratios():
    """quant/gptq.py's docstring: row j of U (H^-1 = U^T U) is row j of H_F^-1 (F = the columns from j on)
    divided by sqrt([H_F^-1]_jj); the full inverse's entries are not what the update uses."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 8, generator=g, dtype=torch.float64)
    h = 2 * x.T @ x
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    full = torch.linalg.inv(h)
    for j in range(8):
        hf = torch.linalg.inv(h[j:, j:])
        assert torch.allclose(u[j, j] ** 2, hf[0, 0])
        assert torch.allclose(u[j, j:] / u[j, j], hf[0] / hf[0, 0])
        # earlier columns quantized changed the problem: the full inverse's ratios differ (the last row is [1])
        if 0 < j < 7:
            assert not torch.allclose(full[j, j:] / full[j, j], hf[0] / hf[0, 0])
