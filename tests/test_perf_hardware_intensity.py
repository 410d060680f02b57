"""Module 01: the hardware table, the device measurement, arithmetic intensity (the lecture notes' and
the real counting) and the roofline arithmetic."""
import math
import random
import time
from fractions import Fraction

import numpy as np
import pytest
import sympy
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from course_lib.models.config import PRESETS, as_config
from course_lib.models.llama import LlamaConfig, LlamaForCausalLM, flops_per_token
from course_lib.device_bench import count_ops, measure_device, time_decode_step
from course_lib.kvcache import FixedPrefixCache
from course_lib.perf.hardware import (DTYPE_BYTES, GPUS, DeviceSpec, bytes_per_element, canonical_dtype,
                                      get_gpu, hardware_table)
from course_lib.perf.intensity import intensity_table
from course_lib.perf.notes_forms import NOTES_CLOSED_FORMS, notes_table
from course_lib.perf.ops import matmul_cost
from course_lib.perf.roofline import (COMPUTE_BOUND, MEMORY_BOUND, analyze, attainable_flops, classify,
                                      critical_batch, decode_critical_batch, matmul_intensity,
                                      min_decode_latency, predict_time, ridge_point, roofline_time)
from course_lib.perf.tables import format_records, format_table

SMALL = LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=128,
                    tie_word_embeddings=False)


# --- hardware table -------------------------------------------------------------------------------
NVIDIA_SIX = ["T4", "L4", "A100-40GB", "A100-80GB", "H100-SXM", "H200"]


def test_table_has_the_eight_gpus_with_every_column():
    assert list(GPUS) == NVIDIA_SIX + ["B200", "MI300X"]
    for g in (GPUS[k] for k in NVIDIA_SIX):
        assert g.bandwidth_gbs > 0 and g.memory_gb > 0 and g.smem_per_sm_kb > 0 and g.sms > 0
        assert g.fp16_tflops > 0 and g.int8_tops > 0
        assert g.source.startswith("NVIDIA") and "datasheet" in g.source
        # dense int8 is twice dense fp16 on every tensor-core generation of the table
        assert g.int8_tops == pytest.approx(2 * g.fp16_tflops, rel=0.01)
        if g.fp8:
            assert g.fp8_tflops == pytest.approx(2 * g.fp16_tflops, rel=0.01)
        assert g.peak_tflops["fp32"] < g.fp16_tflops  # CUDA cores vs tensor cores
        assert not g.measured


