"""The final project (solutions/lab13): its scale and statistic, the in-process evaluation students run, and
`course grade` judging entries from outside their process and writing the leaderboard.

The slow tests grade through real sandboxed kernels (bubblewrap where it runs, else the user level):

* ``test_cheats_earn_nothing_and_the_board_says_so``: the blank release (the course's baseline, the cached
  loop), two honest lossy entries (int8 weights in the cached loop: no faster on a CPU; the reference's forward
  on bf16-rounded weights: as fast as the reference) and the cheats that fooled the in-process evaluation
  (tests/data/project_entries.py): no cheat earns a speed point unflagged or ranks above an honest entry
  unflagged; the fast lossy entry earns its points; the board has its columns. Cost: twelve gradings of
  lab13, two at a time.
* ``test_the_blank_release_never_earns_a_point``: the blank release judged 20 times, each with prompts of its
  own, in the same two kernels (one grading's notebook run, twenty judgings): never a speed point, never a
  flag. Cost: about 20 x 8 calls of the baseline on each side.

Timing noise: the statistic is the geometric mean of the per-round ratios of CPU time with its 90% interval;
the points come from its lower end (``capstone.speedup_interval``). Measured on this project's 2-core machine,
20 judgings of the blank release beside a CPU-bound and a memory-bound loop: the per-round log-ratio of the
baseline (the cached loop) against itself had a standard deviation of 0.04-0.19, its intervals stayed within
0.85-1.14x with lower ends at most 1.03x, and the first half point needs 1.12x; the reference entry's lower ends
were 1.43-1.50x (full points from 1.3x).
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

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab13"
slow = pytest.mark.slow


def test_speed_points_scale():
    from course_lib.capstone import PROJECT_POINTS, RATIO_FLOOR, RATIO_FULL, speed_points
    assert (PROJECT_POINTS, RATIO_FLOOR, RATIO_FULL) == (6.0, 1.1, 1.3)   # as syllabus.md and the lab state them
    assert speed_points(1.0) == speed_points(1.1) == speed_points(float("nan")) == speed_points(0.5) == 0.0
    assert speed_points(1.3) == speed_points(3.7) == 6.0
    assert speed_points(math.sqrt(1.1 * 1.3)) == 3.0                    # half-way on a log scale: half the points
    assert speed_points(1.2) == math.floor(6 * math.log(1.2 / 1.1) / math.log(1.3 / 1.1) * 2) / 2
    pts = [speed_points(1.1 + k / 200) for k in range(60)]
    assert pts == sorted(pts) and all(p * 2 == int(p * 2) for p in pts)  # monotone, in half points
    with pytest.raises(ValueError, match="floor"):
        speed_points(2.0, floor=2.0, full=1.5)


def test_the_baseline_is_the_cached_greedy_loop():
    """baseline_build: generate's greedy tokens (with and without a cache), through a fresh KV cache per prompt
    (a prompt's tokens do not depend on the one before), one model call for the prompt and one per later token."""
    import torch

    from course_lib.capstone import baseline_build, project_prompts
    from course_lib.generation import generate
    from course_lib.models import load

    m, tok = load("tiny")
    a, b = project_prompts(tok, 2, 12, seed=4)
    base = baseline_build(m)
    with torch.inference_mode():
        want = {k: generate(m, p, 5).tokens.tolist() for k, p in (("a", a), ("b", b))}
        assert want["a"] == generate(m, a, 5, cache="contiguous").tokens.tolist()
        assert [base(a, 5).tolist(), base(b, 5).tolist(), base(a, 5).tolist()] == [want["a"], want["b"], want["a"]]
    seen = []
    hook = m.register_forward_pre_hook(lambda mod, args, kw: seen.append((args[0].shape[-1], kw["cache"])),
                                       with_kwargs=True)
    try:
        with torch.inference_mode():
            out = base(a, 5)
    finally:
        hook.remove()
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.dtype == torch.long
    assert [n for n, _ in seen] == [12, 1, 1, 1, 1] and len({id(c) for _, c in seen}) == 1, seen


def test_speedup_interval_is_the_t_interval_of_the_log_ratios():
    from course_lib.capstone import SpeedUp, _t_quantile, speedup_interval
    # Student's t quantiles (tables: 0.95 and 0.975 one-sided), the ones the grader's round counts use
    table = {1: (6.314, 12.706), 2: (2.920, 4.303), 3: (2.353, 3.182), 5: (2.015, 2.571), 9: (1.833, 2.262),
             29: (1.699, 2.045)}
    for df, (q95, q975) in table.items():
        assert _t_quantile(0.95, df) == pytest.approx(q95, rel=0.012) and \
            _t_quantile(0.975, df) == pytest.approx(q975, rel=0.012), df
    r = [2.0, 2.2, 1.9, 2.1, 2.05, 1.95]
    s = speedup_interval(r)
    logs = [math.log(x) for x in r]
    m = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
    half = 2.015 * sd / math.sqrt(len(logs))
    assert s.estimate == pytest.approx(math.exp(m)) and s.n == 6 and s.confidence == 0.9
    assert s.low == pytest.approx(math.exp(m - half), rel=1e-3) and s.high == pytest.approx(math.exp(m + half),
                                                                                            rel=1e-3)
    assert speedup_interval([x * 3 for x in r]).estimate == pytest.approx(3 * s.estimate)   # scale-free
    wide = speedup_interval([1.0, 4.0, 1.0, 4.0, 1.0, 4.0])
    assert wide.low < s.low < s.high < wide.high and wide.overlaps(s) and not s.overlaps(SpeedUp(3, 2.5, 3.5, 6))
    assert "90% interval" in str(s)
    for bad in ([2.0], [1.0, 0.0], [1.0, float("nan")], [1.0, -2.0]):
        with pytest.raises(ValueError, match="ratios"):
            speedup_interval(bad)
    with pytest.raises(ValueError, match="confidence"):
        speedup_interval(r, confidence=1.5)


def test_cpu_clock_reads_a_process_tree_from_outside():
    """The fallback clock of the grader (no cgroup): the CPU of a kernel's process tree, its children
    included, read from /proc; it never goes back when a process is gone."""
    import subprocess
    import time

    from course_grading.session import CpuClock

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    code = ("import subprocess, sys, time\n"
            f"subprocess.run([sys.executable, '-c', {burn.format(s=0.4)!r}])\n"   # a child, reaped: its CPU moves
            + burn.format(s=0.3) + "time.sleep(30)\n")                         # to the parent's count
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        clock = CpuClock((), None, lambda: p.pid)
        assert clock.kind == "proc"
        t0 = time.monotonic()
        first = clock()
        while clock() - first < 0.6 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        used = clock() - first
        assert 0.6 <= used <= 1.5, used       # the child's 0.4 s and the parent's 0.3 s (less what ran before)
    finally:
        p.kill()
        p.wait()
    after = clock()
    assert after >= first + used - 0.02      # the process is gone: what it used is kept


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


def _entries(reference: str):
    """tests/data/project_entries.py's entries, those built on the instructor's build_answer cell (`reference`)
    made whole."""
    sys.path.insert(0, str(ROOT / "tests" / "data"))
    try:
        from project_entries import ENTRIES, ON_THE_REFERENCE
    finally:
        sys.path.pop(0)
    return {**ENTRIES, **{name: (reference + source, method, kind)
                          for name, (source, method, kind) in ON_THE_REFERENCE.items()}}


@slow
def test_cheats_earn_nothing_and_the_board_says_so(tmp_path, capsys):
    release = read_notebook(ROOT / "labs" / f"{LAB}.ipynb")
    answers = answer_sources(read_notebook(ROOT / "solutions" / f"{LAB}.ipynb"))
    entries = _entries(answers["build_answer"])
    subs = tmp_path / "submissions"
    (subs / "blank").mkdir(parents=True)
    (subs / "blank" / f"{LAB}.ipynb").write_text(notebook_text(release), encoding="utf-8")
    for name, (source, method, _) in entries.items():
        (subs / name).mkdir(parents=True)
        nb = _submission(release, {**answers, "build_answer": source}, method)
        (subs / name / f"{LAB}.ipynb").write_text(notebook_text(nb), encoding="utf-8")
    out = tmp_path / "grades"
    rc = grade_main([str(subs), "--assignment", LAB, "--out", str(out), "--labs-release", str(ROOT / "labs"),
                     "--solutions", str(ROOT / "solutions"), "--secret-file", str(tmp_path / "secret"), "-q",
                     "--jobs", "2"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    with open(out / "leaderboard.csv", newline="", encoding="utf-8") as f:
        board = {r["student"]: r for r in csv.DictReader(f)}
    assert set(board) == {"blank"} | set(entries), board.keys()
    for r in board.values():
        assert r["clock"] in ("cgroup", "proc") and int(r["rounds"]) >= 6 and r["max_points"] == "6", r
        assert float(r["low"]) <= float(r["speedup"]) <= float(r["high"]), r
    # the blank release: the baseline against itself, correct, no point, no flag (not even for its own
    # `build = baseline_build`)
    blank = board["blank"]
    assert (blank["correct"], blank["points"], blank["status"], blank["flags"]) == ("yes", "0", "ok", ""), blank
    assert blank["method"] == "(no method given)"
    # the honest lossy entries: correct as lossy, their bits per byte within the bound; the fast one earns
    # speed points (the reference's forward clears the floor by far: 1.4-1.55x), the int8 one is correct
    from course_lib.capstone import RATIO_FLOOR
    for name in ("lossy_int8", "lossy_bf16_weights"):
        lossy = board[name]
        assert (lossy["correct"], lossy["lossy"], lossy["status"]) == ("yes", "yes", "ok"), lossy
    fast = board["lossy_bf16_weights"]
    assert float(fast["points"]) > 0 and float(fast["low"]) > RATIO_FLOOR, fast
    honest_fast = [r for name, r in board.items() if name in entries and entries[name][2] == "honest"
                   and float(r["points"] or 0) > 0]
    for name, (_, method, kind) in entries.items():
        r = board[name]
        assert r["method"] == method
        if kind != "cheat":
            continue
        # no cheat earns a speed point unless it is flagged for review ...
        assert float(r["points"] or 0) == 0 or r["status"] == "review", (name, r)
        # ... and none ranks above an honest entry that earned points without being flagged
        if r["status"] != "review":
            assert all(int(r["rank"]) > int(h["rank"]) for h in honest_fast), (name, r, honest_fast)
    # the two cheats aimed at the new measurement are seen: work in the background is charged and flagged,
    # made-up tokens behind forged logits are flagged (an instant answer, tokens the model does not agree with)
    assert board["background_spin"]["status"] == "review" and "background" in board["background_spin"]["flags"]
    assert float(board["background_spin"]["points"]) == 0
    forged = board["lossy_forged"]
    assert forged["status"] == "review" and "CPU" in forged["flags"] and "agrees" in forged["flags"], forged
    # the grades agree with the board: the speed cell's score is the board's points
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        grades = {r["student"]: r for r in csv.DictReader(f)}
    for r in board.values():
        assert grades[r["student"]]["score"] == r["score"], (grades[r["student"]], r)
    assert grades["lossy_forged"]["status"] == "review"
    page = html.unescape(re.sub(r"<[^>]+>", " ", (out / "leaderboard.html").read_text(encoding="utf-8")))
    assert "90% interval" in page and "review" in page and "int8 weight-only" in page


@slow
def test_the_blank_release_never_earns_a_point(tmp_path, monkeypatch):
    """20 judgings of the blank release, each with prompts of its own (another student key), in the same two
    kernels: the baseline against itself never earns a speed point and is never flagged."""
    import course_grading.autograde as autograde
    from course_grading.judging import judge_parts
    from course_lib.capstone import RATIO_FLOOR

    verdicts = []

    def twenty(judge, send, order, secret, lab, student, *a, **k):
        for n in range(20):
            verdicts.append(judge_parts(judge, send, [o for o in order if o[0] == "speed_tests"], secret, lab,
                                        f"{student}-{n}", *a, **k))
        return judge_parts(judge, send, order, secret, lab, student, *a, **k)
    monkeypatch.setattr(autograde, "judge_parts", twenty)
    subs = tmp_path / "submissions" / "blank"
    subs.mkdir(parents=True)
    (subs / f"{LAB}.ipynb").write_text((ROOT / "labs" / f"{LAB}.ipynb").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    report = autograde.grade(subs.parent, labs_release=ROOT / "labs", solutions=ROOT / "solutions",
                             out=tmp_path / "grades", workdir=tmp_path / "work", secret_file=tmp_path / "secret",
                             jobs=1, budget=3600)
    assert report.results[0].score == 0, report.results[0].messages
    assert len(verdicts) == 20
    records = [v.parts["speed_tests"].record for v in verdicts]
    seen = [(round(r["low"], 3), round(r["ratio"], 3), round(r["high"], 3), r["rounds"]) for r in records]
    for v, r in zip(verdicts, records):
        assert v.parts["speed_tests"].score == 0 and r["points"] == 0 and r["correct"], (r, seen)
        assert r["flags"] == [], (r, seen)
        assert r["low"] < RATIO_FLOOR and r["high"] > 0.8, (r, seen)   # an interval around 1x, not just a low one


def test_leaderboard_rows_sort_and_read_the_report():
    """rows(): correct entries by speed-up, then the incorrect ones, then those without a record."""
    import nbformat

    class R:
        def __init__(self, student, rec, points, score=1.0):
            self.student, self.assignment, self.file, self.status = student, LAB, f"{student}.ipynb", "ok"
            self.score, self.max_score = score, 8.0
            self.project = {"method": student.upper(), "record": rec, "points": points, "max_points": 6.0}

    rec = lambda ok, ratio: {"correct": ok, "ratio": ratio, "low": ratio * 0.95, "high": ratio * 1.05,  # noqa: E731
                             "rounds": 6, "problem": "" if ok else "differ", "flags": []}
    got = rows([R("slow", rec(True, 1.1), 0.0), R("none", None, None), R("cheat", rec(False, 9.0), 0.0),
                R("quick", rec(True, 3.0), 6.0)])
    assert [r["student"] for r in got] == ["quick", "slow", "cheat", "none"]
    assert [r["correct"] for r in got] == ["yes", "yes", "no", "no record"]
    assert [r["rank"] for r in got] == ["1", "2", "3", "4"] and not any(r["tie"] for r in got)
    assert [r["status"] for r in got] == ["ok", "ok", "not correct", "error"]
    # ranked by the interval that scores: below only the entries whose whole interval lies above; overlapping
    # intervals tie, listed by their lower end; a flagged entry keeps its rank and says why it needs a look
    iv = lambda lo, hi, flags=(): {"correct": True, "ratio": (lo * hi) ** 0.5, "low": lo, "high": hi,  # noqa: E731
                                   "rounds": 6, "flags": list(flags)}
    got = rows([R("a", iv(2.0, 2.4), 6.0), R("b", iv(2.3, 2.6), 6.0), R("c", iv(1.5, 2.1), 4.0),
                R("d", iv(3.0, 3.1, ["an entry call used 0.00 ms of CPU"]), 6.0)])
    assert [(r["student"], r["rank"], r["tie"], r["status"]) for r in got] == [
        ("d", "1", "", "review"), ("b", "2", "yes", "ok"), ("a", "2", "yes", "ok"), ("c", "3", "", "ok")], got
    assert "0.00 ms" in got[0]["flags"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Report\n\n**Method:**   int8   weights\n\n**What I measured:** x")]
    assert method_line(nb) == "int8 weights"
    nb.cells[0].source = "**Method:** the course's baseline (replace this with one line: what your `build` does)"
    assert method_line(nb) == ""
    # the record comes from the judge's part (plain data made in the grader), never from a printed line
    verdict = Verdict({"b": PartResult("b", 2.0), "t": PartResult("t", 6.0, record={"correct": True})})
    assert project_record(verdict) == ("t", {"correct": True})
    assert project_record(Verdict({"b": PartResult("b", 2.0)})) is None and project_record(None) is None
