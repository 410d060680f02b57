"""Start a process group from a notebook (or a script, or ``torchrun``) and never leave a process behind.

    from course_lib.parallel.launch import launch
    results = launch(my_module.worker, world_size=2, args=(cfg,))   # [rank 0's return, rank 1's return]

``launch`` starts ``world_size`` fresh Python processes (``torch.multiprocessing`` with the *forkserver*
start method where the OS has it, else *spawn*: never a plain fork of the caller, whose threads and CUDA
state a child must not inherit; the fork server is a clean process, started once, that has imported torch,
so only the first launch of a session waits for that), gives them a free local port for
the rendezvous, initializes ``torch.distributed`` in each (gloo on a CPU, NCCL on GPUs) with a timeout
that bounds every collective, calls ``worker(*args)`` in each and returns what each rank returned.

* Both pickle the worker *by reference*: it must be a function of an importable module, not one defined
  in a notebook cell (``launch`` refuses such a function with a clear message). Notebook code calls library
  functions; ``launch_source`` runs a function given as source text (how lab 11 checks a student's function).
* Both start each rank by re-importing the caller's main module *from its file* (multiprocessing's
  "prepare" step), so a script read on standard input (``python - < script.py``: its file is ``<stdin>``)
  cannot launch: every rank would die before running a line. ``launch`` refuses it up front, saying so.
* A rank that raises: its traceback comes back, the other ranks are killed, and ``RankFailed`` names the
  rank. A rank that dies without a word (killed, out of memory) is reported with its exit code.
* A rank stuck in a collective: the process group's timeout ends it (gloo raises in the collective), and
  ``launch`` itself gives up ``deadline`` seconds after the start, whatever the ranks do.
* Every process is joined or killed on the way out: on success, on failure, and on ``KeyboardInterrupt``
  (interrupting the notebook cell). An interrupt that arrives while the ranks are being started is held
  until all of them are (a start cut in half would leave a rank that nobody stops), then raised. The fork
  server is stopped and waited for when the calling script exits, so it does not outlive it.
* A rank's stderr (gloo's C++ warnings, for one) goes to a file, not into the notebook cell; it is shown
  with the traceback when the rank fails.

The same worker runs under ``torchrun`` (which starts the processes and sets RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT)::

    torchrun --nproc-per-node 2 -m course_lib.parallel.launch course_lib.parallel.workers:torchrun_demo

``main`` initializes the group from that environment (``init_from_env``) and prints rank 0's result.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import importlib
import os
import pickle
import queue as queue_mod
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback

import torch
import torch.distributed as dist

from course_lib.validate import integer, number, one_of


class RankFailed(RuntimeError):
    """A rank of a ``launch`` raised, died or timed out; ``rank`` and ``detail`` (its traceback) say which and why."""

    def __init__(self, rank: int | None, detail: str, others=()):
        self.rank, self.detail, self.others = rank, detail, sorted(others)
        who = "the process group" if rank is None else f"rank {rank}"
        also = f"\n(ranks {self.others} failed too, after it)" if self.others else ""
        super().__init__(f"{who} failed:\n{detail}{also}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it; a race with another program is possible
    but unlikely, and then init fails within the timeout with a clear error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def loopback_ok(host: str = "127.0.0.1") -> bool:
    """Can this machine listen and connect on ``host``? (False in a sandbox whose network namespace has
    no loopback interface up: gloo cannot work there.)"""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            s.listen(1)
            with socket.create_connection(s.getsockname(), timeout=2):
                pass
        return True
    except OSError:
        return False


def default_backend() -> str:
    """NCCL when there are at least two CUDA GPUs here, else gloo (CPU)."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 1 else "gloo"


def _init(backend: str, rank: int, world_size: int, timeout: float, init_method: str | None):
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))


def _capture_stderr():
    """Send this process's file descriptor 2 to a temporary file: C++ warnings of gloo and torch (and any
    print to stderr) stay out of the notebook cell, where a graded cell's stderr output counts as an
    error; they come back with the traceback if the rank fails."""
    f = tempfile.TemporaryFile()
    sys.stderr.flush()
    os.dup2(f.fileno(), 2)
    return f