def test_datasheet_numbers_dense_not_sparse():
    t4, l4, a40, a80, h100, h200, b200, mi300x = (GPUS[k] for k in GPUS)
    assert (t4.bandwidth_gbs, t4.fp16_tflops, t4.int8_tops, t4.memory_gb) == (320, 65, 130, 16)
    assert t4.bf16_tflops is None and not t4.fp8 and t4.smem_per_sm_kb == 64
    assert (l4.bandwidth_gbs, l4.fp16_tflops, l4.fp8_tflops, l4.memory_gb) == (300, 121, 242.5, 24)
    assert l4.fp8 and l4.smem_per_sm_kb == 100
    assert (a40.bandwidth_gbs, a80.bandwidth_gbs) == (1555, 2039)
    assert a40.fp16_tflops == a80.fp16_tflops == a80.bf16_tflops == 312 and a80.int8_tops == 624
    assert not a80.fp8 and a80.smem_per_sm_kb == 164 and (a40.memory_gb, a80.memory_gb) == (40, 80)
    assert h100.bandwidth_gbs == 3350 and h100.fp16_tflops == pytest.approx(989.4) and h100.fp8
    assert h200.bandwidth_gbs == 4800 and h200.memory_gb == 141
    assert h200.peak_tflops == h100.peak_tflops  # same GH100 compute, more and faster memory
    assert h100.smem_per_sm_kb == h200.smem_per_sm_kb == 228
    # fp8 exactly where the hardware has it: Ada and Hopper
    assert [g.name for g in GPUS.values() if g.fp8] == ["L4", "H100-SXM", "H200", "B200", "MI300X"]
    # B200 (HGX, per GPU): the datasheet's sparse figures halved; 180 GB at 7.7 TB/s
    assert (b200.bandwidth_gbs, b200.memory_gb, b200.fp16_tflops, b200.fp8_tflops) == (7700, 180, 2250, 4500)
    assert b200.int8_tops == b200.fp8_tflops == 2 * b200.bf16_tflops and b200.compute_capability == "10.0"
    assert b200.source.startswith("NVIDIA") and "datasheet" in b200.source
    # Blackwell's FP4 (E2M1) tensor cores: twice the FP8 rate; FP6 at the FP8 rate; no other table GPU has them
    assert (b200.peak_tflops["fp4"], b200.peak_tflops["fp6"]) == (9000, 4500) and b200.supports("e2m1")
    assert [g.name for g in GPUS.values() if g.supports("fp4") or g.supports("fp6")] == ["B200"]
    assert ridge_point("B200", "fp4") == pytest.approx(2 * ridge_point("B200", "fp8"))
    assert (bytes_per_element("fp4"), bytes_per_element("fp6")) == (0.5, 0.75)
    # MI300X: not a CUDA device, so no compute capability; CUs and LDS in the SM columns
    assert (mi300x.bandwidth_gbs, mi300x.memory_gb) == (5300, 192)
    assert (mi300x.fp16_tflops, mi300x.bf16_tflops, mi300x.fp8_tflops) == (1307.4, 1307.4, 2614.9)
    assert (mi300x.peak_tflops["fp32"], mi300x.peak_tflops["tf32"], mi300x.int8_tops) == (163.4, 653.7, 2614.9)
    assert mi300x.compute_capability is None and mi300x.architecture == "CDNA 3"
    assert (mi300x.sms, mi300x.smem_per_sm_kb) == (304, 64) and mi300x.source.startswith("AMD")
    assert mi300x.memory_gb > h200.memory_gb and h100.bandwidth_gbs < mi300x.bandwidth_gbs < b200.bandwidth_gbs
    assert "CDNA 3 (-)" in hardware_table(["MI300X"]) and "Blackwell (10.0)" in hardware_table(["B200"])


def test_ridge_points():
    assert ridge_point("A100-80GB", "fp16") == pytest.approx(312e12 / 2039e9)  # ~153 FLOP/byte
    assert ridge_point("H100-SXM", "fp16") == pytest.approx(295.3, abs=0.1)
    assert ridge_point("T4", "fp16") == pytest.approx(203.1, abs=0.1)
    # H200 has the H100's compute and 43% more bandwidth: a lower ridge
    assert ridge_point("H200") < ridge_point("H100-SXM")
    assert ridge_point("A100-80GB", "int8") == pytest.approx(2 * ridge_point("A100-80GB", "fp16"))
    assert get_gpu("A100-80GB").ridge_point("fp16") == ridge_point("A100-80GB")


def test_gpu_names_and_aliases():
    assert get_gpu("a100 80gb").name == "A100-80GB"
    assert get_gpu("A100_40GB").name == "A100-40GB"
    assert get_gpu("H100").name == "H100-SXM"
    assert get_gpu("nvidia h200").name == "H200"
    assert get_gpu("NVIDIA B200").name == "B200" and get_gpu("AMD Instinct MI300X").name == "MI300X"
    assert get_gpu("Tesla T4").name == "T4"
    spec = GPUS["L4"]
    assert get_gpu(spec) is spec


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ValueError) as e:
        get_gpu("RTX 4090")
    msg = str(e.value)
    assert "gpu=" in msg and "RTX 4090" in msg
    for name in GPUS:
        assert name in msg
    with pytest.raises(ValueError, match="gpu"):
        ridge_point("V100")
    with pytest.raises(ValueError, match="gpu"):
        get_gpu(3)


