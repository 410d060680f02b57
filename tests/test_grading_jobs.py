"""`course grade --jobs N`: the grades and files of --jobs 1, kernels that cannot reach each other.

Fast: --jobs parsing, --jobs auto within cores and memory, one sandbox user per job (never two jobs as
one user), the refusal at level process, the progress lines.
Slow: one small batch (a solution, a blank, a wrong answer, an attacker, two submissions that print the
user they run as) graded with --jobs 1 and --jobs 2: the same CSV, report (timings aside), feedback
pages and logs; with two jobs the kernels ran as the two users the grader named.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from course_grading import jobs
from course_grading.build import answer_sources, build_labs, fill_answers, notebook_text, read_notebook
from course_grading.pipeline import grade, grade_main
from course_grading.sandbox import Isolation

DATA = Path(__file__).parent / "data" / "solutions"


def test_parse_jobs():
    assert jobs.parse_jobs("3") == 3 and jobs.parse_jobs(2) == 2 and jobs.parse_jobs("AUTO") == "auto"
    for bad in ("0", "-1", "two", 0, True, 1.5):
        with pytest.raises(ValueError, match="--jobs must be a positive number or 'auto'"):
            jobs.parse_jobs(bad)


def test_auto_jobs_is_bounded(monkeypatch):
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(jobs, "_mem_available_gib", lambda: 40.0)
    assert jobs.auto_jobs(200, 8.0)[0] == 5      # memory: 40 GiB / 8 GiB per kernel
    assert jobs.auto_jobs(200, None)[0] == 8     # cores: 16 / 2 threads per kernel
    assert jobs.auto_jobs(3, 8.0)[0] == 3        # no more than the submissions
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: {0})
    assert jobs.auto_jobs(200, 8.0)[0] == 1


def test_one_sandbox_user_per_job(monkeypatch):
    iso = Isolation("user", uid=65534, gid=65534, user="nobody")
    slots, who = jobs.sandbox_slots(iso, 3)
    uids = [s.uid for s in slots]
    assert len(set(uids)) == 3 and uids[0] == 65534 and slots[0].gid == 65534, uids
    assert all(s.gid == s.uid for s in slots[1:]), slots  # no account: a group of its own too
    assert all(jobs.DYNAMIC_UIDS.start >= u > jobs.DYNAMIC_UIDS.stop for u in uids[1:])
    assert "each as its own user" in who and "no account" in who
    busy = uids[1]  # a uid some process runs as is never handed out
    monkeypatch.setattr(jobs, "_busy_uids", lambda: {busy})
    assert busy not in [s.uid for s in jobs.sandbox_slots(iso, 3)[0]]
    assert jobs.sandbox_slots(iso, 1) == ([iso], "")
    bw = Isolation("bwrap", bwrap="/usr/bin/bwrap")  # bubblewrap without root: namespaces of its own each
    slots, who = jobs.sandbox_slots(bw, 2)
    assert slots == [bw, bw] and "own bubblewrap namespaces" in who
    proc = Isolation("process")
    with pytest.raises(jobs.JobsError, match="could reach each other"):
        jobs.sandbox_slots(proc, 2)
    assert len(jobs.sandbox_slots(proc, 2, explicit_process=True)[0]) == 2


@dataclasses.dataclass
class R:
    """What the progress lines read of a graded submission."""
    student: str = "ann"
    assignment: str = "lab99"
    score: float | None = 5.0
    max_score: float | None = 5.0
    status: str = "ok"


def test_progress_lines():
    lines = []
    p = jobs.LineProgress(lines.append, 2)
    p.advance(R())
    p.advance(R(student="bo", score=None, status="error"))
    assert re.fullmatch(r"\[1/2\] lab99 ann: 5/5 ok  \(\d+s elapsed, about \d+s left\)", lines[0]), lines
    assert lines[1].startswith("[2/2] lab99 bo: - error")


def test_progress_bar():
    import io
    stream = io.StringIO()
    bar = jobs.BarProgress(2, stream=stream)
    bar.advance(R())
    bar.advance(R(student="bo"))
    bar.close()
    text = stream.getvalue()
    assert "2/2" in text and "lab99 bo: 5/5 ok" in text


def test_cli_refuses_bad_jobs(tmp_path, capsys):
    rc = grade_main([str(tmp_path), "--labs-release", str(tmp_path), "--solutions", str(DATA), "--jobs", "0", "-q"])
    assert rc == 2 and "--jobs must be a positive number" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# slow: the same batch at --jobs 1 and --jobs 2

WHOAMI = "import os\nprint('uid=%d' % os.getuid())\n\ndef add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("jobs")
    sols = base / "solutions"
    sols.mkdir()
    shutil.copyfile(DATA / "lab99.ipynb", sols / "lab99.ipynb")
    (base / "judges").mkdir()
    shutil.copyfile(DATA.parent / "judges" / "lab99.py", base / "judges" / "lab99.py")
    labs = base / "labs"
    build_labs(sols, labs)
    lab, a = read_notebook(labs / "lab99.ipynb"), answer_sources(read_notebook(sols / "lab99.ipynb"))
    subs = {"alice": fill_answers(lab, a), "bob": lab,
            "peggy": fill_answers(lab, {**a, "multiply_answer": "def multiply(a, b):\n    return a + b"}),
            "hook": fill_answers(lab, {**a, "add_answer": a["add_answer"] + "\nget_ipython().events.register("
                                       "'post_run_cell', lambda r: print(r.info.raw_cell))"}),
            "who1": fill_answers(lab, {**a, "add_answer": WHOAMI}),
            "who2": fill_answers(lab, {**a, "add_answer": WHOAMI})}
    sub = base / "subs"
    for name, nb in subs.items():
        (sub / name).mkdir(parents=True)
        (sub / name / "lab99.ipynb").write_text(notebook_text(nb))
    runs = {}
    for n in (1, 2):
        lines = []
        # not root: the kernels are the grader's own user (level process), which --jobs takes only when asked
        report = grade(sub, labs, sols, base / f"out{n}", timeout=30, jobs=n, echo=lines.append,
                       isolation=None if os.geteuid() == 0 else "process", secret_file=base / "class-secret")
        runs[n] = dict(report=report, out=base / f"out{n}", lines=lines)
    return runs


slow = pytest.mark.slow
SAME = ("alice", "bob", "peggy", "hook")   # who1/who2 print the user they ran as
_TIMING = re.compile(r"graded in [\d.]+ s \((\d+) kernel start\(s\)\)(, kernel as [^\n\"]*)?")


def _files(out: Path) -> dict:
    """Every output file (the cases are drawn from the class secret and the student's key: the same in both
    runs), the timing and the kernel's user left out."""
    return {str(p.relative_to(out)): _TIMING.sub("graded in T s", p.read_text(encoding="utf-8"))
            for p in sorted(out.rglob("*")) if p.is_file()}