def _tail(f, n: int = 3000) -> str:
    try:
        sys.stderr.flush()
        f.seek(0)
        text = f.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""
    return f"\n--- this rank's stderr (last {n} characters) ---\n{text[-n:]}" if text else ""


def _entry(rank, world_size, target, args, kwargs, backend, init_method, timeout, threads, results):
    """What each spawned process runs: init the group, call the worker, report (rank, ok, payload)."""
    err = _capture_stderr()
    try:
        if threads:
            torch.set_num_threads(threads)
        _init(backend, rank, world_size, timeout, init_method)
        fn = _resolve(target)
        out = fn(*args, **kwargs)
        payload = pickle.dumps(out)          # plain pickle: tensors travel as bytes, not shared memory
        results.put((rank, True, payload))
    except BaseException:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        results.put((rank, False, traceback.format_exc() + _tail(err)))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may be broken by a peer's failure
                pass


def _resolve(target):
    """A worker is a function, or ('source', text, name) compiled here (see ``launch_source``)."""
    if isinstance(target, tuple) and target and target[0] == "source":
        _, source, name, preamble = target
        ns = {"__name__": "__course_parallel_source__"}
        exec(compile(preamble + "\n" + source, "<launched source>", "exec"), ns)
        if not callable(ns.get(name)):
            raise NameError(f"the source defines no function {name!r}")
        return ns[name]
    return target


def _check_picklable_by_reference(fn):
    if not callable(fn):
        raise TypeError(f"worker must be a function, got {type(fn).__name__}")
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", "")
    if mod in (None, "__main__") or "<locals>" in qual or "<lambda>" in qual:
        raise ValueError(
            f"worker {qual or fn!r} is defined in {mod or 'no module'}"
            f"{' (inside a function)' if '<locals>' in qual else ''}: "
            f"spawned processes import the worker by its module and name, so it must be a top-level function "
            f"of an importable module (put it in a .py file, or pass its source to launch_source)")
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise ValueError(f"worker {mod}.{qual} cannot be imported by name in a new process") from None


def _check_main_module_is_a_file():
    """Refuse a caller whose main module has a file name that is not a file (``python - < script.py`` gives
    ``<stdin>``): forkserver and spawn start each rank by running the main module again from that path
    (``multiprocessing.spawn.prepare``), which fails there, and the rank exits before it can report."""
    import multiprocessing.process
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:   # python -m pkg.mod: imported by name
        return
    path = getattr(main, "__file__", None)        # None: a notebook, the REPL, python -c: nothing to re-run
    if path is None:
        return
    origin = multiprocessing.process.ORIGINAL_DIR
    full = path if os.path.isabs(path) or origin is None else os.path.join(origin, path)
    if os.path.isfile(full):
        return
    how = ("this script was read from standard input (python - < script.py)" if path == "<stdin>" else
           f"this script's file {path!r} does not exist (any more)")
    raise RuntimeError(
        f"launch cannot start processes here: {how}. Each rank is a new Python process that first re-imports "
        f"the main module from its file (multiprocessing's forkserver and spawn both do), so every rank would "
        f"exit before running the worker. Save the script to a file and run it as `python script.py` (or "
        f"`python -m package.module`), or run the code in a notebook.")


def _stop(procs, grace: float = 3.0):
    """Terminate, then kill, then join every process still alive (no zombies, no orphans)."""
    procs = [p for p in procs if p.pid is not None]           # started ones only
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


# torch._dynamo: building a model on the meta device (from_pretrained) imports it, seconds per rank otherwise
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.tensor.parallel",
            "course_lib.parallel.workers"]


def _stop_forkserver():
    """Stop the fork server this process started and wait for it (at the exit of a script or a test
    session). Left alone, it notices our exit and quits a moment later as an orphan, outliving its caller.
    (A Jupyter kernel terminates its children itself when it shuts down, before exit handlers run.)"""
    from multiprocessing import forkserver
    stop = getattr(forkserver._forkserver, "_stop", None)   # CPython 3.8-3.13: close the alive pipe, waitpid
    if stop is not None:
        with contextlib.suppress(OSError):
            stop()