def test_dtypes_and_bytes_per_element():
    assert bytes_per_element("fp16") == bytes_per_element("float16") == bytes_per_element(torch.float16) == 2
    assert bytes_per_element("bfloat16") == 2 and bytes_per_element(torch.float32) == 4
    assert bytes_per_element("int8") == bytes_per_element("fp8_e4m3") == 1 and bytes_per_element("int4") == 0.5
    assert bytes_per_element(3) == 3 and bytes_per_element(np.float64(0.5)) == 0.5
    assert canonical_dtype(torch.bfloat16) == "bf16"
    with pytest.raises(ValueError, match="dtype"):
        bytes_per_element("fp12")
    with pytest.raises(ValueError, match="dtype"):
        bytes_per_element(0)
    with pytest.raises(ValueError, match="dtype"):
        bytes_per_element(None)
    assert set(DTYPE_BYTES) >= {"fp32", "fp16", "bf16", "fp8", "int8", "int4"}


def test_unsupported_dtype_on_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="bf16"):
        GPUS["T4"].peak_flops("bf16")
    with pytest.raises(ValueError, match="fp8"):
        ridge_point("A100-80GB", "fp8")
    with pytest.raises(ValueError, match="dtype"):
        ridge_point("A100-80GB", "fp13")


def test_device_spec_validation():
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        DeviceSpec("x", bandwidth_gbs=0, peak_tflops={"fp16": 1})
    with pytest.raises(ValueError, match="peak_tflops"):
        DeviceSpec("x", bandwidth_gbs=1, peak_tflops={"fp16": -1})
    with pytest.raises(ValueError, match="peak_tflops"):
        DeviceSpec("x", bandwidth_gbs=1, peak_tflops={})
    d = DeviceSpec("x", 100, {"float16": 10})
    assert d.peak_tflops == {"fp16": 10.0} and d.ridge_point() == pytest.approx(100)


def test_hardware_table_formats():
    md = hardware_table()
    assert md.startswith("| GPU") and all(n in md for n in GPUS)
    assert "<table>" in hardware_table(fmt="html")
    assert "H200" in hardware_table(["H200"], fmt="text")
    with pytest.raises(ValueError, match="fmt"):
        hardware_table(fmt="latex")


# --- this machine ---------------------------------------------------------------------------------
def test_measure_device_cpu_is_quick_and_sane():
    t0 = time.perf_counter()
    d = measure_device("cpu", quick=True)
    elapsed = time.perf_counter() - t0
    assert elapsed < 20, f"measure_device took {elapsed:.1f} s"
    assert d.measured and d.name.startswith("this machine")
    assert 0.1 < d.bandwidth_gbs < 5000
    assert set(d.peak_tflops) == {"fp32"} and 1e-4 < d.peak_tflops["fp32"] < 100
    assert d.ridge_point("fp32") > 0
    with pytest.raises(ValueError, match="not measured"):
        d.peak_flops("fp16")


@torch.no_grad()
def test_prefix_cache_decode_step_equals_full_forward():
    torch.manual_seed(0)
    model = LlamaForCausalLM(SMALL).eval()
    ids = torch.randint(0, SMALL.vocab_size, (2, 11))
    cache = FixedPrefixCache.from_prompt(model, ids[:, :10])
    assert cache.get_seq_length() == 10
    step = model(ids[:, 10:], cache=cache)
    full = model(ids)
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-4, atol=1e-5)
    # the cache is not changed by a step: the same step can be timed again
    assert cache.get_seq_length() == 10
    t = time_decode_step(model, context=8, batch=2, warmup=1, repeats=2)
    assert t.median > 0
    n = count_ops(model, ids)
    assert n is None or n > 10 * SMALL.num_hidden_layers


