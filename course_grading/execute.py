"""The grader's side of executing one submission (nbgrader autograde preprocessors).

    InjectGuard      before execution: a setup cell first, and in every test cell a first line that
                     calls `guard.verify` (with a per-cell nonce) and the hidden tests wrapped in a
                     function (their names stay local: a student's ``_dev`` or ``_rng`` is not
                     overwritten). The original sources are kept in the cells' metadata.
    SandboxExecute   nbgrader's Execute with the kernel started through the jail (`sandbox.py`), a
                     time budget for the whole notebook on top of the per-cell timeout, and a dead
                     kernel that keeps the outputs of the cells run before it (the cells it did not
                     reach get an error output, so they score 0 and the rest keeps its points).
    CollectGuard     after execution: collects the guard's reports (only those carrying the cell's
                     nonce), removes them and the setup cell, and puts the original sources back.

What they find goes to JSON files the grader reads (in the per-submission course folder, which the
kernel cannot reach at the ``user`` and ``bwrap`` levels).

    check_kernel     before grading: starts a real kernel at the chosen isolation level and checks what it
                     sees (its user, its course_lib and guard, no pipeline, no repository), so that a
                     kernel that cannot start
                     stops `course grade` with the reason instead of failing every submission.
"""
from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import os
import signal
import threading
import time
from pathlib import Path

from nbformat.v4 import new_code_cell, new_output
from traitlets import Dict, Float, List, Unicode

from nbgrader.preprocessors import Execute, NbGraderPreprocessor

from .guard import MIME
from .sandbox import (LIB_MOUNT, USERNS_HELP, Isolation, RunScratch, SandboxKernelManager, SandboxUnavailable,
                      course_lib_root, kernel_spec, python_paths)

GUARD_META = "course_guard"
DEAD_ENAME = "DeadKernelError"
BUDGET_ENAME = "TimeBudgetExceeded"
SETUP_TIMEOUT = 300


def cell_nonce(secret: str, what: str) -> str:
    return hmac.new(secret.encode(), what.encode(), hashlib.sha256).hexdigest()[:24]


def _meta(cell) -> dict:
    m = cell.metadata.get("nbgrader")
    return m if isinstance(m, dict) else {}


def is_test_cell(cell) -> bool:
    m = _meta(cell)
    return cell.cell_type == "code" and bool(m.get("grade")) and not m.get("solution")


HIDDEN_NS = "__course_hidden__"


def _private_exec(body: str) -> list[str]:
    """Lines that run a hidden-test block in a namespace of its own: it sees the student's globals, and
    the names earlier hidden blocks defined (kept in a module ``HIDDEN_NS`` across cells, so a reference
    imported in one hidden block serves the next), but what it assigns never lands in the student's
    globals (a student's ``_dev`` or ``_rng`` is left alone)."""
    return [
        "import sys as __course_sys, types as __course_types",
        f"__course_store = __course_sys.modules.setdefault({HIDDEN_NS!r}, "
        f"__course_types.ModuleType({HIDDEN_NS!r})).__dict__",
        "__course_ns = {**globals(), **{k: v for k, v in __course_store.items() if not k.startswith('__')}}",
        "try:",
        f"    exec(compile({body!r}, '<hidden tests>', 'exec'), __course_ns)",
        "finally:",
        "    __course_store.update({k: v for k, v in __course_ns.items() if not k.startswith('__')",
        "                           and globals().get(k, __course_ns) is not v})",
        "    del __course_sys, __course_types, __course_store, __course_ns",
    ]


def wrap_hidden(source: str) -> str:
    """The hidden-test regions (markers at the start of a line) turned into a function called in place."""
    lines, out, block, inside = source.split("\n"), [], [], False
    for ln in lines:
        if not inside and "BEGIN HIDDEN TESTS" in ln and ln == ln.lstrip():
            inside, block = True, []
            out.append(ln)
        elif inside and "END HIDDEN TESTS" in ln:
            inside = False
            out += _private_exec("\n".join(block))
            out.append(ln)
        elif inside:
            block.append(ln)
        else:
            out.append(ln)
    if inside:  # no end marker: leave it as it is
        return source
    wrapped = "\n".join(out)
    try:
        compile(wrapped, "<test cell>", "exec")
    except SyntaxError:
        return source
    return wrapped


