"""`course grade`: collect -> check and repair -> autograde (nbgrader) -> feedback -> CSV.

Everything nbgrader needs lives in a working course directory (a temporary one unless ``workdir`` is
given); the submissions are only ever read. One nbgrader autograde call per submission, each with a
per-cell time limit, so one bad notebook (syntax error, infinite loop, deleted cells, invalid JSON,
huge outputs, a dead kernel) never stops the others.

Outputs, in `out` (default ``grades/``):
  grades.csv               student, assignment, score, max_score, status, flags, file
  report.json              everything: per-cell scores and errors, repairs, messages, files not graded
  feedback/<student>/<labNN>.html   feedback for the student (hidden tests not shown)
  logs/<student>_<labNN>.log        nbgrader's log for that submission
  not_graded.txt           files that could not be attributed to a student and a lab, and why

Status of a submission:
  ok        graded, nothing unusual
  repaired  graded after a safe automatic repair (restored metadata, restored edited tests, put back
            deleted cells, ...; see flags)
  review    graded, but a human should look: cells matched only by similarity, cells that could not be
            found after metadata loss, a cell that timed out, several files for one lab, cells that
            need manual grading, the lab recognized from content only
  error     not graded (unreadable notebook, nbgrader failure); score left empty, never 0
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from .build import (LabBuildError, generate_release, lab_names, nbgrader_meta, normalize_lab, notebook_text,
                    read_notebook, _lab_relpath)
from .collect import collect
from .nbgrader_env import CourseDir, find_config, result_log
from .repair import repair

MAX_CELLS = 3000
WORKDIR_MARKER = ".course-grade-workdir"
TIMEOUT_ENAMES = {"CellTimeoutError", "KeyboardInterrupt", "TimeoutError"}


@dataclass
class Result:
    student: str
    assignment: str
    file: str
    status: str = "error"
    score: float | None = None
    max_score: float | None = None
    flags: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)
    cells: list = field(default_factory=list)
    feedback: str | None = None
    log: str | None = None
    internal_id: str = ""
    superseded: list = field(default_factory=list)

    @property
    def flag_text(self) -> str:
        parts = []
        for k, v in self.flags.items():
            parts.append(f"{k}({','.join(map(str, v))})" if v else k)
        return "; ".join(parts)


@dataclass
class GradeReport:
    results: list
    not_graded: list          # [(file, why)]: not attributable, or not a lab notebook
    ignored: list             # [(file, why)]: other files, other assignments
    warnings: list
    out: Path | None = None

    def by_student(self, student: str, assignment: str | None = None) -> Result:
        hits = [r for r in self.results if r.student == student and (assignment is None or r.assignment == assignment)]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} results for student {student!r} {assignment or ''}")
        return hits[0]

    @property
    def ok(self) -> bool:
        return not self.not_graded and all(r.status != "error" for r in self.results)


def _slug(s: str) -> str:
    s = re.sub(r"[^\w.\- ]+", "_", s, flags=re.UNICODE).strip().replace(" ", "_")
    return s or "student"


def _release_keys(nb) -> tuple[set, set]:
    ids = {nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c)}
    srcs = {c.source.strip() for c in nb.cells if c.source.strip()}
    return ids, srcs


def _scores(course: CourseDir, sid: str, lab: str) -> tuple[float, float, bool, list]:
    with course.gradebook() as gb:
        sub = gb.find_submission(lab, sid)
        cells = []
        for nb in sub.notebooks:
            for g in nb.grades:
                cells.append({"grade_id": g.name, "score": g.score, "max_score": g.max_score,
                              "needs_manual_grade": bool(g.needs_manual_grade)})
        return float(sub.score), float(sub.max_score), bool(sub.needs_manual_grade), cells


def _failure_reason(log: str) -> str:
    """The most telling line of a failed autograde's log (e.g. 'DeadKernelError: Kernel died')."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = re.search(r"(\w+(?:Error|Exception|Exit)\b.*)", ln)
        if m and "NbGraderException" not in ln and not ln.startswith(("File ", "raise ")):
            return m.group(1)[:300]
    return (lines[-1][:300] if lines else "no log") + " (see the log)"


