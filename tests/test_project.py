"""The final project (solutions/lab13): its scale, its judge's record, and `course grade` writing the leaderboard.

The slow test grades a folder of three project submissions with `course grade` (the round trip's machinery:
the release filled with the solution's answers, or with the judge's planted wrong one, judges/lab13.py):

* ``baseline``: the blank release, whose ``build`` is the course's baseline: correct, about 1x, no speed points;
* ``fast``: the solution's reference entry, a KV cache (a fresh one per prompt) in a lean greedy loop;
* ``wrong``: lab13's mutant, a KV cache kept from one call to the next: as fast, but its tokens differ.

Timing on a shared 2-core machine is noisy, so the test asserts no margin: only that the KV-cached entry
ranks above the baseline and has a speed-up above 1. That holds by a wide margin at the lab's sizes (64-token
prompts, 16 new tokens): the baseline runs the model over 64..79 positions per step, the cache over one, and
measured here the cached entry was 2.5-2.8x the baseline (lower quartile 2.1-2.6x) while the baseline against
itself stayed within 0.9-1.1x. Cost: three gradings of lab13 (each: the bundled model, 7 prompts the grader
draws, 16 new tokens).
"""
from __future__ import annotations

import csv
import html
import math
import re
import sys
from pathlib import Path

import pytest

from course_grading.build import answer_sources, fill_answers, notebook_text, read_notebook
from course_grading.judging import PartResult, Verdict
from course_grading.leaderboard import method_line, project_record, rows
from course_grading.pipeline import grade_main

sys.path.insert(0, str(Path(__file__).parent))
from judge_tools import lab_mutants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab13"
slow = pytest.mark.slow


def test_speed_points_scale():
    from course_lib.capstone import PROJECT_POINTS, RATIO_FLOOR, RATIO_FULL, speed_points
    assert (PROJECT_POINTS, RATIO_FLOOR, RATIO_FULL) == (6.0, 1.2, 2.0)   # as syllabus.md and the lab state them
    assert speed_points(1.0) == speed_points(1.2) == speed_points(float("nan")) == speed_points(0.5) == 0.0
    assert speed_points(2.0) == speed_points(3.7) == 6.0
    assert speed_points(math.sqrt(1.2 * 2.0)) == 3.0                    # half-way on a log scale: half the points
    assert speed_points(1.5) == math.floor(6 * math.log(1.5 / 1.2) / math.log(2.0 / 1.2) * 2) / 2
    pts = [speed_points(1.2 + k / 50) for k in range(60)]
    assert pts == sorted(pts) and all(p * 2 == int(p * 2) for p in pts)  # monotone, in half points
    with pytest.raises(ValueError, match="floor"):
        speed_points(2.0, floor=2.0, full=1.5)


