"""Kernel side of the judge: runs the calls the grader sends and sends back plain data (stdlib only).

The grader executes one line in the student's kernel per request:

    __import__("course_grading.driver", fromlist=["serve"]).serve('<request as JSON>')

A request is ``{"id": nonce, "ops": [op, ...], "fresh": bool}`` (fresh: forget the objects stored by earlier
requests; the judge sends it with each part's first request); the reply, published as a display output of the MIME
type `wire.MIME`, is ``{"id": nonce, "results": [result, ...]}``, one result per op:

    {"op": "call", "fn": TARGET, "args": [...], "kwargs": {...}, "store": NAME?, "send": true?, "watch": "tensors"?}
        call it; keep the result under NAME (for later ops, until a fresh request) and/or send it back
    {"op": "get", "fn": TARGET}            send back the value of TARGET (an attribute, a property)
    {"op": "drop", "names": [NAME, ...]}   forget stored objects
    {"op": "let", "store": NAME, "value": V}   keep a value the grader sent (a remote object's stand-in) as NAME

An argument ``{"$remote": NAME, "attrs": [...], "methods": [...]}`` is a stand-in for an object that lives in
the grader (a reference collaborator, e.g. the course's allocator for a student's block manager): reading one
of its `attrs` or calling one of its `methods` asks the grader over the kernel's stdin channel (the request's
``allow_stdin``) and returns its answer; an exception the grader's object raised is raised here again, as the
library's exception class of that name (OutOfBlocks, PagingError, ...), with its message and attributes.
Nothing of the object's code comes to the kernel.

TARGET is ``name.attr...`` in the notebook's namespace (the student's functions and classes), ``$NAME.attr...``
on a stored object, or ``lib:course_lib.module.name`` (a public name of the course's library). Arguments are
`wire` values, where ``{"$ref": NAME}`` is a stored object, ``{"$name": NAME}`` a name of the notebook (the
student's function, handed to a library call) and ``{"$gen": seed}`` a fresh torch.Generator.

A result is ``{"ok": value}`` (value in `wire` form, or null when not sent), ``{"raised": {"type", "mro",
"message"}}`` when the student's code raised, or ``{"error": text}`` when the op itself was malformed or
its value could not be sent; ``"seconds"`` (the call's wall time) and, with ``"watch": "tensors"``,
``"watch": {"largest": elements, "largest_shape": [...], "matmul_elements": n}`` (every tensor any torch
operation returned during the call: what a memory or work bound is judged on).

Nothing here decides anything: what comes back is what the student's code did, and the grader judges it
in its own process. A student's code can replace this module; it can then send whatever it likes, which
is no more than answering the calls itself. The grader never sends expected values, hidden tests or the
reference implementation of what is graded.
"""
from __future__ import annotations

import importlib
import json
import sys
import time

try:
    from . import wire
except ImportError:  # loaded as a top-level module (the tests)
    import wire  # type: ignore

_store: dict = {}
_namespace_override: dict | None = None
_remote_handler = None           # tests: answers a remote request in this process instead of over stdin
MAX_MESSAGE = 500
RPC_PREFIX = "course-judge-rpc:"


def _namespace() -> dict:
    if _namespace_override is not None:
        return _namespace_override
    try:
        from IPython import get_ipython
        ip = get_ipython()
        if ip is not None:
            return ip.user_ns
    except Exception:  # noqa: BLE001
        pass
    return vars(sys.modules["__main__"])


class OpError(Exception):
    """The op is malformed (an unknown name, a bad target): the grader's request, not the student's code."""


def _resolve(target: str):
    if not isinstance(target, str) or not target:
        raise OpError(f"a target must be a non-empty string, got {target!r}")
    if target.startswith("lib:"):
        path = target[4:]
        if not path.startswith("course_lib.") and not path.startswith("torch."):
            raise OpError(f"{path}: only names of course_lib and torch can be asked for")
        parts = path.split(".")
        for k in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:k]))
            except ImportError:
                continue
            for name in parts[k:]:
                obj = getattr(obj, name)
            return obj
        raise OpError(f"{path}: no such module")
    head, *attrs = target.split(".")
    if head.startswith("$"):
        if head[1:] not in _store:
            raise OpError(f"{head}: no object stored under this name (an earlier op failed?)")
        obj = _store[head[1:]]
    else:
        ns = _namespace()
        if head not in ns:
            raise NameError(f"name {head!r} is not defined in the notebook")
        obj = ns[head]
    for a in attrs:
        obj = getattr(obj, a)
    return obj


