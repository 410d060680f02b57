"""Each public name is listed once: no two package faces (a package's ``__init__`` or a top-level module of
course_lib) put the same name in ``__all__``, and every listed name exists. A name may stay importable from a
second place for convenience (the sampling functions from ``generation``), but only its home lists it."""
import collections
import importlib
import pkgutil
from pathlib import Path

import course_lib

ROOT = Path(course_lib.__file__).parent


def faces():
    out = {"course_lib": importlib.import_module("course_lib")}
    for m in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        path = Path(m.module_finder.path) / (m.name.rsplit(".", 1)[-1])
        if m.ispkg or path.parent == ROOT:
            try:
                out[m.name] = importlib.import_module(m.name)
            except ImportError:          # an optional extra (triton, bitsandbytes) missing here
                continue
    return out


def test_each_public_name_is_listed_once():
    where = collections.defaultdict(list)
    for name, mod in faces().items():
        for n in getattr(mod, "__all__", ()):
            assert hasattr(mod, n), f"{name}.__all__ lists {n!r}, which {name} does not define"
            where[n].append(name)
    twice = {n: fs for n, fs in where.items() if len(fs) > 1}
    assert not twice, f"names listed by more than one package face: {twice}"
