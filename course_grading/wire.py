"""Plain data between the grader and a student's kernel (stdlib only; torch and numpy when present).

The judge (`judging.py`) and the kernel-side driver (`driver.py`) exchange JSON and nothing else: no
pickles, no code, no object of the student's. What a student's function returns is turned into plain
data inside the kernel (`encode`), and the grader rebuilds plain values from it (`decode`), checking
every size and type as it goes: a number, a string, a list, an array of a known dtype and shape. An
object of any other kind arrives as its type name and a short repr, and compares equal to nothing.

Tags (a JSON object with one ``$`` key; every other dict is a ``$dict`` of pairs):
    {"$f": "nan" | "inf" | "-inf"}                       a float JSON cannot write
    {"$tuple": [...], "names": [...]?}                   a tuple (a namedtuple keeps its field names)
    {"$dict": [[key, value], ...]}                       a dict (keys of any plain kind)
    {"$array": {"lib": "torch"|"numpy", "dtype", "shape", "data": base64}}   an array, little-endian
    {"$obj": "TypeName", "fields": {...}?, "repr": "..."}  a dataclass (its fields) or anything else
    {"$ref": "name"}                                     (grader -> kernel) an object the driver stored
    {"$name": "name"}                                    (grader -> kernel) a name of the notebook (a function)
    {"$remote": "name", "attrs": [...], "methods": [...]} (grader -> kernel) a stand-in for a grader's object
    {"$gen": seed}                                       (grader -> kernel) a fresh torch.Generator
"""
from __future__ import annotations

import base64
import dataclasses
import math
import sys

MIME = "application/vnd.course-judge+json"
MAX_BYTES = 8 * 2**20         # one reply, all arrays together (base64 on the wire: under session.Limits' 16 MiB)
MAX_STR = 20_000              # characters of one string
MAX_ITEMS = 100_000           # elements of one list, tuple or dict
MAX_DEPTH = 32
DTYPES = {"float16": 2, "float32": 4, "float64": 8, "bfloat16": 2, "int8": 1, "int16": 2, "int32": 4,
          "int64": 8, "uint8": 1, "bool": 1}


class WireError(ValueError):
    """The data is not what the wire format allows (too big, too deep, an unknown tag or dtype)."""


class _Budget:
    def __init__(self, limit: int):
        self.left = limit

    def take(self, n: int, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise WireError(f"{what}: the data is larger than the {MAX_BYTES // 2**20} MiB a reply may carry")


# ---------------------------------------------------------------------------------------------------
# encode (runs in the kernel for results, in the grader for arguments)

def _array(x, lib: str, budget: _Budget):
    if lib == "torch":
        t = x.detach().to("cpu").contiguous()
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in DTYPES:
            return {"$obj": "Tensor", "repr": f"tensor of dtype {dtype} (not sent)"}
        if dtype == "bfloat16":
            import torch
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        shape = list(t.shape)
    else:
        dtype = str(x.dtype)
        if dtype not in DTYPES or dtype == "bfloat16":
            return {"$obj": "ndarray", "repr": f"array of dtype {dtype} (not sent)"}
        import numpy as np
        raw = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<"), copy=False).tobytes()
        shape = list(x.shape)
    budget.take(len(raw), "an array")
    return {"$array": {"lib": lib, "dtype": dtype, "shape": shape, "data": base64.b64encode(raw).decode("ascii")}}


class Tagged:
    """An argument the grader sends as a tag the driver resolves (`ref`, `generator`)."""

    def __init__(self, tag: dict):
        self.tag = tag

    def __repr__(self):
        return f"Tagged({self.tag})"


def _encode(x, budget: _Budget, depth: int):
    if depth > MAX_DEPTH:
        raise WireError("nested more than 32 levels deep")
    if isinstance(x, Tagged):
        return dict(x.tag)
    if x is None or isinstance(x, (bool, str)) or type(x) is int:
        if isinstance(x, str):
            budget.take(len(x), "a string")
            return x if len(x) <= MAX_STR else x[:MAX_STR] + f"... [{len(x):,} characters]"
        if type(x) is int and x.bit_length() > 256:
            return {"$obj": "int", "repr": f"an integer of {x.bit_length()} bits"}
        return x
    if isinstance(x, float) or type(x).__name__ in ("float64", "float32", "float16"):
        f = float(x)
        return f if math.isfinite(f) else {"$f": "nan" if f != f else ("inf" if f > 0 else "-inf")}
    if isinstance(x, int):                                   # bool subclasses are handled above; numpy ints
        return int(x)
    mod = type(x).__module__ or ""
    if mod.startswith("numpy") and type(x).__name__ in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                                        "uint32", "uint64", "bool_"):
        return bool(x) if type(x).__name__ == "bool_" else int(x)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _array(x, "torch", budget)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return _array(x, "numpy", budget)
    if isinstance(x, (list, tuple, dict)) and len(x) > MAX_ITEMS:
        raise WireError(f"a {type(x).__name__} of {len(x):,} items (at most {MAX_ITEMS:,})")
    if isinstance(x, tuple):
        out = {"$tuple": [_encode(v, budget, depth + 1) for v in x]}
        if hasattr(type(x), "_fields"):
            out["names"] = [str(f) for f in type(x)._fields]
        return out
    if isinstance(x, list):
        return [_encode(v, budget, depth + 1) for v in x]
    if isinstance(x, dict):
        return {"$dict": [[_encode(k, budget, depth + 1), _encode(v, budget, depth + 1)] for k, v in x.items()]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"$obj": type(x).__name__,
                "fields": {f.name: _encode(getattr(x, f.name, None), budget, depth + 1)
                           for f in dataclasses.fields(x)}}
    try:
        text = object.__repr__(x)                            # never the object's own __repr__ code path
    except Exception:  # noqa: BLE001
        text = "?"
    return {"$obj": type(x).__name__, "repr": text[:200]}


