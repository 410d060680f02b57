"""One submission in one sandboxed kernel: its cells run, then the judge's calls, all bounded.

    run_submission(nb, spec, connection_file, judge_fn, limits) -> SessionResult

1. **The notebook.** Every code cell of the (repaired) submission runs in order, in a kernel started
   through the jail (`sandbox.py`), except the lab's test cells: they hold the release's visible tests,
   which students run themselves; while grading, the judge takes their place. Each cell has a time limit
   (then the kernel is interrupted, and the cell is marked), the notebook a budget (the cells after it are
   not run), and what a cell prints is capped: `Limits.cell_chars` of text kept per cell,
   `Limits.notebook_chars` per notebook, no message over `Limits.message_bytes` is even read (the client's
   sockets drop a larger one: a 600 MB output line never reaches the grader's memory) and no more than
   `Limits.queued_messages` wait unread (zmq drops the rest: a flood of outputs is bounded too). A cell
   that kills the kernel is marked; a new kernel replays the cells that ran before it and goes on after it.
2. **The judge.** `judge_fn(send, restart)` (see `judging.judge_parts`) sends its requests through
   `send(ops, timeout)`: one line executed in the kernel, whose reply is the display output of the judge's
   MIME type tagged with the request's nonce (`driver.py`); everything else the kernel prints meanwhile is
   dropped. A request that times out interrupts the kernel; a kernel that is gone raises `KernelGone`, and
   `restart()` brings up a new one with the notebook replayed.
3. **The clean kernel** (a project's judge only): a second kernel in a sandbox of its own (its own user and
   cgroups) that runs none of the notebook, only the grader's requests: the baseline the entry is timed
   against. Each kernel's CPU time is read from outside it (`CpuClock`).

Nothing the kernel sends is believed beyond what it is: outputs are text to show, and a reply is data that
`judging` decodes and judges in the grader's process.
"""
from __future__ import annotations

import asyncio
import json
import os
import queue
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import wire
from .driver import RPC_PREFIX
from .judging import KernelGone
from .sandbox import (LIB_MOUNT, USERNS_HELP, Cgroups, SandboxKernelManager, SandboxUnavailable, course_lib_root,
                      kernel_spec, python_paths)

DEAD_ENAME = "DeadKernelError"
TIMEOUT_ENAME = "CellTimeoutError"
BUDGET_ENAME = "TimeBudgetExceeded"
STARTUP_TIMEOUT = 120.0


@dataclass
class Limits:
    cell_timeout: float = 60.0          # seconds per cell and per judge request
    budget: float = 600.0               # seconds for the notebook's cells and the judge together
    cell_chars: int = 100_000           # text kept per cell
    notebook_chars: int = 2_000_000     # text kept per notebook
    message_bytes: int = 16 * 2**20     # a larger message from the kernel is never read
    queued_messages: int = 16           # messages the client's sockets hold unread (zmq's high-water mark)
    restarts: int = 3                   # kernels started again after one died


@dataclass
class SessionResult:
    executed: object                              # the notebook with the outputs kept (test cells empty)
    verdict: object = None                        # judging.Verdict
    timeouts: list = field(default_factory=list)  # cell labels that hit the time limit
    died: list = field(default_factory=list)      # cell labels that killed the kernel
    budget_at: str | None = None                  # the first cell not run for want of time
    output_dropped: int = 0                       # characters of output not kept
    messages_dropped: int = 0                     # messages over Limits.message_bytes, never read
    started: int = 0                              # kernels started
    pgids: list = field(default_factory=list)
    elapsed: float = 0.0
    startup_error: str | None = None


def _meta(cell) -> dict:
    m = cell.get("metadata", {}).get("nbgrader")
    return m if isinstance(m, dict) else {}


def is_test_cell(cell) -> bool:
    m = _meta(cell)
    return cell.get("cell_type") == "code" and bool(m.get("grade")) and not m.get("solution")


