"""course_lib.capstone: the attribution arithmetic (against a hand computation on fresh random times),
the hardware table against Module 01's roofline bound, and a short stacked run on the bundled model."""
import math
import random

import matplotlib
import pytest
import torch

import course_lib.capstone as capstone

matplotlib.use("Agg")

from course_lib.capstone import STEP_NAMES, attribution_table, hardware_choice, run_capstone, waterfall  # noqa: E402
from course_lib.models import load  # noqa: E402
from course_lib.perf.metrics import cost_per_million_tokens  # noqa: E402
from course_lib.perf.roofline import min_decode_latency  # noqa: E402


def test_attribution_shares_multiply_and_add_up():
    rng = random.Random()
    t = [rng.uniform(0.001, 0.1) for _ in range(5)]
    rows = attribution_table(list("abcde"), t, price_per_hour=2.5)
    total = t[0] / t[-1]
    assert math.isclose(math.prod(r["speedup"] for r in rows), total, rel_tol=1e-9)
    assert math.isclose(sum(r["share"] for r in rows), 1.0, rel_tol=1e-9) or math.isclose(total, 1.0)
    for i in range(1, 5):
        assert math.isclose(rows[i]["share"], math.log(t[i - 1] / t[i]) / math.log(total), rel_tol=1e-9)
        assert math.isclose(rows[i]["usd_per_1M"], cost_per_million_tokens(2.5, 1 / t[i]), rel_tol=1e-12)


def test_attribution_skips_nan_steps_and_refuses_bad_input():
    rows = attribution_table(["a", "b", "c"], [0.04, float("nan"), 0.01])
    assert math.isnan(rows[1]["speedup"]) and rows[2]["speedup"] == pytest.approx(4.0) and rows[2]["share"] == 1
    with pytest.raises(ValueError, match="same length"):
        attribution_table(["a"], [0.1, 0.2])
    with pytest.raises(ValueError, match="> 0"):
        attribution_table(["a", "b"], [0.1, -0.2])
    ax = waterfall(rows)
    assert len(ax.patches) == 2


def test_hardware_choice_matches_the_roofline_bound():
    rows = hardware_choice(["llama-2-7b"], ["A100-80GB", "H100"], batch=1, context=1)
    for r in rows:
        bound = min_decode_latency("llama-2-7b", r["gpu"], "fp16")
        assert r["gpus"] == 1 and r["bound"] == "memory"
        assert r["step_ms"] / 1e3 == pytest.approx(bound, rel=1e-3)     # + one token of KV cache
    seventy = hardware_choice(["llama-2-70b"], ["H100"])[0]
    assert seventy["gpus"] == 2, seventy                 # 138 GB of fp16 weights do not fit one 80 GB card
    big = hardware_choice(["llama-2-7b"], ["H100"], batch=512)[0]
    assert big["tokens_per_s"] > 50 * rows[1]["tokens_per_s"]
    with pytest.raises(ValueError, match="price"):
        hardware_choice(["llama-2-7b"], ["T4"], prices={"H100-SXM": 3.0})


@torch.inference_mode()
def test_stacked_run_on_the_bundled_model(monkeypatch):
    torch.set_num_threads(1)
    model, _ = load("tiny", device="cpu")
    prompts = [torch.randint(1, 2048, (n,)).tolist() for n in (5, 9, 7)]
    steps = run_capstone(model, None, prompts, 8, steps=("no cache", "KV cache", "int8 weights",
                                                        "speculative (tiny-draft)", "continuous batching"),
                         progress=False)
    by = {s.name: s for s in steps}
    assert by["speculative (tiny-draft)"].skipped
    for name in ("no cache", "KV cache", "int8 weights", "continuous batching"):
        assert by[name].tokens == 24 and by[name].seconds > 0 and "WARNING" not in by[name].note, by[name]
    # the int8 step quantizes a copy: the float model the other steps use is untouched
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    q = capstone.int8_weights(model)
    assert type(q.model.layers[0].mlp.up_proj).__name__ == "Int8WeightOnlyLinear"
    monkeypatch.setattr(capstone, "INT8_STEP", None)           # unset: reported as skipped, not measured
    (skipped,) = run_capstone(model, None, prompts, 4, steps=("int8 weights",), progress=False)
    assert skipped.skipped and "INT8_STEP" in skipped.note
    with pytest.raises(ValueError, match="unknown steps"):
        run_capstone(model, None, prompts, 4, steps=("warp drive",))
    assert STEP_NAMES[0] == "no cache"
