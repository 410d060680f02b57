"""What `course grade` gives back to students: a page the grader builds, never the kernel's notebook.

The hidden cases live in the judge (`judging.py`, in the grader's process) and never enter the kernel, so
nothing the kernel prints can carry them. The page (`feedback_notebook`, rendered by `render_html` with
nbgrader's feedback template) still comes from the grader's side only:

* sources: each test and read-only cell as the release shows it, each answer cell and each cell the student
  added as the student submitted it; markdown the student wrote is shown as text (a fenced block), never
  rendered: no HTML, script or styled overlay of theirs reaches the page, and the exporter sanitises the
  rest (`sanitize_html`);
* under each test cell, the judge's verdict: the part's score, the cases passed per group, the first
  failing cases with their messages (their inputs, what was expected, what came), and the misconceptions
  recognized (the lab's public ``MISTAKES`` texts);
* under each written part (a manually graded answer: `manual.py`), its rubric from the judge, and the
  instructor's score and comment once validated ("waiting for your instructor" before);
* the kernel's outputs of the other cells as text only (no images, HTML, JavaScript or widgets: a note says
  so; errors cut to their last line when long), capped; ``outputs="none"`` shows none of them.

Scores come from the judge through the instructor's gradebook (nbgrader's GetGrades), never from the page.
"""
from __future__ import annotations

import copy
import html
import os
import re
from pathlib import Path

import nbformat

from .judging import SHOWN_FAILURES

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NONE_NOTE = "[outputs are not shown in feedback]"
OUTPUT_MODES = ("shown", "none")
MAX_OUTPUT_CHARS = 20_000
NB_META = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
           "language_info": {"name": "python"}}
NBGRADER_KEYS = ("grade", "grade_id", "locked", "points", "schema_version", "solution", "task")


def _meta(cell) -> dict:
    m = cell.get("metadata", {}).get("nbgrader") if isinstance(cell, dict) else None
    return m if isinstance(m, dict) else {}


def _gid(cell) -> str | None:
    return _meta(cell).get("grade_id") or None


def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else str(x)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output truncated: {len(text):,} characters]\n"


def as_text_block(text: str) -> str:
    """Markdown that shows `text` literally: a fenced block longer than any run of backticks in it."""
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, run + 1)
    return f"*Your text:*\n\n{fence}text\n{text}\n{fence}"


def shown_output(out, limit: int = MAX_OUTPUT_CHARS):
    """What the feedback shows of one output (a new output; text only), or None."""
    kind = out.get("output_type")
    if kind == "stream":
        return nbformat.v4.new_output("stream", name=out.get("name") if out.get("name") in ("stdout", "stderr")
                                      else "stdout", text=_cut(_ANSI_RE.sub("", _text(out.get("text", ""))), limit))
    if kind == "error":
        ename, evalue = str(out.get("ename", "Error"))[:200], _ANSI_RE.sub("", str(out.get("evalue", "")))
        tb = [_ANSI_RE.sub("", _text(t)) for t in (out.get("traceback") or [])]
        total = sum(len(t) for t in tb)
        if total > limit:
            tb = (tb[:2] + [f"... [{len(tb) - 3} frames cut] ..."] + tb[-1:] if len(tb) > 3
                  else [_cut("\n".join(tb), limit)])
        return nbformat.v4.new_output("error", ename=ename, evalue=_cut(evalue, limit), traceback=tb)
    if kind in ("execute_result", "display_data"):
        data = out.get("data") or {}
        shown = {}
        if "text/plain" in data:
            shown["text/plain"] = _cut(_ANSI_RE.sub("", _text(data["text/plain"])), limit)
        others = sorted(m for m in data if m != "text/plain")
        if others and not shown.get("text/plain"):
            what = "image" if any(m.startswith("image/") for m in others) else others[0]
            shown["text/plain"] = f"[{what} output: not shown in feedback]"
        if not shown:
            return None
        if kind == "execute_result":
            return nbformat.v4.new_output("execute_result", data=shown, execution_count=None)
        return nbformat.v4.new_output("display_data", data=shown)
    return None


def verdict_text(part) -> str:
    """The judge's verdict on one part, as the page shows it under the test cell."""
    if part is None:
        return "Grader: this part was not judged (see your instructor).\n"
    lines = [f"Grader: {part.score:g} / {part.points:g} points"]
    summary = part.summary()
    if summary:
        lines[0] += ": " + "; ".join(f"{p} of {n} {g if g != 'main' else 'cases'} passed"
                                     for g, (p, n) in summary.items())
    if part.error:
        lines.append("The grader could not judge this part; your instructor will look at it.")
    if part.kernel_gone:
        lines.append("The kernel died or stopped answering while this part was judged: the cases after that "
                     "count as failed.")
    for m in part.misconceptions():
        lines.append(f"Known mistake: {m}")
    fails = part.failures()
    for c in fails[:SHOWN_FAILURES]:
        lines.append(f"- {c.message or c.label}")
    if len(fails) > SHOWN_FAILURES:
        lines.append(f"- ... and {len(fails) - SHOWN_FAILURES} more failing case(s)")
    notes = [c.note for c in part.cases if c.note]
    for n in notes[:2]:
        lines.append(f"Note: {n}")
    return "\n".join(lines) + "\n"


