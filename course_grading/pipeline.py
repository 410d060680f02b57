"""The instructor pipeline: `course build-labs` and `course grade`.

    course build-labs [--solutions solutions] [--labs labs] [--check] [LAB ...]
    course grade SUBMISSIONS [--labs-release labs] [--solutions solutions] [--judges judges] [--out grades]
                 [--secret-file FILE] [--timeout 60] [--assignment labNN] [--workdir DIR]
                 [--config nbgrader_config.py] [--jobs N|auto] [--feedback-outputs shown|none]
                 [--manual scores.csv]

build-labs drives nbgrader's generate_assignment; grade runs each submission in a sandboxed kernel and
judges it in the grader's own process (`judging.py`, the labs' judges in judges/), keeping nbgrader's
gradebook for the scores and manual grading. The pieces, usable from Python:

    build_labs(solutions, labs, names=None, check=False)      -> [LabBuild]       (build.py)
    find_leaks(source_nb, lab_nb)                              -> [lines]          (build.py)
    answer_sources(source_nb), fill_answers(lab_nb, answers)   solved / mutant submissions
    collect(submissions, labs)                                 -> Collection       (collect.py)
    repair(submission_nb, release_nb)                          -> (nb, Findings)   (repair.py)
    load_judge(path), judge_parts(judge, send, ...)            -> Verdict          (judging.py)
    run_submission(nb, spec, connection_file, judge_fn, limits) -> SessionResult   (session.py)
    feedback_notebook(executed_nb, release_nb, verdict)                            (feedback.py)
    grade(submissions, labs_release, solutions, out, ...)      -> GradeReport      (autograde.py)
    read_scores(csv), check_scores(rows, graded)               manual scores of the written parts (manual.py)
"""
from __future__ import annotations

import argparse
import sys

import nbgrader  # noqa: F401 - the grading extra (its release, gradebook and feedback template): without it the
                 # cli says what to install instead of failing half-way through a grade run

from .autograde import GradeReport, Result, grade, summary, write_outputs
from .build import (LabBuild, LabBuildError, answer_sources, build_labs, build_ok, fill_answers, find_leaks,
                    lab_names, secret_and_public_lines)
from .collect import Collection, Submission, collect, parse_name, read_submission, strip_copy_decorations
from .feedback import OUTPUT_MODES, feedback_notebook
from .judging import Judge, Verdict, judge_parts, load_judge
from .manual import ManualScore, ManualScoreError, check_scores, read_scores
from .repair import Findings, repair
from .sandbox import DEFAULT_MEMORY_GB, LEVELS, Isolation, SandboxUnavailable, bwrap_argv, probe
from .session import Limits, run_submission

__all__ = ["build_labs_main", "grade_main", "build_labs", "build_ok", "find_leaks", "secret_and_public_lines",
           "answer_sources", "fill_answers", "lab_names", "LabBuild", "LabBuildError", "collect", "parse_name",
           "strip_copy_decorations", "Collection", "Submission", "repair", "Findings", "grade", "summary",
           "read_submission", "feedback_notebook", "write_outputs", "GradeReport", "Result", "Isolation",
           "SandboxUnavailable", "probe", "bwrap_argv", "Judge", "Verdict", "judge_parts", "load_judge",
           "Limits", "run_submission", "ManualScore", "ManualScoreError", "read_scores", "check_scores"]