class InjectGuard(NbGraderPreprocessor):
    secret = Unicode("").tag(config=True)
    answers = Dict(help="grade_id of a test cell -> names of the functions it tests").tag(config=True)

    def preprocess(self, nb, resources):
        if not self.secret:
            return nb, resources
        for cell in nb.cells:
            if not is_test_cell(cell) or cell.source.lstrip().startswith("%%"):
                continue
            gid = _meta(cell).get("grade_id")
            cell.metadata[GUARD_META] = {"original": cell.source}
            names = list(self.answers.get(gid, []))
            line = (f"import course_grading.guard as __course_guard__; __course_guard__.verify("
                    f"{cell_nonce(self.secret, gid)!r}, {gid!r}, {names!r})")
            cell.source = line + "\n" + wrap_hidden(cell.source)
        # the kernel loads the labs' checks before the guard records them as the originals (the guard
        # itself imports nothing of course_lib)
        setup = new_code_cell("import course_lib.checks, course_grading.guard as __course_guard__; "
                              f"__course_guard__.setup({cell_nonce(self.secret, '-setup-')!r})")
        setup.metadata[GUARD_META] = {"setup": True}
        nb.cells.insert(0, setup)
        return nb, resources


class CollectGuard(NbGraderPreprocessor):
    secret = Unicode("").tag(config=True)
    report_path = Unicode("").tag(config=True)

    def preprocess(self, nb, resources):
        if not self.secret:
            return nb, resources
        found = {"setup": False, "tests": {}, "missing": [], "forged": [], "problems": {}}
        cells = []
        for cell in nb.cells:
            g = cell.metadata.get(GUARD_META)
            if not isinstance(g, dict):
                cells.append(cell)
                continue
            reports, keep = [], []
            for out in cell.get("outputs", []):
                data = out.get("data", {}) if out.get("output_type") in ("display_data", "execute_result") else {}
                if MIME in data:
                    reports.append(data[MIME])
                else:
                    keep.append(out)
            if g.get("setup"):
                found["setup"] = any(isinstance(r, dict) and r.get("nonce") == cell_nonce(self.secret, "-setup-")
                                     for r in reports)
                continue  # the setup cell goes
            gid = _meta(cell).get("grade_id")
            want = cell_nonce(self.secret, gid)
            good = [r for r in reports if isinstance(r, dict) and r.get("nonce") == want]
            if len(good) != len(reports):
                found["forged"].append(gid)
            if good:
                found["tests"][gid] = True
                probs = [str(p) for r in good for p in (r.get("problems") or [])]
                if probs:
                    found["problems"][gid] = sorted(set(probs))
            else:
                enames = {o.get("ename") for o in keep if o.get("output_type") == "error"}
                if not enames & {DEAD_ENAME, BUDGET_ENAME, "CellTimeoutError"}:
                    found["missing"].append(gid)
            cell.source = g.get("original", cell.source)
            cell.outputs = keep
            del cell.metadata[GUARD_META]
            cells.append(cell)
        nb.cells = cells
        if self.report_path:
            Path(self.report_path).write_text(json.dumps(found), encoding="utf-8")
        return nb, resources


def _sandboxed(km, spec: dict | None, connection_file: str):
    """The kernel manager set up to start its kernel through the jail, over Unix sockets in the scratch."""
    if spec:
        km.transport = "ipc"
        km.connection_file = connection_file
        km.ip = os.path.splitext(connection_file)[0] + "-ipc"
        km.sandbox_spec = spec
    return km


