"""The instructor pipeline: `course build-labs` and `course grade`, and the labs' grading round trip.

Three parts:
1. fast checks with no kernels: file-name parsing, collection, submission repair, build-labs on the
   fixture lab tests/data/solutions/lab99.ipynb (three quick exercises; its judge tests/data/judges/lab99.py);
2. (slow) one `grade` run over a folder holding every odd case at once (messy names in both layouts,
   lost metadata, unmatchable damage, an infinite loop, a syntax error, deleted cells, edited tests, a
   50 MB output, invalid JSON, ...), then assertions on its report, CSV and feedback;
3. for every real lab solutions/lab*.ipynb: labs/ in sync, nothing secret in labs/, unique grade_ids, and
   (slow) the round trip through real sandboxed kernels, two submissions at a time: solution = full marks,
   blank = 0, each planted wrong answer of the lab's judge (`mutants()`) strictly in between, its
   misconceptions named on its feedback page.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import html
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

from course_grading.build import (answer_sources, build_labs, duplicate_grade_ids, fill_answers, find_leaks,
                                      grade_id, is_answer, lab_names, notebook_text, read_notebook)
from course_grading.collect import collect, parse_name, strip_copy_decorations
from course_grading.pipeline import build_labs_main, grade, grade_main
from course_grading.repair import repair

sys.path.insert(0, str(Path(__file__).parent))
from judge_tools import lab_mutants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
FIX_SOLUTIONS = DATA / "solutions"
FIX_JUDGES = DATA / "judges"
FIX = "lab99"
REAL_LABS = lab_names(ROOT / "solutions")
# COURSE_LABS=lab03,lab07 limits the real-lab tests to those labs (a quick round trip while writing one);
# unset, every lab in solutions/ is checked.
if os.environ.get("COURSE_LABS"):
    _wanted = {x.strip() for x in os.environ["COURSE_LABS"].split(",") if x.strip()}
    _unknown = _wanted - set(REAL_LABS)
    if _unknown:
        raise ValueError(f"COURSE_LABS names labs with no solutions/<lab>.ipynb: {sorted(_unknown)}")
    REAL_LABS = [lab for lab in REAL_LABS if lab in _wanted]
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
# The fixture lab's points: add 2, multiply 1 + 1 (hidden), clamp 1.
FULL = 5.0


# ---------------------------------------------------------------------------------------------------
# helpers

def strip_nbgrader(nb):
    """What Colab / a copy-paste does: every cell loses its nbgrader metadata."""
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        for k in ("nbgrader", "deletable", "editable"):
            c.metadata.pop(k, None)
    return nb


def index_of(nb, gid: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if grade_id(c) == gid)


def write_nb(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return path


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def html_text(path: Path) -> str:
    """The visible text of an HTML page (tags removed, entities decoded), so a source line is found
    even when syntax highlighting splits it into spans."""
    return html.unescape(re.sub(r"<[^>]+>", "", Path(path).read_text(encoding="utf-8")))


# ---------------------------------------------------------------------------------------------------
# 1. fast: names, collection, repair, build

RELEASED = {1: "lab01", 2: "lab02"}


@pytest.mark.parametrize("name, student, lab", [
    ("alice_lab01.ipynb", "alice", "lab01"),
    ("alice-lab01.ipynb", "alice", "lab01"),
    ("Alice Smith - lab01.ipynb", "Alice Smith", "lab01"),
    ("Alice Smith lab01.ipynb", "Alice Smith", "lab01"),
    ("lab01_alice.ipynb", "alice", "lab01"),
    ("lab01 - alice.ipynb", "alice", "lab01"),
    ("s1234567_lab02.ipynb", "s1234567", "lab02"),
    ("smithalice_12345_67890_lab01.ipynb", "smithalice (12345)", "lab01"),       # an LMS's user id stays
    ("smithalice_LATE_12345_67890_lab01-1.ipynb", "smithalice (12345)", "lab01"),
    ("smithalice_12345_67890_Copy of lab01 (2).ipynb", "smithalice (12345)", "lab01"),
    ("Alice Smith_12345_assignsubmission_file_lab01.ipynb", "Alice Smith (12345)", "lab01"),
    ("alice_Lab1 (2).ipynb", "alice", "lab01"),
    ("alice_LAB_02.ipynb", "alice", "lab02"),
    ("alice_lab01 - Copy.ipynb", "alice", "lab01"),
    ("alice_lab01 - Copy (3).ipynb", "alice", "lab01"),
    ("alice_lab01 copy 2.ipynb", "alice", "lab01"),
    ("alice_lab01.ipynb.ipynb", "alice", "lab01"),
    ("alice_Copy of lab01.ipynb", "alice", "lab01"),
    ("Copy of lab01.ipynb", None, "lab01"),
    ("lab01 (1).ipynb", None, "lab01"),
    ("alice_lab07.ipynb", None, None),
    ("alice.ipynb", None, None),
    ("alice_lab01_lab02.ipynb", None, None),
    ("collab01.ipynb", None, None),
])
def test_parse_flat_names(name, student, lab):
    got_student, got_lab, why = parse_name(name, RELEASED)
    assert (got_student, got_lab) == (student, lab), why
    if student is None:
        assert why, "a file that cannot be attributed must say why"


@pytest.mark.parametrize("name", ["lab01.ipynb", "Copy of lab01.ipynb", "lab01 (1).ipynb", "lab01(2).ipynb",
                                  "lab01 - Copy.ipynb", "Copy of Copy of lab01 (3).ipynb", "lab01 copy 2.ipynb",
                                  "LAB_01.ipynb", "Lab 1.ipynb", "lab01.ipynb.ipynb", "my lab01 answers.ipynb"])
def test_parse_folder_names(name):
    assert parse_name(name, RELEASED, flat=False)[1] == "lab01"


def test_parse_with_assignment_and_copy_decorations():
    assert parse_name("alice.ipynb", RELEASED, assignment="lab01") == ("alice", "lab01", "")
    assert parse_name("Copy of alice (1).ipynb", RELEASED, assignment="lab02")[:2] == ("alice", "lab02")
    assert strip_copy_decorations("Copy of Copy of lab01 - Copy (2)") == "lab01"


def test_collect_layouts_and_reports(tmp_path):
    sub = tmp_path / "subs"
    for rel in ["alice/Copy of lab01.ipynb", "alice/notes.txt", "alice/.ipynb_checkpoints/lab01-checkpoint.ipynb",
                "bob/deeper/lab02 (1).ipynb", "Carol Jones_555_assignsubmission_file_/lab01.ipynb",
                "dave_lab01.ipynb", "lab02_erin.ipynb", "Copy of lab01.ipynb", "frank_lab09.ipynb",
                "readme.md", "gina/lab01.ipynb", "gina/lab01 (1).ipynb"]:
        p = sub / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    os.utime(sub / "gina/lab01.ipynb", (1_000_000, 1_000_000))
    os.utime(sub / "gina/lab01 (1).ipynb", (2_000_000, 2_000_000))
    coll = collect(sub, RELEASED)
    got = {(s.student, s.assignment, s.layout) for s in coll.submissions}
    assert got == {("alice", "lab01", "folder"), ("bob", "lab02", "folder"), ("Carol Jones (555)", "lab01", "folder"),
                   ("dave", "lab01", "flat"), ("erin", "lab02", "flat"), ("gina", "lab01", "folder")}
    gina = next(s for s in coll.submissions if s.student == "gina")
    assert gina.path.name == "lab01 (1).ipynb" and "several_files" in gina.flags
    assert [p.name for p in gina.superseded] == ["lab01.ipynb"]
    not_graded = {p.name for p, _ in coll.unattributed}
    assert not_graded == {"Copy of lab01.ipynb", "frank_lab09.ipynb"}
    # nothing is dropped silently: the checkpoint folder is listed (once, not looked into) with its reason
    assert {p.name: why for p, why in coll.ignored}.keys() == {"notes.txt", "readme.md", ".ipynb_checkpoints"}
    assert "checkpoints" in dict((p.name, w) for p, w in coll.ignored)[".ipynb_checkpoints"]
    only2 = collect(sub, RELEASED, assignment="lab02")
    assert {s.student for s in only2.submissions} == {"bob", "erin"}
    assert any("lab01, not lab02" in why for _, why in only2.ignored)


@pytest.fixture(scope="module")
def fixture_lab(tmp_path_factory):
    """The fixture lab built once: (source notebook, student lab notebook, labs folder)."""
    labs = tmp_path_factory.mktemp("fixture") / "labs"
    results = build_labs(FIX_SOLUTIONS, labs)
    assert [(r.name, r.status) for r in results] == [(FIX, "written")], [r.message for r in results]
    return read_notebook(FIX_SOLUTIONS / f"{FIX}.ipynb"), read_notebook(labs / f"{FIX}.ipynb"), labs


def solved(fixture_lab, **overrides):
    source, lab, _ = fixture_lab
    return fill_answers(lab, {**answer_sources(source), **overrides})


def test_build_removes_solutions_and_hidden_tests(fixture_lab):
    source, lab, labs = fixture_lab
    text = (labs / f"{FIX}.ipynb").read_text()
    for m in MARKERS:
        assert m not in text
    for line in ("return a + b", "return max(lo, min(x, hi))"):
        assert line in json.dumps(source.dict()) and line not in text
    assert find_leaks(source, lab) == []
    assert "raise NotImplementedError()" in text
    assert "solutions/lab99.ipynb" not in lab.cells[0].source  # the badge points at the lab, not the solution
    assert "/lab99.ipynb" in lab.cells[0].source
    assert lab.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") for c in lab.cells if c.cell_type == "code")


def test_find_leaks_catches_a_leak(fixture_lab):
    source, lab, _ = fixture_lab
    leaky = copy.deepcopy(lab)
    leaky.cells[index_of(leaky, "multiply_hidden")].source += "\n    return a * b"
    leaky.cells[index_of(leaky, "clamp_answer")].source = "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))"
    assert find_leaks(source, leaky) == ["return a * b", "return max(lo, min(x, hi))"]


def test_build_is_deterministic_and_check_detects_stale(tmp_path, fixture_lab, capsys):
    _, _, labs = fixture_lab
    again = tmp_path / "labs"
    assert build_labs_main(["--solutions", str(FIX_SOLUTIONS), "--labs", str(again)]) == 0
    assert (again / f"{FIX}.ipynb").read_bytes() == (labs / f"{FIX}.ipynb").read_bytes()
    assert build_labs_main(["--solutions", str(FIX_SOLUTIONS), "--labs", str(again), "--check"]) == 0
    # a hand edit, an orphan lab: --check fails and names them, and writes nothing
    p = again / f"{FIX}.ipynb"
    p.write_text(p.read_text().replace("Exercise 1", "Exercise one"))
    stale = p.read_bytes()
    (again / "lab98.ipynb").write_text("{}")
    capsys.readouterr()
    assert build_labs_main(["--solutions", str(FIX_SOLUTIONS), "--labs", str(again), "--check"]) == 1
    out = capsys.readouterr()
    assert "stale" in out.out and "lab99" in out.err and "lab98" in out.err
    assert p.read_bytes() == stale


def test_build_rejects_duplicate_grade_ids(tmp_path, capsys):
    source = read_notebook(FIX_SOLUTIONS / f"{FIX}.ipynb")
    i = index_of(source, "clamp_tests")
    source.cells[i].metadata.nbgrader["grade_id"] = "add_tests"
    sols = tmp_path / "solutions"
    write_nb(sols / "lab07.ipynb", source)
    assert duplicate_grade_ids(source) == {"add_tests": [index_of(source, "add_tests"), i]}
    assert build_labs_main(["--solutions", str(sols), "--labs", str(tmp_path / "labs")]) == 1
    err = capsys.readouterr().err
    assert "duplicated grade_id" in err and "'add_tests'" in err
    assert not (tmp_path / "labs" / "lab07.ipynb").exists()


def test_repair_restores_lost_metadata(fixture_lab):
    _, lab, _ = fixture_lab
    damaged = strip_nbgrader(solved(fixture_lab))
    work, f = repair(damaged, lab)
    assert set(f.flags) == {"metadata_restored"} and not f.needs_review and f.repaired
    assert sorted(f.flags["metadata_restored"]) == sorted(grade_id(c) for c in lab.cells if grade_id(c))
    assert [grade_id(c) for c in work.cells] == [grade_id(c) for c in lab.cells]
    assert work.cells[index_of(work, "add_answer")].source == answer_sources(read_notebook(
        FIX_SOLUTIONS / f"{FIX}.ipynb"))["add_answer"]


def test_repair_with_student_cells_and_lost_metadata(fixture_lab):
    """Metadata lost and a scratch cell added after an answer: the answer is still found (by
    similarity, so flagged for review), and the tests are all there."""
    _, lab, _ = fixture_lab
    nb = strip_nbgrader(solved(fixture_lab))
    i = index_of(solved(fixture_lab), "multiply_answer")
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell("print(multiply(2, 2))"))
    work, f = repair(nb, lab)
    assert f.flags["matched_by_similarity"] == ["multiply_answer"] and f.needs_review
    assert "def multiply" in work.cells[index_of(work, "multiply_answer")].source
    assert sorted(grade_id(c) for c in work.cells if grade_id(c)) == \
        sorted(grade_id(c) for c in lab.cells if grade_id(c))


def test_repair_unmatchable_is_flagged(fixture_lab):
    """All metadata lost, everything merged into one cell, tests deleted: nothing can be matched with
    confidence; the tests are put back after the student's code and the submission needs review."""
    source, lab, _ = fixture_lab
    code = "\n\n".join(answer_sources(source).values())
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import random\n" + code)])
    work, f = repair(nb, lab)
    assert f.needs_review and "cells_unmatched" in f.flags
    tests = [i for i, c in enumerate(work.cells) if grade_id(c) and grade_id(c).endswith(("tests", "hidden"))]
    assert tests and min(tests) > 0  # after the student's code