def build_labs_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="course build-labs",
        description="Generate the students' labs (labs/labNN.ipynb) from the nbgrader source labs "
                    "(solutions/labNN.ipynb) with nbgrader generate_assignment. Deterministic: an "
                    "unchanged source gives a byte-identical lab. Solutions and hidden tests are removed "
                    "(and checked to be gone); duplicated grade_ids stop the build.")
    p.add_argument("labs_to_build", nargs="*", metavar="LAB", help="only these labs (e.g. lab01); default: all")
    p.add_argument("--solutions", default="solutions", help="folder of source labs (default: solutions)")
    p.add_argument("--labs", default="labs", help="folder of student labs (default: labs)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 and list the labs that are stale, missing or have no source")
    p.add_argument("--config", default=None, help="nbgrader_config.py to use (default: ./nbgrader_config.py, "
                   "else the one next to the solutions folder)")
    args = p.parse_args(argv)
    try:
        results = build_labs(args.solutions, args.labs, args.labs_to_build or None, check=args.check,
                             config_file=args.config)
    except FileNotFoundError as e:
        print(f"course build-labs: {e}", file=sys.stderr)
        return 2
    if not results:
        print(f"course build-labs: no solutions/lab*.ipynb in {args.solutions}/")
        return 0
    for r in results:
        line = f"{r.status:9s} {r.lab}"
        if r.message:
            line += f"\n          {r.message}"
        print(line, file=sys.stderr if r.status == "error" else sys.stdout)
    ok = build_ok(results, args.check)
    if args.check and not ok:
        bad = [r.name for r in results if r.status in ("stale", "missing", "orphan", "error")]
        print(f"labs out of sync with {args.solutions}/: {', '.join(bad)} (run `course build-labs`)",
              file=sys.stderr)
    elif not args.check:
        orphans = [r for r in results if r.status == "orphan"]
        for r in orphans:
            print(f"warning: {r.message}", file=sys.stderr)
    return 0 if ok else 1


