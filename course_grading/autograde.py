"""`course grade`: collect -> check and repair -> autograde (nbgrader) -> feedback -> CSV.

Everything nbgrader needs lives in a working course directory (a temporary one unless ``workdir`` is
given; only the grader can read it); the submissions are only ever read. Each submission is autograded
in its own scratch copy: its own course folder and gradebook (a copy of the one made by
generate_assignment), and a kernel started through `sandbox.py` (least privilege, see there for the
isolation levels) in a working folder that holds only that notebook. The grader then computes the
scores from the executed notebook itself and merges them into the instructor's gradebook, from which
the feedback is made; nothing the kernel could write is trusted. Each cell has a time limit and the
whole notebook a budget, so one bad notebook (syntax error, infinite loop, deleted cells, invalid JSON,
huge outputs, a dead kernel) never stops the others; the guard (`execute.py`, `guard.py`) catches
tampering with the tests inside the kernel.

Outputs, in `out` (default ``grades/``); every file is written through `feedback.write_checked`, which
refuses one that carries hidden-test or solution text (`leaks.py`):
  feedback/<key>/<labNN>.html   for the student: built by the grader from the release, the student's own
                                cells, the scores and the outputs that carry no hidden-test or solution
                                text (`feedback.py`); <key> is the student id made file-safe, with a
                                short hash where two ids collide
  grades.csv               instructor: student, assignment, score, max_score, status, flags, file
  report.json              instructor: per-cell scores and errors, repairs, messages, files not graded
  logs/<key>_<labNN>.log        instructor: nbgrader's log for that submission
  not_graded.txt           instructor: entries not graded or skipped, and why
  leaderboard.csv, .html   the final project's (lab13) board, when project submissions were graded:
                           method, correct, speed-up with its spread, points (`leaderboard.py`)
The instructor files name every student and their files; they too are scrubbed of hidden-test and
solution text (strings replaced), so that one forwarded to a student gives nothing away. ``workdir``
(nbgrader's course folder: sources, gradebook, executed notebooks) is the instructor's alone.

Status of a submission:
  ok        graded, nothing unusual
  repaired  graded after a safe automatic repair (restored metadata, restored edited tests, put back
            deleted cells, ...; see flags)
  review    graded, but a human should look: cells matched only by similarity, cells that could not be
            found after metadata loss, a cell that timed out, several files for one lab, cells that
            need manual grading, the lab recognized from content only, the wrong lab handed in, a dead
            kernel (the points before it are kept), the time budget used up, tampering with the tests,
            an answer that imports the course_lib reference, outputs withheld from the feedback
            because they carried hidden-test or solution text (``feedback_withheld``)
  error     not graded (unreadable notebook, nbgrader failure); score left empty, never 0
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import secrets
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
from .collect import UnsafeSubmission, collect, read_submission
from .feedback import (OUTPUT_MODES, LeakBlocked, describe_hits, feedback_notebook, render_html, scrub_value,
                       withheld_page, write_checked)
from .jobs import BarProgress, LineProgress, auto_jobs, parse_jobs, run, sandbox_slots
from .execute import CollectGuard, InjectGuard, SandboxExecute, check_kernel
from .feedback import WIDGET_STATE
from .leaderboard import is_project, project_entry, write_leaderboard
from .leaks import LabSecrets, Scanner
from .nbgrader_env import DEFAULT_TIMEOUT, CourseDir, find_config, quiet_nbgrader, result_log
from .references import answer_table, reference_imports
from .repair import repair
from .sandbox import DEFAULT_MEMORY_GB, Isolation, RunScratch, kernel_spec, kill_leftovers, probe

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
    file_key: str = ""        # the collision-free name of this student's feedback folder and log
    project: dict | None = None   # a project lab's leaderboard entry (leaderboard.py): method, record, points

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
    scanner: object = field(default=None, repr=False, compare=False)  # every lab's secrets, for the outputs

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


@dataclass
class _Context:
    """What every submission of one grade run shares."""
    course: CourseDir                 # the instructor's course folder (gradebook, autograded, feedback)
    cfg: Path | None
    timeout: float | None
    iso: Isolation
    scratch: RunScratch               # per-submission scratch copies and kernel folders live under here
    budget: float
    answers: dict                     # lab -> AnswerTable
    release_keys: dict                # lab -> (grade_ids, sources), for "is this the wrong lab?"
    template_db: Path
    feedback_extra: object = None
    secrets: dict = field(default_factory=dict)   # lab -> leaks.LabSecrets (grader's process only)
    sources: dict = field(default_factory=dict)   # lab -> the instructor's source notebook (grader's only)
    feedback_outputs: str = "scanned"

    def __getstate__(self):
        """What a worker process gets (jobs.py): no secrets, no nbgrader API, the course by its folder."""
        st = dict(self.__dict__)
        st["course"] = (str(self.course.root), self.cfg, self.timeout)
        st["secrets"], st["sources"] = {}, {}
        return st

    def __setstate__(self, st):
        root, cfg, timeout = st["course"]
        st["course"] = CourseDir(root, cfg, timeout)
        self.__dict__.update(st)


FEEDBACK_PAGE = "the whole feedback page (a page with the score given instead)"

REVIEW_FLAGS = {"timeout", "needs_manual_grading", "several_files", "assignment_from_content", "wrong_lab",
                "kernel_died", "time_budget", "tamper", "reference_import", "processes_left_behind",
                "feedback_failed", "feedback_withheld", "memory_limit"}


def default_budget(timeout: float | None) -> float:
    """The whole notebook's time limit: 10 per-cell timeouts, at least 10 minutes."""
    return float(max(600, 10 * (timeout or DEFAULT_TIMEOUT)))


