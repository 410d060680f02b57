"""What `course grade` gives back to students, and the one gate every file it writes passes through.

Hidden tests run inside the student's kernel, so the executed notebook can carry them anywhere: in an
output printed by an IPython callback, in a traceback, in an image, in widget state. The feedback is
therefore not a rendering of the executed notebook (what nbgrader's generate_feedback does) but a
notebook the grader builds (`feedback_notebook`):

* sources from the instructor's side, never from the kernel: each test or read-only cell as the
  release shows it (hidden tests replaced by one comment line, as `hide_regions` does), each answer cell
  and each cell the student added as the student submitted it;
* metadata: only nbgrader's (points, grade_id); nothing the student or the kernel set (tags, widget
  state, attachments of outputs);
* outputs from the executed notebook, each one reduced to what the feedback shows (text; a test
  cell's error cut to its last line, ``AssertionError: <message>``, because IPython quotes the failing
  source lines; no images, HTML, JavaScript, SVG, LaTeX or widgets: they are replaced by a note, or by
  their text/plain form), then scanned (`leaks.Scanner`, alone and joined with the others): an output
  carrying hidden-test or solution text is replaced by `WITHHELD` and the submission is flagged
  ``feedback_withheld`` for review. ``outputs="none"`` shows no output of the kernel at all.

Scores come from the executed notebook through the instructor's gradebook (nbgrader's GetGrades), never
from the feedback. `render_html` renders with nbgrader's feedback template.

`write_checked(path, text, scanner)` is the one function that writes a file for `course grade`'s
outputs (feedback pages, logs, grades.csv, report.json, not_graded.txt): it scans the whole text again
and refuses (`LeakBlocked`) to write one that carries secret text.
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import nbformat

from .leaks import Hit, Scanner, string_leaves

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REGIONS = (("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"), ("BEGIN MARK SCHEME", "END MARK SCHEME"))
HIDDEN_NOTE = "# [hidden tests ran here; they are not shown in feedback]"
WITHHELD = "[output withheld: it carried text of the instructor's {what}; your instructor will look at it]"
NONE_NOTE = "[outputs are not shown in feedback]"
OUTPUT_MODES = ("scanned", "none")
WIDGET_STATE = "the kernel's widget state (never shown)"
MAX_OUTPUT_CHARS = 20_000
SHOWN_MIMES = ("text/plain",)
NB_META = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
           "language_info": {"name": "python"}}
NBGRADER_KEYS = ("grade", "grade_id", "locked", "points", "schema_version", "solution", "task")


class LeakBlocked(RuntimeError):
    """A file for `course grade`'s outputs still carried hidden-test or solution text: not written."""

    def __init__(self, path, hits):
        self.hits = hits
        super().__init__(f"{path}: not written, it carries {'; '.join(sorted({str(h) for h in hits}))}")


def hide_regions(source: str, note: str) -> tuple[str, bool]:
    """Source with each hidden region replaced by `note` (indented like the region's first line)."""
    out, inside, found = [], False, False
    for line in source.split("\n"):
        if any(b in line for b, _ in REGIONS):
            inside, found = True, True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + note)
        elif inside and any(e in line for _, e in REGIONS):
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out), found


def _meta(cell) -> dict:
    m = cell.get("metadata", {}).get("nbgrader") if isinstance(cell, dict) else None
    return m if isinstance(m, dict) else {}


def _gid(cell) -> str | None:
    return _meta(cell).get("grade_id") or None


def shown_source(source_cell, release_cell) -> str:
    """A test or read-only cell as the feedback shows it: the instructor's source with hidden regions
    replaced by one note; every other line must be the release's, else the release's source is shown."""
    if source_cell is None:
        return release_cell.source
    text, found = hide_regions(source_cell.source, HIDDEN_NOTE if source_cell.cell_type == "code"
                               else "[hidden content]")
    if not found:
        return release_cell.source
    released = {ln.strip() for ln in release_cell.source.split("\n")}
    ok = all(ln.strip() in released or ln.strip() in (HIDDEN_NOTE, "[hidden content]") for ln in text.split("\n"))
    return text if ok else release_cell.source


# ---------------------------------------------------------------------------------------------------
# outputs

def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else str(x)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output truncated: {len(text):,} characters]\n"


