"""`course grade`: collect -> check and repair -> run in a sandbox and judge -> feedback -> CSV.

Each submission is graded in two steps, both in one kernel started through `sandbox.py` (least
privilege: see there for the isolation levels), in a working folder that holds only that notebook:

1. its cells run, as the student wrote them, except the lab's test cells (`session.py`: each cell with a
   time limit, the notebook with a budget, the outputs capped);
2. the lab's judge (``judges/labNN.py``, `judging.py`) calls the student's functions on inputs the grader
   draws (from the class secret and the student's key: a regrade draws the same ones) and judges what
   comes back, as plain data, in the grader's own process, against the course's reference, which the
   kernel's copy of course_lib does not even hold (`sandbox.withhold`).

No hidden test, expected value or reference enters the kernel, and nothing the kernel prints is a score:
the scores are the judge's, merged into the instructor's nbgrader gradebook (nbgrader keeps the release,
the gradebook and manual grading; its autograde is not used). One bad notebook (syntax error, infinite
loop, deleted cells, invalid JSON, huge outputs, a dead kernel) never stops the others, and every step of
a submission runs inside the grader's error handling: the batch always ends with grades.csv.

Outputs, in `out` (default ``grades/``):
  feedback/<key>/<labNN>.html   for the student: built by the grader from the release, the student's own
                                cells, the judge's verdicts and the kernel's text outputs (`feedback.py`);
                                <key> is the student id made file-safe, with a short hash where two ids
                                collide
  grades.csv               instructor: student, assignment, score, max_score, status, flags, file, then the
                           written parts' (manual.py): auto_score, manual_score, manual_pending, one column each
  manual_todo.csv          instructor: the written parts waiting for a score, a file for --manual to fill in
  manual_scores.csv        instructor: every manual score entered; kept from run to run (a regrade keeps them)
  report.json              instructor: per-part scores and cases, repairs, messages, files not graded
  logs/<key>_<labNN>.log        instructor: what the grader noted for that submission
  not_graded.txt           instructor: entries not graded or skipped, and why
  leaderboard.csv, .html   the final project's (lab13) board, when project submissions were graded
``workdir`` (nbgrader's course folder: sources, gradebook, executed notebooks) is the instructor's alone.

Status of a submission:
  ok        graded, nothing unusual
  repaired  graded after a safe automatic repair (restored metadata, restored edited tests, put back
            deleted cells, ...; see flags)
  review    graded, but a human should look: cells matched only by similarity, cells that could not be
            found after metadata loss, a cell that timed out, several files for one lab, hand-graded
            cells other than the written parts (those wait in grades.csv's manual_pending, with status
            ok), the lab recognized from content only, the wrong lab handed in, a dead
            kernel, the time budget used up, outputs over their cap, an answer that imports the
            course_lib reference, a part the judge could not judge (``judge_failed``)
  error     not graded (unreadable or too large a notebook, a kernel that cannot start); score left empty,
            never 0
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from .build import LabBuildError, generate_release, lab_names, nbgrader_meta, normalize_lab, notebook_text, \
    read_notebook, _lab_relpath
from .collect import UnsafeSubmission, collect, read_submission, terminal_safe
from .feedback import OUTPUT_MODES, feedback_notebook, render_html, write_text
from .jobs import BarProgress, LineProgress, auto_jobs, parse_jobs, run, sandbox_slots, submission_uids
from .judging import judge_parts, load_judge, load_secret, release_mistakes
from .leaderboard import is_project, project_entry, write_leaderboard
from .manual import STORE, TODO, ManualScoreError, check_scores, merge_rows, read_scores, write_rows, write_todo, \
    written_rubric
from .manual import manual_parts as written_parts
from .nbgrader_env import DEFAULT_TIMEOUT, CourseDir, find_config, quiet_nbgrader
from .references import answer_table, reference_imports
from .repair import repair
from .sandbox import DEFAULT_MEMORY_GB, Isolation, RunScratch, exposed_paths, kernel_spec, kill_leftovers, probe
from .session import Limits, check_kernel, is_test_cell, run_submission

MAX_CELLS = 3000
MAX_SUBMISSION_BYTES = 64 * 2**20      # a larger file is not graded (flag too_large): grade it by hand
WORKDIR_MARKER = ".course-grade-workdir"


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
    file_key: str = ""        # the collision-free name of this student's feedback folder and log
    project: dict | None = None   # a project lab's leaderboard entry (leaderboard.py): method, record, points
    manual: dict = field(default_factory=dict)   # written parts: {grade_id: points, score (None: pending),
                                                 # comment, validated} (manual.py)

    @property
    def manual_pending(self) -> list[str]:
        """The written parts with no validated score yet."""
        return [g for g, m in self.manual.items() if not m.get("validated")]

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
    isolation: str = ""
    manual_rows: list | None = None   # every manual score entered (manual.ManualScore), earlier runs' and this one's

    def by_student(self, student: str, assignment: str | None = None) -> Result:
        hits = [r for r in self.results if r.student == student and (assignment is None or r.assignment == assignment)]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} results for student {student!r} {assignment or ''}")
        return hits[0]

    @property
    def ok(self) -> bool:
        return not self.not_graded and all(r.status != "error" for r in self.results)


def _slug(s: str) -> str:
    s = re.sub(r"[^\w.\- ]+", "_", s, flags=re.UNICODE).strip().replace(" ", "_").lstrip(".")
    return s[:80] or "student"


def file_keys(students) -> dict[str, str]:
    """student id -> a file-safe name, unique even where ids differ only in spaces, punctuation or case
    ("Ann Lee" and "Ann_Lee" both get a short hash of the id appended)."""
    students = sorted(set(students))
    groups: dict[str, list[str]] = {}
    for st in students:
        groups.setdefault(_slug(st).casefold(), []).append(st)
    keys = {}
    for st in students:
        k = _slug(st)
        if len(groups[k.casefold()]) > 1:
            k = f"{k}-{hashlib.sha1(st.encode('utf-8')).hexdigest()[:8]}"
        keys[st] = k
    return keys


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


def test_parts(release_nb) -> list[tuple[str, float]]:
    """[(grade_id, points)] of the release's autograded test cells, in order: what the judge must judge."""
    return [(nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points") or 0))
            for c in release_nb.cells if is_test_cell(c)]


def manual_parts(release_nb) -> list[str]:
    """grade_ids of the cells the instructor grades by hand (nbgrader's manually graded answers and tasks)."""
    out = []
    for c in release_nb.cells:
        m = nbgrader_meta(c) or {}
        if m.get("grade") and (m.get("solution") or m.get("task")) or (m.get("task") and not m.get("grade")):
            out.append(m["grade_id"])
    return out


@dataclass
class _Lab:
    """What the grader prepared for one lab (in its own process; workers load the judge themselves)."""
    judge_path: str
    order: list                      # [(grade_id, points)]
    mistakes: dict                   # the release's MISTAKES
    lib: str                         # the kernel's course_lib copy, with the graded references withheld
    answers: object                  # references.AnswerTable: what the static reference-import check reads
    error: str = ""
    clean: bool = False              # its judge times the entry against a clean kernel (Judge(clean=True))
    written: dict = field(default_factory=dict)   # {grade_id: {points, rubric}}: the judge's WRITTEN (manual.py)


@dataclass
class _Context:
    """What every submission of one grade run shares."""
    course: CourseDir                 # the instructor's course folder (gradebook, executed notebooks)
    cfg: Path | None
    timeout: float | None
    iso: Isolation
    scratch: RunScratch               # per-submission scratch copies and kernel folders live under here
    budget: float
    labs: dict                        # lab -> _Lab
    release_keys: dict                # lab -> (grade_ids, sources), for "is this the wrong lab?"
    secret: bytes
    feedback_outputs: str = "shown"
    clean_uid: int | None = None      # the user the clean kernels run as (a fresh one, no submission's)
    manual: dict = field(default_factory=dict)   # {(student, lab): {grade_id: ManualScore}}: entered by hand

    def __getstate__(self):
        """What a worker process gets (jobs.py): the course by its folder (no nbgrader API objects)."""
        st = dict(self.__dict__)
        st["course"] = (str(self.course.root), self.cfg, self.timeout)
        return st

    def __setstate__(self, st):
        root, cfg, timeout = st["course"]
        st["course"] = CourseDir(root, cfg, timeout)
        self.__dict__.update(st)


REVIEW_FLAGS = {"timeout", "needs_manual_grading", "several_files", "assignment_from_content", "wrong_lab",
                "project_review", "kernel_died", "time_budget", "reference_import", "processes_left_behind",
                "feedback_failed",
                "memory_limit", "output_limit", "judge_failed"}


def default_budget(timeout: float | None) -> float:
    """The whole notebook's time limit (its cells and the judge's calls): 10 per-cell timeouts, at least 10
    minutes."""
    return float(max(600, 10 * (timeout or DEFAULT_TIMEOUT)))


def default_secret_file(solutions: Path) -> Path:
    """Where the class secret lives unless --secret-file says: beside solutions/, in the ignored .grading/."""
    return Path(solutions).resolve().parent / ".grading" / "class-secret"


def grade(submissions: str | Path, labs_release: str | Path = "labs", solutions: str | Path = "solutions",
          out: str | Path | None = "grades", timeout: float | None = None, assignment: str | None = None,
          workdir: str | Path | None = None, config_file: str | Path | None = None, feedback: bool = True,
          echo=None, isolation: str | None = None, require_sandbox: bool = False, budget: float | None = None,
          memory_gb: float | None = DEFAULT_MEMORY_GB, sandbox_user=None, jobs: int | str = 1,
          feedback_outputs: str = "shown", progress: str | None = None, judges: str | Path | None = None,
          secret_file: str | Path | None = None, manual: str | Path | None = None) -> GradeReport:
    """Grade every notebook under `submissions`; write the outputs to `out` (None: write nothing).

    `timeout` is the per-cell (and per judge call) limit in seconds (default: nbgrader_config.py's, else
    60); `budget` the whole notebook's (default: `default_budget`). `isolation` is ``bwrap``, ``user`` or
    ``process`` (default: the strongest available, see `sandbox.py`); `require_sandbox` refuses to grade
    without bubblewrap (`sandbox.SandboxUnavailable`). `sandbox_user`: a user, or a list of users (one per
    job); none given, as root, each submission runs as a fresh user id of its own (`jobs.submission_uids`).
    `jobs`: submissions graded at a time, or "auto" (`jobs.py`). `feedback_outputs`: "shown" (the kernel's
    text outputs) or "none". `judges`: the folder of judges/labNN.py (default: beside `solutions`).
    `secret_file`: the class secret the hidden cases are drawn from (default: `default_secret_file`, made
    when missing). `manual`: a CSV of the scores the instructor gave the written parts (`manual.py`),
    merged with those an earlier run kept in `out` (manual_scores.csv); a bad row raises ManualScoreError
    (a ValueError) before anything is graded. `echo(str)` receives progress lines (None: quiet); `progress`
    is "lines" (the default with `echo`) or "bar" (a tqdm bar on stderr; `echo` then gets the other lines).
    """
    say = echo or (lambda s: None)
    jobs = parse_jobs(jobs)
    if feedback_outputs not in OUTPUT_MODES:
        raise ValueError(f"feedback_outputs must be one of {', '.join(OUTPUT_MODES)}, got {feedback_outputs!r}")
    if progress not in (None, "lines", "bar"):
        raise ValueError(f"progress must be 'lines' or 'bar', got {progress!r}")
    explicit_users = sandbox_user is not None
    users = [sandbox_user] if isinstance(sandbox_user, (str, int)) or sandbox_user is None else list(sandbox_user)
    iso = probe(isolation, require_sandbox, users[0] if users else None, memory_gb)
    say(iso.describe())
    labs_release, solutions = Path(labs_release), Path(solutions)
    judges = Path(judges) if judges is not None else solutions.resolve().parent / "judges"
    secret, note = load_secret(secret_file or default_secret_file(solutions))
    if note:
        say(note)
    released, sources = set(lab_names(labs_release)), set(lab_names(solutions))
    notes = list(iso.notes)
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
    if budget is not None and budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got {budget}")
    release_nbs = {name: read_notebook(labs_release / f"{name}.ipynb") for name in gradable}
    numbers = {int(name[3:]): name for name in gradable}
    all_keys = {name: _release_keys(nb) for name, nb in release_nbs.items()}
    keys = {name: k for name, k in all_keys.items() if assignment is None or name == assignment}
    coll = collect(submissions, numbers, assignment, keys)
    out_dir = Path(out) if out is not None else None
    manual_rows, manual_now = _manual_scores(coll, release_nbs, out_dir, manual, notes)

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
    os.chmod(root, 0o700)  # the instructor's course folder: sources, gradebook; never the kernel's
    course = CourseDir(root, cfg, timeout)
    if out_dir is not None:
        _prepare_out(out_dir)
    results: list[Result] = []
    scratch = None
    try:
        # the kernels' scratch (modes the sandbox user needs, whatever TMPDIR is), then one real kernel
        # started at the chosen level: a level that cannot start a kernel stops here, with the reason
        scratch = RunScratch(iso)
        check_kernel(iso, scratch)
        needed = sorted({s.assignment for s in coll.submissions})
        labs: dict[str, _Lab] = {}
        for lab in needed:
            labs[lab] = _prepare_lab(course, scratch, lab, solutions, labs_release, judges, release_nbs[lab], notes)
        ctx = _Context(course, cfg, timeout, iso, scratch, budget or default_budget(course.timeout), labs,
                       all_keys, secret, feedback_outputs=feedback_outputs, manual=manual_now)
        students = sorted({s.student for s in coll.submissions})
        ids = {st: f"s{k + 1:03d}" for k, st in enumerate(students)}
        fkeys = file_keys(students)
        todo = []
        for k, sub in enumerate(sorted(coll.submissions, key=lambda s: (s.assignment, s.student))):
            r = Result(sub.student, sub.assignment, str(sub.path), internal_id=ids[sub.student],
                       superseded=[str(p) for p in sub.superseded], file_key=fkeys[sub.student])
            for fl in sub.flags:
                r.flags.setdefault(fl, [])
            if sub.superseded:
                r.messages.append("several files for this lab; graded the most recently modified, not: "
                                  + ", ".join(p.name for p in sub.superseded))
            results.append(r)
            if labs[sub.assignment].error:
                r.messages.append(f"the lab could not be set up for grading: {labs[sub.assignment].error}")
                r.flags.setdefault("lab_setup_failed", [])
                continue
            todo.append((k, sub, r))
        if jobs == "auto":
            kernels = 2 if any(labs[sub.assignment].clean for _, sub, _ in todo) else 1   # a clean kernel beside
            n_jobs, why = auto_jobs(len(todo), iso.memory_gb * kernels if iso.memory_gb else iso.memory_gb)
            say(f"jobs: auto -> {n_jobs} ({why})")
        else:
            n_jobs = max(1, min(jobs, len(todo)))
        slots, who = sandbox_slots(iso, n_jobs, users[1:], explicit_process=isolation == "process",
                                   fresh=not explicit_users)
        if who:
            say(who)
        if iso.uid is not None and not explicit_users:
            uids = submission_uids(len(todo) + 1)
            todo = [(k, sub, r, uid) for (k, sub, r), uid in zip(todo, uids)]
            ctx.clean_uid = uids[-1]      # the clean kernels' own (they run only the grader's requests)
        else:
            todo = [(k, sub, r, None) for k, sub, r in todo]
        prog = (BarProgress(len(todo)) if progress == "bar" else
                LineProgress(say, len(todo)) if echo is not None else LineProgress(lambda s: None, len(todo)))

        def finish(idx, r, carry):
            results[idx] = r
            try:
                _finish(ctx, r, carry, release_nbs[r.assignment], out_dir, feedback)
            except Exception as e:  # never let one submission stop the others
                r.status, r.score, r.max_score = "error", None, None
                r.flags.setdefault("grader_crashed", [])
                r.messages.append(f"the grader failed on this submission: {type(e).__name__}: {e}")
                r.log = (r.log or "") + traceback.format_exc()
            try:
                _write_log(r, out_dir)
            except Exception as e:  # noqa: BLE001 - a log that cannot be written is said, not fatal
                r.messages.append(f"the log could not be written: {type(e).__name__}: {e}")
        try:
            run(grade_one_safely, ctx, todo, release_nbs, slots, finish, prog)
        finally:
            prog.close()
    finally:
        if scratch is not None:
            scratch.close()
        if tmp is not None:
            tmp.cleanup()
    report = GradeReport(results, [(str(p), why) for p, why in coll.unattributed],
                         [(str(p), why) for p, why in coll.ignored], notes, out_dir, iso.describe(), manual_rows)
    if out_dir is not None:
        write_outputs(report, out_dir)
    return report


def _manual_scores(coll, release_nbs: dict, out_dir: Path | None, manual, notes: list) -> tuple[list, dict]:
    """The manual scores for this run: the store an earlier run left in `out_dir` (rows that no longer fit
    are left out, with a note), then the instructor's `manual` file over it (every bad row refused).
    Returns (the store's rows after this run, {(student, lab): {grade_id: ManualScore}})."""
    graded = {(s.student, s.assignment): written_parts(release_nbs[s.assignment]) for s in coll.submissions}
    stored = []
    if out_dir is not None and (out_dir / STORE).is_file():
        try:
            stored = read_scores(out_dir / STORE)
        except ManualScoreError as e:
            raise ManualScoreError(f"the manual scores kept by an earlier run cannot be read (fix or remove "
                                   f"{out_dir / STORE}): {e}") from None
    others = set(release_nbs) - {lab for _, lab in graded}      # labs this run does not grade (--assignment)
    now, dropped = check_scores(stored, graded, strict=False, other_labs=others)
    notes += dropped
    new = []
    if manual is not None:
        new = read_scores(manual)
        entered, _ = check_scores(new, graded, strict=True, other_labs=others)
        for key, parts in entered.items():
            now.setdefault(key, {}).update(parts)
    return merge_rows(stored, new), now


def _prepare_lab(course: CourseDir, scratch: RunScratch, lab: str, solutions: Path, labs_release: Path,
                 judges: Path, release_nb, notes: list) -> _Lab:
    """The lab's release in nbgrader's gradebook, its judge loaded and checked against the release's test
    cells, and the kernel's copy of course_lib with the judge's references withheld."""
    empty = _Lab("", [], {}, "", None)
    try:
        source_nb = read_notebook(solutions / f"{lab}.ipynb")
        generated = generate_release(course, lab, source_nb, solutions / f"{lab}.ipynb")
        rel_path = labs_release / f"{lab}.ipynb"
        if notebook_text(normalize_lab(generated, _lab_relpath(rel_path))) != rel_path.read_text(encoding="utf-8"):
            notes.append(f"{rel_path} is not what {solutions / (lab + '.ipynb')} generates now (run "
                         "`course build-labs`?); submissions are checked against the release students had")
        judge_path = judges / f"{lab}.py"
        judge = load_judge(judge_path)
        order = test_parts(release_nb)
        missing = [g for g, _ in order if g not in judge.parts]
        extra = sorted(set(judge.parts) - {g for g, _ in order})
        if missing or extra:
            raise ValueError(f"{judge_path} does not match the release's test cells"
                             + (f": no part for {', '.join(missing)}" if missing else "")
                             + (f"; parts for no test cell: {', '.join(extra)}" if extra else ""))
        written = written_rubric(judge, lab, written_parts(release_nb))
        lib = scratch.lib_for(lab, judge.withheld)
        return _Lab(str(judge_path), order, release_mistakes(release_nb), str(lib),
                    answer_table(source_nb, judge.references), clean=judge.clean, written=written)
    except (LabBuildError, OSError, ValueError, SyntaxError, ImportError) as e:
        empty.error = f"{type(e).__name__}: {e}"
        return empty


def _wrong_lab(nb, lab: str, release_keys: dict) -> str | None:
    """The lab this notebook clearly is, when that is not `lab` (by grade_ids and locked cell sources)."""
    ids, srcs = set(), set()
    for c in nb.cells:
        m = c.get("metadata", {}).get("nbgrader") if isinstance(c, dict) else None
        if isinstance(m, dict) and m.get("grade_id"):
            ids.add(m["grade_id"])
        if isinstance(c, dict):
            srcs.add(str(c.get("source", "")).strip())
    scores = {}
    for name, (rel_ids, rel_srcs) in release_keys.items():
        scores[name] = max(len(ids & rel_ids) / max(len(rel_ids), 1), len(srcs & rel_srcs) / max(len(rel_srcs), 1))
    best = max(scores, key=scores.get)
    if best != lab and scores[best] >= 0.5 and scores[best] > scores.get(lab, 0) + 0.25:
        return best
    return None


def _merge(course: CourseDir, sid: str, lab: str, scores: dict, manual: dict | None = None) -> None:
    """Write one submission's scores into the instructor's gradebook (replacing an earlier entry). A cell
    with no score (None) is left for the instructor (needs manual grading), unless `manual` ({grade_id:
    score}: the instructor's validated scores) gives it one."""
    from nbgrader.api import MissingEntry

    with quiet_nbgrader(), warnings.catch_warnings(), course.gradebook() as gb:
        warnings.simplefilter("ignore")
        gb.update_or_create_student(sid)
        try:
            gb.remove_submission(lab, sid)
        except MissingEntry:
            pass
        sub = gb.add_submission(lab, sid)
        for nb in sub.notebooks:
            for g in nb.grades:
                auto = scores.get(g.name, 0.0)
                g.auto_score = auto
                g.needs_manual_grade = auto is None
                if (manual or {}).get(g.name) is not None:
                    g.manual_score = float(manual[g.name])
                    g.needs_manual_grade = False
        gb.db.commit()


def grade_one_safely(ctx: _Context, sub, r: Result, release_nb, uid=None) -> tuple[Result, dict | None]:
    """`_grade_one`, with any failure of the grader turned into an error result (never raises)."""
    try:
        return r, _grade_one(ctx, sub, r, release_nb, uid)
    except Exception as e:  # never let one submission stop the others
        r.status, r.score, r.max_score = "error", None, None
        r.flags.setdefault("grader_crashed", [])
        r.messages.append(f"the grader failed on this submission: {type(e).__name__}: {e}")
        r.log = (r.log or "") + traceback.format_exc()
        return r, None


class TooLarge(ValueError):
    pass


def _read_submission(path: Path):
    """The submitted notebook, read without following links, at most MAX_SUBMISSION_BYTES; its stored
    outputs are dropped before nbformat reads it (the notebook runs again; a large output costs nothing but
    the flag repair gives it). Errors never quote the file's content."""
    text = read_submission(path, MAX_SUBMISSION_BYTES + 1)
    if len(text.encode("utf-8", errors="replace")) > MAX_SUBMISSION_BYTES:
        raise TooLarge(f"larger than {MAX_SUBMISSION_BYTES // 2**20} MiB")
    try:
        data = json.loads(text)
    except ValueError as e:
        where = f"line {getattr(e, 'lineno', '?')}, column {getattr(e, 'colno', '?')}"
        raise ValueError(f"not valid JSON ({where})") from None
    del text
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError("no list of cells")
    output_bytes = 0
    for c in data["cells"]:
        if isinstance(c, dict) and isinstance(c.get("outputs"), list):
            if c["outputs"]:
                output_bytes += len(json.dumps(c["outputs"]))
                c["outputs"] = []
    with warnings.catch_warnings():  # nbformat fixes duplicated cell ids of copied cells in memory
        warnings.simplefilter("ignore")
        try:
            nb = nbformat.reads(json.dumps(data), as_version=4)
        except Exception as e:  # noqa: BLE001 - nbformat's messages quote the content
            raise ValueError(f"not a notebook nbformat can read ({type(e).__name__})") from None
    if not isinstance(nb.get("cells"), list):
        raise ValueError("no list of cells")
    return nb, output_bytes


def _grade_one(ctx: _Context, sub, r: Result, release_nb, uid=None) -> dict | None:
    """Read, check and repair, run and judge in a sandbox: what may run in a worker process (jobs.py).
    Returns what `_finish` needs (None when there is nothing to finish: `r` says why)."""
    sid, lab = r.internal_id, r.assignment
    lab_info: _Lab = ctx.labs[lab]
    iso = ctx.iso if uid is None else _with_uid(ctx.iso, uid)
    # 1. read (the submission is only read, never through a link)
    try:
        nb, output_bytes = _read_submission(sub.path)
    except TooLarge as e:
        r.status = "error"
        r.flags.setdefault("too_large", [])
        r.messages.append(f"not graded: the file is {e}; ask the student for a copy with its outputs cleared, "
                          "or grade it by hand")
        return None
    except (UnsafeSubmission, ValueError) as e:
        r.status = "error"
        r.flags.setdefault("unreadable", [])
        r.messages.append(f"not a readable notebook: {e}")
        return None
    if len(nb.cells) > MAX_CELLS:
        r.status = "error"
        r.flags.setdefault("too_many_cells", [str(len(nb.cells))])
        r.messages.append(f"{len(nb.cells)} cells; grade this one by hand")
        return None
    other = _wrong_lab(nb, lab, ctx.release_keys)
    if other:
        r.flags["wrong_lab"] = [other]
        r.messages.append(f"this notebook is {other}, not {lab}: the student handed in the wrong lab "
                          f"(graded as {lab} anyway)")
    # 2. check and repair against the release
    work, findings = repair(nb, release_nb)
    if output_bytes > 1_000_000:
        findings.flags.setdefault("large_outputs_removed", [f"{output_bytes / 1e6:.1f} MB"])
    for k, v in findings.flags.items():
        r.flags[k] = v
    r.messages += findings.messages
    if lab_info.answers is not None:
        refs = reference_imports(work.cells, lab_info.answers, release_nb.cells)
        if refs:
            r.flags["reference_import"] = sorted(refs)
            for gid, where in sorted(refs.items()):
                r.messages.append(f"{gid}: the answer imports course_lib's reference or internals "
                                  f"({'; '.join(where)})")
    # 3. run and judge in a sandboxed kernel, in a folder (the sandbox user's) holding only this notebook
    ks = ctx.scratch.kernel(f"{sid}-{lab}", iso)   # one student's labs may be graded side by side (--jobs)
    clean_ks = None
    log_lines: list[str] = []
    t0 = time.time()
    try:
        marker = hashlib.sha256(os.urandom(16)).hexdigest()[:16]
        conn = ks.run / "kernel.json"
        cpu = int(ctx.budget * 2 + 60)
        spec = kernel_spec(iso, ks, conn, marker, cpu, Path(lab_info.lib))
        nbformat.write(work, str(ks.work / f"{lab}.ipynb"))   # the student's own notebook, for code that opens it
        if iso.uid is not None:
            os.chown(ks.work / f"{lab}.ipynb", iso.uid, iso.gid)
        judge = load_judge(lab_info.judge_path)
        limits = Limits(cell_timeout=float(ctx.course.timeout), budget=ctx.budget)
        clean = None
        if lab_info.clean:   # a kernel of its own (folders, cgroups, user) running only the grader's requests
            clean_iso = _with_uid(ctx.iso, ctx.clean_uid) if ctx.clean_uid is not None else iso
            clean_ks = ctx.scratch.kernel(f"{sid}-{lab}-clean", clean_iso)
            clean_conn = clean_ks.run / "kernel.json"
            clean = {"spec": kernel_spec(clean_iso, clean_ks, clean_conn, marker, cpu, ctx.scratch.lib),
                     "connection_file": str(clean_conn)}

        def judge_fn(send, restart):
            return judge_parts(judge, send, lab_info.order, ctx.secret, lab, sub.student, lab_info.mistakes,
                               timeout=limits.cell_timeout, on_kernel_gone=restart, log=log_lines.append)
        session = run_submission(work, spec, str(conn), judge_fn, limits, log=log_lines.append, clean=clean)
        left = kill_leftovers(marker, iso.uid, session.pgids)
        if left:
            r.flags["processes_left_behind"] = [str(len(left))]
            r.messages.append(f"{len(left)} process(es) started by the notebook were still running after it and "
                              "were killed")
        jail = _read_text(ks.report)
        if session.verdict is None:
            r.status = "error"
            r.flags.setdefault("kernel_failed", [])
            r.messages.append("the kernel could not be started or run: "
                              + (session.startup_error or "") + (f" ({jail[-500:]})" if jail else ""))
            return None
    finally:
        if clean_ks is not None:
            ctx.scratch.release(clean_ks)
        usage = ctx.scratch.release(ks)  # kills what is left, removes its folders, tmpfs and cgroups
        if usage.get("oom_kill"):  # said whatever else happened (an early return included)
            r.flags["memory_limit"] = [f"{iso.memory_gb:g}GiB"]
            peak = f", peak {usage['peak'] / 2**20:.0f} MiB" if usage.get("peak") else ""
            r.messages.append(f"the notebook reached its memory limit of {iso.memory_gb:g} GiB: "
                              f"{usage['oom_kill']} process(es) killed{peak}")
    return {"session": session, "elapsed": time.time() - t0, "log": log_lines,
            "user": "" if iso.uid is None else f"uid {iso.uid}" if iso.user == f"uid {iso.uid}"
            else f"{iso.user} (uid {iso.uid})",
            "needs_review": findings.needs_review, "repaired": findings.repaired}


def _with_uid(iso: Isolation, uid: int) -> Isolation:
    return dataclasses.replace(iso, uid=uid, gid=uid, user=f"uid {uid}", notes=list(iso.notes),
                               expose=exposed_paths(uid, uid) if iso.expose or iso.level == "bwrap" else [])


def _feedback(ctx: _Context, r: Result, session, release_nb, out_dir: Path | None) -> None:
    """The student's feedback page (feedback.py)."""
    written = {gid: {**w, **r.manual.get(gid, {})} for gid, w in ctx.labs[r.assignment].written.items()}
    fb_nb = feedback_notebook(session.executed, release_nb, session.verdict, ctx.feedback_outputs, written=written)
    html = render_html(fb_nb, r.assignment, r.internal_id, ctx.course.db_url)
    if out_dir is not None:
        target = out_dir / "feedback" / (r.file_key or _slug(r.student)) / f"{r.assignment}.html"
        write_text(target, html)
        r.feedback = str(target)


def _write_log(r: Result, out_dir: Path | None) -> None:
    """What the grader noted of one submission, to logs/ (instructor's)."""
    if not r.log or out_dir is None:
        return
    logfile = out_dir / "logs" / f"{r.file_key or _slug(r.student)}_{r.assignment}.log"
    write_text(logfile, r.log)
    r.log = str(logfile)


def _finish(ctx: _Context, r: Result, carry: dict | None, release_nb, out_dir: Path | None, feedback: bool) -> None:
    """The grader's own process, one submission at a time: the instructor's gradebook, flags, feedback
    and log."""
    course = ctx.course
    sid, lab = r.internal_id, r.assignment
    if carry is None:
        return
    session = carry["session"]
    verdict = session.verdict
    scores = {gid: p.score for gid, p in verdict.parts.items()}
    for gid in manual_parts(release_nb):
        scores[gid] = None
    entered = ctx.manual.get((r.student, lab), {})
    written = ctx.labs[lab].written
    r.manual = {gid: {"points": w["points"], "score": entered[gid].score if gid in entered else None,
                      "comment": entered[gid].comment if gid in entered else "",
                      "validated": gid in entered and entered[gid].validated} for gid, w in written.items()}
    _merge(course, sid, lab, scores, {g: m["score"] for g, m in r.manual.items() if m["validated"]})
    executed = course.autograded(sid, lab)   # the executed notebook, kept in the instructor's course folder
    executed.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(session.executed, str(executed))
    score, max_score, manual, cells = _scores(course, sid, lab)
    for c in cells:
        part = verdict.parts.get(c["grade_id"])
        if part is not None:
            c["cases"] = [{"case": x.label, "group": x.group, "passed": x.passed,
                           **({"message": x.message} if x.message else {}),
                           **({"note": x.note} if x.note else {})} for x in part.cases]
            failed = part.failures()
            if failed:
                c["error"] = failed[0].message[:300]
            if part.misconceptions():
                c["misconceptions"] = part.misconceptions()
    r.score, r.max_score, r.cells = round(score, 4), max_score, cells
    lines = list(carry.get("log") or [])
    failed_parts = sorted(g for g, p in verdict.parts.items() if p.error)
    if failed_parts:
        r.flags["judge_failed"] = failed_parts
        for g in failed_parts:
            r.messages.append(f"{g}: the judge could not judge this part ({verdict.parts[g].error}); it scores 0 "
                              "until you look at it")
    if is_project(release_nb):  # the final project: its leaderboard entry, from the judge's record
        r.project = project_entry(verdict, read_notebook(executed), cells)
        why = list((r.project.get("record") or {}).get("flags") or [])
        if why:    # the judge's anomalies: the board says "review" and why
            r.flags["project_review"] = [str(w)[:300] for w in why]
            r.messages += [f"the project's measurement needs a look: {w}" for w in why]
    if session.timeouts:
        r.flags["timeout"] = list(session.timeouts)
        r.messages.append(f"cells hit the time limit of {course.timeout} s: {', '.join(session.timeouts)}")
    if session.died:
        r.flags["kernel_died"] = list(session.died)
        r.messages.append("the kernel died while running " + ", ".join(session.died) + "; the cells after it "
                          "ran in a new kernel")
    gone = sorted(g for g, p in verdict.parts.items() if p.kernel_gone)
    if gone:
        r.flags.setdefault("kernel_died", []).extend(f"judging {g}" for g in gone)
        r.messages.append("the kernel died or stopped answering while judging " + ", ".join(gone)
                          + "; the cases after that count as failed")
    if session.budget_at is not None or any("time budget" in (c.message or "") for p in verdict.parts.values()
                                            for c in p.cases):
        r.flags["time_budget"] = [f"{ctx.budget:g}s"]
        r.messages.append(f"the notebook used up its time budget of {ctx.budget:g} s; what came after was not run "
                          "and scores 0")
    if session.output_dropped or session.messages_dropped:
        r.flags["output_limit"] = ([f"{session.output_dropped:,} characters"] if session.output_dropped else []) + (
            [f"{session.messages_dropped} message(s) over {Limits.message_bytes // 2**20} MiB"]
            if session.messages_dropped else [])
        r.messages.append(f"{session.output_dropped:,} characters of output were not kept (a cell keeps "
                          f"{Limits.cell_chars:,}, a notebook {Limits.notebook_chars:,}), and "
                          f"{session.messages_dropped} message(s) larger than {Limits.message_bytes // 2**20} MiB "
                          "were never read")
    unexpected = [c["grade_id"] for c in cells if c["needs_manual_grade"] and c["grade_id"] not in r.manual]
    if manual and unexpected:   # a written part waits in manual_pending, not here: this is any other hand-graded cell
        r.flags.setdefault("needs_manual_grading", unexpected)
    r.messages.append(f"graded in {carry['elapsed']:.1f} s ({session.started} kernel start(s))"
                      + (f", kernel as {carry['user']}" if carry["user"] else ""))
    r.log = "\n".join(lines + r.messages) + "\n"
    if feedback:
        try:
            _feedback(ctx, r, session, release_nb, out_dir)
        except Exception as e:  # noqa: BLE001 - the grade stands without its feedback page
            r.flags.setdefault("feedback_failed", [])
            r.messages.append(f"the feedback page could not be made: {type(e).__name__}: {str(e)[:300]}")
    if carry["needs_review"] or REVIEW_FLAGS & set(r.flags):
        r.status = "review"
    elif carry["repaired"]:
        r.status = "repaired"
    else:
        r.status = "ok"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------------
# outputs

CSV_COLUMNS = ["student", "assignment", "score", "max_score", "status", "flags", "file"]
# then what the instructor grades by hand: the autograded share, the written parts' validated scores, the
# parts still waiting (empty: the score is final), and one column per written part (empty until scored)
MANUAL_COLUMNS = ["auto_score", "manual_score", "manual_pending"]


def _manual_cells(r: Result, written_ids: list[str]) -> list[str]:
    if r.score is None:
        return [""] * (len(MANUAL_COLUMNS) + len(written_ids))
    done = {g: m["score"] for g, m in r.manual.items() if m.get("validated")}
    manual = sum(done.values())
    pending = " ".join(f"{g}({r.manual[g]['points']:g})" for g in r.manual_pending)
    return ([_fmt(round(r.score - manual, 4)), _fmt(float(manual)) if r.manual else "", pending]
            + [_fmt(float(done[g])) if g in done else "" for g in written_ids])


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
        for name in ("leaderboard.csv", "leaderboard.html"):   # an earlier run's project board
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).write_text("written by `course grade`; feedback/ and logs/ are replaced on each run\n")


