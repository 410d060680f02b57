"""The `course` command.

    course doctor                 what this machine can do; exits non-zero if the install is broken
    course build-labs             regenerate labs/ from solutions/ (instructors; the grading extra)
    course grade SUBMISSIONS      collect, check, autograde, feedback, CSV (instructors; the grading extra)
    course bench [NAME ...]       run the benchmarks in bench/ and print their tables
    course serve [--model tiny --port 8000]   OpenAI-compatible HTTP server over the course engine (Module 12)
"""
from __future__ import annotations

import sys

from course_lib import bench


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        from course_lib.doctor import main as run
    elif cmd in ("build-labs", "grade"):
        pipeline = _grading_pipeline(cmd)
        if pipeline is None:
            return 2
        run = pipeline.build_labs_main if cmd == "build-labs" else pipeline.grade_main
    elif cmd == "bench":
        run = bench.main
    elif cmd == "serve":
        from course_lib.serving.server import main as run
    else:
        print(f"course: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


def _grading_pipeline(cmd: str):
    """The instructor's pipeline (`course_grading`), or None after saying how to install it: it needs the
    grading extra (nbgrader and its Jupyter tools), which a student's install leaves out."""
    try:
        from course_grading import pipeline
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("course_grading."):
            raise  # the package is here and broken: its own traceback says more than advice would
        print(f"course {cmd}: the instructor's grading pipeline is not installed here (no module {e.name!r}).\n"
              'Install it with: pip install "course_lib[grading]"  (or, in a clone: make setup-dev)',
              file=sys.stderr)
        return None
    return pipeline


if __name__ == "__main__":
    sys.exit(main())