def _report(out: Path) -> list:
    data = json.loads((out / "report.json").read_text())
    for r in data["results"]:
        r["messages"] = [_TIMING.sub("graded in T s", m) for m in r["messages"]]
        for k in ("log", "feedback"):
            r[k] = r[k] and str(Path(r[k]).relative_to(out))
    return data


@slow
def test_same_grades_and_files(two_runs):
    one, two = two_runs[1], two_runs[2]
    assert [(r.student, r.score, r.status, r.flags) for r in one["report"].results] == \
           [(r.student, r.score, r.status, r.flags) for r in two["report"].results]
    assert (one["out"] / "grades.csv").read_bytes() == (two["out"] / "grades.csv").read_bytes()
    a, b = _report(one["out"]), _report(two["out"])
    for x, y in zip(a["results"], b["results"]):
        if x["student"] not in SAME:
            x["cells"] = y["cells"] = None
        assert x == y, x["student"]
    fa, fb = _files(one["out"]), _files(two["out"])
    assert sorted(fa) == sorted(fb)
    for name in fa:
        if name.endswith(("report.json",)) or any(f"/{s}/" in f"/{name}" for s in ("who1", "who2")):
            continue
        assert fa[name] == fb[name], name
    # the controls graded right; the hook that prints every later cell sees no hidden test (there is none in
    # the kernel) and changes nothing: its answers are right
    by = {r.student: r for r in one["report"].results}
    assert (by["alice"].score, by["bob"].score, by["peggy"].score, by["hook"].score) == (5.0, 0.0, 3.0, 5.0)


@slow
def test_every_submission_runs_as_its_own_user(two_runs):
    """As root, each submission's kernel is a fresh user id (no account, no process), never another kernel's,
    whatever the jobs; without root, every kernel is the grader's own user (level process, asked for)."""
    lines = two_runs[2]["lines"]
    who = next((ln for ln in lines if ln.startswith("jobs: 2")), None)
    if os.geteuid() != 0:
        assert who and "grader's own user" in who, lines
    else:
        assert who and "each submission runs as a fresh user id" in who, lines
    for n in (1, 2):
        used = []
        for r in two_runs[n]["report"].results:
            said = [int(u) for m in r.messages for u in re.findall(r"kernel as uid (\d+)", m)]
            used += said
            if r.student.startswith("who"):
                uids = {int(u) for u in re.findall(r"uid=(\d+)", Path(r.feedback).read_text())}
                assert uids and (os.geteuid() != 0 or uids == set(said)), (n, r.student, uids, said)
        if os.geteuid() == 0:
            assert len(used) == 6 and len(set(used)) == 6, (n, used)   # six submissions, six users
            assert all(61184 <= u <= 65519 for u in used), used
    # progress: one line per submission, the last one says nothing is left
    progress = [ln for ln in lines if ln.startswith("[")]
    assert len(progress) == 6 and progress[-1].startswith("[6/6]") and "about 0s left" in progress[-1]
