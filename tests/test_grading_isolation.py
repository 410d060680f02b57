"""`course grade` against students who cheat: isolation, tricks on the checks, silent losses, safe names.

One grade run (module fixture) over two fixture labs: lab99 (tests/data/solutions, its judge in
tests/data/judges) and lab98, built here, whose visible tests use `check_close`/`check_equal` and whose judge
compares with a `course_lib` reference (withheld from the kernel's copy of the library). Each attack is a
submission; a victim graded after it and a decoy file outside the course folder show that nothing leaked. A
second, tiny run checks the notebook time budget.

The fast tests (no kernel) check the bwrap command line, --require-sandbox's refusal, safe names and
CSV escaping, the answer-after-test repair and the reference table.
"""
from __future__ import annotations

import csv
import hashlib
import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from course_grading import sandbox
from course_grading.autograde import csv_safe, file_keys
from course_grading.build import answer_sources, build_labs, fill_answers, grade_id, notebook_text, read_notebook
from course_grading.pipeline import grade, grade_main
from course_grading.references import answer_table, reference_imports
from course_grading.repair import repair

DATA = Path(__file__).parent / "data" / "solutions"
SLEEP_MARK = "4321.987"  # `sleep 4321.987`: the attacker's leftover processes, found by their command line


def code(src, **nbg):
    c = nbformat.v4.new_code_cell(src)
    if nbg:
        c.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False,
                                  "task": False, **nbg}
    return c


LAB98_JUDGE = '''
"""lab98's judge: scale on drawn integers, matmul_cost's intensity against course_lib's reference."""
from course_grading.judging import Judge
from course_lib.checks import check_close, check_equal
from course_lib.perf.ops import matmul_cost as ref_matmul_cost

judge = Judge(references={"cost_tests": ["course_lib.perf.ops.matmul_cost"]})


@judge.part("scale_tests")
def scale(t):
    for _ in range(10):
        k = t.rng.randint(2, 9)
        with t.case(f"scale({k}, 3)"):
            check_equal(t.call("scale", k, 3), 3 * k, f"scale({k}, 3)")


@judge.part("cost_tests")
def cost(t):
    for _ in range(5):
        m = t.rng.randint(1, 99)
        with t.case(f"matmul_cost({m}, 8, 8, 2)"):
            check_close(t.call("matmul_cost", m, 8, 8, 2)[2], ref_matmul_cost(m, 8, 8, 2).intensity, "intensity")
'''


def lab98_source():
    """A fixture lab whose visible tests use the check functions (its judge: LAB98_JUDGE)."""
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Lab 98: isolation fixture"),
        code("import random\nfrom course_lib.checks import check_close, check_equal"),
        code("def scale(x, k):\n    ### BEGIN SOLUTION\n    return x * k\n    ### END SOLUTION",
             grade_id="scale_answer", solution=True),
        code('check_close(scale(2, 3), 6, "scale(2, 3)")', grade_id="scale_tests", grade=True, locked=True, points=2),
        code("def matmul_cost(m, n, k, b):\n    ### BEGIN SOLUTION\n    f = 2 * m * n * k\n"
             "    nb = b * (m * k + k * n + m * n)\n    return f, nb, f / nb\n    ### END SOLUTION",
             grade_id="cost_answer", solution=True),
        code('check_equal(matmul_cost(1, 4096, 4096, 2)[0], 33_554_432, "matmul_cost FLOPs")', grade_id="cost_tests",
             grade=True, locked=True, points=2),
    ], metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}})