def test_repair_duplicates_edits_deletions_types(fixture_lab):
    _, lab, _ = fixture_lab
    nb = solved(fixture_lab)
    i = index_of(nb, "add_tests")
    nb.cells[i].source = "assert True  # I fixed the test"
    dup = copy.deepcopy(nb.cells[index_of(nb, "multiply_answer")])
    dup.source = "print('trying things')"
    nb.cells.insert(index_of(nb, "multiply_answer") + 1, dup)
    del nb.cells[index_of(nb, "clamp_tests")]
    nb.cells[index_of(nb, "multiply_hidden")].metadata.nbgrader["grade_id"] = "my_id"
    j = index_of(nb, "clamp_answer")
    nb.cells[j] = nbformat.v4.new_markdown_cell(nb.cells[j].source, metadata=nb.cells[j].metadata)
    work, f = repair(nb, lab)
    assert f.flags == {"locked_cells_restored": ["add_tests"],
                       "duplicate_grade_ids": ["multiply_answer"],
                       "unknown_grade_ids": ["my_id"],
                       "metadata_restored": ["multiply_hidden"],  # its grade_id was removed, then matched by source
                       "cells_restored": ["clamp_tests"],
                       "cell_type_restored": ["clamp_answer"]}
    assert not f.needs_review
    assert work.cells[index_of(work, "add_tests")].source == lab.cells[index_of(lab, "add_tests")].source
    assert work.cells[index_of(work, "clamp_answer")].cell_type == "code"
    assert index_of(work, "clamp_tests") == index_of(work, "clamp_answer") + 1
    assert duplicate_grade_ids(work) == {}


