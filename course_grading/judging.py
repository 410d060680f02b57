"""The judge: a lab's parts graded in the grader's process, on plain data from the student's kernel.

A lab's judge is a file ``judges/labNN.py`` (the instructor's, never released) that makes a `Judge` and
registers one function per graded test cell (its nbgrader grade_id):

    from course_grading.judging import Judge
    from course_lib.checks import check_close
    from course_lib.perf.ops import matmul_cost as ref_matmul_cost      # the reference, grader side only

    judge = Judge(references={"matmul_cost_tests": ["course_lib.perf.ops.matmul_cost"]})

    @judge.part("matmul_cost_tests")
    def matmul_cost(t):
        for m, n, k, b in [(1, 1, 1, 2)] + [(t.rng.randint(1, 9000), ...) for _ in range(20)]:
            with t.case(f"matmul_cost({m}, {n}, {k}, {b})"):
                got = t.call("matmul_cost", m, n, k, b)         # runs in the student's kernel
                ref = ref_matmul_cost(m, n, k, b)               # runs here
                check_close(got[0], ref.flops, "FLOPs", mistakes={t.mistake("flops_mnk"): m * n * k})

What `t` (a `Trial`) gives a part:
* ``t.rng`` (random.Random) and ``t.seed``: drawn from the class secret, the lab, the part and the student's
  key, so a regrade draws the same cases and a student cannot know them in advance (`case_seed`);
* ``t.call(fn, *args, **kwargs)`` calls a name of the notebook in the kernel and returns the result as plain
  data (`wire`); when the student's code raises, `StudentRaised` (with the exception's type names);
  ``t.run([Call(...), Get(...), ...])`` sends several ops in one round trip and returns their `Outcome`s
  (objects kept in the kernel with ``store=``, named in later ops' arguments with `ref`, for the rest of the
  part: each part starts with none);
* ``t.case(label, group=..., weight=...)``: one case; an AssertionError (``course_lib.checks`` messages), a
  `StudentRaised` or any failure to compare inside it fails the case, with its message; everything else goes on;
* ``t.mistake(key)``: the explanation of a known misconception, from the release's public ``MISTAKES`` dict,
  to pass to ``check_close(..., mistakes={explanation: wrong_value})``.
* ``Judge(clean=True)``: the grader starts a clean kernel beside the student's (a sandbox of its own running
  none of the notebook); ``t.run(ops, where="clean")`` sends there, and ``t.cpu(where)`` reads a kernel's CPU
  seconds from outside it (the final project times its entry against the baseline this way);
* ``t.record``: plain data the part reports beyond its score (the project's leaderboard row).

Scoring: a part's points are split over its groups by their weights (``@judge.part(gid, groups={"values":
3, "errors": 1})``; one group by default) and within a group over its cases. A misconception is charged
once: a case whose failure names a misconception that an earlier part of the lab already charged passes,
with a note (the later part is judged as if the earlier part's bug were the contract).
"""
from __future__ import annotations

import ast
import hashlib
import hmac
import importlib.util
import json
import os
import random
import secrets as _secrets
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import driver, wire

SHOWN_FAILURES = 3     # failing cases shown per part on the feedback page


class StudentRaised(Exception):
    """The student's code raised (in the kernel): its type, the names of its classes, its message."""

    def __init__(self, type_name: str, mro: list, message: str):
        self.type, self.mro, self.message = str(type_name), [str(m) for m in mro], str(message)
        super().__init__(f"{self.type}: {self.message}")

    def is_a(self, *names: str) -> bool:
        """Is the exception an instance of a class with one of these names?"""
        return any(n in self.mro for n in names)


class DriverError(Exception):
    """An op could not run or its result could not come back (a name the notebook lacks is a NameError,
    a StudentRaised; this is a malformed op or a result the wire does not carry)."""


class KernelGone(Exception):
    """The kernel died or stopped answering while a part was judged: the rest of the part is not run."""