def grade(submissions: str | Path, labs_release: str | Path = "labs", solutions: str | Path = "solutions",
          out: str | Path | None = "grades", timeout: float | None = None, assignment: str | None = None,
          workdir: str | Path | None = None, config_file: str | Path | None = None, feedback: bool = True,
          echo=None, isolation: str | None = None, require_sandbox: bool = False, budget: float | None = None,
          memory_gb: float | None = DEFAULT_MEMORY_GB, sandbox_user=None, jobs: int | str = 1,
          feedback_outputs: str = "scanned", progress: str | None = None) -> GradeReport:
    """Grade every notebook under `submissions`; write the outputs to `out` (None: write nothing).

    `timeout` is the per-cell limit in seconds (default: nbgrader_config.py's, else 60); `budget` the
    whole notebook's (default: `default_budget`). `isolation` is ``bwrap``, ``user`` or ``process``
    (default: the strongest available, see `sandbox.py`); `require_sandbox` refuses to grade without
    bubblewrap (`sandbox.SandboxUnavailable`). `sandbox_user`: a user, or a list of users (one per job).
    `jobs`: submissions graded at a time, or "auto" (`jobs.py`). `feedback_outputs`: "scanned" (outputs
    without hidden-test or solution text) or "none" (no kernel output in the feedback). `echo(str)`
    receives progress lines (None: quiet); `progress` is "lines" (the default with `echo`) or "bar"
    (a tqdm bar on stderr; `echo` then gets the other lines).
    """
    say = echo or (lambda s: None)
    jobs = parse_jobs(jobs)
    if feedback_outputs not in OUTPUT_MODES:
        raise ValueError(f"feedback_outputs must be one of {', '.join(OUTPUT_MODES)}, got {feedback_outputs!r}")
    if progress not in (None, "lines", "bar"):
        raise ValueError(f"progress must be 'lines' or 'bar', got {progress!r}")
    users = [sandbox_user] if isinstance(sandbox_user, (str, int)) or sandbox_user is None else list(sandbox_user)
    iso = probe(isolation, require_sandbox, users[0] if users else None, memory_gb)
    say(iso.describe())
    labs_release, solutions = Path(labs_release), Path(solutions)
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
    out_dir = Path(out) if out is not None else None
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
        ready, answers, lab_secrets, sources = {}, {}, {}, {}
        for lab in needed:
            try:
                source_nb = read_notebook(solutions / f"{lab}.ipynb")
                generated = generate_release(course, lab, source_nb, solutions / f"{lab}.ipynb")
                answers[lab] = answer_table(source_nb)
                sources[lab] = source_nb
                lab_secrets[lab] = LabSecrets(source_nb, release_nbs[lab])
                rel_path = labs_release / f"{lab}.ipynb"
                if notebook_text(normalize_lab(generated, _lab_relpath(rel_path))) != rel_path.read_text(encoding="utf-8"):
                    notes.append(f"{rel_path} is not what {solutions / (lab + '.ipynb')} generates now (run "
                                    "`course build-labs`?); submissions are checked against the release students "
                                    "had, and graded with the tests of the source")
                ready[lab] = ""
            except (LabBuildError, OSError, ValueError) as e:
                ready[lab] = str(e)
        template_db = scratch.private / "template-gradebook.db"  # holds every hidden test: the grader's only
        if (root / "gradebook.db").exists():
            shutil.copyfile(root / "gradebook.db", template_db)
            os.chmod(template_db, 0o600)
        ctx = _Context(course, cfg, timeout, iso, scratch, budget or default_budget(course.timeout), answers,
                       all_keys, template_db, secrets=lab_secrets, sources=sources, feedback_outputs=feedback_outputs)
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
            if ready[sub.assignment]:
                r.messages.append(f"the lab could not be set up for grading: {ready[sub.assignment]}")
                r.flags.setdefault("lab_setup_failed", [])
                continue
            todo.append((k, sub, r))
        if jobs == "auto":
            n_jobs, why = auto_jobs(len(todo), iso.memory_gb)
            say(f"jobs: auto -> {n_jobs} ({why})")
        else:
            n_jobs = max(1, min(jobs, len(todo)))
        slots, who = sandbox_slots(iso, n_jobs, users[1:], explicit_process=isolation == "process")
        if who:
            say(who)
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
            _write_log(ctx, r, out_dir)
        try:
            run(grade_one_safely, ctx, todo, release_nbs, slots, finish, prog)
        finally:
            prog.close()
    finally:
        if scratch is not None:
            scratch.close()
        if tmp is not None:
            tmp.cleanup()
    scanner = Scanner.of(*(sec.scanner() for sec in lab_secrets.values())) if lab_secrets else None
    report = GradeReport(results, [(str(p), why) for p, why in coll.unattributed],
                         [(str(p), why) for p, why in coll.ignored], notes, out_dir, iso.describe(), scanner)
    if out_dir is not None:
        write_outputs(report, out_dir)
    return report


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