# ---------------------------------------------------------------------------------------------------
# 2. slow: one grade run over every odd case

LOOP = "def multiply(a, b):\n    return a * b\n\nwhile True:  # never ends\n    pass"


@pytest.fixture(scope="module")
def graded(fixture_lab, tmp_path_factory):
    source, lab, labs = fixture_lab
    base = tmp_path_factory.mktemp("grading")
    sub = base / "submissions"
    good = solved(fixture_lab)
    # one folder per student
    write_nb(sub / "alice" / "Copy of lab99.ipynb", good)
    write_nb(sub / "bob" / "lab99 (1).ipynb", lab)                                  # blank
    write_nb(sub / "carol" / "lab99 - Copy.ipynb", strip_nbgrader(good))           # Colab lost metadata
    write_nb(sub / "dave" / "lab99.ipynb", solved(fixture_lab, multiply_answer=LOOP))
    old = write_nb(sub / "erin" / "lab99.ipynb", lab)
    new = write_nb(sub / "erin" / "lab99 (1).ipynb", good)
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(new, (2_000_000, 2_000_000))
    # flat, student id in the name
    write_nb(sub / "Frank Smith - lab99.ipynb", solved(fixture_lab, add_answer="def add(a, b)\n    return a + b"))
    deleted = copy.deepcopy(good)
    del deleted.cells[index_of(deleted, "multiply_hidden")]
    del deleted.cells[index_of(deleted, "clamp_tests")]
    write_nb(sub / "grace_lab99.ipynb", deleted)
    cheat = solved(fixture_lab, add_answer="def add(a, b):\n    return a - b")
    cheat.cells[index_of(cheat, "add_tests")].source = "assert True"
    write_nb(sub / "lab99_heidi.ipynb", cheat)
    big = copy.deepcopy(good)
    big.cells[index_of(big, "add_answer")].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="x" * 50_000_000)]
    write_nb(sub / "smithivan_12345_67890_lab99.ipynb", big)
    dup = copy.deepcopy(good)
    copy_cell = copy.deepcopy(dup.cells[index_of(dup, "multiply_answer")])
    copy_cell["id"] = "pasted-copy"  # Jupyter gives a pasted cell a new id, and keeps its metadata
    dup.cells.insert(index_of(dup, "multiply_answer") + 1, copy_cell)
    write_nb(sub / "judy_LATE_111_222_Copy of lab99 (2).ipynb", dup)
    (sub / "mallory_lab99.ipynb").write_text(notebook_text(good)[:2000])          # invalid JSON
    merged = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import random\n\n" + "\n\n".join(answer_sources(source).values()))])
    write_nb(sub / "oscar_lab99.ipynb", merged)                                      # unmatchable
    write_nb(sub / "peggy_lab99.ipynb", solved(fixture_lab, multiply_answer="def multiply(a, b):\n    return a + b"))
    retyped = copy.deepcopy(good)
    k = index_of(retyped, "multiply_answer")
    retyped.cells[k] = nbformat.v4.new_markdown_cell(retyped.cells[k].source, metadata=retyped.cells[k].metadata)
    write_nb(sub / "rupert_lab99.ipynb", retyped)
    write_nb(sub / "victor_lab99.ipynb", solved(fixture_lab, add_answer="import os\nos._exit(1)"))  # kills the kernel
    # not attributable / not notebooks
    write_nb(sub / "Copy of lab99.ipynb", good)
    write_nb(sub / "trent_lab42.ipynb", good)
    (sub / "notes.txt").write_text("not a notebook")

    before = tree_hashes(sub)
    out = base / "grades"
    report = grade(sub, labs_release=labs, solutions=FIX_SOLUTIONS, out=out, timeout=15,
                   secret_file=base / "class-secret")
    return report, sub, before, out, source