def written_text(gid: str, part: dict) -> str:
    """What the page shows under a written part: its score (or that it waits), the instructor's comment and
    the rubric. `part`: points, rubric [(points, criterion)], and score, comment, validated when entered.
    The instructor's and the rubric's text is escaped: shown as written, never as markup."""
    validated = part.get("validated") and part.get("score") is not None
    head = (f"**Instructor: {part['score']:g} / {part['points']:g} points** (written part `{gid}`)" if validated
            else f"**Written part `{gid}` ({part['points']:g} points): graded by your instructor; "
                 "the score is not in yet.**")
    lines = [head, ""]
    if validated and part.get("comment"):
        comment = html.escape(part["comment"]).replace("\n", "<br>")
        lines += [f"> *Comment:* {comment}", ""]
    lines.append("Rubric:")
    lines += [f"- {p:g} point{'s' if p != 1 else ''}: {html.escape(text)}" for p, text in part.get("rubric", [])]
    return "\n".join(lines)


def feedback_notebook(executed_nb, release_nb, verdict, outputs: str = "shown", limit: int = MAX_OUTPUT_CHARS,
                      written: dict | None = None):
    """The notebook to render for one graded submission: `executed_nb` (the repaired submission with the
    kernel's outputs, test cells not run), `release_nb` (the lab as students got it), `verdict` (the judge's
    `Verdict`, or None), `written` ({grade_id: rubric and manual score}: `written_text`)."""
    if outputs not in OUTPUT_MODES:
        raise ValueError(f"outputs must be one of {', '.join(OUTPUT_MODES)}, got {outputs!r}")
    release = {_gid(c): c for c in release_nb.cells if _gid(c)}
    release_sources = {c.source for c in release_nb.cells if c.cell_type == "markdown"}
    parts = verdict.parts if verdict is not None else {}
    cells = []
    for k, ex in enumerate(executed_nb.cells):
        gid = _gid(ex)
        rel = release.get(gid) if gid else None
        meta, ctype = {}, ex.get("cell_type", "code")
        if rel is not None:
            meta = {"nbgrader": {k2: v for k2, v in _meta(rel).items() if k2 in NBGRADER_KEYS}}
            ctype = rel.cell_type
            src = ex.get("source", "") if _meta(rel).get("solution") else rel.source
        else:
            src = ex.get("source", "")
        is_test = bool(_meta(rel or {}).get("grade")) and not _meta(rel or {}).get("solution")
        if ctype == "markdown":
            trusted = rel is not None and not _meta(rel).get("solution") or (rel is None and src in release_sources)
            cell = nbformat.v4.new_markdown_cell(src if trusted else as_text_block(str(src)), metadata=meta)
        elif ctype == "code":
            cell = nbformat.v4.new_code_cell(str(src), metadata=meta)
        else:
            cell = nbformat.v4.new_markdown_cell(as_text_block(str(src)), metadata=meta)
        cell["id"] = f"feedback-{k}"
        cells.append(cell)
        if gid and rel is not None and gid in (written or {}):
            cells.append(nbformat.v4.new_markdown_cell(written_text(gid, written[gid]),
                                                       metadata={"course_written": gid}))
            cells[-1]["id"] = f"feedback-{k}-written"
        if ctype != "code":
            continue
        if is_test:
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=verdict_text(parts.get(gid))))
            continue
        if outputs == "none":
            if ex.get("outputs"):
                cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=NONE_NOTE + "\n"))
            continue
        for out in ex.get("outputs", []):
            shown = shown_output(out, limit)
            if shown is not None:
                cell.outputs.append(shown)
    return nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(NB_META))


def render_html(nb, lab: str, sid: str, db_url: str) -> str:
    """The feedback page: nbgrader's feedback template, scores from the instructor's gradebook, sanitised."""
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
    c.HTMLExporter.sanitize_html = True
    from jupyter_core.paths import jupyter_config_dir
    resources = {"nbgrader": {"notebook": lab, "assignment": lab, "student": sid, "db_url": db_url},
                 "config_dir": jupyter_config_dir()}
    nb = copy.deepcopy(nb)
    nb, resources = GetGrades().preprocess(nb, resources)
    nb, resources = CSSHTMLHeaderPreprocessor().preprocess(nb, resources)
    html, _ = HTMLExporter(config=c).from_notebook_node(nb, resources=resources)
    return html


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write one of `course grade`'s output files (folders made as needed)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p
