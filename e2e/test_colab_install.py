"""The Colab install cell, run as Colab runs it (issue 20).

Every notebook and lab starts with a cell that, on Colab only, pip-installs the course at its release tag.
Here it runs in a Colab-like environment (tools/colab_env.py: Python 3.12, torch's CUDA build and
ipywidgets 7.7.1 preinstalled, Colab's IPython 7 kernel), with `google.colab` importable in the kernel and
the release URL replaced by a wheel built from this working tree. Then:

  * the install must keep every preinstalled package as it was (Colab's torch and ipywidgets stay put);
  * each lab's first cells (the install cell through the setup cells, up to the first exercise) must run;
  * one solved lab (the student version with the instructor's answers: no hidden tests) must pass its
    visible tests.

Run it with `make colab-test`. The first run builds the environment (about 3 minutes, mostly torch's
download) under build/colab/; later runs reuse it. Offline as the course is (COURSE_OFFLINE=1,
HF_HUB_OFFLINE=1); only pip reaches the package index. Without Python 3.12 it skips, except under CI=true.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from course_lib import INSTALL_SPEC, __version__
from course_grading.build import answer_sources, fill_answers, is_answer, is_test, lab_names, read_notebook

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("colab_env", ROOT / "tools" / "colab_env.py")
colab_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_env)

SOLVED_LAB = "lab06"  # quick on a CPU (about 6 s), and it runs course_lib's paged KV store
LABS = lab_names(ROOT / "labs")
# Colab imports google.colab in its kernel before any cell runs; the install cell looks for it there.
GOOGLE_COLAB_STUB = '"""A stand-in for Colab\'s module: its presence is what says "this is Colab"."""\n'

pytestmark = pytest.mark.slow


def log(msg: str) -> None:
    print(f"[colab-test] {msg}", file=sys.stderr, flush=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The course's wheel, built from this working tree as a release would be."""
    dist = ROOT / "build" / "dist"
    for old in dist.glob("course_lib-*.whl"):
        old.unlink()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(dist)],
                   check=True)
    (whl,) = dist.glob(f"course_lib-{__version__}-*.whl")
    log(f"wheel {whl.name} built in {time.perf_counter() - t0:.0f} s")
    return whl


@pytest.fixture(scope="module")
def colab():
    """A fresh Colab-like environment (a copy of the cached one) and a kernelspec running it, as Colab's:
    google.colab imported at start, offline, in a folder of its own (never the repository, whose
    course_lib/ would shadow the installed one)."""
    python = colab_env.find_python()
    if python is None:
        msg = "no Python 3.12 (~/.pyenv/versions/3.12.1/bin/python or python3.12 on PATH): Colab runs 3.12"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    t0 = time.perf_counter()
    base = colab_env.build(python, log=log)
    log(f"cached environment {base.name} ready in {time.perf_counter() - t0:.0f} s")
    for stale in base.parent.glob("run-*"):   # left by a run that was killed
        if not pid_alive(int(stale.name.split("-")[1])):
            shutil.rmtree(stale, ignore_errors=True)
    run = base.parent / f"run-{os.getpid()}"   # beside the cache: hard links stay on one file system
    venv = colab_env.copy(base, run / "venv")
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (site / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (site / "google" / "colab" / "__init__.py").write_text(GOOGLE_COLAB_STUB)
    kernels = run / "kernels"
    (kernels / "colab").mkdir(parents=True)
    (kernels / "colab" / "kernel.json").write_text(json.dumps({
        "argv": [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.exec_lines=import google.colab"],
        "display_name": "Python 3 (Colab-like)", "language": "python"}))
    # The kernel and the shell commands it starts (`!pip`) find the environment's pip first; nothing of
    # the developer's environment (PYTHONPATH to this tree, an activated venv) reaches them.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", COURSE_OFFLINE="1",
               HF_HUB_OFFLINE="1", COURSE_QUICK="1", COLAB_RELEASE_TAG="colab-like-test",
               PYDEVD_DISABLE_FILE_VALIDATION="1")   # quiets ipykernel 6.17's debugger about Python 3.12
    workdir = run / "content"   # Colab's working folder is /content
    workdir.mkdir()
    yield dict(venv=venv, kernels=kernels, env=env, workdir=workdir,
               freeze=(base / "freeze.txt").read_text())
    shutil.rmtree(run, ignore_errors=True)


def with_wheel(nb, whl: Path):
    """`nb` with its install cell installing `whl` instead of the release URL (the rest as on Colab)."""
    cell = nb.cells[1]
    assert INSTALL_SPEC in cell.source, f"cell 2 is not the install cell of {INSTALL_SPEC!r}:\n{cell.source}"
    nb.cells[1].source = cell.source.replace(INSTALL_SPEC, f"course_lib @ {whl.as_uri()}")
    return nb


def execute(nb, colab, timeout=600):
    """Run every cell of `nb` in the Colab-like kernel (raises on the first cell that fails)."""
    specs = KernelSpecManager(kernel_dirs=[str(colab["kernels"])])
    km = KernelManager(kernel_name="colab", kernel_spec_manager=specs)
    client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=False,
                            resources={"metadata": {"path": str(colab["workdir"])}})
    try:
        client.execute(env=colab["env"])
    finally:   # nbclient leaves a kernel it did not create running
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return nb