slow = pytest.mark.slow


def r(graded, student):
    return graded[0].by_student(student, FIX)


@slow
def test_submissions_are_never_modified(graded):
    report, sub, before, out, _ = graded
    assert tree_hashes(sub) == before


@slow
@pytest.mark.parametrize("student, score, status, flags", [
    ("alice", FULL, "ok", set()),
    ("bob", 0.0, "ok", set()),
    ("carol", FULL, "repaired", {"metadata_restored"}),
    ("dave", FULL, "review", {"timeout"}),
    ("erin", FULL, "review", {"several_files"}),
    ("Frank Smith", 3.0, "ok", set()),
    ("grace", FULL, "repaired", {"cells_restored"}),
    ("heidi", 3.0, "repaired", {"locked_cells_restored"}),
    ("smithivan (12345)", FULL, "ok", {"large_outputs_removed"}),
    ("judy (111)", FULL, "repaired", {"duplicate_grade_ids", "late"}),
    ("peggy", 3.0, "ok", set()),
    ("rupert", FULL, "repaired", {"cell_type_restored"}),
])
def test_grade_cases(graded, student, score, status, flags):
    res = r(graded, student)
    assert (res.score, res.max_score, res.status) == (score, FULL, status), (res.flags, res.messages)
    assert set(res.flags) == flags, res.messages