@dataclass
class Call:
    """One call in the kernel: `fn` is a notebook name (``"BlockManager"``, ``"m.append_token"``), a stored
    object (``"$m.append_token"``) or a library name (``"lib:course_lib.paged.BlockAllocator"``)."""
    fn: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    store: str | None = None
    send: bool = True
    watch: str | None = None

    def op(self) -> dict:
        out = {"op": "call", "fn": self.fn, "args": wire.encode(list(self.args)),
               "kwargs": wire.encode(dict(self.kwargs)), "send": self.send}
        if self.store:
            out["store"] = self.store
        if self.watch:
            out["watch"] = self.watch
        return out


def call(fn: str, *args, store: str | None = None, send: bool = True, watch: str | None = None, **kwargs) -> Call:
    return Call(fn, args, kwargs, store, send, watch)


@dataclass
class Get:
    """The value of a name or attribute in the kernel (``"$m.refcount"``, a property: ``"$a.num_free"``)."""
    fn: str

    def op(self) -> dict:
        return {"op": "get", "fn": self.fn}


@dataclass
class Let:
    """Keep a value in the kernel under `store` (e.g. a remote object's stand-in, for later ``$name`` ops)."""
    store: str
    value: object

    def op(self) -> dict:
        return {"op": "let", "store": self.store, "value": wire.encode(self.value)}


ref = wire.ref
notebook = wire.notebook
generator = wire.generator


class _Remotes:
    """The grader's objects a part lends to the kernel (`Trial.remote`), and the answers to the kernel's
    requests on them: only the attributes and methods lent, arguments and results as plain data."""

    def __init__(self):
        self.objects: dict = {}

    def add(self, name: str, obj, attrs, methods) -> None:
        self.objects[name] = (obj, frozenset(attrs), frozenset(methods))

    def answer(self, request) -> dict:
        try:
            if not isinstance(request, dict) or request.get("remote") not in self.objects:
                return {"raised": {"module": "builtins", "type": "RuntimeError", "message": "no such object"}}
            obj, attrs, methods = self.objects[request["remote"]]
            if "get" in request:
                if request["get"] not in attrs:
                    return {"raised": {"module": "builtins", "type": "AttributeError",
                                       "message": str(request["get"])[:100]}}
                value = getattr(obj, request["get"])
            else:
                if request.get("call") not in methods:
                    return {"raised": {"module": "builtins", "type": "AttributeError",
                                       "message": str(request.get("call"))[:100]}}
                args = wire.decode(request.get("args") or [])
                kwargs = wire.decode(request.get("kwargs") or {"$dict": []})
                if not isinstance(args, list) or not isinstance(kwargs, dict):
                    raise wire.WireError("malformed arguments")
                value = getattr(obj, request["call"])(*args, **{str(k): v for k, v in kwargs.items()})
            return {"ok": wire.encode(value)}
        except wire.WireError as e:
            return {"raised": {"module": "builtins", "type": "ValueError", "message": str(e)[:300]}}
        except Exception as e:  # noqa: BLE001 - the grader's object refused: the kernel gets the same exception
            state = {k: v for k, v in vars(e).items() if isinstance(v, (int, float, str, bool, type(None)))}
            return {"raised": {"module": type(e).__module__, "type": type(e).__name__, "message": str(e)[:500],
                               "state": wire.encode(state)}}


@dataclass
class Outcome:
    """What one op gave: a value, or the student's exception, or the op's own failure."""
    value: object = None
    raised: StudentRaised | None = None
    error: str | None = None
    seconds: float | None = None
    watch: dict | None = None

    @property
    def ok(self) -> bool:
        return self.raised is None and self.error is None

    def get(self):
        """The value; raises the student's exception (StudentRaised) or the op's failure (DriverError)."""
        if self.raised is not None:
            raise self.raised
        if self.error is not None:
            raise DriverError(self.error)
        return self.value


