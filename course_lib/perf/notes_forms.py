"""The lecture notes' arithmetic-intensity tables, reproduced row for row (mode "notes").

The notes analyse one layer with multi-head attention (D x D projections) and a 4D relu MLP, count work
in *multiply-adds* and traffic in *elements* (not FLOPs and bytes), attention per head, and scale the
scores by 1/sqrt(D) (it should be the head dimension). ``notes_table`` reproduces those counts exactly
(Fractions, or sympy expressions for symbolic sizes), and ``NOTES_CLOSED_FORMS`` holds the right-hand
sides the notes print; ``course_lib.perf.intensity`` refines them (``mode="real"``).
"""
from __future__ import annotations

import numbers
from fractions import Fraction

from course_lib.perf.ops import PHASES, NotesOp, OpTable
from course_lib.validate import integer, one_of


def _ratio(x, y):
    if isinstance(x, numbers.Integral) and isinstance(y, numbers.Integral):
        return Fraction(int(x), int(y))
    return x / y


# The right-hand sides printed in the notes, as functions of (L, D, H): row number -> intensity.
NOTES_CLOSED_FORMS = {
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


def notes_table(phase: str, seq_len, hidden_size, num_heads=None, head_dim=None) -> OpTable:
    """The lecture notes' table for `phase`, row for row (13 prefill rows, 15 decode rows).

    seq_len is L (prefill: the prompt; decode: the tokens already cached), hidden_size D, num_heads n_h,
    head_dim H = D / n_h. Integers give exact Fractions; sympy symbols give symbolic intensities
    (give head_dim then, e.g. notes_table('decode', L, D, head_dim=H) with L, D, H = sympy.symbols(...)).
    """
    one_of(phase, "phase", PHASES)
    L, D = seq_len, hidden_size
    if _is_number(L):
        L = integer(L, "seq_len", low=1)
    if _is_number(D):
        D = integer(D, "hidden_size", low=1)
    if num_heads is None and head_dim is None:
        raise ValueError("give num_heads (or head_dim) for the notes' table")
    if head_dim is None:
        num_heads = integer(num_heads, "num_heads", low=1)
        if _is_number(D):
            if D % num_heads:
                raise ValueError(f"num_heads={num_heads} must divide hidden_size={D}")
            head_dim = D // num_heads
        else:
            head_dim = D / num_heads
    else:
        if _is_number(head_dim):
            head_dim = integer(head_dim, "head_dim", low=1)
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
        rows.append(NotesOp(name=f"{no}", computation=comp, kind=kind, flops=work, bytes=traffic, count=count,
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
    return OpTable(phase=phase, mode="notes", model=None, seq_len=L, batch=1, dtype=None, rows=rows,
                   dims={"D": D, "n_h": nh, "H": H})



__all__ = ["NOTES_CLOSED_FORMS", "notes_table"]