@slow
def test_edited_visible_test_is_restored(graded):
    heidi = r(graded, "heidi")
    assert heidi.flags["locked_cells_restored"] == ["add_tests"]
    assert {c["grade_id"]: c["score"] for c in heidi.cells}["add_tests"] == 0


@slow
def test_timeout_does_not_stop_the_others(graded):
    dave = r(graded, "dave")
    assert dave.flags["timeout"] == ["multiply_answer"]
    later = [x for x in graded[0].results if x.student > "dave" and x.status != "error"]
    assert later and all(x.score is not None for x in later)


@slow
def test_unmatchable_damage_is_flagged_not_zeroed(graded):
    oscar = r(graded, "oscar")
    assert oscar.status == "review" and "cells_unmatched" in oscar.flags
    assert oscar.score == FULL  # the tests were put back after the student's code


@slow
def test_invalid_notebook_is_an_error_without_a_score(graded):
    mallory = r(graded, "mallory")
    assert mallory.status == "error" and mallory.score is None and "unreadable" in mallory.flags


@slow
def test_dead_kernel_costs_only_what_it_killed_and_others_go_on(graded):
    """os._exit in the first answer: a new kernel replays the cells before it and runs the ones after it, so
    only that answer is lost (add: 0 of 2); the submission is flagged for review."""
    victor = r(graded, "victor")
    assert victor.status == "review" and victor.score == 3.0 and "kernel_died" in victor.flags, victor.messages
    assert victor.flags["kernel_died"] == ["add_answer"], victor.flags
    assert any("kernel died" in m for m in victor.messages), victor.messages
    assert {c["grade_id"]: c["score"] for c in victor.cells}["add_tests"] == 0
    assert r(graded, "smithivan (12345)").score == FULL  # graded just before him
    assert sum(x.status == "error" for x in graded[0].results) == 1  # mallory only