# --- the lecture notes' tables ----------------------------------------------------------------------
L_, D_, H_ = sympy.symbols("L D H", positive=True, integer=True)
# the right-hand sides as printed in the notes (typed from the notes, independent of the library)
NOTES = {
    "prefill": {1: L_ * D_ / (2 * L_ + D_), 2: L_ * D_ / (2 * L_ + D_), 3: L_ * D_ / (2 * L_ + D_),
                7: L_ * H_ / (2 * H_ + L_), 8: L_ * H_ / (2 * H_ + L_), 10: L_ * D_ / (2 * L_ + D_),
                11: 4 * L_ * D_ / (5 * L_ + 4 * D_), 13: 4 * L_ * D_ / (5 * L_ + 4 * D_)},
    "decode": {1: D_ / (2 + D_), 2: D_ / (2 + D_), 4: D_ / (2 + D_),
               9: (H_ + L_ * H_) / (2 * H_ + L_ + L_ * H_ + 1), 10: (H_ + L_ * H_) / (2 * H_ + L_ + L_ * H_ + 1),
               12: D_ / (2 + D_), 13: 4 * D_ / (5 + 4 * D_), 15: 4 * D_ / (5 + 4 * D_)},
}
DASHES = {"prefill": {4, 5, 6, 9, 12}, "decode": {3, 5, 6, 7, 8, 11, 14}}


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_notes_table_symbolically_equals_the_notes(phase):
    t = notes_table(phase, L_, D_, head_dim=H_)
    assert [r.no for r in t] == list(range(1, 14 if phase == "prefill" else 16))
    for r in t:
        if r.no in DASHES[phase]:
            assert r.intensity is None and r.closed_form == "-"
        else:
            assert sympy.cancel(r.intensity - NOTES[phase][r.no]) == 0, (phase, r.no, r.intensity)
            assert sympy.cancel(r.intensity - NOTES_CLOSED_FORMS[phase][r.no](L_, D_, H_)) == 0
    assert set(NOTES[phase]) | DASHES[phase] == {r.no for r in t}
    assert "sqrt(D)" in t[6 if phase == "prefill" else 8].computation  # the notes' (wrong) scale, kept


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_notes_table_numerically_exact(phase):
    rng = random.Random(time.time_ns())
    for _ in range(25):
        nh = rng.choice([1, 2, 4, 8, 12, 32])
        D = nh * rng.randint(1, 64)
        L = rng.randint(1, 5000)
        H = D // nh
        t = notes_table(phase, L, D, num_heads=nh)
        for r in t:
            if r.no in NOTES[phase]:
                expected = NOTES[phase][r.no].subs({L_: L, D_: D, H_: H})
                assert r.intensity == Fraction(int(sympy.numer(expected)), int(sympy.denom(expected)))
                assert isinstance(r.intensity, Fraction)
        # per-head rows run n_h times
        score_no = 7 if phase == "prefill" else 9
        assert t[score_no - 1].count == nh and t[0].count == 1


def test_notes_mode_reads_d_and_heads_from_a_llama_config():
    t = intensity_table(LlamaConfig(), "decode", 100, mode="notes")
    assert t.units == ("multiply-adds", "elements")
    assert t[0].intensity == Fraction(256, 258) and t[8].intensity == Fraction(32 + 100 * 32, 64 + 100 + 3200 + 1)
    assert "(H+LH)/(2H+L+LH+1)" in t.to_markdown()


def test_notes_bad_inputs():
    with pytest.raises(ValueError, match="num_heads"):
        notes_table("prefill", 10, 100, num_heads=7)
    with pytest.raises(ValueError, match="seq_len"):
        notes_table("prefill", 0, 64, num_heads=4)
    with pytest.raises(ValueError, match="batch"):
        intensity_table(LlamaConfig(), "decode", 10, batch=2, mode="notes")
    with pytest.raises(ValueError, match="phase"):
        notes_table("generate", 10, 64, num_heads=4)