def _execution_problems(path: Path) -> tuple[list[str], dict[str, str]]:
    """(ids of cells that timed out, grade_id -> first line of the error) from an autograded notebook."""
    nb = read_notebook(path)
    timeouts, errors = [], {}
    for k, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        g = (c.metadata.get("nbgrader") or {}).get("grade_id")
        for out in c.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            if out.get("ename") in TIMEOUT_ENAMES and (g or f"cell {k}") not in timeouts:
                timeouts.append(g or f"cell {k}")
            if g and g not in errors:
                errors[g] = f"{out.get('ename')}: {out.get('evalue', '')}"[:300]
    return timeouts, errors


def grade(submissions: str | Path, labs_release: str | Path = "labs", solutions: str | Path = "solutions",
          out: str | Path | None = "grades", timeout: float | None = None, assignment: str | None = None,
          workdir: str | Path | None = None, config_file: str | Path | None = None, feedback: bool = True,
          echo=None) -> GradeReport:
    """Grade every notebook under `submissions`; write the outputs to `out` (None: write nothing).

    `timeout` is the per-cell limit in seconds (default: nbgrader_config.py's, else 60).
    `echo(str)` receives progress lines (None: quiet).
    """
    say = echo or (lambda s: None)
    labs_release, solutions = Path(labs_release), Path(solutions)
    released, sources = set(lab_names(labs_release)), set(lab_names(solutions))
    notes = []
    for name in sorted(released - sources):
        notes.append(f"{labs_release / (name + '.ipynb')} has no source in {solutions}/; it cannot be graded")
    for name in sorted(sources - released):
        notes.append(f"{solutions / (name + '.ipynb')} has no release in {labs_release}/; it cannot be graded")
    gradable = sorted(released & sources)
    if assignment is not None and assignment not in gradable:
        raise FileNotFoundError(f"--assignment {assignment}: need both {labs_release}/{assignment}.ipynb and "
                                f"{solutions}/{assignment}.ipynb")
    if not gradable:
        raise FileNotFoundError(f"no lab has both a release in {labs_release}/ and a source in {solutions}/")
    release_nbs = {name: read_notebook(labs_release / f"{name}.ipynb") for name in gradable}
    numbers = {int(name[3:]): name for name in gradable}
    keys = {name: _release_keys(nb) for name, nb in release_nbs.items()
            if assignment is None or name == assignment}
    coll = collect(submissions, numbers, assignment, keys)

    cfg = find_config(config_file, solutions)
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="course-grade-")
        root = Path(tmp.name)
    else:
        root = Path(workdir)
        if root.exists() and any(root.iterdir()):
            if not (root / WORKDIR_MARKER).exists():
                raise FileExistsError(f"--workdir {root} is not empty and was not made by `course grade`; "
                                      "give an empty or new folder")
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        (root / WORKDIR_MARKER).write_text("made by `course grade`; it is deleted and remade on the next run\n")
    from traitlets.config import Config
    extra = Config()
    from nbgrader.preprocessors import GetGrades
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from .feedback import HideHiddenTests
    extra.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
    course = CourseDir(root, cfg, timeout, extra)
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        _prepare_out(out_dir)
    results: list[Result] = []
    try:
        needed = sorted({s.assignment for s in coll.submissions})
        ready = {}
        for lab in needed:
            try:
                generated = generate_release(course, lab, read_notebook(solutions / f"{lab}.ipynb"),
                                             solutions / f"{lab}.ipynb")
                rel_path = labs_release / f"{lab}.ipynb"
                if notebook_text(normalize_lab(generated, _lab_relpath(rel_path))) != rel_path.read_text(encoding="utf-8"):
                    notes.append(f"{rel_path} is not what {solutions / (lab + '.ipynb')} generates now (run "
                                    "`course build-labs`?); submissions are checked against the release students "
                                    "had, and graded with the tests of the source")
                ready[lab] = ""
            except (LabBuildError, OSError, ValueError) as e:
                ready[lab] = str(e)
        students = sorted({s.student for s in coll.submissions})
        ids = {st: f"s{k + 1:03d}" for k, st in enumerate(students)}
        for k, sub in enumerate(sorted(coll.submissions, key=lambda s: (s.assignment, s.student))):
            say(f"[{k + 1}/{len(coll.submissions)}] {sub.assignment} {sub.student}: {sub.path.name}")
            r = Result(sub.student, sub.assignment, str(sub.path), internal_id=ids[sub.student],
                       superseded=[str(p) for p in sub.superseded])
            for fl in sub.flags:
                r.flags.setdefault(fl, [])
            if sub.superseded:
                r.messages.append("several files for this lab; graded the most recently modified, not: "
                                  + ", ".join(p.name for p in sub.superseded))
            if ready[sub.assignment]:
                r.messages.append(f"the lab could not be set up for grading: {ready[sub.assignment]}")
                r.flags.setdefault("lab_setup_failed", [])
                results.append(r)
                continue
            try:
                _grade_one(course, sub, r, release_nbs[sub.assignment], out_dir, feedback)
            except Exception as e:  # never let one submission stop the others
                r.status, r.score, r.max_score = "error", None, None
                r.flags.setdefault("grader_crashed", [])
                r.messages.append(f"the grader failed on this submission: {type(e).__name__}: {e}")
                r.log = (r.log or "") + traceback.format_exc()
            results.append(r)
    finally:
        if tmp is not None:
            tmp.cleanup()
    report = GradeReport(results, [(str(p), why) for p, why in coll.unattributed],
                         [(str(p), why) for p, why in coll.ignored], notes, out_dir)
    if out_dir is not None:
        write_outputs(report, out_dir)
    return report


