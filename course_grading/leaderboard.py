"""The final project's leaderboard (labs/lab13): `leaderboard.csv` and `leaderboard.html`, next to grades.csv.

A project lab's judge reports, beside the part's score, a record (`judging.PartResult.record`), made in the
grader's process from what it measured itself (judges/lab13.py): correct or not, the speed-up over the
course's baseline (the geometric mean of the per-round ratios of CPU time, each kernel's read from outside
it) with its 90% interval, the wall-clock speed-up, the rounds, the points, and the flags that put an entry
under review. The grader reads the points from its own gradebook and the method from the student's report:
the first ``**Method:**`` line of a markdown cell of the submission.

Ranked by the statistic that scores (`capstone.SpeedUp`): correct entries first, each ranked below only the
entries whose whole interval lies above its own, so entries whose intervals overlap share a rank (a tie,
shown "=") and are listed by the lower end of their interval (what the points come from); then the entries
that are not correct (no speed points, whatever their time); then the submissions with no record (the
grader could not run them). Status: ``ok``, ``review`` (the flags say why; the rank stands until a person
looks), ``not correct``, ``error``.
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
COLUMNS = ["rank", "tie", "student", "assignment", "method", "correct", "lossy", "speedup", "low", "high",
           "wall_speedup", "rounds", "points", "max_points", "score", "max_score", "status", "flags", "problem",
           "clock", "file"]


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
    return "" if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.{digits}f}"


def _interval(rec: dict) -> tuple[float, float] | None:
    lo, hi = rec.get("low"), rec.get("high")
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (lo, hi))
    return (float(lo), float(hi)) if ok else None


def _status(r, rec: dict) -> str:
    if not rec or r.status == "error":
        return "error"
    if rec.get("flags") or r.status == "review":
        return "review"
    return "ok" if rec.get("correct") else "not correct"


def rows(results) -> list[dict]:
    """One row per graded project submission, ranked (see the module docstring)."""
    out = []
    for r in results:
        if not getattr(r, "project", None):
            continue
        rec = r.project.get("record") or {}
        points = r.project.get("points")
        flags = [str(f) for f in rec.get("flags") or []]
        out.append({
            "student": r.student, "assignment": r.assignment, "method": r.project.get("method") or "(no method given)",
            "correct": "yes" if rec.get("correct") else "no" if rec else "no record",
            "lossy": "yes" if rec.get("lossy") else "",
            "speedup": _num(rec.get("ratio")), "low": _num(rec.get("low")), "high": _num(rec.get("high")),
            "wall_speedup": _num(rec.get("wall_ratio")), "rounds": str(rec.get("rounds") or ""),
            "points": "" if points is None else f"{points:g}",
            "max_points": "" if r.project.get("max_points") is None else f"{r.project['max_points']:g}",
            "score": "" if r.score is None else f"{r.score:g}",
            "max_score": "" if r.max_score is None else f"{r.max_score:g}",
            "status": _status(r, rec), "flags": "; ".join(flags), "problem": str(rec.get("problem") or ""),
            "clock": str(rec.get("clock") or ""), "file": r.file,
            "_tier": 0 if rec.get("correct") and _interval(rec) else 1 if rec else 2,
            "_interval": _interval(rec) if rec.get("correct") else None})
    ranked = []
    for a in sorted({row["assignment"] for row in out}):
        rs = [row for row in out if row["assignment"] == a]
        correct = [row for row in rs if row["_tier"] == 0]
        for row in correct:     # below only the entries whose whole interval is above this one's
            lo, hi = row["_interval"]
            row["_rank"] = 1 + sum(1 for other in correct if other["_interval"][0] > hi)
        correct.sort(key=lambda row: (row["_rank"], -row["_interval"][0], row["student"]))
        rest = sorted((row for row in rs if row["_tier"] > 0), key=lambda row: (row["_tier"], row["student"]))
        for k, row in enumerate(rest):
            row["_rank"] = len(correct) + k + 1
        shared = [row["_rank"] for row in correct]
        for row in correct + rest:
            row["rank"] = str(row["_rank"])
            row["tie"] = "yes" if row["_tier"] == 0 and shared.count(row["_rank"]) > 1 else ""
            ranked.append(row)
    for row in ranked:
        for k in ("_tier", "_interval", "_rank"):
            del row[k]
    return ranked


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Final project leaderboard</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:90em}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}}td.n{{text-align:right}}
tr.wrong{{color:#999}}tr.review td{{background:#fff6e0}}small{{color:#666}}</style></head><body>
<h1>Final project leaderboard</h1>
<p>Each entry ran in its own sandboxed kernel and the course's baseline in a clean kernel of the grader's, on
the same fresh hidden prompts, round by round, the order alternating. Speed-up: the baseline's CPU time over
the entry's (each kernel's processes, read from outside it, whatever the entry did in the meantime charged to
it): the geometric mean over the rounds, with its 90% interval. The points come from the interval's lower
end by the project's scale (course_lib.capstone.speed_points), and so does the rank: an entry is ranked
below only the entries whose whole interval lies above its own, so overlapping intervals share a rank (=).
An entry whose tokens differ from the baseline's (or, for a lossy entry, from its lossy_model's greedy
tokens, or whose held-out bits per byte exceed the bound) is not correct and scores no speed points.
<b>review</b>: the grader saw something in the measurement a person should look at (the flags say what).</p>
{tables}
</body></html>
"""


def _table(assignment: str, rs: list[dict]) -> str:
    head = ("<tr><th>#</th><th>student</th><th>method</th><th>correct</th><th>speed-up</th>"
            "<th>90% interval</th><th>wall</th><th>rounds</th><th>speed points</th><th>status</th></tr>")
    body = []
    for r in rs:
        e = {k: html.escape(v) for k, v in r.items()}
        span = f"{e['low']}&ndash;{e['high']}x" if r["low"] else ""
        pts = f"{e['points']} / {e['max_points']}" if r["points"] else ""
        correct = e["correct"] + (" (lossy)" if r["lossy"] else "")
        if r["problem"]:
            correct += f"<br><small>{e['problem']}</small>"
        status = e["status"] + (f"<br><small>{e['flags']}</small>" if r["flags"] else "")
        cls = ' class="review"' if r["status"] == "review" else "" if r["correct"] == "yes" else ' class="wrong"'
        body.append(f"<tr{cls}><td class=n>{e['rank']}{'=' if r['tie'] else ''}</td><td>{e['student']}</td>"
                    f"<td>{e['method']}</td><td>{correct}</td>"
                    f"<td class=n>{e['speedup']}{'x' if r['speedup'] else ''}</td><td class=n>{span}</td>"
                    f"<td class=n>{e['wall_speedup']}{'x' if r['wall_speedup'] else ''}</td>"
                    f"<td class=n>{e['rounds']}</td><td class=n>{pts}</td><td>{status}</td></tr>")
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
