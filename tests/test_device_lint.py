"""Device lint: every torch factory call in course_lib says which device it creates on.

A tensor or generator made with no ``device=`` lands on the CPU (or on whatever ``torch.set_default_device``
says), so a function whose data is on a GPU mixes devices: "Expected all tensors to be on the same
device", or a seeded draw that silently comes from another generator. The library's rule: create on the
data's device (``device=x.device``, ``torch.Generator(device=x.device)``, ``x.new_zeros(...)``,
``torch.zeros_like(x)``); a deliberate host tensor says so with ``device="cpu"``.

This test parses every ``course_lib/**/*.py`` (no import, no GPU needed) and fails, naming file:line, on a
call ``torch.<factory>(...)`` with no ``device=`` keyword. ``device=None`` counts as saying it (the
PyTorch convention for module constructors: ``None`` = the default / ambient ``torch.device(...)`` context).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"

FACTORIES = frozenset({"tensor", "arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint",
                       "randperm", "linspace", "Generator",
                       # the same kind; as_tensor too: a list becomes a tensor on the default device
                       "as_tensor", "eye", "logspace", "empty_strided", "scalar_tensor", "tril_indices",
                       "triu_indices"})

# Deliberate host tensors that cannot simply say device="cpu" in the code (prefer writing
# device="cpu" at the call: it documents the choice where it is made). Keyed by (file, enclosing
# function's qualified name, factory name) so that the entry survives edits of line numbers; the value
# says why. test_host_allow_list_is_not_stale fails on an entry that no longer matches anything.
HOST_ALLOWED: dict[tuple[str, str, str], str] = {}


def _torch_aliases(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """Names bound to the torch module (import torch [as th]) and names imported from it (from torch import
    tensor [as t]) -> the factory they stand for."""
    modules, direct = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch":
                    modules.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            for a in node.names:
                if a.name in FACTORIES:
                    direct[a.asname or a.name] = a.name
    return modules or {"torch"}, direct


class _Finder(ast.NodeVisitor):
    def __init__(self, modules: set[str], direct: dict[str, str]):
        self.modules, self.direct = modules, direct
        self.scope: list[str] = []
        self.found: list[tuple[int, str, str]] = []   # (line, qualname, factory)

    def _visit_scope(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_scope

    def visit_Call(self, node: ast.Call):
        f = node.func
        name = None
        if isinstance(f, ast.Attribute) and f.attr in FACTORIES and isinstance(f.value, ast.Name) \
                and f.value.id in self.modules:
            name = f.attr
        elif isinstance(f, ast.Name) and f.id in self.direct:
            name = self.direct[f.id]
        if name is not None:
            says = any(kw.arg == "device" or kw.arg is None for kw in node.keywords)  # None: **kwargs
            says = says or (name == "Generator" and bool(node.args))                 # torch.Generator(dev)
            if not says:
                self.found.append((node.lineno, ".".join(self.scope) or "<module>", name))
        self.generic_visit(node)


def find_implicit_device_calls(source: str, filename: str = "<string>") -> list[tuple[int, str, str]]:
    """(line, enclosing qualname, factory) of every torch factory call in `source` without device=."""
    tree = ast.parse(source, filename=filename)
    finder = _Finder(*_torch_aliases(tree))
    finder.visit(tree)
    return sorted(finder.found)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _scan() -> dict[str, list[tuple[int, str, str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = _rel(path)
        out[rel] = find_implicit_device_calls(path.read_text(encoding="utf-8"), rel)
    return out


# --------------------------------------------------------------------------------------------------
# the checker itself
# --------------------------------------------------------------------------------------------------
PLANTED = '''
import torch
import torch as th
from torch import randn as rn

def f(x):
    g = torch.Generator().manual_seed(0)                # 7: planted
    a = torch.zeros(3, dtype=torch.long)                # 8: planted
    b = torch.arange(5, device=x.device)                # fine
    c = th.tensor([1, 2])                               # 10: planted (alias)
    d = rn(2, 2)                                        # 11: planted (from-import)
    e = torch.zeros_like(x)                             # fine: follows x
    h = torch.randint(0, 9, (2,), generator=g,
                      dtype=torch.long)                 # 13: planted, a call over two lines
    i = torch.empty(2, device="cpu")                    # fine: a host tensor that says so
    j = torch.ones(2, **kw)                             # fine: cannot tell, assume it is passed
    k = torch.Generator(x.device)                       # fine: Generator's one positional is the device
    return torch.tensor(1.0).to(x.device)               # 18: planted (created on the CPU, then copied)

class M:
    def __init__(self, dim, device=None):
        self.w = torch.ones(dim, device=device)         # fine: the constructor convention
        self.b = torch.zeros(dim)                       # 23: planted
'''


def test_checker_flags_the_planted_calls_and_only_those():
    found = find_implicit_device_calls(PLANTED)
    assert [line for line, _, _ in found] == [7, 8, 10, 11, 13, 18, 23]
    assert found[0] == (7, "f", "Generator") and found[-1] == (23, "M.__init__", "zeros")
    assert find_implicit_device_calls("import torch\nx = torch.tensor([1], device='cpu')\n") == []


def test_checker_fails_the_lint_on_a_planted_file(tmp_path, monkeypatch):
    """The real lint, pointed at a package holding one bad file, fails and names file:line."""
    fake = tmp_path / "course_lib"
    (fake / "sub").mkdir(parents=True)
    (fake / "sub" / "bad.py").write_text("import torch\n\n\ndef f(x):\n    return torch.randn(3)\n")
    (fake / "good.py").write_text("import torch\nX = torch.randn(3, device='cpu')\n")
    me = sys.modules[__name__]
    monkeypatch.setattr(me, "ROOT", tmp_path)
    monkeypatch.setattr(me, "PACKAGE", fake)
    with pytest.raises(AssertionError, match=r"course_lib/sub/bad\.py:5 .*torch\.randn"):
        test_course_lib_factories_name_a_device()


# --------------------------------------------------------------------------------------------------
# the lint
# --------------------------------------------------------------------------------------------------
def test_course_lib_factories_name_a_device():
    problems = []
    for rel, found in _scan().items():
        for line, qual, name in found:
            if (rel, qual, name) in HOST_ALLOWED:
                continue
            problems.append(f"{rel}:{line} in {qual}: torch.{name}(...) without device=")
    assert not problems, (
        "torch factory calls without device= (create on the data's device: device=x.device, "
        "torch.Generator(device=x.device); a deliberate host tensor says device=\"cpu\"):\n  "
        + "\n  ".join(problems))


def test_host_allow_list_is_not_stale():
    found = {(rel, qual, name) for rel, hits in _scan().items() for _, qual, name in hits}
    stale = [key for key in HOST_ALLOWED if key not in found]
    assert not stale, f"HOST_ALLOWED entries that match nothing any more (delete them): {stale}"


# --------------------------------------------------------------------------------------------------
# the same rule at run time, on a CPU-only machine
# --------------------------------------------------------------------------------------------------
def test_library_creates_nothing_on_the_default_device():
    """Data and models on the CPU, the default device "meta" (``with torch.device("meta")``): a tensor a
    library function creates without saying where lands on meta and fails when it meets the CPU data,
    as a CPU tensor would meet a model on a GPU. This catches what the lint cannot see (a list turned into
    a tensor by as_tensor, a module built inside a function) on machines without a GPU."""
    import torch

    from course_lib import distill as D
    from course_lib.kvcache import (H2OCache, LatentCache, MultiTierCache, QuantizedCache, SinkCache,
                                    SlidingWindowCache, fit_latent, stream_score)
    from course_lib.generation import generate
    from course_lib.models import LlamaConfig, LlamaForCausalLM, load_tokenizer, bundled_path
    from course_lib.quant import nf4_quantize, quantize, search_clip_ratio
    from course_lib.quant.nf4 import nf4_dequantize
    from course_lib.speculative import speculative_generate
    from course_lib.speculative.medusa import MedusaHeads, medusa_accuracy, medusa_generate, train_medusa
    from course_lib.speculative.prompt_lookup import prompt_lookup_generate

    def tiny(seed, layers=1):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        return LlamaForCausalLM(cfg).eval()

    target, draft, tok = tiny(0, 2), tiny(1), load_tokenizer(bundled_path("tiny"))
    ids = torch.randint(1, 2048, (1, 24), generator=torch.Generator().manual_seed(0))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    text = "def f(x):\n    return x + 1\n\n\n" * 20
    heads = MedusaHeads(32, 2048, num_heads=2)
    proj = fit_latent(target, [ids[0]])
    with torch.device("meta"):
        for cache in (H2OCache(4, 4), QuantizedCache(8, 4, 4), QuantizedCache(4, 4, 4), SinkCache(8, 2),
                      SlidingWindowCache(8, sinks=2), MultiTierCache(4, ((8, 8), (None, 4)), 4),
                      LatentCache(proj, target.config.rope_theta, rank=16)):
            generate(target, ids[:, :10], 4, cache=cache)
        stream_score(target, ids[0], H2OCache(4, 4), prefill=3, chunk=2)
        speculative_generate(target, draft, ids[0, :8], 8, draft_length=3)
        speculative_generate(target, draft, ids[0, :8], 8, draft_length=3, temperature=1.0,
                             generator=torch.Generator(device="cpu").manual_seed(0))
        prompt_lookup_generate(target, ids[0], 6)
        medusa_generate(target, heads, ids[:, :8], 8)
        medusa_accuracy(target, heads, [text], tok, seq_len=32, max_tokens=128)
        train_medusa(target, [text], tok, steps=2, num_heads=2, seq_len=32, batch_size=2, progress=False)
        stream = torch.arange(600, device="cpu") % 2048
        for mode in ("white_box", "black_box", "scratch"):
            D.distill(target, D.new_student(draft, seed=1), steps=2, batch_size=2, seq_len=16, mode=mode,
                      stream=stream, feature_weight=0.5, progress=False)
        quantize(x, 4, "zeropoint", "group", group_size=16).dequantize()
        search_clip_ratio(x, 3, granularity="group", group_size=16, per_scale=True)
        nf4_dequantize(nf4_quantize(x, double_quant=True))