def code(src: str):
    return nbformat.v4.new_code_cell(src)


def outputs_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


# Appended to every run: where the course and `!pip` came from, and what is installed.
WHERE = code("import json, shutil, sys, importlib.metadata as md, course_lib.env\n"
             "print(json.dumps({'file': course_lib.__file__, 'pip': shutil.which('pip'), 'prefix': sys.prefix,\n"
             "                  'python': sys.version_info[:2], 'colab': course_lib.env.in_colab(),\n"
             "                  'versions': {d.metadata['Name'].lower(): d.version for d in md.distributions()}}))")


def where(nb) -> dict:
    info = json.loads(outputs_text(nb.cells[-1]))
    for what in ("file", "pip"):
        assert info[what].startswith(info["prefix"] + "/"), \
            f"{what}: {info[what]} is not in the Colab-like environment {info['prefix']}"
    assert info["python"] == [3, 12], info["python"]
    return info


def test_install_cell_installs_the_course_and_keeps_colabs_packages(colab, wheel):
    lab = read_notebook(ROOT / "labs" / "lab00.ipynb")
    nb = nbformat.v4.new_notebook(cells=[with_wheel(lab, wheel).cells[1], WHERE])
    t0 = time.perf_counter()
    execute(nb, colab)
    log(f"install cell and check ran in {time.perf_counter() - t0:.0f} s")
    pip_says = outputs_text(nb.cells[0])
    assert "ERROR" not in pip_says, f"pip reported an error installing the course:\n{pip_says}"
    info = where(nb)
    assert info["versions"]["course_lib"] == __version__ and info["colab"] is True
    before = dict(line.split("==", 1) for line in colab["freeze"].splitlines() if "==" in line)
    before = {k.lower(): v for k, v in before.items()}
    assert before["torch"] == colab_env.TORCH.split("==")[1] and before["ipywidgets"] == "7.7.1"
    changed = {k: f"{v} -> {info['versions'].get(k, 'removed')}" for k, v in before.items()
               if info["versions"].get(k) != v}
    assert not changed, f"the install cell changed Colab's preinstalled packages: {changed}"
    added = sorted(set(info["versions"]) - set(before))
    log(f"the install cell added: {', '.join(added)}")


def first_cells(name: str):
    """The lab's cells from the badge through its setup, up to (not including) the first exercise."""
    nb = read_notebook(ROOT / "labs" / f"{name}.ipynb")
    first = next(i for i, c in enumerate(nb.cells) if is_answer(c))
    nb.cells = nb.cells[:first]
    return nb


@pytest.mark.parametrize("name", LABS)
def test_lab_first_cells_run_on_colab(name, colab, wheel):
    nb = with_wheel(first_cells(name), wheel)
    assert sum(c.cell_type == "code" for c in nb.cells) >= 2, f"{name}: no setup cell before the first exercise"
    nb.cells.append(WHERE)
    t0 = time.perf_counter()
    execute(nb, colab)
    log(f"{name}: first {len(nb.cells) - 1} cells in {time.perf_counter() - t0:.0f} s")
    assert where(nb)["colab"] is True, f"{name}: course_lib.env.in_colab() is not True in the Colab-like kernel"


def test_solved_lab_passes_its_visible_tests_on_colab(colab, wheel):
    """The student version (nbgrader's release: hidden tests already removed) with the instructor's
    answers filled in, every cell run."""
    lab = read_notebook(ROOT / "labs" / f"{SOLVED_LAB}.ipynb")
    nb = with_wheel(fill_answers(lab, answer_sources(read_notebook(ROOT / "solutions" / f"{SOLVED_LAB}.ipynb"))),
                    wheel)
    tests = [c for c in nb.cells if is_test(c)]
    assert tests, f"{SOLVED_LAB} has no visible test cell"
    assert not any("HIDDEN TESTS" in c.source for c in nb.cells), f"labs/{SOLVED_LAB}.ipynb holds hidden tests"
    nb.cells.append(WHERE)
    t0 = time.perf_counter()
    execute(nb, colab)
    log(f"{SOLVED_LAB} solved: {len(tests)} test cells passed in {time.perf_counter() - t0:.0f} s")
    where(nb)
    assert all(c.get("execution_count") for c in tests), "a test cell did not run"
