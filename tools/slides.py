r"""Slide decks for instructors: one reveal.js deck per module, from its executed notebook, offline.

    python tools/slides.py build [--out build/slides]   the decks alone (`make slides`), as a small site:
                                                        OUT/index.html lists them, OUT/slides/NN_slug.slides.html
    python tools/site.py build                          the site builds them too, beside the pages
                                                        (build/site/slides/), linked from each module

A deck is nbconvert's slides exporter (reveal.js) with the course's template (tools/site_assets/templates/
course_slides): reveal.js comes from the copy vendored in tools/site_assets/reveal.js (version and licence in
its README.md), copied to the site's assets/reveal.js and named by the exporter's `reveal_url_prefix`,
relative to the deck; MathJax is the site's own. Nothing is fetched from a CDN; `tools/site.py check` and the
browser tier (e2e/test_site_pages.py) check it.

Slide structure, derived here from the notebook (on a copy: the tracked .ipynb files do not change). A
slide carries one idea (a heading and its point, a figure, a table); the notebook's prose goes into reveal.js
speaker notes (key S), so the deck is what an instructor presents and the notes what they say:
- A cell's own `slideshow` metadata wins, and such a cell is shown as written: in the .py source, a header
  field such as
      # %% [markdown] id="c031" slideshow={"slide_type": "notes"}
  (tools/nb.py writes header fields as the cell's metadata). Types: slide, subslide, fragment, "-"
  (continue), notes (speaker notes), skip. A cell tagged `slide-keep` (KEEP_TAG) is placed by the rules
  below but shown as written (markdown whole; code with its source).
- The Colab badge and install cells (ids c000, c001) and the cell tagged `parameters` are skipped.
- A markdown cell is cut at its headings and summarized block by block (`markdown_points`): a heading, a
  formula or a table as written; a list by the head of each item (its bold lead, or its first clause); a
  paragraph by its bold lead, or its lead sentence when it opens a section, or whole when it is a short line
  ending in ':' that introduces what follows; any other paragraph, code block or `<details>` only in the
  notes. Each point's full text (when the slide shows less) follows it as a notes cell.
- A code cell shows its outputs, each figure and each table (an HTML or markdown table, or TABLE_LINES
  printed lines or more) as a unit of its own; its source only when it is a few plain lines with a result
  (CODE_LINES: a call, an assignment) or tagged `slide-keep`. Text outputs longer than MAX_OUTPUT_LINES
  lines are trimmed to KEEP_OUTPUT_LINES, with a line saying how many were left out (the page shows all).
- Pagination (`_Layout`): a `# `/`## ` heading starts a slide, a deeper one a sub-slide (reveal's vertical
  slides); anything else continues the current sub-slide unless it would take it past CHAR_BUDGET
  characters of text or LINE_BUDGET lines, or it is a second figure or table there: then a new sub-slide.
- Measured (`deck_stats`, on the built HTML) and judged (`deck_problems`: this tool's build and the site's
  refuse a deck with a problem, naming each, and tests/test_slides.py fails on it): the median
  text a slide at most MEDIAN_TEXT characters, no slide past MAX_TEXT characters of text or MAX_PROSE of
  prose, every figure of the executed notebook on a slide, every word of its text on a slide or in the notes.
"""
from __future__ import annotations

import argparse
import base64
import copy
import html
import math
import os
import re
import shutil
import statistics
import struct
import sys
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course_lib import colab_url  # noqa: E402
from tools import nbexec, site_plan  # noqa: E402
from tools.site_plan import deck_path  # noqa: E402

