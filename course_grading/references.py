"""Which `course_lib` names are the answers of a lab: the references its judge grades against.

Each lab's judge (``judges/labNN.py``) names, per graded part, the library names the part is graded against
(`judging.Judge.references`): a student's cell that imports one of these names, or the module holding one,
is handing in the reference instead of an answer, and that part is flagged for review (the kernel's copy of
course_lib does not even hold the withheld ones: `sandbox.withhold`). The check helpers (`course_lib.checks`)
are never answers.

    answer_table(source_nb, references) -> AnswerTable(tests: {test grade_id: [answer names]},
                                                      references: {test grade_id: {"module.name", ...}})
    reference_imports(cells, table)     -> {test grade_id: ["cell 3: from course_lib.perf.ops import matmul_cost"]}

A private name of the library (`from course_lib.attention.triton_flash import _flash_fwd_kernel`, or
`tf._flash_fwd_kernel` on an imported module) is flagged as well: no lab asks for one.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .build import grade_id, is_answer, nbgrader_meta

NOT_ANSWERS = ("course_lib.checks",)


@dataclass
class AnswerTable:
    tests: dict = field(default_factory=dict)       # test grade_id -> names the answer cells define
    references: dict = field(default_factory=dict)  # test grade_id -> qualified reference names

    @property
    def modules(self) -> dict:
        """test grade_id -> modules that are, or hold, a reference (never the top-level package)."""
        out = {}
        for g, refs in self.references.items():
            mods = {q if _is_module(q) else q.rsplit(".", 1)[0] for q in refs}
            out[g] = {m for m in mods if "." in m}
        return out


def _is_module(qualified: str) -> bool:
    """Is `course_lib.a.b` a module (a file or package of the installed course_lib)? No import needed."""
    root = Path(__file__).resolve().parents[1] / "course_lib"  # beside this package (one distribution)
    rel = qualified.split(".")[1:]
    if not rel:
        return True
    p = root.joinpath(*rel)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _parse(src: str):
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError):
        # cells may hold IPython syntax (magics); keep the lines that parse on their own
        body = []
        for ln in src.split("\n"):
            try:
                body += ast.parse(ln.strip()).body
            except (SyntaxError, ValueError):
                continue
        return ast.Module(body=body, type_ignores=[])


def _imports(tree, aliases: bool = False) -> list[tuple]:
    """(module, name or None, line[, alias]) for every import in `tree` (also inside functions)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) + ((a.asname or a.name,) if aliases else ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.module, a.name, node.lineno) + ((a.asname or a.name,) if aliases else ())
                    for a in node.names]
    return out


def _defined(src: str) -> list[str]:
    names = []
    for node in _parse(src).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
    return names


def answer_table(source_nb, references: dict | None = None) -> AnswerTable:
    """The names each test cell's answers define (the answer cells since the previous test cell), and the
    references the judge grades each part against (`references`: {grade_id: [qualified names]})."""
    table = AnswerTable()
    current: list[str] = []
    after_test = True
    for c in source_nb.cells:
        m = nbgrader_meta(c)
        if m is None or c.cell_type != "code":
            continue
        if is_answer(c):
            if after_test:
                current, after_test = [], False
            current = current + [n for n in _defined(c.source) if n not in current]
            continue
        if m.get("grade"):
            after_test = True
            gid = grade_id(c)
            table.tests[gid] = list(current)
            table.references[gid] = {q for q in (references or {}).get(gid, ())
                                     if q.startswith("course_lib") and not q.startswith(NOT_ANSWERS)}
    return table


def _private(name: str | None) -> bool:
    return bool(name) and name.startswith("_") and not name.startswith("__")


def _private_uses(tree) -> set[str]:
    """`alias._name` where alias is a course_lib module imported in `tree` (or `course_lib.a._name`
    written out): the library's internals reached through an attribute."""
    modules = {alias for mod, name, _, alias in _imports(tree, aliases=True)
               if mod.startswith("course_lib") and not mod.startswith(NOT_ANSWERS)
               and (name is None or _is_module(f"{mod}.{name}"))}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = ast.unparse(node.value)
            if base in modules or (base.startswith("course_lib.") and not base.startswith(NOT_ANSWERS)):
                out.add(f"{base}.{node.attr}")
    return out


def reference_imports(cells, table: AnswerTable, release_cells=()) -> dict[str, list[str]]:
    """Imports of answer references in a submission's own cells (not its test cells, not imports the
    release itself makes), by test grade_id; and the library's private names (`from course_lib.x import
    _kernel`, `x._kernel`), which no lab asks for and which may hold the very thing an exercise asks to
    write (the library's own kernel under another module than the reference): flagged for the tests whose
    answers that cell defines (every test, when it defines none of them)."""
    found: dict[str, list[str]] = {}
    mods = table.modules

    def add(gid, what):
        if what not in found.setdefault(gid, []):
            found[gid].append(what)

    release_trees = [_parse(str(c.get("source", ""))) for c in release_cells if c.get("cell_type") == "code"]
    allowed = {i[:2] for t in release_trees for i in _imports(t)}
    allowed_uses = set().union(*(_private_uses(t) for t in release_trees))
    for k, c in enumerate(cells):
        if c.get("cell_type") != "code":
            continue
        m = nbgrader_meta(c)
        if m is not None and m.get("grade") and not m.get("solution"):
            continue  # a test cell (restored from the release) imports references legitimately
        tree = _parse(str(c.get("source", "")))
        defined = set(_defined(str(c.get("source", ""))))
        owners = [g for g, names in table.tests.items() if defined & set(names)] or list(table.tests)
        for mod, name, line in _imports(tree):
            if not mod.startswith("course_lib") or mod.startswith(NOT_ANSWERS) or (mod, name) in allowed:
                continue
            full = f"{mod}.{name}" if name else mod
            what = f"cell {k}: " + (f"from {mod} import {name}" if name else f"import {mod}")
            for gid, refs in table.references.items():
                # the reference itself, its module, or the reference re-exported by a package above its module
                # (`from course_lib.quant import absmax_quantize` for course_lib.quant.core.absmax_quantize)
                reexport = name and any(q.rsplit(".", 1)[1] == name and q.rsplit(".", 1)[0].startswith(mod + ".")
                                        for q in refs)
                if full in refs or full in mods[gid] or reexport:
                    add(gid, what)
            if _private(name):
                for gid in owners:
                    add(gid, f"{what} (a private name of the library)")
        for use in sorted(_private_uses(tree) - allowed_uses):
            for gid in owners:
                add(gid, f"cell {k}: {use} (a private name of the library)")
    return found