class SandboxExecute(Execute):
    """nbgrader's Execute with the jailed kernel, a notebook time budget and dead-kernel handling."""
    sandbox_spec = Dict(allow_none=True, default_value=None).tag(config=True)
    connection_file = Unicode("").tag(config=True)
    budget = Float(0.0, help="seconds for the whole notebook (0: none)").tag(config=True)
    grace = Float(20.0, help="seconds past the budget before the kernel is killed").tag(config=True)
    report_path = Unicode("").tag(config=True)
    pgids = List([])

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxKernelManager)
        super().__init__(*args, **kwargs)

    def create_kernel_manager(self):
        return _sandboxed(super().create_kernel_manager(), self.sandbox_spec, self.connection_file)

    def _remaining(self) -> float | None:
        if not self.budget:
            return None
        return self.budget - (time.monotonic() - self._t0)

    def _get_timeout(self, cell):
        t = super()._get_timeout(cell)
        if cell is not None and (cell.metadata.get(GUARD_META) or {}).get("setup"):
            return max(t or 0, SETUP_TIMEOUT)  # the grader's own cell (imports numpy and torch)
        left = self._remaining()
        if left is None:
            return t
        left = max(1, int(left) + 1)
        return left if t is None else min(t, left)

    def _kill_over_budget(self):
        self._state["budget_killed"] = True
        pg = getattr(getattr(self.km, "provisioner", None), "pgid", None)
        if pg:
            try:
                os.killpg(pg, signal.SIGKILL)
            except OSError:
                pass

    def preprocess_cell(self, cell, resources, index):
        self._state["current"] = index
        if (cell.metadata.get(GUARD_META) or {}).get("setup"):
            out = super().preprocess_cell(cell, resources, index)
            self._t0 = time.monotonic()  # the budget is the student's: it starts after the grader's setup
            return out
        pg = getattr(getattr(self.km, "provisioner", None), "pgid", None)
        if pg and pg not in self._state["pgids"]:
            self._state["pgids"].append(pg)
        left = self._remaining()
        if cell.cell_type == "code" and left is not None and left <= 0:
            if self._state["budget_at"] is None:
                self._state["budget_at"] = index
            cell.outputs = [new_output("error", ename=BUDGET_ENAME,
                                       evalue=f"the notebook's time budget of {self.budget:g} s was used up "
                                              "before this cell", traceback=[])]
            return cell, resources
        return super().preprocess_cell(cell, resources, index)

    def preprocess(self, nb, resources=None, km=None):
        from nbclient.exceptions import CellTimeoutError, DeadKernelError
        self._t0 = time.monotonic()
        self._state = {"current": None, "budget_at": None, "died_at": None, "budget_killed": False,
                       "pgids": [], "error": None}
        timer = None
        if self.budget:
            timer = threading.Timer(self.budget + self.grace, self._kill_over_budget)
            timer.daemon = True
            timer.start()
        try:
            try:
                nb, resources = super().preprocess(nb, resources, km)
            except (DeadKernelError, CellTimeoutError) as e:
                self._state["died_at"] = self._state["current"]
                self._state["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                why = ("the kernel was killed after the notebook's time budget" if self._state["budget_killed"]
                       else "the kernel stopped answering" if isinstance(e, CellTimeoutError)
                       else "the kernel died (os._exit, a crash, or a resource limit)")
                for k, cell in enumerate(nb.cells):
                    if k < (self._state["current"] or 0) or cell.cell_type != "code":
                        continue
                    if not any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                        cell.setdefault("outputs", []).append(new_output(
                            "error", ename=DEAD_ENAME, evalue=f"{why}; this cell did not complete", traceback=[]))
        finally:
            if timer is not None:
                timer.cancel()
            self._state["elapsed"] = time.monotonic() - self._t0
            if self.report_path:
                Path(self.report_path).write_text(json.dumps(self._state), encoding="utf-8")
        return nb, resources


CHECK_MARK = "course-grade-check:"


def _tail(path: Path, n: int = 800) -> str:
    try:
        return path.read_text(errors="replace").strip()[-n:]
    except OSError:
        return ""


