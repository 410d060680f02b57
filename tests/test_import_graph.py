"""The import graph of course_lib: no cycles, no module imports a layer above its own, and no folder
imports a layer above its own.

The layers (bottom to top) are the ones ARCHITECTURE.md describes; every module of the package must be
placed in one, so a new module is placed deliberately. A folder (a subpackage) sits at the lowest layer of
its modules, and nothing in it imports from outside it above that layer: a folder is one place on the
layer ladder, so a reader who knows where a folder sits knows what it may use. Imports inside functions
count like any other (a lazy import hides a cycle from Python at import time, not from a reader).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "course_lib"

# module prefix -> layer; the longest matching prefix wins. Keep in step with ARCHITECTURE.md.
LAYERS = {
    # 1. foundations: no model, no cache
    "course_lib": 1, "course_lib.env": 1, "course_lib.attention": 1, "course_lib.quant": 1, "course_lib.perf": 1,
    "course_lib.sampling": 1, "course_lib.models.config": 1,
    # 2. the model and its registry
    "course_lib.models": 2, "course_lib.models.llama": 2, "course_lib.models.corpus": 2,
   
    # 3. KV caches, and the device bench that times a decode step over one
    "course_lib.kvcache": 3, "course_lib.device_bench": 3,
    # 4. the generate loop; paged KV memory
    "course_lib.generation": 4, "course_lib.paged": 4,
    # 5. techniques built on generation and caches
    "course_lib.speculative": 5, "course_lib.distill": 5, "course_lib.serving": 5, "course_lib.sparsity": 5,
    "course_lib.parallel": 5,
    "course_lib.quant_eval": 5,
    "course_lib.compile_tools": 5, "course_lib.capstone": 5,
    # 6. applications: training scripts, widgets, command line, grading
    "course_lib.training": 6, "course_lib.viz": 6,
    "course_lib.doctor": 6, "course_lib.cli": 6, "course_lib.bench": 6, "course_lib.grading": 6,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The course_lib modules that ``name`` imports, anywhere in the file (package faces included)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name` imports mod
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:          # `import course_lib.x.y` of a name inside a module
                t = t.rpartition(".")[0]
            if t.startswith("course_lib") and t != name:
                found.add(t)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def layer(name: str, layers: dict[str, int] = LAYERS) -> int | None:
    best = max((p for p in layers if name == p or name.startswith(p + ".")), key=len, default=None)
    return None if best is None else layers[best]


def folder(name: str) -> str:
    """The subpackage a module lives in (a package face is in its own folder); a top-level module of
    course_lib is a place of its own."""
    parent = name if MODULES.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    return name if parent in ("course_lib", "") else parent


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int] = LAYERS) -> list[str]:
    return [f"{src} (layer {layer(src, layers)}) imports {dst} (layer {layer(dst, layers)})"
            for src, dsts in graph.items() for dst in sorted(dsts)
            if src != "course_lib" and layer(src, layers) < layer(dst, layers)]


def folder_upward_imports(graph: dict[str, set[str]], layers: dict[str, int] = LAYERS) -> list[str]:
    """Imports that leave a folder for a layer above the folder's lowest module: the folder holds modules
    of several layers and its higher ones reach up (what `models/` did with its training scripts)."""
    lowest: dict[str, int] = {}
    for m in graph:
        if m != "course_lib":
            lowest[folder(m)] = min(lowest.get(folder(m), 99), layer(m, layers))
    return [f"{src} in {folder(src)}/ (a layer-{lowest[folder(src)]} folder) imports {dst} (layer "
            f"{layer(dst, layers)})"
            for src, dsts in graph.items() if src != "course_lib" for dst in sorted(dsts)
            if folder(dst) != folder(src) and layer(dst, layers) > lowest[folder(src)]]


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer(m) is None]
    assert not missing, f"modules with no layer in LAYERS (place them, and in ARCHITECTURE.md): {missing}"


def test_no_upward_imports():
    upward = upward_imports(GRAPH)
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_folder_imports_above_its_layer():
    upward = folder_upward_imports(GRAPH)
    assert not upward, "imports from a folder to a layer above it:\n" + "\n".join(upward)


def test_the_checker_sees_a_planted_upward_import_from_models():
    # the model importing the generate loop: an upward import, caught module by module
    planted = {**GRAPH, "course_lib.models.llama": GRAPH["course_lib.models.llama"] | {"course_lib.generation"}}
    assert upward_imports(planted) == ["course_lib.models.llama (layer 2) imports course_lib.generation (layer 4)"]
    # a training script placed back in models/ at layer 6: no module-level arrow points up, but the folder
    # (layer 1, for models.config) now imports distillation (layer 5); the layout before this test existed
    old_layers = {**LAYERS, "course_lib.models.distill_draft": 6}
    planted = {**GRAPH, "course_lib.models.distill_draft": {"course_lib.distill", "course_lib.models"}}
    assert not upward_imports(planted, old_layers)
    assert folder_upward_imports(planted, old_layers) == [
        "course_lib.models.distill_draft in course_lib.models/ (a layer-1 folder) imports course_lib.distill (layer 5)"]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the cycles of the graph (components of more than one module, or a self-loop)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # a package face (__init__) imports its own submodules and they import siblings through it: that is not
    # a cycle of design, so edges from a submodule to its own package face are left out
    graph = {m: {d for d in ds if not m.startswith(d + ".")} for m, ds in GRAPH.items()}
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles (each line: modules that import each other in a loop):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_checker_sees_cycles_and_upward_imports():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    assert layer("course_lib.models.config") == 1 and layer("course_lib.models.llama") == 2
    assert layer("course_lib.training.train") == 6 and layer("course_lib.paged.cache") == 4
    assert layer("course_lib.models.train") == 2      # nothing of layer 6 left in models/


@pytest.mark.parametrize("name", ["course_lib.paged.attention", "course_lib.serving"])
def test_relative_imports_resolve(name):
    if name not in MODULES:
        pytest.skip(f"{name} does not exist")
    assert all(t in MODULES for t in GRAPH[name])


def test_grading_imports_nothing_from_the_course():
    # the instructor pipeline runs untrusted submissions; it must not depend on (or be changed by) the course code
    leaks = [f"{src} imports {dst}" for src, dsts in GRAPH.items() if src.startswith("course_lib.grading")
             for dst in sorted(dsts) if not dst.startswith("course_lib.grading")]
    assert not leaks, "\n".join(leaks)