def csv_safe(text: str) -> str:
    """A text cell a spreadsheet will not run as a formula (=, +, -, @, tab, CR first get a quote)."""
    return "'" + text if text and text[0] in "=+-@\t\r" else text


def write_outputs(report: GradeReport, out: Path) -> None:
    """grades.csv, report.json and not_graded.txt (and the project's leaderboard)."""
    out.mkdir(parents=True, exist_ok=True)
    written_ids = sorted({g for r in report.results for g in r.manual})
    rows = [CSV_COLUMNS + MANUAL_COLUMNS + written_ids] + [
        [csv_safe(r.student), csv_safe(r.assignment), _fmt(r.score), _fmt(r.max_score), r.status,
         csv_safe(r.flag_text), csv_safe(r.file)] + _manual_cells(r, written_ids) for r in report.results]
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    write_text(out / "grades.csv", buf.getvalue())
    data = {"results": [asdict(r) for r in report.results],
            "not_graded": [{"file": p, "why": w} for p, w in report.not_graded],
            "ignored": [{"file": p, "why": w} for p, w in report.ignored],
            "warnings": report.warnings, "isolation": report.isolation}
    write_text(out / "report.json", json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    lines = [f"{p}\t{w}" for p, w in report.not_graded] + [f"{p}\tskipped: {w}" for p, w in report.ignored]
    write_text(out / "not_graded.txt", "\n".join(lines) + ("\n" if lines else ""))
    write_leaderboard(report.results, out, csv_safe)   # the final project's, when one was graded
    if report.manual_rows or (out / STORE).exists():   # kept for the next run (a regrade keeps the scores)
        write_rows(out / STORE, report.manual_rows or [])
    write_todo(out / TODO, [r for r in report.results if r.score is not None])


SUMMARY_LINES = 40


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= SUMMARY_LINES:
        return lines
    more = len(lines) - SUMMARY_LINES
    return lines[:SUMMARY_LINES] + [f"  ... and {more} more (all in not_graded.txt and report.json)"]


def summary(report: GradeReport) -> str:
    """A short table for the terminal (names and paths printed with their control characters escaped)."""
    rows = [("student", "lab", "score", "status", "flags")]
    for r in sorted(report.results, key=lambda r: (r.assignment, r.student)):
        score = f"{_fmt(r.score)}/{_fmt(r.max_score)}" if r.score is not None else "-"
        flags = ", ".join(r.flags) if r.flags else ""
        rows.append((terminal_safe(r.student), terminal_safe(r.assignment), score, r.status, flags))
    widths = [min(max(len(row[k]) for row in rows), 40) for k in range(4)]
    lines = ["  ".join(row[k][:40].ljust(widths[k]) for k in range(4)) + "  " + row[4] for row in rows]
    counts = {}
    for r in report.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("")
    lines.append(f"{len(report.results)} submission(s): "
                 + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) if report.results else "no submissions")
    if report.not_graded:
        lines.append(f"NOT GRADED ({len(report.not_graded)}: not attributed to a student and a lab, or not safe "
                     "to open):")
        lines += _capped([f"  {terminal_safe(p)}: {terminal_safe(w)}" for p, w in report.not_graded])
    if report.ignored:
        lines.append(f"skipped ({len(report.ignored)}):")
        lines += _capped([f"  {terminal_safe(p)}: {terminal_safe(w)}" for p, w in report.ignored])
    pending = sum(len(r.manual_pending) for r in report.results if r.score is not None)
    if pending:
        lines.append(f"{pending} written part(s) wait for your score: fill in manual_todo.csv and pass it with "
                     "--manual (the scores column of grades.csv counts only what is scored)")
    for w in report.warnings:
        lines.append(f"warning: {terminal_safe(w)}")
    if report.isolation:
        lines.append(report.isolation)
    return "\n".join(lines)