GRADE_EPILOG = """\
accepted submission names (the assignment is the labNN token, e.g. lab01, Lab1, lab_01):
  one folder per student (folder name = student id):
    SUBMISSIONS/<student>/lab01.ipynb, .../Copy of lab01.ipynb, .../lab01 (1).ipynb,
    .../lab01 - Copy.ipynb, .../anything-with-lab01.ipynb (any depth)
  flat folder (student id in the file name):
    <student>_lab01.ipynb  <student>-lab01.ipynb  <student> - lab01.ipynb  <student> lab01.ipynb
    lab01_<student>.ipynb  lab01-<student>.ipynb  lab01 - <student>.ipynb
    <name>_<number>_<number>_lab01.ipynb, <name>_LATE_<number>_<number>_lab01.ipynb   (Canvas; student = name)
    <name>_<number>_assignsubmission_file_lab01.ipynb                                (Moodle; student = name)
  copy decorations are ignored anywhere: "Copy of ...", " (1)", "(2)", " - Copy", " - Copy (2)",
  " copy", " copy 2", Canvas's "-1" after the lab token, a doubled ".ipynb".
  With --assignment, notebooks without a lab token count as that lab (a flat file's whole name is then
  the student id). Without it, a token-less notebook in a student folder is recognized by content.
  Files that cannot be attributed are listed as NOT GRADED, every other entry that is skipped as
  skipped, each with the reason (never dropped silently). Links are never followed: a symbolic link
  (file or folder, at any depth) is NOT GRADED and never opened; so is a notebook in a hidden folder
  (name starting with "."). Checkpoint folders, __MACOSX and macOS' ._* files are listed as skipped.
  Several files of one student for one lab: the newest is graded, the submission flagged for review.

isolation (printed first; see README "For instructors"): bwrap (bubblewrap: a private filesystem, read-only
  system and Python, own /proc /tmp /dev/shm, no network; as root, each submission as a fresh user id) or
  user (grader is root, no bubblewrap: the same private filesystem built by the grader, each submission as a
  fresh user id). Both are refused with the reason when a real kernel cannot start at that level. process
  (the grader's own user, resource limits only: trusted notebooks) is used only when asked for with
  --isolation process. Every level: one scratch copy per submission, no network where the system allows
  it, limits on memory, processes, CPU and file size, an empty session keyring of its own and no key system
  call (keyctl, add_key, request_key), every process of the kernel killed at the end; as root, one cgroup
  and one tmpfs per submission where the machine allows (the memory limit then holds for all its processes
  and files together). --require-sandbox refuses to grade without bubblewrap.

outputs (in --out): feedback/<student>/<lab>.html for each student; for you only: grades.csv (student,
  assignment, score, max_score, status, flags, file, auto_score, manual_score, manual_pending, then one
  column per written part), manual_todo.csv (the written parts waiting for your score), manual_scores.csv
  (every manual score entered, kept for the next run), report.json (per-part scores and cases, repairs,
  messages), logs/, not_graded.txt (feedback and logs are named by a file-safe student id, with a short hash
  added where two ids collide; CSV cells starting with = + - @ get a leading ' so a spreadsheet does not run
  them); for the final project (lab13): leaderboard.csv and leaderboard.html
judging: each submission's cells run in its sandboxed kernel (not the lab's test cells); then the lab's judge
  (judges/labNN.py, yours) calls the student's functions on hidden inputs drawn from the class secret
  (--secret-file, made on first use: keep it; a regrade with it draws the same inputs) and the student's key,
  and compares what comes back, as plain data, with the course's reference in the grader's own process. No
  hidden test, expected value or reference ever enters the kernel; no output of the kernel is a score.
feedback: built by the grader from the release, the student's own cells (their markdown shown as text), the
  judge's verdict under each test cell (score, cases passed, the first failing cases, misconceptions) and
  the kernel's text outputs; --feedback-outputs none shows no kernel output at all.
jobs: --jobs N grades N submissions at a time, each in its own sandbox and scratch and, where the grader
  is root, as a fresh user id of its own (bubblewrap without root: each in its own namespaces); the grades and
  files are those of --jobs 1. --jobs auto: one per two cores, within memory. Default 1 (time limits are
  wall-clock: a busy machine could push a slow submission over them).
written parts (manually graded answer cells, rubric in the judge's WRITTEN): left for you, never judged;
  score = the autograded points + the validated manual scores, max_score = all points, manual_pending names
  the written parts not scored yet (empty: the score is final). --manual FILE merges your scores: a CSV
  with columns student, lab, grade_id, score and optionally comment (shown to the student) and validated
  (yes/no: a score not validated is a draft, neither counted nor shown); manual_todo.csv is such a file,
  to fill in. A row naming no graded student, lab or written part, or a score outside 0..points or not a
  number, stops the run before grading (exit 2), each such row named (rows of a lab --assignment leaves
  out wait for the run that grades it). Scores entered are kept in
  --out's manual_scores.csv: a regrade into the same folder keeps them (a later row replaces an earlier).
status: ok | repaired (safe automatic repair, see flags) | review (a human should look: also wrong_lab,
  kernel_died, time_budget, memory_limit, output_limit, reference_import, judge_failed) |
  error (not graded: unreadable, too_large, kernel_failed; score left empty, never 0)
exit status: 0 all graded, 1 some file not graded or some submission in error, 2 usage error
"""