def cell_label(cell, k: int) -> str:
    return _meta(cell).get("grade_id") or f"cell {k}"


class _Capped:
    """Outputs of one cell, text kept up to the cell's and the notebook's limits."""

    def __init__(self, limits: Limits, spent: list):
        self.limits, self.spent = limits, spent     # spent: [characters kept in the notebook so far]
        self.outputs, self.kept, self.dropped = [], 0, 0

    def _room(self) -> int:
        return max(0, min(self.limits.cell_chars - self.kept, self.limits.notebook_chars - self.spent[0]))

    def _take(self, text: str) -> str:
        room = self._room()
        cut = text[:room]
        self.kept += len(cut)
        self.spent[0] += len(cut)
        self.dropped += len(text) - len(cut)
        return cut

    def add(self, msg_type: str, content: dict) -> None:
        if msg_type == "stream":
            name = content.get("name") if content.get("name") in ("stdout", "stderr") else "stdout"
            text = self._take(str(content.get("text", "")))
            if not text:
                return
            last = self.outputs[-1] if self.outputs else None
            if last is not None and last.get("output_type") == "stream" and last.get("name") == name:
                last["text"] += text
            else:
                self.outputs.append(nbformat.v4.new_output("stream", name=name, text=text))
        elif msg_type in ("display_data", "execute_result"):
            data = content.get("data") if isinstance(content.get("data"), dict) else {}
            shown = {}
            for mime, value in data.items():
                if mime == wire.MIME:
                    continue
                text = value if isinstance(value, str) else json.dumps(value)[:100_000]
                if mime == "text/plain":
                    shown[mime] = self._take(text)
                else:  # kept only as a note that it was there: the feedback shows text only
                    shown[mime] = "" if len(text) > 10_000 else text
            if not shown:
                return
            if msg_type == "execute_result":
                self.outputs.append(nbformat.v4.new_output("execute_result", data=shown,
                                                           execution_count=None))
            else:
                self.outputs.append(nbformat.v4.new_output("display_data", data=shown))
        elif msg_type == "error":
            ename = str(content.get("ename", "Error"))[:200]
            evalue = self._take(str(content.get("evalue", ""))[:5000])
            tb = [self._take(str(t)[:5000]) for t in (content.get("traceback") or [])[:50]]
            self.outputs.append(nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=tb))
        elif msg_type == "clear_output":
            self.outputs = []


