"""Bad input across module 03 (quantized linears, LLM.int8, W8A8, SmoothQuant, AWQ, GPTQ) and module 10
(masks, Wanda, N:M, MoE): each row is one input that used to give a silent NaN, a wrong dtype, an empty
result or a bare library error, and must now raise the contract's ValueError/TypeError naming the argument
(ARCHITECTURE.md, "Errors"). Plus Wanda's per-row count against the authors' code (locuslab/wanda)."""
import pytest
import torch
import torch.nn as nn

import course_lib.quant as Q
from course_lib.quant.fp8 import FP8Linear
from course_lib.quant.linear import quantize_per_token
from course_lib.quant.llm_int8 import llm_int8_matmul, outlier_columns
from course_lib import sparsity as S
from course_lib.models.config import LlamaConfig
from course_lib.models.llama import LlamaForCausalLM

NAN, INF = float("nan"), float("inf")


def linear(in_f=16, out_f=8, bad=None, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f)
    if bad is not None:
        with torch.no_grad():
            lin.weight[1, 2] = bad
    return lin


def x_with(value=None, shape=(4, 16), seed=1):
    x = torch.randn(*shape, generator=torch.Generator(device="cpu").manual_seed(seed))
    if value is not None:
        x[1, 3] = value
    return x


def hess(in_f=16, seed=2):
    return Q.hessian(x_with(None, (64, in_f), seed))


def nan_h(in_f=16):
    H = hess(in_f)
    H[3, 3] = NAN
    return H


def indefinite_h(in_f=16):
    H = torch.eye(in_f)
    H[0, 1] = H[1, 0] = 2.0           # eigenvalues -1 and 3 on that pair: a positive diagonal, not positive definite
    return H


def small_model(bad=None):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    if bad is not None:
        with torch.no_grad():
            m.model.layers[1].mlp.up_proj.weight[3, 5] = bad
    return m


def calib_ids(n=2, T=12):
    return [torch.randint(0, 64, (1, T), generator=torch.Generator(device="cpu").manual_seed(i)) for i in range(n)]


def moe_args(n=6, d=8, e=4, k=2):
    torch.manual_seed(0)
    experts = nn.ModuleList(S.Expert(d, 12) for _ in range(e))
    x = torch.randn(n, d)
    idx = torch.stack([torch.arange(n) % e, (torch.arange(n) + 1) % e], dim=1)   # [n, k] long
    w = torch.full((n, k), 0.5)
    return x, experts, w, idx


