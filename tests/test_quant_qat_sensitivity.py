"""QAT's straight-through estimator and model transform; the sensitivity scan and bit allocation (exact
against brute force on synthetic sensitivities; greedy never better than exact)."""
import random

import pytest
import torch
from torch import nn

from course_lib.quant import fake_quantize
from course_lib.quant.qat import QATLinear, convert_qat, fake_quantize_ste, prepare_qat, qat_finetune, \
    rtn_quantize_linears
from course_lib.quant.sensitivity import (allocate_bits, allocation_cost, brute_force_allocation, layer_groups,
                                          sensitivity_scan)


def test_ste_forward_is_the_quantized_value_and_gradient_is_identity():
    w = torch.randn(8, 64, requires_grad=True)
    y = fake_quantize_ste(w, bits=4, group_size=32)
    assert torch.equal(y.detach(), fake_quantize(w.detach(), 4, "absmax", "group", group_size=32))
    upstream = torch.randn(8, 64)
    (y * upstream).sum().backward()
    assert torch.equal(w.grad, upstream)                        # straight through: d y / d w = 1
    # without the STE the rounding would pass no gradient (round has zero derivative almost everywhere)
    v = torch.randn(4, 8, requires_grad=True)
    torch.round(v * 3).sum().backward()
    assert v.grad.abs().sum() == 0


def _tiny_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))


def test_prepare_convert_qat_shares_parameters_and_bakes_the_grid():
    net = _tiny_net()
    w0 = net[0].weight
    prepare_qat(net, bits=3, group_size=16, skip=())
    assert isinstance(net[0], QATLinear) and net[0].weight is w0
    x = torch.randn(5, 32)
    y_qat = net(x)
    convert_qat(net)
    assert type(net[0]) is nn.Linear
    assert torch.allclose(net(x), y_qat, atol=1e-6)
    assert torch.equal(net[0].weight, fake_quantize(w0.detach(), 3, "absmax", "group", group_size=16))
    with pytest.raises(ValueError, match="group_size"):
        prepare_qat(_tiny_net(), 4, group_size=24, skip=())


def test_qat_finetune_beats_ptq_on_a_regression_task():
    """A toy problem: learn to imitate a float teacher whose rounded weights are poor; QAT's training through
    the rounding must end below RTN of the same teacher (the same grid)."""
    teacher = _tiny_net()
    x = torch.randn(256, 32, generator=torch.Generator().manual_seed(1))
    ptq = rtn_quantize_linears(_tiny_net(), bits=2, group_size=16, skip=())
    err_ptq = float(((ptq(x) - teacher(x)) ** 2).mean().detach())
    student = prepare_qat(_tiny_net(), bits=2, group_size=16, skip=())

    class AsLM(nn.Module):        # qat_finetune's loss is next-token: wrap the regression as logits over 32 "tokens"
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, ids):
            return self.f(x[: ids.shape[1]])[None]
    t, s = AsLM(teacher), AsLM(student)
    losses = qat_finetune(s, [torch.zeros(1, 257, dtype=torch.long)], steps=60, lr=3e-3, teacher=t, ce_weight=0.0,
                          progress=False)
    convert_qat(student)
    err_qat = float(((student(x) - teacher(x)) ** 2).mean().detach())
    assert losses[-1] < losses[0] and err_qat < 0.7 * err_ptq, (err_qat, err_ptq)
    with pytest.raises(ValueError, match="teacher"):
        qat_finetune(s, [torch.zeros(1, 3, dtype=torch.long)], 1, ce_weight=0.0)


def test_sensitivity_scan_restores_weights_and_finds_the_sensitive_group():
    net = _tiny_net()
    with torch.no_grad():
        net[2].weight.mul_(10)                                 # the second layer dominates the output
    x = torch.randn(64, 32)
    ref = net(x).detach()
    before = [p.detach().clone() for p in net.parameters()]
    out = sensitivity_scan(net, lambda m: float(((m(x) - ref) ** 2).mean()), {"first": ["0"], "second": ["2"]},
                           lambda w, b: fake_quantize(w, b, "absmax", "group", group_size=16), bits=(8, 3),
                           progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    d = out["delta"]
    assert out["base"] == 0 and d["second"][3] > d["first"][3] > 0 and d["second"][3] > d["second"][8]
    assert out["size"] == {"first": 32 * 64, "second": 64 * 32}


def test_layer_groups_of_a_llama_shaped_module():
    m = nn.Module()
    m.layers = nn.ModuleList([nn.ModuleDict({"q_proj": nn.Linear(4, 4), "down_proj": nn.Linear(4,
                                                                                               4)}) for _ in range(2)])
    m.lm_head = nn.Linear(4, 4)
    assert layer_groups(m) == {"layers.0": ["layers.0.q_proj", "layers.0.down_proj"],
                               "layers.1": ["layers.1.q_proj", "layers.1.down_proj"]}
    assert len(layer_groups(m, "linear")) == 4


def _synthetic(rng, n):
    size = {f"g{i}": rng.choice([1000, 2000, 4000]) for i in range(n)}
    delta = {}
    for g in size:
        s = rng.uniform(0.01, 1.0)                             # a sensitivity; narrower bits cost more
        delta[g] = {8: s * rng.uniform(0, 0.01), 4: s * rng.uniform(0.1, 0.3), 3: s * rng.uniform(0.5, 1.5)}
    return delta, size


def test_exact_allocation_equals_brute_force_and_greedy_is_never_better():
    rng = random.Random(0)
    for trial in range(30):
        delta, size = _synthetic(rng, rng.randint(2, 7))
        lo = sum(s * 3 / 8 for s in size.values())
        hi = sum(s * 8 / 8 for s in size.values())
        budget = rng.uniform(lo, hi)
        exact = allocate_bits(delta, size, budget)
        brute = brute_force_allocation(delta, size, budget)
        ce, le = allocation_cost(exact, delta, size)
        _, lb = allocation_cost(brute, delta, size)
        assert ce <= budget + 1e-9 and le == pytest.approx(lb, abs=1e-12), trial
        greedy = allocate_bits(delta, size, budget, method="greedy")
        cg, lg = allocation_cost(greedy, delta, size)
        assert cg <= budget + 1e-9 and lg >= le - 1e-12


def test_allocation_edges():
    delta = {"a": {8: 0.0, 4: 1.0}, "b": {8: 0.0, 4: 5.0}}
    size = {"a": 8, "b": 8}
    assert allocate_bits(delta, size, 16) == {"a": 8, "b": 8}            # everything fits at 8 bits
    assert allocate_bits(delta, size, 12) == {"a": 4, "b": 8}            # narrow the less sensitive one
    with pytest.raises(ValueError, match="below the smallest"):
        allocate_bits(delta, size, 7)
    with pytest.raises(ValueError, match="method"):
        allocate_bits(delta, size, 12, method="annealing")
