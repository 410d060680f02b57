"""The quantization explorer's logic, driven the way a student drives it (set .value), without a browser."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.viz.quant import QuantExplorer, divisors, linear_weights, plot_bit_layouts  # noqa: E402


def weights():
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(48, 64, generator=g) * 0.02, "b": torch.randn(64, 86, generator=g) * 0.02}


def test_controls_drive_the_stats():
    ex = QuantExplorer(weights(), bits=4, granularity="group", group_size=16, render=False)
    s4 = ex.stats["sqnr_db"]
    ex.bits.value = 8
    assert ex.stats["sqnr_db"] > s4 + 20                    # ~6 dB per bit
    ex.bits.value = 3
    s3_group = ex.stats["sqnr_db"]
    ex.granularity.value = "tensor"
    assert ex.group_size.disabled and ex.stats["n_scales"] == 1
    assert ex.stats["sqnr_db"] < s3_group
    ex.granularity.value = "channel"
    assert ex.stats["n_scales"] == 48
    ex.scheme.value = "zeropoint"
    assert ex.stats["params"]["scheme"] == "zeropoint" and len(ex.stats["grid"]) == 8
    ex.clip.value = 0.6
    assert ex.stats["params"]["clip_ratio"] == pytest.approx(0.6) and ex.stats["saturated"] > 0
    assert "SQNR" in ex.info.value


def test_group_sizes_follow_the_matrix():
    ex = QuantExplorer(weights(), granularity="group", group_size=32, render=False)
    assert list(ex.group_size.options) == divisors(64) and ex.group_size.value == 32
    ex.matrix.value = "b"                                   # 86 = 2 * 43: 32 is no longer allowed
    assert list(ex.group_size.options) == divisors(86) == [43, 86]
    assert ex.stats["params"]["group_size"] in (43, 86) and ex.stats["shape"] == (64, 86)
    ex.group_size.value = 86
    assert ex.stats["n_scales"] == 64
    with pytest.raises(ValueError):
        QuantExplorer({"v": torch.randn(5)}, render=False)
    ex = QuantExplorer(weights(), matrix="b", group_size=32, render=False)
    assert ex.matrix.value == "b" and ex.stats["shape"] == (64, 86) and ex.group_size.value == 43
    with pytest.raises(ValueError, match="matrix"):
        QuantExplorer(weights(), matrix="c", render=False)


def test_renders_and_real_model():
    from course_lib.models import load
    model, _ = load("tiny", device="cpu")
    ws = linear_weights(model, 0)
    assert "layers.0.mlp.up_proj" in ws and ws["layers.0.mlp.up_proj"].shape == (688, 256)
    ex = QuantExplorer({"up": ws["layers.0.mlp.up_proj"]}, render=True)
    assert ex.figure_count == 1
    ex.bits.value = 2
    assert ex.figure_count == 2 and ex.stats["bits_per_weight"] > 2
    fig = plot_bit_layouts(0.1)
    assert len(fig.axes) == 5


def test_set_several_controls_with_one_redraw():
    ex = QuantExplorer(weights(), bits=4, granularity="group", group_size=16, render=False)
    calls = []
    ex._render = lambda: calls.append(1)
    ex.render_enabled = True
    stats = ex.set(matrix="b", bits=3, granularity="group", group_size=43, clip=0.9)
    assert len(calls) == 1
    assert stats["params"] == dict(bits=3, scheme="absmax", granularity="group", axis=-1, group_size=43,
                                   clip_ratio=0.9)
    assert stats["shape"] == (64, 86) and stats["n_scales"] == 64 * 2
    ex.bits.value = 5                                       # a single control still redraws by itself
    assert len(calls) == 2
    with pytest.raises(ValueError, match="unknown control"):
        ex.set(colour="red")