# (id, call, exception, regex that the message must match: the argument's name and what was expected)
CASES = [
    # --- weights and inputs with NaN/Inf ------------------------------------------------------------------
    ("QuantLinear.from_linear NaN weight", lambda: Q.QuantLinear.from_linear(linear(bad=NAN)), ValueError,
     r"linear\.weight contains 1 NaN"),
    ("QuantLinear.from_linear Inf weight", lambda: Q.QuantLinear.from_linear(linear(bad=INF), bits=8), ValueError,
     r"linear\.weight contains 0 NaN and 1 Inf"),
    ("W8A8Linear.from_linear Inf weight", lambda: Q.W8A8Linear.from_linear(linear(bad=-INF)), ValueError,
     r"linear\.weight contains 0 NaN and 1 Inf"),
    ("LLMInt8Linear.from_linear NaN weight", lambda: Q.LLMInt8Linear.from_linear(linear(bad=NAN)), ValueError,
     r"linear\.weight contains 1 NaN"),
    ("gptq_quantize NaN weight", lambda: Q.gptq_quantize(linear(bad=NAN).weight, hess()), ValueError,
     r"^weight contains 1 NaN"),
    ("gptq_quantize Inf weight", lambda: Q.gptq_quantize(linear(bad=INF).weight, hess()), ValueError,
     r"^weight contains 0 NaN and 1 Inf"),
    ("gptq_quantize NaN H", lambda: Q.gptq_quantize(linear().weight, nan_h()), ValueError, r"^H contains 1 NaN"),
    ("hessian NaN x", lambda: Q.hessian(x_with(NAN, (64, 16))), ValueError, r"^x contains 1 NaN"),
    ("LLM.int8 forward NaN x", lambda: Q.LLMInt8Linear.from_linear(linear())(x_with(NAN)), ValueError,
     r"^x contains 1 NaN"),
    ("LLM.int8 forward Inf x", lambda: Q.LLMInt8Linear.from_linear(linear())(x_with(INF)), ValueError,
     r"^x contains 0 NaN and 1 Inf"),
    ("LLM.int8 forward NaN x, no outlier columns", lambda: Q.LLMInt8Linear.from_linear(linear(), threshold=0.0)(
        x_with(NAN)), ValueError, r"^x contains 1 NaN"),
    ("llm_int8_matmul NaN x", lambda: llm_int8_matmul(x_with(NAN), torch.ones(8, 16, dtype=torch.int8),
                                                        torch.ones(8)), ValueError, r"^x contains 1 NaN"),
    ("W8A8 forward NaN x (validate=True)", lambda: Q.W8A8Linear.from_linear(linear(), validate=True)(x_with(NAN)),
     ValueError, r"^x contains 1 NaN"),
    ("W8A8 forward Inf x (validate=True)", lambda: Q.W8A8Linear.from_linear(linear(), validate=True)(x_with(INF)),
     ValueError, r"^x contains 0 NaN and 1 Inf"),
    ("quantize_per_token NaN x", lambda: quantize_per_token(x_with(NAN)), ValueError, r"^x contains 1 NaN"),
    ("smooth_scales NaN act_absmax", lambda: Q.smooth_scales(torch.tensor([1.0, NAN]), torch.ones(2)), ValueError,
     r"^act_absmax contains 1 NaN"),
    ("smooth_scales Inf weight_absmax", lambda: Q.smooth_scales(torch.ones(2), torch.tensor([INF, 1.0])),
     ValueError, r"^weight_absmax contains 0 NaN and 1 Inf"),
    ("smooth_scales negative act_absmax", lambda: Q.smooth_scales(torch.tensor([1.0, -2.0]), torch.ones(2)),
     ValueError, r"^act_absmax must be >= 0"),
    ("awq_search_group NaN x", lambda: Q.awq_search_group([linear().weight], x_with(NAN), group_size=8, n_grid=2),
     ValueError, r"^x contains 1 NaN"),
    ("awq_search_group NaN weight", lambda: Q.awq_search_group([linear(bad=NAN).weight], x_with(), group_size=8,
                                                               n_grid=2), ValueError, r"^weights\[0\] contains 1 NaN"),
    ("awq_search_group empty x", lambda: Q.awq_search_group([linear().weight], torch.zeros(0, 16), group_size=8,
                                                            n_grid=2), ValueError, r"^x is empty"),
    ("awq_search_group no weights", lambda: Q.awq_search_group([], x_with(), group_size=8, n_grid=2), ValueError,
     r"^weights must be a non-empty list"),
    ("nm_mask NaN scores", lambda: S.nm_mask(x_with(NAN, (4, 16))), ValueError, r"^scores contains 1 NaN"),
    ("wanda_mask NaN weight", lambda: S.wanda_mask(linear(bad=NAN).weight, torch.ones(16), sparsity=0.5),
     ValueError, r"^weight contains 1 NaN"),
    ("wanda_mask NaN x_norm (2:4)", lambda: S.wanda_mask(linear().weight, torch.tensor([NAN] + [1.0] * 15), n=2, m=4),
     ValueError, r"^x_norm contains 1 NaN"),
    ("wanda_mask negative x_norm", lambda: S.wanda_mask(linear().weight, -torch.ones(16), sparsity=0.5),
     ValueError, r"^x_norm must be >= 0"),
    ("quantize_model rtn, NaN weight", lambda: Q.quantize_model(small_model(NAN), "rtn", group_size=16), ValueError,
     r"^model\.layers\.1\.mlp\.up_proj: linear\.weight contains 1 NaN"),
    ("quantize_model gptq, NaN weight", lambda: Q.quantize_model(small_model(NAN), "gptq", group_size=16,
                                                                 calib=calib_ids()), ValueError,
     r"^model\.layers\.1\.mlp\.up_proj: weight contains 1 NaN"),
    ("quantize_model awq, NaN weight", lambda: Q.quantize_model(small_model(NAN), "awq", group_size=16, n_grid=2,
                                                                calib=calib_ids()), ValueError,
     r"^model\.layers\.1\.mlp\.gate_up: weights\[1\] contains 1 NaN"),
    ("quantize_model smoothquant, NaN weight", lambda: Q.quantize_model(small_model(NAN), "smoothquant",
                                                                        calib=calib_ids()), ValueError,
     r"^model\.layers\.1\.mlp\.gate_up: weight_absmax contains 1 NaN"),
    ("magnitude_masks NaN weight, global", lambda: S.magnitude_masks(small_model(NAN), 0.5, "global"), ValueError,
     r"^model\.layers\.1\.mlp\.up_proj\.weight contains 1 NaN"),
    ("magnitude_masks NaN weight, per layer", lambda: S.magnitude_masks(small_model(NAN), 0.5, "layer"),
     ValueError, r"^model\.layers\.1\.mlp\.up_proj\.weight contains 1 NaN"),
    # --- integer and empty tensors -----------------------------------------------------------------------
    ("gptq_quantize int weight", lambda: Q.gptq_quantize(torch.randint(-5, 5, (8, 16)), hess()), TypeError,
     r"^weight must be a real floating-point tensor"),
    ("gptq_quantize empty weight", lambda: Q.gptq_quantize(torch.zeros(0, 16), hess()), ValueError,
     r"^weight is empty"),
    ("LLM.int8 forward int x", lambda: Q.LLMInt8Linear.from_linear(linear())(torch.randint(0, 5, (4, 16))),
     TypeError, r"^x must be a real floating-point tensor"),
    ("QuantLinear forward int x", lambda: Q.QuantLinear.from_linear(linear(), group_size=8)(
        torch.randint(0, 5, (4, 16))), TypeError, r"^x must be a real floating-point tensor"),
    ("hessian of an empty batch", lambda: Q.hessian(torch.zeros(0, 16)), ValueError, r"^x has no rows"),
    ("wanda_masks on empty calibration ids", lambda: S.wanda_masks(small_model(), torch.zeros(0, 8, dtype=torch.long),
                                                                   sparsity=0.5), ValueError, r"^ids is empty"),
    ("wanda_masks on zero-length windows", lambda: S.wanda_masks(small_model(), torch.zeros(3, 0, dtype=torch.long),
                                                                 sparsity=0.5), ValueError, r"^ids is empty"),
    ("load_balancing_loss of an empty batch", lambda: S.load_balancing_loss(torch.zeros(0, 4),
                                                                            torch.zeros(0, 2, dtype=torch.long)),
     ValueError, r"^probs holds no tokens"),
    # --- errors that must name the argument --------------------------------------------------------------
    ("dispatch capacity=-1", lambda: S.dispatch(*moe_args(), capacity=-1), ValueError,
     r"^capacity must be None or an int >= 0 .*got -1"),
    ("dispatch_loop capacity=-1", lambda: S.dispatch_loop(*moe_args(), capacity=-1), ValueError,
     r"^capacity must be None or an int >= 0 .*got -1"),
    ("dispatch capacity=2.5", lambda: S.dispatch(*moe_args(), capacity=2.5), ValueError, r"^capacity must be"),
    ("dispatch float indices", lambda: S.dispatch(*moe_args()[:3], moe_args()[3].float()), TypeError,
     r"^indices must be an integer tensor"),
    ("load_balancing_loss expert index >= E", lambda: S.load_balancing_loss(
        torch.full((3, 4), 0.25), torch.tensor([[0, 1], [2, 3], [4, 0]])), ValueError,
     r"^experts must be expert numbers in \[0, 4\), got 0\.\.4"),
    ("load_balancing_loss negative expert index", lambda: S.load_balancing_loss(
        torch.full((3, 4), 0.25), torch.tensor([[0, 1], [2, 3], [-1, 0]])), ValueError,
     r"^experts must be expert numbers in \[0, 4\)"),
    ("load_balancing_loss float experts", lambda: S.load_balancing_loss(torch.full((3, 4), 0.25), torch.zeros(3, 2)),
     TypeError, r"^experts must be an integer tensor"),
    ("QuantLinear wrong in_features", lambda: Q.QuantLinear.from_linear(linear(), group_size=8)(x_with(None, (4, 15))),
     ValueError, r"^x's last dimension must be in_features=16, got \(4, 15\)"),
    ("LLM.int8 wrong in_features", lambda: Q.LLMInt8Linear.from_linear(linear())(x_with(None, (2, 3, 15))),
     ValueError, r"^x's last dimension must be in_features=16, got \(2, 3, 15\)"),
    ("W8A8 wrong in_features", lambda: Q.W8A8Linear.from_linear(linear())(x_with(None, (4, 17))),
     ValueError, r"^x's last dimension must be in_features=16, got \(4, 17\)"),
    ("AWQ wrong in_features", lambda: Q.awq_search_group([linear().weight], x_with(None, (4, 15)), group_size=8,
                                                         n_grid=2),
     ValueError, r"^x's last dimension must be in_features=16 \(the weights' columns\), got \(4, 15\)"),
    ("AWQ weights of different in_features", lambda: Q.awq_search_group([linear().weight, linear(15).weight],
                                                                        x_with(), group_size=None, n_grid=2),
     ValueError, r"^weights\[1\] must be a 2-D \[out, in=16\] tensor"),
    ("GPTQ non-positive-definite H", lambda: Q.gptq_quantize(linear().weight, indefinite_h()), ValueError,
     r"^H is not positive definite"),
    ("GPTQ negative-definite H", lambda: Q.gptq_quantize(linear().weight, -torch.eye(16)), ValueError,
     r"^H is not positive definite"),
]


