"""The one decode-step model (``perf.roofline.decode_step``), the one KV-bytes formula
(``LlamaConfig.kv_cache_bytes``) and the one block count (``paged.blocks_needed``) against the copies they
replaced (issue 31), kept here verbatim as oracles and compared on a table of cases: the callers
(``min_decode_latency``, ``capstone.hardware_choice``, ``StepCostModel.from_roofline``,
``parallel.cost.tp_step_time`` / ``per_gpu_memory`` / ``notes_example``, the block manager, the engine,
the scheduler, the simulator's policies) must compute what they computed before."""
import itertools
import math

import pytest

from course_lib.capstone import hardware_choice
from course_lib.models.config import as_config, preset
from course_lib.paged import BlockManager, blocks_needed
from course_lib.parallel.cost import LINKS, allreduce_time, gpt3_175b, notes_example, per_gpu_memory, tp_step_time
from course_lib.perf import DecodeStep, decode_step, get_gpu, min_decode_latency
from course_lib.perf.roofline import decode_step_critical_batch, ridge_point
from course_lib.perf.hardware import bytes_per_element, canonical_dtype
from course_lib.serving import StepCostModel
from course_lib.serving.policies import blocks_needed as serving_blocks_needed

GPUS = ("T4", "L4", "A100-80GB", "H100-SXM", "H200")
MODELS = ("llama-2-7b", "llama-2-70b", "llama-3-8b", "tiny")


# --- the copies as they were at 55a0367 -------------------------------------------------------------------
def old_min_decode_latency(num_params, device, dtype="fp16", kv_cache_bytes=0):
    if not isinstance(num_params, (int, float)):
        num_params = as_config(num_params).num_parameters()
    return (num_params * bytes_per_element(dtype) + kv_cache_bytes) / get_gpu(device).bandwidth


def old_hardware_step(m, g, dtype, batch, context, memory_headroom=0.9):
    """capstone.hardware_choice's step: (gpus, step seconds, bound)."""
    cfg = as_config(m)
    params = cfg.num_parameters()
    wbytes = params * bytes_per_element(dtype)
    kv_per_tok = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * bytes_per_element(dtype)
    kv = kv_per_tok * context * batch
    d = get_gpu(g)
    n_gpu = max(1, math.ceil((wbytes + kv) / (d.memory_gb * 1e9 * memory_headroom)))
    t_mem = (wbytes + kv) / (d.bandwidth * n_gpu)
    t_cmp = 2 * params * batch / (d.peak_flops(dtype if canonical_dtype(dtype) in d.peak_tflops else "fp16") * n_gpu)
    return n_gpu, max(t_mem, t_cmp), "memory" if t_mem >= t_cmp else "compute"


def old_from_roofline(g, m, dtype):
    """StepCostModel.from_roofline's coefficients: (fixed_s, per_context_token_s, compute_s_per_token)."""
    dev, shape = get_gpu(g), as_config(m)
    params, b = shape.num_parameters(), bytes_per_element(dtype)
    return params * b / dev.bandwidth, shape.kv_cache_bytes(1, 1, b) / dev.bandwidth, 2 * params / dev.peak_flops(dtype)


