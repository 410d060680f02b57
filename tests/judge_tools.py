"""The labs' judges run here, in the test process, on trusted notebooks (the instructor's solutions, the blank
releases and the planted mutants): the same judge code `course grade` runs, with the kernel replaced by a
namespace of this process (`judging.local_send`). Seconds per lab instead of a sandboxed kernel's start; the
real round trip (tests/test_grading.py) grades through kernels.

    namespace_of(nb)                 run a notebook's code cells but its test cells in a fresh namespace
    judge_locally(lab, answers=None) -> Verdict: the lab's release, its answer cells filled with `answers`
                                        (grade_id -> source; None: the blank release), judged
    solution_answers(lab)            the instructor's answers (solutions/labNN.ipynb)
    lab_mutants(lab)                 the judge's planted wrong answers, their misconceptions as texts
"""
from __future__ import annotations

import contextlib
import io
import itertools
import linecache
import os
import sys
import types
from functools import lru_cache
from pathlib import Path

from course_grading.build import answer_sources, fill_answers, read_notebook
from course_grading.judging import judge_parts, load_judge, local_send, release_mistakes
from course_grading.session import is_test_cell

_NAMESPACES = itertools.count()

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"tests-class-secret-0123456789abcdef0123456789"


def _transform(source: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def namespace_of(nb, grading: bool = True) -> dict:
    """A fresh namespace with every code cell of `nb` run in order except its test cells (as `course grade`
    runs a submission), under NBGRADER_EXECUTION like a graded kernel. A cell that raises is skipped (its
    error is noted in the namespace's ``__errors__``), as a kernel would go on."""
    # the namespace is a module's, registered under its own name as IPython registers its user module: a tracer
    # that finds a function's globals by its module's name (dynamo's guards, lab12's export) finds these
    module = types.ModuleType(f"__lab_namespace_{next(_NAMESPACES)}__")
    sys.modules[module.__name__] = module
    ns: dict = module.__dict__
    ns["get_ipython"] = lambda: None
    errors = []
    old = os.environ.get("NBGRADER_EXECUTION")
    if grading:
        os.environ["NBGRADER_EXECUTION"] = "autograde"
    try:
        for k, c in enumerate(nb.cells):
            if c.cell_type != "code" or is_test_cell(c):
                continue
            code, name = _transform(c.source), f"<cell {k}>"
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)   # as IPython keeps a cell's
            with contextlib.redirect_stdout(io.StringIO()):                           # source (inspect reads it)
                try:
                    exec(compile(code, name, "exec"), ns)
                except Exception as e:  # noqa: BLE001
                    errors.append((k, f"{type(e).__name__}: {e}"))
    finally:
        if old is None:
            os.environ.pop("NBGRADER_EXECUTION", None)
        else:
            os.environ["NBGRADER_EXECUTION"] = old
    ns["__errors__"] = errors
    return ns


@lru_cache(maxsize=None)
def _release(lab: str):
    return read_notebook(ROOT / "labs" / f"{lab}.ipynb")


def solution_answers(lab: str) -> dict:
    return answer_sources(read_notebook(ROOT / "solutions" / f"{lab}.ipynb"))


def parts_of(release) -> list:
    return [(c.metadata["nbgrader"]["grade_id"], float(c.metadata["nbgrader"].get("points") or 0))
            for c in release.cells if is_test_cell(c)]


def needs_own_process(lab: str) -> bool:
    """A lab whose setup cell sets TRITON_INTERPRET (lab07): Triton reads it once, when first imported, so the
    lab runs in a fresh process of its own, and leaves this one's environment as it was."""
    return any("TRITON_INTERPRET" in c.source for c in _release(lab).cells if c.cell_type == "code")