def shown_output(out, in_test: bool, limit: int = MAX_OUTPUT_CHARS):
    """What the feedback shows of one output (a new output; text only), or None."""
    kind = out.get("output_type")
    if kind == "stream":
        return nbformat.v4.new_output("stream", name=out.get("name") if out.get("name") in ("stdout", "stderr")
                                      else "stdout", text=_cut(_text(out.get("text", "")), limit))
    if kind == "error":
        ename, evalue = str(out.get("ename", "Error"))[:200], _ANSI_RE.sub("", str(out.get("evalue", "")))
        if in_test:  # IPython's traceback quotes the cell's source: hidden tests included
            tb = [f"{ename}: {_cut(evalue, limit)}"]
        else:
            tb = [_text(t) for t in (out.get("traceback") or [])]
            total = sum(len(t) for t in tb)
            if total > limit:
                tb = (tb[:2] + [f"... [{len(tb) - 3} frames cut] ..."] + tb[-1:] if len(tb) > 3
                      else [_cut("\n".join(tb), limit)])
        return nbformat.v4.new_output("error", ename=ename, evalue=_cut(evalue, limit), traceback=tb)
    if kind in ("execute_result", "display_data"):
        data = out.get("data") or {}
        shown = {}
        if "text/plain" in data:
            shown["text/plain"] = _cut(_text(data["text/plain"]), limit)
        others = sorted(m for m in data if m not in SHOWN_MIMES)
        if others and not shown:
            what = "image" if any(m.startswith("image/") for m in others) else others[0]
            shown["text/plain"] = f"[{what} output: not shown in feedback]"
        if not shown:
            return None
        if kind == "execute_result":
            return nbformat.v4.new_output("execute_result", data=shown, execution_count=out.get("execution_count"))
        return nbformat.v4.new_output("display_data", data=shown)
    return None


def output_text(out) -> str:
    """Everything of an output the kernel chose, as one text (its structure's names left out, so that
    text printed in pieces over several outputs joins up): stream text, error name, value and
    traceback, every value of every MIME type (JSON values walked), and metadata (keys too)."""
    kind = out.get("output_type")
    if kind == "stream":
        parts = [_text(out.get("text", ""))]
    elif kind == "error":
        parts = [str(out.get("ename", "")), str(out.get("evalue", ""))] + [_text(t) for t in out.get("traceback") or []]
    else:
        parts = [x for v in (out.get("data") or {}).values() for x in string_leaves(v)]
    for key in ("metadata", "transient"):
        if out.get(key):
            parts += string_leaves(out.get(key))
    parts += [x for k, v in out.items() if k not in ("output_type", "name", "text", "ename", "evalue", "traceback",
                                                     "data", "metadata", "transient", "execution_count")
              for x in string_leaves({k: v})]
    return "".join(parts)


def withheld_output(kinds) -> dict:
    what = " and ".join(sorted({"hidden tests" if k == "hidden test" else k + "s" for k in kinds})) or "tests"
    return nbformat.v4.new_output("stream", name="stdout", text=WITHHELD.format(what=what) + "\n")


# ---------------------------------------------------------------------------------------------------
# the feedback notebook

def feedback_notebook(executed_nb, submitted_nb, release_nb, source_nb, scanner: Scanner,
                      outputs: str = "scanned", limit: int = MAX_OUTPUT_CHARS):
    """(notebook to render, {cell label: [Hit]}) for one graded submission.

    `executed_nb` is the autograded notebook (outputs, instructor's test sources), `submitted_nb` what
    was executed as the student's (after repair), `release_nb` / `source_nb` the lab as students got it
    and as the instructor wrote it. Cells are matched by id (else by position)."""
    if outputs not in OUTPUT_MODES:
        raise ValueError(f"outputs must be one of {', '.join(OUTPUT_MODES)}, got {outputs!r}")
    release = {_gid(c): c for c in release_nb.cells if _gid(c)}
    source = {_gid(c): c for c in source_nb.cells if _gid(c)}
    by_id = {c.get("id"): c for c in submitted_nb.cells if c.get("id")}
    same_shape = len(submitted_nb.cells) == len(executed_nb.cells)
    cells, plan = [], []   # plan: (cell index, output index, original output, shown output)
    for k, ex in enumerate(executed_nb.cells):
        sub = by_id.get(ex.get("id")) if ex.get("id") in by_id else (submitted_nb.cells[k] if same_shape else None)
        gid = _gid(ex) or (_gid(sub) if sub is not None else None)
        rel = release.get(gid) if gid else None
        meta = {}
        if rel is not None:
            meta = {"nbgrader": {k2: v for k2, v in _meta(rel).items() if k2 in NBGRADER_KEYS}}
            if _meta(rel).get("solution"):
                src = sub.source if sub is not None else ""
            else:
                src = shown_source(source.get(gid), rel)
            ctype = rel.cell_type
        elif sub is not None:
            src, ctype = sub.source, sub.cell_type
        else:
            src, ctype = "# [this cell could not be matched with the submission: not shown]", "code"
        if ctype == "code":
            cell = nbformat.v4.new_code_cell(src, metadata=meta, execution_count=ex.get("execution_count"))
        elif ctype == "markdown":
            cell = nbformat.v4.new_markdown_cell(src, metadata=meta)
        else:
            cell = nbformat.v4.new_raw_cell(src, metadata=meta)
        cell["id"] = f"feedback-{k}"
        cells.append(cell)
        if ctype != "code":
            continue
        in_test = bool(_meta(rel or {}).get("grade")) and not _meta(rel or {}).get("solution")
        trusted = sub is not None or rel is not None
        for j, out in enumerate(ex.get("outputs", [])):
            shown = shown_output(out, in_test, limit) if trusted else None
            # a test cell's traceback quotes its hidden tests by construction (they are cut): scan the
            # rest of everything the kernel produced, shown or not (an attempt is flagged either way)
            scanned = shown if in_test and out.get("output_type") == "error" and shown is not None else out
            plan.append((k, j, scanned, shown))
    parts = [output_text(o) for _, _, o, _ in plan]
    shown_parts = [output_text(s) if s is not None else "" for *_, s in plan]
    hits = scanner.find_in_parts(parts)
    for i, h in scanner.find_in_parts(shown_parts).items():
        hits.setdefault(i, []).extend(h)
    withheld: dict[str, list[Hit]] = {}
    for i, (k, j, out, shown) in enumerate(plan):
        cell = cells[k]
        if outputs == "none":
            if not cell.outputs:
                cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=NONE_NOTE + "\n"))
            continue
        if i in hits:
            label = _gid(executed_nb.cells[k]) or f"cell {k}"
            withheld.setdefault(label, []).extend(h for h in hits[i] if h not in withheld[label])
            if not (cell.outputs and cell.outputs[-1].get("text", "").startswith("[output withheld")):
                cell.outputs.append(withheld_output(h.kind for h in hits[i]))
        elif shown is not None:
            cell.outputs.append(shown)
    # what nbclient keeps of the kernel's widgets sits in the notebook's metadata: never shown, but a
    # sign of an attempt
    extra = scanner.find("\n".join(string_leaves(dict(executed_nb.metadata))))
    if extra:
        withheld[WIDGET_STATE] = extra
    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(NB_META))
    return nb, withheld