def test_notes_vs_real_on_the_notes_sizes():
    """The notes' sizes (MHA, D x D projections, a 4D-wide MLP): row for row, the real count is exactly
    2x the multiply-adds and bytes-per-element x the elements, so in fp16 the two factors of 2 cancel.
    (The real MLP is SwiGLU: its gate matrix has no row in the notes, its up and down matrices do.)"""
    D, nh, L = 512, 8, 300
    notes_arch = LlamaConfig(hidden_size=D, num_attention_heads=nh, num_key_value_heads=nh,
                             intermediate_size=4 * D, num_hidden_layers=1)
    notes = intensity_table(notes_arch, "prefill", L, mode="notes")
    for dtype, factor in (("fp16", 1), ("fp32", Fraction(1, 2)), ("int8", 2)):
        real = intensity_table(notes_arch, "prefill", L, dtype=dtype)
        for notes_no, name in ((1, "q_proj"), (2, "k_proj"), (10, "o_proj"), (11, "up_proj"), (13, "down_proj")):
            s, r = notes[notes_no - 1], real[name]
            assert r.flops == 2 * s.flops
            assert r.bytes == bytes_per_element(dtype) * s.bytes
            assert Fraction(r.flops) / Fraction(r.bytes) == s.intensity * factor
    # attention: the notes count per head, the real table all heads at once
    real = intensity_table(notes_arch, "prefill", L, dtype="fp16")
    assert real["qk"].flops == 2 * nh * notes[6].flops


# --- the real count ----------------------------------------------------------------------------------
def _counted_flops(model, *args, **kw):
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(*args, **kw)
    return fc.get_total_flops()