class Kernel:
    """One sandboxed kernel and its client (async)."""

    def __init__(self, spec: dict | None, connection_file: str, limits: Limits, kernel_name: str = "python3",
                 stderr=None):
        self.spec, self.connection_file, self.limits, self.kernel_name = spec, connection_file, limits, kernel_name
        self.stderr = stderr            # a file for what the jail and the kernel say (the start-up check's)
        self.km = self.kc = None
        self.dropped_messages = 0

    async def start(self) -> None:
        import zmq
        import zmq.asyncio
        km = SandboxKernelManager(kernel_name=self.kernel_name)
        if self.spec:
            km.transport = "ipc"
            km.connection_file = self.connection_file
            km.ip = self.connection_file.rsplit(".", 1)[0] + "-ipc"
            km.sandbox_spec = self.spec
        self.km = km
        await km.start_kernel(extra_arguments=["--IPKernelApp.log_level=ERROR"],
                              **({"stderr": self.stderr} if self.stderr is not None else {}))
        # every socket the client makes: no message over message_bytes is read, no more than queued_messages
        # wait unread (zmq drops the rest): the grader's memory for a kernel's messages stays under their product
        ctx = zmq.asyncio.Context()
        ctx.setsockopt(zmq.MAXMSGSIZE, int(self.limits.message_bytes))
        ctx.setsockopt(zmq.RCVHWM, int(self.limits.queued_messages))
        self._ctx = ctx
        self.kc = km.client(context=ctx)
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=STARTUP_TIMEOUT)

    def reconnect_iopub(self) -> None:
        """A new iopub socket: the client's socket drops a peer that sends a message over `message_bytes` and
        does not connect again, so after such a message the kernel's outputs (and the judge's replies) would be
        lost for good."""
        old = self.kc._iopub_channel
        self.kc._iopub_channel = None
        try:
            if old is not None:
                old.close()
        except Exception:  # noqa: BLE001
            pass
        self.kc.iopub_channel.start()

    @property
    def pgid(self):
        return getattr(getattr(self.km, "provisioner", None), "pgid", None)

    async def alive(self) -> bool:
        try:
            return bool(await self.km.is_alive())
        except Exception:  # noqa: BLE001
            return False

    async def stop(self) -> None:
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:  # noqa: BLE001
                pass
        if self.km is not None:
            try:
                await self.km.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001
                try:
                    await self.km._async_kill_kernel()
                except Exception:  # noqa: BLE001
                    pass
            try:
                res = self.km.cleanup_resources()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # noqa: BLE001
                pass
        ctx = getattr(self, "_ctx", None)
        if ctx is not None:
            try:
                ctx.destroy(linger=0)
            except Exception:  # noqa: BLE001
                pass

    async def _answer_stdin(self, msg_id: str, stdin) -> None:
        """Answer the input requests waiting on the stdin channel (the judge's remote objects)."""
        while True:
            try:
                req = await self.kc.get_stdin_msg(timeout=0)
            except Exception:  # noqa: BLE001 - nothing waiting, or a message the session could not read
                return
            if req.get("msg_type") != "input_request" or req.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            prompt = str((req.get("content") or {}).get("prompt", ""))
            try:
                reply = stdin(prompt)
            except Exception as e:  # noqa: BLE001
                reply = json.dumps({"raised": {"module": "builtins", "type": "RuntimeError",
                                               "message": f"the grader could not answer: {type(e).__name__}"}})
            self.kc.input(reply)

    async def execute(self, code: str, timeout: float, sink, store_history: bool = True, stdin=None) -> str:
        """Run `code`; every iopub message of it goes to ``sink(msg_type, content)``. Returns "ok",
        "error" (the cell raised), "timeout" (interrupted; the kernel answered again) or "dead". `stdin`:
        ``stdin(prompt) -> reply`` answers the code's input requests (the judge's remote objects); None: the
        code gets no stdin (input() raises in the kernel). One poll waits on the iopub, shell and stdin
        sockets together: a judge's request costs the kernel's work, not the grader's polling."""
        import zmq
        import zmq.asyncio
        msg_id = self.kc.execute(code, store_history=store_history, allow_stdin=stdin is not None,
                                 stop_on_error=False)
        iopub, shell = self.kc.iopub_channel.socket, self.kc.shell_channel.socket
        poller = zmq.asyncio.Poller()
        poller.register(iopub, zmq.POLLIN)
        poller.register(shell, zmq.POLLIN)
        if stdin is not None:
            poller.register(self.kc.stdin_channel.socket, zmq.POLLIN)
        deadline = time.monotonic() + max(1.0, timeout)
        status, replied_at, interrupted = "ok", None, False
        checked = time.monotonic()
        while True:
            now = time.monotonic()
            if now > deadline:
                if interrupted:
                    return "dead"          # interrupted and still not idle: the kernel is not answering
                interrupted = True
                try:
                    await self.km.interrupt_kernel()
                except Exception:  # noqa: BLE001
                    return "dead"
                deadline = now + 10.0
                status = "timeout"
            ready = dict(await poller.poll(timeout=200 if replied_at is None else 100))
            if stdin is not None and ready.get(self.kc.stdin_channel.socket):
                await self._answer_stdin(msg_id, stdin)
            if ready.get(shell) and replied_at is None:
                try:
                    reply = await self.kc.get_shell_msg(timeout=0)
                    if reply.get("parent_header", {}).get("msg_id") == msg_id:
                        replied_at = time.monotonic()
                except Exception:  # noqa: BLE001 - an old reply, or one the session could not read
                    pass
            while ready.get(iopub):
                try:
                    msg = await self.kc.get_iopub_msg(timeout=0)
                except (queue.Empty, asyncio.TimeoutError, TimeoutError):
                    break
                except Exception:  # noqa: BLE001 - a message the session could not read (a bad signature)
                    continue
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg.get("msg_type"), msg.get("content") or {}
                if kind == "status" and content.get("execution_state") == "idle":
                    return status
                if kind == "error" and status == "ok":
                    status = "error"
                sink(kind, content)
            if not ready and time.monotonic() - checked > 0.5:
                checked = time.monotonic()
                if not await self.alive():
                    return "dead"
            if replied_at is not None and time.monotonic() - replied_at > 2.0:
                self.reconnect_iopub()   # the reply came, the idle status did not: a message too big was dropped
                sink("stream", {"name": "stdout", "text": "\n[the kernel sent a message larger than the grader "
                                                         f"reads ({self.limits.message_bytes // 2**20} MiB), or more "
                                                         "than it holds unread: dropped, with what came after it "
                                                         "in this cell]\n"})
                self.dropped_messages += 1
                return status


