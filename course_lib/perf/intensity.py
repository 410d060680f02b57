"""Arithmetic intensity: FLOPs, bytes moved and FLOP/byte of every operation of a decoder layer.

Two ways of counting:

* ``mode="seed"`` reproduces the tables of the lecture notes exactly: multi-head attention with D x D
  projections, a 4D MLP with relu, *multiply-adds* as the work, *elements* (not bytes) as the traffic,
  attention per head. Intensities are exact fractions (or sympy expressions when you pass symbols).
  The notes also scale the scores by 1/sqrt(D); that changes no count, only the text.
* ``mode="real"`` (default) counts what a Llama-style model does: 2 FLOPs per multiply-add (2·M·N·K for
  a matmul), bytes for a chosen dtype, GQA K/V projections (num_kv_heads), a SwiGLU MLP with three
  matrices, attention per head with the real head dim (scale 1/sqrt(head_dim)), KV-cache reads in
  decode, RMSNorm/RoPE/softmax/SiLU/residual adds as elementwise ops, the embedding and the LM head,
  and a batch dimension. Totals per layer and per model.

Every op reads its inputs from memory and writes its output (no fusion): the table is what an
unfused implementation moves. Fusion (FlashAttention, fused norms) removes some of the traffic of the
elementwise and attention rows, never of the weights.

    from course_lib.perf import intensity_table
    t = intensity_table("llama2-7b", "decode", seq_len=1024, batch=1, dtype="fp16")
    t["q_proj"].intensity          # about 1 FLOP/byte: decode is memory-bound
    print(t.to_text())

Shape letters: B batch, T new tokens (prefill: L, decode: 1), S tokens attended to (prefill: L,
decode: L + 1), D hidden size, H query heads, K key/value heads, Dh head dim, F MLP hidden size,
V vocabulary.
"""
from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field, replace
from fractions import Fraction

from course_lib.perf.hardware import bytes_per_element, canonical_dtype, format_table

PHASES = ("prefill", "decode")
MODES = ("real", "seed")

# FLOPs per element of the elementwise ops. These are conventions (an exp is many instructions and
# FLOP counters disagree); none of them changes a conclusion, since every elementwise op is
# memory-bound by a factor of 100 or more on every device of the table.
ELEMENTWISE_FLOPS = {
    "rmsnorm": 4,    # square, sum, multiply by 1/rms, multiply by the weight
    "rope": 3,       # x*cos + rotate_half(x)*sin
    "softmax": 6,    # scale, max, subtract, exp, sum, divide
    "silu_mul": 5,   # silu(g) = g / (1 + exp(-g)): negate, exp, add, divide; then * up
    "relu": 1,
    "residual": 1,
}


# --- model shapes ---------------------------------------------------------------------------------
def _pos_int(value, name: str, allow_zero: bool = False):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return int(value)


