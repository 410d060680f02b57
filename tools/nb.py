"""Write course notebooks from percent-format Python (the way we author them), and back.

    python tools/nb.py build src.py notebooks/01_where_the_time_goes.ipynb
    python tools/nb.py build src.py solutions/lab01.ipynb
    python tools/nb.py extract notebooks/01_where_the_time_goes.ipynb > src.py

Cells in the source:
    # %% [markdown]                         a markdown cell (each line starts with "# ")
    # %%                                    a code cell
    # %% tags=["parameters"]                the papermill parameters cell
    # %% nbgrader={"grade_id": "q1", "solution": true}                       an answer cell
    # %% nbgrader={"grade_id": "q1_tests", "grade": true, "points": 2}       a test cell (locked)
    # %% [markdown] nbgrader={"grade_id": "q1_text", "solution": true, "grade": true, "points": 1}
The Colab badge and the install cell are prepended on build (do not write them), so every notebook
starts the same way. The result has no outputs and no execution counts.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_lib import REPO  # noqa: E402

HEADER_RE = re.compile(r"^# %%(?: \[(markdown)\])?(.*)$")
INSTALL = """# Colab only: install the course library (this cell does nothing anywhere else).
import sys
if "google.colab" in sys.modules:
    !pip install -q "course_lib @ git+https://github.com/{repo}"
"""


def colab_badge(relpath: str) -> str:
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/{relpath}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


def _meta(rest: str) -> dict:
    meta = {}
    rest = rest.strip()
    m = re.search(r"tags=(\[.*?\])", rest)
    if m:
        meta["tags"] = json.loads(m.group(1))
    m = re.search(r"nbgrader=(\{.*\})", rest)
    if m:
        g = json.loads(m.group(1))
        grade = bool(g.get("grade", False))
        solution = bool(g.get("solution", False))
        nb = {"grade": grade, "grade_id": g["grade_id"], "locked": not solution,
              "schema_version": 3, "solution": solution, "task": False}
        if grade:
            nb["points"] = g.get("points", 1)
        meta["nbgrader"] = nb
    return meta


def parse(src: str) -> list:
    cells, kind, meta, lines = [], None, {}, []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.split("\n"))
            cells.append(nbformat.v4.new_markdown_cell(body, metadata=meta))
        else:
            cells.append(nbformat.v4.new_code_cell(body, metadata=meta))

    for line in src.split("\n"):
        m = HEADER_RE.match(line)
        if m:
            flush()
            kind, meta, lines = ("markdown" if m.group(1) else "code"), _meta(m.group(2)), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def build(src_path: str, out_path: str):
    out = Path(out_path)
    rel = out.resolve().relative_to(ROOT).as_posix()
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    nb.cells = [nbformat.v4.new_markdown_cell(colab_badge(rel)),
                nbformat.v4.new_code_cell(INSTALL.format(repo=REPO).strip())]
    nb.cells += parse(Path(src_path).read_text())
    for i, c in enumerate(nb.cells):  # stable ids keep diffs quiet
        c["id"] = f"c{i:03d}"
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))


def extract(nb_path: str) -> str:
    nb = nbformat.read(nb_path, as_version=4)
    parts = []
    for c in nb.cells[2:]:
        meta = ""
        if c.metadata.get("tags"):
            meta += " tags=" + json.dumps(c.metadata["tags"])
        if "nbgrader" in c.metadata:
            g = c.metadata["nbgrader"]
            d = {"grade_id": g["grade_id"]}
            if g.get("solution"):
                d["solution"] = True
            if g.get("grade"):
                d["grade"], d["points"] = True, g.get("points", 1)
            meta += " nbgrader=" + json.dumps(d)
        if c.cell_type == "markdown":
            body = "\n".join(("# " + l) if l else "#" for l in c.source.split("\n"))
            parts.append(f"# %% [markdown]{meta}\n{body}\n")
        else:
            parts.append(f"# %%{meta}\n{c.source}\n")
    return "\n".join(parts)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "extract":
        sys.stdout.write(extract(sys.argv[2]))
    else:
        sys.exit(__doc__)