def judge_locally(lab: str, answers: dict | None = None, student: str = "student", secret: bytes = SECRET,
                  only=None):
    """The judge's verdict on the release filled with `answers` (None: the blank release); `only`: judge these
    parts alone (grade_ids). Run in a fresh process where the lab needs one (`needs_own_process`)."""
    if needs_own_process(lab) and os.environ.get("COURSE_JUDGE_CHILD") != "1":
        import pickle
        import subprocess
        import sys
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "verdict.pickle"
            code = ("import pickle, sys; sys.path.insert(0, %r); import judge_tools as j; "
                    "args = pickle.load(sys.stdin.buffer); open(%r, 'wb').write(pickle.dumps(j.judge_locally(*args)))"
                    % (str(Path(__file__).parent), str(out)))
            r = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((lab, answers, student, secret, only)),
                               capture_output=True, env={**os.environ, "COURSE_JUDGE_CHILD": "1"}, timeout=1800)
            if r.returncode or not out.exists():
                raise RuntimeError(f"judging {lab} in its own process failed:\n{r.stderr.decode()[-3000:]}")
            return pickle.loads(out.read_bytes())
    release = _release(lab)
    nb = fill_answers(release, answers) if answers is not None else release
    ns = namespace_of(nb)
    judge = load_judge(ROOT / "judges" / f"{lab}.py")
    order = [(g, p) for g, p in parts_of(release) if only is None or g in only]
    return judge_parts(judge, local_send(ns), order, secret, lab, student, release_mistakes(release))


def lab_mutants(lab: str) -> list:
    """[(what, {answer grade_id: source}, [misconception texts])] of judges/labNN.py's `mutants()`: each
    misconception key of the judge's list turned into the release's MISTAKES text."""
    judge = load_judge(ROOT / "judges" / f"{lab}.py")
    mistakes = release_mistakes(_release(lab))
    out = []
    for what, cells, keys in judge.module.mutants():
        out.append((what, cells, [mistakes[k] for k in keys]))
    return out


def solution_with(lab: str, grade_id: str, edits: dict[str, str]) -> str:
    """The instructor's answer cell `grade_id` of solutions/<lab>.ipynb (solution delimiters removed) with each
    `old -> new` edit applied, each `old` found exactly once: a mutant that is one planted mistake in the
    solution, without a second copy of the solution to keep in step with it."""
    src = solution_answers(lab)[grade_id]
    for old, new in edits.items():
        if src.count(old) != 1:
            raise ValueError(f"{lab} {grade_id}: the mutant's edit {old!r} matches {src.count(old)} times, not once")
        src = src.replace(old, new)
    return src


def grade_for_real(labs, out: Path, jobs: int = 1, isolation: str | None = None, echo=print):
    """`course grade` on each lab's solution, blank release and mutants (one folder per submission), in `out`;
    the GradeReport."""
    from course_grading.autograde import grade
    from course_grading.build import notebook_text
    sub = out / "submissions"
    for lab in labs:
        release = _release(lab)
        answers = solution_answers(lab)
        cases = [("solution", answers), ("blank", None)] + [(f"mutant{k}", {**answers, **cells})
                                                            for k, (_, cells, _) in enumerate(lab_mutants(lab))]
        for who, ans in cases:
            p = sub / who / f"{lab}.ipynb"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(notebook_text(fill_answers(release, ans) if ans is not None else release), encoding="utf-8")
    return grade(sub, labs_release=ROOT / "labs", solutions=ROOT / "solutions", out=out / "grades",
                 workdir=out / "work", secret_file=out / "secret", jobs=jobs, isolation=isolation, echo=echo)


if __name__ == "__main__":
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="grade labs' solutions, blank releases and mutants through real "
                                             "sandboxed kernels (course grade), and compare with the local judge")
    ap.add_argument("command", choices=["grade"])
    ap.add_argument("labs", nargs="+")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--isolation", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="judge-tools-") as d:
        report = grade_for_real(args.labs, Path(d), args.jobs, args.isolation)
        bad = 0
        for r in sorted(report.results, key=lambda r: (r.assignment, r.student)):
            local = None
            if r.student == "solution":
                local = judge_locally(r.assignment, solution_answers(r.assignment), student=r.student)
            pending = sum(float(m.get("points") or 0) for g, m in r.manual.items() if g in r.manual_pending)
            print(f"{r.assignment} {r.student:10s} {r.score}/{r.max_score} {r.status} {sorted(r.flags)}"
                  + (f" ({pending:g} written points wait for the instructor)" if pending else ""))
            # the solution earns every point the autograder gives: all but the written parts' (pending)
            if r.status == "error" or (r.student == "solution" and r.score != (r.max_score or 0) - pending) or \
                    (r.student == "blank" and r.score != 0):
                bad += 1
                print("   ", r.messages[-6:])
            del local
        raise SystemExit(1 if bad else 0)
