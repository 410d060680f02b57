"""Course notebooks and their reviewable sources.

Every notebooks/NN_slug.ipynb and solutions/labNN.ipynb has a percent-format source beside it
(notebooks/NN_slug.py, solutions/labNN.py), and the two are kept in sync with this tool:

    python tools/nb.py check [PATH ...]               list the pairs not in sync (exit 1 if any); writes nothing
    python tools/nb.py sync --from-py [PATH ...]      build each .ipynb from its .py (after editing the .py)
    python tools/nb.py sync --from-ipynb [PATH ...]   write each .py from its .ipynb (after editing in JupyterLab)
    python tools/nb.py build SRC.py OUT.ipynb         one notebook from a source
    python tools/nb.py extract NB.ipynb               a notebook's source, on stdout

PATH is a .py or an .ipynb (either names its pair) or a folder (every pair in it: its .ipynb files and its
.py files that have a "# %%" line); the default is notebooks/ and solutions/. A pair is in sync when the
.ipynb is exactly (as text) what its .py builds. `sync` needs a direction and writes only that way (plus
what the direction implies, below); tests/test_notebook_sources.py runs the check.

Source format (percent format, which jupytext, VS Code and PyCharm read as cells):
    # %% [markdown] id="c002"                 a markdown cell; each line written "# " + line ("#" if empty)
    # %% id="c003"                            a code cell; its lines as they are
    # %% id="c004" tags=["parameters"]        the papermill parameters cell
    # %% id="c005" nbgrader={"grade_id": "q1", "solution": true}                   an answer cell
    # %% id="c006" nbgrader={"grade_id": "q1_tests", "grade": true, "points": 2}   a test cell (locked)
    # %% id="c007" nbgrader={"grade_id": "setup", "locked": true}                  a read-only cell
    # %% [markdown] id="c008" nbgrader={"grade_id": "q1_text", "solution": true, "grade": true, "points": 1}
A header is "# %%", then " [markdown]" or " [raw]" for those cells, then " key=JSON" fields: `id` is the
cell id (kept, so the notebook's diffs stay quiet); `nbgrader` is filled out to nbgrader's schema 3
(locked = not solution, schema_version 3, task false, points 1 on a graded cell, unless given); any other
key (`tags`, ...) is that cell's metadata as written. A cell written without an id gets one on build
(the previous cell's id plus a letter: c022 -> c022a), and `sync --from-py` writes it into the header.
Lines before the first header are comments. Blank lines at the start and end of a cell are not part of
it. A cell line that itself starts with "# %%" (or "## %%", ...) is written with one more "#".

Not in the source, written the same into every notebook by build: the Colab badge and the Colab-only
install cell (ids c000, c001), the notebook metadata (python3 kernelspec, language_info {"name":
"python"}), nbformat 4.5, no outputs, no execution counts. A notebook in that form comes back exactly
(build(extract(nb)) == nb). From any other (say one saved by JupyterLab) extract drops what a source
does not hold: outputs, execution counts, notebook metadata, blank lines at a cell's edges; so
`sync --from-ipynb` also rewrites such a notebook as built. It refuses, naming the cell, what it would
lose otherwise (a changed badge or install cell, attachments, a cell source with a carriage return).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_lib import INSTALL_SPEC, colab_url  # noqa: E402

DEFAULT_DIRS = ("notebooks", "solutions")
NB_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
               "language_info": {"name": "python"}}
INSTALL = """# Colab only: install the course library (this cell does nothing anywhere else).
import sys
if "google.colab" in sys.modules:
    !pip install -q "{spec}"
