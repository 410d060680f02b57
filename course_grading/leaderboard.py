"""The final project's leaderboard (labs/lab13): `leaderboard.csv` and `leaderboard.html`, next to grades.csv.

A project lab's judge reports, beside the part's score, a record (`judging.PartResult.record`), made in the
grader's process: correct or not, the speed-up over the course's baseline (median of the paired per-round
ratios, its quartiles, min and max, the rounds), the points of its scale. The grader reads the points from
its own gradebook and the method from the student's report: the first ``**Method:**`` line of a markdown
cell of the submission.

Sorted: correct entries first, by speed-up (median), then the entries that are not correct (no speed points,
whatever their time), then the submissions that have no record (the grader could not run them).
"""
from __future__ import annotations

import csv
import html
import io
import math
import re
from pathlib import Path

from .feedback import write_text

METHOD_RE = re.compile(r"^\s*\*\*Method:\*\*\s*(.*?)\s*$", re.M)
TEMPLATE_METHOD = "the course's baseline (replace this"   # the template's line, left as it was
COLUMNS = ["rank", "student", "assignment", "method", "correct", "speedup", "q1", "q3", "min", "max", "rounds",
           "points", "max_points", "score", "max_score", "status", "problem", "file"]


def project_record(verdict) -> tuple[str, dict] | None:
    """(grade_id, record) of the judge's part that reported one, or None."""
    for gid, part in (verdict.parts.items() if verdict is not None else ()):
        if isinstance(part.record, dict):
            return gid, part.record
    return None


def method_line(nb) -> str:
    """The report's method: the first ``**Method:**`` line of a markdown cell ("" if none, or the template's)."""
    for c in nb.cells:
        if c.get("cell_type") != "markdown":
            continue
        m = METHOD_RE.search(str(c.get("source", "")))
        if m:
            text = " ".join(m.group(1).split())[:200]
            return "" if text.startswith(TEMPLATE_METHOD) else text
    return ""


def is_project(release_nb) -> bool:
    """A project lab: its release hands in a ``build`` entry (the project template's contract)."""
    return any(c.get("cell_type") == "code" and "def build(model" in str(c.get("source", ""))
               for c in release_nb.cells) or any(c.get("cell_type") == "code" and "evaluate_project(" in
                                                str(c.get("source", "")) for c in release_nb.cells)


def project_entry(verdict, submitted_nb, cells: list) -> dict:
    """What the leaderboard shows of one graded project submission (see the module docstring)."""
    found = project_record(verdict)
    entry = {"method": method_line(submitted_nb), "record": None, "points": None, "max_points": None}
    if found is None:
        return entry
    gid, rec = found
    entry["record"] = rec
    for c in cells:
        if c.get("grade_id") == gid:
            entry["points"], entry["max_points"] = c.get("score"), c.get("max_score")
    return entry


def _num(x, digits=2) -> str:
    return "" if not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.{digits}f}"


def rows(results) -> list[dict]:
    """One row per graded project submission, sorted and ranked."""
    out = []
    for r in results:
        if not getattr(r, "project", None):
            continue
        rec = r.project.get("record") or {}
        points = r.project.get("points")
        out.append({
            "student": r.student, "assignment": r.assignment, "method": r.project.get("method") or "(no method given)",
            "correct": "yes" if rec.get("correct") else "no" if rec else "no record",
            "speedup": _num(rec.get("ratio")), "q1": _num(rec.get("q1")), "q3": _num(rec.get("q3")),
            "min": _num(rec.get("min")), "max": _num(rec.get("max")), "rounds": str(rec.get("rounds", "")),
            "points": "" if points is None else f"{points:g}",
            "max_points": "" if r.project.get("max_points") is None else f"{r.project['max_points']:g}",
            "score": "" if r.score is None else f"{r.score:g}", "max_score": "" if r.max_score is None else f"{r.max_score:g}",
            "status": r.status, "problem": str(rec.get("problem") or ""), "file": r.file,
            "_key": (0 if rec.get("correct") else 1 if rec else 2, -(rec.get("ratio") or 0.0), r.student)})
    out.sort(key=lambda row: (row["assignment"], row["_key"]))
    rank, last = 0, None
    for row in out:
        rank = 1 if row["assignment"] != last else rank + 1
        last = row["assignment"]
        row["rank"] = str(rank)
        del row["_key"]
    return out


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Final project leaderboard</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:80em}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}td.n{{text-align:right}}tr.wrong{{color:#999}}
</style></head><body>
<h1>Final project leaderboard</h1>
<p>Speed-up: the course's baseline time over the entry's, measured in the same process, the two interleaved
round by round on fresh hidden prompts; the median over the rounds, with the interquartile range and the
extremes. An entry whose tokens differ from the baseline's (or, for a lossy entry, whose held-out bits per
byte exceed the bound) is not correct and scores no speed points. Points from the lower quartile by the
project's scale (course_lib.capstone.speed_points).</p>
{tables}
</body></html>
"""


def _table(assignment: str, rs: list[dict]) -> str:
    head = ("<tr><th>#</th><th>student</th><th>method</th><th>correct</th><th>speed-up (median)</th>"
            "<th>IQR</th><th>min&ndash;max</th><th>rounds</th><th>speed points</th></tr>")
    body = []
    for r in rs:
        e = {k: html.escape(v) for k, v in r.items()}
        iqr = f"{e['q1']}&ndash;{e['q3']}" if r["q1"] else ""
        span = f"{e['min']}&ndash;{e['max']}" if r["min"] else ""
        pts = f"{e['points']} / {e['max_points']}" if r["points"] else ""
        why = f' title="{e["problem"]}"' if r["problem"] else ""
        cls = "" if r["correct"] == "yes" else ' class="wrong"'
        body.append(f"<tr{cls}><td class=n>{e['rank']}</td><td>{e['student']}</td><td>{e['method']}</td>"
                    f"<td{why}>{e['correct']}</td><td class=n>{e['speedup']}{'x' if r['speedup'] else ''}</td>"
                    f"<td class=n>{iqr}</td><td class=n>{span}</td><td class=n>{e['rounds']}</td>"
                    f"<td class=n>{pts}</td></tr>")
    return f"<h2>{html.escape(assignment)}</h2>\n<table>\n{head}\n" + "\n".join(body) + "\n</table>"


def write_leaderboard(results, out: Path, csv_cell=lambda text: text) -> list[Path]:
    """leaderboard.csv and leaderboard.html in `out`, when some result is a project submission; the paths
    written (none otherwise). `csv_cell` makes a text cell safe for a spreadsheet (grades.csv's rule,
    `autograde.csv_safe`)."""
    rs = rows(results)
    if not rs:
        return []
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    for r in rs:
        w.writerow([csv_cell(r[k]) for k in COLUMNS])
    paths = [write_text(Path(out) / "leaderboard.csv", buf.getvalue())]
    tables = []
    for a in sorted({r["assignment"] for r in rs}):
        tables.append(_table(a, [r for r in rs if r["assignment"] == a]))
    paths.append(write_text(Path(out) / "leaderboard.html", PAGE.format(tables="\n".join(tables))))
    return paths
