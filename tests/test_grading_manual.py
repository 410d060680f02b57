"""Written parts graded by the instructor, through `course grade` (course_grading/manual.py).

1. fast: the manual scores CSV refused row by row with clear messages; a judge's WRITTEN checked against the
   release; every real lab has a written part whose rubric adds up (labs 07 and 12 skip until theirs land);
2. (slow) end to end through real sandboxed kernels, on the fixture lab with a written part added: the
   written cell is left pending (never judged, status ok), the instructor's CSV is merged into grades.csv
   and the feedback page (rubric and comment), a draft is neither counted nor shown, a bad CSV stops the run
   before anything is graded, and a regrade keeps the scores.
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import nbformat
import pytest

from course_grading.build import answer_sources, build_labs, fill_answers, lab_names, notebook_text, read_notebook
from course_grading.feedback import written_text
from course_grading.judging import load_judge
from course_grading.manual import ManualScoreError, check_scores, manual_parts, read_scores, written_rubric
from course_grading.pipeline import grade, grade_main

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
LAB = "lab99"
WRITTEN_ID = "written_explain"
RUBRIC = [(1, "says which case of add the drawn inputs exercise"), (1, "explains why the edge grid <matters>")]
# labs whose written part a colleague's branch adds (issue 43): skipped here until it lands
PENDING_ELSEWHERE = {"lab07", "lab12"}


def _csv(text: str, tmp_path: Path) -> Path:
    p = tmp_path / "scores.csv"
    p.write_text(text, encoding="utf-8")
    return p


# ---------------------------------------------------------------------------------------------------
# 1. fast

def test_read_scores_refuses_each_bad_row_by_number(tmp_path):
    p = _csv("student,lab,grade_id,score,comment,validated\n"
             "alice,lab99,written_explain,1.5,good,yes\n"
             "bob,lab99,written_explain,one,,yes\n"
             "carol,lab99,written_explain,nan,,yes\n"
             "dave,lab99,written_explain,1,,maybe\n"
             ",lab99,written_explain,1,,yes\n"
             "alice,lab99,written_explain,2,again,yes\n"
             "erin,lab99,written_explain,,,\n", tmp_path)   # not scored yet: skipped, not an error
    with pytest.raises(ManualScoreError) as e:
        read_scores(p)
    msg = str(e.value)
    assert "5 bad row(s)" in msg
    for row, what in [(3, "score must be a number, got 'one'"), (4, "score must be a finite number"),
                      (5, "validated must be yes or no"), (6, "student must not be empty"),
                      (7, "alice lab99 written_explain is scored twice (also row 2)")]:
        assert f"{p}, row {row}: {what}" in msg, msg


def test_read_scores_header_and_drafts(tmp_path):
    with pytest.raises(ManualScoreError, match=r"missing: score; unknown: 'scroe'"):
        read_scores(_csv("student,lab,grade_id,scroe\nalice,lab99,w,1\n", tmp_path))
    rows = read_scores(_csv("student,lab,grade_id,score\nalice,lab99,w,1\n", tmp_path))
    assert rows[0].validated and rows[0].comment == ""          # no validated column: all final
    rows = read_scores(_csv("\ufeffstudent,lab,grade_id,score,validated\nalice,lab99,w,1,no\n", tmp_path))
    assert not rows[0].validated                                  # a spreadsheet's BOM is read past


def test_check_scores_names_unknown_students_parts_and_range(tmp_path):
    rows = read_scores(_csv("student,lab,grade_id,score\n"
                            "zed,lab99,written_explain,1\n"
                            "alice,lab01,written_explain,1\n"
                            "alice,lab99,written_typo,1\n"
                            "alice,lab99,written_explain,2.5\n"
                            "bob,lab99,written_explain,-1\n", tmp_path))
    graded = {("alice", LAB): {WRITTEN_ID: 2.0}, ("bob", LAB): {WRITTEN_ID: 2.0}}
    with pytest.raises(ManualScoreError, match="scored twice"):
        read_scores(_csv("student,lab,grade_id,score\nalice,lab99,w,1\nalice,lab99,w,2\n", tmp_path))
    with pytest.raises(ManualScoreError) as e:
        check_scores(rows, graded)
    msg = str(e.value)
    assert "row 2: no submission of 'zed' for lab99" in msg and "no such student" in msg
    assert "row 3: no submission of 'alice' for lab01 is graded in this run (graded for 'alice': lab99)" in msg
    assert "row 4: lab99 has no written part 'written_typo' (its manually graded parts: written_explain)" in msg
    assert "row 5: score must be between 0 and 2 (the points of written_explain), got 2.5" in msg
    assert "row 6: score must be between 0 and 2" in msg and "got -1" in msg
    # a lab that exists but is not graded in this run (--assignment): its rows wait for the run that grades it
    with pytest.raises(ManualScoreError) as e:
        check_scores(rows, graded, other_labs={"lab01"})
    assert "row 3" not in str(e.value) and "row 2" in str(e.value)
    # the store of an earlier run is lenient: a row that no longer fits is left out with a note
    kept, notes = check_scores(rows, graded, strict=False)
    assert kept == {} and len(notes) == 4 and all("left out" in n for n in notes)   # zed: not in this run


class _Judge:
    def __init__(self, written):
        self.module = type("M", (), {"WRITTEN": written, "__file__": "judges/lab99.py"})


def test_written_rubric_must_match_the_release():
    parts = {WRITTEN_ID: 2.0}
    assert written_rubric(_Judge({WRITTEN_ID: {"points": 2, "rubric": RUBRIC}}), LAB, parts)[WRITTEN_ID]["points"] == 2
    for written, why in [({}, "no rubric in WRITTEN for the written part written_explain"),
                         ({WRITTEN_ID: {"points": 2, "rubric": [(1, "only half")]}}, "add up to 1 points"),
                         ({WRITTEN_ID: {"points": 3, "rubric": [(3, "x")]}}, "points is 3, the cell's"),
                         ({WRITTEN_ID: {"points": 2, "rubric": RUBRIC}, "written_other": {"points": 1,
                           "rubric": [(1, "x")]}}, "WRITTEN['written_other'] is no manually graded cell")]:
        with pytest.raises(ValueError, match=r"judges/lab99.py does not match the release's written parts"):
            written_rubric(_Judge(written), LAB, parts)
        with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
            written_rubric(_Judge(written), LAB, parts)


def test_written_text_escapes_and_hides_drafts():
    part = {"points": 2.0, "rubric": RUBRIC}
    pending = written_text(WRITTEN_ID, {**part, "score": 1.0, "comment": "draft <b>", "validated": False})
    assert "not in yet" in pending and "draft" not in pending and "&lt;matters&gt;" in pending
    done = written_text(WRITTEN_ID, {**part, "score": 1.5, "comment": "<script>x</script>", "validated": True})
    assert "1.5 / 2 points" in done and "&lt;script&gt;" in done and "<script>" not in done


SOLUTION_LABS = lab_names(ROOT / "solutions")


@pytest.mark.parametrize("lab", SOLUTION_LABS)
def test_every_lab_has_a_written_part_with_a_rubric(lab):
    """Each lab: at least one written part (a markdown answer cell, grade_id written_*), its rubric in the
    judge's WRITTEN with the cell's points, the criteria adding up to them."""
    source = read_notebook(ROOT / "solutions" / f"{lab}.ipynb")
    parts = manual_parts(source)
    if not parts and lab in PENDING_ELSEWHERE:
        pytest.skip(f"{lab}'s written part comes from another branch of issue 43")
    assert parts, f"{lab} has no written part (a manually graded markdown answer cell)"
    for gid, points in parts.items():
        cell = next(c for c in source.cells if (c.metadata.get("nbgrader") or {}).get("grade_id") == gid)
        assert gid.startswith("written_") and cell.cell_type == "markdown" and points > 0, (lab, gid)
        assert len(cell.source.split()) >= 40, f"{lab} {gid}: the model answer is too short to grade against"
    rubric = written_rubric(load_judge(ROOT / "judges" / f"{lab}.py"), lab, parts)
    assert set(rubric) == set(parts)
    release = read_notebook(ROOT / "labs" / f"{lab}.ipynb")
    assert manual_parts(release) == parts, f"labs/{lab}.ipynb is not rebuilt with its written parts"
    for gid in parts:   # the rubric never reaches the student's notebook
        for _, text in rubric[gid]["rubric"]:
            assert text not in notebook_text(release), f"labs/{lab}.ipynb shows {gid}'s rubric"


# ---------------------------------------------------------------------------------------------------
# 2. slow: through real sandboxed kernels

JUDGE_EXTRA = f'''

WRITTEN = {{{WRITTEN_ID!r}: {{"points": 2, "rubric": {RUBRIC!r}}}}}
'''


@pytest.fixture(scope="module")
def written_lab(tmp_path_factory):
    """The fixture lab with a written part (2 points) added after Exercise 1, its judge with a WRITTEN rubric,
    built into a release; plus a solved and a blank submission."""
    base = tmp_path_factory.mktemp("manual")
    src = read_notebook(DATA / "solutions" / f"{LAB}.ipynb")
    k = next(i for i, c in enumerate(src.cells) if (c.metadata.get("nbgrader") or {}).get("grade_id") == "add_tests")
    meta = {"grade": True, "grade_id": WRITTEN_ID, "locked": False, "points": 2, "schema_version": 3,
            "solution": True, "task": False}
    src.cells[k + 1:k + 1] = [
        nbformat.v4.new_markdown_cell("## Written: explain (2 points)\nSay which inputs add's grader draws."),
        nbformat.v4.new_markdown_cell("The grader draws pairs from a seeded generator.", metadata={"nbgrader": meta})]
    for i, c in enumerate(src.cells):
        c["id"] = f"c{i:03d}"
    (base / "solutions").mkdir()
    (base / "solutions" / f"{LAB}.ipynb").write_text(notebook_text(src), encoding="utf-8")
    (base / "judges").mkdir()
    shutil.copy(DATA / "judges" / f"{LAB}.py", base / "judges" / f"{LAB}.py")
    with open(base / "judges" / f"{LAB}.py", "a", encoding="utf-8") as f:
        f.write(JUDGE_EXTRA)
    results = build_labs(base / "solutions", base / "labs")
    assert [(r.name, r.status) for r in results] == [(LAB, "written")], [r.message for r in results]
    release = read_notebook(base / "labs" / f"{LAB}.ipynb")
    assert manual_parts(release) == {WRITTEN_ID: 2.0}
    sub = base / "submissions"
    for who, nb in [("alice", fill_answers(release, answer_sources(src))), ("bob", release)]:
        (sub / who).mkdir(parents=True)
        (sub / who / f"{LAB}.ipynb").write_text(notebook_text(nb), encoding="utf-8")
    return base


def _grade(base, out, **kw):
    return grade(base / "submissions", labs_release=base / "labs", solutions=base / "solutions", out=out,
                 judges=base / "judges", timeout=15, secret_file=base / "class-secret", **kw)


def _rows(out: Path) -> dict:
    return {row["student"]: row for row in csv.DictReader(open(out / "grades.csv", encoding="utf-8"))}


def _page(res) -> str:
    import html
    import re
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", Path(res.feedback).read_text(encoding="utf-8"))).split())


@pytest.mark.slow
def test_written_part_pending_then_merged_then_kept(written_lab, tmp_path, capsys):
    base = written_lab
    out = tmp_path / "grades"
    # 1. no manual scores yet: the written cell is left for the instructor, the autograded score unchanged
    report = _grade(base, out)
    alice, bob = report.by_student("alice", LAB), report.by_student("bob", LAB)
    assert (alice.score, alice.max_score, alice.status) == (5.0, 7.0, "ok"), (alice.flags, alice.messages)
    assert (bob.score, bob.status) == (0.0, "ok") and not alice.flags and not bob.flags
    assert alice.manual_pending == [WRITTEN_ID] and alice.manual[WRITTEN_ID]["score"] is None
    rows = _rows(out)
    assert list(rows["alice"])[-4:] == ["auto_score", "manual_score", "manual_pending", WRITTEN_ID]
    assert (rows["alice"]["score"], rows["alice"]["auto_score"], rows["alice"]["manual_score"]) == ("5", "5", "0")
    assert rows["alice"]["manual_pending"] == f"{WRITTEN_ID}(2)" and rows["alice"][WRITTEN_ID] == ""
    todo = list(csv.DictReader(open(out / "manual_todo.csv", encoding="utf-8")))
    assert [(t["student"], t["grade_id"], t["max_points"], t["score"]) for t in todo] == [
        ("alice", WRITTEN_ID, "2", ""), ("bob", WRITTEN_ID, "2", "")]
    page = _page(alice)
    assert "graded by your instructor; the score is not in yet" in page and RUBRIC[0][1] in page
    assert "explains why the edge grid <matters>" in page          # escaped on the page, read back as text
    assert "The grader draws pairs from a seeded generator." in page   # the student's answer, as text

    # 2. a bad CSV is refused before anything is graded: exit 2, each bad row named, the outputs untouched
    before = (out / "grades.csv").read_bytes()
    bad = _csv("student,lab,grade_id,score,comment,validated\n"
               "alice,lab99,written_explain,3,,yes\nmallory,lab99,written_explain,1,,yes\n"
               "bob,lab99,written_explain,x,,yes\n", tmp_path)
    rc = grade_main([str(base / "submissions"), "--labs-release", str(base / "labs"), "--solutions",
                     str(base / "solutions"), "--judges", str(base / "judges"), "--out", str(out),
                     "--secret-file", str(base / "class-secret"), "--manual", str(bad), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}, row 4: score must be a number, got 'x'" in err, err
    assert (out / "grades.csv").read_bytes() == before and alice.feedback and Path(alice.feedback).exists()
    bad.write_text("student,lab,grade_id,score\nalice,lab99,written_explain,3\nmallory,lab99,written_explain,1\n")
    rc = grade_main([str(base / "submissions"), "--labs-release", str(base / "labs"), "--solutions",
                     str(base / "solutions"), "--judges", str(base / "judges"), "--out", str(out),
                     "--secret-file", str(base / "class-secret"), "--manual", str(bad), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "row 2: score must be between 0 and 2" in err and "row 3: no submission of 'mallory'" in err

    # 3. the instructor's scores (the to-do file filled in): merged into grades.csv and the feedback
    scores = _csv("student,lab,max_points,grade_id,score,comment,validated\n"
                  f"alice,lab99,2,{WRITTEN_ID},1.5,\"Right about the seed; <b>the grid</b> is not explained.\",yes\n"
                  f"bob,lab99,2,{WRITTEN_ID},0.5,draft: ask bob,no\n", tmp_path)
    report = _grade(base, out, manual=scores)
    alice, bob = report.by_student("alice", LAB), report.by_student("bob", LAB)
    assert (alice.score, alice.max_score, alice.status, alice.manual_pending) == (6.5, 7.0, "ok", [])
    assert (bob.score, bob.manual_pending) == (0.0, [WRITTEN_ID])      # a draft is not counted
    rows = _rows(out)
    assert (rows["alice"]["score"], rows["alice"]["auto_score"], rows["alice"]["manual_score"],
            rows["alice"]["manual_pending"], rows["alice"][WRITTEN_ID]) == ("6.5", "5", "1.5", "", "1.5")
    assert rows["bob"][WRITTEN_ID] == "" and rows["bob"]["manual_pending"] == f"{WRITTEN_ID}(2)"
    page = _page(alice)
    assert "Instructor: 1.5 / 2 points" in page and "Right about the seed; <b>the grid</b> is not explained." in page
    assert RUBRIC[1][1] in page
    bob_page = _page(bob)
    assert "ask bob" not in bob_page and "not in yet" in bob_page   # a draft is never shown to the student
    todo = list(csv.DictReader(open(out / "manual_todo.csv", encoding="utf-8")))
    assert [(t["student"], t["score"], t["comment"], t["validated"]) for t in todo] == [
        ("bob", "0.5", "draft: ask bob", "no")]

    # 4. a regrade into the same folder, with no --manual: the scores entered are kept
    report = _grade(base, out)
    alice = report.by_student("alice", LAB)
    assert alice.score == 6.5 and alice.manual[WRITTEN_ID]["comment"].startswith("Right about the seed")
    assert alice.manual[WRITTEN_ID]["score"] == 1.5 and _rows(out)["alice"][WRITTEN_ID] == "1.5"
    assert "Instructor: 1.5 / 2 points" in _page(alice)
    # and a later file replaces an earlier score of the same part (the to-do row validated now)
    report = _grade(base, out, manual=_csv(f"student,lab,grade_id,score,comment,validated\n"
                                           f"bob,lab99,{WRITTEN_ID},1,fine after all,yes\n", tmp_path))
    assert report.by_student("bob", LAB).score == 1.0 and report.by_student("alice", LAB).score == 6.5
    assert not list(csv.DictReader(open(out / "manual_todo.csv", encoding="utf-8")))