def _ref(name: str):
    if name not in _store:
        raise OpError(f"${name}: no object stored under this name (an earlier op failed?)")
    return _store[name]


def _rpc(request: dict):
    """Ask the grader (see the module's docstring); the answer's value, or its exception raised here."""
    text = json.dumps(request)
    if _remote_handler is not None:
        reply = json.loads(json.dumps(_remote_handler(json.loads(text))))
    else:
        import builtins
        reply = json.loads(builtins.input(RPC_PREFIX + text))
    if "ok" in reply:
        return wire.decode(reply["ok"])
    raised = reply.get("raised") or {}
    raise _rebuilt(raised)


def _rebuilt(raised: dict) -> BaseException:
    """The grader object's exception as an instance of the library's class of that name (or RuntimeError)."""
    cls = None
    module, name = str(raised.get("module", "")), str(raised.get("type", ""))
    if module == "builtins" or module.startswith("course_lib."):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            cls = None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return RuntimeError(f"{name}: {raised.get('message', '')}")
    e = cls.__new__(cls)
    Exception.__init__(e, str(raised.get("message", "")))
    try:
        for k, v in (wire.decode(raised.get("state") or {"$dict": []}) or {}).items():
            setattr(e, str(k), v)
    except Exception:  # noqa: BLE001
        pass
    return e


class Remote:
    """A stand-in for an object of the grader's: its `attrs` are read and its `methods` called over `_rpc`."""

    def __init__(self, name: str, attrs, methods):
        object.__setattr__(self, "_remote", (str(name), frozenset(map(str, attrs)), frozenset(map(str, methods))))

    def __getattr__(self, attr):
        name, attrs, methods = object.__getattribute__(self, "_remote")
        if attr in attrs:
            return _rpc({"remote": name, "get": attr})
        if attr in methods:
            def method(*args, **kwargs):
                return _rpc({"remote": name, "call": attr, "args": wire.encode(list(args)),
                             "kwargs": wire.encode(dict(kwargs))})
            method.__name__ = attr
            return method
        raise AttributeError(f"{name} has no attribute {attr!r} (it offers {', '.join(sorted(attrs | methods))})")

    def __setattr__(self, attr, value):
        raise AttributeError(f"{object.__getattribute__(self, '_remote')[0]} is read-only here")

    def __repr__(self):
        return f"<{object.__getattribute__(self, '_remote')[0]} (the grader's)>"


def _resolve_tag(kind: str, value):
    """`wire.decode`'s hook: a stored object (``$ref``) or a remote object (``$remote``)."""
    if kind == "$ref":
        return _ref(value["$ref"])
    if kind == "$name":            # a name of the notebook's namespace: the student's function itself
        ns = _namespace()
        if value["$name"] not in ns:
            raise OpError(f"name {value['$name']!r} is not defined in the notebook")
        return ns[value["$name"]]
    if kind == "$remote":
        return Remote(value.get("$remote"), value.get("attrs") or (), value.get("methods") or ())
    raise OpError(f"unknown tag {kind}")


def _raised(e: BaseException) -> dict:
    try:
        message = str(e)
    except Exception:  # noqa: BLE001
        message = "?"
    mro = [k.__name__ for k in type(e).__mro__ if k is not object][:20]
    return {"raised": {"type": type(e).__name__, "mro": mro, "message": message[:MAX_MESSAGE]}}