def _trusted_scores(graded_nb) -> dict[str, float | None]:
    """grade_id -> score, computed by the grader from the executed notebook (nbgrader's own rule),
    never read from anything the kernel could write."""
    from nbgrader.utils import determine_grade, is_grade
    out = {}
    for c in graded_nb.cells:
        if is_grade(c):
            out[c.metadata.nbgrader["grade_id"]] = determine_grade(c)[0]
    return out


def _merge(course: CourseDir, sid: str, lab: str, scores: dict) -> None:
    """Write one submission's scores into the instructor's gradebook (replacing an earlier entry)."""
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
        gb.db.commit()


def _sub_config(ctx: _Context, secret: str, spec: dict | None, conn: Path, reports: Path, lab: str):
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput,
                                        SaveAutoGrades)
    from traitlets.config import Config

    c = Config()
    c.Autograde.autograde_preprocessors = [InjectGuard, SandboxExecute, CollectGuard, IgnorePattern,
                                           ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
                                           AssignLatePenalties, CheckCellMetadata]
    c.InjectGuard.secret = secret
    c.InjectGuard.answers = dict(ctx.answers[lab].tests) if lab in ctx.answers else {}
    c.CollectGuard.secret = secret
    c.CollectGuard.report_path = str(reports / "guard.json")
    c.SandboxExecute.sandbox_spec = spec
    c.SandboxExecute.connection_file = str(conn)
    c.SandboxExecute.budget = float(ctx.budget)
    c.SandboxExecute.report_path = str(reports / "execute.json")
    return c


def grade_one_safely(ctx: _Context, sub, r: Result, release_nb) -> tuple[Result, dict | None]:
    """`_grade_one`, with any failure of the grader turned into an error result (never raises)."""
    try:
        return r, _grade_one(ctx, sub, r, release_nb)
    except Exception as e:  # never let one submission stop the others
        r.status, r.score, r.max_score = "error", None, None
        r.flags.setdefault("grader_crashed", [])
        r.messages.append(f"the grader failed on this submission: {type(e).__name__}: {e}")
        r.log = (r.log or "") + traceback.format_exc()
        return r, None


def _read_submission(path: Path):
    """The submitted notebook, read without following links; errors never quote the file's content."""
    text = read_submission(path)
    try:
        data = json.loads(text)
    except ValueError as e:
        where = f"line {getattr(e, 'lineno', '?')}, column {getattr(e, 'colno', '?')}"
        raise ValueError(f"not valid JSON ({where})") from None
    del data
    with warnings.catch_warnings():  # nbformat fixes duplicated cell ids of copied cells in memory
        warnings.simplefilter("ignore")
        try:
            nb = nbformat.reads(text, as_version=4)
        except Exception as e:  # noqa: BLE001 - nbformat's messages quote the content
            raise ValueError(f"not a notebook nbformat can read ({type(e).__name__})") from None
    if not isinstance(nb.get("cells"), list):
        raise ValueError("no list of cells")
    return nb