def encode(x, limit: int = MAX_BYTES):
    """A JSON-able form of `x` (see the module's tags); raises WireError past the limits."""
    return _encode(x, _Budget(limit), 0)


# ---------------------------------------------------------------------------------------------------
# decode (runs in the grader for results, in the kernel for arguments)

@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value of a kind the wire does not carry: its type name and a short text. Equal to nothing."""
    type: str
    text: str = ""

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self.type}{': ' + self.text if self.text else ''}>"


@dataclasses.dataclass(frozen=True)
class Record:
    """A dataclass instance of the student's, as plain fields (`.fields`), readable as attributes."""
    type: str
    fields: dict

    def __getattr__(self, name):
        f = self.__dict__.get("fields", {})
        if name in f:
            return f[name]
        raise AttributeError(name)

    def __repr__(self):
        return f"{self.type}({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"


def _decode_array(spec: dict, budget: _Budget, arrays: str):
    if not isinstance(spec, dict) or set(spec) - {"lib", "dtype", "shape", "data"}:
        raise WireError("a malformed array")
    dtype, shape, data = spec.get("dtype"), spec.get("shape"), spec.get("data")
    if dtype not in DTYPES:
        raise WireError(f"an array of unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(type(n) is int and 0 <= n <= 2**31 for n in shape)):
        raise WireError("an array with a malformed shape")
    if not isinstance(data, str):
        raise WireError("an array without data")
    n = 1
    for s in shape:
        n *= s
    if n * DTYPES[dtype] > MAX_BYTES or len(data) > 4 * (MAX_BYTES // 3 + 4):
        raise WireError("an array larger than a reply may carry")
    raw = base64.b64decode(data, validate=True)
    if len(raw) != n * DTYPES[dtype]:
        raise WireError(f"an array of shape {shape} and dtype {dtype} with {len(raw)} bytes of data")
    budget.take(len(raw), "an array")
    import numpy as np
    if dtype == "bfloat16":
        a = np.frombuffer(raw, dtype="<i2").reshape(shape)
    else:
        a = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
    if arrays == "torch" or (arrays == "native" and spec.get("lib") == "torch"):
        import torch
        t = torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=True))
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t
    if dtype == "bfloat16":
        raise WireError("a bfloat16 array needs torch")
    return a.astype(a.dtype.newbyteorder("="), copy=True)


