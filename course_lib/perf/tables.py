"""The one table formatter of the course: rows of cells as Markdown, HTML or plain text.

    from course_lib.perf.tables import format_table, format_records
    print(format_table(["GPU", "GB/s"], [["A100", "2039"]], "text"))
    print(format_records([{"model": "Llama-2-7B", "cache GiB": 2.0}]))     # dict rows: keys are the head

It imports nothing from course_lib, so any module may use it.
"""
from __future__ import annotations

import html

FORMATS = ("markdown", "html", "text")


def _is_number(cell: str) -> bool:
    try:
        float(cell.replace(",", "").rstrip("%"))
    except ValueError:
        return False
    return True


def format_table(head: list[str], rows: list[list], fmt: str = "markdown", note: str = "") -> str:
    """Render rows of cells (each turned into str) under `head` as 'markdown', 'html' or 'text'.

    note: a caption (below the table). In 'text', columns whose cells are all numbers are right-aligned.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    head = [str(h) for h in head]
    rows = [[str(c) for c in r] for r in rows]
    for i, r in enumerate(rows):
        if len(r) != len(head):
            raise ValueError(f"rows[{i}] has {len(r)} cells but head has {len(head)} columns")
    if fmt == "html":
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        cap = f"<caption style='caption-side:bottom'>{html.escape(note)}</caption>" if note else ""
        return f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines) + (f"\n\n{note}" if note else "")
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    right = [bool(rows) and all(_is_number(r[i]) for r in rows) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    lines = [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    return "\n".join(lines) + (f"\n{note}" if note else "")


def format_records(records: list[dict], fmt: str = "text", floatfmt: str = ".3g", note: str = "") -> str:
    """format_table for dict rows: the keys of the first are the head; floats use `floatfmt`."""
    if not records:
        return ""
    keys = list(records[0])
    for i, r in enumerate(records):
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"records[{i}] lacks {missing} (the head is the keys of records[0]: {keys})")
    rows = [[f"{r[k]:{floatfmt}}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in records]
    return format_table(keys, rows, fmt, note)


def si(x, unit: str = "") -> str:
    """x with an SI prefix and 3 significant digits: si(1.5e9, 'B') == '1.5 GB'; '-' for None."""
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


__all__ = ["format_table", "format_records", "si", "FORMATS"]
