"""The repository's own promises: two README commands that CI runs, consistent dependency lists."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_installs_this_package_with_pyprojects_extras():
    yml = (ROOT / "environment.yml").read_text()
    pip_lines = re.findall(r"^\s*-\s+(-e\s+\S+|\S+)\s*$", yml.split("pip:")[1], re.M)
    assert pip_lines == ["-e .[dev]"], f"environment.yml pip section: {pip_lines}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "dev" in extras
    py = re.search(r"python=(3\.\d+)", yml).group(1)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert tuple(map(int, py.split("."))) >= tuple(map(int, requires.strip(">=").split(".")))


def test_torch_is_never_pinned_and_flash_attn_is_optional():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = [d for d in proj["dependencies"] if d.startswith("torch")]
    assert torch_req and "==" not in torch_req[0], torch_req
    assert not any("flash" in d for d in proj["dependencies"])
    assert not any("nbgrader" in d for d in proj["dependencies"]), "nbgrader must not be a student dependency"
    assert any("ipywidgets>=7.6" in d for d in proj["dependencies"])


def test_readme_has_exactly_two_newcomer_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start")[1].split("\n## ")[0]
    cmds = re.findall(r"^\s*(make \S+)\s*$", quick, re.M)
    assert cmds == ["make course", "make test"], cmds
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_every_notebook_and_lab_has_a_colab_badge_in_readme():
    from course_lib import colab_url
    readme = (ROOT / "README.md").read_text()
    for nb in sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("labs/*.ipynb")]):
        rel = nb.relative_to(ROOT).as_posix()
        assert f"({colab_url(rel)})" in readme, f"README has no Colab badge for {rel} at {colab_url(rel)}"


def test_one_published_location_and_release_everywhere():
    """course_lib says where the course is published and which release students get; every badge (README,
    notebooks, labs) opens that release and every install cell installs the library at the same tag."""
    import nbformat
    from course_lib import INSTALL_SPEC, RELEASE, REPO, __version__, colab_url
    assert RELEASE == f"v{__version__}" and INSTALL_SPEC.endswith(f"@{RELEASE}")
    readme = (ROOT / "README.md").read_text()
    linked = re.findall(r"https://colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/(\S+?\.ipynb)",
                        readme)
    assert linked, "README has no Colab badge"
    for repo, ref, rel in linked:
        assert (repo, ref) == (REPO, RELEASE), f"README links {rel} at {repo}@{ref}, not {REPO}@{RELEASE}"
        assert (ROOT / rel).exists(), f"README links {rel}, which does not exist"
    for nb_path in sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"),
                           *ROOT.glob("labs/*.ipynb")]):
        nb = nbformat.read(str(nb_path), as_version=4)
        rel = nb_path.relative_to(ROOT).as_posix()
        assert f"({colab_url(rel)})" in nb.cells[0].source, f"{rel}: the badge is not {colab_url(rel)}"
        installs = re.findall(r'pip install -q "([^"]+)"', nb.cells[1].source)
        assert installs == [INSTALL_SPEC], f"{rel}: the install cell installs {installs}, not [{INSTALL_SPEC!r}]"


def test_notebooks_start_with_badge_install_and_parameters_cells():
    import nbformat
    for nb_path in sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"),
                           *ROOT.glob("labs/*.ipynb")]):
        nb = nbformat.read(str(nb_path), as_version=4)
        rel = nb_path.relative_to(ROOT).as_posix()
        assert "colab-badge.svg" in nb.cells[0].source and rel in nb.cells[0].source, rel
        assert "google.colab" in nb.cells[1].source, f"{rel}: cell 2 must be the Colab-only install cell"
        assert nb.metadata["kernelspec"]["name"] == "python3", rel
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, f"{rel}: outputs not stripped"
        if nb_path.parent.name == "notebooks":
            tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
            assert len(tagged) == 1, f"{rel}: needs exactly one cell tagged 'parameters'"


def test_syllabus_lists_all_thirteen_modules_and_existing_files():
    syl = (ROOT / "syllabus.md").read_text()
    nums = re.findall(r"^## Module (\d\d)", syl, re.M)
    assert nums == [f"{i:02d}" for i in range(13)], nums
    for nb in ROOT.glob("notebooks/*.ipynb"):
        assert nb.name in syl, f"syllabus.md does not mention {nb.name}"


def test_syllabus_states_hours_per_module_that_add_up():
    """Every module states its notebook's and its lab's hours; the project its range; the total the
    introduction gives is their sum (a graduate track: 60 to 90 hours)."""
    syl = (ROOT / "syllabus.md").read_text()
    times = re.findall(r"^- Time: about ([\d.]+) h \(notebook ([\d.]+) h, lab ([\d.]+) h\)", syl, re.M)
    assert len(times) == 13, f"{len(times)} modules state '- Time: about T h (notebook N h, lab L h)', expected 13"
    for t, nb, lab in times:
        assert float(t) == float(nb) + float(lab), f"'about {t} h' is not notebook {nb} h + lab {lab} h"
    project = re.search(r"the final project ([\d.]+)[-–]([\d.]+) h", syl)
    assert project, "the project's hours (the final project A-B h) are not stated"
    lo = sum(float(t) for t, _, _ in times) + float(project.group(1))
    hi = sum(float(t) for t, _, _ in times) + float(project.group(2))
    total = re.search(r"In all, about ([\d.]+)[-–]([\d.]+) hours", syl)
    assert total and (float(total.group(1)), float(total.group(2))) == (lo, hi), \
        f"the syllabus states {total and total.group(0)!r}; the modules and the project add up to {lo:g}-{hi:g}"
    assert 60 <= lo and hi <= 90, f"{lo:g}-{hi:g} hours: a graduate track is 60 to 90"


def test_course_console_script_help():
    out = subprocess.run([sys.executable, "-m", "course_lib.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "doctor" in out.stdout and "grade" in out.stdout


def test_doctor_reports_and_succeeds_here():
    out = subprocess.run([sys.executable, "-m", "course_lib.cli", "doctor"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for key in ("torch", "notebook mode", "real bf16", "flash-attn", "triton", "bitsandbytes", "colab", "model tiny"):
        assert key in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("The course can run here, notebooks in "), last
    import torch
    if not torch.cuda.is_available():
        assert "quick mode" in last
        triton = next(line for line in out.stdout.splitlines() if line.split()[1:2] == ["triton"])
        assert "no CUDA GPU" in triton or "not installed" in triton, triton
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return
    nf4 = next(line for line in out.stdout.splitlines() if "bitsandbytes nf4" in line)
    assert nf4.split()[0] == "ok" and "688x256 takes the dequantize path" in nf4, nf4


def test_doctor_fails_when_the_bundled_model_is_broken(monkeypatch, capsys):
    from course_lib import doctor, models
    monkeypatch.setattr(models, "BUNDLED_ROOT", Path("/nonexistent"))
    monkeypatch.setattr(doctor, "triton_plan", lambda: None)      # its smoke subprocess is beside the point here
    assert doctor.main([]) == 1
    assert "broken" in capsys.readouterr().out


def test_t4_has_no_real_bf16(monkeypatch):
    import torch

    from course_lib import env
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert env.real_bf16() is False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert env.real_bf16() is True


@pytest.mark.parametrize("bad", ["cuda:0"])
def test_device_asks_for_missing_cuda(bad):
    import torch

    from course_lib import env
    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    with pytest.raises(ValueError, match="CUDA"):
        env.device(bad)


def test_make_course_opens_copies_of_notebooks_and_labs_without_instructor_tools(tmp_path):
    """make course: the student environment (no nbgrader), doctor and JupyterLab offline, JupyterLab on a
    working folder holding copies of notebooks/ and labs/, --allow-root exactly when run as root."""
    import os
    work = tmp_path / "w"
    plan = subprocess.run(["make", "-n", "-B", "course", f"WORK={work}"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    assert '-e ".[course]"' in plan and ".[dev]" not in plan, plan
    doctor = next(line for line in plan.splitlines() if "course doctor" in line)
    lab = next(line for line in plan.splitlines() if "jupyter lab" in line)
    assert "COURSE_OFFLINE=1" in doctor and "COURSE_OFFLINE=1" in lab
    assert lab.rstrip().endswith(str(work)), lab
    assert ("--allow-root" in lab) == (os.getuid() == 0)
    # the copies: made once, never overwritten
    subprocess.run(["make", "-s", "workdir", f"WORK={work}"], cwd=ROOT, check=True, capture_output=True)
    copies = sorted(p.relative_to(work).as_posix() for p in work.rglob("*.ipynb"))
    tracked = sorted(p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("notebooks/*.ipynb"),
                                                              *ROOT.glob("labs/*.ipynb")])
    assert copies == tracked
    mine = work / tracked[0]
    mine.write_text("my work")
    again = subprocess.run(["make", "-s", "workdir", f"WORK={work}"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout
    assert mine.read_text() == "my work" and f"kept your {work}/{tracked[0]}" in again


def test_student_extras_have_no_instructor_tools_and_dev_has_all_of_them():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(d.startswith(("nbgrader", "pytest", "nbclient")) for d in extras["course"]), extras["course"]
    assert set(extras["course"]) <= set(extras["dev"])
    assert set(extras["grading"]) <= set(extras["dev"])
    assert any(d.startswith("nbgrader") for d in extras["grading"]), extras["grading"]


def test_the_distribution_holds_the_library_and_the_grading_pipeline_apart():
    """One pyproject installs two packages: course_lib (what students and labs import; `course_lib.checks`
    is a lab's only grading import) and course_grading (the instructor's pipeline, its dependencies the
    grading extra)."""
    from setuptools import find_packages
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(str(ROOT), include=find["include"])
    assert {"course_lib", "course_lib.models", "course_grading"} <= set(found), found
    assert not [p for p in found if p.startswith("course_grading.")], "course_grading is one flat package"
    assert (ROOT / "course_grading" / "jail.py").is_file()
    assert not list((ROOT / "course_lib" / "grading").glob("*.py")), "the pipeline lives in course_grading/"
    for lab in sorted(ROOT.glob("solutions/lab*.py")):
        imports = set(re.findall(r"^\s*(?:from|import) (course_\w+(?:\.\w+)*)", lab.read_text(), re.M))
        assert imports and not {m for m in imports if m.startswith("course_grading")}, (lab.name, imports)
        assert "course_lib.checks" in imports, (lab.name, imports)


@pytest.mark.parametrize("cmd", ["grade", "build-labs"])
def test_grading_commands_say_how_to_install_the_pipeline(cmd):
    """Without the grading extra (nbgrader missing), `course grade` / `build-labs` stop with what to install,
    not a traceback."""
    code = ("import sys; sys.modules['nbgrader'] = None  # as if not installed\n"
            f"from course_lib.cli import main; sys.exit(main([{cmd!r}, '--help']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    assert 'pip install "course_lib[grading]"' in out.stderr and "make setup-dev" in out.stderr, out.stderr
    assert "nbgrader" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_quick_mode_follows_the_device_unless_forced(monkeypatch):
    from course_lib import env
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    for cuda, quick in ((False, True), (True, False)):
        monkeypatch.setattr(env.torch.cuda, "is_available", lambda c=cuda: c)
        assert env.quick() is quick
        monkeypatch.setenv("COURSE_QUICK", "0")
        assert env.quick() is False
        monkeypatch.setenv("COURSE_QUICK", "1")
        assert env.quick() is True
        monkeypatch.delenv("COURSE_QUICK")


def test_notebook_time_budget_fails_the_run(tmp_path):
    """The root conftest runs each notebook in notebooks/ as one test (nbclient, tools/nbexec.py): a failing
    cell fails it with the cell's source and traceback; a notebook that runs through leaves its executed
    copy in build/executed/, recording the tracked file's sha256; and the run fails (exit status 1, the
    notebook named) when one notebook's kernel uses more than COURSE_NOTEBOOK_BUDGET_S seconds of CPU time.
    Wall time is reported but not budgeted: a notebook that waits (as one on a busy machine waits for a
    core) stays within budget however long it takes."""
    import os

    import nbformat
    (tmp_path / "pytest.ini").write_text("[pytest]\n")   # rootdir: tmp_path, so notebooks/ is its notebooks folder
    (tmp_path / "notebooks").mkdir()
    for name, source in (("spinner",
                          "import time\nt = time.process_time()\nwhile time.process_time() - t < 3.0:\n    pass"),
                         ("sleeper", "import time; time.sleep(4.0)"),
                         ("broken", "x = 1\nraise ValueError('planted')")):
        nb = nbformat.v4.new_notebook()
        nb.metadata.kernelspec = {"display_name": "Python 3", "language": "python", "name": "python3"}
        nb.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, tmp_path / "notebooks" / f"{name}.ipynb")

    def run(budget, *paths):
        env = {**os.environ, "COURSE_NOTEBOOK_BUDGET_S": budget, "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                               *paths], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    def row(out, name):   # "  wall s   CPU s  notebook" of the summary
        line = next(ln for ln in out.splitlines() if ln.rstrip().endswith(f"notebooks/{name}.ipynb")
                    or f"notebooks/{name}.ipynb  OVER" in ln)
        return [float(x) for x in line.split()[:2]]
    over = run("2.0", "notebooks")   # the spinner burns 3 CPU seconds; the sleeper 4 s of wall, little CPU
    assert over.returncode == 1 and "spinner.ipynb  OVER BUDGET" in over.stdout, over.stdout
    assert "sleeper.ipynb  OVER BUDGET" not in over.stdout and "2 CPU-second budget" in over.stdout, over.stdout
    assert "1 failed, 2 passed" in over.stdout, over.stdout
    (w_spin, c_spin), (w_sleep, c_sleep) = row(over.stdout, "spinner"), row(over.stdout, "sleeper")
    assert c_spin >= 3.0 and w_spin >= 3.0 and w_sleep >= 4.0 and c_sleep < 2.0, over.stdout
    failure = over.stdout.split("broken.ipynb: cell 1 of 1 failed")[1]
    assert "raise ValueError('planted')" in failure and "ValueError: planted" in failure, over.stdout
    assert not (tmp_path / "build" / "executed" / "broken.ipynb").exists()
    within = run("120", "notebooks/spinner.ipynb")
    assert within.returncode == 0 and "OVER BUDGET" not in within.stdout, within.stdout
    copy = nbformat.read(tmp_path / "build" / "executed" / "spinner.ipynb", as_version=4)
    from tools import nbexec
    spinner = tmp_path / "notebooks" / "spinner.ipynb"
    assert copy.metadata[nbexec.META_KEY]["source_sha256"] == nbexec.source_sha256(spinner)
    assert copy.cells[0].execution_count == 1


def _root_conftest():
    import importlib.util
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    return root


def test_kernel_cpu_counts_a_child_the_kernel_never_waited_for(tmp_path):
    """A process the kernel started and never waited for (as a fork server with its gloo ranks, which
    ipykernel terminates at shutdown without waiting) is missing from the kernel's own resource usage; the
    sampled process tree still counts it.

    The child runs in its own session, so that no signal meant for the kernel's process group (nbclient's
    interrupt, ipykernel's shutdown) ends it while the kernel lives: a child that died first could be reaped
    by its Popen object's finalizer at the kernel's exit, and its time would then be counted as waited for
    (CI saw that once). It is killed here, after the kernel is gone."""
    import signal

    import nbclient
    import nbformat
    pytest.importorskip("psutil")
    done, pid_file = tmp_path / "burnt", tmp_path / "pid"
    burn = (f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            f"t = time.process_time()\nwhile time.process_time() - t < 2.0:\n    pass\n"
            f"open({str(done)!r}, 'w').close()\ntime.sleep(120)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        f"import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {burn!r}], start_new_session=True)\n"
        f"import os\nwhile not os.path.exists({str(done)!r}):\n    time.sleep(0.1)\ntime.sleep(0.6)")]
    root = _root_conftest()
    try:
        with root.KernelTreeCPU() as cpu:
            r0 = root.children_cpu_s()
            nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
            waited = root.children_cpu_s() - r0
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert waited < 2.0 <= cpu.seconds, (waited, cpu.seconds)


def test_notebook_budget_accounting_on_recorded_numbers():
    """The budget is checked against CPU seconds, wall seconds only where no CPU time was measured. The
    numbers: notebook 05 measured quiet and beside two busy loops (before OMP_WAIT_POLICY=PASSIVE: 294 s
    wall under load; CPU time is what the budget reads)."""
    root = _root_conftest()
    wall = {"nb/05.ipynb": 294.0, "nb/03.ipynb": 30.0, "nb/win.ipynb": 130.0}
    cpu = {"nb/05.ipynb": 70.0, "nb/03.ipynb": 125.0}
    assert root.budgeted_seconds(wall, cpu) == {"nb/05.ipynb": 70.0, "nb/03.ipynb": 125.0, "nb/win.ipynb": 130.0}
    assert root.over_budget(wall, cpu, 120.0) == {"nb/03.ipynb": 125.0, "nb/win.ipynb": 130.0}
    assert root.over_budget(wall, cpu, 200.0) == {}
    assert root.children_cpu_s() is None or root.children_cpu_s() >= 0
