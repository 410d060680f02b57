"""A Colab-like Python environment for the install test (e2e/test_colab_install.py).

Colab gives students Python 3.12 with torch (a CUDA build), ipywidgets 7.7.1 and a few hundred other
packages already installed; the first cell of every notebook and lab then pip-installs the course on top.
This builds that starting point once, as a virtual environment cached under build/colab/ and keyed on its
inputs (the interpreter's version and the package list below), and hands each test run a throwaway copy:

    python tools/colab_env.py                 # build (or find) the cached environment, print its path
    python tools/colab_env.py --copy DEST     # and a fresh copy of it at DEST, for one run to install into
                                              # (on the cache's file system)

The copy is made of hard links (seconds, no extra disk): pip and Python replace files by unlinking and
writing anew, so what a run installs or upgrades never reaches the cached environment.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# COLAB_ENV_CACHE puts it elsewhere, e.g. outside a CI run's fresh clone, so that later runs find it.
CACHE = Path(os.environ.get("COLAB_ENV_CACHE") or ROOT / "build" / "colab")
# Colab's Python 3.12 runtime as the course last saw it (`!pip list` there). torch comes first and alone,
# as on Colab; on PyPI only its CUDA build exists for Python 3.12 (about 5 GB installed).
TORCH = "torch==2.13.0"
# What Colab preinstalls that the course relies on: its widget and kernel stack (IPython 7, ipykernel 6.17,
# classic notebook 6.5 for widgetsnbextension 3) and the course's dependencies that Colab has. The
# course's other dependencies (tokenizers and safetensors come with transformers) are left for the
# install cell to bring.
PREINSTALLED = [
    "ipywidgets==7.7.1",
    "ipykernel==6.17.1",
    "ipython==7.34.0",
    "notebook==6.5.7",
    "numpy==2.0.2",
    "matplotlib==3.10.0",
    "tqdm==4.67.1",
    "transformers==4.57.1",
]
SCHEMA = 2  # bump when the way the environment is built changes


def find_python() -> str | None:
    """A Python 3.12 interpreter: pyenv's 3.12.1, or `python3.12` on PATH; None when there is none."""
    candidates = [Path.home() / ".pyenv/versions/3.12.1/bin/python", shutil.which("python3.12")]
    for exe in candidates:
        if exe and Path(exe).is_file():
            out = subprocess.run([str(exe), "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                                 capture_output=True, text=True)
            if out.stdout.strip() == "True":
                return str(exe)
    return None


def env_key(python: str) -> str:
    """What the cached environment depends on: the interpreter's exact version and the package list."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    text = json.dumps([SCHEMA, version, TORCH, PREINSTALLED])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _pip(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args], check=True)


def build(python: str, cache: Path = CACHE, log=print) -> Path:
    """The cached Colab-like environment for `python`, built if missing (minutes: torch's CUDA build)."""
    venv = cache / f"py312-{env_key(python)}"
    if (venv / ".complete").is_file():
        return venv
    # An unfinished build (interrupted) or environments of older inputs (5 GB each) are removed.
    if cache.is_dir():
        for old in cache.glob("py312-*"):
            shutil.rmtree(old)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # Built in place: a virtual environment's scripts name its own path, so it cannot be moved.
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    _pip(venv, "--upgrade", "pip")
    _pip(venv, TORCH)
    t_torch = time.perf_counter() - t0
    constraint = venv / "torch-constraint.txt"
    constraint.write_text(TORCH + "\n")  # nothing below may move torch
    _pip(venv, "-c", str(constraint), *PREINSTALLED)
    freeze = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"], capture_output=True,
                            text=True, check=True).stdout
    (venv / "freeze.txt").write_text(freeze)
    (venv / ".complete").write_text(f"torch {t_torch:.0f} s, all {time.perf_counter() - t0:.0f} s\n")
    log(f"built {venv} in {time.perf_counter() - t0:.0f} s (torch {t_torch:.0f} s)")
    return venv


def copy(venv: Path, dest: Path) -> Path:
    """A fresh copy of the environment `venv` at `dest` (which must not exist), made of hard links."""
    venv, dest = Path(venv).resolve(), Path(dest).resolve()
    if not (venv / ".complete").is_file():
        raise ValueError(f"venv={venv} is not a finished environment of tools/colab_env.py (no .complete)")
    if dest.exists():
        raise ValueError(f"dest={dest} exists; expected a path for a new environment")
    shutil.copytree(venv, dest, symlinks=True, copy_function=os.link)
    # The scripts in bin/ (pip, jupyter, ...) and pyvenv.cfg name the cached environment's path: rewrite
    # them for the copy, as new files (writing into a hard link would change the cached one too).
    old, new = str(venv).encode(), str(dest).encode()
    for f in [*(dest / "bin").iterdir(), dest / "pyvenv.cfg"]:
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            if old in data:
                mode = f.stat().st_mode
                f.unlink()
                f.write_bytes(data.replace(old, new))
                f.chmod(mode)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the environment is kept (build/colab)")
    ap.add_argument("--copy", type=Path, metavar="DEST", help="also make a fresh copy of it at DEST")
    args = ap.parse_args(argv)
    python = find_python()
    if python is None:
        print("no Python 3.12 found (~/.pyenv/versions/3.12.1/bin/python or python3.12 on PATH)",
              file=sys.stderr)
        return 2
    venv = build(python, args.cache)
    print(copy(venv, args.copy) if args.copy else venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