def _grade_one(course: CourseDir, sub, r: Result, release_nb, out_dir: Path | None, feedback: bool) -> None:
    sid, lab = r.internal_id, r.assignment
    # 1. read (the submission is only read)
    try:
        with warnings.catch_warnings():  # nbformat fixes duplicated cell ids of copied cells in memory
            warnings.simplefilter("ignore")
            nb = nbformat.read(str(sub.path), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as e:
        r.status = "error"
        r.flags.setdefault("unreadable", [])
        r.messages.append(f"not a readable notebook: {type(e).__name__}: {str(e)[:300]}")
        return
    if len(nb.cells) > MAX_CELLS:
        r.status = "error"
        r.flags.setdefault("too_many_cells", [str(len(nb.cells))])
        r.messages.append(f"{len(nb.cells)} cells; grade this one by hand")
        return
    # 2. check and repair against the release
    work, findings = repair(nb, release_nb)
    for k, v in findings.flags.items():
        r.flags[k] = v
    r.messages += findings.messages
    dest = course.submitted(sid, lab)
    if dest.parent.exists():
        shutil.rmtree(dest.parent)
    dest.parent.mkdir(parents=True)
    nbformat.write(work, str(dest))
    # 3. autograde
    t0 = time.time()
    res = course.autograde(sid, lab)
    log = result_log(res)
    r.log = log
    if out_dir is not None:
        (out_dir / "logs").mkdir(parents=True, exist_ok=True)
        logfile = out_dir / "logs" / f"{_slug(r.student)}_{lab}.log"
        logfile.write_text(log, encoding="utf-8")
        r.log = str(logfile)
    graded = course.autograded(sid, lab)
    if not res.get("success") or not graded.exists():
        r.status = "error"
        r.flags.setdefault("autograde_failed", [])
        r.messages.append("nbgrader autograde failed: " + _failure_reason(log))
        return
    score, max_score, manual, cells = _scores(course, sid, lab)
    timeouts, errors = _execution_problems(graded)
    for c in cells:
        if c["grade_id"] in errors:
            c["error"] = errors[c["grade_id"]]
    r.score, r.max_score, r.cells = score, max_score, cells
    if timeouts:
        r.flags["timeout"] = timeouts
        r.messages.append(f"cells hit the time limit of {course.timeout} s: {', '.join(timeouts)}")
    if manual:
        r.flags.setdefault("needs_manual_grading", [c["grade_id"] for c in cells if c["needs_manual_grade"]])
    r.messages.append(f"autograded in {time.time() - t0:.1f} s")
    # 4. feedback
    if feedback:
        fres = course.generate_feedback(sid, lab)
        html = course.feedback(sid, lab)
        if fres.get("success") and html.exists():
            if out_dir is not None:
                target = out_dir / "feedback" / _slug(r.student) / f"{lab}.html"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(html, target)
                r.feedback = str(target)
        else:
            r.flags.setdefault("feedback_failed", [])
            r.messages.append("nbgrader generate_feedback failed: " + result_log(fres)[-300:])
    review = {"timeout", "needs_manual_grading", "several_files", "assignment_from_content"}
    if findings.needs_review or review & set(r.flags) or "feedback_failed" in r.flags:
        r.status = "review"
    elif findings.repaired:
        r.status = "repaired"
    else:
        r.status = "ok"


# ---------------------------------------------------------------------------------------------------
# outputs

CSV_COLUMNS = ["student", "assignment", "score", "max_score", "status", "flags", "file"]


def _fmt(x):
    if x is None:
        return ""
    return f"{x:g}" if isinstance(x, float) else str(x)


OUT_MARKER = ".course-grades"


def _prepare_out(out: Path) -> None:
    """Results of an earlier run in `out` (feedback, logs) are removed, so nothing stale is handed out;
    only in a folder an earlier `course grade` made."""
    if (out / OUT_MARKER).exists():
        for sub in ("feedback", "logs"):
            if (out / sub).is_dir():
                shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).write_text("written by `course grade`; feedback/ and logs/ are replaced on each run\n")


