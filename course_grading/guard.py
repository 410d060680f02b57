"""Kernel-side guard of `course grade`: the grader puts calls to it into the notebook it executes.

`setup(nonce)` runs in a cell the grader adds before the student's first cell: it records the
originals of what tests rely on (IPython's input transformers, AST transformers, custom exception
handlers, tracing, the check functions and the modules they come from, the builtins and numpy
functions the checks use). `verify(nonce, grade_id, ns, answers)` is the first line the grader adds
to every test cell: it compares all of that with the originals, binds the check functions in the
notebook's namespace to the originals at test time (so a student's ``check_close = lambda *a: None``
does not reach the test), puts back what was changed (so the remaining cells are graded as written),
looks at how the functions under test were made (defined in a notebook cell, or taken from the
reference implementation in `course_lib`), and publishes a report as a display output of a private
MIME type, tagged with the cell's nonce. The grader collects these reports from the executed
notebook (a test cell without its report was not run as written) and removes them before feedback.

It also makes the hidden tests harder to see from the student's code, and flags what would show them:
IPython event callbacks of every kind (``post_run_cell`` sees each later cell's source) are compared
and undone like the transformers; an audit hook set up first refuses any later ``sys.addaudithook``
(the attempt is reported); and each test cell removes the hidden regions from IPython's copies of the
cells it has run (``In``, ``_ih``, ``_i*``, the history lists, the cells' entries in `linecache`), and
the history database is never written while the notebook runs.

This runs in the student's process: a student who attacks the guard itself can defeat it (no check
inside a process can be safe from code in that process). What keeps one submission from changing
another's grade is the isolation around the kernel (see `sandbox.py`), and what keeps hidden tests out
of the feedback is the grader's scan of every output (`feedback.py`), not this module.
"""
from __future__ import annotations

import builtins
import sys
import types

MIME = "application/vnd.course-grade.guard+json"
# The student-side checks the labs import. The guard watches that module by name and imports nothing of
# course_lib: the grader's setup cell imports it in the kernel before `setup` records its functions.
CHECK_MODULE = "course_lib.checks"
CHECK_NAMES = ("check_close", "check_equal", "check_shape", "check_raises")
BUILTIN_NAMES = ("__import__", "exec", "eval", "compile", "isinstance", "getattr", "abs", "len", "range",
                 "AssertionError", "Exception", "print", "float", "int", "max", "min", "all", "any")
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
SHELL_METHODS = ("run_cell", "run_cell_async", "run_ast_nodes", "run_code", "transform_cell",
                 "transform_ast", "showtraceback", "_showtraceback", "showsyntaxerror", "get_exception_only")

_orig: dict | None = None
_audit_attempts: list = []


def _shell():
    try:
        from IPython import get_ipython
        return get_ipython()
    except Exception:  # noqa: BLE001
        return None


def _numpy_funcs():
    np = sys.modules.get("numpy")
    if np is None:
        return {}
    return {f"numpy.{n}": getattr(np, n, None) for n in ("allclose", "isclose", "array_equal", "asarray", "nonzero")}


def _state(ip) -> dict:
    st = {"builtins": {n: getattr(builtins, n, None) for n in BUILTIN_NAMES},
          "trace": sys.gettrace(), "profile": sys.getprofile(), "excepthook": sys.excepthook}
    mod = sys.modules.get(CHECK_MODULE)
    st["checks_module"] = mod
    st["checks"] = {n: getattr(mod, n, None) for n in CHECK_NAMES} if mod else {}
    st["code"] = {n: (f.__code__, f.__defaults__, f.__kwdefaults__) for n, f in st["checks"].items()
                  if isinstance(f, types.FunctionType)}
    st["guard_module"] = sys.modules.get(__name__)
    math = sys.modules.get("math")
    st["math.isclose"] = getattr(math, "isclose", None)
    if ip is not None:
        itm = ip.input_transformer_manager
        st["ip"] = {
            "input_transformers_cleanup": list(ip.input_transformers_cleanup),
            "input_transformers_post": list(ip.input_transformers_post),
            "line_transforms": list(getattr(itm, "line_transforms", [])),
            "token_transformers": list(getattr(itm, "token_transformers", [])),
            "ast_transformers": list(ip.ast_transformers),
            "custom_exceptions": tuple(ip.custom_exceptions),
            "events": {k: list(v) for k, v in ip.events.callbacks.items()},
        }
        st["methods"] = {n: getattr(type(ip), n, None) for n in SHELL_METHODS}
        st["instance_methods"] = sorted(n for n in SHELL_METHODS if n in vars(ip))
        st["compile"] = ip.compile
    return st


def setup(nonce: str) -> None:
    """Record the originals (the grader runs this before any of the student's cells)."""
    global _orig
    import math  # noqa: F401
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    ip = _shell()
    _orig = _state(ip)
    _orig["numpy"] = _numpy_funcs()
    _install_audit_hook()
    hm = getattr(ip, "history_manager", None)
    if hm is not None:
        hm.db_cache_size = 10**9  # the history database (a file the kernel can read) is not written meanwhile
    _publish({"nonce": nonce, "kind": "setup", "problems": []})


