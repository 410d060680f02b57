"""Build the course notebooks from their percent-format sources, with jupytext.

Every notebooks/NN_slug.ipynb and solutions/labNN.ipynb is generated from the source beside it
(notebooks/NN_slug.py, solutions/labNN.py). Edit the .py, never the .ipynb:

    python tools/nb.py build [PATH ...]   write each .ipynb from its .py (`make notebooks`)
    python tools/nb.py check [PATH ...]   name each pair whose .ipynb is not what its .py builds; exit 1 if any

PATH is a .py or an .ipynb (either names its pair) or a folder (its .ipynb files and its .py files that
have a "# %%" line); the default is notebooks/ and solutions/. tests/test_notebook_sources.py runs the check.

A source is jupytext's percent format, read by jupytext (VS Code and PyCharm run its cells; JupyterLab with
jupytext opens it as a notebook: right-click, Open With, Notebook, and saving writes the .py back):
    # %% [markdown] id="c002"        a markdown cell, each line written "# " + line
    # %% id="c003" tags=["parameters"]
    # %% id="c006" nbgrader={"grade": true, "grade_id": "q1_tests", "locked": true, "points": 2,
    #                         "schema_version": 3, "solution": false, "task": false}      (on one line)
A header's key=JSON fields are the cell's metadata; nbgrader's is written in full, as nbgrader reads it.
This file adds only what jupytext's text formats cannot hold:
- cell ids: jupytext keeps none in a text notebook (jupytext/jupytext#1263) and a notebook built without
  them gets random ones, so each header carries its cell's id as the field id=; the build moves it to the
  cell's id. A cell written without one gets the previous cell's id plus a letter (c003 -> c003a), and
  `build` writes it into the header (`check` reports the source until then).
- the Colab badge and the Colab-only install cell (ids c000, c001): they name the release
  (course_lib.INSTALL_SPEC, colab_url), so the build writes them, not each source.
- the notebook metadata: a python3 kernelspec and language_info {"name": "python"} in place of jupytext's;
  no outputs; jupytext's layout keys (lines_to_next_cell, ...) are not written as cell metadata.
- citations: a markdown cell's `[@key]` (an entry of references.yaml) is written as the student reads it,
  `([Kwon et al., 2023](https://arxiv.org/abs/2309.06180 "title. venue, year."))`, linked to the paper
  (tools/references.py); a key that is not in references.yaml fails the build, naming it and the cell. So a
  change to an entry of references.yaml changes the notebooks that cite it: `check` names them, `build`
  rewrites them.
`jupytext --to py:percent` does not write cell ids, so a notebook edited as .ipynb has no exact way back:
`source_text` (below) is the inverse the tests and the one-time conversion used.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

try:
    import jupytext
    from jupytext.cell_metadata import _JUPYTEXT_CELL_METADATA as LAYOUT_KEYS
except ImportError as e:   # an error, not an exit: pytest reports this file and runs the rest
    raise ImportError(f"tools/nb.py needs jupytext, a dev dependency (pip install -e '.[dev]'): {e}") from e

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_lib import INSTALL_SPEC, colab_url  # noqa: E402
from tools import references  # noqa: E402

FMT = "py:percent"
DEFAULT_DIRS = ("notebooks", "solutions")
FIXED_IDS = ("c000", "c001")
NB_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
               "language_info": {"name": "python"}}
INSTALL = """# Colab only: install the course library (this cell does nothing anywhere else).
import sys
if "google.colab" in sys.modules:
    !pip install -q "{spec}"
"""
ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")   # nbformat 4.5's cell id


class SourceError(ValueError):
    """A source that cannot be built, or a notebook that no source builds exactly."""


def _read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path, text: str):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def relpath(nb_path) -> str:
    """The notebook's path in the repository (what its badge links to); outside it (a copy), folder/name."""
    p = Path(nb_path).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return f"{p.parent.name}/{p.name}"


def fixed_cells(relpath: str) -> list:
    """The Colab badge and install cells that open every notebook."""
    badge = nbformat.v4.new_markdown_cell(
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(relpath)})")
    install = nbformat.v4.new_code_cell(INSTALL.format(spec=INSTALL_SPEC).strip())
    badge["id"], install["id"] = FIXED_IDS
    return [badge, install]


def _next_id(prev: str, used: set) -> str:
    """An unused id for a cell after the one with id `prev`: c022 -> c022a, c022a -> c022b, ..."""
    m = re.fullmatch(r"(.*\d)([a-z]*)", prev)
    base, suffix = m.groups() if m else (prev, "")
    base = base if len(base) <= 56 else "c"
    for n in itertools.count(1):
        for letters in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=n):
            s = "".join(letters)
            if (n, s) > (len(suffix), suffix) and base + s not in used:
                return base + s