def _outcome(raw) -> Outcome:
    if not isinstance(raw, dict):
        return Outcome(error="the kernel sent no result for this call")
    secs = raw.get("seconds") if isinstance(raw.get("seconds"), (int, float)) else None
    watch = raw.get("watch") if isinstance(raw.get("watch"), dict) else None
    if "raised" in raw and isinstance(raw["raised"], dict):
        r = raw["raised"]
        mro = r.get("mro") if isinstance(r.get("mro"), list) else []
        return Outcome(raised=StudentRaised(str(r.get("type", "Exception"))[:100], [str(m)[:100] for m in mro[:20]],
                                            str(r.get("message", ""))[:500]), seconds=secs)
    if "error" in raw:
        return Outcome(error=str(raw["error"])[:500], seconds=secs)
    if "ok" not in raw:
        return Outcome(error="the kernel sent a malformed result")
    try:
        return Outcome(value=wire.decode(raw["ok"]), seconds=secs, watch=watch)
    except (wire.WireError, ValueError, TypeError) as e:
        return Outcome(error=f"the result could not be read: {e}", seconds=secs)


# ---------------------------------------------------------------------------------------------------
# cases and parts

@dataclass
class CaseResult:
    label: str
    group: str
    weight: float = 1.0
    passed: bool = False
    message: str = ""
    note: str = ""                     # a passed case's remark (a misconception already charged)
    misconception: str | None = None   # the explanation this failure matched


@dataclass
class PartResult:
    grade_id: str
    points: float
    score: float = 0.0
    cases: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)    # group -> weight
    error: str | None = None                      # the judge itself failed (a grader bug): flagged
    kernel_gone: bool = False
    record: dict | None = None                    # what a part reports beyond its score (the project's board)

    def summary(self) -> dict:
        """group -> (passed, total)."""
        out: dict = {}
        for c in self.cases:
            p, n = out.get(c.group, (0, 0))
            out[c.group] = (p + int(c.passed), n + 1)
        return out

    def misconceptions(self) -> list[str]:
        seen = []
        for c in self.cases:
            if c.misconception and c.misconception not in seen:
                seen.append(c.misconception)
        return seen

    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]


def part_score(points: float, cases: list, groups: dict | None) -> float:
    """points x the weighted share of passed cases: each group's weight split over its cases."""
    by_group: dict = {}
    for c in cases:
        by_group.setdefault(c.group, []).append(c)
    if not by_group:
        return 0.0
    weights = {g: float((groups or {}).get(g, 1.0)) for g in by_group}
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    share = 0.0
    for g, cs in by_group.items():
        w = sum(c.weight for c in cs)
        if w > 0:
            share += weights[g] / total * sum(c.weight for c in cs if c.passed) / w
    return round(points * share, 4)


