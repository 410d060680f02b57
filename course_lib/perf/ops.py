"""Operation costs: the FLOPs, bytes and FLOP/byte of one operation (OpCost, a lecture-notes row NotesOp),
a matmul's cost, and the table of a phase's operations (OpTable) with its totals and printing.

``course_lib.perf.intensity`` fills an OpTable with a real model's operations, and
``course_lib.perf.notes_forms`` with the lecture notes' rows.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from fractions import Fraction

from course_lib.models.config import LlamaConfig
from course_lib.perf.hardware import bytes_per_element
from course_lib.perf.tables import format_table, si
from course_lib.validate import integer

PHASES = ("prefill", "decode")
MODES = ("real", "notes")

# FLOPs per element of the elementwise ops. These are conventions (an exp is many instructions and
# FLOP counters disagree); none of them changes a conclusion, since every elementwise op is
# memory-bound by a factor of 100 or more on every device of the table.
ELEMENTWISE_FLOPS = {
    "rmsnorm": 4,    # square, sum, multiply by 1/rms, multiply by the weight
    "rope": 3,       # x*cos + rotate_half(x)*sin
    "softmax": 6,    # scale, max, subtract, exp, sum, divide
    "silu_mul": 5,   # silu(g) = g / (1 + exp(-g)): negate, exp, add, divide; then * up
    "residual": 1,
}



@dataclass
class OpCost:
    """One operation: its work, its memory traffic and how many times the model runs it.

    flops and bytes are per run (in notes mode: multiply-adds and elements, see OpTable.units);
    count is how many times it runs (num_hidden_layers for a layer op; heads for a notes per-head row).
    m, k, n: the matmul [m, k] x [k, n] for weight matmuls (None otherwise).
    """
    name: str
    computation: str
    kind: str                 # 'matmul' (weights), 'attention', 'elementwise', 'memory', 'data' (notes '-')
    flops: float
    bytes: float
    count: int = 1
    scope: str = "layer"      # 'layer' or 'model'
    weight_bytes: float = 0
    kv_bytes: float = 0       # bytes of K/V read or written (the KV cache in decode)
    shapes: str = ""
    m: int | None = None
    k: int | None = None
    n: int | None = None

    @property
    def intensity(self):
        """FLOP per byte (float); None for an op that moves no data."""
        if not self.bytes:
            return None
        return self.flops / self.bytes

    @property
    def total_flops(self):
        return self.flops * self.count

    @property
    def total_bytes(self):
        return self.bytes * self.count


@dataclass
class NotesOp(OpCost):
    """A row of the lecture notes' table: flops = multiply-adds, bytes = elements, exact intensity."""
    no: int = 0
    inputs: str = ""
    output: str = ""
    closed_form: str = "-"    # the right-hand side printed in the notes

    @property
    def intensity(self):
        """Exact: a Fraction for integer sizes, a sympy expression for symbols, None for '-' rows."""
        if not self.bytes:
            return None
        if isinstance(self.flops, numbers.Integral) and isinstance(self.bytes, numbers.Integral):
            return Fraction(int(self.flops), int(self.bytes))
        return self.flops / self.bytes



def _fmt_intensity(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, Fraction):
        return f"{float(x):.4g}"
    try:
        return f"{float(x):.4g}"
    except TypeError:  # symbolic
        return str(x)