def grade_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="course grade",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Collect, check, run in a sandbox, judge, give feedback and export the grades of a folder "
                    "of submitted lab notebooks, as students download them from Colab or Jupyter. The "
                    "submissions are only read, never modified.",
        epilog=GRADE_EPILOG)
    p.add_argument("submissions", metavar="SUBMISSIONS", help="folder of submissions (or one notebook)")
    p.add_argument("--labs-release", default="labs", help="folder of the released labs students got (default: labs)")
    p.add_argument("--solutions", default="solutions", help="folder of the source labs (default: solutions)")
    p.add_argument("--judges", default=None, help="folder of the labs' judges, labNN.py (default: judges/ beside "
                   "the solutions folder)")
    p.add_argument("--secret-file", default=None, metavar="FILE",
                   help="the class secret the hidden cases are drawn from (default: .grading/class-secret beside "
                        "the solutions folder; made on first use: keep it, and keep it from students)")
    p.add_argument("--out", default="grades", help="output folder (default: grades)")
    p.add_argument("--timeout", type=float, default=None,
                   help="time limit of each cell and of each call of the judge, in seconds (default: "
                        "nbgrader_config.py's, else 60)")
    p.add_argument("--assignment", default=None, metavar="labNN", help="grade only this lab")
    p.add_argument("--workdir", default=None,
                   help="keep nbgrader's course folder (gradebook.db, autograded notebooks) here "
                        "(default: a temporary folder, deleted)")
    p.add_argument("--config", default=None, help="nbgrader_config.py to use")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="time limit for a whole notebook, its cells and the judge's calls together, on top of "
                        "the per-cell one (default: 10 per-cell timeouts, at least 600 s); what comes after it "
                        "scores 0 and the submission is flagged")
    p.add_argument("--isolation", choices=LEVELS, default=None,
                   help="how to run students' code (default: bwrap where bubblewrap is installed, else user as "
                        "root): bwrap = bubblewrap sandbox; user = an unprivileged user in a private filesystem "
                        "(grader runs as root); process = the grader's own user with resource limits only "
                        "(trusted notebooks; never chosen unless asked)")
    p.add_argument("--require-sandbox", action="store_true",
                   help="refuse to grade unless bubblewrap (bwrap) is installed and used")
    p.add_argument("--sandbox-user", default=None, metavar="USER[,USER...]",
                   help="the unprivileged user kernels run as when the grader is root (default: a fresh user id "
                        "with no account for each submission); with --jobs N, one user per job")
    p.add_argument("--jobs", default="1", metavar="N|auto",
                   help="submissions graded at a time, each in its own sandbox (default: 1; auto: one per two "
                        "cores, within memory)")
    p.add_argument("--feedback-outputs", choices=OUTPUT_MODES, default="shown",
                   help="shown (default): the kernel's text outputs of the student's cells; none: no output of "
                        "the kernel in the feedback")
    p.add_argument("--memory-limit", type=float, default=DEFAULT_MEMORY_GB, metavar="GiB",
                   help=f"memory limit of a submission (default: {DEFAULT_MEMORY_GB:g}; 0: none): for all its "
                        "processes and files together where a cgroup can be made (root), else per process")
    p.add_argument("--manual", default=None, metavar="CSV",
                   help="the scores you gave the written parts (columns student, lab, grade_id, score, comment, "
                        "validated; manual_todo.csv of an earlier run is one to fill in), merged into grades.csv "
                        "and the feedback; kept in --out for later runs")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    users = [u.strip() for u in args.sandbox_user.split(",") if u.strip()] if args.sandbox_user else None
    bar = not args.quiet and sys.stderr.isatty()  # a progress bar on a terminal, plain lines elsewhere
    try:
        report = grade(args.submissions, args.labs_release, args.solutions, args.out, args.timeout,
                       args.assignment, args.workdir, args.config, feedback=not args.no_feedback,
                       echo=None if args.quiet else (lambda s: print(s, flush=True)), isolation=args.isolation,
                       require_sandbox=args.require_sandbox, budget=args.budget, memory_gb=args.memory_limit,
                       sandbox_user=users, jobs=args.jobs, feedback_outputs=args.feedback_outputs,
                       progress="bar" if bar else None, judges=args.judges, secret_file=args.secret_file,
                       manual=args.manual)
    except (FileNotFoundError, FileExistsError, ValueError, SandboxUnavailable) as e:
        print(f"course grade: {e}", file=sys.stderr)
        return 2
    print(summary(report))
    board = " and the project's leaderboard.csv/.html" if any(r.project for r in report.results) else ""
    print(f"\nwrote {report.out}/: feedback/<student>/ for each student; grades.csv, manual_todo.csv, "
          f"manual_scores.csv, report.json, logs/, not_graded.txt{board} for you")
    return 0 if report.ok else 1