_stop_registered = []


def _context(start_method: str | None, preload=None):
    """The multiprocessing context: forkserver (preloading torch and the course's workers) or spawn."""
    import multiprocessing
    methods = multiprocessing.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    if method not in ("forkserver", "spawn") or method not in methods:
        raise ValueError(f"start_method must be 'forkserver' or 'spawn' (available here: "
                         f"{[m for m in methods if m != 'fork']}), got {start_method!r}")
    ctx = torch.multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(_PRELOAD if preload is None else preload))  # used when the server starts
        if not _stop_registered:
            atexit.register(_stop_forkserver)
            _stop_registered.append(True)
    return ctx


@contextlib.contextmanager
def _interrupts_held():
    """Hold an interrupt (Ctrl-C, a notebook's Interrupt button, ``_thread.interrupt_main``) that arrives
    inside the block and raise it when the block ends. ``Process.start`` cut by an interrupt after the fork
    server forked the rank but before its pid came back leaves a rank this process does not know: nobody
    stops it, and it fails to unpickle its arguments once the result queue's semaphores are gone (a stray
    FileNotFoundError traceback from the fork server). Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:                      # a handler not installed from Python: leave it alone
        yield
        return
    held = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:                                  # what the interrupt would have done, now
        if callable(previous):
            previous(signal.SIGINT, held[-1])
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt


# Errors a rank sees because a *peer* failed (its connection closed, the collective aborted).
_SECONDARY = ("Connection closed by peer", "Connection reset by peer", "DistBackendError", "Broken pipe",
              "ProcessGroupGloo", "gloo/transport")


def _first_cause(rank, detail, results, window: float = 1.0) -> RankFailed:
    """The failure to report: gather the reports of other ranks for ``window`` seconds and prefer one that
    is not just a peer's broken connection (the rank that failed first, not the ones that noticed)."""
    failures = [(rank, detail)]
    end = time.monotonic() + window
    while time.monotonic() < end:
        try:
            r, ok, payload = results.get(timeout=max(0.01, end - time.monotonic()))
        except queue_mod.Empty:
            break
        if not ok:
            failures.append((r, payload))
    primary = [f for f in failures if not any(m in f[1] for m in _SECONDARY)]
    r, d = (primary or failures)[0]
    return RankFailed(r, d, {x for x, _ in failures} - {r})