@pytest.mark.parametrize("cfg", [LlamaConfig(), SMALL], ids=["course-tiny", "gqa-untied"])
@pytest.mark.parametrize("batch,seq", [(1, 7), (3, 24)])
def test_prefill_flops_match_torch_flop_counter(cfg, batch, seq):
    """torch.utils.flop_counter counts every matmul as 2*M*N*K; the SDPA math path decomposes
    attention into two batched matmuls it counts too. Tolerance: exact (0%); the table counts the
    same dense products."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    counted = _counted_flops(model, torch.randint(0, cfg.vocab_size, (batch, seq)))
    table = intensity_table(cfg, "prefill", seq, batch=batch, dtype="fp32")
    assert table.matmul_flops() == counted
    # without the LM head's logits for every position, the difference is exactly those matmuls
    last = intensity_table(cfg, "prefill", seq, batch=batch, all_logits=False)
    assert table.matmul_flops() - last.matmul_flops() == 2 * batch * (seq - 1) * cfg.hidden_size * cfg.vocab_size


@pytest.mark.parametrize("cfg", [LlamaConfig(), SMALL], ids=["course-tiny", "gqa-untied"])
def test_decode_flops_match_torch_flop_counter(cfg):
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    B, L = 2, 13
    cache = FixedPrefixCache.from_prompt(model, torch.randint(0, cfg.vocab_size, (B, L)))
    counted = _counted_flops(model, torch.randint(0, cfg.vocab_size, (B, 1)), cache=cache)
    table = intensity_table(cfg, "decode", L, batch=B)
    assert table.matmul_flops() == counted
    # and the course model's own per-token formula (attention over the L + 1 keys)
    assert intensity_table(cfg, "decode", L).matmul_flops() == flops_per_token(cfg, context=L + 1)


def test_weight_bytes_are_the_parameters():
    for cfg in (LlamaConfig(), SMALL):
        model = LlamaForCausalLM(cfg)
        assert as_config(model).num_parameters() == cfg.num_parameters() == model.num_parameters()
        B = 3
        t = intensity_table(cfg, "decode", 5, batch=B, dtype="fp16")
        # every weight read once, except the embedding table: only the B looked-up rows (when tied,
        # the LM head reads the shared table anyway, and the B rows are read a second time)
        n_embed = cfg.vocab_size * cfg.hidden_size
        expected = 2 * (cfg.num_parameters() - (0 if cfg.tie_word_embeddings else n_embed) + B * cfg.hidden_size)
        assert t.weight_bytes() == expected


def test_kv_cache_reads_in_decode():
    cfg = SMALL
    B, L = 4, 50
    t = intensity_table(cfg, "decode", L, batch=B, dtype="fp16", kv_dtype="int8")
    K, Dh, N = cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    reads = 2 * N * B * K * (L + 1) * Dh * 1  # K and V, only the KV heads, int8
    writes = 2 * N * B * K * Dh * 1
    assert t.kv_bytes() == reads + writes
    assert cfg.kv_cache_bytes(L + 1, B, bytes_per_element("int8")) == reads


def test_dtype_batch_and_length_scaling():
    m = "llama-3-8b"
    t16 = intensity_table(m, "decode", 256, batch=4, dtype="fp16")
    t32 = intensity_table(m, "decode", 256, batch=4, dtype="fp32")
    for a, b in zip(t16, t32):
        assert a.flops == b.flops and b.bytes == 2 * a.bytes
    # decode: the weights are read once whatever the batch; FLOPs grow with it
    t1 = intensity_table(m, "decode", 256, batch=1)
    t64 = intensity_table(m, "decode", 256, batch=64)
    assert t1["q_proj"].weight_bytes == t64["q_proj"].weight_bytes
    assert t64["q_proj"].flops == 64 * t1["q_proj"].flops
    assert t64["q_proj"].intensity > 50 * t1["q_proj"].intensity
    # attention over the cache does not get more intense with the batch
    assert t64["qk"].intensity == pytest.approx(t1["qk"].intensity, rel=1e-9)
    # GQA: K/V projections are num_kv_heads/num_heads the size of Q's
    assert t1["k_proj"].flops * 4 == t1["q_proj"].flops


def test_decode_is_memory_bound_and_prefill_compute_bound_on_every_gpu():
    pre = intensity_table("llama-2-7b", "prefill", 1024, dtype="fp16")
    dec = intensity_table("llama-2-7b", "decode", 1024, dtype="fp16")
    for g in GPUS:
        for r in dec:
            assert classify(r.intensity, g) == MEMORY_BOUND, (g, r.name)
        for name in ("q_proj", "gate_proj", "down_proj", "lm_head"):
            assert classify(pre[name].intensity, g) == COMPUTE_BOUND, (g, name)
        # elementwise ops are memory-bound even in prefill
        assert classify(pre["softmax"].intensity, g) == MEMORY_BOUND


def test_matmul_cost():
    c = matmul_cost(1, 4096, 4096, "fp16")
    assert c.flops == 2 * 4096 * 4096
    assert c.bytes == 2 * (4096 + 4096 * 4096 + 4096)
    assert c.intensity == pytest.approx(4096 / (4096 + 2), rel=1e-12)
    assert matmul_cost(8, 16, 32, 4).bytes == 4 * (8 * 32 + 32 * 16 + 8 * 16)
    w4 = matmul_cost(1, 4096, 4096, "fp16", weight_dtype="int4")
    assert w4.weight_bytes == 4096 * 4096 / 2
    with pytest.raises(ValueError, match="m must be"):
        matmul_cost(0, 4, 4)


def test_models_by_name_and_bad_inputs():
    assert intensity_table("llama-2-7b", "decode", 8).model is PRESETS["llama-2-7b"]
    assert intensity_table("LLAMA-2-7B", "decode", 8).name == "Llama-2-7B"
    assert intensity_table("tiny", "decode", 8).model.hidden_size == 256
    with pytest.raises(ValueError, match="known"):
        intensity_table("gpt-5", "decode", 8)
    for kw, arg in (({"seq_len": 0}, "seq_len"), ({"batch": 0}, "batch"), ({"seq_len": 2.5}, "seq_len"),
                    ({"dtype": "fp7"}, "dtype"), ({"phase": "train"}, "phase"), ({"mode": "fancy"}, "mode"),
                    ({"kv_dtype": "x"}, "kv_dtype")):
        args = dict(model="tiny", phase="decode", seq_len=8, batch=1, dtype="fp16")
        args.update(kw)
        with pytest.raises(ValueError, match=arg):
            intensity_table(**args)


def test_table_printing_and_totals():
    t = intensity_table("tiny", "prefill", 64, batch=2)
    assert len(t) == len(t.names()) and t["q_proj"] is t[t.names().index("q_proj")]
    with pytest.raises(KeyError):
        t["nope"]
    lay, tot = t.layer_total(), t.total()
    assert lay.count == 6 and tot.flops == pytest.approx(sum(r.flops * r.count for r in t))
    per_layer = [r for r in t if r.scope == "layer"]
    assert lay.flops == sum(r.flops for r in per_layer)
    assert tot.flops == 6 * lay.flops + sum(r.flops for r in t if r.scope == "model")
    md, html, txt = t.to_markdown(), t.to_html(), str(t)
    assert "| op |" in md and "layer total" in md and "model total" in md
    assert html.startswith("<table>") and "q_proj" in html and t._repr_html_() == html
    assert "lm_head" in txt


# --- roofline arithmetic -----------------------------------------------------------------------------
def test_attainable_and_classify():
    a = GPUS["A100-80GB"]
    r = ridge_point(a)
    assert attainable_flops(r, a) == pytest.approx(a.peak_flops("fp16"))
    assert attainable_flops(1.0, a) == pytest.approx(2039e9)
    assert attainable_flops(1e6, a) == a.peak_flops("fp16")
    arr = attainable_flops([0.5, r, 10 * r], a)
    assert arr.shape == (3,) and arr[0] == pytest.approx(0.5 * 2039e9)
    assert classify(r * 0.99, a) == MEMORY_BOUND and classify(r, a) == COMPUTE_BOUND
    assert classify(None, a) == MEMORY_BOUND
    with pytest.raises(ValueError, match="intensity"):
        attainable_flops(-1, a)
    assert roofline_time(1e12, 1e9, a) == pytest.approx(max(1e12 / 312e12, 1e9 / 2039e9))


def test_min_decode_latency_7b_on_a100():
    t = min_decode_latency(7e9, "A100-80GB", "fp16")  # 14 GB / 2.039 TB/s
    assert t == pytest.approx(14e9 / 2039e9) and 6.5e-3 < t < 7.0e-3
    assert min_decode_latency("llama-2-7b", "A100-80GB") == pytest.approx(6.738415616e9 * 2 / 2039e9)
    assert min_decode_latency(7e9, "A100-80GB", "int4") == pytest.approx(t / 4)
    assert min_decode_latency(7e9, "A100-80GB", kv_cache_bytes=2039e6) == pytest.approx(t + 1e-3)
    # the full roofline prediction of a decode step is a little above the weights-only bound
    pred = predict_time("llama-2-7b", "A100-80GB", "decode", 1, batch=1)
    assert pred >= min_decode_latency("llama-2-7b", "A100-80GB") * 0.97
    assert pred < min_decode_latency("llama-2-7b", "A100-80GB") * 1.05
    with pytest.raises(ValueError, match="num_params"):
        min_decode_latency(0, "A100-80GB")
    with pytest.raises(ValueError, match="gpu"):
        min_decode_latency(7e9, "A1000")


def test_critical_batch_solves_intensity_equals_ridge():
    rng = random.Random(time.time_ns())
    for _ in range(30):
        g = rng.choice(list(GPUS))
        dtype = rng.choice(["fp16", "int8"] + (["fp8"] if GPUS[g].fp8 else []))
        d_in, d_out = rng.randint(512, 16384), rng.randint(512, 16384)
        b = critical_batch(d_in, d_out, g, dtype)
        R = ridge_point(g, dtype)
        if math.isinf(b):
            assert matmul_intensity(1e12, d_in, d_out, dtype) < R
            continue
        assert matmul_intensity(b, d_in, d_out, dtype) == pytest.approx(R, rel=1e-9)
        # the smallest integer batch that is compute-bound, checked with the row counting of matmul_cost
        bi = max(1, math.ceil(b))
        assert matmul_cost(bi, d_out, d_in, dtype).intensity >= R * (1 - 1e-12)
        if bi > 1:
            assert matmul_cost(bi - 1, d_out, d_in, dtype).intensity < R
    # large square matrices: B* -> ridge * bytes / 2 (fp16: about the ridge point itself)
    assert critical_batch(65536, 65536, "A100-80GB") == pytest.approx(ridge_point("A100-80GB"), rel=0.01)
    # a small matrix never gets there: its intensity tops out at 2 d_in d_out / (a (d_in + d_out))
    assert math.isinf(critical_batch(64, 64, "H100-SXM", "fp16"))
    with pytest.raises(ValueError, match="d_in"):
        critical_batch(0, 5, "T4")
    # bytes per element as a number: the peak comes from peak_dtype (default: the device's main rate)
    assert critical_batch(4096, 4096, "A100-80GB", 2) == critical_batch(4096, 4096, "A100-80GB", "fp16")
    assert critical_batch(8192, 8192, "A100-80GB", 1, peak_dtype="int8") == pytest.approx(158.954, abs=1e-3)
    assert critical_batch(4096, 4096, "A100-80GB", "int4", peak_dtype="fp16") < critical_batch(4096, 4096, "A100-80GB")


def test_decode_critical_batch_of_a_model():
    for g in ("T4", "A100-80GB", "H100-SXM"):
        b = decode_critical_batch("llama-2-7b", g)
        R = ridge_point(g)
        lo, hi = math.floor(b), math.ceil(b)

        def matmul_intensity_at(batch):
            t = intensity_table("llama-2-7b", "decode", 16, batch=batch)
            mats = [r for r in t if r.kind == "matmul"]
            return sum(r.flops * r.count for r in mats) / sum(r.bytes * r.count for r in mats)

        assert matmul_intensity_at(lo) < R <= matmul_intensity_at(hi)
        assert R < b < 1.3 * R  # fp16: a bit above the ridge point


def test_analyze_sums_the_ops():
    t = intensity_table("llama-2-7b", "decode", 512, batch=8)
    a = analyze(t, "H100-SXM")
    assert a.time == pytest.approx(sum(max(r.flops / 989.4e12, r.bytes / 3350e9) * r.count for r in t))
    assert a.share(MEMORY_BOUND) == pytest.approx(1.0)
    assert "total" in a.to_markdown() and "<table>" in a.to_html() and "q_proj" in str(a)
    pre = analyze(intensity_table("llama-2-7b", "prefill", 2048), "H100-SXM")
    # most of the time compute-bound; the rest is the unfused L x L score matrix (softmax) going
    # through memory, what FlashAttention (module 07) removes
    assert pre.share(COMPUTE_BOUND) > 0.5 and pre["softmax"].bound == MEMORY_BOUND
    assert pre["q_proj"].bound == COMPUTE_BOUND
    with pytest.raises(ValueError, match="table"):
        analyze(intensity_table("tiny", "decode", 8, mode="notes"), "T4")
    # a measured CPU spec has only fp32: analyze falls back to it
    cpu = DeviceSpec("cpu", 10, {"fp32": 0.1}, measured=True)
    assert analyze(intensity_table("tiny", "decode", 8, dtype="fp32"), cpu).dtype == "fp32"


def test_the_one_table_formatter():
    head, rows = ["name", "GB/s"], [["A100", "2,039"], ["T4", "320"]]
    assert format_table(head, rows, "markdown", note="n") == ("| name | GB/s |\n|---|---|\n| A100 | 2,039 |\n"
                                                            "| T4 | 320 |\n\nn")
    assert format_table(head, rows, "text").split("\n") == ["name   GB/s", "----  -----", "A100  2,039",
                                                           "T4      320"]   # numbers right-aligned
    assert format_table(["<a>"], [["&"]], "html") == ("<table><thead><tr><th>&lt;a&gt;</th></tr></thead>"
                                                      "<tbody><tr><td>&amp;</td></tr></tbody></table>")
    recs = [{"model": "x", "GiB": 2.0, "n": 3}, {"model": "yy", "GiB": 0.12345, "n": 40}]
    assert format_records(recs) == format_table(["model", "GiB", "n"], [["x", "2", "3"], ["yy", "0.123", "40"]],
                                                "text")
    assert format_records(recs, "markdown", floatfmt=".1f").endswith("| yy | 0.1 | 40 |") and format_records([]) == ""
    with pytest.raises(ValueError, match="fmt"):
        format_table(head, rows, "latex")
    with pytest.raises(ValueError, match="rows\\[1\\]"):
        format_table(head, [["a", "1"], ["b"]])
    with pytest.raises(ValueError, match="lacks"):
        format_records([{"a": 1}, {"b": 2}])