REVEAL_DIR = site_plan.ASSETS / "reveal.js"     # the vendored reveal.js
TEMPLATES = site_plan.ASSETS / "templates"
SKIPPED_IDS = ("c000", "c001")                  # the Colab badge and install cells (tools/nb.py FIXED_IDS)
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "notes", "skip")
LINE_BUDGET = 22          # lines of a 960x700 slide at the template's 20 px text (about 26, less a heading)
MAX_OUTPUT_LINES = 16
KEEP_OUTPUT_LINES = 12
TEXT_WIDTH = 70           # characters in a line of a slide before it wraps (measured: 65-75 at 20 px)
FIGURE_LINES = 14         # what a figure counts as when its size is not known
SLIDE_WIDTH_PX, LINE_PX = 900, 27   # a figure wider than the slide is scaled to it; a line of text is ~27 px
CHAR_BUDGET = 300         # characters of text on a slide before the next point starts a sub-slide
LEAD_CHARS = 160          # a lead sentence longer than this is cut at a clause
POINT_CHARS = 80          # a list item's head
BOLD_ALONE = 25           # a bold lead this long stands alone; a shorter one takes its first sentence along
CAPTION_CHARS = 140       # a paragraph this short that ends in ':' introduces what follows: it stays
MAX_POINTS = 6            # list items shown; the rest are in the notes
CODE_LINES = 3            # a code cell this short with a result shows its code; a longer one only its outputs
TABLE_LINES = 4           # a printed block this long is a table: a slide of its own
KEEP_TAG = "slide-keep"   # a cell tag: the cell goes on the slide as written (code: its source shown)
MEDIAN_TEXT = 300         # a deck's median characters of text a slide, at most (deck_problems)
MAX_TEXT = 1000           # characters of text (tables not counted) on any slide, at most
MAX_PROSE = 600           # characters of prose (outside outputs) on any slide, at most


class SlidesError(site_plan.SiteError):
    """A deck cannot be built as asked; the message says which notebook and cell."""


# --- the slide structure -----------------------------------------------------------------------------------

_HEADING = re.compile(r"^(#{1,6})\s+\S")
_ITEM = re.compile(r"^(\s*)([*+-]|\d+[.)])\s+")
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^()\s]*(?:\s+\"[^\"]*\")?\)")
_MASK = re.compile(r"!?\[[^\]]*\]\([^()\s]*(?:\s+\"[^\"]*\")?\)|`[^`]*`|\$[^$]*\$")   # no sentence ends inside
_ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "etc.", "cf.", "approx.", "resp.", "Fig.", "Eq.", "Sec.")
_SENTENCE_END = re.compile(r"[.!?;](?=\s+[^\sa-z])|[.!?]$")
_CLAUSE = re.compile(r"[:;,](?=\s)|\s[—–-]\s")


def _heading_level(cell) -> int | None:
    if cell.cell_type != "markdown":
        return None
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    m = _HEADING.match(first)
    return len(m.group(1)) if m else None


def _text_lines(text: str) -> int:
    return sum(1 + len(line) // TEXT_WIDTH for line in text.splitlines())


def visible_text(md: str) -> str:
    """About the text a reader sees of the markdown `md`: links by their text, no emphasis or code marks,
    no heading, list or quote markers."""
    text = _LINK.sub(r"\1", md)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"^\s*(#{1,6}\s+|>\s?|[*+-]\s+|\d+[.)]\s+)", "", text, flags=re.M)
    parts = re.split(r"(`[^`\n]*`)", text)   # code spans as written, without their backticks
    return "".join(p[1:-1] if i % 2 else re.sub(r"\*\*|__", "", p) for i, p in enumerate(parts))


def _size(md: str) -> int:
    return len(" ".join(visible_text(md).split()))


def md_blocks(md: str) -> list[tuple[str, str]]:
    """The markdown `md` as (kind, text) blocks, kind one of heading, para, list, table, math, quote, fence,
    html: what the summary below treats differently."""
    lines, blocks, i = md.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        start = line.lstrip()
        j = i + 1
        if _FENCE.match(line):
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            kind, j = "fence", j + 1
        elif start.startswith("$$"):
            if not (len(start.rstrip()) > 2 and start.rstrip().endswith("$$")):   # not one line $$ ... $$
                while j < len(lines) and "$$" not in lines[j]:
                    j += 1
                j += 1
            kind = "math"
        elif _HEADING.match(line):
            kind = "heading"
        else:
            kind = ("table" if start.startswith("|") else "quote" if start.startswith(">") else
                    "html" if start.startswith("<") else "list" if _ITEM.match(line) else "para")
            while j < len(lines):
                nxt = lines[j]
                if not nxt.strip():
                    k = j
                    while k < len(lines) and not lines[k].strip():
                        k += 1
                    # a list goes on past a blank line when an item or an indented line follows
                    if kind == "list" and k < len(lines) and (_ITEM.match(lines[k]) or lines[k][:1].isspace()):
                        j = k
                        continue
                    break
                if _HEADING.match(nxt) or _FENCE.match(nxt) or nxt.lstrip().startswith("$$"):
                    break
                if kind == "para" and _ITEM.match(nxt) and not nxt[:1].isspace():
                    break                                   # a list may start right under a paragraph
                j += 1
        blocks.append((kind, "\n".join(lines[i:j])))
        i = j
    return blocks


