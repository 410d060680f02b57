"""The `course` command.

    course doctor                 what this machine can do; exits non-zero if the install is broken
    course build-labs             regenerate labs/ from solutions/ (instructors)
    course grade SUBMISSIONS      collect, check, autograde, feedback, CSV (instructors)
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
    elif cmd == "build-labs":
        from course_lib.grading.pipeline import build_labs_main as run
    elif cmd == "grade":
        from course_lib.grading.pipeline import grade_main as run
    elif cmd == "bench":
        run = bench.main
    elif cmd == "serve":
        from course_lib.serving.server import main as run
    else:
        print(f"course: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