@pytest.mark.parametrize("call,exc,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_argument(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_w8a8_checks_values_only_when_asked_and_fp8_message_is_shared():
    """The W8A8 forward reads no value on the host unless validate=True (its NaN propagates, as in any matmul);
    shape and dtype are always checked. FP8Linear's message is the one every linear shares."""
    lin = linear()
    y = Q.W8A8Linear.from_linear(lin)(x_with(NAN))
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2, 3]]).all()
    assert Q.W8A8Linear.from_linear(lin, validate=True).validate
    with pytest.raises(TypeError, match=r"^x must be a real floating-point tensor"):
        Q.W8A8Linear.from_linear(lin)(torch.ones(4, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^x's last dimension must be in_features=16, got \(4, 15\)"):
        FP8Linear.from_linear(lin, act=None)(x_with(None, (4, 15)))
    with pytest.raises(TypeError, match=r"^x must be a real floating-point tensor"):
        FP8Linear.from_linear(lin, act=None)(torch.ones(4, 16, dtype=torch.long))


def test_llm_int8_reads_outliers_and_the_nan_flag_together_on_any_device(device):
    """The one host read of LLM.int8 (outlier columns + NaN/Inf flag) on the device of x: the same outlier
    columns and output as on the CPU, and the NaN refused there too."""
    lin = linear()
    x = x_with()
    x[:, 5] = 9.0                                                          # the one outlier column (|x| >= 6)
    cpu_layer = Q.LLMInt8Linear.from_linear(lin)
    ref = cpu_layer(x)
    layer = Q.LLMInt8Linear.from_linear(lin).to(device)
    y = layer(x.to(device))
    assert layer.last_outliers.device.type == device.type
    assert layer.last_outliers.tolist() == cpu_layer.last_outliers.tolist() == outlier_columns(x, 6.0).tolist() == [5]
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"^x contains 1 NaN"):
        layer(x_with(NAN).to(device))
    with pytest.raises(ValueError, match=r"^x contains 1 NaN"):
        Q.W8A8Linear.from_linear(lin, validate=True).to(device)(x_with(NAN).to(device))


def test_good_input_still_works_at_the_edges():
    """What the checks must let through: an empty batch into a linear, capacity 0, a zero weight, zero norms."""
    lin = linear()
    for layer in (Q.QuantLinear.from_linear(lin, group_size=8), Q.LLMInt8Linear.from_linear(lin),
                  Q.W8A8Linear.from_linear(lin, validate=True)):
        assert layer(torch.zeros(0, 16)).shape == (0, 8)
    y, load, dropped = S.dispatch(*moe_args(), capacity=0)
    assert dropped == 12 and int(load.sum()) == 0 and not y.any()
    assert S.wanda_mask(torch.zeros(4, 8), torch.zeros(8), sparsity=0.5).sum() == 16
    r = Q.gptq_quantize(torch.zeros(4, 16), torch.zeros(16, 16), group_size=None)   # every column dead
    assert not r.weight.any()
    assert torch.equal(Q.smooth_scales(torch.zeros(3), torch.zeros(3)), torch.ones(3))


# --- Wanda's count: the authors' int(in * s), not round ---------------------------------------------------
def authors_wanda_mask(W_metric: torch.Tensor, sparsity_ratio: float) -> torch.Tensor:
    """The unstructured branch of ``prune_wanda`` in locuslab/wanda (lib/prune.py), transcribed: True = kept."""
    W_mask = torch.zeros_like(W_metric) == 1                               # True = pruned in their code
    sort_res = torch.sort(W_metric, dim=-1, stable=True)
    indices = sort_res[1][:, :int(W_metric.shape[1] * sparsity_ratio)]
    W_mask.scatter_(1, indices, True)
    return ~W_mask


@pytest.mark.parametrize("in_f,s", [(7, 0.5), (10, 0.67), (352, 0.3), (128, 0.6), (100, 0.29)])
def test_wanda_removes_int_of_s_times_in_per_row(in_f, s):
    assert int(in_f * s) != round(in_f * s)                                # a shape where the two differ
    g = torch.Generator(device="cpu").manual_seed(in_f)
    w, xn = torch.randn(5, in_f, generator=g), torch.rand(in_f, generator=g) * 3
    mask = S.wanda_mask(w, xn, sparsity=s)
    assert (~mask).sum(dim=1).tolist() == [int(in_f * s)] * 5
    assert torch.equal(mask, authors_wanda_mask(S.wanda_scores(w, xn), s))
