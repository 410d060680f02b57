"""A throw-away nbgrader course directory, configured for this course, driven through nbgrader's API.

The course keeps its labs flat (``solutions/labNN.ipynb``), which is not nbgrader's layout
(``source/<assignment>/<notebook>.ipynb``), so every instructor command builds nbgrader's layout in a
working directory and runs nbgrader there; nothing nbgrader-specific is written into the repository.

Settings come from three places, later ones winning:
  1. the defaults below (`DEFAULTS`),
  2. ``nbgrader_config.py`` (the repository root's, or the one named with ``--config``),
  3. command-line flags (``--timeout``).
"""
from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import nbformat

#: Time limit of each cell and of each call of the judge when grading, in seconds (nbgrader's own default is 30 s).
DEFAULT_TIMEOUT = 60

#: The kernelspec every lab keeps (Colab and the course's environment both provide ``python3``).
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}

CONFIG_NAME = "nbgrader_config.py"


def find_config(explicit: str | os.PathLike | None, *near: str | os.PathLike) -> Path | None:
    """The nbgrader_config.py to use: the explicit one, else one in the working directory, else one
    next to (the parent of) any of `near` (e.g. the solutions folder, whose parent is the repo root)."""
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise FileNotFoundError(f"--config {explicit}: no such file")
        return p
    candidates = [Path.cwd() / CONFIG_NAME]
    for n in near:
        n = Path(n).resolve()
        candidates += [n / CONFIG_NAME, n.parent / CONFIG_NAME]
    for c in candidates:
        if c.is_file():
            return c
    return None


def make_config(root: Path, config_file: Path | None = None, timeout: float | None = None,
                extra=None):
    """A traitlets Config for an nbgrader course rooted at `root`."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    c = Config()
    c.Execute.timeout = DEFAULT_TIMEOUT
    c.Execute.interrupt_on_timeout = True
    c.Execute.execute_retries = 0
    # the kernel's own start-up warnings (e.g. "running over TCP without encryption") are noise here
    c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR"]
    if config_file is not None:
        loaded = PyFileConfigLoader(Path(config_file).name, path=str(Path(config_file).parent)).load_config()
        c.merge(loaded)
    # What the pipeline owns, whatever the file says.
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = "course"
    c.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]
    c.Exchange.root = str(root / "exchange")
    c.NbGraderAPI.log_level = "WARN"
    if timeout is not None:
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        c.Execute.timeout = max(1, round(timeout))
    if extra is not None:
        c.merge(extra)
    return c


class CourseDir:
    """An nbgrader course directory at `root`, with an NbGraderAPI bound to it."""

    def __init__(self, root: str | os.PathLike, config_file: Path | None = None,
                 timeout: float | None = None, extra=None):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "exchange").mkdir(exist_ok=True)
        self.config = make_config(self.root, config_file, timeout, extra)
        self._api = None

    @property
    def timeout(self) -> int:
        return int(self.config.Execute.timeout)

    @property
    def api(self):
        if self._api is None:
            _patch_alembic_version()
            from nbgrader.apps import NbGraderAPI
            with quiet_nbgrader():
                self._api = NbGraderAPI(config=self.config)
        return self._api

    @property
    def db_url(self) -> str:
        return self.config.CourseDirectory.db_url

    def gradebook(self):
        _patch_alembic_version()
        from nbgrader.api import Gradebook
        return Gradebook(self.db_url, "course")

    # paths in nbgrader's layout
    def source(self, assignment: str) -> Path:
        return self.root / "source" / assignment / f"{assignment}.ipynb"

    def release(self, assignment: str) -> Path:
        return self.root / "release" / assignment / f"{assignment}.ipynb"

    def submitted(self, student: str, assignment: str) -> Path:
        return self.root / "submitted" / student / assignment / f"{assignment}.ipynb"

    def autograded(self, student: str, assignment: str) -> Path:
        return self.root / "autograded" / student / assignment / f"{assignment}.ipynb"

    def add_source(self, assignment: str, nb) -> Path:
        p = self.source(assignment)
        if p.parent.exists():
            shutil.rmtree(p.parent)
        p.parent.mkdir(parents=True)
        nbformat.write(nb, str(p))
        return p

    def generate_assignment(self, assignment: str) -> dict:
        with quiet_nbgrader():
            return self.api.generate_assignment(assignment, force=True, create=True)



@contextmanager
def quiet_nbgrader():
    """nbgrader 0.9 trips SQLAlchemy 2's autoflush warnings on every autograde; they are noise (nbgrader's
    own log is captured by its API and kept in the report's log files)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not in session.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


def _alembic_head() -> str:
    """The head revision of nbgrader's database migrations, read from its migration scripts."""
    import re

    from nbgrader.dbutil import ALEMBIC_DIR
    revisions, parents = set(), set()
    for p in Path(ALEMBIC_DIR, "versions").glob("*.py"):
        text = p.read_text(encoding="utf-8")
        rev = re.search(r"^revision\s*=\s*['\"](\w+)['\"]", text, re.M)
        down = re.search(r"^down_revision\s*=\s*['\"](\w+)['\"]", text, re.M)
        if rev:
            revisions.add(rev.group(1))
        if down:
            parents.add(down.group(1))
    heads = revisions - parents
    if len(heads) != 1:
        raise RuntimeError(f"cannot tell nbgrader's database revision (heads: {sorted(heads)})")
    return heads.pop()


def _patch_alembic_version() -> None:
    """nbgrader creates every new gradebook by running the `alembic` command in a subprocess, found on
    PATH: slow, and it fails when the course is run as .venv/bin/course without an activated
    environment. The answer is a constant of the installed nbgrader; read it from its migration
    scripts instead (falling back to nbgrader's own way if that does not work)."""
    import nbgrader.api as api
    if getattr(api.get_alembic_version, "_course_patched", False):
        return
    original = api.get_alembic_version
    try:
        head = _alembic_head()
    except Exception:
        return

    def get_alembic_version() -> str:
        return head

    get_alembic_version._course_patched = True
    get_alembic_version.original = original
    api.get_alembic_version = get_alembic_version


def result_log(result: dict) -> str:
    """Log and traceback of an NbGraderAPI call, as one text."""
    parts = [result.get("log") or ""]
    if result.get("error"):
        parts.append(result["error"])
    return "\n".join(p for p in parts if p)