def describe_hits(hits) -> str:
    """'hidden tests of add_tests, multiply_hidden (plain, base64)': what leaked, from where, how."""
    kinds: dict[str, set] = {}
    for h in hits:
        kinds.setdefault(h.kind, set()).add(h.where)
    hows = sorted({part for h in hits for part in h.encoding.split(", ")})
    what = "; ".join(f"{'hidden tests' if k == 'hidden test' else k + 's'} of {', '.join(sorted(w))}"
                     for k, w in sorted(kinds.items()))
    return f"{what} ({', '.join(hows)})"


def render_html(nb, lab: str, sid: str, db_url: str) -> str:
    """The feedback page: nbgrader's feedback template, scores from the instructor's gradebook."""
    from nbconvert.exporters import HTMLExporter
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import GetGrades
    from traitlets.config import Config

    import nbgrader
    base = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    c = Config()
    c.HTMLExporter.template_name = "feedback"
    c.HTMLExporter.extra_template_basedirs = [str(base / "templates")]
    c.HTMLExporter.extra_template_paths = [str(base / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    from jupyter_core.paths import jupyter_config_dir
    resources = {"nbgrader": {"notebook": lab, "assignment": lab, "student": sid, "db_url": db_url},
                 "config_dir": jupyter_config_dir()}
    nb = copy.deepcopy(nb)
    nb, resources = GetGrades().preprocess(nb, resources)
    nb, resources = CSSHTMLHeaderPreprocessor().preprocess(nb, resources)
    html, _ = HTMLExporter(config=c).from_notebook_node(nb, resources=resources)
    return html


def withheld_page(lab: str, score, max_score) -> str:
    """What a student gets when the rendered feedback itself failed the final check."""
    s = f"{score:g} / {max_score:g}" if score is not None and max_score is not None else "see your instructor"
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + lab + "</title></head><body>\n"
            f"<h2>{lab}</h2>\n<p>Score: {s}</p>\n<p>The feedback page for this lab was withheld: it carried text "
            "of the instructor's tests. Your instructor will look at your submission.</p>\n</body></html>\n")


# ---------------------------------------------------------------------------------------------------
# the gate

def check_text(text: str, scanner: Scanner | None) -> list[Hit]:
    """Hidden-test or solution text in `text` (plain or encoded); [] when there is none."""
    return scanner.find(text) if scanner else []


def write_checked(path: str | os.PathLike, text: str, scanner: Scanner | None) -> Path:
    """Write `text` to `path` only when `check_text` finds nothing in it (else raise `LeakBlocked`).
    Every file `course grade` writes to its output folder goes through here."""
    hits = check_text(text, scanner)
    if hits:
        raise LeakBlocked(path, hits)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def scrub_value(value, scanner: Scanner | None, note: str = "[withheld: carried text of the instructor's tests]"):
    """A JSON-like value with every string that carries secret text (alone, or spread over several
    strings) replaced by `note`; and the hits."""
    if not scanner:
        return value, []
    leaves: list[str] = []

    def collect(v):
        if isinstance(v, str):
            leaves.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)

    collect(value)
    marked = scanner.find_in_parts(leaves)
    if not marked:
        return value, []
    counter = iter(range(len(leaves)))

    def rebuild(v):
        if isinstance(v, str):
            return note if next(counter) in marked else v
        if isinstance(v, dict):
            return {k: rebuild(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(rebuild(x) for x in v)
        return v

    return rebuild(value), [h for hs in marked.values() for h in hs]
