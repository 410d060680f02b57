"""Manually graded parts: the written analyses the instructor scores by hand, carried through `course grade`.

A lab's written part is an nbgrader manually graded answer cell (``grade`` and ``solution`` both true; a
markdown cell whose grade_id starts ``written_``). The autograder leaves it alone: no judge part, no case,
no score until the instructor enters one. Its rubric lives in the lab's judge only (``judges/labNN.py``):

    WRITTEN = {"written_roofline": {"points": 2, "rubric": [(1, "names the bound ..."), (1, "explains ...")]}}

The instructor's scores come in as a CSV (``course grade SUBMISSIONS --manual scores.csv``):

    student,lab,grade_id,score,comment,validated
    alice,lab03,written_roofline,1.5,"right bound; the 2x gap is not explained",yes

``student`` is the id grades.csv shows, ``lab`` the assignment, ``score`` a number in 0..the part's points;
``comment`` (optional) goes to the student's feedback page; ``validated`` (optional: yes/no, true/false,
1/0; a file without the column is all validated) says whether the score is final: a score not validated is
a draft, kept for the instructor (manual_todo.csv shows it) and neither counted nor shown to the student.
A row with neither score nor comment is skipped (a row of the to-do file not scored yet). Every other
mistake stops the run before any kernel starts, naming the file, the row and what was expected.

The scores entered are kept in ``<out>/manual_scores.csv`` (this module writes it after each run: the
earlier ones merged with the new, a new row replacing the old one for the same student, lab and part), so a
regrade into the same folder keeps them; ``<out>/manual_todo.csv`` lists every written part not scored yet
(or only drafted), in the format ``--manual`` reads back.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from .build import nbgrader_meta

STORE = "manual_scores.csv"
TODO = "manual_todo.csv"
REQUIRED = ("student", "lab", "grade_id", "score")
OPTIONAL = ("comment", "validated", "max_points")    # max_points: the to-do file's reminder, not read
COLUMNS = ["student", "lab", "grade_id", "score", "comment", "validated"]
YES, NO = {"yes", "y", "true", "1"}, {"no", "n", "false", "0", ""}
MAX_COMMENT = 4000


class ManualScoreError(ValueError):
    """A manual scores file that cannot be merged: every bad row, each named."""


@dataclass(frozen=True)
class ManualScore:
    student: str
    lab: str
    grade_id: str
    score: float
    comment: str = ""
    validated: bool = True
    where: str = ""          # "<file>, row N": for messages

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.student, self.lab, self.grade_id)


def manual_parts(release_nb) -> dict[str, float]:
    """{grade_id: points} of the release's manually graded answer cells (nbgrader: grade and solution),
    in order."""
    out = {}
    for c in release_nb.cells:
        m = nbgrader_meta(c) or {}
        if m.get("grade") and m.get("solution"):
            out[m["grade_id"]] = float(m.get("points") or 0)
    return out


def written_rubric(judge, lab: str, parts: dict[str, float]) -> dict:
    """The judge module's WRITTEN dict, checked against the release's manual parts: every manual part has a
    rubric with the release's points, whose criteria's points add up to them. Raises ValueError naming what
    does not match."""
    path = getattr(getattr(judge, "module", None), "__file__", f"judges/{lab}.py")
    written = getattr(getattr(judge, "module", None), "WRITTEN", {})
    if not isinstance(written, dict):
        raise ValueError(f"{path}: WRITTEN must be a dict {{grade_id: {{'points': P, 'rubric': [(points, "
                         f"criterion), ...]}}}}, got {type(written).__name__}")
    problems = []
    for gid in parts:
        if gid not in written:
            problems.append(f"no rubric in WRITTEN for the written part {gid}")
    for gid, entry in written.items():
        if gid not in parts:
            problems.append(f"WRITTEN[{gid!r}] is no manually graded cell of the release "
                            f"(those are: {', '.join(parts) or 'none'})")
            continue
        problems += [f"WRITTEN[{gid!r}]: {p}" for p in rubric_problems(entry, parts[gid])]
    if problems:
        raise ValueError(f"{path} does not match the release's written parts: " + "; ".join(problems))
    return {gid: {"points": float(written[gid]["points"]),
                  "rubric": [(float(p), str(text)) for p, text in written[gid]["rubric"]]} for gid in parts}


def rubric_problems(entry, points: float | None = None) -> list[str]:
    """What is wrong with one WRITTEN entry (empty when nothing is)."""
    if not isinstance(entry, dict) or set(entry) != {"points", "rubric"}:
        return ["must be {'points': P, 'rubric': [(points, criterion), ...]}"]
    p, rubric = entry["points"], entry["rubric"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0:
        return [f"points must be a positive number, got {p!r}"]
    out = []
    if points is not None and float(p) != points:
        out.append(f"points is {p:g}, the cell's nbgrader points are {points:g}")
    if not isinstance(rubric, (list, tuple)) or not rubric:
        return out + ["rubric must be a non-empty list of (points, criterion)"]
    total = 0.0
    for k, item in enumerate(rubric):
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or isinstance(item[0], bool)
                or not isinstance(item[0], (int, float)) or not item[0] > 0
                or not isinstance(item[1], str) or not item[1].strip()):
            out.append(f"rubric item {k} must be (positive points, non-empty criterion), got {item!r}")
            continue
        total += float(item[0])
    if not out and abs(total - float(p)) > 1e-9:
        out.append(f"the rubric's criteria add up to {total:g} points, the part is worth {p:g}")
    return out


def _row_error(where: str, text: str) -> str:
    return f"{where}: {text}"


def read_scores(path: str | Path, text: str | None = None) -> list[ManualScore]:
    """The rows of a manual scores CSV, checked for form (not yet against the submissions: `check_scores`).
    Raises ManualScoreError listing every bad row."""
    p = Path(path)
    if text is None:
        if not p.is_file():
            raise ManualScoreError(f"--manual {p}: no such file")
        text = p.read_text(encoding="utf-8-sig")   # a spreadsheet's UTF-8 export starts with a BOM
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED if c not in header]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if missing or unknown or len(set(header)) != len(header):
        raise ManualScoreError(
            f"{p}: the header must name the columns {', '.join(REQUIRED)} (and optionally comment, validated)"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(repr(u) for u in unknown)}" if unknown else "")
            + ("; a column is named twice" if len(set(header)) != len(header) else "") + f"; got {header}")
    reader.fieldnames = header
    has_validated = "validated" in header
    rows, errors, seen = [], [], {}
    for n, raw in enumerate(reader, start=2):        # row 1 is the header
        where = f"{p}, row {n}"
        if None in raw:
            errors.append(_row_error(where, f"more cells than the {len(header)} columns of the header"))
            continue
        row = {k: (v or "").strip() for k, v in raw.items()}
        if not any(row.values()):
            continue
        if not row["score"] and not row.get("comment"):
            continue                                   # not scored yet (a to-do row left as it was)
        bad = [c for c in ("student", "lab", "grade_id") if not row[c]]
        if bad:
            errors.append(_row_error(where, f"{', '.join(bad)} must not be empty"))
            continue
        try:
            score = float(row["score"])
        except ValueError:
            errors.append(_row_error(where, f"score must be a number, got {row['score']!r}"))
            continue
        if not math.isfinite(score):
            errors.append(_row_error(where, f"score must be a finite number, got {row['score']!r}"))
            continue
        validated = True
        if has_validated:
            v = row["validated"].lower()
            if v not in YES | NO:
                errors.append(_row_error(where, f"validated must be yes or no (true/false, 1/0, empty: no), "
                                                f"got {row['validated']!r}"))
                continue
            validated = v in YES
        comment = row.get("comment", "")
        if len(comment) > MAX_COMMENT:
            errors.append(_row_error(where, f"comment is {len(comment)} characters; at most {MAX_COMMENT}"))
            continue
        s = ManualScore(row["student"], row["lab"], row["grade_id"], score, comment, validated, where)
        if s.key in seen:
            errors.append(_row_error(where, f"{s.student} {s.lab} {s.grade_id} is scored twice "
                                            f"(also row {seen[s.key]})"))
            continue
        seen[s.key] = n
        rows.append(s)
    if errors:
        raise ManualScoreError(f"{len(errors)} bad row(s) in the manual scores:\n  " + "\n  ".join(errors))
    return rows


def check_scores(rows: list[ManualScore], graded: dict, strict: bool = True,
                 other_labs: set | frozenset = frozenset()) -> tuple[dict, list[str]]:
    """Match `rows` with this run's submissions. `graded`: {(student, lab): {grade_id: points}} of every
    submission graded now. Returns ({(student, lab): {grade_id: ManualScore}}, notes). With `strict` (the
    instructor's --manual file) a row that names no graded submission or part, or a score outside 0..points,
    raises ManualScoreError listing them all; without (the store of earlier runs) such rows are left out of
    this run, each with a note (the rows of labs not graded now are simply not this run's). `other_labs`: labs
    that exist but are not graded in this run (``--assignment``): their rows are not this run's, in either mode."""
    out: dict = {}
    errors, notes = [], []
    students = {s for s, _ in graded}
    labs_now = {lab for _, lab in graded}
    for s in rows:
        if s.lab not in labs_now and s.lab in other_labs:
            continue                           # kept for the run that grades that lab
        student = s.student
        if (student, s.lab) not in graded and student.startswith("'") and (student[1:], s.lab) in graded:
            student = student[1:]             # grades.csv quotes an id that starts with = + - @
        parts = graded.get((student, s.lab))
        problem = None
        if parts is None:
            if not strict and student not in students:
                continue                       # an earlier run's student, not in this one
            labs = sorted(lab for st, lab in graded if st == student)
            problem = (f"no submission of {student!r} for {s.lab} is graded in this run"
                       + (f" (graded for {student!r}: {', '.join(labs)})" if labs else
                          " (no such student among the submissions)"))
        elif s.grade_id not in parts:
            problem = (f"{s.lab} has no written part {s.grade_id!r} (its manually graded parts: "
                       f"{', '.join(parts) or 'none'})")
        elif not 0 <= s.score <= parts[s.grade_id]:
            problem = f"score must be between 0 and {parts[s.grade_id]:g} (the points of {s.grade_id}), got {s.score:g}"
        if problem:
            (errors if strict else notes).append(f"{s.where}: {problem}" + ("" if strict else "; left out"))
            continue
        out.setdefault((student, s.lab), {})[s.grade_id] = s
    if errors:
        raise ManualScoreError(f"{len(errors)} bad row(s) in the manual scores:\n  " + "\n  ".join(errors))
    return out, notes


def merge_rows(stored: list[ManualScore], new: list[ManualScore]) -> list[ManualScore]:
    """The store after this run: a new row replaces the stored one of the same student, lab and part."""
    by = {s.key: s for s in stored}
    by.update({s.key: s for s in new})
    return [by[k] for k in sorted(by)]


def _safe(text: str) -> str:
    """A student id a spreadsheet will not run as a formula (ids come from file names: the student's);
    `check_scores` takes the quote off again."""
    return "'" + text if text and text[0] in "=+-@\t\r" else text


def write_rows(path: Path, rows: list[ManualScore]) -> None:
    """The store (or any list of rows) as the CSV `read_scores` reads."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    for s in rows:
        w.writerow([_safe(s.student), s.lab, s.grade_id, f"{s.score:g}", s.comment, "yes" if s.validated else "no"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue(), encoding="utf-8")


def write_todo(path: Path, results) -> int:
    """manual_todo.csv: each written part of a graded submission with no validated score (a draft shows its
    score and comment), with its points; returns how many."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["student", "lab", "grade_id", "max_points", "score", "comment", "validated"])
    n = 0
    for r in sorted(results, key=lambda r: (r.assignment, r.student)):
        for gid, m in (r.manual or {}).items():
            if m.get("validated"):
                continue
            draft = m.get("score") is not None
            w.writerow([_safe(r.student), r.assignment, gid, f"{m['points']:g}", f"{m['score']:g}" if draft else "",
                        m.get("comment", "") if draft else "", "no" if draft else ""])
            n += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return n


def as_dict(s: ManualScore | None) -> dict:
    return asdict(s) if s is not None else {}