def _decode(x, budget: _Budget, depth: int, arrays: str, refs):
    if depth > MAX_DEPTH:
        raise WireError("nested more than 32 levels deep")
    if x is None or isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, str):
        budget.take(len(x), "a string")
        return x
    if isinstance(x, list):
        if len(x) > MAX_ITEMS:
            raise WireError("a list too long")
        return [_decode(v, budget, depth + 1, arrays, refs) for v in x]
    if not isinstance(x, dict) or len(x) not in (1, 2, 3) or not any(str(k).startswith("$") for k in x):
        raise WireError("a JSON object that is not a tagged value")
    if "$f" in x:
        special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
        if x["$f"] not in special:
            raise WireError("a malformed float")
        return special[x["$f"]]
    if "$tuple" in x:
        items = tuple(_decode(v, budget, depth + 1, arrays, refs) for v in _as_list(x["$tuple"]))
        return items
    if "$dict" in x:
        out = {}
        for pair in _as_list(x["$dict"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise WireError("a malformed dict")
            k = _decode(pair[0], budget, depth + 1, arrays, refs)
            try:
                hash(k)
            except TypeError:
                raise WireError("a dict key that is not hashable") from None
            out[k] = _decode(pair[1], budget, depth + 1, arrays, refs)
        return out
    if "$array" in x:
        return _decode_array(x["$array"], budget, arrays)
    if "$obj" in x:
        name = str(x["$obj"])[:100]
        if isinstance(x.get("fields"), dict):
            return Record(name, {str(k)[:100]: _decode(v, budget, depth + 1, arrays, refs)
                                 for k, v in list(x["fields"].items())[:200]})
        return Opaque(name, str(x.get("repr", ""))[:200])
    if "$ref" in x and refs is not None:
        return refs("$ref", {"$ref": str(x["$ref"])})
    if "$name" in x and refs is not None:
        if not isinstance(x["$name"], str) or not x["$name"].isidentifier():
            raise WireError("a malformed name")
        return refs("$name", {"$name": x["$name"]})
    if "$remote" in x and refs is not None:
        return refs("$remote", {"$remote": str(x["$remote"])[:100], "attrs": _names(x.get("attrs")),
                                "methods": _names(x.get("methods"))})
    if "$gen" in x and refs is not None:
        import torch
        if type(x["$gen"]) is not int:
            raise WireError("a malformed generator seed")
        return torch.Generator().manual_seed(x["$gen"] % 2**63)
    raise WireError(f"an unknown tag {sorted(x)}")


def _names(v) -> list:
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > 100 or not all(isinstance(n, str) and n.isidentifier() for n in v):
        raise WireError("a malformed list of names")
    return list(v)


def _as_list(v):
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        raise WireError("a malformed container")
    return v


def decode(x, arrays: str = "native", refs=None, limit: int = MAX_BYTES):
    """Plain values from `encode`'s form: numbers, strings, lists, tuples, dicts, arrays (``arrays``:
    "native" as sent, "torch" or "numpy"), `Record` for a dataclass, `Opaque` for anything else. `refs`
    (kernel side only) resolves ``$ref`` and ``$gen``. Raises WireError on anything malformed."""
    return _decode(x, _Budget(limit), 0, arrays, refs)


def ref(name: str) -> Tagged:
    """An argument that names an object the driver stored (`driver.py`)."""
    return Tagged({"$ref": str(name)})


def notebook(name: str) -> Tagged:
    """An argument the driver takes from the notebook's namespace: the student's function or class itself."""
    return Tagged({"$name": str(name)})


def remote(name: str, attrs=(), methods=()) -> Tagged:
    """An argument the driver turns into a stand-in for the grader's object `name` (`driver.Remote`)."""
    return Tagged({"$remote": str(name), "attrs": list(attrs), "methods": list(methods)})


def generator(seed: int) -> Tagged:
    """An argument the driver turns into ``torch.Generator().manual_seed(seed)``."""
    return Tagged({"$gen": int(seed)})
