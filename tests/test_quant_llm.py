"""Module 03: quantized linears, quantize_model, W8A8, LLM.int8 (against bitsandbytes), SmoothQuant, AWQ,
GPTQ (against its objective and a brute-force optimum)."""
import itertools
import logging

import pytest
import torch
import torch.nn as nn

import course_lib.quant as Q
from course_lib.quant.awq import awq_apply
from course_lib.quant.linear import quantize_per_token
from course_lib.quant.llm_int8 import llm_int8_matmul, outlier_columns
from course_lib.models import LlamaConfig, load
from course_lib.models.llama import LlamaForCausalLM

logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward"))


def small_model(seed=0, outlier_channels=(3, 17), gain=30.0):
    """A random 2-layer course model whose norms have a few large gains: activation outliers like an LLM's."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[list(outlier_channels)] = gain
    return m


def batches(n=4, T=32, vocab=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, T), generator=g) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny():
    model, tok = load("tiny", device="cpu", verbose=False)
    return model, tok


@pytest.fixture(scope="module")
def tiny_inputs(tiny):
    """For every linear of the bundled model: the Hessian of its calibration inputs (32 windows of 256 tokens
    of the training split) and its inputs on held-out text [n, in]."""
    from course_lib.quant_eval import calibration_batches, heldout_texts
    model, tok = tiny
    calib = calibration_batches(tok, n_batches=32, seq_len=256, seed=0, max_files=200)
    held = [torch.tensor([tok(t, add_special_tokens=False)["input_ids"][:256]]) for t in heldout_texts(4, 4000)]
    names = list(Q.named_linears(model))
    return Q.input_hessians(model, calib, names), Q.capture_inputs(model, held, names)


# --- weight-only linears --------------------------------------------------------------------------
@pytest.mark.parametrize("bits,group_size,sym", [(4, 128, False), (4, 32, True), (8, None, True), (8, 64, False)])
def test_quant_linear_matches_rtn_and_packs(bits, group_size, sym):
    torch.manual_seed(0)
    lin = nn.Linear(200, 48, bias=True)        # 200 = one partial group for group_size 128 / 64
    q = Q.QuantLinear.from_linear(lin, bits, group_size, sym)
    codes, scales, zeros = Q.rtn_quantize_weight(lin.weight.detach(), bits, group_size, sym)
    assert torch.equal(q.codes().float(), codes)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    assert int(codes.min()) >= lo and int(codes.max()) <= hi
    w = q.dequantize_weight()
    # each element is within half a step of its group's scale (symmetric: no clipping in RTN); asymmetric
    # rounds the zero point too, so the top of the range can fall short by half a step more
    g = Q.group_index(200, group_size)
    step = q.scales.float()[:, g]
    assert bool(((w - lin.weight).abs() <= step * (0.5 if sym else 1.0) + 1e-6).all())
    assert float((w - lin.weight.detach()).abs().mean()) < float(step.mean()) / 3
    x = torch.randn(5, 200)
    torch.testing.assert_close(q(x), x @ w.T + lin.bias, rtol=1e-5, atol=1e-5)
    # measured bytes: packed codes + fp16 scales (+ int8 zeros) + fp32 bias
    n_groups = -(-200 // (group_size or 200))
    expect = 48 * 200 * bits // 8 + 48 * n_groups * 2 + (0 if sym else 48 * n_groups) + 48 * 4
    assert Q.state_dict_bytes(q) == expect
    assert q.qweight.dtype == (torch.uint8 if bits == 4 else torch.int8)


def test_quant_linear_refuses_bad_arguments():
    lin = nn.Linear(16, 8)
    with pytest.raises(ValueError, match="bits"):
        Q.QuantLinear.from_linear(lin, bits=3)
    with pytest.raises(ValueError, match="group_size"):
        Q.QuantLinear.from_linear(lin, bits=4, group_size=0)
    with pytest.raises(TypeError, match="linear"):
        Q.QuantLinear.from_linear(torch.zeros(3), bits=4)
    with pytest.raises(ValueError, match="method"):
        Q.quantize_model(small_model(), "gptq2")
    with pytest.raises(ValueError, match="calib"):
        Q.quantize_model(small_model(), "awq")


def test_quantize_model_swaps_linears_and_bytes_shrink():
    m = small_model()
    fp_bytes = Q.state_dict_bytes(m)
    # the tied lm_head is counted once
    assert fp_bytes == sum(p.numel() * 4 for p in m.parameters())
    sizes = {}
    for bits in (8, 4):
        qm = Q.quantize_model(m, "rtn", bits=bits, group_size=32)
        kinds = {type(mod).__name__ for mod in qm.modules()}
        assert "QuantLinear" in kinds and type(qm.lm_head) is nn.Linear      # lm_head skipped (tied)
        assert not any(isinstance(mod, nn.Linear) for n, mod in qm.named_modules() if n != "lm_head")
        sizes[bits] = Q.state_dict_bytes(qm)
    assert sizes[4] < sizes[8] < fp_bytes
    assert all(isinstance(mod, nn.Linear) for mod in m.modules() if "proj" in type(mod).__name__.lower())
    assert isinstance(m.model.layers[0].mlp.up_proj, nn.Linear)              # the original is untouched


# --- W8A8 and LLM.int8 --------------------------------------------------------------------------------
def test_w8a8_integer_matmul_is_exact_and_close():
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=False)
    q = Q.W8A8Linear.from_linear(lin)
    x = torch.randn(7, 96)
    xq, sx = quantize_per_token(x)
    exact = (xq.double() @ q.qweight.double().T) * sx.double() * q.scales.double().T
    torch.testing.assert_close(q(x).double(), exact, rtol=1e-6, atol=1e-6)
    rel = (q(x) - lin(x)).norm() / lin(x).norm()
    assert rel < 0.02


def test_llm_int8_matches_bitsandbytes_within_one_int8_step():
    bnb = pytest.importorskip("bitsandbytes")
    for seed in range(3):
        torch.manual_seed(seed)
        lin = nn.Linear(256, 96, bias=False)
        lin.weight.data = lin.weight.data.half().float()                     # bnb quantizes in fp16
        x = torch.randn(12, 256)
        x[:, torch.randint(0, 256, (3,))] *= 25                               # outlier features
        x = x.half().float()
        ours = Q.LLMInt8Linear.from_linear(lin, threshold=6.0)
        y = ours(x)
        b = bnb.nn.Linear8bitLt(256, 96, bias=False, has_fp16_weights=False, threshold=6.0)
        b.weight = bnb.nn.Int8Params(lin.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
        with torch.no_grad():
            yb = b(x).float()
        assert torch.equal(b.weight.data, ours.cb)                            # the same int8 weights
        cols = outlier_columns(x, 6.0)
        assert torch.equal(ours.last_outliers, cols) and cols.numel() >= 1
        # Stated tolerance: the two differ only in each token's int8 scale (ours: absmax over the regular
        # columns; bnb: over every element below the threshold), so per output by at most one int8 step
        # of x (the larger scale / 127) times sum |w| over the regular columns.
        regular = torch.ones(256, dtype=torch.bool)
        regular[cols] = False
        w_hat = ours.cb.float() * ours.scb[:, None] / 127
        sx = torch.where(x.abs() < 6.0, x.abs(), torch.zeros_like(x)).amax(dim=1, keepdim=True)
        tol = sx / 127 * (w_hat.abs() * regular).sum(dim=1)[None, :] + 1e-4
        assert bool(((y - yb).abs() <= tol).all()), float(((y - yb).abs() / tol).max())
        # and both are close to the fp product, ours at least as close on the regular part
        ref = x @ lin.weight.T
        assert (y - ref).norm() / ref.norm() < 0.01 and (yb - ref).norm() / ref.norm() < 0.01


def test_llm_int8_keeps_outliers_exact_where_plain_int8_fails():
    torch.manual_seed(0)
    lin = nn.Linear(128, 64, bias=False)
    x = torch.randn(16, 128) * 0.5
    x[:, 5] = 60.0                                                             # one huge feature
    ref = lin(x)
    plain = Q.W8A8Linear.from_linear(lin)(x)
    mixed = Q.LLMInt8Linear.from_linear(lin, threshold=6.0)(x)
    e_plain, e_mixed = (plain - ref).norm() / ref.norm(), (mixed - ref).norm() / ref.norm()
    assert e_mixed < e_plain / 3, (e_mixed, e_plain)
    # threshold 0 turns the decomposition off: plain per-token int8 with row-wise weights
    y0, cols = llm_int8_matmul(x, Q.LLMInt8Linear.from_linear(lin).cb, lin.weight.abs().amax(1), 0.0,
                                 return_outliers=True)
    assert cols.numel() == 0


# --- SmoothQuant --------------------------------------------------------------------------------------
def test_smoothquant_keeps_fp_model_and_reduces_w8a8_error():
    m = small_model()
    calib, held = batches(4, seed=1), batches(2, seed=2)
    with torch.no_grad():
        ref = [m(b) for b in held]
    import copy
    smoothed = copy.deepcopy(m)
    scales = Q.smooth_model(smoothed, calib, alpha=0.5)
    assert len(scales) == 3 * 2 and all(bool((s > 0).all()) for s in scales.values())
    with torch.no_grad():
        for b, r in zip(held, ref):
            torch.testing.assert_close(smoothed(b), r, rtol=1e-4, atol=1e-4)   # same fp function
    # the outlier channels got the largest scales (difficulty moved into the weights)
    s = scales["model.layers.0.self_attn.qkv"]
    assert set(s.topk(2).indices.tolist()) == {3, 17}
    # W8A8 error of each smoothed linear, on the held-out inputs, below the unsmoothed one's
    names = [n for n in Q.named_linears(m) if n.endswith(("q_proj", "gate_proj"))]
    x_plain, x_smooth = Q.capture_inputs(m, held, names), Q.capture_inputs(smoothed, held, names)
    for n in names:
        lin, lin_s = m.get_submodule(n), smoothed.get_submodule(n)
        ref_out = lin(x_plain[n])
        e_plain = (Q.W8A8Linear.from_linear(lin)(x_plain[n]) - ref_out).norm()
        e_smooth = (Q.W8A8Linear.from_linear(lin_s)(x_smooth[n]) - ref_out).norm()
        assert e_smooth < e_plain, (n, float(e_smooth), float(e_plain))


def test_smooth_scales_formula_and_axis():
    a = torch.tensor([1.0, 100.0, 4.0])
    w = torch.tensor([0.5, 0.5, 2.0])
    s = Q.smooth_scales(a, w, alpha=0.5)
    torch.testing.assert_close(s, (a.sqrt() / w.sqrt()))
    torch.testing.assert_close((a / s), (w * s))                              # alpha 0.5 balances the maxima
    with pytest.raises(ValueError, match="alpha"):
        Q.smooth_scales(a, w, alpha=1.5)


# --- AWQ ----------------------------------------------------------------------------------------------
def test_awq_search_never_worse_than_rtn_and_restores_weights():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    x = torch.randn(256, 128)
    x[:, :4] *= 20                                                              # salient channels
    w0 = w.clone()
    r = Q.awq_search_group([w], x, bits=4, group_size=32, n_grid=10)
    assert torch.equal(w, w0)
    assert r.grid[0] == 0.0 and min(r.losses) <= r.losses[0]                # alpha 0 is RTN
    assert min(r.losses) < r.losses[0] * 0.9                                   # scaling really helps here
    assert r.alpha > 0


def test_awq_fold_keeps_fp_function():
    import copy
    m = small_model()
    folded = copy.deepcopy(m)
    found = awq_apply(folded, batches(3), bits=4, group_size=32, n_grid=5)
    assert {f.name.rsplit(".", 1)[-1] for f in found} == {"qkv", "gate_up", "down"}
    with torch.no_grad():
        for b in batches(2, seed=5):
            torch.testing.assert_close(folded(b), m(b), rtol=1e-4, atol=1e-4)


# --- GPTQ ---------------------------------------------------------------------------------------------
def _rtn(w, bits, group_size, sym=False):
    codes, scales, zeros = Q.rtn_quantize_weight(w, bits, group_size, sym)
    g = Q.group_index(w.shape[1], group_size)
    return (codes - (0 if zeros is None else zeros[:, g])) * scales[:, g]


def test_gptq_beats_rtn_at_every_layer_of_the_bundled_model(tiny, tiny_inputs):
    hessians, held_x = tiny_inputs
    model = tiny[0]
    ratios = []
    for name, lin in Q.named_linears(model).items():
        w, H = lin.weight.detach(), hessians[name][0]
        r = Q.gptq_quantize(w, H, bits=4, group_size=128)
        w_rtn = _rtn(w, 4, 128)
        calib = Q.hessian_error(w, r.weight, H), Q.hessian_error(w, w_rtn, H)
        held = Q.layer_output_error(w, r.weight, held_x[name]), Q.layer_output_error(w, w_rtn, held_x[name])
        assert calib[0] < calib[1] and held[0] < held[1], (name, calib, held)
        ratios.append(held[0] / held[1])
    assert sum(ratios) / len(ratios) < 0.7                                     # clearly below, on average


def test_hessian_error_is_the_layer_output_error():
    torch.manual_seed(4)
    w, w_q, x = torch.randn(5, 12), torch.randn(5, 12), torch.randn(30, 12)
    assert Q.hessian_error(w, w_q, Q.hessian(x)) == pytest.approx(Q.layer_output_error(w, w_q, x), rel=1e-5)


def test_gptq_bounded_below_by_brute_force_optimum():
    torch.manual_seed(0)
    bits, k = 2, 6
    w = torch.randn(1, k)
    x = torch.randn(40, k) @ torch.randn(k, k)                                # correlated inputs
    H = Q.hessian(x)
    r = Q.gptq_quantize(w, H, bits=bits, group_size=None, sym=False, percdamp=0.0)
    scale, zero = Q.weight_qparams(w, bits, sym=False)
    best = float("inf")
    for combo in itertools.product(range(-2, 2), repeat=k):                    # every code vector on the grid
        w_q = (torch.tensor(combo, dtype=torch.float32)[None] - zero) * scale
        best = min(best, Q.layer_output_error(w, w_q, x))
    e_gptq, e_rtn = Q.layer_output_error(w, r.weight, x), Q.layer_output_error(w, _rtn(w, bits, None), x)
    assert best <= e_gptq + 1e-6 and e_gptq <= e_rtn + 1e-6, (best, e_gptq, e_rtn)


def test_gptq_lazy_batches_equal_one_column_updates_and_groups_store():
    torch.manual_seed(1)
    w = torch.randn(16, 96) * 0.1
    x = torch.randn(200, 96)
    H = Q.hessian(x)
    a = Q.gptq_quantize(w, H, bits=4, group_size=32, blocksize=1)
    b = Q.gptq_quantize(w, H, bits=4, group_size=32, blocksize=40)
    torch.testing.assert_close(a.weight, b.weight, rtol=1e-4, atol=1e-5)
    q = Q.QuantLinear.from_codes(b.codes, b.scales, b.zeros, None, None, 4, 32)
    torch.testing.assert_close(q.dequantize_weight(), b.weight, rtol=0, atol=1e-6)


def test_gptq_act_order_unpermutes_with_groups():
    torch.manual_seed(2)
    w = torch.randn(12, 64) * 0.1
    x = torch.randn(300, 64) * torch.linspace(0.1, 3, 64)                     # distinct diag(H)
    H = Q.hessian(x)
    r = Q.gptq_quantize(w, H, bits=4, group_size=16, act_order=True)
    assert r.perm is not None and not torch.equal(r.perm, torch.arange(64))
    # permuting the problem's columns permutes the answer: the un-permutation is right
    p = torch.randperm(64)
    rp = Q.gptq_quantize(w[:, p], H[p][:, p], bits=4, group_size=16, act_order=True)
    torch.testing.assert_close(rp.weight, r.weight[:, p], rtol=1e-5, atol=1e-6)
    # each group holds group_size columns of the quantization order, and the stored layer agrees
    assert torch.bincount(r.g_idx).tolist() == [16] * 4
    q = Q.QuantLinear.from_codes(r.codes, r.scales, r.zeros, r.g_idx, None, 4, 16)
    torch.testing.assert_close(q.dequantize_weight(), r.weight, rtol=0, atol=1e-6)
    assert Q.state_dict_bytes(q) == 12 * 32 + 12 * 4 * 2 + 12 * 4 + 64 * 4    # codes, scales, zeros, g_idx
    assert Q.layer_output_error(w, r.weight, x) < Q.layer_output_error(w, _rtn(w, 4, 16), x)


def test_gptq_dead_columns_and_bad_input():
    torch.manual_seed(3)
    w = torch.randn(8, 32)
    x = torch.randn(100, 32)
    x[:, [4, 9]] = 0                                                           # inputs never used
    r = Q.gptq_quantize(w, Q.hessian(x), bits=4, group_size=None)
    assert torch.isfinite(r.weight).all()
    assert torch.equal(r.weight[:, [4, 9]], torch.zeros(8, 2))
    with pytest.raises(ValueError, match="H"):
        Q.gptq_quantize(w, torch.eye(31))
    with pytest.raises(ValueError, match="percdamp"):
        Q.gptq_quantize(w, torch.eye(32), percdamp=-1)


def test_gptq_model_is_sequential_and_stores_packed():
    m = small_model()
    calib = batches(3)
    qm = Q.quantize_model(m, "gptq", bits=4, group_size=32, calib=calib, act_order=True)
    lins = [mod for mod in qm.modules() if isinstance(mod, Q.QuantLinear)]
    assert len(lins) == 7 * 2 and all(mod.g_idx is not None for mod in lins)
    with torch.no_grad():
        b = batches(1, seed=9)[0]
        rel = (qm(b) - m(b)).norm() / m(b).norm()
    assert rel < 0.2