class Trial:
    """One part judged for one student (see the module's docstring)."""

    def __init__(self, grade_id: str, send, seed: int, mistakes: dict, charged: dict, part_label: str,
                 timeout: float = 60.0):
        self.grade_id, self._send, self.seed = grade_id, send, seed
        self.rng = random.Random(seed)
        self._mistakes, self._charged, self._label = mistakes, charged, part_label
        self.timeout = timeout
        self.cases: list[CaseResult] = []
        self.record: dict | None = None      # plain data a part reports beyond its score (the project's board)
        self._gen = None
        self._remotes = _Remotes()
        self._sent: set = set()      # the part's first request to a kernel starts its store afresh

    # -- the kernel ------------------------------------------------------------------------------
    def run(self, ops: list, where: str = "entry") -> list[Outcome]:
        """Send the ops in one request; one Outcome each (raises KernelGone when the kernel is gone).
        ``where="clean"``: to the clean kernel of a judge made with ``Judge(clean=True)``, which runs none of
        the student's code (its own store of objects; `ref` names objects of the kernel the request goes to)."""
        if not ops:
            return []
        raw = self._send([o.op() for o in ops], self.timeout, self._remotes.answer, where not in self._sent, where)
        self._sent.add(where)
        if not isinstance(raw, list):
            raw = []
        return [_outcome(raw[k] if k < len(raw) else None) for k in range(len(ops))]

    def call(self, fn: str, *args, **kwargs):
        """Call `fn` in the kernel; its result as plain data (raises StudentRaised, DriverError)."""
        return self.run([Call(fn, args, kwargs)])[0].get()

    def batch(self, items) -> None:
        """[(label, group, Call, check(value))]: every call in one round trip, then one case each, in which
        `check` judges the call's value (a request costs the kernel a few milliseconds: batch the cases that do
        not depend on each other)."""
        items = list(items)
        for (label, group, _, check), o in zip(items, self.run([c for _, _, c, _ in items])):
            with self.case(label, group=group):
                check(o.get())

    def outcome(self, fn: str, *args, **kwargs) -> Outcome:
        return self.run([Call(fn, args, kwargs)])[0]

    def remote(self, name: str, obj, attrs=(), methods=()):
        """Lend the grader's `obj` to the kernel as `name`: pass the result as an argument of a call; the
        kernel's stand-in (`driver.Remote`) reads `attrs` and calls `methods` here, during that request. A
        reference collaborator whose code never enters the kernel (a later part judged on the reference of
        an earlier one)."""
        self._remotes.add(name, obj, attrs, methods)
        return wire.remote(name, attrs, methods)

    def cpu(self, where: str = "entry") -> float | None:
        """The CPU seconds the kernel's processes (`where`: "entry" or "clean") have used so far, read from
        outside the kernel (`session.CpuClock`); None where it cannot be read."""
        reader = getattr(self._send, "cpu", None)
        return reader(where) if reader is not None else None

    def clock_kind(self, where: str = "entry") -> str:
        """How `cpu` is read: "cgroup" (exact), "proc" (a scan of the kernel's processes) or "process"
        (judged locally: this process's own CPU time)."""
        reader = getattr(self._send, "clock_kind", None)
        return reader(where) if reader is not None else "none"

    def torch_generator(self):
        """A torch.Generator seeded like `rng` (for tensors the grader draws)."""
        import torch
        if self._gen is None:
            self._gen = torch.Generator().manual_seed(self.seed % 2**63)
        return self._gen

    # -- misconceptions --------------------------------------------------------------------------
    def mistake(self, key: str) -> str:
        """The explanation of the release's MISTAKES[key] (public text)."""
        if key not in self._mistakes:
            raise KeyError(f"the lab's MISTAKES has no {key!r} (known: {', '.join(sorted(self._mistakes))})")
        return self._mistakes[key]

    # -- cases -----------------------------------------------------------------------------------
    @contextmanager
    def case(self, label: str, group: str = "main", weight: float = 1.0):
        c = CaseResult(str(label), str(group), float(weight))
        self.cases.append(c)
        try:
            yield c
        except AssertionError as e:
            self._failed(c, str(e) or f"{label}: failed")
        except StudentRaised as e:
            if e.is_a("NotImplementedError"):
                c.message = f"{label}: not implemented yet (NotImplementedError)"
            else:
                c.message = f"{label}: raised {e.type}: {e.message}"
        except DriverError as e:
            c.message = f"{label}: {e}"
        except KernelGone as e:
            c.message = f"{label}: {e}"
            raise
        except Exception as e:  # noqa: BLE001 - the student's value was of a kind the check cannot compare
            c.message = f"{label}: the answer could not be checked ({type(e).__name__}: {str(e)[:300]})"
        else:
            c.passed = True

    def _failed(self, c: CaseResult, message: str) -> None:
        for explanation in self._mistakes.values():
            if explanation in message:
                c.misconception = explanation
                earlier = self._charged.get(explanation)
                if earlier is not None and earlier != self.grade_id:
                    c.passed = True
                    c.note = (f"{c.label}: consistent with a mistake already charged in {earlier} "
                              f"({explanation.split(':')[0]}): not charged again")
                    return
                self._charged.setdefault(explanation, self.grade_id)
                break
        c.message = message

    def expect(self, condition: bool, message: str) -> None:
        """Fail the current case with `message` unless `condition`."""
        if not condition:
            raise AssertionError(message)

    def raises(self, outcome: Outcome, *names: str, what: str = "") -> None:
        """The op must have raised an exception of one of these class names."""
        label = what or "the call"
        if outcome.error is not None:
            raise DriverError(outcome.error)
        if outcome.raised is None:
            raise AssertionError(f"{label}: expected {' or '.join(names)} to be raised, but nothing was raised")
        if not outcome.raised.is_a(*names):
            raise AssertionError(f"{label}: expected {' or '.join(names)}, got {outcome.raised.type}: "
                                 f"{outcome.raised.message}")


