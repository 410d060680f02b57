"""`course grade --jobs N`: several submissions at a time, each still in its own sandbox and scratch.

A submission's time is mostly its kernel's (start-up, imports, the tests), so N kernels at a time
divide the wall time by up to N while the cores and memory last. The grading of one submission
(`autograde._grade_one`: read, repair, autograde in a scratch copy) runs in a worker process of its
own (spawned, so nbgrader's global logger never mixes two students' logs); everything shared -- the
instructor's gradebook, the feedback, the output files -- is done by the grader's main process, one
submission at a time, from the worker's result. The grades and files are those of ``--jobs 1``
(`tests/test_grading_jobs.py`), apart from the timings in the messages.

Concurrent kernels must not reach each other. Where kernels run as an unprivileged user (the grader
is root: levels ``user`` and ``bwrap``), each worker has its own user: the first ``--sandbox-user``
(default ``nobody``), then the other users given (``--sandbox-user nobody,grader1``), then user ids
with no account and no process on this machine, taken from the top of the range systemd reserves for
dynamic users (61184-65519). Two kernels of the same user could read each other's scratch and
connection files; two users cannot. At level ``process`` every kernel is the grader's own user
(trusted notebooks only), so more than one job there is refused unless asked for explicitly.

``--jobs auto``: one kernel per two cores (each kernel runs with OMP_NUM_THREADS=2), no more than the
available memory holds at ``--memory-limit`` per kernel, no more than the submissions. The default is
1: cell time limits and the notebook budget are wall-clock times, so on a machine that is already busy
more kernels at once can push a slow but correct submission over its limit.
"""
from __future__ import annotations

import dataclasses
import os
import pwd
import sys
import time
import traceback
from pathlib import Path

from .collect import terminal_safe
from .sandbox import exposed_paths, resolve_user

DYNAMIC_UIDS = range(65519, 61183, -1)  # systemd's dynamic-user range, from the top


class JobsError(ValueError):
    """--jobs asks for something this machine or level cannot do safely (the message says what)."""