def parse(text: str, where: str = "source"):
    """jupytext's notebook of a source, and its cells as a notebook holds them (ids from the headers,
    one given to a cell without), and the positions of the cells that had no id."""
    jnb = jupytext.reads(text, fmt=FMT)
    cells, missing, used = [], [], set(FIXED_IDS)
    for n, c in enumerate(jnb.cells):
        meta = {k: v for k, v in c.metadata.items() if k not in LAYOUT_KEYS}
        cid = meta.pop("id", None)
        here = f"{where}: cell {n + 1}"
        if cid is None:
            missing.append(n)
        elif not (isinstance(cid, str) and ID_RE.match(cid)):
            raise SourceError(f"{here}: id={json.dumps(cid)} is not a cell id (1-64 of A-Z a-z 0-9 _ -)")
        elif cid in used:
            raise SourceError(f"{here}: cell id {cid!r} is used twice (c000 and c001 are the badge and install "
                              "cells)")
        else:
            used.add(cid)
        new = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
               "raw": nbformat.v4.new_raw_cell}[c.cell_type]
        cell = new(c.source, metadata=meta)
        cell["id"] = cid
        cells.append(cell)
    prev = FIXED_IDS[-1]
    for cell in cells:
        if cell["id"] is None:
            cell["id"] = _next_id(prev, used)
            used.add(cell["id"])
        prev = cell["id"]
    return jnb, cells, missing


def _bibliography(where: str) -> dict:
    try:
        return references.current()
    except references.ReferenceError as e:
        raise SourceError(f"{where}: cites from references.yaml, which is not valid:\n{e}") from None


def _citations(cells, where: str, convert) -> None:
    """Apply `convert(markdown, bibliography)` (references.render or unrender) to every markdown cell that
    may hold a citation; the bibliography is read only when one does."""
    for n, cell in enumerate(cells):
        if cell.cell_type == "markdown" and ("[@" in cell.source or '"))' in cell.source):
            try:
                cell.source = convert(cell.source, _bibliography(where))
            except references.ReferenceError as e:
                raise SourceError(f"{where}: cell {n + 1} (id {cell.get('id')!r}): {e}") from None