@dataclass
class PartSpec:
    grade_id: str
    fn: object
    groups: dict | None = None


class Judge:
    """A lab's judge: one function per graded test cell (`part`), and per part the library names it is
    graded against (`references`: {grade_id: ["course_lib.module.name", ...]}, each named where it is
    defined). The kernel's copy of course_lib holds none of them (`withheld`), except those in `kept`
    ({name: why}: the library itself needs it where the lab runs, e.g. the model's default cache); an
    answer that imports any of them is flagged for review (`references.reference_imports`)."""

    def __init__(self, references: dict | None = None, kept: dict | None = None, clean: bool = False):
        self.references = {g: list(v) for g, v in (references or {}).items()}
        self.kept = dict(kept or {})
        self.clean = bool(clean)       # the grader starts a clean kernel beside the student's (`Trial.run`)
        self.parts: dict[str, PartSpec] = {}

    @property
    def withheld(self) -> list[str]:
        names = {q for v in self.references.values() for q in v}
        return sorted(names - set(self.kept))

    def part(self, grade_id: str, groups: dict | None = None):
        def register(fn):
            if grade_id in self.parts:
                raise ValueError(f"two judges for {grade_id}")
            self.parts[grade_id] = PartSpec(grade_id, fn, groups)
            return fn
        return register


# ---------------------------------------------------------------------------------------------------
# seeds, secrets, loading

def case_seed(secret: bytes, lab: str, grade_id: str, student_key: str) -> int:
    """The seed of one student's cases for one part: HMAC-SHA256 of (lab, part, student) under the class
    secret. The same secret and student give the same cases (a regrade gives the same grade); without the
    secret nobody can say which cases a student gets."""
    msg = f"{lab}\0{grade_id}\0{student_key}".encode("utf-8")
    return int.from_bytes(hmac.new(secret, msg, hashlib.sha256).digest()[:8], "big")


def load_secret(path: str | Path, create: bool = True) -> tuple[bytes, str]:
    """(the class secret, a note) from `path`: made (0600, 32 random bytes as hex) when missing."""
    p = Path(path)
    if p.exists():
        text = p.read_text(encoding="utf-8").strip()
        if len(text) < 32:
            raise ValueError(f"{p}: a class secret of at least 32 characters is expected")
        return text.encode("utf-8"), ""
    if not create:
        raise FileNotFoundError(f"{p}: no class secret")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(_secrets.token_hex(32) + "\n")
    return p.read_text(encoding="utf-8").strip().encode("utf-8"), (
        f"made a class secret in {p}: the hidden cases of every student are drawn from it; keep it (a regrade "
        "with the same secret gives the same cases and grades) and keep it from students")


def load_judge(path: str | Path) -> Judge:
    """The `judge` of a judges/labNN.py file (imported under a private module name)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no judge {p}")
    name = f"_course_judge_{p.stem}"
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    judge = getattr(mod, "judge", None)
    if not isinstance(judge, Judge):
        raise ValueError(f"{p} defines no `judge = Judge(...)`")
    judge.module = mod
    return judge


def release_mistakes(nb) -> dict[str, str]:
    """The release's ``MISTAKES = {...}`` (a dict of string literals in a code cell), or {}."""
    for c in nb.cells:
        if c.get("cell_type") != "code" or "MISTAKES" not in c.get("source", ""):
            continue
        try:
            tree = ast.parse(c.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MISTAKES"
                                                     for t in node.targets)):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    return {str(k): str(v) for k, v in value.items()}
    return {}


