"""bitsandbytes' two CPU paths for a 4-bit (NF4) linear, on any CPU (``quant_eval.route_bnb_cpu``).

bitsandbytes 0.50 repacks a 4-bit weight for a fused bf16 kernel on CPUs with AVX512-BF16 ("packed") and
dequantizes it at every call elsewhere ("dequantize"). A machine exercises only its own path, so:
- the dequantize path runs end to end everywhere (forced, and as bitsandbytes' own choice on a simulated CPU
  without the feature, in a subprocess);
- the repack (pure torch, where the bundled model's 688-wide layers crashed) runs on every layer the routing
  sends to the packed path, with the module flags and the fused kernel simulated as on an AVX512-BF16 CPU,
  and its layout is decoded here and checked code for code;
- the packed path runs end to end where the CPU has the kernel (skipped elsewhere, saying why).
"""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

bnb = pytest.importorskip("bitsandbytes")
import bitsandbytes.functional as bnbF  # noqa: E402

from course_lib import quant_eval as qe  # noqa: E402
from course_lib.models import bundled_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HAS_KERNEL = qe.bnb_packed_cpu_kernel()
# bf16 activations and bf16 block scales in the fused kernel: each about 2^-9 relative, fp32 accumulation
PACKED_RTOL = 1e-2


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def hf_fp32():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(bundled_path("tiny"))).eval()


def swapped(hf_fp32, packed_flag: bool):
    """The bundled model's linears as bitsandbytes NF4 modules, not yet routed; every module's flag set as
    bitsandbytes sets it on a CPU with (True) or without (False) AVX512-BF16."""
    m = qe._swap_bnb(copy.deepcopy(hf_fp32), "nf4").eval()
    for mod in m.modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            mod.support_avx512bf16_for_cpu = packed_flag
    return m


def dequantized_reference(model):
    """The same model with each Linear4bit replaced by an nn.Linear holding bitsandbytes' dequantized weight."""
    ref = copy.deepcopy(model)
    for n, mod in list(ref.named_modules()):
        if isinstance(mod, bnb.nn.Linear4bit):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            lin.weight.data = bnbF.dequantize_4bit(mod.weight.data, mod.weight.quant_state).float()
            if mod.bias is not None:
                lin.bias.data = mod.bias.data.float()
            parent, _, child = n.rpartition(".")
            setattr(ref.get_submodule(parent), child, lin)
    return ref