def launch(worker, world_size: int, args: tuple = (), kwargs: dict | None = None, backend: str | None = None,
           timeout: float = 30.0,
           deadline: float | None = None, threads: int | None = 1, start_method: str | None = None,
           preload=None, _target=None) -> list:
    """Run ``worker(*args, **kwargs)`` in ``world_size`` spawned processes that form one process group; return the
    list of their return values (index = rank).

    backend: "gloo" (CPU, default unless two GPUs are here) or "nccl" (rank r uses GPU r).
    timeout: seconds any collective may wait (the process group's timeout; also bounds the rendezvous).
    deadline: seconds the whole launch may take (default: timeout + 120 for starting Python and torch).
    threads: torch threads per rank (1: a small machine is not oversubscribed by P ranks x all cores).
    start_method: "forkserver" (default where the OS has it: a clean server process, started once, that
    has imported torch and forks each rank, so later launches skip the seconds of importing torch) or
    "spawn" (a fresh interpreter per rank; the only one on Windows). Both import the worker by reference.
    preload: the modules the fork server imports when it starts (default: torch, torch.distributed,
    torch._dynamo, the DTensor API and the course's workers); it starts once per session.
    Raises ``RankFailed`` naming the first rank that failed (its traceback included); the other ranks are
    killed. Every process is joined or killed before this returns or raises, KeyboardInterrupt included.
    RuntimeError, before any process starts, when the caller is a script read on standard input (its ranks
    could not re-import it) or the machine has no loopback network.
    """
    world_size = integer(world_size, "world_size", low=1)
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    timeout = number(timeout, "timeout", 0, low_open=True)   # seconds
    backend = backend or default_backend()
    one_of(backend, "backend", ("gloo", "nccl"))
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' with world_size={world_size} needs {world_size} GPUs; "
                         f"this machine has {torch.cuda.device_count()}")
    target = _target if _target is not None else worker
    if _target is None:
        _check_picklable_by_reference(worker)
    _check_main_module_is_a_file()
    if not loopback_ok():
        raise RuntimeError("torch.distributed cannot start here: this machine has no working loopback "
                           "network interface (127.0.0.1), which gloo needs even on one machine (a sandbox "
                           "without network?). Run the notebook where localhost works (your laptop, Colab).")
    deadline = timeout + 120.0 if deadline is None else deadline
    ctx = _context(start_method, preload)
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_entry, daemon=True,
                         args=(r, world_size, target, args, kwargs, backend, init_method, timeout, threads, results))
             for r in range(world_size)]
    out: dict[int, object] = {}
    try:
        with _interrupts_held():              # every rank started and known before an interrupt is raised
            for p in procs:
                p.start()
        t_end = time.monotonic() + deadline
        while len(out) < world_size:
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    if r not in out and p.exitcode is not None and p.exitcode != 0:
                        time.sleep(0.2)        # its report may still be in the pipe
                        try:
                            rank, ok, payload = results.get(timeout=0.5)
                            break
                        except queue_mod.Empty:
                            raise RankFailed(r, f"the process exited with code {p.exitcode} without reporting "
                                                f"(killed, or out of memory?)") from None
                else:
                    if time.monotonic() > t_end:
                        missing = [r for r in range(world_size) if r not in out]
                        raise RankFailed(missing[0], f"no result after {deadline:.0f} s (ranks {missing} still "
                                                     f"running): a hang outside a collective? raise deadline= "
                                                     f"if the work is just slow")
                    continue
            if not ok:
                raise _first_cause(rank, payload, results)
            out[rank] = pickle.loads(payload)
        for p in procs:
            p.join(10)
        return [out[r] for r in range(world_size)]
    finally:
        _stop(procs)
        results.close()
        results.join_thread()


# The names a source given to launch_source can use without importing them.
SOURCE_PREAMBLE = ("import math\nimport torch\nimport torch.nn.functional as F\nimport torch.distributed as dist\n"
                   "from torch import nn\n")


def launch_source(source: str, name: str, world_size: int, args: tuple = (), **options) -> list:
    """``launch`` for a function given as source text (a notebook cell's function, which spawned processes
    cannot import): each rank compiles ``source`` (with torch, F, dist, nn and math imported) and calls
    ``name(*args)``. Use ``inspect.getsource(fn)`` to get a notebook function's source."""
    if not isinstance(source, str) or not source.strip():
        raise TypeError("source must be the non-empty source text of a function")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be the function's name, got {name!r}")
    options.setdefault("preload", ["torch", "torch.distributed"])       # a lab's kernel needs no more
    return launch(None, world_size, args, _target=("source", source, name, SOURCE_PREAMBLE), **options)


def init_from_env(backend: str | None = None, timeout: float = 30.0) -> tuple[int, int]:
    """Under ``torchrun``: initialize the default group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT;
    returns (rank, world_size)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"init_from_env: {', '.join(missing)} not set; start this with torchrun "
                           f"(torchrun --nproc-per-node N ...) or call launch() instead")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _init(backend or default_backend(), rank, world, timeout, "env://")
    return rank, world


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m course_lib.parallel.launch module:function [--timeout S]``: run
    the same worker ``launch`` runs; rank 0 prints its result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or ":" not in argv[0]:
        print(main.__doc__, file=sys.stderr)
        return 2
    timeout = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else 30.0
    mod, _, name = argv[0].partition(":")
    fn = getattr(importlib.import_module(mod), name)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, _ = init_from_env(timeout=timeout)
    try:
        out = fn()
        if rank == 0:
            print(f"rank 0 result: {out}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