def parse_jobs(value) -> int | str:
    """``--jobs`` as given: a positive int or "auto"."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        try:
            value = int(value)
        except ValueError:
            raise JobsError(f"--jobs must be a positive number or 'auto', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobsError(f"--jobs must be a positive number or 'auto', got {value!r}")
    return value


def _mem_available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def auto_jobs(n_submissions: int, memory_gb: float | None) -> tuple[int, str]:
    """(jobs, why) for ``--jobs auto``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n, why = max(1, cores // 2), [f"{cores} cores / 2 threads per kernel"]
    mem = _mem_available_gib()
    if memory_gb and mem is not None:
        by_mem = max(1, int(mem // memory_gb))
        why.append(f"{mem:.0f} GiB available / {memory_gb:g} GiB per submission (its kernels)")
        n = min(n, by_mem)
    n = max(1, min(n, n_submissions))
    return n, ", ".join(why)


def _busy_uids() -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.add(int((d / "status").read_text().split("Uid:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                continue
    return out


def free_uids(n: int, exclude=()) -> list[int]:
    """`n` user ids with no account (passwd) and no running process, from systemd's dynamic range."""
    busy, out = _busy_uids() | set(exclude), []
    for uid in DYNAMIC_UIDS:
        if len(out) == n:
            break
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            out.append(uid)
    if len(out) < n:
        raise JobsError(f"cannot find {n} free user ids for the kernels; name users with --sandbox-user")
    return out


def submission_uids(n: int) -> list[int]:
    """One fresh user id per submission (no account, no process: `free_uids`), so that no two kernels of a
    run ever share a user (its files, its keyring, its processes), whatever they leave behind."""
    return free_uids(n)


def sandbox_slots(iso, n: int, users=(), explicit_process: bool = False, fresh: bool = False) -> tuple[list, str]:
    """One isolation per worker (a distinct sandbox user where the kernels run as one), and a line
    saying who the kernels run as. `fresh`: every submission gets a user id of its own
    (`submission_uids`), whatever the worker."""
    if fresh and iso.uid is not None:
        return [iso] * n, (f"{'jobs: ' + str(n) + ' kernels at a time; ' if n > 1 else ''}each submission runs as "
                           "a fresh user id of its own (no account, no process), from systemd's dynamic range")
    if n == 1:
        return [iso], ""
    if iso.uid is None and iso.level == "bwrap":  # bubblewrap without root: each kernel in namespaces of its own
        return [iso] * n, (f"jobs: {n} kernels at a time, all as your own user, each in its own bubblewrap "
                           "namespaces (filesystem, processes, network)")
    if iso.uid is None:
        if not explicit_process:
            raise JobsError(f"--jobs {n} at isolation level '{iso.level}': the kernels would all run as you and "
                            "could reach each other; grade as root or with bubblewrap, or ask for "
                            "--isolation process explicitly (trusted notebooks only)")
        return [iso] * n, f"jobs: {n} kernels at a time, all as the grader's own user (level process)"
    uids = [(iso.uid, iso.gid, iso.user)]
    for u in users:
        uid, gid, name = resolve_user(u)
        if uid not in {x for x, _, _ in uids}:
            uids.append((uid, gid, name))
    uids = uids[:n]
    if len(uids) < n:  # no account: its own group id too, so no two kernels share a group
        uids += [(u, u, f"uid {u}") for u in free_uids(n - len(uids), exclude={x for x, _, _ in uids})]
    slots = [dataclasses.replace(iso, uid=uid, gid=gid, user=name, notes=list(iso.notes),
                                 expose=exposed_paths(uid, gid) if iso.expose or iso.level == "bwrap" else [])
             for uid, gid, name in uids]
    who = ", ".join(f"{name} ({uid})" if not name.startswith("uid ") else f"{name} (no account)"
                    for uid, _, name in uids)
    return slots, f"jobs: {n} kernels at a time, each as its own user: {who}"


# ---------------------------------------------------------------------------------------------------
# progress

def _fmt_secs(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _line(r) -> str:
    score = f"{r.score:g}/{r.max_score:g}" if r.score is not None and r.max_score is not None else "-"
    return f"{r.assignment} {terminal_safe(r.student)}: {score} {r.status}"


class LineProgress:
    """One line per graded submission, with the elapsed time and an estimate of what is left."""

    def __init__(self, say, total: int):
        self.say, self.total, self.done, self.t0 = say, total, 0, time.monotonic()

    def write(self, text: str):
        self.say(text)

    def advance(self, r):
        self.done += 1
        el = time.monotonic() - self.t0
        eta = el / self.done * (self.total - self.done)
        self.say(f"[{self.done}/{self.total}] {_line(r)}  ({_fmt_secs(el)} elapsed, about {_fmt_secs(eta)} left)")

    def close(self):
        pass


class BarProgress:
    """A tqdm bar on the terminal (stderr), the submission just graded beside it."""

    def __init__(self, total: int, stream=None):
        from tqdm import tqdm
        self.bar = tqdm(total=total, unit="submission", file=stream or sys.stderr, dynamic_ncols=True,
                        smoothing=0.1, bar_format="{l_bar}{bar}| {n}/{total} [{elapsed}<{remaining}] {postfix}")

    def write(self, text: str):
        self.bar.write(text)

    def advance(self, r):
        self.bar.set_postfix_str(_line(r)[:60], refresh=False)
        self.bar.update(1)

    def close(self):
        self.bar.close()


# ---------------------------------------------------------------------------------------------------
# running

_WORKER: dict = {}


def _init_worker(slots) -> None:
    _WORKER["iso"] = slots.get()


def _work(grade_one, ctx, sub, r, release_nb, uid):
    if "iso" in _WORKER:
        ctx.iso = _WORKER["iso"]
    return grade_one(ctx, sub, r, release_nb, uid)


def run(grade_one, ctx, todo: list, release_nbs: dict, slots: list, finish, progress) -> None:
    """Grade `todo` ([(index, Submission, Result, uid or None)]) with one worker per slot: `grade_one(ctx,
    sub, r, release_nb, uid) -> (result, carry)` (a module-level function: a worker process gets it by name)
    in the worker, `finish(index, result, carry)` in this process, one at a time, as results come in."""
    if len(slots) == 1:
        ctx.iso = slots[0]
        for idx, sub, r, uid in todo:
            r2, carry = grade_one(ctx, sub, r, release_nbs[sub.assignment], uid)
            finish(idx, r2, carry)
            progress.advance(r2)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    for s in slots:
        queue.put(s)
    with ProcessPoolExecutor(max_workers=len(slots), mp_context=mp, initializer=_init_worker,
                             initargs=(queue,)) as pool:
        futures = {pool.submit(_work, grade_one, ctx, sub, r, release_nbs[sub.assignment], uid): (idx, r)
                   for idx, sub, r, uid in todo}
        for fut in as_completed(futures):
            idx, r = futures[fut]
            try:
                r2, carry = fut.result()
            except Exception as e:  # a worker process died: this submission is not graded, the rest go on
                r2, carry = r, None
                r2.status, r2.score, r2.max_score = "error", None, None
                r2.flags.setdefault("grader_crashed", [])
                r2.messages.append(f"the grader's worker failed on this submission: {type(e).__name__}: {e}")
                r2.log = (r2.log or "") + traceback.format_exc()
            finish(idx, r2, carry)
            progress.advance(r2)