def _grade_one(ctx: _Context, sub, r: Result, release_nb) -> dict | None:
    """Read, check and repair, autograde in a scratch copy: what may run in a worker process (jobs.py).
    Returns what `_finish` needs (None when there is nothing to finish: `r` says why)."""
    course = ctx.course
    sid, lab = r.internal_id, r.assignment
    # 1. read (the submission is only read, never through a link)
    try:
        nb = _read_submission(sub.path)
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
    for k, v in findings.flags.items():
        r.flags[k] = v
    r.messages += findings.messages
    if lab in ctx.answers:
        refs = reference_imports(work.cells, ctx.answers[lab], release_nb.cells)
        if refs:
            r.flags["reference_import"] = sorted(refs)
            for gid, where in sorted(refs.items()):
                r.messages.append(f"{gid}: the answer imports course_lib's reference or internals "
                                  f"({'; '.join(where)})")
    # 3. autograde in a scratch copy: its own course folder and gradebook (grader only), and a kernel
    #    folder (the sandbox user's) holding only this notebook
    sc_course = ctx.scratch.private / "courses" / sid
    (ctx.scratch.private / "courses").mkdir(exist_ok=True, mode=0o700)
    if sc_course.exists():
        shutil.rmtree(sc_course)
    reports = sc_course / "reports"
    reports.mkdir(parents=True)
    ks = ctx.scratch.kernel(sid, ctx.iso)  # ctx.iso: this job's sandbox user (jobs.py)
    kwork = ks.work
    try:
        if ctx.template_db.exists():
            shutil.copyfile(ctx.template_db, sc_course / "gradebook.db")
        secret = secrets.token_hex(16)
        marker = secrets.token_hex(8)
        conn = ks.run / "kernel.json"
        cpu = int(ctx.budget * 2 + 60)
        spec = kernel_spec(ctx.iso, ks, conn, marker, cpu, ctx.scratch.lib)
        scourse = CourseDir(sc_course, ctx.cfg, ctx.timeout, _sub_config(ctx, secret, spec, conn, reports, lab))
        dest = scourse.submitted(sid, lab)
        dest.parent.mkdir(parents=True)
        nbformat.write(work, str(dest))
        shutil.copyfile(dest, kwork / f"{lab}.ipynb")  # the student's own notebook, for code that opens it
        t0 = time.time()
        res = scourse.autograde(sid, lab)
        ex = _read_json(reports / "execute.json")
        left = kill_leftovers(marker, ctx.iso.uid, ex.get("pgids", []))
        if left:
            r.flags["processes_left_behind"] = [str(len(left))]
            r.messages.append(f"{len(left)} process(es) started by the notebook were still running after it and "
                              "were killed")
        r.log = result_log(res)
        graded = scourse.autograded(sid, lab)
        jail = _read_text(ks.report)
        if jail:  # the jail could not start the kernel: its reason, not just "Kernel died"
            r.messages.append("the kernel could not start: " + jail[-500:])
        if not res.get("success") or not graded.exists():
            r.status = "error"
            r.flags.setdefault("autograde_failed", [])
            r.messages.append("nbgrader autograde failed: " + _failure_reason(r.log))
            return None
        graded_nb = read_notebook(graded)
        guard = _read_json(reports / "guard.json")
        # 4. the grader computes the scores (merged into the instructor's gradebook by `_finish`)
        scores = _trusted_scores(graded_nb)
        for gid in guard.get("missing") or []:  # a test cell that did not run as written earns nothing
            if gid in scores and scores[gid] is not None:
                scores[gid] = 0.0
        final = course.autograded(sid, lab)
        for p in (course.submitted(sid, lab), final):
            if p.parent.exists():
                shutil.rmtree(p.parent)
            p.parent.mkdir(parents=True)
        shutil.copyfile(dest, course.submitted(sid, lab))
        shutil.copyfile(graded, final)
    finally:
        shutil.rmtree(sc_course, ignore_errors=True)
        usage = ctx.scratch.release(ks)  # kills what is left, removes its folders, tmpfs and cgroups
        if usage.get("oom_kill"):  # said whatever else happened (an early return included)
            r.flags["memory_limit"] = [f"{ctx.iso.memory_gb:g}GiB"]
            peak = f", peak {usage['peak'] / 2**20:.0f} MiB" if usage.get("peak") else ""
            r.messages.append(f"the notebook reached its memory limit of {ctx.iso.memory_gb:g} GiB: "
                              f"{usage['oom_kill']} process(es) killed{peak}")
    return {"ex": ex, "guard": guard, "scores": scores, "elapsed": time.time() - t0,
            "user": "" if ctx.iso.uid is None else f"uid {ctx.iso.uid}" if ctx.iso.user == f"uid {ctx.iso.uid}"
            else f"{ctx.iso.user} (uid {ctx.iso.uid})",
            "needs_review": findings.needs_review, "repaired": findings.repaired}


