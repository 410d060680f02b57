"""Module 03 part B on the bundled model: QAT recovers int3 quality vs PTQ on held-out bits per byte;
bitsandbytes int8 / NF4 (double quant) through transformers (or, where transformers refuses, the same
bitsandbytes modules by hand; the 4-bit CPU paths in test_quant_bnb_paths.py); a per-layer sensitivity scan."""
import pytest
import torch

from course_lib.models import load
from course_lib.quant.linear import state_dict_bytes
from course_lib.quant_eval import bnb_rows, heldout_bpb, heldout_texts, load_bnb, qat_vs_ptq, sensitivity_bpb


@pytest.fixture(scope="module")
def texts():
    return heldout_texts(3, 1200)


def test_qat_recovers_int3_quality_vs_ptq(texts):
    r = qat_vs_ptq(bits=3, group_size=None, steps=20, lr=1e-4, texts=texts, progress=False)
    assert r["ptq"] > r["fp32"] + 0.02, r                      # int3 per-row RTN costs real quality here
    assert r["qat"] < r["ptq"] - 0.1 * (r["ptq"] - r["fp32"]), r    # 20 QAT steps close >= 10% of the gap
    assert r["recovered"] > 0.1
    # the deployed model is plain linears on the int3 grid: at most 7 distinct values per row (codes -3..3)
    w = r["model"].model.layers[0].mlp.up_proj.weight
    assert type(r["model"].model.layers[0].mlp.up_proj) is torch.nn.Linear
    assert max(len(torch.unique(row)) for row in w) <= 7


def test_transformers_bitsandbytes_route_or_its_precise_refusal():
    pytest.importorskip("bitsandbytes")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        with pytest.raises((ImportError, ValueError), match="accelerate"):
            load_bnb("nf4", fallback=False)
        pytest.skip("transformers needs `accelerate` for BitsAndBytesConfig (even on CPU); it is not installed: "
                    "the by-hand route (same bitsandbytes modules) is tested instead")
    m, info = load_bnb("nf4", fallback=False)
    assert info["route"] == "transformers"


def test_bitsandbytes_bytes_and_quality(texts):
    pytest.importorskip("bitsandbytes")
    rows = {r["method"].split()[-1] if "fp32" not in r["method"] else "fp32": r for r in bnb_rows(texts=texts)}
    fp, i8, nf4 = rows["fp32"], rows["int8"], rows["quant"]
    # the linears shrink 4x (int8) / ~7x (NF4 + double-quant statistics); the tied embedding stays fp32
    assert i8["bytes"] < 0.4 * fp["bytes"] and nf4["bytes"] < 0.75 * i8["bytes"]
    assert abs(i8["bpb"] - fp["bpb"]) < 0.01 and 0 < nf4["bpb"] - fp["bpb"] < 0.05, rows
    # every linear's CPU path is reported (route_bnb_cpu): int8 has one; NF4 packs the attention projections
    # where bitsandbytes has its fused AVX512-BF16 kernel and dequantizes the 688-wide MLP everywhere
    from course_lib.quant_eval import bnb_packed_cpu_kernel
    n = 7 * 6
    assert i8["paths"] == {"int8": n}
    assert nf4["paths"] == ({"packed": 4 * 6, "dequantize": 3 * 6} if bnb_packed_cpu_kernel() else {"dequantize": n})


def test_sensitivity_scan_on_the_bundled_model(texts):
    model, tok = load("tiny", device="cpu", verbose=False)
    base = heldout_bpb(model, tok, texts[:1])
    out = sensitivity_bpb(model, tok, texts[:1], bits=(3,), progress=False)
    assert out["base"] == pytest.approx(base) and len(out["delta"]) == model.config.num_hidden_layers
    assert all(d[3] > 0 for d in out["delta"].values())          # quantizing any layer at 3 bits hurts
    assert heldout_bpb(model, tok, texts[:1]) == pytest.approx(base)   # weights restored
    assert state_dict_bytes(model) == 4 * sum(p.numel() for p in model.parameters())