@slow
def test_unattributed_files_are_reported(graded):
    report, sub, *_ = graded
    assert {Path(p).name for p, _ in report.not_graded} == {"Copy of lab99.ipynb", "trent_lab42.ipynb"}
    assert {Path(p).name for p, _ in report.ignored} == {"notes.txt"}
    assert "Copy of lab99.ipynb" in (graded[3] / "not_graded.txt").read_text()


@slow
def test_csv_and_report(graded):
    report, sub, before, out, _ = graded
    rows = list(csv.DictReader(open(out / "grades.csv", encoding="utf-8")))
    assert list(rows[0]) == ["student", "assignment", "score", "max_score", "status", "flags", "file",
                             "auto_score", "manual_score", "manual_pending"]   # the fixture lab has no written part
    by = {row["student"]: row for row in rows}
    assert len(rows) == len(report.results) == 15
    assert by["alice"]["score"] == "5" and by["alice"]["max_score"] == "5" and by["alice"]["status"] == "ok"
    assert by["mallory"]["score"] == "" and by["mallory"]["status"] == "error"
    assert "metadata_restored(" in by["carol"]["flags"]
    data = json.loads((out / "report.json").read_text())
    assert {x["student"] for x in data["results"]} == set(by)


@slow
def test_feedback_shows_the_verdicts_and_no_judge_code(graded):
    report, sub, before, out, source = graded
    judge_lines = {ln.strip() for ln in (FIX_JUDGES / f"{FIX}.py").read_text().splitlines()
                   if len(ln.strip()) > 12 and not ln.strip().startswith(("#", '"', "def ", "@"))}
    # the search works: a visible test line is found in the page despite the syntax highlighting
    assert 'assert add(2, 3) == 5, f"add(2, 3): expected 5, got {add(2, 3)!r}"' in html_text(r(graded, "bob").feedback)
    for res in report.results:
        if res.status == "error":
            assert res.feedback is None
            continue
        text = html_text(res.feedback)
        assert "Grader:" in text, f"{res.student}'s feedback has no verdict"
        shown = sorted(line for line in judge_lines if line in text)
        assert not shown, f"{res.student}'s feedback shows the judge's code: {shown}"
    # a failing case says its input, what was expected and what came
    peggy = html_text(r(graded, "peggy").feedback)
    assert "multiply(3, 4): expected 12, got 7" in peggy and "of 22 cases passed" in peggy, peggy[-2000:]
    assert Path(r(graded, "alice").feedback).stat().st_size < 2_000_000
    assert Path(r(graded, "smithivan (12345)").feedback).stat().st_size < 2_000_000