def _balanced(md: str) -> str:
    return md + "**" if md.count("**") % 2 else md


def lead(md: str, limit: int) -> str:
    """The first sentence (or clause ending in ';') of the markdown `md`, on one line; one longer than
    `limit` visible characters is cut at its last clause (or word) boundary within the limit, marked '…'.
    Links, code and math are never cut, nor taken for a sentence's end."""
    flat = " ".join(md.split())
    masked = _MASK.sub(lambda m: "x" * len(m.group()), flat)
    end = len(flat)
    for m in _SENTENCE_END.finditer(masked):
        if not masked[:m.end()].endswith(_ABBREVIATIONS):
            end = m.end()
            break
    sentence = flat[:end].rstrip(";")
    if _size(sentence) <= limit:
        return _balanced(sentence)
    cuts = [m.start() for m in _CLAUSE.finditer(masked[:end])] + [m.start() for m in re.finditer(r"\s", masked[:end])]
    fits = [c for c in cuts if _size(flat[:c]) <= limit]
    good = [c for c in fits if c in cuts[:len(cuts) - len(fits)] or _CLAUSE.match(masked, c)]
    cut = max((c for c in good if _size(flat[:c]) >= limit // 2), default=max(fits, default=0))
    return _balanced(flat[:cut].rstrip(" ,;:—–-")) + " …"


def _paragraph_point(text: str, first: bool) -> str:
    """A paragraph on a slide: its bold lead (with its first sentence when the bold is a few words), the lead
    sentence of the first paragraph of a section, a short line that introduces what follows (ends in ':'),
    or nothing (it stays in the notes)."""
    m = re.match(r"\s*(\*\*[^*]+\*\*)(.*)", text, re.S)
    if m:
        bold, rest = m.groups()
        if _size(bold) >= BOLD_ALONE or not rest.strip():
            return bold
        return f"{bold} {lead(rest, LEAD_CHARS - _size(bold))}"
    if first or (_size(text) <= CAPTION_CHARS and text.rstrip().endswith(":")):
        return lead(text, LEAD_CHARS)
    return ""


def _list_point(text: str) -> str:
    """A list on a slide: the head of each top-level item (its bold lead, or its first clause), nested items
    and the rest in the notes; past MAX_POINTS items, a line says how many more the notes hold."""
    items, top, nested = [], None, False
    for line in text.splitlines():
        m = _ITEM.match(line)
        if m and (top is None or len(m.group(1)) <= top):
            top = len(m.group(1)) if top is None else top
            items.append([m.group(2), line[m.end():]])
            nested = False
        elif m:
            nested = True
        elif items and not nested:
            items[-1][1] += " " + line.strip()
    heads = []
    for marker, body in items[:MAX_POINTS]:
        b = re.match(r"\s*(\*\*[^*]+\*\*)(.*)", body, re.S)
        if b and (_size(b.group(1)) >= BOLD_ALONE or not b.group(2).strip(" :.,")):
            head = b.group(1)
        else:
            flat = " ".join(body.split())
            colon = re.search(r"(?<=\S):\s", _MASK.sub(lambda m: "x" * len(m.group()), flat))
            head = lead(flat[:colon.start()] if colon else flat, POINT_CHARS)
        heads.append(f"{marker} {head}")
    if len(items) > MAX_POINTS:
        heads.append(f"{'*' if items[0][0] in '*+-' else f'{MAX_POINTS + 1}.'} … {len(items) - MAX_POINTS} more "
                     "(in the notes)")
    return "\n".join(heads)


def block_point(kind: str, text: str, first: bool) -> str:
    """What of one markdown block goes on the slide ('' for nothing): a heading, a formula or a table as
    written; a list by its items' heads; a paragraph or a quote by `_paragraph_point`; code and HTML blocks
    (a `<details>`) only in the notes."""
    if kind in ("heading", "math", "table"):
        return text
    if kind == "list":
        return _list_point(text)
    if kind == "quote":
        inner = _paragraph_point(re.sub(r"^\s*>\s?", "", text, flags=re.M), True)
        return f"> {inner}" if inner else ""
    if kind == "para":
        return _paragraph_point(text, first)
    return ""


def markdown_points(md: str) -> list[tuple[str, str]]:
    """The markdown `md` as (slide text, notes) points: each block that shows something on a slide starts a
    point; the blocks that show nothing join the notes of the point before (or after, at the start). A
    point's notes hold its blocks in full, or are '' when the slide already shows all of them."""
    points, pending, first = [], [], True
    for kind, text in md_blocks(md):
        point = block_point(kind, text, first)
        first = kind == "heading" or (first and kind not in ("para", "quote", "list"))
        if point:
            points.append([point, pending + [text]])
            pending = []
        elif points:
            points[-1][1].append(text)
        else:
            pending.append(text)
    if pending:   # nothing of `md` shows: its first sentence does
        points.append([lead(visible_text(pending[0]), LEAD_CHARS), pending])
    return [(shown, "" if _size("\n".join(notes)) <= _size(shown) else "\n\n".join(notes))
            for shown, notes in points]


def _png_lines(output) -> int:
    """The lines of a slide a PNG figure takes at its displayed size (a wide one scaled to the slide)."""
    try:
        head = base64.b64decode(output["data"]["image/png"][:64])
        w, h = struct.unpack(">II", head[16:24])
    except (KeyError, ValueError, struct.error, TypeError):
        return FIGURE_LINES
    return max(4, math.ceil(h * min(1.0, SLIDE_WIDTH_PX / max(w, 1)) / LINE_PX))


def output_units(cell) -> list[tuple[str, list]]:
    """The outputs of a code cell in (kind, outputs) units of one slide each at most: "figure" (an image, or
    HTML showing one), "table" (an HTML or markdown table, or a printed block of TABLE_LINES lines or more),
    "text" (consecutive short printed lines, a claim's verdict)."""
    units = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if any(k.startswith("image/") for k in data) or "<img" in data.get("text/html", ""):
            units.append(("figure", [out]))
        elif "<table" in data.get("text/html", "") or "\n|" in "\n" + data.get("text/markdown", ""):
            units.append(("table", [out]))
        else:
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            if _text_lines(text) >= TABLE_LINES:
                units.append(("table", [out]))
            elif units and units[-1][0] == "text":
                units[-1][1].append(out)
            else:
                units.append(("text", [out]))
    return units


def _unit_lines(kind: str, outputs: list) -> int:
    if kind == "figure":
        return sum(_png_lines(o) if "image/png" in o.get("data", {}) else FIGURE_LINES for o in outputs)
    return _lines(nbformat.v4.new_code_cell(outputs=outputs))


def _lines(cell) -> int:
    """About how many lines of a slide the cell takes: its source, wrapped, and its outputs (a figure as
    FIGURE_LINES, a table as its rows)."""
    n = 0 if cell.get("metadata", {}).get("transient", {}).get("remove_source") else _text_lines(cell.source)
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if out.get("output_type") == "stream":
            n += _text_lines(out.get("text", ""))
        elif any(k.startswith("image/") for k in data):
            n += FIGURE_LINES
        elif "text/html" in data:
            body = data["text/html"]
            n += FIGURE_LINES * body.count("<img") + max(2, body.count("<tr"), body.count("<p"))
        elif "text/markdown" in data:
            n += _text_lines(data["text/markdown"])
        elif "text/plain" in data:
            n += _text_lines(data["text/plain"])
    return n


def _trim(text: str) -> str:
    lines = text.splitlines()
    if len(lines) <= MAX_OUTPUT_LINES:
        return text
    left = len(lines) - KEEP_OUTPUT_LINES
    return "\n".join(lines[:KEEP_OUTPUT_LINES]) + f"\n… {left} more lines (the module's page shows them all)\n"


def trim_outputs(cell) -> None:
    """Trim the cell's long text outputs (streams, and plain-text results with no richer form)."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            out["text"] = _trim(out.get("text", ""))
        elif set(out.get("data", {})) == {"text/plain"}:
            out["data"]["text/plain"] = _trim(out["data"]["text/plain"])


def explicit_slide_type(cell, where: str) -> str | None:
    """The slide type the cell's metadata sets (`slideshow` = {"slide_type": ...}), checked, or None."""
    show = cell.get("metadata", {}).get("slideshow")
    if show is None:
        return None
    kind = show.get("slide_type") if isinstance(show, dict) else None
    if kind not in SLIDE_TYPES:
        raise SlidesError(f"{where}: cell {cell.get('id')}: slideshow={show!r}: expected "
                          f'{{"slide_type": one of {", ".join(SLIDE_TYPES)}}}')
    return kind


def _code_shown(cell) -> bool:
    """Whether a code cell's source goes on the slide: tagged `slide-keep`, or a few plain lines (calls,
    assignments) with a result."""
    if KEEP_TAG in cell.get("metadata", {}).get("tags", []):
        return True
    code = [line for line in cell.source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    # code that prints, plots or asserts, or a statement over several lines, is not the point of a slide
    plain = not any(re.match(r"\s|\)|(print|display|assert|plt|fig|ax)\b", line) for line in code)
    return 0 < len(code) <= CODE_LINES and bool(cell.get("outputs")) and plain


class _Layout:
    """Pagination: what is on the current (sub-)slide, and where the next piece goes."""

    def __init__(self):
        self.chars = self.lines = 0
        self.visual = False

    def place(self, chars: int, lines: int, visual: bool = False, level: int | None = None) -> str:
        if level is not None:
            kind = "slide" if level <= 2 else "subslide"
        elif self.lines and (self.chars + chars > CHAR_BUDGET or self.lines + lines > LINE_BUDGET
                             or (visual and self.visual)):
            kind = "subslide"
        else:
            kind = "-"
        if kind != "-":
            self.chars = self.lines = 0
            self.visual = False
        self.chars, self.lines, self.visual = self.chars + chars, self.lines + lines, self.visual or visual
        return kind


def _with_type(cell, kind: str):
    cell.metadata["slideshow"] = {**cell.metadata.get("slideshow", {}), "slide_type": kind}
    return cell


def slide_deck_notebook(nb, where: str = "notebook"):
    """A copy of the executed notebook `nb` as a deck, by the rule in this module's docstring: markdown
    summarized onto slides with the prose in speaker notes, code cells by their outputs, one figure or
    table a slide, long outputs trimmed; `nb` itself is not changed."""
    nb = copy.deepcopy(nb)
    cells, layout = [], _Layout()
    for cell in nb.cells:
        cid = cell.get("id") or f"cell{len(cells)}"
        kind = explicit_slide_type(cell, where)
        tags = cell.get("metadata", {}).get("tags", [])
        if kind is None and (cell.get("id") in SKIPPED_IDS or "parameters" in tags):
            kind = "skip"
        if kind is not None:   # the author's choice (or a skipped cell), as it is
            if kind not in ("skip", "notes"):
                trim_outputs(cell)
                layout.place(_size(cell.source) if cell.cell_type == "markdown" else 0, _lines(cell),
                             level=2 if kind == "slide" else 3 if kind == "subslide" else None)
            cells.append(_with_type(cell, kind))
        elif cell.cell_type == "markdown":
            points = [(cell.source, "")] if KEEP_TAG in tags else markdown_points(cell.source)
            for i, (shown, notes) in enumerate(points):
                level = _heading_level(nbformat.v4.new_markdown_cell(shown))
                kind = layout.place(_size(shown), _text_lines(visible_text(shown)) + (level is not None), level=level)
                cells.append(_with_type(nbformat.v4.new_markdown_cell(shown, id=f"{cid}-{i}"), kind))
                if notes:
                    cells.append(_with_type(nbformat.v4.new_markdown_cell(notes, id=f"{cid}-{i}n"), "notes"))
        elif cell.cell_type == "code":
            trim_outputs(cell)
            units = output_units(cell)
            shown = _code_shown(cell)
            if shown and not units:
                units = [("text", [])]
            for i, (unit, outputs) in enumerate(units):
                part = nbformat.v4.new_code_cell(cell.source if shown and i == 0 else "", id=f"{cid}-{i}",
                                                 outputs=outputs, execution_count=cell.get("execution_count"))
                if not (shown and i == 0):
                    part.metadata["transient"] = {"remove_source": True}
                chars = sum(_size(o.get("text", "")) for o in outputs) if unit == "text" else 0
                lines = _lines(part) if unit != "figure" else _unit_lines(unit, outputs)
                cells.append(_with_type(part, layout.place(chars, lines, visual=unit != "text")))
        else:
            cells.append(_with_type(cell, "skip"))
    nb.cells = cells
    return nb


# --- measuring a deck -----------------------------------------------------------------------------------

@dataclass
class SlideStats:
    """What one (sub-)slide of a built deck shows. `text`: characters of visible text, speaker notes not
    counted, nor the tables (an output holding an HTML table, or printed over TABLE_LINES lines or more),
    whose characters are `table_text`; `prose`: the part of `text` outside the code cells' outputs;
    `figures`, `tables`: how many; `notes`: characters of speaker notes."""
    text: int = 0
    prose: int = 0
    table_text: int = 0
    figures: int = 0
    tables: int = 0
    notes: int = 0


_WORD = re.compile(r"[a-z0-9]+")
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _chars(parts: list[str]) -> int:
    return len(" ".join("".join(parts).split()))


class _DeckParser(HTMLParser):
    """Measures each sub-slide (reveal's second-level <section>) of a deck built by nbconvert."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []            # open elements: (tag, role), role one of section, output, notes, hidden, None
        self.slides: list[SlideStats] = []
        self.output = None         # the text and tables of the output being read: [parts, tables]
        self.words: set[str] = set()   # every word shown, on a slide or in its notes

    def _roles(self):
        return {role for _, role in self.stack}

    def handle_starttag(self, tag, attrs):
        cls = (dict(attrs).get("class") or "").split()
        roles, role = self._roles(), None
        if tag == "section":
            role = "section"
            if sum(r == "section" for _, r in self.stack) == 1:
                self.slides.append(SlideStats())
        elif tag in ("script", "style") or {"jp-InputPrompt", "jp-OutputPrompt"} & set(cls):
            role = "hidden"
        elif tag == "aside" and "notes" in cls:
            role = "notes"
        elif "jp-OutputArea-output" in cls and "output" not in roles and self.slides:
            role, self.output = "output", [[], 0]
        elif tag == "table" and self.output is None and "table" not in roles and self.slides:
            role = "table"     # a markdown table: its text is a table's, not prose
        if self.slides and not roles & {"notes", "hidden"}:
            self.slides[-1].figures += tag == "img"
            self.slides[-1].tables += role == "table"
            if tag == "table" and self.output is not None:
                self.output[1] += 1
        if tag not in _VOID:
            self.stack.append((tag, role))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                closed = {role for _, role in self.stack[i:]}
                del self.stack[i:]
                if "output" in closed and self.output is not None:
                    parts, tables = self.output
                    self.output = None
                    slide, chars = self.slides[-1], _chars(parts)
                    if tables or "".join(parts).strip().count("\n") + 1 >= TABLE_LINES:
                        slide.tables += max(tables, 1)
                        slide.table_text += chars
                    else:
                        slide.text += chars
                break

    def handle_data(self, data):
        roles = self._roles()
        if not self.slides or "hidden" in roles:
            return
        slide = self.slides[-1]
        self.words.update(_WORD.findall(data.lower()))
        if "notes" in roles:
            slide.notes += len(" ".join(data.split()))
        elif self.output is not None:
            self.output[0].append(data)
        elif "table" in roles:
            slide.table_text += len(" ".join(data.split()))
        elif data.strip():
            n = len(" ".join(data.split()))
            slide.text += n
            slide.prose += n


def deck_stats(deck_html: str) -> list[SlideStats]:
    """Each (sub-)slide of the built deck `deck_html`, measured (`SlideStats`), in order."""
    parser = _DeckParser()
    parser.feed(deck_html)
    parser.close()
    return parser.slides


def lost_words(nb, deck_html: str) -> list[str]:
    """The words of the notebook `nb`'s markdown (cells the deck does not skip) that the deck `deck_html`
    shows nowhere, neither on a slide nor in its notes, sorted: what a summary would have lost."""
    parser = _DeckParser()
    parser.feed(deck_html)
    parser.close()
    said = set()
    for cell in nb.cells:
        kind = (cell.get("metadata", {}).get("slideshow") or {}).get("slide_type")
        if cell.cell_type == "markdown" and kind != "skip" and cell.get("id") not in SKIPPED_IDS:
            # words split at any mark, as the HTML splits them at its tags (`DTensor`s: dtensor, s)
            said.update(_WORD.findall(_LINK.sub(r"\1", re.sub(r"<[^>]+>", " ", cell.source)).lower()))
    return sorted(said - parser.words)


def notebook_figures(nb) -> int:
    """How many figures the executed notebook `nb` shows: image outputs, and images in HTML outputs."""
    return sum(1 if any(k.startswith("image/") for k in out.get("data", {}))
               else out.get("data", {}).get("text/html", "").count("<img")
               for cell in nb.cells for out in cell.get("outputs", []))


def deck_problems(stats: list[SlideStats], figures: int, where: str, lost: list[str] = ()) -> list[str]:
    """What makes the deck measured by `stats` one an instructor would not present, one line each ([] when
    nothing): a median past MEDIAN_TEXT characters of text a slide, a slide with more than MAX_TEXT
    characters of text or MAX_PROSE of prose, fewer figures than its notebook's `figures`, words of the
    notebook's text shown nowhere (`lost`, from `lost_words`)."""
    problems = []
    if not stats:
        return [f"{where}: no slides"]
    median = statistics.median(s.text for s in stats)
    if median > MEDIAN_TEXT:
        problems.append(f"{where}: a median of {median:.0f} characters of text a slide (at most {MEDIAN_TEXT})")
    for i, s in enumerate(stats, 1):
        if s.text > MAX_TEXT:
            problems.append(f"{where}: slide {i} shows {s.text} characters of text (at most {MAX_TEXT})")
        if s.prose > MAX_PROSE:
            problems.append(f"{where}: slide {i} shows {s.prose} characters of prose (at most {MAX_PROSE})")
    shown = sum(s.figures for s in stats)
    if shown < figures:
        problems.append(f"{where}: {shown} figures on its slides, {figures} in the notebook")
    if lost:
        problems.append(f"{where}: {len(lost)} words of the notebook neither on a slide nor in the notes: "
                        f"{', '.join(lost[:10])}")
    return problems


def problems_of(nb, deck_html: str, where: str) -> list[str]:
    """`deck_problems` of the deck `deck_html` rendered from the executed notebook `nb`: what both builds
    refuse and tests/test_slides.py checks."""
    return deck_problems(deck_stats(deck_html), notebook_figures(nb), where, lost_words(nb, deck_html))


# --- rendering ------------------------------------------------------------------------------------------

def exporter(reveal_url_prefix: str = "../assets/reveal.js"):
    """nbconvert's slides exporter with the course's template; `reveal_url_prefix` is where reveal.js is,
    relative to the deck (the site puts decks in slides/ and reveal.js in assets/reveal.js)."""
    from nbconvert import SlidesExporter
    return SlidesExporter(template_name="course_slides", extra_template_basedirs=[str(TEMPLATES)],
                          extra_template_paths=[str(TEMPLATES / "shared")], reveal_url_prefix=reveal_url_prefix,
                          reveal_theme="white", reveal_transition="none", reveal_width="960", reveal_height="700",
                          exclude_input_prompt=True, exclude_output_prompt=True)   # no "In [3]:" on a slide


def render_deck(nb, title: str, rel: str, site_pages: dict[str, str], root: Path, exp=None,
                page: str | None = None) -> str:
    """The HTML of the deck of the executed notebook `nb` (repository path `rel`), titled `title`: `nb` is
    shown as the site shows it (widget stand-ins, math fixed) and is not changed. Its links are rewritten as
    the site's pages' are (`site_pages`: repository path -> site path); `page` is the site path of the
    module's page, linked from every slide (None: no link). `problems_of` judges the result (both builds refuse a
    deck with a problem; tests/test_slides.py holds the course's decks to it)."""
    exp = exp or exporter()
    deck = slide_deck_notebook(nb, rel)
    deck.metadata["title"] = title
    out = deck_path(rel)
    base = "../" * out.count("/")
    resources = {"deck": {"base": base, "page": site_plan.relative_link(page, out) if page else None,
                          "page_title": title}}
    body, _ = exp.from_notebook_node(deck, resources=resources)
    return site_plan.rewrite_links(body, site_plan.Page(rel, out, "slides", title), site_pages, root)


# --- the decks alone (`make slides`) ----------------------------------------------------------------------

def _index(course_title: str, decks: list[tuple[str, str]]) -> str:
    items = "".join(f'<li><a href="{html.escape(href)}">{html.escape(title)}</a></li>\n' for href, title in decks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><link rel="icon" href="data:,">'
            f'<title>{html.escape(course_title)}: slides</title>'
            f'<link rel="stylesheet" href="assets/site.css"></head>\n<body>\n<main class="course-slides-index">'
            f"<h1>{html.escape(course_title)}: slides</h1>\n<p>One reveal.js deck per module, from its executed "
            f"notebook (arrows or space to move, S for speaker notes, F for full screen).</p>\n<ol>\n{items}</ol>"
            f"\n</main>\n</body>\n</html>\n")


def build(out: Path, root: Path = ROOT, log=print, modules: tuple[str, ...] = ()) -> list[str]:
    """Build every module's deck (or those whose numbers are in `modules`) into `out` as a small site:
    out/index.html, out/slides/, out/assets/ (reveal.js, MathJax). All or nothing, as the site's build.
    Links to other notebooks go to GitHub (the site's pages are not there). Returns the decks' paths."""
    start = time.perf_counter()
    out = Path(out)
    site = site_plan.plan(root)
    pages = [p for p in site.pages if p.kind == "notebook" and (not modules or p.module in modules)]
    if modules and {p.module for p in pages} != set(modules):
        raise SlidesError(f"modules {', '.join(modules)}: expected module numbers among "
                          f"{', '.join(m.number for m in site.modules if m.notebook)}")
    site_plan.check_out(out)
    staging = site_plan.staging_dir(out)
    exp, decks, problems = exporter(), [], []
    try:
        site_plan.copy_assets(staging)   # MathJax, reveal.js, the site's CSS
        for page in pages:
            t0 = time.perf_counter()
            nb, origin = site_plan.executed_notebook(root / page.src, root)
            site_plan.replace_widgets(nb, colab_url(page.src))
            site_plan.fix_math(nb)
            dest = staging / deck_path(page.src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            deck = render_deck(nb, page.title, page.src, {}, root, exp)
            dest.write_text(deck, encoding="utf-8")
            problems += problems_of(nb, deck, page.src)
            decks.append((deck_path(page.src), page.title))
            log(f"{time.perf_counter() - t0:6.1f} s  {deck_path(page.src)}  ({origin})")
        if problems:
            raise SlidesError("decks an instructor would not present (tools/slides.py states the limits):\n  "
                              + "\n  ".join(problems))
        (staging / "index.html").write_text(_index(site.course_title, decks), encoding="utf-8")
        site_plan.swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"built {len(decks)} slide decks into {out} in {time.perf_counter() - start:.1f} s "
        f"(open {out / 'index.html'})")
    return [d for d, _ in decks]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/slides.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the slide decks")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "slides", help="output folder (default build/slides)")
    b.add_argument("modules", nargs="*", help="module numbers (00 .. 12); default: every module")
    args = parser.parse_args(argv)
    for key, value in (("COURSE_QUICK", "1"), ("COURSE_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)   # a notebook without a current executed copy runs as the tests run it
    try:
        build(args.out, modules=tuple(args.modules))
    except (site_plan.SiteError, nbexec.NotebookFailed) as e:
        print(f"slides build failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