def write_outputs(report: GradeReport, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in report.results:
            w.writerow([r.student, r.assignment, _fmt(r.score), _fmt(r.max_score), r.status, r.flag_text, r.file])
    data = {"results": [asdict(r) for r in report.results],
            "not_graded": [{"file": p, "why": w} for p, w in report.not_graded],
            "ignored": [{"file": p, "why": w} for p, w in report.ignored],
            "warnings": report.warnings}
    (out / "report.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    lines = [f"{p}\t{w}" for p, w in report.not_graded]
    (out / "not_graded.txt").write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")


def summary(report: GradeReport) -> str:
    """A short table for the terminal."""
    rows = [("student", "lab", "score", "status", "flags")]
    for r in sorted(report.results, key=lambda r: (r.assignment, r.student)):
        score = f"{_fmt(r.score)}/{_fmt(r.max_score)}" if r.score is not None else "-"
        flags = ", ".join(r.flags) if r.flags else ""
        rows.append((r.student, r.assignment, score, r.status, flags))
    widths = [min(max(len(row[k]) for row in rows), 40) for k in range(4)]
    lines = ["  ".join(row[k][:40].ljust(widths[k]) for k in range(4)) + "  " + row[4] for row in rows]
    counts = {}
    for r in report.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("")
    lines.append(f"{len(report.results)} submission(s): "
                 + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) if report.results else "no submissions")
    if report.not_graded:
        lines.append(f"NOT GRADED ({len(report.not_graded)} file(s) not attributed to a student and a lab):")
        lines += [f"  {p}: {w}" for p, w in report.not_graded]
    other = [(p, w) for p, w in report.ignored if not w.startswith("not a notebook")]
    if other:
        lines.append(f"skipped ({len(other)}):")
        lines += [f"  {p}: {w}" for p, w in other]
    for w in report.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
