"""What every lab asks of a student, held by a test (the conventions are in CONTRIBUTING.md, "Labs"):

1. a contract: parts marked ``(N points, contract)`` in their heading are specified by what they take, give,
   keep invariant and refuse, not by steps; together they are worth at least a third of the lab's autograded
   points (a written part, graded by hand against a rubric, is neither a contract nor a recipe).
   A contract part states a ``**Contract.**`` paragraph, and any step-by-step guidance is folded into a
   ``<details>`` hint the student opens on purpose (no numbered steps outside one);
2. a prediction: at least one answer cell and one graded test cell whose grade_id starts with ``predict_``
   (the student computes a number from the module's model; grading is against the model, never against a
   measurement);
3. an answer key: every item of a "Going further" section has a worked answer in the solution, in cells tagged
   ``answer-key`` under an "Answer key" heading, one list item per item, which never reach ``labs/``.

Every heading's points must add up to its graded cells' points, so the third in (1) is the real third.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_grading.build import is_answer_key, lab_names, read_notebook

ROOT = Path(__file__).resolve().parents[1]
LABS = lab_names(ROOT / "solutions")
HEADING = re.compile(r"^##\s+(?P<name>Part [A-Z]|Exercise \d+)\s*[·—-]\s*(?P<title>.+?)\s*"
                     r"\((?P<points>\d+(?:\.\d+)?) points?(?P<contract>, contract)?\)\s*$", re.M)
SECTION = re.compile(r"^##\s+\S", re.M)
LIST_ITEM = re.compile(r"^(?:[*-]|\d+\.)\s+\S", re.M)
NUMBERED = re.compile(r"^\s*\d+\.\s+\S", re.M)
DETAILS = re.compile(r"<details>.*?</details>", re.S)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def parts(nb) -> list[dict]:
    """The graded parts of a lab: heading, points claimed, points of its graded cells, its markdown."""
    out: list[dict] = []
    for c in nb.cells:
        if c.cell_type == "markdown" and SECTION.search(c.source):
            m = HEADING.search(c.source)
            out.append({"name": m["name"], "title": m["title"], "points": float(m["points"]),
                        "contract": bool(m["contract"]), "graded": 0.0, "written": 0.0, "markdown": []} if m else None)
        if not out or out[-1] is None:
            continue
        if c.cell_type == "markdown":
            out[-1]["markdown"].append(c.source)
        if _meta(c).get("grade"):
            out[-1]["graded"] += float(_meta(c).get("points", 0))
            if _meta(c).get("solution"):   # a manually graded answer: a written part
                out[-1]["written"] += float(_meta(c).get("points", 0))
    return [p for p in out if p is not None]


def total_points(nb) -> float:
    return sum(float(_meta(c).get("points", 0)) for c in nb.cells if _meta(c).get("grade"))


@pytest.fixture(params=LABS)
def lab(request):
    return request.param, read_notebook(ROOT / "solutions" / f"{request.param}.ipynb")


def test_headings_match_graded_points(lab):
    name, nb = lab
    ps = parts(nb)
    assert ps, f"{name}: no part headings like '## Part A · Title (3 points)'"
    for p in ps:
        assert p["points"] == p["graded"], (f"{name} {p['name']} ({p['title']}): the heading says {p['points']:g} "
                                            f"points, its graded cells give {p['graded']:g}")
    assert sum(p["points"] for p in ps) == total_points(nb), f"{name}: graded cells outside any part heading"


def test_a_third_of_the_points_are_contracts(lab):
    name, nb = lab
    ps = parts(nb)
    contract = sum(p["points"] for p in ps if p["contract"])
    total = sum(p["points"] - p["written"] for p in ps)
    assert total and contract * 3 >= total, (
        f"{name}: contract parts are worth {contract:g} of {total:g} autograded points; at least a third must be parts "
        f"marked '(N points, contract)', specified by their contract and tests, not by steps")


def test_contract_parts_state_a_contract_and_fold_their_steps(lab):
    name, nb = lab
    for p in parts(nb):
        if not p["contract"]:
            continue
        text = "\n".join(p["markdown"])
        assert "**Contract.**" in text, f"{name} {p['name']}: a contract part states a '**Contract.**' paragraph"
        for block in DETAILS.findall(text):
            assert "<summary>" in block, f"{name} {p['name']}: a <details> hint needs a <summary> line"
        unfolded = NUMBERED.findall(DETAILS.sub("", text))
        assert not unfolded, (f"{name} {p['name']}: numbered steps outside a <details> hint in a contract part: "
                              f"{unfolded[:3]}")


def test_every_lab_has_a_prediction(lab):
    name, nb = lab
    answers = [_meta(c)["grade_id"] for c in nb.cells if _meta(c).get("solution") and
               str(_meta(c).get("grade_id", "")).startswith("predict_")]
    tests = [_meta(c)["grade_id"] for c in nb.cells if _meta(c).get("grade") and
             str(_meta(c).get("grade_id", "")).startswith("predict_")]
    assert answers and tests, (f"{name}: no prediction (an answer cell and a graded test cell whose grade_id "
                               f"starts with 'predict_'); answers {answers}, tests {tests}")


def _going_further_items(nb) -> int:
    n, inside = 0, False
    for c in nb.cells:
        if c.cell_type != "markdown" or is_answer_key(c):
            continue
        if SECTION.search(c.source):
            inside = bool(re.search(r"^##\s+Going further", c.source, re.M))
        if inside:
            n += len(LIST_ITEM.findall(c.source))
    return n


def test_going_further_has_an_answer_key(lab):
    name, nb = lab
    items = _going_further_items(nb)
    keys = [c.source for c in nb.cells if c.cell_type == "markdown" and is_answer_key(c)]
    if not items:
        assert not keys, f"{name}: answer-key cells but no 'Going further' items"
        return
    assert keys and re.search(r"^#+\s+Answer key", keys[0], re.M), \
        f"{name}: 'Going further' has {items} items and no answer key (markdown cells tagged answer-key)"
    answered = sum(len(LIST_ITEM.findall(k)) for k in keys)
    assert answered == items, f"{name}: 'Going further' has {items} items, the answer key answers {answered}"


def test_no_answer_key_reaches_students(lab):
    name, _ = lab
    committed = ROOT / "labs" / f"{name}.ipynb"
    assert "Answer key" not in committed.read_text(encoding="utf-8"), f"labs/{name}.ipynb shows an answer key"


def test_the_rules_catch_a_recipe():
    """The parser sees a contract part with steps left in the open, and the points a heading overclaims."""
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("## Part A · Tiles (4 points, contract)\n\n**Contract.** ...\n\n"
                                      "1. compute m\n2. rescale"),
        nbformat.v4.new_code_cell("", metadata={"nbgrader": {"grade": True, "grade_id": "t", "points": 3}}),
        nbformat.v4.new_markdown_cell("## Part B · More (2 points)"),
        nbformat.v4.new_code_cell("", metadata={"nbgrader": {"grade": True, "grade_id": "u", "points": 2}}),
    ]
    (a, b) = parts(nb)
    assert a["contract"] and a["points"] == 4 and a["graded"] == 3 and not b["contract"]
    assert len(NUMBERED.findall(DETAILS.sub("", "\n".join(a["markdown"])))) == 2
    folded = "<details><summary>Hint</summary>\n\n1. compute m\n2. rescale\n</details>"
    assert not NUMBERED.findall(DETAILS.sub("", folded))