def _watcher():
    """A TorchFunctionMode that records the largest tensor any torch operation returns and the elements
    of all matmul results (the scores and p @ v products: the work done)."""
    from torch.overrides import TorchFunctionMode
    import torch

    class Watch(TorchFunctionMode):
        MATMULS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "mm", "baddbmm", "addmm"}

        def __init__(self):
            super().__init__()
            self.largest, self.largest_shape, self.matmul_elements = 0, [], 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    if t.numel() > self.largest:
                        self.largest, self.largest_shape = t.numel(), list(t.shape)
                    if getattr(func, "__name__", "") in self.MATMULS:
                        self.matmul_elements += t.numel()
            return out

        def report(self):
            return {"largest": self.largest, "largest_shape": self.largest_shape,
                    "matmul_elements": self.matmul_elements}

    return Watch()


def run_op(op) -> dict:
    if not isinstance(op, dict) or op.get("op") not in ("call", "get", "drop", "let"):
        return {"error": f"not an op: {str(op)[:200]}"}
    if op["op"] == "drop":
        for n in op.get("names") or []:
            _store.pop(str(n), None)
        return {"ok": None}
    if op["op"] == "let":
        try:
            _store[str(op.get("store"))] = wire.decode(op.get("value"), arrays="native", refs=_resolve_tag)
        except (wire.WireError, OpError) as e:
            return {"error": f"the value could not be read: {e}"}
        return {"ok": None}
    try:
        fn = _resolve(op.get("fn"))
    except OpError as e:
        return {"error": str(e)}
    except BaseException as e:  # noqa: BLE001 - a missing name or a property that raises is the student's
        if isinstance(e, KeyboardInterrupt):
            raise
        return _raised(e)
    if op["op"] == "get":
        value, seconds, watch = fn, 0.0, None
    else:
        try:
            args = wire.decode(op.get("args") or [], arrays="native", refs=_resolve_tag)
            kwargs = wire.decode(op.get("kwargs") or {"$dict": []}, arrays="native", refs=_resolve_tag)
        except (wire.WireError, OpError) as e:
            return {"error": f"the arguments could not be read: {e}"}
        watch = _watcher() if op.get("watch") == "tensors" else None
        t0 = time.perf_counter()
        try:
            if watch is not None:
                with watch:
                    value = fn(*args, **kwargs)
            else:
                value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - SystemExit from a student's function is an answer too
            if isinstance(e, KeyboardInterrupt):
                raise
            if op.get("store"):
                _store.pop(str(op["store"]), None)
            return {**_raised(e), "seconds": time.perf_counter() - t0}
        seconds = time.perf_counter() - t0
        if op.get("store"):
            _store[str(op["store"])] = value
    out = {"ok": None, "seconds": seconds}
    if watch is not None:
        out["watch"] = watch.report()
    if op["op"] == "get" or op.get("send", True):
        try:
            out["ok"] = wire.encode(value)
        except wire.WireError as e:
            return {"error": f"the result could not be sent: {e}", "seconds": seconds}
        except BaseException as e:  # noqa: BLE001 - a tensor subclass whose methods raise, ...
            if isinstance(e, KeyboardInterrupt):
                raise
            return {"error": f"the result could not be sent: {type(e).__name__}: {str(e)[:200]}", "seconds": seconds}
    return out


def handle(request_text: str, namespace: dict | None = None, remote=None, store: dict | None = None) -> dict:
    """The reply to one request (a JSON text); `namespace` replaces the notebook's, `remote` answers the
    remote objects' requests and `store` replaces the kept objects (tests: two "kernels" in one process)."""
    global _namespace_override, _remote_handler, _store
    req = json.loads(request_text)
    results = []
    kept = _store
    _namespace_override, _remote_handler = namespace, remote
    if store is not None:
        _store = store
    if req.get("fresh", True):      # a part's first request: no object of an earlier part answers for it
        _store.clear()
    try:
        for op in req.get("ops") or []:
            results.append(run_op(op))
    finally:
        _namespace_override, _remote_handler, _store = None, None, kept
    return {"id": req.get("id"), "results": results}


def serve(request_text: str) -> None:
    """Handle one request and publish the reply as a display output of the judge's MIME type."""
    reply = handle(request_text)
    from IPython.display import publish_display_data
    publish_display_data({wire.MIME: reply})