def test_evaluate_project_catches_the_contract_breaks():
    """A correct entry passes; one that returns the prompt too, keeps its cache between calls, or changes the
    model's weights is not correct and scores no points (the bundled model, three short prompts: a random
    model's greedy tokens barely depend on the context, so a stale cache would go unseen on one)."""
    import torch

    from course_lib.capstone import project_prompts
    from course_lib.models import load

    m, tok = load("tiny")
    prompts = project_prompts(tok, 3, 8, seed=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # as the lab does: two threads on a busy 2-core machine make every matmul wait
    try:
        _contract_breaks(m, prompts)
        _lossy_entries(m, tok, prompts)
    finally:
        torch.set_num_threads(threads)


def _lossy_entries(m, tok, prompts):
    """A lossy entry is checked against greedy decoding of its own lossy_model and the bits-per-byte bound."""
    import copy

    import torch

    from course_lib.capstone import BPB_BOUND, baseline_build, evaluate_project
    from course_lib.models.corpus import load_split

    heldout = [load_split("heldout", max_files=1)[0][:800]]

    def lossy(scale):
        def build(model):
            lm = copy.deepcopy(model)
            with torch.no_grad():
                for p in lm.parameters():
                    p.mul_(scale)
            fn = baseline_build(lm)
            fn.lossy_model = lm
            return fn
        return build

    near = evaluate_project(lossy(0.999), m, prompts, 4, rounds=2, tokenizer=tok, heldout=heldout)
    assert near.correct and near.lossy and near.bpb <= near.bpb_model + BPB_BOUND, near.describe()
    far = evaluate_project(lossy(0.5), m, prompts, 4, rounds=2, tokenizer=tok, heldout=heldout)
    assert not far.correct and "bits per byte" in far.problem and far.points == 0.0, far.describe()


def _contract_breaks(m, prompts):
    import torch

    from course_lib.capstone import baseline_build, evaluate_project
    from course_lib.kvcache import ContiguousCache

    def with_prompt(model):
        base = baseline_build(model)
        return lambda p, n: torch.cat([p, base(p, n)])

    def stale(model):
        cache = ContiguousCache()

        def fn(p, n):
            x, out = p.view(1, -1), []
            for _ in range(n):
                t = model(x, cache=cache)[0, -1].argmax()
                out.append(int(t))
                x = t.view(1, 1)
            return out
        return fn

    def meddles(model):
        with torch.no_grad():
            model.lm_head.weight[0, 0] += 1e-3     # in place, on the model the baseline also runs
        return baseline_build(model)

    ok = evaluate_project(baseline_build, m, prompts, 4, rounds=2)   # its points: timing noise, not asserted
    assert ok.correct and len(ok.ratios) == 2 and ok.outputs == ok.expected and len(ok.outputs) == 3, ok.describe()
    def fails(model):
        return lambda p, n: 1 / 0

    for build, says in ((with_prompt, "returned 12 tokens"), (stale, "greedy tokens differ"),
                        (meddles, "changed the model's weights"), (fails, "raised ZeroDivisionError")):
        r = evaluate_project(build, m, prompts, 4, rounds=2)
        assert not r.correct and r.points == 0.0 and says in r.problem, (build.__name__, r.problem)
        assert "NOT correct" in r.describe()


def _submission(release, answers: dict, method: str):
    """The release with `answers` filled in and the report's Method line written."""
    nb = fill_answers(release, answers)
    for c in nb.cells:
        if c.cell_type == "markdown" and "**Method:**" in c.source:
            c.source = re.sub(r"(\*\*Method:\*\*).*", lambda m: f"{m.group(1)} {method}", c.source, count=1)
    return nb


@slow
def test_course_grade_writes_the_leaderboard(tmp_path, capsys):
    release = read_notebook(ROOT / "labs" / f"{LAB}.ipynb")
    answers = answer_sources(read_notebook(ROOT / "solutions" / f"{LAB}.ipynb"))
    wrong_cells = next(cells for what, cells, _ in lab_mutants(LAB) if "build_answer" in cells)
    subs = tmp_path / "submissions"
    entries = {"baseline": ({}, ""),
               "fast": (answers, "KV cache, fresh per prompt, lean greedy loop"),
               "wrong": ({**answers, **wrong_cells}, "one KV cache kept across calls")}
    for student, (cells, method) in entries.items():
        nb = _submission(release, cells, method) if cells or method else release
        (subs / student).mkdir(parents=True)
        (subs / student / f"{LAB}.ipynb").write_text(notebook_text(nb), encoding="utf-8")
    out = tmp_path / "grades"
    rc = grade_main([str(subs), "--assignment", LAB, "--out", str(out), "--labs-release", str(ROOT / "labs"),
                     "--solutions", str(ROOT / "solutions"), "--secret-file", str(tmp_path / "secret"), "-q"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    with open(out / "leaderboard.csv", newline="", encoding="utf-8") as f:
        board = list(csv.DictReader(f))
    assert [r["student"] for r in board] == ["fast", "baseline", "wrong"], board
    fast, base, wrong = board
    assert [r["rank"] for r in board] == ["1", "2", "3"]
    assert (fast["correct"], base["correct"], wrong["correct"]) == ("yes", "yes", "no"), board
    assert fast["method"] == "KV cache, fresh per prompt, lean greedy loop"
    assert base["method"] == "(no method given)"             # the template's line, left as it was
    assert wrong["method"] == "one KV cache kept across calls"
    # the wrong one: no speed points however fast, and the reason is on the board
    assert float(wrong["points"]) == 0.0 and "per-prompt state" in wrong["problem"], wrong
    # ordering only, no margin (see the module docstring): the cached entry is faster than the baseline
    assert float(fast["speedup"]) > 1.0 and float(fast["speedup"]) > float(base["speedup"]), board
    assert float(base["points"]) <= float(fast["points"]), board
    for r in board:   # the spread is reported: quartiles inside min..max, the median between the quartiles
        lo, q1, med, q3, hi = (float(r[k]) for k in ("min", "q1", "speedup", "q3", "max"))
        assert lo <= q1 <= med <= q3 <= hi and int(r["rounds"]) >= 3, r
        assert r["max_points"] == "6"
    # the grades agree with the board: the speed cell's score is the board's points
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        grades = {r["student"]: r for r in csv.DictReader(f)}
    for r in board:
        assert grades[r["student"]]["score"] == r["score"], (grades[r["student"]], r)
    assert float(grades["wrong"]["score"]) == 2.0      # Part B only
    page = html.unescape(re.sub(r"<[^>]+>", " ", (out / "leaderboard.html").read_text(encoding="utf-8")))
    where = [page.index(s) for s in ("KV cache, fresh per prompt", "(no method given)", "one KV cache kept")]
    assert where == sorted(where), "the HTML page lists the entries in the CSV's order"
    assert "speed-up" in page and "no" in page


def test_leaderboard_rows_sort_and_read_the_report():
    """rows(): correct entries by speed-up, then the incorrect ones, then those without a record."""
    import nbformat

    class R:
        def __init__(self, student, rec, points, score=1.0):
            self.student, self.assignment, self.file, self.status = student, LAB, f"{student}.ipynb", "ok"
            self.score, self.max_score = score, 8.0
            self.project = {"method": student.upper(), "record": rec, "points": points, "max_points": 6.0}

    rec = lambda ok, ratio: {"correct": ok, "ratio": ratio, "q1": ratio, "q3": ratio, "min": ratio,  # noqa: E731
                             "max": ratio, "rounds": 5, "problem": "" if ok else "differ"}
    got = rows([R("slow", rec(True, 1.1), 0.0), R("none", None, None), R("cheat", rec(False, 9.0), 0.0),
                R("quick", rec(True, 3.0), 6.0)])
    assert [r["student"] for r in got] == ["quick", "slow", "cheat", "none"]
    assert [r["correct"] for r in got] == ["yes", "yes", "no", "no record"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Report\n\n**Method:**   int8   weights\n\n**What I measured:** x")]
    assert method_line(nb) == "int8 weights"
    nb.cells[0].source = "**Method:** the course's baseline (replace this with one line: what your `build` does)"
    assert method_line(nb) == ""
    # the record comes from the judge's part (plain data made in the grader), never from a printed line
    verdict = Verdict({"b": PartResult("b", 2.0), "t": PartResult("t", 6.0, record={"correct": True})})
    assert project_record(verdict) == ("t", {"correct": True})
    assert project_record(Verdict({"b": PartResult("b", 2.0)})) is None and project_record(None) is None