async def _run_cells(kernel: Kernel, cells: list[tuple[int, object]], outputs: dict, result: SessionResult,
                     limits: Limits, t0: float, spent: list, skip: set) -> int | None:
    """Run (index, cell) in order; returns the index of a cell that killed the kernel, or None."""
    for k, cell in cells:
        if k in skip:
            continue
        left = limits.budget - (time.monotonic() - t0)
        if left <= 0:
            result.budget_at = result.budget_at or cell_label(cell, k)
            outputs[k] = [nbformat.v4.new_output("error", ename=BUDGET_ENAME, evalue=(
                f"the notebook's time budget of {limits.budget:g} s was used up before this cell"), traceback=[])]
            continue
        cap = _Capped(limits, spent)
        dropped = kernel.dropped_messages
        status = await kernel.execute(cell.source, min(limits.cell_timeout, left), cap.add)
        result.output_dropped += cap.dropped
        result.messages_dropped += kernel.dropped_messages - dropped
        if cap.dropped:
            cap.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
                f"\n[{cap.dropped:,} characters of output not kept: a cell keeps {limits.cell_chars:,}, a "
                f"notebook {limits.notebook_chars:,}]\n")))
        if status == "timeout":
            result.timeouts.append(cell_label(cell, k))
            cap.outputs.append(nbformat.v4.new_output("error", ename=TIMEOUT_ENAME, evalue=(
                f"this cell ran longer than {min(limits.cell_timeout, left):g} s and was interrupted"), traceback=[]))
        if status == "dead":
            cap.outputs.append(nbformat.v4.new_output("error", ename=DEAD_ENAME, evalue=(
                "the kernel died or stopped answering while this cell ran (os._exit, a crash, a resource limit); "
                "the cells after it ran in a new kernel"), traceback=[]))
            outputs[k] = cap.outputs
            return k
        outputs[k] = cap.outputs
    return None


