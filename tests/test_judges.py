"""Every lab's judge (judges/labNN.py), run here on trusted notebooks without a kernel (tests/judge_tools.py):

* it judges exactly the release's test cells, and the library names it withholds exist where it says;
* the instructor's solution earns every point, the blank release none, each planted mistake (the judge's
  `mutants()`) some but not all, with the misconceptions it plants named in the verdict;
* cases come from the class secret and the student's key: a regrade gives the same cases and scores, another
  student or another secret other drawn cases;
* no hidden test is left in a source lab: the judges hold them.

The same judges through real sandboxed kernels: tests/test_grading.py's round trip."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from judge_tools import ROOT, _release, judge_locally, lab_mutants, parts_of, solution_answers  # noqa: E402

from course_grading.build import lab_names  # noqa: E402
from course_grading.feedback import verdict_text  # noqa: E402
from course_grading.judging import load_judge  # noqa: E402
from course_grading.sandbox import withhold  # noqa: E402

LABS = lab_names(ROOT / "solutions")
if os.environ.get("COURSE_LABS"):
    LABS = [lab for lab in LABS if lab in {x.strip() for x in os.environ["COURSE_LABS"].split(",")}]
per_lab = pytest.mark.parametrize("lab", LABS)


@per_lab
def test_no_hidden_tests_in_the_source(lab):
    src = (ROOT / "solutions" / f"{lab}.py").read_text(encoding="utf-8")
    assert "BEGIN HIDDEN TESTS" not in src, \
        f"solutions/{lab}.py still holds hidden tests: they belong in judges/{lab}.py"


@per_lab
def test_the_judge_judges_the_release(lab):
    judge = load_judge(ROOT / "judges" / f"{lab}.py")
    order = [g for g, _ in parts_of(_release(lab))]
    assert sorted(judge.parts) == sorted(order), f"judges/{lab}.py's parts {sorted(judge.parts)} != test cells {order}"
    assert set(judge.references) <= set(order), f"references for unknown parts: {set(judge.references) - set(order)}"


@per_lab
def test_withheld_names_exist_where_named(lab, tmp_path):
    judge = load_judge(ROOT / "judges" / f"{lab}.py")
    lib = tmp_path / "course_lib"
    shutil.copytree(ROOT / "course_lib", lib, ignore=shutil.ignore_patterns("__pycache__", "bundled"))
    withhold(lib, judge.withheld)          # raises for a name that is not defined where the judge says


@per_lab
def test_solution_full_blank_zero_mutants_between(lab):
    answers = solution_answers(lab)
    sol = judge_locally(lab, answers)
    for gid, part in sol.parts.items():
        assert part.error is None, f"{lab} {gid}: the judge failed on the solution: {part.error}"
        assert part.score == part.points, (f"{lab} {gid}: the solution scores {part.score}/{part.points}: "
                                           f"{[c.message for c in part.failures()][:3]}")
    blank = judge_locally(lab, None)
    for gid, part in blank.parts.items():
        assert part.error is None, f"{lab} {gid}: the judge failed on the blank lab: {part.error}"
        assert part.score == 0, \
            f"{lab} {gid}: the blank lab scores {part.score}: {[c.label for c in part.cases if c.passed][:5]}"
    mutants = lab_mutants(lab)
    assert mutants, f"judges/{lab}.py plants no mistake (mutants())"
    full = sum(p.points for p in sol.parts.values())
    for what, cells, texts in mutants:
        assert set(cells) <= set(answers), f"{lab} mutant {what!r}: unknown answer cells {set(cells) - set(answers)}"
        v = judge_locally(lab, {**answers, **cells})
        total = sum(p.score for p in v.parts.values())
        assert 0 < total < full, f"{lab} mutant {what!r} scores {total}/{full}"
        shown = " ".join(verdict_text(p) for p in v.parts.values())
        missing = [t for t in texts if t not in shown]
        assert not missing, f"{lab} mutant {what!r}: the verdict does not name {missing}"


@per_lab
def test_cases_are_the_students_and_the_secrets(lab):
    answers = solution_answers(lab)
    a1 = judge_locally(lab, answers, student="alice")
    a2 = judge_locally(lab, answers, student="alice")
    labels = lambda v: {g: [c.label for c in p.cases] for g, p in v.parts.items()}   # noqa: E731
    assert labels(a1) == labels(a2), f"{lab}: a regrade drew other cases"
    bob = judge_locally(lab, answers, student="bob")
    other = judge_locally(lab, answers, student="alice", secret=b"another class secret, 32 bytes or more")
    assert labels(bob) != labels(a1), f"{lab}: alice and bob got the same cases in every part"
    assert labels(other) != labels(a1), f"{lab}: another class secret drew the same cases"