def check_kernel(iso: Isolation, scratch: RunScratch, timeout: float = 120.0) -> dict:
    """Start a real kernel at `iso`'s level, as a submission's would be started, run one cell and check
    what it sees; raise SandboxUnavailable with the reason (the jail's own words where it failed) when it
    does not start or sees more than it should. Returns what the kernel reported."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_notebook
    from traitlets import Unicode as TUnicode

    class _Client(NotebookClient):
        connection_file = TUnicode("")
        sandbox_spec = Dict(allow_none=True, default_value=None)

        def create_kernel_manager(self):
            return _sandboxed(super().create_kernel_manager(), self.sandbox_spec, self.connection_file)

    ks = scratch.kernel("check")
    conn = ks.run / "kernel.json"
    spec = kernel_spec(iso, ks, conn, "check", None, scratch.lib)
    repo = str(course_lib_root().resolve())
    code = ("import json, os, importlib.util, course_lib, course_lib.checks, course_grading.guard\n"
            f"print({CHECK_MARK!r} + json.dumps({{'uid': os.getuid(), "
            "'lib': os.path.dirname(os.path.dirname(os.path.abspath(course_lib.__file__))), "
            "'guard': os.path.dirname(os.path.dirname(os.path.abspath(course_grading.guard.__file__))), "
            "'pipeline': importlib.util.find_spec('course_grading.sandbox') is not None, "
            f"'repo': sorted(os.listdir({repo!r})) if os.path.isdir({repo!r}) else []}}))")
    nb = new_notebook(cells=[new_code_cell(code)])
    client = _Client(nb, timeout=int(timeout), startup_timeout=int(timeout), kernel_name="python3",
                     kernel_manager_class=SandboxKernelManager, sandbox_spec=spec, connection_file=str(conn),
                     extra_arguments=["--IPKernelApp.log_level=ERROR"])
    error, seen = None, None
    errfile = scratch.private / "check-stderr.txt"  # what the jail, bubblewrap or the kernel said
    try:
        with open(errfile, "w") as fh:
            client.execute(stderr=fh)
    except Exception as e:  # noqa: BLE001 - any failure to start or run is the answer
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    finally:
        atexit.unregister(client._cleanup_kernel)  # nbclient leaves it registered after a failed start
        jail = "\n".join(t for t in (_tail(ks.report), _tail(errfile)) if t)
        scratch.release(ks)
    for out in nb.cells[0].get("outputs", []):
        for line in str(out.get("text", "")).splitlines():
            if line.startswith(CHECK_MARK):
                seen = json.loads(line[len(CHECK_MARK):])
    where = f"isolation level {iso.level}"
    if seen is None:
        why = "; ".join(t for t in (error, jail) if t) or "its check cell printed nothing"
        hint = ""
        if iso.level == "bwrap":
            hint = ("\nbubblewrap may be unable to create its namespaces here"
                    + (f" as user {iso.user}" if iso.user else "") + ".\n" + USERNS_HELP
                    + ("\nAs root, --isolation user builds the same private filesystem without bubblewrap."
                       if iso.uid is not None else ""))
        raise SandboxUnavailable(f"the grading kernel does not start at {where}: {why}{hint}")
    problems = []
    if iso.uid is not None and seen["uid"] != iso.uid:
        problems.append(f"it runs as uid {seen['uid']}, not the sandbox user's {iso.uid}")
    # A Python installation inside the repository (the venv of a clone, as `make` and CI make it) is bound at
    # its own path, so the repository's folder exists in the jail holding only that; nothing else of it
    # (solutions/, course_lib/, ...) may be in reach.
    bound = {Path(p).relative_to(repo).parts[0] for p in python_paths() if p.startswith(repo + "/")}
    if iso.private and set(seen["repo"]) - bound:
        problems.append(f"it can see the repository ({repo}: {', '.join(sorted(set(seen['repo']) - bound))})")
    if iso.private and seen["lib"] != LIB_MOUNT:
        problems.append(f"it imports course_lib from {seen['lib']}, not its private copy")
    if iso.private and seen["guard"] != LIB_MOUNT:
        problems.append(f"it imports the grader's guard from {seen['guard']}, not its private copy")
    # the kernel gets the guard of course_grading, not the pipeline (its sandbox, gradebook and feedback code)
    if iso.private and seen["pipeline"]:
        problems.append("it can import the grader's pipeline (course_grading.sandbox)")
    if problems:
        raise SandboxUnavailable(f"the grading kernel at {where} is not isolated as it should be: "
                                 + "; ".join(problems))
    return seen