class CpuClock:
    """The CPU seconds a kernel's processes have used, read from outside them (nothing the kernel does can
    change it): its cgroups' counter where it has one (exact: every process, the exited ones too); else a
    scan of /proc for the processes of its own user (a sandbox user of its own), or of the process tree of
    its launcher, each process counted with its reaped children and kept at the last value seen after it is
    gone (so the sum never goes back; a process that leaves the tree and exits unseen is missed). Where
    the kernel runs as the grader's own user and there is no cgroup the tree is all there is."""

    def __init__(self, cgroups=(), uid: int | None = None, root_pid=lambda: None):
        self.cgroups, self.uid, self.root_pid = [str(d) for d in cgroups], uid, root_pid
        self.kind = "cgroup" if Cgroups.cpu_seconds(self.cgroups) is not None else "proc"
        self._seen: dict = {}
        self._tick = os.sysconf("SC_CLK_TCK")

    def __call__(self) -> float | None:
        if self.kind == "cgroup":
            return Cgroups.cpu_seconds(self.cgroups)
        own = self.uid is not None and self.uid != os.getuid()
        root = None if own else self.root_pid()
        procs = {}
        for d in os.scandir("/proc"):
            if not d.name.isdigit():
                continue
            try:
                if own and d.stat().st_uid != self.uid:
                    continue
                with open(f"/proc/{d.name}/stat") as fh:
                    text = fh.read()
            except OSError:
                continue
            f = text[text.rfind(")") + 2:].split()
            procs[int(d.name)] = (int(f[1]), int(f[19]), sum(int(x) for x in f[11:15]))  # ppid, start, ticks
        if not own:
            if root is None:
                return None
            keep, frontier = set(), {root}
            while frontier:
                keep |= frontier
                frontier = {p for p, (pp, _, _) in procs.items() if pp in frontier and p not in keep}
            procs = {p: v for p, v in procs.items() if p in keep}
        for p, (_, start, ticks) in procs.items():
            key = (p, start)
            self._seen[key] = max(ticks, self._seen.get(key, 0))
        return sum(self._seen.values()) / self._tick


def run_submission(nb, spec: dict | None, connection_file: str, judge_fn, limits: Limits,
                   log=None, clean=None) -> SessionResult:
    """Run `nb`'s cells (not its test cells) in a sandboxed kernel, then `judge_fn(send, restart)`; see the
    module's docstring. `clean`: {"spec", "connection_file"} of a second sandboxed kernel that runs none of
    the notebook, for the judge's requests sent with ``where="clean"`` (the project's baseline, timed beside
    the entry and out of its reach); started on its first request. ``send.cpu(where)``: the CPU seconds
    that kernel's processes have used so far (`CpuClock`). Never raises for what the notebook does."""
    return asyncio.run(_run_submission(nb, spec, connection_file, judge_fn, limits, log or (lambda s: None), clean))


