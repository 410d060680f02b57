"""The one linear walker and the one module swap (course_lib/modules.py), and that every transform's selection
is theirs: quantization, QAT, the sensitivity groups and pruning touch the same linears."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from course_lib import quant as Q
from course_lib import sparsity as S
from course_lib.models import load
from course_lib.modules import layer_index, name_matches, named_linears, replace_module
from course_lib.quant.qat import QATLinear, convert_qat, prepare_qat
from course_lib.quant.sensitivity import layer_groups
from course_lib.quant.transform import to_gguf

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


def tricky() -> nn.Module:
    """Names a substring rule gets wrong: lm_head_proj / my_lm_head beside lm_head, gate beside gate_proj,
    experts in a ModuleList nested in a ModuleList, a list called xlayers, and non-linears."""
    m = nn.Module()
    m.embed = nn.Embedding(10, 4)
    m.layers = nn.ModuleList(nn.ModuleDict({
        "gate": nn.Linear(4, 2), "gate_proj": nn.Linear(4, 8), "norm": nn.LayerNorm(4),
        "experts": nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)) for _ in range(2)),
    }) for _ in range(2))
    m.xlayers = nn.ModuleList([nn.Linear(4, 4)])
    m.lm_head_proj = nn.Linear(4, 4)
    m.my_lm_head = nn.Linear(4, 4)
    m.lm_head = nn.Linear(4, 4)
    return m


def rule(model, skip=("lm_head",)):
    """The intended rule, written out independently: every nn.Linear whose dotted name does not end in
    ".<s>" (or equal <s>) for a skip entry s."""
    out = []
    for n, m in model.named_modules():
        parts = n.split(".")
        skipped = any(parts[len(parts) - len(s.split(".")):] == s.split(".") for s in skip)
        if isinstance(m, nn.Linear) and not skipped:
            out.append(n)
    return out


def test_the_walker_follows_the_rule_on_tricky_names():
    m = tricky()
    got = list(named_linears(m))
    assert got == rule(m)
    assert "lm_head" not in got and {"lm_head_proj", "my_lm_head", "xlayers.0"} <= set(got)
    assert "layers.1.experts.0.2" in got and len(got) == 2 * (2 + 2 * 2) + 3
    # "gate" leaves out the routers, never a gate_proj; a dotted entry names one place in every layer
    no_gate = list(named_linears(m, skip=("lm_head", "gate")))
    assert no_gate == rule(m, ("lm_head", "gate"))
    assert not any(n.endswith(".gate") for n in no_gate) and "layers.0.gate_proj" in no_gate
    assert list(named_linears(m, skip=("experts.1.0",))) == rule(m, ("experts.1.0",))
    assert "layers.0.experts.1.0" not in named_linears(m, skip=("experts.1.0",))
    assert list(named_linears(m, skip="lm_head")) == got                   # one name, not its letters
    assert list(named_linears(m, skip=())) == rule(m, ())
    # a second pass over another class (convert_qat walks its QATLinears): subclasses count as nn.Linear
    prepare_qat(m, bits=4, group_size=None, skip=("lm_head", "gate"))
    assert list(named_linears(m, skip=(), types=QATLinear)) == no_gate
    assert list(named_linears(m)) == got


def test_every_transform_selects_what_the_walker_selects():
    m = tricky()
    want = rule(m)
    assert list(S.prunable_linears(m)) == want
    assert [n for g in layer_groups(m).values() for n in g] == want
    assert list(layer_groups(m, "linear")) == want
    # groups by decoder layer on dots: xlayers.0 is no decoder layer
    assert set(layer_groups(m)) == {"layers.0", "layers.1", "xlayers.0", "lm_head_proj", "my_lm_head"}
    q = Q.quantize_model(m, "w8a8")
    assert [n for n, x in q.named_modules() if isinstance(x, Q.W8A8Linear)] == want
    qat = prepare_qat(tricky(), bits=4, group_size=None)
    assert [n for n, x in qat.named_modules() if isinstance(x, QATLinear)] == want
    assert not any(isinstance(x, QATLinear) for x in convert_qat(qat).modules())


@pytest.fixture(scope="module")
def tiny():
    return load("tiny", device="cpu", verbose=False)[0]


def test_the_walker_on_the_bundled_model(tiny):
    want = [f"model.layers.{i}.{p}" for i in range(tiny.config.num_hidden_layers) for p in PROJ]
    assert list(named_linears(tiny)) == want == rule(tiny)                 # the tied lm_head left out
    assert list(S.prunable_linears(tiny)) == want
    assert list(layer_groups(tiny)) == [f"layers.{i}" for i in range(tiny.config.num_hidden_layers)]
    assert all(layer_index(n) == int(n.split(".")[2]) for n in want) and layer_index("lm_head") is None
    assert tiny.lm_head.weight is tiny.model.embed_tokens.weight             # why it is skipped


def test_name_matches_cuts_on_dots():
    assert name_matches("model.lm_head", "lm_head") and name_matches("lm_head", ("x", "lm_head"))
    assert not name_matches("lm_head_proj", "lm_head") and not name_matches("my_lm_head", "lm_head")
    assert not name_matches("mlp.gate_proj", "gate") and name_matches("layers.0.mlp.gate", "mlp.gate")
    assert layer_index("xlayers.3.q") is None and layer_index("model.layers.12.mlp.up_proj") == 12


def test_replace_module_swaps_in_place_and_returns_the_old_one():
    m = tricky()
    old = m.layers[1].experts[0][2]
    new = nn.Linear(4, 4)
    assert replace_module(m, "layers.1.experts.0.2", new) is old
    assert m.layers[1].experts[0][2] is new and m.get_submodule("layers.1.experts.0.2") is new
    head = nn.Identity()
    replace_module(m, "lm_head", head)
    assert m.lm_head is head


@pytest.mark.parametrize("name", ["lm_head.weight", "layers.0.gate.bias", "layers.7.gate", "nope", "",
                                  "layers.0.missing", "layers..gate", "embed.weight"])
def test_replace_module_refuses_a_name_that_is_not_a_module(name):
    m = tricky()
    before = {n: id(x) for n, x in m.named_modules()}
    want = r"^name must name a submodule of the model .*got " + re.escape(repr(name)) + "$"
    with pytest.raises(ValueError, match=want):
        replace_module(m, name, nn.Linear(4, 4))
    assert {n: id(x) for n, x in m.named_modules()} == before               # nothing was added or swapped
    assert isinstance(m.lm_head.weight, nn.Parameter)


def test_bad_arguments_name_themselves():
    m = tricky()
    with pytest.raises(TypeError, match=r"^model must be an nn\.Module"):
        named_linears(torch.zeros(2))
    with pytest.raises(ValueError, match=r"^skip must hold dotted module names"):
        named_linears(m, skip=(".lm_head",))
    with pytest.raises(ValueError, match=r"^skip must hold dotted module names"):
        named_linears(m, skip=("lm_head", 3))
    with pytest.raises(TypeError, match=r"^types must be nn\.Module classes"):
        named_linears(m, types=int)
    with pytest.raises(TypeError, match=r"^new must be an nn\.Module"):
        replace_module(m, "lm_head", torch.zeros(2))
    with pytest.raises(TypeError, match=r"^name must be a dotted module name"):
        replace_module(m, 0, nn.Linear(4, 4))
    with pytest.raises(TypeError, match=r"^mix must be a dict"):
        to_gguf(m, mix=["v_proj"])