def old_per_gpu_kv(cfg, tp, pp, context, batch, kv_bpe):
    layers = -(-cfg.num_hidden_layers // pp)
    return 2 * layers * (cfg.num_key_value_heads // tp) * cfg.head_dim * context * batch * kv_bpe


def old_blocks(tokens, block_size):                       # policies._blocks, and the inline copies
    return -(-tokens // block_size)


def old_manager_blocks_needed(n, num_new, bs):            # BlockManager.blocks_needed without copy-on-write
    return -(-(n + num_new) // bs) - (-(-n // bs))


# --- the table ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama-2-7b", "llama-2-70b", 7e9, 6_738_415_616])
def test_min_decode_latency_unchanged(model):
    for g, dt, kv in itertools.product(GPUS, ("fp16", "int8", "int4", 0.5, "fp32"), (0, 2e9)):
        new = min_decode_latency(model, g, dt, kv_cache_bytes=kv)
        assert new == pytest.approx(old_min_decode_latency(model, g, dt, kv), rel=1e-12), (model, g, dt, kv)


def test_hardware_choice_unchanged():
    for batch, context, dt in itertools.product((1, 8, 32, 512), (1, 2048, 4096), ("fp16", "int8", "int4", "fp32")):
        rows = hardware_choice(MODELS[:3], GPUS, dtype=dt, batch=batch, context=context)
        for r in rows:
            n, step, bound = old_hardware_step(r["model"], r["gpu"], dt, batch, context)
            assert (r["gpus"], r["bound"]) == (n, bound), (r, n, bound)
            assert r["step_ms"] / 1e3 == pytest.approx(step, rel=1e-12), r
            assert r["tokens_per_s"] == pytest.approx(batch / step, rel=1e-12), r


def test_from_roofline_unchanged_and_is_decode_step():
    for g, m, dt in itertools.product(GPUS, MODELS, ("fp16", "int8", "fp32")):
        c = StepCostModel.from_roofline(g, m, dt, overhead_s=0.0)
        old = old_from_roofline(g, m, dt)
        assert (c.fixed_s, c.per_context_token_s, c.compute_s_per_token) == pytest.approx(old, rel=1e-12), (g, m, dt)
        for batch, ctx in ((1, 0), (16, 300), (256, 4000)):        # the linear model is the one model's step
            one = decode_step(m, g, dt, batch=batch, context=ctx + 1)  # decode_time counts the fed token's KV
            assert c.decode_time(batch, ctx) == pytest.approx(one.time, rel=1e-9), (g, m, dt, batch, ctx)


def test_parallel_cost_unchanged():
    l70, h100 = preset("llama-2-70b"), get_gpu("H100-SXM")
    for tp, pp, ctx, batch, kv_bpe in itertools.product((1, 2, 4, 8), (1, 2, 8), (0, 100, 4096), (1, 3, 8), (2, 0.5)):
        m = per_gpu_memory(l70, tp=tp, pp=pp, context=ctx, batch=batch, bpe=2, kv_bpe=kv_bpe)
        assert m["kv"] == old_per_gpu_kv(l70, tp, pp, ctx, batch, kv_bpe), (tp, pp, ctx, batch, kv_bpe)
    for p, link, (ctx, batch) in itertools.product((1, 2, 4, 8), LINKS, ((0, 1), (1024, 1), (4096, 8))):
        t = tp_step_time(l70, p, link, h100.bandwidth, context=ctx, batch=batch)
        assert t["compute_s"] == pytest.approx(per_gpu_memory(l70, tp=p, context=ctx, batch=batch)["total"]
                                               / h100.bandwidth, rel=1e-12)
        msg, L = batch * l70.hidden_size * 2, l70.num_hidden_layers
        assert t["comm_s"] == pytest.approx(2 * L * allreduce_time(msg, p, link), rel=1e-12)
    for gpus, bpe, batch, context in ((16, 2, 8, 2048), (8, 1, 3, 100)):
        ex = notes_example(gpus=gpus, bpe=bpe, batch=batch, context=context)
        assert ex["kv_bytes_per_gpu"] == 2 * 96 * 12288 * context * batch * bpe / gpus
    assert gpt3_175b().kv_bytes_per_token(2) == 2 * 96 * 12288 * 2


def test_decode_step_terms():
    cfg, a100 = preset("llama-2-7b"), get_gpu("A100-80GB")
    s = decode_step(cfg, a100, "fp16", batch=4, context=1000, gpus=2)
    assert s.weight_bytes == cfg.num_parameters() * 2 / 2
    assert s.kv_bytes == cfg.kv_cache_bytes(1000, 4, 2) / 2           # the one KV formula
    assert s.flops == 2 * cfg.num_parameters() * 4 / 2
    assert s.time == max(s.memory_s, s.compute_s) and s.bound == "memory-bound"
    assert decode_step(cfg, a100, batch=4096).bound == "compute-bound"
    # int4 weights compute in fp16: the device's default rate where it has none for the dtype
    assert decode_step(cfg, a100, "int4").peak == a100.peak_flops("fp16")
    assert DecodeStep(1e9, 0, 1e15, 1e9, None).time == 1.0            # no peak: memory only
    for bad, match in (({"batch": 0}, "batch"), ({"context": -1}, "context"), ({"gpus": 1.5}, "gpus"),
                       ({"kv_bytes": -1}, "kv_bytes")):
        with pytest.raises(ValueError, match=match):
            decode_step(cfg, a100, **bad)
    with pytest.raises(ValueError, match="context"):
        decode_step(7e9, a100, context=10)                           # no config: no KV formula


def test_decode_step_critical_batch_is_where_the_step_turns_compute_bound():
    for m, g, dt, ctx in itertools.product(MODELS, GPUS, ("fp16", "int4", "fp32"), (0, 1, 64, 300, 1000, 4096)):
        b = decode_step_critical_batch(m, g, dt, context=ctx)
        step = lambda B: decode_step(m, g, dt, batch=B, context=ctx)  # noqa: E731
        if math.isinf(b):                     # each sequence's KV read costs at least its FLOPs: never
            assert step(1).kv_bytes / step(1).bandwidth >= step(1).compute_s, (m, g, dt, ctx)
            assert step(10**6).bound == "memory-bound", (m, g, dt, ctx)
            continue
        B = max(1, math.ceil(b))
        assert step(B).compute_s >= step(B).memory_s * (1 - 1e-12), (m, g, dt, ctx, b)
        if B > 1:
            assert step(B - 1).compute_s <= step(B - 1).memory_s * (1 + 1e-12), (m, g, dt, ctx, b)  # a tie rounds
        # never sooner with a longer context (more KV per sequence)
        assert decode_step_critical_batch(m, g, dt, context=ctx + 100) >= b
    # no KV: the weights alone, ridge x bytes per weight / 2 (about the ridge itself in fp16)
    assert decode_step_critical_batch("llama-2-7b", "A100-80GB", "fp16") == pytest.approx(
        ridge_point("A100-80GB", "fp16"), rel=1e-12)
    # Llama-2-7B (512 KiB of fp16 KV per token) on an A100: past 168 tokens no batch is compute-bound
    a100, P = get_gpu("A100-80GB"), preset("llama-2-7b").num_parameters()
    limit = 2 * P / a100.peak_flops("fp16") * a100.bandwidth / preset("llama-2-7b").kv_cache_bytes(1, 1, 2)
    assert 167 < limit < 169
    assert math.isfinite(decode_step_critical_batch("llama-2-7b", a100, context=math.floor(limit)))
    assert math.isinf(decode_step_critical_batch("llama-2-7b", a100, context=math.ceil(limit)))
    # the KV bytes of one sequence given directly are the config's formula's
    cfg = preset("llama-3-8b")
    kv = cfg.kv_cache_bytes(512, 1, bytes_per_element("int4"))
    assert decode_step_critical_batch(cfg.num_parameters(), "H100-SXM", "int4", kv_bytes=kv) == pytest.approx(
        decode_step_critical_batch(cfg, "H100-SXM", "int4", context=512), rel=1e-12)


def test_one_block_count_agrees_with_every_old_copy():
    assert serving_blocks_needed is blocks_needed                     # serving re-exports the one function
    for tokens, bs in itertools.product(range(0, 70), (1, 2, 3, 4, 16, 64)):
        assert blocks_needed(tokens, bs) == old_blocks(tokens, bs), (tokens, bs)
    assert blocks_needed(10**18 + 1, 10**9) == 10**9 + 1               # integer arithmetic, no float ceil
    import numpy as np
    assert blocks_needed(np.int64(17), np.int32(16)) == 2
    for bad in ((3, 0), (-1, 4), (True, 4), (3, 2.0), (2.5, 4)):
        with pytest.raises(ValueError):
            blocks_needed(*bad)
    # the block manager's count of new blocks (no sharing: no copy-on-write) is a difference of the one count
    for bs, n, new in itertools.product((1, 3, 4), range(1, 13), range(0, 9)):
        m = BlockManager(num_blocks=64, block_size=bs)
        m.add_sequence("a", list(range(n)))
        assert m.blocks_needed("a", new) == old_manager_blocks_needed(n, new, bs), (bs, n, new)


def test_a_decode_step_at_its_ridge_is_compute_bound_as_classify_says():
    """DecodeStep.bound and classify agree on the tie: arithmetic exactly as long as the traffic is compute-bound."""
    from course_lib.perf.roofline import COMPUTE_BOUND, MEMORY_BOUND, DecodeStep, classify, ridge_point
    tie = DecodeStep(weight_bytes=1e9, kv_bytes=0.0, flops=2e12, bandwidth=1e12, peak=2e15)
    assert tie.memory_s == tie.compute_s and tie.bound == COMPUTE_BOUND
    assert classify(ridge_point("A100-80GB"), "A100-80GB") == COMPUTE_BOUND
    assert DecodeStep(1e9, 0.0, 1e12, 1e12, 2e15).bound == MEMORY_BOUND
    assert DecodeStep(1e9, 0.0, 1e12, 1e12, None).bound == MEMORY_BOUND