async def _run_submission(nb, spec, connection_file, judge_fn, limits: Limits, log, clean=None) -> SessionResult:
    t0 = time.monotonic()
    result = SessionResult(executed=nb)
    cells = [(k, c) for k, c in enumerate(nb.cells) if c.get("cell_type") == "code" and not is_test_cell(c)]
    outputs: dict = {}
    spent = [0]
    skip: set = set()
    state = {"kernel": None}

    async def start() -> bool:
        if state["kernel"] is not None:
            await state["kernel"].stop()
        if result.started > limits.restarts:
            return False
        k = Kernel(spec, connection_file, limits)
        result.started += 1
        try:
            await k.start()
        except Exception as e:  # noqa: BLE001
            result.startup_error = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"the kernel did not start: {result.startup_error}")
            await k.stop()
            state["kernel"] = None
            return False
        state["kernel"] = k
        if k.pgid and k.pgid not in result.pgids:
            result.pgids.append(k.pgid)
        return True

    async def replay() -> bool:
        """A new kernel with the cells that ran before (their outputs kept from the first run)."""
        if not await start():
            return False
        scratch: dict = {}
        done = [(k, c) for k, c in cells if k in outputs and k not in skip]
        dead = await _run_cells(state["kernel"], done, scratch, SessionResult(executed=nb), limits, t0, [0], skip)
        return dead is None

    try:
        if not await start():
            return result
        pending = list(cells)
        while pending:
            dead = await _run_cells(state["kernel"], pending, outputs, result, limits, t0, spent, skip)
            if dead is None:
                break
            result.died.append(cell_label(nb.cells[dead], dead))
            skip.add(dead)
            pending = [(k, c) for k, c in pending if k > dead]
            if not pending or not await replay():
                break
        if state["kernel"] is not None and not await state["kernel"].alive() and not await replay():
            return result
        # the judge: in the same kernel; a judge that times the entry against the baseline also gets a clean
        # kernel (`clean`: started on its first request, running only the grader's requests)
        async def request(k: Kernel, ops, timeout, remote, fresh) -> list:
            nonce = secrets.token_hex(8)
            request = json.dumps({"id": nonce, "ops": ops, "fresh": bool(fresh)})
            code = f"__import__('course_grading.driver', fromlist=['serve']).serve({request!r})"
            found = []

            def sink(kind, content):
                data = content.get("data") if kind == "display_data" else None
                if isinstance(data, dict) and isinstance(data.get(wire.MIME), dict):
                    reply = data[wire.MIME]
                    if reply.get("id") == nonce and not found:
                        found.append(reply)

            def stdin(prompt):
                if remote is None or not prompt.startswith(RPC_PREFIX) or len(prompt) > wire.MAX_BYTES:
                    return json.dumps({"raised": {"module": "builtins", "type": "RuntimeError",
                                                  "message": "no input is given while grading"}})
                try:
                    request = json.loads(prompt[len(RPC_PREFIX):])
                except ValueError:
                    request = None
                return json.dumps(remote(request))
            dropped = k.dropped_messages
            status = await k.execute(code, timeout, sink, store_history=False, stdin=stdin)
            result.messages_dropped += k.dropped_messages - dropped
            if status == "dead":
                raise KernelGone("the kernel died or stopped answering during this call")
            if status == "timeout":
                raise KernelGone(f"the call ran longer than {timeout:g} s and was interrupted")
            if not found:
                return []
            results = found[0].get("results")
            return results if isinstance(results, list) else []

        async def send_async(ops, timeout, remote=None, fresh=True, where="entry"):
            if where == "clean":
                if clean is None:
                    raise ValueError("this session has no clean kernel (run_submission's clean=)")
                if state.get("clean") is None:
                    k = Kernel(clean["spec"], clean["connection_file"], limits)
                    try:
                        await k.start()
                    except Exception as e:  # noqa: BLE001
                        await k.stop()
                        raise RuntimeError(f"the grader's clean kernel did not start: {type(e).__name__}: "
                                           f"{str(e)[:300]}") from None
                    state["clean"] = k
                    if k.pgid and k.pgid not in result.pgids:
                        result.pgids.append(k.pgid)
                try:
                    return await request(state["clean"], ops, timeout, remote, fresh)
                except KernelGone as e:
                    raise RuntimeError(f"the grader's clean kernel failed: {e}") from None
            if where != "entry":
                raise ValueError(f"where must be 'entry' or 'clean', got {where!r}")
            k = state["kernel"]
            if k is None:
                raise KernelGone("no kernel")
            left = limits.budget - (time.monotonic() - t0)
            if left <= 0:
                raise KernelGone(f"the time budget of {limits.budget:g} s was used up")
            return await request(k, ops, min(timeout, left), remote, fresh)

        loop = asyncio.get_running_loop()

        def send(ops, timeout, remote=None, fresh=True, where="entry"):
            return asyncio.run_coroutine_threadsafe(send_async(ops, timeout, remote, fresh, where), loop).result()

        def launcher(which):
            k = state.get(which)
            proc = getattr(getattr(getattr(k, "km", None), "provisioner", None), "process", None)
            return getattr(proc, "pid", None)

        clocks = {"entry": CpuClock((spec or {}).get("cgroup") or (), (spec or {}).get("uid"),
                                    lambda: launcher("kernel"))}
        if clean is not None:
            cs = clean["spec"] or {}
            clocks["clean"] = CpuClock(cs.get("cgroup") or (), cs.get("uid"), lambda: launcher("clean"))
        send.cpu = lambda where="entry": clocks[where]()
        send.clock_kind = lambda where="entry": clocks[where].kind

        def restart():
            return asyncio.run_coroutine_threadsafe(replay(), loop).result()

        if state["kernel"] is not None:
            result.verdict = await loop.run_in_executor(None, judge_fn, send, restart)
    finally:
        for which in ("kernel", "clean"):
            if state.get(which) is not None:
                await state[which].stop()
        result.elapsed = time.monotonic() - t0
        for k, c in enumerate(nb.cells):
            if c.get("cell_type") == "code":
                c["outputs"] = outputs.get(k, [])
                c["execution_count"] = None
        result.executed = nb
    return result