def _install_audit_hook() -> None:
    """An audit hook that refuses every later one (an audit hook sees each exec'd and compiled source:
    the hidden tests' too) and remembers the attempt. Audit hooks cannot be removed, so this one is set
    up before any of the student's cells."""
    attempts = _audit_attempts

    def hook(event, args):
        if event == "sys.addaudithook":
            attempts.append(event)
            raise RuntimeError("course grade: audit hooks are not allowed while grading")

    sys.addaudithook(hook)


def _strip_hidden(text: str) -> str:
    """`text` without its hidden-test regions (marker lines included)."""
    out, inside = [], False
    for line in text.split("\n"):
        if HIDDEN_BEGIN in line:
            inside = True
        elif inside and HIDDEN_END in line:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def forget_hidden(ip) -> None:
    """Remove the hidden regions from IPython's copies of the cells run so far (this one included)."""
    import linecache

    def clean(v):
        return _strip_hidden(v) if isinstance(v, str) and HIDDEN_BEGIN in v else v

    hm = getattr(ip, "history_manager", None) if ip is not None else None
    if hm is not None:
        for name in ("input_hist_parsed", "input_hist_raw"):
            lst = getattr(hm, name, None)
            if isinstance(lst, list):
                lst[:] = [clean(v) for v in lst]
        cache = getattr(hm, "db_input_cache", None)
        if isinstance(cache, list):
            cache[:] = [tuple(clean(x) for x in row) if isinstance(row, tuple) else row for row in cache]
        for name in ("_i", "_ii", "_iii", "_i00"):
            if isinstance(getattr(hm, name, None), str):
                setattr(hm, name, clean(getattr(hm, name)))
    if ip is not None:
        ns = ip.user_ns
        for k in [k for k in ns if k.startswith("_i") and isinstance(ns.get(k), str)]:
            ns[k] = clean(ns[k])
    for fname, entry in list(linecache.cache.items()):
        if isinstance(entry, tuple) and len(entry) >= 3 and isinstance(entry[2], list) \
                and any(HIDDEN_BEGIN in ln for ln in entry[2]):
            lines = _strip_hidden("".join(entry[2])).splitlines(keepends=True)
            linecache.cache[fname] = (len("".join(lines)), *entry[1:2], lines, *entry[3:])


def _publish(report: dict) -> None:
    ip = _shell()
    if ip is not None:
        from IPython.core.displaypub import DisplayPublisher
        pub = ip.display_pub
        publish = type(pub).publish if isinstance(pub, DisplayPublisher) else None
        if publish is not None:
            publish(pub, {MIME: report, "text/plain": ""}, metadata={})
            return
    print(report)  # no IPython: nothing collects it, but do not fail


def _compare(cur: dict, orig: dict) -> list[str]:
    problems = []
    for n, f in orig["builtins"].items():
        if cur["builtins"].get(n) is not f:
            problems.append(f"builtins.{n} was replaced")
    if cur["trace"] is not orig["trace"]:
        problems.append("a trace function was installed (sys.settrace)")
    if cur["profile"] is not orig["profile"]:
        problems.append("a profile function was installed (sys.setprofile)")
    if cur["checks_module"] is not orig["checks_module"]:
        problems.append(f"sys.modules[{CHECK_MODULE!r}] was replaced")
    for n, f in orig["checks"].items():
        if cur["checks"].get(n) is not f:
            problems.append(f"{CHECK_MODULE}.{n} was replaced")
    for n, (code, d, kw) in orig["code"].items():
        f = orig["checks"][n]
        if f.__code__ is not code or f.__defaults__ is not d or f.__kwdefaults__ is not kw:
            problems.append(f"the code of {n} was changed")
    if cur["guard_module"] is not orig["guard_module"]:
        problems.append(f"sys.modules[{__name__!r}] was replaced")
    if cur["math.isclose"] is not orig["math.isclose"]:
        problems.append("math.isclose was replaced")
    for n, f in orig.get("numpy", {}).items():
        if _numpy_funcs().get(n) is not f:
            problems.append(f"{n} was replaced")
    if "ip" in orig and "ip" in cur:
        a, b = cur["ip"], orig["ip"]
        for k in ("input_transformers_cleanup", "input_transformers_post", "line_transforms",
                  "token_transformers", "ast_transformers"):
            if len(a[k]) != len(b[k]) or any(x is not y for x, y in zip(a[k], b[k])):
                problems.append(f"IPython's {k} were changed")
        if a["custom_exceptions"] != b["custom_exceptions"]:
            problems.append("a custom exception handler was installed (set_custom_exc)")
        for ev in sorted(set(a["events"]) | set(b["events"])):
            cbs, old = a["events"].get(ev, []), b["events"].get(ev, [])
            if len(cbs) != len(old) or any(x is not y for x, y in zip(cbs, old)):
                problems.append(f"IPython event callbacks {ev!r} were changed")
        for n, f in orig["methods"].items():
            if cur["methods"].get(n) is not f:
                problems.append(f"InteractiveShell.{n} was replaced")
        for n in cur["instance_methods"]:
            if n not in orig["instance_methods"]:
                problems.append(f"the shell's {n} was replaced")
        if cur.get("compile") is not orig.get("compile"):
            problems.append("the shell's compiler was replaced")
    return problems