def local_send(namespace: dict, clean: dict | None = None):
    """A `send` that runs the ops here, in `namespace` (trusted code only: the tests of the judges run the
    instructor's solutions and mutants this way, without a kernel); ``where="clean"`` runs them in `clean`
    (another namespace of this process). ``send.cpu(where)``: this process's CPU time spent in that
    namespace's requests (as if each were a process of its own)."""
    spaces = {"entry": namespace, "clean": {} if clean is None else clean}
    stores: dict = {"entry": {}, "clean": {}}
    spent = {"entry": 0.0, "clean": 0.0}

    def send(ops, timeout, remote=None, fresh=True, where="entry"):
        t0 = time.process_time()
        try:
            reply = driver.handle(json.dumps({"id": "local", "ops": ops, "fresh": fresh}), namespace=spaces[where],
                                  remote=remote, store=stores[where])
        finally:
            spent[where] += time.process_time() - t0
        return json.loads(json.dumps(reply))["results"]     # through JSON, as from a kernel
    send.cpu = lambda where="entry": spent[where]
    send.clock_kind = lambda where="entry": "process"
    return send


@dataclass
class Verdict:
    """A submission's judged parts, in the release's order."""
    parts: dict = field(default_factory=dict)      # grade_id -> PartResult

    def scores(self) -> dict:
        return {g: p.score for g, p in self.parts.items()}


def judge_parts(judge: Judge, send, order: list[tuple[str, float]], secret: bytes, lab: str, student_key: str,
                mistakes: dict, timeout: float = 60.0, on_kernel_gone=None, labels: dict | None = None,
                log=None) -> Verdict:
    """Run the judge's parts in `order` ([(grade_id, points)], the release's test cells) through `send`
    (``send(ops, timeout, remote, fresh) -> [result]``, raising KernelGone; `remote` answers the kernel's
    requests on the grader's lent objects; `fresh` starts the kernel's store of objects afresh: each part's
    first request). A part without a judge scores 0 with an
    error (the judge is incomplete: flagged). After KernelGone the part keeps the cases it finished and
    `on_kernel_gone()` (if given) must bring a kernel back before the next part (returns False if not)."""
    verdict = Verdict()
    charged: dict = {}
    alive = True
    for gid, points in order:
        res = PartResult(gid, float(points))
        verdict.parts[gid] = res
        spec = judge.parts.get(gid)
        if spec is None:
            res.error = f"the judge has no part for {gid}"
            continue
        res.groups = dict(spec.groups or {})
        if not alive:
            res.kernel_gone = True
            res.error = None
            res.cases.append(CaseResult(f"{gid}", "main", 1.0, False, "not judged: the kernel was gone"))
            continue
        t = Trial(gid, send, case_seed(secret, lab, gid, student_key), mistakes, charged,
                  (labels or {}).get(gid, gid), timeout)
        try:
            spec.fn(t)
        except KernelGone as e:
            res.kernel_gone = True
            if log:
                log(f"{gid}: {e}")
            alive = bool(on_kernel_gone()) if on_kernel_gone else False
        except Exception as e:  # noqa: BLE001 - the judge's own failure: never a silent 0
            res.error = f"{type(e).__name__}: {e}"
            if log:
                log(f"{gid}: the judge failed:\n{traceback.format_exc()}")
        res.cases = t.cases
        res.record = t.record
        if not res.cases and res.error is None and not res.kernel_gone:
            res.error = "the judge ran no case"
        res.score = part_score(res.points, res.cases, res.groups)
    return verdict
