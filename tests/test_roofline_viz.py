"""Module 01: roofline plots and the roofline explorer widget (driven by setting .value)."""
import math

import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.models.config import LlamaConfig  # noqa: E402
from course_lib.perf.hardware import GPUS, DeviceSpec  # noqa: E402
from course_lib.perf.intensity import intensity_table  # noqa: E402
from course_lib.perf.roofline import decode_critical_batch, min_decode_latency, ridge_point  # noqa: E402
from course_lib.viz import RooflineExplorer, plot_decode_batch, plot_roofline  # noqa: E402

LOCAL = DeviceSpec("this machine (test CPU)", bandwidth_gbs=12.0, peak_tflops={"fp32": 0.08}, measured=True)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_plot_roofline_draws_each_device_and_the_ops():
    pre = intensity_table("tiny", "prefill", 128)
    dec = intensity_table("tiny", "decode", 128)
    ax = plot_roofline(["A100-80GB", "T4", LOCAL], "fp16", tables=[pre, dec])
    labels = [l.get_label() for l in ax.get_lines() if not l.get_label().startswith("_")]
    assert len(labels) == 3
    assert "A100-80GB (fp16): ridge 153 FLOP/B" == labels[0]
    assert labels[2].startswith("this machine (test CPU) (fp32)")  # a CPU has no fp16 rate: its own dtype
    assert len(ax.collections) == 2  # one scatter per phase
    offsets = ax.collections[1].get_offsets()
    assert len(offsets) == sum(1 for r in dec if r.intensity)
    # every op lies on the first device's roofline: y = min(peak, I * bw)
    for x, y in offsets:
        assert y == pytest.approx(min(312e12, x * 2039e9))
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_plot_roofline_defaults_and_errors():
    ax = plot_roofline()
    assert len([l for l in ax.get_lines() if not l.get_label().startswith("_")]) == len(GPUS)
    with pytest.raises(ValueError, match="gpu"):
        plot_roofline(["A100-80GB", "B300"])
    with pytest.raises(ValueError, match="tables"):
        plot_roofline("T4", tables=[intensity_table("tiny", "decode", 8, mode="notes")])
    with pytest.raises(ValueError, match="intensity_range"):
        plot_roofline("T4", intensity_range=(10, 1))


def test_plot_decode_batch_marks_the_critical_batch():
    ax = plot_decode_batch("llama-2-7b", ["A100-80GB", "H100-SXM"])
    labels = [l.get_label() for l in ax.get_lines()]
    b = decode_critical_batch("llama-2-7b", "A100-80GB")
    assert any(f"-> batch {b:.0f}" in s for s in labels)
    with pytest.raises(ValueError, match="batches"):
        plot_decode_batch("tiny", batches=[0, 1])


def test_explorer_uses_only_core_widgets():
    e = RooflineExplorer(plot=False)
    assert isinstance(e.gpu, W.Dropdown) and isinstance(e.dtype, W.Dropdown)
    assert isinstance(e.batch, W.IntSlider) and isinstance(e.seq_len, W.IntSlider)
    assert isinstance(e.out, W.Output) and isinstance(e.summary, W.HTML) and isinstance(e.ui, W.VBox)
    assert list(e.gpu.options) == list(GPUS)


def test_explorer_logic_follows_the_widgets():
    e = RooflineExplorer("llama-2-7b", plot=False)
    r = e.result
    assert r["ok"] and r["gpu"] == "A100-80GB" and r["ridge"] == pytest.approx(ridge_point("A100-80GB"))
    # batch 1 decode: about the time to read the weights once
    assert r["decode_time"] == pytest.approx(min_decode_latency("llama-2-7b", "A100-80GB"), rel=0.05)
    assert r["decode_bound"] == "memory-bound" and r["prefill_bound"] == "compute-bound"
    assert r["critical_batch"] == pytest.approx(decode_critical_batch("llama-2-7b", "A100-80GB"))
    assert r["fits"]

    e.gpu.value = "H100-SXM"
    assert e.result["ridge"] == pytest.approx(ridge_point("H100-SXM"))
    assert e.result["decode_time"] < r["decode_time"]  # more bandwidth
    assert "H100-SXM" in e.summary.value

    t1 = e.result["decode_tokens_per_s"]
    e.batch.value = 64
    # the weights are read once for all 64 sequences, but each has its own 1024-token KV cache
    # (0.5 GB each for Llama-2-7B without GQA): 64x the tokens for far less than 64x the time
    assert 10 * t1 < e.result["decode_tokens_per_s"] < 64 * t1
    d_short = e.result["decode_time"]
    e.seq_len.value = 8192
    assert e.result["decode_time"] > d_short  # a longer KV cache to read
    e.batch.value = 1024
    assert not e.result["fits"] and "does not fit" in e.summary.value

    e.dtype.value = "int8"
    assert e.result["ridge"] == pytest.approx(ridge_point("H100-SXM", "int8"))


def test_explorer_unsupported_dtype_says_so():
    e = RooflineExplorer(gpu="T4", plot=False)
    e.dtype.value = "bf16"
    assert not e.result["ok"] and "bf16" in e.result["message"] and "T4" in e.summary.value
    e.plot = True
    e.update()
    assert e.figure is None  # nothing to draw
    e.gpu.value = "A100-80GB"
    assert e.result["ok"]


def test_explorer_draws_and_accepts_a_local_device():
    e = RooflineExplorer("tiny", devices=[LOCAL], gpu=LOCAL.name, dtype="fp32", seq_len=64, plot=True)
    assert LOCAL.name in e.gpu.options
    assert e.result["ok"] and e.figure is not None
    assert e.result["memory_available"] == 0  # a measured device without a memory size: no fits check
    fig = e.draw()
    assert len(fig.axes) == 1 and len(fig.axes[0].collections) == 2
    e.dtype.value = "fp16"
    assert not e.result["ok"] and "fp32" in e.result["message"]


def test_explorer_bad_arguments():
    with pytest.raises(ValueError, match="gpu"):
        RooflineExplorer(gpu="Voodoo2", plot=False)
    with pytest.raises(ValueError, match="dtype"):
        RooflineExplorer(dtype="int4", plot=False)
    with pytest.raises(ValueError, match="batch"):
        RooflineExplorer(batch=0, plot=False)
    with pytest.raises(ValueError, match="known"):
        RooflineExplorer(model="no-such-model", plot=False)
    small = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=256,
                        num_hidden_layers=1)
    assert math.isinf(RooflineExplorer(model=small, gpu="H100-SXM", plot=False).result["critical_batch"])