def _feedback(ctx: _Context, r: Result, secrets_: LabSecrets, final: Path, release_nb, out_dir: Path | None,
              score, max_score) -> None:
    """The student's feedback page (feedback.py), written through the checked writer; what was withheld
    is flagged ``feedback_withheld`` and said in the messages."""
    sid, lab = r.internal_id, r.assignment
    submitted = read_notebook(ctx.course.submitted(sid, lab))
    scan = secrets_.scanner(submitted)
    fb_nb, withheld = feedback_notebook(read_notebook(final), submitted, release_nb, ctx.sources[lab], scan,
                                        ctx.feedback_outputs)
    html = render_html(fb_nb, lab, sid, ctx.course.db_url)
    if out_dir is not None:
        target = out_dir / "feedback" / (r.file_key or _slug(r.student)) / f"{lab}.html"
        try:
            write_checked(target, html, scan)
        except LeakBlocked as e:  # what the per-output scan missed: the page goes, a page with the score stays
            withheld[FEEDBACK_PAGE] = e.hits
            write_checked(target, withheld_page(lab, score, max_score), scan)
        r.feedback = str(target)
    if withheld:
        r.flags["feedback_withheld"] = sorted(withheld)
        for where, hits in sorted(withheld.items()):
            what = where if where in (FEEDBACK_PAGE, WIDGET_STATE) else f"the output of {where}"
            r.messages.append(f"feedback: {what} withheld: it carried text of the {describe_hits(hits)}")


def _write_log(ctx: _Context, r: Result, out_dir: Path | None) -> None:
    """nbgrader's log of one submission to logs/ (instructor's), lines with secret text withheld."""
    if not r.log or out_dir is None:
        return
    sec = ctx.secrets.get(r.assignment)
    scan = sec.scanner() if sec else None
    text = scan.scrub(r.log, "[line withheld: it carried text of the instructor's tests]")[0] if scan else r.log
    logfile = out_dir / "logs" / f"{r.file_key or _slug(r.student)}_{r.assignment}.log"
    write_checked(logfile, text, scan)
    r.log = str(logfile)