@slow
def test_grade_cli(tmp_path, fixture_lab, capsys):
    """The command line: exit 1 when something could not be graded; the summary and files are written.
    (No kernel starts here: the only attributable notebook is invalid JSON.)"""
    _, _, labs = fixture_lab
    sub = tmp_path / "subs"
    sub.mkdir()
    (sub / "zed_lab99.ipynb").write_text("{not json")
    (sub / "Copy of lab99.ipynb").write_text("{}")
    out = tmp_path / "out"
    rc = grade_main([str(sub), "--labs-release", str(labs), "--solutions", str(FIX_SOLUTIONS), "--out", str(out),
                     "--timeout", "5", "--secret-file", str(tmp_path / "secret"), "-q"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "zed" in text and "error" in text and "NOT GRADED" in text and "Copy of lab99.ipynb" in text
    assert (out / "grades.csv").exists() and (out / "report.json").exists()


def test_grade_help_documents_names(capsys):
    with pytest.raises(SystemExit):
        grade_main(["--help"])
    text = capsys.readouterr().out
    for form in ("Copy of", "(1)", "- Copy", "<student>_lab01.ipynb", "lab01_<student>.ipynb", "Canvas"):
        assert form in text


# ---------------------------------------------------------------------------------------------------
# 3. every real lab

needs_labs = pytest.mark.skipif(not REAL_LABS, reason="no solutions/lab*.ipynb yet")
per_lab = pytest.mark.parametrize("lab", REAL_LABS or ["none"])


@pytest.fixture(scope="module")
def real_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "labs"
    return {r.name: r for r in build_labs(ROOT / "solutions", out)}


@needs_labs
@per_lab
def test_lab_builds_and_is_in_sync(real_build, lab):
    b = real_build[lab]
    assert b.status == "written", b.message
    committed = ROOT / "labs" / f"{lab}.ipynb"
    assert committed.exists(), f"labs/{lab}.ipynb is missing: run `course build-labs` and commit it"
    assert committed.read_text(encoding="utf-8") == b.text, \
        f"labs/{lab}.ipynb is out of date with solutions/{lab}.ipynb: run `course build-labs` and commit it"


@needs_labs
@per_lab
def test_lab_gives_nothing_away(lab):
    committed = ROOT / "labs" / f"{lab}.ipynb"
    if not committed.exists():
        pytest.fail(f"labs/{lab}.ipynb is missing: run `course build-labs`")
    text = committed.read_text(encoding="utf-8")
    for m in MARKERS:
        assert m not in text, f"labs/{lab}.ipynb contains {m!r}"
    source = read_notebook(ROOT / "solutions" / f"{lab}.ipynb")
    leaks = find_leaks(source, read_notebook(committed))
    assert not leaks, f"labs/{lab}.ipynb shows solution or hidden-test lines: {leaks[:10]}"


@needs_labs
@per_lab
def test_lab_grade_ids(lab):
    source = read_notebook(ROOT / "solutions" / f"{lab}.ipynb")
    assert duplicate_grade_ids(source) == {}
    tests = [c for c in source.cells if (c.metadata.get("nbgrader") or {}).get("grade")]
    answers = [c for c in source.cells if is_answer(c)]
    assert tests and answers, f"{lab} has no graded test cells or no answer cells"
    assert all(c.metadata.nbgrader.get("points", 0) > 0 for c in tests)
    assert (ROOT / "judges" / f"{lab}.py").is_file(), f"{lab} has no judge (judges/{lab}.py)"


def _plain(text: str) -> str:
    """Text as a student reads it on the feedback page: HTML entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(text).split())


@pytest.fixture(scope="module")
def real_graded(tmp_path_factory):
    """Every real lab graded once through real sandboxed kernels, two at a time: its solution, its blank release
    and its judge's mutants, one grade run."""
    base = tmp_path_factory.mktemp("roundtrip")
    sub = base / "submissions"
    for lab in REAL_LABS:
        committed = ROOT / "labs" / f"{lab}.ipynb"
        if not committed.exists():
            continue
        release = read_notebook(committed)
        answers = answer_sources(read_notebook(ROOT / "solutions" / f"{lab}.ipynb"))
        write_nb(sub / "solution" / f"{lab}.ipynb", fill_answers(release, answers))
        write_nb(sub / "blank" / f"{lab}.ipynb", release)
        for k, (_, cells, _) in enumerate(lab_mutants(lab)):
            if set(cells) <= set(answers):
                write_nb(sub / f"mutant{k}" / f"{lab}.ipynb", fill_answers(release, {**answers, **cells}))
    if not sub.exists():
        return None
    report = grade(sub, labs_release=ROOT / "labs", solutions=ROOT / "solutions", out=base / "grades",
                   workdir=base / "work", secret_file=base / "class-secret", jobs=2)
    report.workdir = base / "work"   # the executed notebooks, for test_blank_lab_runs_without_tracebacks
    return report


@slow
@needs_labs
@per_lab
def test_lab_round_trip(real_graded, lab):
    assert real_graded is not None and any(x.assignment == lab for x in real_graded.results), \
        f"labs/{lab}.ipynb is missing"
    res = {x.student: x for x in real_graded.results if x.assignment == lab}
    sol = res["solution"]
    auto_max = sum(c["max_score"] for c in sol.cells if not c["needs_manual_grade"])
    assert sol.status in ("ok", "review") and not set(sol.flags) - {"needs_manual_grading"}, sol.messages
    assert sol.score == auto_max > 0, f"{lab}: the solution scores {sol.score}/{auto_max}: {sol.cells}"
    b = res["blank"]
    assert b.score == 0, \
        f"{lab}: the blank lab scores {b.score}: {b.cells} {b.flags} {b.messages} {(b.log or '')[-2000:]}"
    for k, (what, _, diagnoses) in enumerate(lab_mutants(lab)):
        m = res.get(f"mutant{k}")
        assert m is not None, f"{lab} mutant {what!r} was not graded"
        assert 0 < m.score < auto_max, f"{lab} mutant {what!r} scores {m.score}/{auto_max}: {m.cells}"
        page = _plain(Path(m.feedback).read_text(encoding="utf-8")) if m.feedback else ""
        missing = [d for d in diagnoses if _plain(d) not in page]
        assert not missing, f"{lab} mutant {what!r}: its feedback does not name the misconception: {missing}"
    judge_code = [ln.strip() for ln in (ROOT / "judges" / f"{lab}.py").read_text().splitlines()
                  if ln.strip().startswith(("with t.case(", "@judge.part(")) or "t.call(" in ln]
    for who, x in res.items():  # every submission has its feedback page, none was judged by a failing judge,
        assert x.feedback and "judge_failed" not in x.flags, (lab, who, x.flags, x.messages)
        page = _plain(Path(x.feedback).read_text(encoding="utf-8"))   # and no page shows the judge's code
        assert judge_code and not [ln for ln in judge_code if _plain(ln) in page], (lab, who)


@slow
@needs_labs
@per_lab
def test_blank_lab_runs_without_tracebacks(real_graded, lab):
    """A student's first run of a blank lab: only the answer cells and their tests may fail; every other
    cell (setup, demos, "putting it together") runs, printing "finish the exercises first" where it
    needs an answer. The solution runs with no error anywhere."""
    ids = {x.student: x.internal_id for x in real_graded.results if x.assignment == lab}
    for student in ("blank", "solution"):
        graded = real_graded.workdir / "autograded" / ids[student] / lab / f"{lab}.ipynb"
        assert graded.exists(), f"no autograded notebook for {student}/{lab} at {graded}"
        nb = read_notebook(graded)
        for k, c in enumerate(nb.cells):
            meta = c.metadata.get("nbgrader") or {}
            if c.cell_type != "code" or (student == "blank" and (meta.get("solution") or meta.get("grade"))):
                continue
            errs = [f"{o.get('ename')}: {o.get('evalue', '')}"[:200] for o in c.get("outputs", [])
                    if o.get("output_type") == "error"]
            assert not errs, (f"{lab} ({student}): cell {k} ({meta.get('grade_id') or c.get('id')}) raised {errs}; "
                              f"source starts {c.source[:120]!r}")