# ---------------------------------------------------------------------------------------------------
# the start-up check

CHECK_MARK = "course-grade-check:"
CHECK_CODE = r"""
import ctypes, importlib.util, json, os
import course_lib, course_lib.checks, course_grading.driver
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
keys = None if nr is None else libc.syscall(ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))
print(MARK + json.dumps({"uid": os.getuid(),
    "lib": os.path.dirname(os.path.dirname(os.path.abspath(course_lib.__file__))),
    "driver": os.path.dirname(os.path.dirname(os.path.abspath(course_grading.driver.__file__))),
    "pipeline": any(importlib.util.find_spec("course_grading." + m) is not None for m in ("sandbox", "judging")),
    "keyctl": keys, "repo": sorted(os.listdir(REPO)) if os.path.isdir(REPO) else []}))
"""


def check_kernel(iso, scratch, timeout: float = 120.0) -> dict:
    """Start a real kernel at `iso`'s level, as a submission's would be started, run one cell and check
    what it sees (its user, its own copies of course_lib and of the driver, no pipeline, no repository, no
    key system call); raise SandboxUnavailable with the reason (the jail's own words where it failed) when
    it does not start or sees more than it should. Returns what the kernel reported."""
    ks = scratch.kernel("check")
    conn = ks.run / "kernel.json"
    spec = kernel_spec(iso, ks, conn, "check", None, scratch.lib)
    repo = str(course_lib_root().resolve())
    code = CHECK_CODE.replace("MARK", repr(CHECK_MARK)).replace("REPO", repr(repo))
    printed: list[str] = []
    error = None

    errfile = scratch.private / "check-stderr.txt"  # what the jail, bubblewrap or the kernel said

    async def go():
        nonlocal error
        with open(errfile, "w") as fh:
            k = Kernel(spec, str(conn), Limits(cell_timeout=timeout), stderr=fh)
            try:
                await k.start()
                await k.execute(code, timeout, lambda kind, c: printed.append(str(c.get("text", "")))
                                if kind == "stream" else None)
            except Exception as e:  # noqa: BLE001 - any failure to start or run is the answer
                error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            finally:
                await k.stop()
    try:
        asyncio.run(go())
    finally:
        jail = ""
        for f in (ks.report, errfile):
            try:
                jail += f.read_text(errors="replace").strip()[-800:] + "\n"
            except OSError:
                pass
        jail = jail.strip()
        scratch.release(ks)
    seen = None
    for line in "".join(printed).splitlines():
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
    # (solutions/, judges/, course_lib/, ...) may be in reach.
    bound = {Path(p).relative_to(repo).parts[0] for p in python_paths() if p.startswith(repo + "/")}
    if iso.private and set(seen["repo"]) - bound:
        problems.append(f"it can see the repository ({repo}: {', '.join(sorted(set(seen['repo']) - bound))})")
    if iso.private and seen["lib"] != LIB_MOUNT:
        problems.append(f"it imports course_lib from {seen['lib']}, not its private copy")
    if iso.private and seen["driver"] != LIB_MOUNT:
        problems.append(f"it imports the judge's driver from {seen['driver']}, not its private copy")
    if iso.private and seen["pipeline"]:
        problems.append("it can import the grader's pipeline (course_grading.sandbox or .judging)")
    if seen.get("keyctl") is not None and seen["keyctl"] >= 0:
        problems.append("it can use the key system calls (keyctl): the grader's keyrings are not out of reach")
    if problems:
        raise SandboxUnavailable(f"the grading kernel at {where} is not isolated as it should be: "
                                 + "; ".join(problems))
    return seen