@dataclass
class OpTable:
    """The ops of one phase; iterate it, index it by op name, print it (text, markdown, HTML)."""
    phase: str
    mode: str
    model: LlamaConfig | None  # None for the notes' table, which knows only D, n_h and H (dims)
    seq_len: int
    batch: int
    dtype: str | None
    rows: list = field(default_factory=list)
    label: str = ""            # who, in captions (default: model.name)
    dims: dict | None = None   # notes mode: {"D": hidden size, "n_h": heads, "H": head dim}

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.model is None:
            return "lecture notes"
        m = self.model
        return m.name or f"D={m.hidden_size}, heads={m.num_attention_heads}"

    @property
    def units(self) -> tuple[str, str]:
        return ("multiply-adds", "elements") if self.mode == "notes" else ("FLOPs", "bytes")

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, key):
        if isinstance(key, int):
            return self.rows[key]
        for r in self.rows:
            if r.name == key:
                return r
        raise KeyError(f"no op named {key!r}; ops: {[r.name for r in self.rows]}")

    def names(self) -> list[str]:
        return [r.name for r in self.rows]

    def _sum(self, rows, name, count=1, scope="model"):
        flops = sum(r.flops * r.count for r in rows)
        nbytes = sum(r.bytes * r.count for r in rows)
        w = sum(r.weight_bytes * r.count for r in rows)
        kv = sum(r.kv_bytes * r.count for r in rows)
        cls = NotesOp if self.mode == "notes" else OpCost
        return cls(name=name, computation="", kind="total", flops=flops, bytes=nbytes, count=count, scope=scope,
                   weight_bytes=w, kv_bytes=kv)

    def layer_total(self) -> OpCost:
        """One layer (all its ops once; per-head notes rows times the heads); count = layers (notes: 1)."""
        n = self.model.num_hidden_layers if self.mode == "real" else 1
        layer = [replace(r, count=r.count // n) for r in self.rows if r.scope == "layer"]
        return self._sum(layer, "layer total", count=n, scope="layer")

    def total(self) -> OpCost:
        """The whole model (layers x num_hidden_layers + embedding, final norm, LM head)."""
        return self._sum(self.rows, "model total")

    @property
    def flops(self):
        return self.total().flops

    @property
    def bytes(self):
        return self.total().bytes

    @property
    def intensity(self):
        return self.total().intensity

    def matmul_flops(self) -> float:
        """FLOPs of the matmuls only (weights and attention): what FLOP counters such as
        torch.utils.flop_counter count."""
        return sum(r.flops * r.count for r in self.rows if r.kind in ("matmul", "attention"))

    def weight_bytes(self) -> float:
        return sum(r.weight_bytes * r.count for r in self.rows)

    def kv_bytes(self) -> float:
        return sum(r.kv_bytes * r.count for r in self.rows)

    # --- pretty printing
    def _table(self, with_totals=True):
        work, traffic = self.units
        if self.mode == "notes":
            head = ["No.", "computation", "input", "output", f"work ({work})", f"traffic ({traffic})",
                    "intensity", "notes' closed form"]
            rows = [[str(r.no), r.computation, r.inputs, r.output, "-" if not r.bytes else si(r.flops),
                     "-" if not r.bytes else si(r.bytes), _fmt_intensity(r.intensity), r.closed_form]
                    for r in self.rows]
            return head, rows
        head = ["op", "computation", "shapes", "count", "FLOPs", "bytes", "FLOP/byte", "weights", "KV"]
        rows = [[r.name, r.computation, r.shapes, str(r.count), si(r.flops), si(r.bytes, "B"),
                 _fmt_intensity(r.intensity), si(r.weight_bytes, "B") if r.weight_bytes else "-",
                 si(r.kv_bytes, "B") if r.kv_bytes else "-"] for r in self.rows]
        if with_totals:
            for t in (self.layer_total(), self.total()):
                label = "one layer" if t.scope == "layer" else "all"
                rows.append([t.name, label, "", str(t.count), si(t.flops), si(t.bytes, "B"),
                             _fmt_intensity(t.intensity), si(t.weight_bytes, "B"), si(t.kv_bytes, "B")])
        return head, rows

    def caption(self) -> str:
        if self.mode == "notes":
            d = self.dims
            return (f"{self.phase}, lecture-notes counting (multiply-adds, elements), L={self.seq_len}, "
                    f"D={d['D']}, n_h={d['n_h']}, H={d['H']}")
        where = f"L={self.seq_len}" if self.phase == "prefill" else f"{self.seq_len} tokens in the KV cache"
        return (f"{self.name}: {self.phase}, batch {self.batch}, {where}, {self.dtype}; per run of each op, "
                f"count = runs per forward")

    def to_markdown(self) -> str:
        head, rows = self._table()
        return format_table(head, rows, "markdown", note=self.caption())

    def to_html(self) -> str:
        head, rows = self._table()
        return format_table(head, rows, "html", note=self.caption())

    def to_text(self) -> str:
        head, rows = self._table()
        return format_table(head, rows, "text", note=self.caption())

    def _repr_html_(self):
        return self.to_html()

    def __str__(self):
        return self.to_text()

    def __repr__(self):
        return (f"OpTable({self.name}, {self.phase}, mode={self.mode}, seq_len={self.seq_len}, batch={self.batch}, "
                f"dtype={self.dtype}, {len(self.rows)} ops)")



def matmul_cost(m: int, n: int, k: int, dtype="fp16", name: str = "matmul", weight_dtype=None) -> OpCost:
    """[m, k] x [k, n] -> [m, n]: 2·m·n·k FLOPs, bytes = read both inputs + write the output.

    dtype: bytes per element as a dtype name ('fp16') or a number; weight_dtype (default dtype) for
    the [k, n] operand when it is a weight matrix (e.g. int4 weights, fp16 activations).
    """
    m, n, k = integer(m, "m", low=1), integer(n, "n", low=1), integer(k, "k", low=1)
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    nbytes = a * (m * k + m * n) + w * k * n
    return OpCost(name=name, computation=f"[{m}, {k}] x [{k}, {n}]", kind="matmul", flops=2 * m * n * k,
                  bytes=nbytes, weight_bytes=w * k * n, shapes=f"[{m}, {k}] x [{k}, {n}]", m=m, k=k, n=n)



__all__ = ["PHASES", "MODES", "ELEMENTWISE_FLOPS", "OpCost", "NotesOp", "OpTable", "matmul_cost"]