def write_nb(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return path


def sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def leftover_pids() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if SLEEP_MARK.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


# ---------------------------------------------------------------------------------------------------
# fast: no kernel

def test_require_sandbox_refuses_without_bwrap(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
        sandbox.probe(require_sandbox=True)
    with pytest.raises(sandbox.SandboxUnavailable, match="not installed"):
        sandbox.probe("bwrap")
    rc = grade_main([str(tmp_path), "--labs-release", str(tmp_path), "--solutions", str(DATA),
                     "--require-sandbox", "-q"])
    assert rc == 2 and "--require-sandbox" in capsys.readouterr().err


def test_bwrap_command_line(tmp_path):
    work, run = tmp_path / "work", tmp_path / "run"
    pkg = sandbox.course_lib_root() / "course_lib"
    argv = sandbox.bwrap_argv("/usr/bin/bwrap", work, run, pkg, marker="m1")
    joined = " ".join(argv)
    assert argv[0] == "/usr/bin/bwrap" and argv[-1] == "--"
    for flag in ("--die-with-parent", "--unshare-all", "--clearenv"):
        assert flag in argv
    # the kernel must stay in the jail's process group, or the grader's interrupts (SIGINT) miss it
    assert "--new-session" not in argv
    assert "--share-net" not in argv  # no network
    # writable: the scratch only; the course package read-only at a neutral path, not the repository
    binds = [(argv[k + 1], argv[k + 2]) for k, a in enumerate(argv) if a == "--bind"]
    assert binds == [(str(work), str(work)), (str(run), str(run))]
    ro = [(argv[k + 1], argv[k + 2]) for k, a in enumerate(argv) if a in ("--ro-bind", "--ro-bind-try")]
    assert (str(pkg), f"{sandbox.BWRAP_LIB}/course_lib") in ro
    # beside it the driver's copy (RunScratch puts only driver.py and wire.py there), no other package of the grader
    assert (str(pkg.parent / "course_grading"), f"{sandbox.BWRAP_LIB}/course_grading") in ro
    assert [dst for _, dst in ro if dst.startswith(sandbox.BWRAP_LIB)] == [f"{sandbox.BWRAP_LIB}/course_lib",
                                                                        f"{sandbox.BWRAP_LIB}/course_grading"]
    assert all(src != str(sandbox.course_lib_root()) for src, _ in ro), "the repository must not be visible"
    assert ("/", "/") not in ro
    assert f"--chdir {work}" in joined and "PYTHONPATH /opt/course" in joined
    assert "COURSE_GRADE_KERNEL m1" in joined
    assert "JPY_PARENT_PID 1" in joined  # ipykernel's "parent is init": no parent polling in the PID namespace
    # the spec the jail gets at this level runs bwrap in front of the kernel command
    iso = sandbox.Isolation("bwrap", bwrap="/usr/bin/bwrap")
    ks = sandbox.KernelScratch("s1", tmp_path, work, run, tmp_path / "tmp", tmp_path / "shm", tmp_path / "r.txt")
    spec = sandbox.kernel_spec(iso, ks, run / "kernel.json", "m1", 100, pkg)
    assert spec["bwrap"][:2] == ["/usr/bin/bwrap", "--die-with-parent"] and spec["rlimits"]["cpu"] == 100
    assert "as" in spec["rlimits"] and "fsize" in spec["rlimits"]


def test_safe_names_and_csv_escaping():
    keys = file_keys(["Ann Lee", "Ann_Lee", "ann lee", "bob", "..", "a/b"])
    assert len(set(keys.values())) == 6
    assert keys["bob"] == "bob" and keys["Ann Lee"].startswith("Ann_Lee-")
    assert all("/" not in k and not k.startswith(".") for k in keys.values())
    assert csv_safe("=HYPERLINK(1)") == "'=HYPERLINK(1)" and csv_safe("+1") == "'+1" and csv_safe("@x") == "'@x"
    assert csv_safe("-2") == "'-2" and csv_safe("alice") == "alice"


def test_reference_table_from_the_judge():
    t = answer_table(lab98_source(), {"cost_tests": ["course_lib.perf.ops.matmul_cost"]})
    assert t.tests == {"scale_tests": ["scale"], "cost_tests": ["matmul_cost"]}
    assert t.references["cost_tests"] == {"course_lib.perf.ops.matmul_cost"}
    cells = [code("from course_lib.perf.ops import matmul_cost"), code("from course_lib.perf import GPUS")]
    assert reference_imports(cells, t) == {"cost_tests": ["cell 0: from course_lib.perf.ops import matmul_cost"]}
    # a package above the reference's module that re-exports it
    assert reference_imports([code("from course_lib.perf import matmul_cost as mc")], t) == {
        "cost_tests": ["cell 0: from course_lib.perf import matmul_cost"]}

    # the library's private names: flagged for the tests whose answers the cell defines, or all of them
    cells = [code("from course_lib.perf.ops import _flops\ndef scale(x):\n    return x"),
             code("import course_lib.perf.hardware as o\nimport course_lib\ny = o._flops(1) + course_lib.perf._x\n"
                  "z = o.__name__"),
             code("from course_lib.checks import _private_helper")]
    got = reference_imports(cells, t)
    assert got == {"scale_tests": ["cell 0: from course_lib.perf.ops import _flops (a private name of the library)",
                                   "cell 1: course_lib.perf._x (a private name of the library)",
                                   "cell 1: o._flops (a private name of the library)"],
                   "cost_tests": ["cell 1: course_lib.perf._x (a private name of the library)",
                                  "cell 1: o._flops (a private name of the library)"]}, got
    # what the release's own cells do is never the student's doing
    assert reference_imports(cells[1:2], t, release_cells=cells[1:2]) == {}


def test_answer_below_its_test_is_moved_back():
    lab = read_notebook(DATA / "lab99.ipynb")
    nb = fill_answers(lab, answer_sources(lab))
    k = next(i for i, c in enumerate(nb.cells) if grade_id(c) == "multiply_answer")
    cell = nb.cells.pop(k)
    nb.cells.insert(k + 2, cell)  # below multiply_tests and multiply_hidden
    work, f = repair(nb, lab)
    order = [grade_id(c) for c in work.cells if grade_id(c)]
    assert order.index("multiply_answer") < order.index("multiply_tests")
    assert f.flags.get("answer_moved_before_test") == ["multiply_answer"] and f.repaired


# ---------------------------------------------------------------------------------------------------
# slow: one grade run with every attack

ATTACK = r'''
import os, subprocess, glob, sqlite3
def add(a, b):
    return a + b
_targets = {targets!r}
for _p in _targets:
    try:
        with open(_p, "w") as _fh:
            _fh.write("owned")
    except OSError as _e:
        print("blocked", _p, type(_e).__name__)
for _db in glob.glob("../../../gradebook.db") + glob.glob({workdir!r} + "/gradebook.db"):
    try:
        _c = sqlite3.connect(_db); _c.execute("UPDATE source_cells SET source = 'pass'"); _c.commit()
    except Exception as _e:
        print("blocked", _db, type(_e).__name__)
try:
    print(open("/proc/%d/cmdline" % os.getppid()).read())
except OSError:
    pass
subprocess.Popen(["sleep", "{mark}"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    subprocess.Popen(["sleep", "{mark}"])
    os._exit(0)
'''


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    base = tmp_path_factory.mktemp("isolation")
    sols = base / "solutions"
    sols.mkdir()
    shutil.copyfile(DATA / "lab99.ipynb", sols / "lab99.ipynb")
    write_nb(sols / "lab98.ipynb", lab98_source())
    (base / "judges").mkdir()
    shutil.copyfile(DATA.parent / "judges" / "lab99.py", base / "judges" / "lab99.py")
    (base / "judges" / "lab98.py").write_text(LAB98_JUDGE)
    labs = base / "labs"
    assert all(r.status == "written" for r in build_labs(sols, labs))
    l99, l98 = read_notebook(labs / "lab99.ipynb"), read_notebook(labs / "lab98.ipynb")
    a99, a98 = answer_sources(read_notebook(sols / "lab99.ipynb")), answer_sources(read_notebook(sols / "lab98.ipynb"))
    sub = base / "submissions"
    workdir = base / "work"
    decoy = base / "decoy.txt"
    decoy.write_text("the instructor's file\n")
    os.chmod(decoy, 0o644)
    victim = write_nb(sub / "zoe" / "lab99.ipynb", fill_answers(l99, a99))
    targets = [str(victim), str(labs / "lab99.ipynb"), str(sols / "lab99.ipynb"), str(decoy),
               str(base / "new_file_outside.txt")]
    # lab99: one attacker first, its victim last; the others are the silent losses and odd ids
    write_nb(sub / "aaron" / "lab99.ipynb", fill_answers(l99, {**a99, "add_answer": ATTACK.format(
        targets=targets, workdir=str(workdir), mark=SLEEP_MARK)}))
    write_nb(sub / "Ann Lee" / "lab99.ipynb", fill_answers(l99, a99))
    write_nb(sub / "Ann_Lee" / "lab99.ipynb", fill_answers(l99, {**a99, "clamp_answer": "import os\nos._exit(3)"}))
    moved = fill_answers(l99, a99)
    k = next(i for i, c in enumerate(moved.cells) if grade_id(c) == "multiply_answer")
    moved.cells.insert(k + 2, moved.cells.pop(k))
    write_nb(sub / "moved" / "lab99.ipynb", moved)
    write_nb(sub / "=HYPERLINK(1)" / "lab99.ipynb", fill_answers(l98, a98))  # the wrong lab
    # lab98: honest with a `_dev` helper (the judge must not clobber it), and the kernel tricks
    write_nb(sub / "helen" / "lab98.ipynb", fill_answers(l98, {
        "scale_answer": "_dev = 3\n\ndef scale(x, k):\n    return x * k",
        "cost_answer": "def matmul_cost(m, n, k, b):\n    f = 2 * m * n * k * (_dev - 2)\n"
                       "    nb = b * (m * k + k * n + m * n)\n    return f, nb, f / nb"}))
    wrong = {"scale_answer": "def scale(x, k):\n    return x + k",
             "cost_answer": "def matmul_cost(m, n, k, b):\n    return 0, 1, 0.0"}
    write_nb(sub / "rebind" / "lab98.ipynb", fill_answers(l98, {
        **wrong, "scale_answer": wrong["scale_answer"] + "\ncheck_close = check_equal = lambda *a, **k: None"}))
    write_nb(sub / "transformer" / "lab98.ipynb", fill_answers(l98, {
        **wrong, "scale_answer": wrong["scale_answer"] + "\nget_ipython().input_transformers_cleanup.append("
        "lambda lines: ['pass\\n'] if any('check_' in ln for ln in lines) else lines)"}))
    write_nb(sub / "refimport" / "lab98.ipynb", fill_answers(l98, {
        **a98, "cost_answer": "from course_lib.perf.ops import matmul_cost"}))
    write_nb(sub / "execsrc" / "lab98.ipynb", fill_answers(l98, {**wrong, "cost_answer": (
        "import json\nfor _p in ['../../../source/lab98/lab98.ipynb', '../../source/lab98/lab98.ipynb']:\n"
        "    try:\n        for _c in json.load(open(_p))['cells']:\n"
        "            if _c['cell_type'] == 'code':\n                exec(''.join(_c['source']))\n"
        "    except OSError:\n        pass")}))
    before = {"subs": tree(sub), "labs": tree(labs), "sols": tree(sols), "decoy": sha(decoy)}
    lines = []
    t0 = time.time()
    report = grade(sub, labs_release=labs, solutions=sols, out=base / "out", timeout=30, workdir=workdir,
                   echo=lines.append, secret_file=base / "class-secret")
    wall = time.time() - t0
    time.sleep(0.5)
    return dict(report=report, base=base, before=before, sub=sub, labs=labs, sols=sols, decoy=decoy,
                lines=lines, wall=wall, workdir=workdir)


slow = pytest.mark.slow


def res(attacked, student, lab=None):
    return attacked["report"].by_student(student, lab)


def protected(attacked) -> bool:
    return attacked["report"].isolation.startswith(("isolation: user", "isolation: bwrap"))


@slow
def test_isolation_level_is_printed(attacked):
    assert attacked["lines"][0].startswith("isolation: ")
    assert attacked["report"].isolation == attacked["lines"][0]
    if os.geteuid() == 0:
        assert protected(attacked), attacked["lines"][0]


@slow
def test_attacker_changes_nothing_outside_its_scratch(attacked):
    if not protected(attacked):
        pytest.skip("isolation level 'process' does not protect the grader's files: " + attacked["report"].isolation)
    b = attacked["before"]
    assert tree(attacked["sub"]) == b["subs"], "a submission was changed"
    assert tree(attacked["labs"]) == b["labs"] and tree(attacked["sols"]) == b["sols"], "the release or source changed"
    assert sha(attacked["decoy"]) == b["decoy"], "the decoy outside the course folder changed"
    assert not (attacked["base"] / "new_file_outside.txt").exists()
    assert res(attacked, "aaron").score == 5.0  # its own answers are right; it just cannot harm anyone


@slow
def test_victim_after_the_attacker_is_graded_right(attacked):
    if not protected(attacked):
        pytest.skip("isolation level 'process': the attacker can overwrite the victim's file")
    zoe = res(attacked, "zoe")
    assert (zoe.score, zoe.max_score, zoe.status) == (5.0, 5.0, "ok"), (zoe.flags, zoe.messages)


@slow
def test_no_process_of_the_batch_is_left(attacked):
    assert leftover_pids() == []


@slow
def test_the_judge_does_not_clobber_student_names(attacked):
    helen = res(attacked, "helen")
    assert (helen.score, helen.status) == (4.0, "ok"), (helen.cells, helen.flags, helen.messages)


@slow
def test_rebinding_the_checks_earns_nothing(attacked):
    """The checks run in the grader: what the kernel does to its own check functions changes nothing."""
    r = res(attacked, "rebind")
    assert r.score == 0.0, r.cells


@slow
def test_an_input_transformer_earns_nothing(attacked):
    r = res(attacked, "transformer")
    assert r.score == 0.0, r.cells


@slow
def test_reference_import_is_flagged_and_earns_nothing(attacked):
    """The answer imports the reference it is graded against: flagged for review, and in the kernel's copy of
    course_lib the reference is a stub that raises, so the part earns nothing."""
    r = res(attacked, "refimport")
    assert r.status == "review" and r.flags.get("reference_import") == ["cost_tests"], (r.flags, r.messages)
    assert any("course_lib" in m for m in r.messages)
    assert {c["grade_id"]: c["score"] for c in r.cells} == {"scale_tests": 2.0, "cost_tests": 0.0}, r.cells
    assert "withheld while this lab is graded" in " ".join(c.get("error", "") for c in r.cells), r.cells


@slow
def test_instructor_source_is_out_of_reach(attacked):
    r = res(attacked, "execsrc")
    assert r.score == 0.0, r.cells  # the source notebook was not found from the kernel's folder


@slow
def test_dead_kernel_keeps_earlier_points(attacked):
    r = res(attacked, "Ann_Lee")
    assert r.status == "review" and "kernel_died" in r.flags, (r.flags, r.messages)
    assert (r.score, r.max_score) == (4.0, 5.0), r.cells


@slow
def test_answer_after_its_test_is_restored(attacked):
    r = res(attacked, "moved")
    assert (r.score, r.status) == (5.0, "repaired") and "answer_moved_before_test" in r.flags, r.messages


@slow
def test_wrong_lab_is_named(attacked):
    r = res(attacked, "=HYPERLINK(1)")
    assert r.status == "review" and r.flags.get("wrong_lab") == ["lab98"], r.flags
    assert any("is lab98, not lab99" in m for m in r.messages)


@slow
def test_colliding_ids_and_formula_ids_are_safe(attacked):
    a, b = res(attacked, "Ann Lee"), res(attacked, "Ann_Lee")
    assert a.feedback and b.feedback is not None and a.feedback != b.feedback
    assert Path(a.feedback).exists() and Path(b.feedback).exists()
    assert a.log != b.log and Path(a.log).exists() and Path(b.log).exists()
    rows = list(csv.reader(open(attacked["base"] / "out" / "grades.csv", encoding="utf-8")))
    cells = [c for row in rows for c in row]
    assert "'=HYPERLINK(1)" in cells and not any(c.startswith(("=", "+", "@")) for c in cells)


@slow
def test_honest_submission_is_not_flagged(attacked):
    r = res(attacked, "Ann Lee")
    assert (r.score, r.status, r.flags) == (5.0, "ok", {}), r.messages


@slow
def test_time_budget(tmp_path):
    """Every function loops: the per-cell timeout would be paid once per test cell; the notebook's budget
    stops it, the cells after it score 0 and it is flagged."""
    sols = tmp_path / "solutions"
    sols.mkdir()
    shutil.copyfile(DATA / "lab99.ipynb", sols / "lab99.ipynb")
    labs = tmp_path / "labs"
    build_labs(sols, labs)
    lab = read_notebook(labs / "lab99.ipynb")
    loop = "def {}(*a):\n    while True:\n        pass"
    write_nb(tmp_path / "subs" / "looper" / "lab99.ipynb", fill_answers(lab, {
        "add_answer": loop.format("add"), "multiply_answer": loop.format("multiply"),
        "clamp_answer": loop.format("clamp")}))
    t0 = time.time()
    (tmp_path / "judges").mkdir()
    shutil.copyfile(DATA.parent / "judges" / "lab99.py", tmp_path / "judges" / "lab99.py")
    report = grade(tmp_path / "subs", labs, sols, tmp_path / "out", timeout=4, budget=6, feedback=False,
                   secret_file=tmp_path / "class-secret")
    wall = time.time() - t0
    r = report.by_student("looper")
    assert r.score == 0.0 and r.status == "review" and "time_budget" in r.flags, (r.flags, r.messages)
    assert wall < 60 + 4 * 4, wall