def decode_packed(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Our reading of the packed layout [N, K/2] -> codes [N, K]: for each block of 32 rows and each byte
    column j, 32 bytes whose low nibbles hold rows 0-15 and high nibbles rows 16-31, each row as the pair
    (column 2j, column 2j+1)."""
    p = packed.reshape(n // 32, k // 2, 32)                          # [row block, j, byte]
    seq = torch.cat([p & 0xF, p >> 4], dim=-1)                       # [row block, j, 64]: element e -> row e // 2
    seq = seq.reshape(n // 32, k // 2, 32, 2)                        # [row block, j, row in block, column parity]
    return seq.permute(0, 2, 1, 3).reshape(n, k)


def plain_codes(data: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """bitsandbytes' plain layout: codes in row-major order, two per byte, the first in the high nibble."""
    flat = data.reshape(-1)
    return torch.stack([flat >> 4, flat & 0xF], dim=-1).reshape(n, k)


TINY_PATHS = {"q_proj": "packed", "k_proj": "packed", "v_proj": "packed", "o_proj": "packed",
              "gate_proj": "dequantize", "up_proj": "dequantize", "down_proj": "dequantize"}


def test_auto_routing_sends_the_layers_the_repack_cannot_take_to_dequantize(hf_fp32, monkeypatch):
    """Flags and kernel as on an AVX512-BF16 CPU: 'auto' keeps the packed path for the attention projections
    (N 256 or 64, K 256) and sends gate/up (N = 688, 688 % 32 = 16) and down (K = 688, not a multiple of the
    64-wide block) to the dequantize path, setting each module's flag to match."""
    monkeypatch.setattr(qe, "bnb_packed_cpu_kernel", lambda: True)
    m = swapped(hf_fp32, packed_flag=True)
    routes = qe.route_bnb_cpu(m, "auto")
    assert len(routes) == 7 * hf_fp32.config.num_hidden_layers
    for name, r in routes.items():
        assert r.path == TINY_PATHS[name.rsplit(".", 1)[1]], (name, r)
        assert m.get_submodule(name).support_avx512bf16_for_cpu is (r.path == "packed")
    assert "N=688" in routes["model.layers.0.mlp.up_proj"].why
    assert "K=688" in routes["model.layers.0.mlp.down_proj"].why
    # bitsandbytes' own choice on a CPU without the feature: every layer dequantizes
    m = swapped(hf_fp32, packed_flag=False)
    assert {r.path for r in qe.route_bnb_cpu(m, "auto").values()} == {"dequantize"}
    assert not any(mod.support_avx512bf16_for_cpu for mod in m.modules() if isinstance(mod, bnb.nn.Linear4bit))


@pytest.mark.parametrize("route", ["transformers", "by hand"])
def test_both_load_routes_go_through_the_routing(route, monkeypatch):
    """load_bnb's two routes (from_pretrained with BitsAndBytesConfig; bitsandbytes modules swapped in by hand)
    on a simulated AVX512-BF16 CPU (new modules' flag True, fused kernel there): both give the routed paths."""
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    monkeypatch.setattr(qe, "bnb_packed_cpu_kernel", lambda: True)
    if route == "by hand":
        from transformers import AutoModelForCausalLM
        plain = AutoModelForCausalLM.from_pretrained

        def refuse_quantized(*args, **kwargs):
            if "quantization_config" in kwargs:
                raise ImportError("planted refusal: accelerate is missing")
            return plain(*args, **kwargs)
        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse_quantized)
    try:
        m, info = qe.load_bnb("nf4", fallback=route == "by hand")
    except ImportError as e:
        pytest.skip(f"transformers refuses BitsAndBytesConfig here ({e}); the by-hand route is tested")
    assert info["route"] == ("transformers" if route == "transformers" else "bitsandbytes modules swapped in by hand")
    assert {n.rsplit(".", 1)[1]: r.path for n, r in info["cpu_paths"].items()} == TINY_PATHS
    for name, r in info["cpu_paths"].items():
        assert m.get_submodule(name).support_avx512bf16_for_cpu is (r.path == "packed"), name