"""
PREAMBLE = ("# Source of the notebook beside this file (same name, .ipynb). After editing it, run\n"
            "#     python tools/nb.py sync --from-py\n"
            "# (tools/nb.py describes the format; the build adds the Colab badge and install cells).\n\n")

HEADER_RE = re.compile(r"^# %%(?: \[(markdown|raw)\])?(.*)$")
HEADER_START_RE = re.compile(r"^# %%(?: \[(?:markdown|raw)\])?")
ESCAPE_RE = re.compile(r"^#+ %%")        # a cell line that would read as a header gets one more "#"
FIELD_RE = re.compile(r" ([A-Za-z_][\w.-]*)=")
ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")   # nbformat 4.5's cell id
BADGE_RE = re.compile(r"^\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]"
                      r"\(https://colab\.research\.google\.com/github/\S+\.ipynb\)$")
CELL_KEYS = {"code": {"cell_type", "id", "metadata", "source", "outputs", "execution_count"},
             "markdown": {"cell_type", "id", "metadata", "source"},
             "raw": {"cell_type", "id", "metadata", "source"}}


class SourceError(ValueError):
    """A source that cannot be built, or a notebook whose source cannot be written exactly."""


def _read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path, text: str):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def relpath(nb_path) -> str:
    """The notebook's path in the repository (what its badge links to); outside the repository (a copy),
    its folder and name."""
    p = Path(nb_path).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return f"{p.parent.name}/{p.name}"


def colab_badge(relpath: str) -> str:
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(relpath)})"


def install_source() -> str:
    return INSTALL.format(spec=INSTALL_SPEC).strip()


# ---- nbgrader metadata: the source holds what differs from what the build fills in -------------------

def expand_nbgrader(d, where: str = "source") -> dict:
    if not isinstance(d, dict) or not isinstance(d.get("grade_id"), str):
        raise SourceError(f"{where}: nbgrader= needs a JSON object with a \"grade_id\" string, got {d!r}")
    g = dict(d)
    g.setdefault("solution", False)
    g.setdefault("grade", False)
    g.setdefault("locked", not g["solution"])
    g.setdefault("schema_version", 3)
    g.setdefault("task", False)
    if g["grade"]:
        g.setdefault("points", 1)
    return g


def compact_nbgrader(g: dict, where: str = "notebook") -> dict:
    d = {"grade_id": g.get("grade_id")}
    for key in ("solution", "grade"):
        if key in g and g[key] is not False:
            d[key] = g[key]
    if "points" in g:
        d["points"] = g["points"]
    solution, grade = g.get("solution", False), g.get("grade", False)
    if "locked" in g and (g["locked"] != (not solution) or not (solution or grade)):
        d["locked"] = g["locked"]   # said also on a read-only cell (neither answer nor test), for the reader
    if "task" in g and g["task"] is not False:
        d["task"] = g["task"]
    if "schema_version" in g and g["schema_version"] != 3:
        d["schema_version"] = g["schema_version"]
    for key in sorted(set(g) - set(d) - {"solution", "grade", "locked", "task", "schema_version"}):
        d[key] = g[key]
    try:
        same = json.dumps(expand_nbgrader(d, where), sort_keys=True) == json.dumps(g, sort_keys=True)
    except SourceError:
        same = False
    if not same:
        raise SourceError(f"{where}: its nbgrader metadata {json.dumps(g, sort_keys=True)} lacks fields of "
                          "nbgrader's schema 3 (grade_id, solution, grade, locked, schema_version, task, and "
                          "points on a graded cell), so its source would not build it back")
    return d


# ---- source -> notebook ----------------------------------------------------------------------------

def _fields(rest: str, where: str) -> dict:
    fields, i, dec = {}, 0, json.JSONDecoder()
    rest = rest.rstrip()
    while i < len(rest):
        m = FIELD_RE.match(rest, i)
        if not m:
            raise SourceError(f"{where}: cannot read the cell header from {rest[i:]!r} on "
                              "(expected ' [markdown]' or ' [raw]', then ' key=JSON' fields)")
        key = m.group(1)
        try:
            value, i = dec.raw_decode(rest, m.end())
        except json.JSONDecodeError as e:
            raise SourceError(f"{where}: {key}= is not followed by JSON ({e.msg})") from None
        if key in fields:
            raise SourceError(f"{where}: {key}= given twice")
        fields[key] = value
    return fields


def _uncomment(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    return line[1:] if line.startswith("#") else line


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


def parse(text: str, where: str = "source") -> tuple[list, list]:
    """Cells of a percent-format source, and [(line index, id)] for the headers that had no id."""
    cells, generated = [], []
    header = None        # (line index, kind, fields)
    lines: list[str] = []

    def flush():
        if header is None:
            return
        at, kind, fields = header
        body = list(lines)
        while body and body[0] == "":
            body.pop(0)
        while body and body[-1] == "":
            body.pop()
        body = [line[1:] if ESCAPE_RE.match(line) else line for line in body]
        if kind != "code":
            body = [_uncomment(line) for line in body]
        here = f"{where}:{at + 1}"
        meta = {k: (expand_nbgrader(v, here) if k == "nbgrader" else v) for k, v in fields.items() if k != "id"}
        new = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
               "raw": nbformat.v4.new_raw_cell}[kind]
        cell = new("\n".join(body), metadata=meta)
        cid = fields.get("id")
        if cid is not None and not (isinstance(cid, str) and ID_RE.match(cid)):
            raise SourceError(f"{here}: id={json.dumps(cid)} is not a cell id (1-64 of A-Z a-z 0-9 _ -)")
        cell["id"] = cid
        cells.append((at, cell))

    for i, line in enumerate(text.split("\n")):
        m = HEADER_RE.match(line)
        if m:
            flush()
            header, lines = (i, m.group(1) or "code", _fields(m.group(2), f"{where}:{i + 1}")), []
        elif header is not None:
            lines.append(line)
        elif line.strip() and not line.startswith("#"):
            raise SourceError(f"{where}:{i + 1}: text before the first '# %%' cell header (only comments may be)")
    flush()

    used = {"c000", "c001"}
    for at, cell in cells:
        if cell["id"] is not None:
            if cell["id"] in used:
                raise SourceError(f"{where}:{at + 1}: cell id {cell['id']!r} is used twice (c000 and c001 are "
                                  "the badge and install cells)")
            used.add(cell["id"])
    prev = "c001"
    for at, cell in cells:
        if cell["id"] is None:
            cell["id"] = _next_id(prev, used)
            used.add(cell["id"])
            generated.append((at, cell["id"]))
        prev = cell["id"]
    return [c for _, c in cells], generated


def fixed_cells(relpath: str) -> list:
    badge = nbformat.v4.new_markdown_cell(colab_badge(relpath))
    install = nbformat.v4.new_code_cell(install_source())
    badge["id"], install["id"] = "c000", "c001"
    return [badge, install]


def notebook(text: str, relpath: str, where: str = "source", cells=None):
    """The notebook a source builds (relpath: the notebook's path in the repository, for its badge;
    cells: the source's cells if already parsed)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = copy.deepcopy(NB_METADATA)
    nb.cells = fixed_cells(relpath) + (parse(text, where)[0] if cells is None else cells)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        raise SourceError(f"{where}: builds an invalid notebook: {e.message}") from None
    return nb


def render(nb) -> str:
    """The notebook as its file holds it."""
    s = nbformat.writes(nb)
    return s if s.endswith("\n") else s + "\n"


def pin_ids(text: str, generated: list) -> str:
    """The source with the ids the build gave to cells written without one put into their headers."""
    lines = text.split("\n")
    for at, cid in generated:
        end = HEADER_START_RE.match(lines[at]).end()
        lines[at] = f"{lines[at][:end]} id={json.dumps(cid)}{lines[at][end:]}"
    return "\n".join(lines)


def build(src_path, out_path):
    _write(out_path, render(notebook(_read(src_path), relpath(out_path), str(src_path))))


# ---- notebook -> source ----------------------------------------------------------------------------

def _header(cell, where: str) -> str:
    kind = cell.cell_type
    h = "# %%" + ("" if kind == "code" else f" [{kind}]")
    if cell.get("id") is not None:
        h += f" id={json.dumps(cell['id'])}"
    meta = cell.get("metadata", {})
    for key in sorted(meta, key=lambda k: (k != "tags", k != "nbgrader", k)):
        if not FIELD_RE.fullmatch(f" {key}=") or key == "id":
            raise SourceError(f"{where}: metadata key {key!r} cannot be written in a cell header")
        value = compact_nbgrader(meta[key], where) if key == "nbgrader" else meta[key]
        h += f" {key}={json.dumps(value, ensure_ascii=False)}"
    return h


def source_text(nb, where: str = "notebook") -> str:
    """The percent-format source of a notebook (read with nbformat, version 4)."""
    cells = nb.cells
    if len(cells) < 2 or cells[0].cell_type != "markdown" or not BADGE_RE.match(cells[0].source.strip()):
        raise SourceError(f"{where}: cell 1 is not the Colab badge that the build writes")
    if cells[1].cell_type != "code" or cells[1].source.strip() != install_source():
        raise SourceError(f"{where}: cell 2 is not the install cell that the build writes (the badge and install "
                          "cells are fixed: change INSTALL in tools/nb.py, not a notebook)")
    parts = []
    for n, c in enumerate(cells[2:], start=3):
        here = f"{where}: cell {n} (id {c.get('id')!r})"
        if c.cell_type not in CELL_KEYS:
            raise SourceError(f"{here}: cell type {c.cell_type!r} has no source form")
        extra = {k for k in set(c) - CELL_KEYS[c.cell_type] if c[k]}   # an empty one is dropped
        if extra:
            raise SourceError(f"{here}: has {', '.join(sorted(extra))} (e.g. pasted images), which a source "
                              "cannot hold; put the image in a file and link it")
        if "\r" in c.source:
            raise SourceError(f"{here}: its source has a carriage return, which a source cannot hold")
        lines = c.source.strip("\n").split("\n")
        if c.cell_type != "code":
            lines = [("# " + line) if line else "#" for line in lines]
        lines = [("#" + line) if ESCAPE_RE.match(line) else line for line in lines]
        parts.append(_header(c, here) + "\n" + "\n".join(lines) + "\n")
    return PREAMBLE + "\n".join(parts)


def extract(nb_path) -> str:
    try:
        nb = nbformat.reads(_read(nb_path), as_version=4)
    except Exception as e:   # not JSON, not a notebook
        raise SourceError(f"{nb_path}: cannot be read as a notebook ({type(e).__name__}: {e})") from None
    return source_text(nb, str(nb_path))


# ---- pairs: check and sync -------------------------------------------------------------------------

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
    if not pair.py.exists():
        return f"{ipynb} has no source {py} (run: python tools/nb.py sync --from-ipynb {ipynb})"
    if not pair.ipynb.exists():
        return f"{py} has no notebook {ipynb} (run: python tools/nb.py sync --from-py {py})"
    try:
        built = render(notebook(_read(pair.py), relpath(pair.ipynb), py))
    except SourceError as e:
        return f"{e} (fix the source, then run: python tools/nb.py sync --from-py {py})"
    have = _read(pair.ipynb)
    if built == have:
        return None
    later = ".py" if pair.py.stat().st_mtime > pair.ipynb.stat().st_mtime else ".ipynb"
    return (f"{ipynb} is not what {py} builds ({_first_difference(built, have)}; the {later} was saved last): "
            f"run python tools/nb.py sync --from-py {py} if the source is right, or "
            f"python tools/nb.py sync --from-ipynb {ipynb} if the notebook is (edited in JupyterLab)")


def check(paths=()) -> list[str]:
    return [p for p in map(problem, pairs(paths)) if p]


def sync(paths=(), direction: str = "", say=print) -> int:
    """direction 'py': build each .ipynb from its .py; 'ipynb': write each .py from its .ipynb (and the
    .ipynb as built, if it was not). Returns the number of pairs it could not sync."""
    if direction not in ("py", "ipynb"):
        raise ValueError("sync needs a direction: 'py' or 'ipynb'")
    failed = 0
    for pair in pairs(paths):
        py, ipynb = _show(pair.py), _show(pair.ipynb)
        try:
            if direction == "py":
                if not pair.py.exists():
                    raise SourceError(f"{ipynb} has no source {py} to build it from")
                text = _read(pair.py)
                cells, generated = parse(text, py)
                new = render(notebook(text, relpath(pair.ipynb), py, cells))
                if not pair.ipynb.exists() or _read(pair.ipynb) != new:
                    _write(pair.ipynb, new)
                    say(f"wrote {ipynb} from {py}")
                if generated:
                    _write(pair.py, pin_ids(text, generated))
                    say(f"wrote the ids of its new cells into {py}: {', '.join(c for _, c in generated)}")
            else:
                if not pair.ipynb.exists():
                    raise SourceError(f"{py} has no notebook {ipynb} to extract it from")
                text = extract(pair.ipynb)
                if not pair.py.exists() or _read(pair.py) != text:
                    _write(pair.py, text)
                    say(f"wrote {py} from {ipynb}")
                new = render(notebook(text, relpath(pair.ipynb), py))
                if _read(pair.ipynb) != new:
                    _write(pair.ipynb, new)
                    say(f"rewrote {ipynb} as its source builds it (no outputs, execution counts or other "
                        "notebook metadata)")
        except SourceError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/nb.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="list the pairs not in sync; exit 1 if any")
    c.add_argument("paths", nargs="*")
    s = sub.add_parser("sync", help="bring pairs in sync, in the direction given")
    way = s.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-py", dest="direction", action="store_const", const="py",
                     help="build each .ipynb from its .py")
    way.add_argument("--from-ipynb", dest="direction", action="store_const", const="ipynb",
                     help="write each .py from its .ipynb")
    s.add_argument("paths", nargs="*")
    b = sub.add_parser("build", help="build one notebook from a source")
    b.add_argument("src")
    b.add_argument("out")
    e = sub.add_parser("extract", help="write a notebook's source to stdout")
    e.add_argument("notebook")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "check":
            found = check(args.paths)
            for p in found:
                print(p)
            return 1 if found else 0
        if args.cmd == "sync":
            return 1 if sync(args.paths, args.direction) else 0
        if args.cmd == "build":
            build(args.src, args.out)
        else:
            sys.stdout.write(extract(args.notebook))
        return 0
    except SourceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