def notebook(text: str, relpath: str, where: str = "source"):
    """The notebook a source builds (relpath: the notebook's path in the repository, for its badge)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = copy.deepcopy(NB_METADATA)
    nb.cells = fixed_cells(relpath) + parse(text, where)[1]
    _citations(nb.cells[2:], where, references.render)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        raise SourceError(f"{where}: builds an invalid notebook: {e.message}") from None
    return nb


def render(nb) -> str:
    """The notebook as its file holds it."""
    s = nbformat.writes(nb)
    return s if s.endswith("\n") else s + "\n"


def _with_ids(jnb, cells) -> str:
    """jupytext's text of a notebook, each cell's id first in its header."""
    jnb = copy.deepcopy(jnb)
    for jc, cell in zip(jnb.cells, cells):
        jc.metadata = {"id": cell["id"], **{k: v for k, v in jc.metadata.items() if k != "id"}}
    return jupytext.writes(jnb, fmt=FMT)


def source_text(nb, where: str = "notebook") -> str:
    """The source of a notebook as `notebook` builds it (the inverse of the build; refuses, naming the cell,
    a notebook that no source builds exactly)."""
    cells = nb.cells
    if [c.get("id") for c in cells[:2]] != list(FIXED_IDS):
        raise SourceError(f"{where}: does not open with the badge and install cells (ids c000, c001)")
    jnb = nbformat.v4.new_notebook()
    jnb.metadata = {"jupytext": {"notebook_metadata_filter": "-all"}}   # no YAML header
    jnb.cells = copy.deepcopy(cells[2:])
    _citations(jnb.cells, where, references.unrender)   # the source writes [@key] where the notebook links
    text = _with_ids(jnb, jnb.cells)
    built = notebook(text, "x/x.ipynb", where)
    for n, (a, b) in enumerate(itertools.zip_longest(built.cells[2:], cells[2:]), start=3):
        if a != b:
            raise SourceError(f"{where}: cell {n} (id {(b or {}).get('id')!r}) would not come back from a "
                              "percent-format source (a source holds no outputs or execution counts; jupytext "
                              "drops empty tags, JupyterLab's view state (collapsed, scrolled) and may drop "
                              "blank or whitespace-only lines at a cell's end, and reads a line starting with "
                              "%% as a cell header)")
    return text


# ---- pairs: check and build ------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    py: Path
    ipynb: Path


def _show(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _looks_like_source(path: Path) -> bool:
    return any(line.startswith("# %%") for line in _read(path).split("\n"))


def pairs(paths=()) -> list[Pair]:
    """The pairs named by `paths` (.py or .ipynb files, or folders); by default notebooks/ and solutions/."""
    stems = set()
    for p in map(Path, paths or [ROOT / d for d in DEFAULT_DIRS]):
        if p.is_dir():
            stems |= {q.with_suffix("") for q in p.glob("*.ipynb")}
            stems |= {q.with_suffix("") for q in p.glob("*.py") if _looks_like_source(q)}
        elif p.suffix in (".py", ".ipynb") and (p.exists() or p.with_suffix(".py" if p.suffix == ".ipynb"
                                                                             else ".ipynb").exists()):
            stems.add(p.with_suffix(""))
        else:
            raise SourceError(f"{p}: no such notebook (.ipynb), source (.py) or folder")
    return [Pair(s.with_name(s.name + ".py"), s.with_name(s.name + ".ipynb")) for s in sorted(stems)]


def _first_difference(built: str, have: str) -> str:
    try:
        a, b = json.loads(built), json.loads(have)
    except json.JSONDecodeError:
        return "the notebook is not valid JSON"
    ca = a["cells"]
    cb = b.get("cells", []) if isinstance(b, dict) else []
    for i, (x, y) in enumerate(zip(ca, cb)):
        if x != y:
            return f"first at cell {i + 1}, id {x.get('id')!r}"
    if len(ca) != len(cb):
        return f"the source has {len(ca) - 2} cells after the badge and install cells, the notebook {len(cb) - 2}"
    return "in the notebook's metadata or layout"


def problem(pair: Pair) -> str | None:
    """Why a pair is not in sync (naming the files and the command that fixes it), or None."""
    py, ipynb = _show(pair.py), _show(pair.ipynb)
    fix = f"python tools/nb.py build {py}"
    if not pair.py.exists():
        return (f"{ipynb} has no source {py} (a notebook is built from its source: write {py}, "
                f"tools/nb.py's source_text gives a notebook's, then run {fix})")
    if not pair.ipynb.exists():
        return f"{py} has no notebook {ipynb} (run: {fix})"
    try:
        text = _read(pair.py)
        _, cells, missing = parse(text, py)
        built = render(notebook(text, relpath(pair.ipynb), py))
    except SourceError as e:
        return f"{e} (fix the source, then run: {fix})"
    if missing:
        return f"{py}: {len(missing)} cell(s) without an id= in the header (run: {fix}, which writes them)"
    have = _read(pair.ipynb)
    if built == have:
        return None
    return (f"{ipynb} is not what {py} builds ({_first_difference(built, have)}): run {fix} "
            "(the .py is the source: an edit made in the .ipynb is overwritten)")


def check(paths=()) -> list[str]:
    return [p for p in map(problem, pairs(paths)) if p]


def build(paths=(), say=print) -> int:
    """Write each .ipynb from its .py (and the ids given to cells written without one into the .py).
    Returns the number of pairs it could not build."""
    failed = 0
    for pair in pairs(paths):
        py, ipynb = _show(pair.py), _show(pair.ipynb)
        try:
            if not pair.py.exists():
                raise SourceError(f"{ipynb} has no source {py} to build it from")
            text = _read(pair.py)
            jnb, cells, missing = parse(text, py)
            new = render(notebook(text, relpath(pair.ipynb), py))
            if not pair.ipynb.exists() or _read(pair.ipynb) != new:
                _write(pair.ipynb, new)
                say(f"wrote {ipynb} from {py}")
            if missing:
                pinned = _with_ids(jnb, cells)
                if parse(pinned, py)[1] != cells:   # jupytext wrote back a different notebook: say so
                    raise SourceError(f"{py}: writing the new cells' ids into it would change its cells")
                _write(pair.py, pinned)
                say(f"wrote the ids of its new cells into {py}: {', '.join(cells[n]['id'] for n in missing)}")
        except SourceError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/nb.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, says in (("build", "write each .ipynb from its .py"),
                       ("check", "name the pairs not in sync; exit 1 if any")):
        sub.add_parser(name, help=says).add_argument("paths", nargs="*")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            return 1 if build(args.paths) else 0
        found = check(args.paths)
        for p in found:
            print(p)
        return 1 if found else 0
    except SourceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