def _restore(ip, orig: dict, ns: dict | None) -> None:
    for n, f in orig["builtins"].items():
        setattr(builtins, n, f)
    sys.settrace(orig["trace"])
    sys.setprofile(orig["profile"])
    if orig["checks_module"] is not None:
        sys.modules[CHECK_MODULE] = orig["checks_module"]
    sys.modules[__name__] = orig["guard_module"]
    for n, f in orig["checks"].items():
        setattr(orig["checks_module"], n, f)
    for n, (code, d, kw) in orig["code"].items():
        f = orig["checks"][n]
        f.__code__, f.__defaults__, f.__kwdefaults__ = code, d, kw
    math = sys.modules.get("math")
    if math is not None:
        math.isclose = orig["math.isclose"]
    np = sys.modules.get("numpy")
    for n, f in orig.get("numpy", {}).items():
        if np is not None and f is not None:
            setattr(np, n.split(".", 1)[1], f)
    if ip is not None and "ip" in orig:
        b = orig["ip"]
        ip.input_transformers_cleanup[:] = b["input_transformers_cleanup"]
        ip.input_transformers_post[:] = b["input_transformers_post"]
        itm = ip.input_transformer_manager
        if hasattr(itm, "line_transforms"):
            itm.line_transforms[:] = b["line_transforms"]
        if hasattr(itm, "token_transformers"):
            itm.token_transformers[:] = b["token_transformers"]
        ip.ast_transformers[:] = b["ast_transformers"]
        ip.custom_exceptions = b["custom_exceptions"]
        for ev in list(ip.events.callbacks):
            ip.events.callbacks[ev][:] = b["events"].get(ev, [])
        for n, f in orig["methods"].items():
            if n not in orig["instance_methods"]:
                ip.__dict__.pop(n, None)
            if f is not None:
                setattr(type(ip), n, f)
        ip.compile = orig["compile"]


def _cell_filenames(ip) -> set:
    comp = getattr(ip, "compile", None)
    fmap = getattr(comp, "_filename_map", None)
    return set(fmap) if isinstance(fmap, dict) else set()


def _answer_problems(ns: dict, answers, ip) -> list[str]:
    """How the functions under test were made: from the reference implementation, or not in a cell."""
    problems = []
    cells = _cell_filenames(ip) if ip is not None else set()
    for name in answers or ():
        obj = ns.get(name)
        if obj is None:
            continue
        fn = getattr(obj, "__func__", obj)
        mod = getattr(fn, "__module__", "") or ""
        code = getattr(fn, "__code__", None)
        if mod.startswith("course_lib") or (code is not None and "course_lib" in code.co_filename.replace("\\", "/")
                                             .split("/")):
            problems.append(f"reference_import: {name} is {mod}.{getattr(fn, '__qualname__', name)} from "
                            "course_lib, not the student's own code")
        elif code is not None and cells and code.co_filename not in cells:
            problems.append(f"answer_not_from_cell: {name} was not defined in a notebook cell "
                            f"(its code comes from {code.co_filename!r})")
    return problems


def verify(nonce: str, grade_id: str, answers=()) -> None:
    """Check, restore, bind the check functions in the notebook's namespace, and report (the first line
    the grader puts in every test cell)."""
    ip = _shell()
    ns = ip.user_ns if ip is not None else sys._getframe(1).f_globals
    problems = []
    if _orig is None:
        problems.append("the grader's setup did not run before this cell")
        report = {"nonce": nonce, "kind": "test", "grade_id": grade_id, "problems": problems}
        _publish(report)
        return
    problems += _compare(_state(ip), _orig)
    if _orig["checks_module"] is None:  # nothing to bind: the tests would call whatever the notebook defines
        problems.append(f"{CHECK_MODULE} was not loaded before the grader's setup")
    if _audit_attempts:
        problems.append("an audit hook was added (sys.addaudithook; refused)")
    if problems:
        _restore(ip, _orig, ns)
    try:
        forget_hidden(ip)
    except Exception:  # noqa: BLE001 - hardening only; the grader's scan is the defence
        pass
    for n, f in _orig["checks"].items():
        if n in ns and ns[n] is not f:
            problems.append(f"{n} was rebound in the notebook")
        ns[n] = f  # bound at test time to the original
    problems += _answer_problems(ns, answers, ip)
    _publish({"nonce": nonce, "kind": "test", "grade_id": grade_id, "problems": problems})