def test_repack_is_exact_on_every_layer_routed_to_the_packed_path(hf_fp32, monkeypatch):
    """bitsandbytes' repack (pure torch; it ran at the first forward and crashed on 688) on a copy of every
    layer 'auto' sends to the packed path: decoded here, the same 4-bit codes; the block scales are the
    double-quantized ones decoded, in bf16, transposed to [K / blocksize, N]; the weight they give equals
    bitsandbytes' dequantized weight within the bf16 rounding of the scales; and bitsandbytes' inverse gives
    back the original bytes."""
    monkeypatch.setattr(qe, "bnb_packed_cpu_kernel", lambda: True)
    m = swapped(hf_fp32, packed_flag=True)
    routes = qe.route_bnb_cpu(m, "auto")
    packed_names = [n for n, r in routes.items() if r.path == "packed"]
    assert len(packed_names) == 4 * hf_fp32.config.num_hidden_layers
    nf4 = bnbF.get_4bit_type("nf4", device="cpu")
    for name in packed_names:
        w = m.get_submodule(name).weight
        qs = copy.deepcopy(w.quant_state)
        n, k = qs.shape
        bs = qs.blocksize
        codes = plain_codes(w.data, n, k)
        scales = (bnbF.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset).float()      # [N * K / bs]
        packed, pqs = bnbF._convert_weight_packed_for_cpu(w.data.clone(), copy.deepcopy(w.quant_state))
        assert packed.shape == (n, k // 2) and pqs.packing_format_for_cpu and not pqs.nested
        assert torch.equal(decode_packed(packed, n, k), codes), name
        assert pqs.absmax.dtype == torch.bfloat16
        assert torch.equal(pqs.absmax, scales.reshape(n, k // bs).T.to(torch.bfloat16)), name
        w_packed = nf4[decode_packed(packed, n, k).long()] * pqs.absmax.float().T.repeat_interleave(bs, dim=1)
        w_ref = bnbF.dequantize_4bit(w.data, w.quant_state).float()
        assert torch.all((w_packed - w_ref).abs() <= w_ref.abs() * 2 ** -8 + 1e-12), name
        back, _ = bnbF._convert_weight_packed_for_cpu_inverse(packed, pqs)
        assert torch.equal(back, w.data), name
    assert not any(getattr(mod.weight.quant_state, "packing_format_for_cpu", False)
                   for mod in m.modules() if isinstance(mod, bnb.nn.Linear4bit))     # the model itself untouched


def test_dequantize_path_end_to_end_on_any_cpu(hf_fp32):
    """Forced to the dequantize path (whatever this CPU has): every layer reports it, none is repacked by a
    forward, and the logits equal those of nn.Linear layers holding bitsandbytes' dequantized weights."""
    m = swapped(hf_fp32, packed_flag=HAS_KERNEL)
    routes = qe.route_bnb_cpu(m, "dequantize")
    assert {r.path for r in routes.values()} == {"dequantize"}
    ids = torch.randint(0, hf_fp32.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = m(ids).logits
        want = dequantized_reference(m)(ids).logits
    assert rel(got, want) < 1e-5
    assert not any(getattr(mod.weight.quant_state, "packing_format_for_cpu", False)
                   for mod in m.modules() if isinstance(mod, bnb.nn.Linear4bit))


@pytest.mark.skipif(not HAS_KERNEL, reason="this CPU has no AVX512-BF16, so bitsandbytes registered no fused "
                                           "4-bit CPU kernel: the packed path cannot run here (its repack is "
                                           "tested above on every CPU)")
def test_packed_path_end_to_end_agrees_with_the_dequantize_path():
    """On this CPU 'auto' packs the attention projections at the first forward; the logits agree with the
    all-dequantize model within bf16 (relative Frobenius error < 1e-2), and a small all-packable layer forced
    to 'packed' agrees with its dequantized weight the same way."""
    auto, info = qe.load_bnb("nf4")
    deq, _ = qe.load_bnb("nf4", cpu_path="dequantize")
    ids = torch.randint(0, auto.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, d = auto(ids).logits, deq(ids).logits
    assert rel(a, d) < PACKED_RTOL
    for name, r in info["cpu_paths"].items():
        assert getattr(auto.get_submodule(name).weight.quant_state, "packing_format_for_cpu", False) is \
            (r.path == "packed"), name
    lin = nn.Linear(128, 64).eval()
    one = nn.Sequential(qe.bnb_linear(lin, "nf4")).eval()
    assert qe.route_bnb_cpu(one, "packed")["0"].path == "packed"
    x = torch.randn(5, 128)
    want = dequantized_reference(one)(x)
    with torch.no_grad():
        got = one(x)
    assert one[0].weight.quant_state.packing_format_for_cpu and rel(got, want) < PACKED_RTOL


def test_refusals(hf_fp32, monkeypatch):
    with pytest.raises(ValueError, match="cpu_path must be one of"):
        qe.route_bnb_cpu(nn.Sequential(), "fast")
    with pytest.raises(ValueError, match="mode='int8' has one"):
        qe.load_bnb("int8", cpu_path="packed")
    # 'packed' with a layer the repack cannot take: refused, naming the layer and why
    monkeypatch.setattr(qe, "bnb_packed_cpu_kernel", lambda: True)
    with pytest.raises(ValueError, match=r"cpu_path='packed'.*mlp.gate_proj: N=688"):
        qe.route_bnb_cpu(swapped(hf_fp32, True), "packed")
    # 'packed' on a CPU without the fused kernel: refused (there it would compute wrong numbers)
    monkeypatch.setattr(qe, "bnb_packed_cpu_kernel", lambda: False)
    with pytest.raises(ValueError, match=r"cpu_path='packed' needs .*AVX512-BF16"):
        qe.route_bnb_cpu(nn.Sequential(qe.bnb_linear(nn.Linear(64, 64), "nf4")), "packed")
    # a layer already repacked by a forward cannot be sent back to the dequantize path
    one = nn.Sequential(qe.bnb_linear(nn.Linear(64, 64), "nf4"))
    w = one[0].weight
    w.data, w.quant_state = bnbF._convert_weight_packed_for_cpu(w.data, w.quant_state)
    with pytest.raises(ValueError, match="already repacked"):
        qe.route_bnb_cpu(one, "dequantize")


# A CPU without AVX512-BF16, simulated: bitsandbytes.functional.has_avx512bf16 answers False from the moment
# the module is loaded, before bitsandbytes' CPU backend registers its kernels and before any Linear4bit reads it.
NO_BF16_CPU = r'''
import importlib.abc, importlib.machinery, sys

class NoAvx512Bf16(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            module.has_avx512bf16 = lambda: False
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, NoAvx512Bf16())
'''

PROBE = r'''
import copy, json
import torch
from torch import nn
import bitsandbytes as bnb
import bitsandbytes.functional as bnbF
from course_lib import quant_eval as qe

torch.manual_seed(0)
fp = nn.Sequential(nn.Linear(256, 688), nn.Linear(688, 256), nn.Linear(256, 256)).eval()
x = torch.randn(4, 256)

def fresh():
    return qe._swap_bnb(copy.deepcopy(fp), "nf4").eval()

def reference(m, x):
    for layer in m:
        x = x @ bnbF.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float().T + layer.bias
    return x

def rel(a, b):
    return ((a - b).norm() / b.norm()).item()

out = {"kernel": qe.bnb_packed_cpu_kernel()}
m = fresh()
out["flags"] = [bool(layer.support_avx512bf16_for_cpu) for layer in m]
out["auto"] = [r.path for r in qe.route_bnb_cpu(m, "auto").values()]
with torch.no_grad():
    out["auto_err"] = rel(m(x), reference(m, x))
# the flag alone picks bitsandbytes' path: set on one layer (as an AVX512-BF16 CPU sets it), the forward repacks
# the weight and, with no fused kernel registered, the generic kernel reads the packed bytes wrongly
m = fresh()
layer = m[2]
want = x @ bnbF.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float().T + layer.bias
layer.support_avx512bf16_for_cpu = True
with torch.no_grad():
    y = layer(x)
out["forced_repacked"] = bool(getattr(layer.weight.quant_state, "packing_format_for_cpu", False))
out["forced_err"] = rel(y, want)
# flags as an AVX512-BF16 CPU sets them, then the course's routing: every layer runs, and right
m = fresh()
for layer in m:
    layer.support_avx512bf16_for_cpu = True
out["auto_forced"] = [r.path for r in qe.route_bnb_cpu(m, "auto").values()]
with torch.no_grad():
    out["auto_forced_err"] = rel(m(x), reference(m, x))
try:
    qe.route_bnb_cpu(fresh(), "packed")
    out["packed_refused"] = None
except ValueError as e:
    out["packed_refused"] = str(e)
print("RESULT " + json.dumps(out))
'''


def test_a_cpu_without_avx512bf16_simulated():
    """In a subprocess whose bitsandbytes sees no AVX512-BF16: no fused kernel is registered and new modules'
    flags are False; 'auto' dequantizes every layer, correctly; forcing one module's flag (as an AVX512-BF16
    CPU sets it) is what makes bitsandbytes repack it, and there its output is wrong, so 'packed' is refused;
    with every flag forced, 'auto' still sends all layers (688-wide ones included) to the dequantize path and
    the model runs right. Without the routing this run crashes on the 688-row layer."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", NO_BF16_CPU + PROBE], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert r["kernel"] is False and r["flags"] == [False] * 3
    assert r["auto"] == ["dequantize"] * 3 and r["auto_err"] < 1e-5
    assert r["forced_repacked"] and r["forced_err"] > 0.1, r
    assert r["auto_forced"] == ["dequantize"] * 3 and r["auto_forced_err"] < 1e-5
    assert r["packed_refused"] and "AVX512-BF16" in r["packed_refused"]