def _finish(ctx: _Context, r: Result, carry: dict | None, release_nb, out_dir: Path | None, feedback: bool) -> None:
    """The grader's own process, one submission at a time: the instructor's gradebook, flags, feedback
    and log (every file through `write_checked`)."""
    course = ctx.course
    sid, lab = r.internal_id, r.assignment
    secrets_ = ctx.secrets.get(lab)
    if carry is None:
        return
    ex, guard = carry["ex"], carry["guard"]
    _merge(course, sid, lab, carry["scores"])
    final = course.autograded(sid, lab)
    score, max_score, manual, cells = _scores(course, sid, lab)
    timeouts, errors = _execution_problems(final)
    for c in cells:
        if c["grade_id"] in errors:
            c["error"] = errors[c["grade_id"]]
    r.score, r.max_score, r.cells = score, max_score, cells
    if is_project(release_nb):  # the final project: its leaderboard entry, from the executed notebook
        r.project = project_entry(read_notebook(final), read_notebook(course.submitted(sid, lab)), cells)
    if timeouts:
        r.flags["timeout"] = timeouts
        r.messages.append(f"cells hit the time limit of {course.timeout} s: {', '.join(timeouts)}")
    if ex.get("died_at") is not None:
        r.flags["kernel_died"] = [str(ex["died_at"])]
        r.messages.append("the kernel died while running the notebook (" + (ex.get("error") or "") + "); the "
                          "points of the cells run before it are kept, the cells after it score 0")
    if ex.get("budget_at") is not None or ex.get("budget_killed"):
        r.flags["time_budget"] = [f"{ctx.budget:g}s"]
        r.messages.append(f"the notebook used up its time budget of {ctx.budget:g} s; the cells after that "
                          "were not run and score 0")
    tamper = {}
    for gid, probs in (guard.get("problems") or {}).items():
        for p in probs:
            kind, _, rest = p.partition(": ")
            if kind == "reference_import":
                r.flags.setdefault("reference_import", [])
                if gid not in r.flags["reference_import"]:
                    r.flags["reference_import"].append(gid)
                r.messages.append(f"{gid}: {rest}")
            else:
                tamper.setdefault(gid, []).append(p)
    for gid in guard.get("missing") or []:
        tamper.setdefault(gid, []).append("the test cell did not run as written (the grader's check in it "
                                          "never reported)")
    for gid in guard.get("forged") or []:
        tamper.setdefault(gid, []).append("a forged grader report was printed in this cell")
    if guard and not guard.get("setup", True):
        tamper.setdefault("setup", []).append("the grader's setup cell did not report")
    if tamper:
        r.flags["tamper"] = sorted(tamper)
        for gid, probs in sorted(tamper.items()):
            r.messages.append(f"tampering detected in {gid}: " + "; ".join(sorted(set(probs))))
    if manual:
        r.flags.setdefault("needs_manual_grading", [c["grade_id"] for c in cells if c["needs_manual_grade"]])
    r.messages.append(f"autograded in {carry['elapsed']:.1f} s"
                      + (f", kernel as {carry['user']}" if carry["user"] else ""))
    # 5. feedback, built by the grader (feedback.py): sources from the release and the student's own
    #    cells, outputs only where they carry no hidden-test or solution text
    if feedback and secrets_ is not None:
        try:
            _feedback(ctx, r, secrets_, final, release_nb, out_dir, score, max_score)
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


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


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
        for name in ("leaderboard.csv", "leaderboard.html"):   # an earlier run's project board
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).write_text("written by `course grade`; feedback/ and logs/ are replaced on each run\n")


def csv_safe(text: str) -> str:
    """A text cell a spreadsheet will not run as a formula (=, +, -, @, tab, CR first get a quote)."""
    return "'" + text if text and text[0] in "=+-@\t\r" else text


def write_outputs(report: GradeReport, out: Path, scanner: Scanner | None = None) -> None:
    """grades.csv, report.json and not_graded.txt, each scrubbed of hidden-test and solution text
    (`scanner`, default the report's) and written through `feedback.write_checked`."""
    scanner = scanner if scanner is not None else report.scanner
    out.mkdir(parents=True, exist_ok=True)
    rows = [CSV_COLUMNS] + [[csv_safe(r.student), csv_safe(r.assignment), _fmt(r.score), _fmt(r.max_score), r.status,
                             csv_safe(r.flag_text), csv_safe(r.file)] for r in report.results]
    rows, _ = scrub_value(rows, scanner)
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    write_checked(out / "grades.csv", buf.getvalue(), scanner)
    data = {"results": [asdict(r) for r in report.results],
            "not_graded": [{"file": p, "why": w} for p, w in report.not_graded],
            "ignored": [{"file": p, "why": w} for p, w in report.ignored],
            "warnings": report.warnings, "isolation": report.isolation}
    data, _ = scrub_value(data, scanner)
    write_checked(out / "report.json", json.dumps(data, indent=1, sort_keys=True) + "\n", scanner)
    lines = [f"{p}\t{w}" for p, w in report.not_graded] + [f"{p}\tskipped: {w}" for p, w in report.ignored]
    lines, _ = scrub_value(lines, scanner)
    write_checked(out / "not_graded.txt", "\n".join(lines) + ("\n" if lines else ""), scanner)
    write_leaderboard(report.results, out, scanner, csv_safe)   # the final project's, when one was graded


SUMMARY_LINES = 40


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= SUMMARY_LINES:
        return lines
    more = len(lines) - SUMMARY_LINES
    return lines[:SUMMARY_LINES] + [f"  ... and {more} more (all in not_graded.txt and report.json)"]


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
        lines.append(f"NOT GRADED ({len(report.not_graded)}: not attributed to a student and a lab, or not safe "
                     "to open):")
        lines += _capped([f"  {p}: {w}" for p, w in report.not_graded])
    if report.ignored:
        lines.append(f"skipped ({len(report.ignored)}):")
        lines += _capped([f"  {p}: {w}" for p, w in report.ignored])
    for w in report.warnings:
        lines.append(f"warning: {w}")
    if report.isolation:
        lines.append(report.isolation)
    return "\n".join(lines)