@dataclass
class ModelShape:
    """The sizes that decide a decoder's FLOPs and bytes (a LlamaConfig has them all).

    num_kv_heads defaults to num_heads (plain multi-head attention); head_dim to hidden_size // num_heads
    (num_heads must divide hidden_size then); intermediate_size to 4 * hidden_size; vocab_size 0 means
    no embedding and no LM head (one bare stack of layers). mlp: 'swiglu' (gate, up, down: Llama) or
    'relu' (up, down: the lecture notes' 4D MLP).
    """
    hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    num_layers: int = 1
    vocab_size: int = 0
    mlp: str = "swiglu"
    tie_word_embeddings: bool = True
    name: str = ""

    def __post_init__(self):
        self.hidden_size = _pos_int(self.hidden_size, "hidden_size")
        self.num_heads = _pos_int(self.num_heads, "num_heads")
        self.num_layers = _pos_int(self.num_layers, "num_layers")
        self.vocab_size = _pos_int(self.vocab_size, "vocab_size", allow_zero=True)
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        self.num_kv_heads = _pos_int(self.num_kv_heads, "num_kv_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size} "
                                 f"(or give head_dim explicitly)")
            self.head_dim = self.hidden_size // self.num_heads
        self.head_dim = _pos_int(self.head_dim, "head_dim")
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        self.intermediate_size = _pos_int(self.intermediate_size, "intermediate_size")
        if self.mlp not in ("swiglu", "relu"):
            raise ValueError(f"mlp must be 'swiglu' or 'relu', got {self.mlp!r}")

    @classmethod
    def from_config(cls, cfg, name: str = "") -> "ModelShape":
        """From a course LlamaConfig, a transformers config or a config.json dict."""
        get = (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        try:
            heads = get("num_attention_heads")
            return cls(hidden_size=get("hidden_size"), num_heads=heads,
                       num_kv_heads=get("num_key_value_heads") or heads, head_dim=get("head_dim"),
                       intermediate_size=get("intermediate_size"), num_layers=get("num_hidden_layers"),
                       vocab_size=get("vocab_size") or 0,
                       tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                       name=name or str(get("name_or_path", "") or get("_name_or_path", "") or ""))
        except ValueError as e:
            raise ValueError(f"model config: {e}") from None

    def num_parameters(self) -> int:
        D, H, K, Dh, F = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate_size
        attn = D * H * Dh * 2 + D * K * Dh * 2
        mlp = (3 if self.mlp == "swiglu" else 2) * D * F
        layer = attn + mlp + 2 * D  # two norm weights
        emb = self.vocab_size * D * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + (D if self.vocab_size else 0)

    def kv_cache_bytes(self, batch: int, tokens: int, dtype="fp16") -> float:
        """Bytes of the K and V cache of all layers for `batch` sequences of `tokens` tokens."""
        return 2 * self.num_layers * batch * self.num_kv_heads * self.head_dim * tokens * bytes_per_element(dtype)


# Published architectures (config.json of the Hugging Face checkpoints).
PRESETS: dict[str, ModelShape] = {
    "llama2-7b": ModelShape(4096, 32, 32, intermediate_size=11008, num_layers=32, vocab_size=32000,
                            tie_word_embeddings=False, name="Llama-2-7B"),
    "llama2-13b": ModelShape(5120, 40, 40, intermediate_size=13824, num_layers=40, vocab_size=32000,
                             tie_word_embeddings=False, name="Llama-2-13B"),
    "llama2-70b": ModelShape(8192, 64, 8, intermediate_size=28672, num_layers=80, vocab_size=32000,
                             tie_word_embeddings=False, name="Llama-2-70B"),
    "llama3-8b": ModelShape(4096, 32, 8, intermediate_size=14336, num_layers=32, vocab_size=128256,
                            tie_word_embeddings=False, name="Llama-3-8B"),
    "smollm2-135m": ModelShape(576, 9, 3, intermediate_size=1536, num_layers=30, vocab_size=49152,
                               tie_word_embeddings=True, name="SmolLM2-135M"),
}


def preset_names() -> list[str]:
    return ["tiny", "tiny-draft", *PRESETS]


def as_model(model) -> ModelShape:
    """A ModelShape from a ModelShape, a (course or transformers) config, a config dict, a model with a
    `.config`, or a name: a preset ('llama2-7b', ...) or a bundled model ('tiny', 'tiny-draft')."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, str):
        key = model.lower()
        if key in PRESETS:
            return PRESETS[key]
        if key in ("tiny", "tiny-draft"):
            from course_lib.models import bundled_path
            cfg = json.loads((bundled_path(key) / "config.json").read_text())
            return ModelShape.from_config(cfg, name=key)
        raise ValueError(f"model={model!r} is not a known architecture; known: {preset_names()} "
                         f"(or pass a LlamaConfig / ModelShape)")
    if isinstance(model, dict):
        if "hidden_size" in model and "num_attention_heads" in model:
            return ModelShape.from_config(model)
        return ModelShape(**model)
    if hasattr(model, "hidden_size") and hasattr(model, "num_attention_heads"):
        return ModelShape.from_config(model)
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "hidden_size"):
        return ModelShape.from_config(cfg, name=str(getattr(model, "name", "")))
    raise ValueError(f"model must be a ModelShape, a LlamaConfig, a config dict or a preset name, got {type(model).__name__}")


# --- rows and tables ------------------------------------------------------------------------------
@dataclass
class OpCost:
    """One operation: its work, its memory traffic and how many times the model runs it.

    flops and bytes are per run (in seed mode: multiply-adds and elements, see OpTable.units);
    count is how many times it runs (num_layers for a layer op; num_heads for a seed per-head row).
    m, k, n: the matmul [m, k] x [k, n] for weight matmuls (None otherwise).
    """
    name: str
    computation: str
    kind: str                 # 'matmul' (weights), 'attention', 'elementwise', 'memory', 'data' (seed '-')
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
class SeedOp(OpCost):
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


def _si(x, unit="") -> str:
    if x is None:
        return "-"
    x = float(x)
    if x == 0:
        return f"0 {unit}".rstrip()
    for p, s in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"),
                 (1e-6, "µ"), (1e-9, "n")):
        if abs(x) >= p:
            return f"{x / p:.3g} {s}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()


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
    model: ModelShape
    seq_len: int
    batch: int
    dtype: str | None
    rows: list = field(default_factory=list)

    @property
    def units(self) -> tuple[str, str]:
        return ("multiply-adds", "elements") if self.mode == "seed" else ("FLOPs", "bytes")

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
        cls = SeedOp if self.mode == "seed" else OpCost
        return cls(name=name, computation="", kind="total", flops=flops, bytes=nbytes, count=count, scope=scope,
                   weight_bytes=w, kv_bytes=kv)

    def layer_total(self) -> OpCost:
        """One layer (all its ops once; per-head seed rows times num_heads); count = num_layers."""
        layer = [replace(r, count=r.count // self.model.num_layers if self.mode == "real" else r.count)
                 for r in self.rows if r.scope == "layer"]
        return self._sum(layer, "layer total", count=self.model.num_layers, scope="layer")

    def total(self) -> OpCost:
        """The whole model (layers x num_layers + embedding, final norm, LM head)."""
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
        if self.mode == "seed":
            head = ["No.", "computation", "input", "output", f"work ({work})", f"traffic ({traffic})",
                    "intensity", "notes' closed form"]
            rows = [[str(r.no), r.computation, r.inputs, r.output, "-" if not r.bytes else _si(r.flops),
                     "-" if not r.bytes else _si(r.bytes), _fmt_intensity(r.intensity), r.closed_form]
                    for r in self.rows]
            return head, rows
        head = ["op", "computation", "shapes", "count", "FLOPs", "bytes", "FLOP/byte", "weights", "KV"]
        rows = [[r.name, r.computation, r.shapes, str(r.count), _si(r.flops), _si(r.bytes, "B"),
                 _fmt_intensity(r.intensity), _si(r.weight_bytes, "B") if r.weight_bytes else "-",
                 _si(r.kv_bytes, "B") if r.kv_bytes else "-"] for r in self.rows]
        if with_totals:
            for t in (self.layer_total(), self.total()):
                label = "one layer" if t.scope == "layer" else "all"
                rows.append([t.name, label, "", str(t.count), _si(t.flops), _si(t.bytes, "B"),
                             _fmt_intensity(t.intensity), _si(t.weight_bytes, "B"), _si(t.kv_bytes, "B")])
        return head, rows

    def caption(self) -> str:
        m = self.model
        who = m.name or f"D={m.hidden_size}, heads={m.num_heads}"
        if self.mode == "seed":
            return (f"{self.phase}, lecture-notes counting (multiply-adds, elements), L={self.seq_len}, "
                    f"D={m.hidden_size}, n_h={m.num_heads}, H={m.head_dim}")
        where = f"L={self.seq_len}" if self.phase == "prefill" else f"{self.seq_len} tokens in the KV cache"
        return (f"{who}: {self.phase}, batch {self.batch}, {where}, {self.dtype}; per run of each op, "
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
        who = self.model.name or f"D={self.model.hidden_size}"
        return (f"OpTable({who}, {self.phase}, mode={self.mode}, seq_len={self.seq_len}, batch={self.batch}, "
                f"dtype={self.dtype}, {len(self.rows)} ops)")


def matmul_cost(m: int, n: int, k: int, dtype="fp16", name: str = "matmul", weight_dtype=None) -> OpCost:
    """[m, k] x [k, n] -> [m, n]: 2·m·n·k FLOPs, bytes = read both inputs + write the output.

    dtype: bytes per element as a dtype name ('fp16') or a number; weight_dtype (default dtype) for
    the [k, n] operand when it is a weight matrix (e.g. int4 weights, fp16 activations).
    """
    m, n, k = _pos_int(m, "m"), _pos_int(n, "n"), _pos_int(k, "k")
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    nbytes = a * (m * k + m * n) + w * k * n
    return OpCost(name=name, computation=f"[{m}, {k}] x [{k}, {n}]", kind="matmul", flops=2 * m * n * k,
                  bytes=nbytes, weight_bytes=w * k * n, shapes=f"[{m}, {k}] x [{k}, {n}]", m=m, k=k, n=n)


def _check_phase(phase):
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


# --- the real count -------------------------------------------------------------------------------
def _real_rows(s: ModelShape, phase: str, L: int, B: int, a: float, w: float, kv: float, all_logits: bool):
    D, H, K, Dh, F, V, N = (s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size,
                            s.vocab_size, s.num_layers)
    T, S = (L, L) if phase == "prefill" else (1, L + 1)
    BT = B * T
    E = ELEMENTWISE_FLOPS
    rows: list[OpCost] = []

    def mm(name, comp, k_, n_, count=N, scope="layer", m_=BT, shapes=None):
        flops = 2 * m_ * k_ * n_
        nbytes = a * (m_ * k_ + m_ * n_) + w * k_ * n_
        rows.append(OpCost(name, comp, "matmul", flops, nbytes, count, scope, weight_bytes=w * k_ * n_,
                           shapes=shapes or f"[{m_}, {k_}] x [{k_}, {n_}]", m=m_, k=k_, n=n_))

    def ew(name, comp, flops, nbytes, count=N, scope="layer", weight_bytes=0, shapes=""):
        rows.append(OpCost(name, comp, "elementwise", flops, nbytes, count, scope, weight_bytes=weight_bytes,
                           shapes=shapes))

    def norm(name, count=N, scope="layer"):
        ew(name, "RMSNorm(x) * w", E["rmsnorm"] * BT * D, a * 2 * BT * D + w * D, count, scope,
           weight_bytes=w * D, shapes=f"[{BT}, {D}]")

    if V and N:
        rows.append(OpCost("embed", "x = E[ids]", "memory", 0, (a + w) * BT * D, 1, "model",
                           weight_bytes=w * BT * D, shapes=f"{BT} rows of [{V}, {D}]"))
    norm("attn_norm")
    mm("q_proj", "Q = x W_Q", D, H * Dh)
    mm("k_proj", "K = x W_K", D, K * Dh)
    mm("v_proj", "V = x W_V", D, K * Dh)
    ew("rope", "RoPE(Q), RoPE(K)", E["rope"] * BT * (H + K) * Dh, a * (2 * BT * (H + K) * Dh + 2 * BT * Dh),
       shapes=f"[{B}, {H}+{K}, {T}, {Dh}]")
    rows.append(OpCost("kv_cache_write", "cache[K, V] <- K, V", "memory", 0, kv * 2 * BT * K * Dh, N, "layer",
                       kv_bytes=kv * 2 * BT * K * Dh, shapes=f"2 x [{B}, {K}, {T}, {Dh}]"))
    kv_read = kv * B * K * S * Dh  # one of K or V, only the K heads (GQA shares them)
    rows.append(OpCost("qk", "scores = Q K^T / sqrt(Dh)", "attention", 2 * B * H * T * S * Dh,
                       a * (B * H * T * Dh + B * H * T * S) + kv_read, N, "layer", kv_bytes=kv_read,
                       shapes=f"{B}x{H} heads: [{T}, {Dh}] x [{Dh}, {S}]"))
    ew("softmax", "P = softmax(scores + mask)", E["softmax"] * B * H * T * S, a * 2 * B * H * T * S,
       shapes=f"[{B}, {H}, {T}, {S}]")
    rows.append(OpCost("pv", "Z = P V", "attention", 2 * B * H * T * S * Dh,
                       a * (B * H * T * S + B * H * T * Dh) + kv_read, N, "layer", kv_bytes=kv_read,
                       shapes=f"{B}x{H} heads: [{T}, {S}] x [{S}, {Dh}]"))
    mm("o_proj", "out = Z W_O", H * Dh, D)
    ew("attn_residual", "x = x + out", E["residual"] * BT * D, a * 3 * BT * D, shapes=f"[{BT}, {D}]")
    norm("mlp_norm")
    if s.mlp == "swiglu":
        mm("gate_proj", "G = x W_gate", D, F)
        mm("up_proj", "U = x W_up", D, F)
        ew("silu_mul", "A = silu(G) * U", E["silu_mul"] * BT * F, a * 3 * BT * F, shapes=f"[{BT}, {F}]")
    else:
        mm("up_proj", "A = x W_1", D, F)
        ew("relu", "A = relu(A)", E["relu"] * BT * F, a * 2 * BT * F, shapes=f"[{BT}, {F}]")
    mm("down_proj", "y = A W_down", F, D)
    ew("mlp_residual", "x = x + y", E["residual"] * BT * D, a * 3 * BT * D, shapes=f"[{BT}, {D}]")
    if V:
        norm("final_norm", count=1, scope="model")
        m_ = BT if all_logits else B
        mm("lm_head", "logits = x W_vocab", D, V, count=1, scope="model", m_=m_)
    return rows


# --- the lecture notes' count ---------------------------------------------------------------------
def _ratio(x, y):
    if isinstance(x, numbers.Integral) and isinstance(y, numbers.Integral):
        return Fraction(int(x), int(y))
    return x / y


# The right-hand sides printed in the notes, as functions of (L, D, H): row number -> intensity.
SEED_CLOSED_FORMS = {
    "prefill": {
        1: lambda L, D, H: _ratio(L * D, 2 * L + D), 2: lambda L, D, H: _ratio(L * D, 2 * L + D),
        3: lambda L, D, H: _ratio(L * D, 2 * L + D), 7: lambda L, D, H: _ratio(L * H, 2 * H + L),
        8: lambda L, D, H: _ratio(L * H, 2 * H + L), 10: lambda L, D, H: _ratio(L * D, 2 * L + D),
        11: lambda L, D, H: _ratio(4 * L * D, 5 * L + 4 * D), 13: lambda L, D, H: _ratio(4 * L * D, 5 * L + 4 * D),
    },
    "decode": {
        1: lambda L, D, H: _ratio(D, 2 + D), 2: lambda L, D, H: _ratio(D, 2 + D),
        4: lambda L, D, H: _ratio(D, 2 + D),
        9: lambda L, D, H: _ratio(H + L * H, 2 * H + L + L * H + 1),
        10: lambda L, D, H: _ratio(H + L * H, 2 * H + L + L * H + 1),
        12: lambda L, D, H: _ratio(D, 2 + D), 13: lambda L, D, H: _ratio(4 * D, 5 + 4 * D),
        15: lambda L, D, H: _ratio(4 * D, 5 + 4 * D),
    },
}


def _is_number(x):
    return isinstance(x, numbers.Number)


def seed_table(phase: str, seq_len, hidden_size, num_heads=None, head_dim=None) -> OpTable:
    """The lecture notes' table for `phase`, row for row (13 prefill rows, 15 decode rows).

    seq_len is L (prefill: the prompt; decode: the tokens already cached), hidden_size D, num_heads n_h,
    head_dim H = D / n_h. Integers give exact Fractions; sympy symbols give symbolic intensities
    (give head_dim then, e.g. seed_table('decode', L, D, head_dim=H) with L, D, H = sympy.symbols(...)).
    """
    _check_phase(phase)
    L, D = seq_len, hidden_size
    if _is_number(L):
        L = _pos_int(L, "seq_len")
    if _is_number(D):
        D = _pos_int(D, "hidden_size")
    if num_heads is None and head_dim is None:
        raise ValueError("give num_heads (or head_dim) for the seed table")
    if head_dim is None:
        num_heads = _pos_int(num_heads, "num_heads")
        if _is_number(D):
            if D % num_heads:
                raise ValueError(f"num_heads={num_heads} must divide hidden_size={D}")
            head_dim = D // num_heads
        else:
            head_dim = D / num_heads
    else:
        if _is_number(head_dim):
            head_dim = _pos_int(head_dim, "head_dim")
        if num_heads is None:
            num_heads = D // head_dim if _is_number(D) and _is_number(head_dim) else D / head_dim
        elif _is_number(num_heads) and _is_number(D) and _is_number(head_dim) and num_heads * head_dim != D:
            raise ValueError(f"num_heads={num_heads} x head_dim={head_dim} must equal hidden_size={D}")
    if _is_number(D) and _is_number(head_dim) and D % head_dim:
        raise ValueError(f"head_dim={head_dim} must divide hidden_size={D}")
    H, nh = head_dim, num_heads
    rows = []

    def op(no, comp, inputs, output, work=0, traffic=0, closed="-", count=1, kind="matmul"):
        if not traffic:
            kind = "data"
        rows.append(SeedOp(name=f"{no}", computation=comp, kind=kind, flops=work, bytes=traffic, count=count,
                           scope="layer", no=no, inputs=inputs, output=output, closed_form=closed))

    part = "Partition_{-1}"
    if phase == "prefill":
        proj = dict(work=L * D * D, traffic=L * D + D * D + L * D, closed="L×D/(2L+D)")
        op(1, "Q = x W^Q", "x ∈ R^{L×D}, W^Q ∈ R^{D×D}", "Q ∈ R^{L×D}", **proj)
        op(2, "K = x W^K", "x ∈ R^{L×D}, W^K ∈ R^{D×D}", "K ∈ R^{L×D}", **proj)
        op(3, "V = x W^V", "x ∈ R^{L×D}, W^V ∈ R^{D×D}", "V ∈ R^{L×D}", **proj)
        op(4, f"[Q_1..Q_nh] = {part}(Q)", "Q ∈ R^{L×D}", "Q_i ∈ R^{L×H}")
        op(5, f"[K_1..K_nh] = {part}(K)", "K ∈ R^{L×D}", "K_i ∈ R^{L×H}")
        op(6, f"[V_1..V_nh] = {part}(V)", "V ∈ R^{L×D}", "V_i ∈ R^{L×H}")
        op(7, "Score_i = softmax(Q_i K_i^T / sqrt(D))", "Q_i, K_i ∈ R^{L×H}", "score_i ∈ R^{L×L}",
           work=L * L * H, traffic=L * H + L * L + L * H, closed="L×H/(2H+L)", count=nh, kind="attention")
        op(8, "Z_i = score_i V_i", "score_i ∈ R^{L×L}, V_i ∈ R^{L×H}", "Z_i ∈ R^{L×H}",
           work=L * L * H, traffic=L * H + L * L + L * H, closed="L×H/(2H+L)", count=nh, kind="attention")
        op(9, "Z = Merge_{-1}([Z_1..Z_nh])", "Z_i ∈ R^{L×H}", "Z ∈ R^{L×D}")
        op(10, "Out = Z W^O", "Z ∈ R^{L×D}, W^O ∈ R^{D×D}", "Out ∈ R^{L×D}", **proj)
        op(11, "A = Out W^1", "Out ∈ R^{L×D}, W^1 ∈ R^{D×4D}", "A ∈ R^{L×4D}",
           work=4 * L * D * D, traffic=L * D + 4 * D * D + L * 4 * D, closed="4L×D/(5L+4D)")
        op(12, "A' = relu(A)", "A ∈ R^{L×4D}", "A' ∈ R^{L×4D}")
        op(13, "x' = A' W^2", "A' ∈ R^{L×4D}, W^2 ∈ R^{4D×D}", "x' ∈ R^{L×D}",
           work=4 * L * D * D, traffic=L * D + 4 * D * D + L * 4 * D, closed="4L×D/(5L+4D)")
    else:
        proj = dict(work=D * D, traffic=D + D * D + D, closed="D/(2+D)")
        attn = dict(work=(L + 1) * H, traffic=H + (L + 1) * H + (L + 1), closed="(H+LH)/(2H+L+LH+1)",
                    count=nh, kind="attention")
        op(1, "Q = Q_d = t W^Q", "t ∈ R^{1×D}, W^Q ∈ R^{D×D}", "Q, Q_d ∈ R^{1×D}", **proj)
        op(2, "K_d = t W^K", "t ∈ R^{1×D}, W^K ∈ R^{D×D}", "K_d ∈ R^{1×D}", **proj)
        op(3, "K = concat(K_cache, K_d)", "K_cache ∈ R^{L×D}, K_d ∈ R^{1×D}", "K ∈ R^{(L+1)×D}")
        op(4, "V_d = t W^V", "t ∈ R^{1×D}, W^V ∈ R^{D×D}", "V_d ∈ R^{1×D}", **proj)
        op(5, "V = concat(V_cache, V_d)", "V_cache ∈ R^{L×D}, V_d ∈ R^{1×D}", "V ∈ R^{(L+1)×D}")
        op(6, f"[Q_1..Q_nh] = {part}(Q)", "Q ∈ R^{1×D}", "Q_i ∈ R^{1×H}")
        op(7, f"[K_1..K_nh] = {part}(K)", "K ∈ R^{(L+1)×D}", "K_i ∈ R^{(L+1)×H}")
        op(8, f"[V_1..V_nh] = {part}(V)", "V ∈ R^{(L+1)×D}", "V_i ∈ R^{(L+1)×H}")
        op(9, "Score_i = softmax(Q_i K_i^T / sqrt(D))", "Q_i ∈ R^{1×H}, K_i ∈ R^{(L+1)×H}",
           "score_i ∈ R^{1×(L+1)}", **attn)
        op(10, "Z_i = score_i V_i", "score_i ∈ R^{1×(L+1)}, V_i ∈ R^{(L+1)×H}", "Z_i ∈ R^{1×H}", **attn)
        op(11, "Z = Merge_{-1}([Z_1..Z_nh])", "Z_i ∈ R^{1×H}", "Z ∈ R^{1×D}")
        op(12, "Out = Z W^O", "Z ∈ R^{1×D}, W^O ∈ R^{D×D}", "Out ∈ R^{1×D}", **proj)
        op(13, "A = Out W^1", "Out ∈ R^{1×D}, W^1 ∈ R^{D×4D}", "A ∈ R^{1×4D}",
           work=4 * D * D, traffic=D + 4 * D * D + 4 * D, closed="4D/(5+4D)")
        op(14, "A' = relu(A)", "A ∈ R^{1×4D}", "A' ∈ R^{1×4D}")
        op(15, "t' = A' W^2", "A' ∈ R^{1×4D}, W^2 ∈ R^{4D×D}", "t' ∈ R^{1×D}",
           work=4 * D * D, traffic=4 * D + 4 * D * D + D, closed="4D/(5+4D)")
    if all(_is_number(x) for x in (D, nh, H)):
        shape = ModelShape(int(D), int(nh), head_dim=int(H), intermediate_size=4 * int(D), mlp="relu",
                           name="lecture notes")
    else:  # symbolic: a placeholder shape (only the rows carry the symbols)
        shape = ModelShape(1, 1, name=f"symbolic D={D}, H={H}", mlp="relu")
    return OpTable(phase=phase, mode="seed", model=shape, seq_len=L, batch=1, dtype=None, rows=rows)


# --- the entry point ------------------------------------------------------------------------------
def intensity_table(model, phase: str, seq_len: int, batch: int = 1, dtype="fp16", *, mode: str = "real",
                    weight_dtype=None, kv_dtype=None, all_logits: bool = True) -> OpTable:
    """Per-operation FLOPs, bytes and FLOP/byte of one forward pass of `phase`.

    model: a LlamaConfig, a ModelShape (plain sizes: ModelShape(hidden_size=..., num_heads=...)), a
        config dict, or a name ('tiny', 'llama2-7b', 'llama3-8b', ...).
    phase: 'prefill' (seq_len prompt tokens at once) or 'decode' (one new token per sequence, with
        seq_len tokens already in the KV cache, so attention reads seq_len + 1 keys and values).
    batch: sequences processed together. dtype: bytes per element of activations (and weights and
        the KV cache unless weight_dtype / kv_dtype say otherwise): 'fp32', 'fp16', 'bf16', 'fp8',
        'int8', 'int4' or a number of bytes.
    mode: 'real' (default) or 'seed' (the lecture notes' table exactly; uses only hidden_size and
        num_heads, batch must be 1, dtype is ignored: the notes count elements).
    all_logits: the LM head computes logits for every position (what model(ids) does); False counts
        only the last position of each sequence (all that generation needs).

    Attention FLOPs are dense: the causal mask's zeros are computed too (as SDPA's math path and the
    FLOP counters do); a causal kernel such as FlashAttention skips about half of them in prefill.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _check_phase(phase)
    seq_len = _pos_int(seq_len, "seq_len")
    batch = _pos_int(batch, "batch")
    shape = as_model(model)
    if mode == "seed":
        if batch != 1:
            raise ValueError(f"batch must be 1 in seed mode (the lecture notes have no batch), got {batch}")
        t = seed_table(phase, seq_len, shape.hidden_size, shape.num_heads)
        t.model = replace(t.model, name=shape.name or t.model.name)
        return t
    a = bytes_per_element(dtype)
    w = a if weight_dtype is None else bytes_per_element(weight_dtype, "weight_dtype")
    kv = a if kv_dtype is None else bytes_per_element(kv_dtype, "kv_dtype")
    rows = _real_rows(shape, phase, seq_len, batch, a, w, kv, all_logits)
    name = f"{dtype} B/elem" if isinstance(dtype, numbers.Real) else canonical_dtype(dtype)
    return OpTable(phase=phase, mode="real", model=shape, seq_len=seq_len, batch=batch, dtype=name, rows=rows)


def prefill_decode_tables(model, seq_len: int, batch: int = 1, dtype="fp16", **kw) -> tuple[OpTable, OpTable]:
    """(prefill of seq_len tokens, decode of the next token after them)."""
    return (intensity_table(model, "prefill", seq_len, batch, dtype, **kw),
            intensity_table(model, "decode", seq_len, batch, dtype, **kw))


__all__ = ["ModelShape", "PRESETS", "preset_names", "as_model", "OpCost", "SeedOp", "OpTable", "matmul_cost",
           "seed_table", "SEED_CLOSED_FORMS", "intensity_table", "prefill_decode_tables", "ELEMENTWISE_FLOPS",
           "PHASES"]
