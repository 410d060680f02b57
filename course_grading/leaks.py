"""Find the instructor's hidden-test and solution text in anything the grader gives back.

Hidden tests run inside the student's own kernel, so whatever the isolation, a kernel can see them as
they run (an IPython ``post_run_cell`` callback, ``In``, a frame's constants, an audit hook) and print
them, encoded if it likes, into its outputs. The grader therefore never trusts an output: every text it
hands back passes through a `Scanner`, and an output carrying such text is withheld (`feedback.py`).

    secrets = LabSecrets(source_nb, release_nb)      # once per lab: the instructor's source and release
    scan = secrets.scanner(submission_nb)            # what this student may see: release + own submission
    scan.find(text)            -> [Hit]              # the text, or an encoding of it, carries secret text
    scan.find_in_parts(texts)  -> {index: [Hit]}     # the same over a sequence (a secret split across parts)
    scan.scrub(text, note)     -> (text, hits)       # lines that carry secret text replaced by `note`

What is secret: every line of a ``BEGIN HIDDEN TESTS`` / ``BEGIN SOLUTION`` / ``BEGIN MARK SCHEME``
region (markers included) and every line of an answer cell without markers (nbgrader replaces it
whole) -- minus what the student may see anyway: the text of the release, the student's own
submission (a student who wrote a line knows it), nbgrader's stubs, and the literals of the hidden
tests (assertion messages and expected values are written to be shown when a test fails).

How a text is matched (`normalize`): Unicode NFKC, zero-width and other format characters removed,
all whitespace removed, case folded; a hit is a run of `WINDOW` characters of one secret line (or a
whole secret line of at least `MIN_LINE` characters) that is not in the public text. The scanner also
reads the text reversed and Caesar-shifted (rot13 and every other shift), HTML (tags removed, entities
decoded, attribute values kept), URL-quoted, with backslash escapes (``\\x61``, ``\\u0061``, JSON's),
as base64 / base64url / base32 / hex runs (then zlib, gzip, bz2, lzma), as lists of character codes,
and PNG text chunks, recursively to depth 2 (base64 of reversed text is found). Parts are also
matched joined, so a line printed in pieces across outputs is found.

What no scanner catches: text encrypted with a key of the student's own, or drawn as pixels or as
ASCII art. That is why the feedback carries no images and `course grade --feedback-outputs none`
carries no kernel output at all.
"""
from __future__ import annotations

import ast
import base64
import binascii
import bz2
import gzip
import html
import lzma
import re
import struct
import textwrap
import unicodedata
import urllib.parse
import zlib
from dataclasses import dataclass

WINDOW = 24          # characters (normalized) of a secret line that make a hit
MIN_LINE = 12        # shorter secret lines are too common to be evidence (``pass``, ``return x``)
KEY = 12             # index prefix length (<= MIN_LINE)
MAX_SCAN = 4_000_000  # characters of one text scanned (the feedback truncates far below this)
MAX_DEPTH = 2

REGIONS = (("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "hidden test"),
           ("BEGIN SOLUTION", "END SOLUTION", "solution"),
           ("BEGIN MARK SCHEME", "END MARK SCHEME", "mark scheme"))
STUBS = ("# YOUR CODE HERE", "raise NotImplementedError()", "YOUR ANSWER HERE")

_WS_RE = re.compile(r"\s+")
_B64_RE = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_B32_RE = re.compile(r"[A-Z2-7]{16,}=*")
_HEX_RE = re.compile(r"[0-9a-fA-F]{16,}")
_CODES_RE = re.compile(r"(?:\b\d{1,7}\b[\s,;:]+){11,}\b\d{1,7}\b")
_TAG_RE = re.compile(r"<[^>]*>")
_ATTR_RE = re.compile(r"""=\s*("[^"]*"|'[^']*')""")


def normalize(text: str) -> str:
    """NFKC, no format characters (zero-width joiners ...), no whitespace, case folded."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf") if not text.isascii() else text
    return _WS_RE.sub("", text).casefold()


@dataclass(frozen=True)
class Hit:
    kind: str        # "hidden test" | "solution" | "mark scheme"
    where: str       # the grade_id of the instructor's cell the text comes from (or "cell N")
    encoding: str    # "plain", "reversed", "rot13", "base64", ...

    def __str__(self):
        how = "" if self.encoding == "plain" else f", {self.encoding}"
        return f"{self.kind} text of {self.where}{how}"


# ---------------------------------------------------------------------------------------------------
# what is secret, what is public

def _cell_label(cell, k: int) -> str:
    m = cell.get("metadata", {}).get("nbgrader") if isinstance(cell, dict) else None
    return m["grade_id"] if isinstance(m, dict) and m.get("grade_id") else f"cell {k}"


def _secret_lines(source_nb) -> list[tuple[str, str, str]]:
    """(line, kind, where) for every secret line of a source lab."""
    out = []
    for k, c in enumerate(source_nb.cells):
        where = _cell_label(c, k)
        m = c.get("metadata", {}).get("nbgrader") or {}
        found_solution, kind = False, None
        for line in str(c.get("source", "")).split("\n"):
            if kind is None:
                for begin, _end, name in REGIONS:
                    if begin in line:
                        kind = name
                        found_solution |= name == "solution"
                        break
                if kind is not None:
                    out.append((line, kind, where))
                continue
            out.append((line, kind, where))
            if any(end in line for _b, end, name in REGIONS if name == kind):
                kind = None
        if isinstance(m, dict) and m.get("solution") and not found_solution:
            out += [(line, "solution", where) for line in str(c.get("source", "")).split("\n")]
    return out


def hidden_literals(source_nb) -> list[str]:
    """The literals of the hidden tests: string constants (and the constant parts of f-strings), and the
    source text of numbers and of lists/tuples of them. A failing test shows them by design (its message,
    its expected values), so they are not evidence of a leak."""
    out = []
    for c in source_nb.cells:
        for block in _hidden_blocks(str(c.get("source", ""))):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append(node.value)
                elif isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.UnaryOp)) and _is_literal(node):
                    seg = ast.get_source_segment(block, node)
                    if seg:
                        out.append(seg)
    return out


def _is_literal(node) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex, str, bytes, bool)) or node.value is None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_is_literal(e) for e in node.elts)
    return False


def _hidden_blocks(source: str) -> list[str]:
    blocks, cur, inside = [], [], False
    for line in source.split("\n"):
        if "BEGIN HIDDEN TESTS" in line:
            inside, cur = True, []
        elif "END HIDDEN TESTS" in line and inside:
            inside = False
            blocks.append(textwrap.dedent("\n".join(cur)))
        elif inside:
            cur.append(line)
    return blocks


def notebook_sources(nb) -> list[str]:
    """Every cell source of a notebook (a dict or NotebookNode; list-of-lines sources joined)."""
    out = []
    for c in (nb.get("cells") or []) if isinstance(nb, dict) else []:
        if isinstance(c, dict):
            src = c.get("source", "")
            out.append("".join(src) if isinstance(src, list) else str(src))
    return out


def html_text(raw: str) -> str:
    """An HTML text as the scanner reads it: tags removed, entities decoded, attribute values kept."""
    attrs = " ".join(m.group(1)[1:-1] for m in _ATTR_RE.finditer(raw))
    return html.unescape(_TAG_RE.sub("", raw)) + " " + html.unescape(attrs)


def shown_texts(nb) -> list[str]:
    """What a notebook shows a reader: every cell source, and each markdown cell as the feedback page
    renders it, read back as `html_text` (the page drops Markdown's markup: "raise `X(1)`" becomes
    "raise X(1)", which is no more secret than the markdown it came from)."""
    out = notebook_sources(nb)
    try:
        from nbconvert.filters.markdown_mistune import markdown2html_mistune
    except ImportError:  # no renderer, no rendered forms: the plain sources still count
        return out
    for c in (nb.get("cells") or []) if isinstance(nb, dict) else []:
        if isinstance(c, dict) and c.get("cell_type") == "markdown":
            src = c.get("source", "")
            src = "".join(src) if isinstance(src, list) else str(src)
            if src.strip():
                try:
                    out.append(html_text(markdown2html_mistune(src)))
                except Exception:  # noqa: BLE001 - a cell the renderer cannot read shows as its source
                    continue
    return out


class LabSecrets:
    """The secret windows of one lab (its source), less what its release and literals show anyway."""

    def __init__(self, source_nb, release_nb, extra_public: list[str] = ()):
        public = "\0".join(normalize(t) for t in [*shown_texts(release_nb), *hidden_literals(source_nb),
                                                   *STUBS, *extra_public])
        windows: dict[str, tuple[str, str]] = {}
        for line, kind, where in _secret_lines(source_nb):
            n = normalize(line)
            if len(n) < MIN_LINE:
                continue
            pieces = [n] if len(n) <= WINDOW else [n[i:i + WINDOW] for i in range(len(n) - WINDOW + 1)]
            for w in pieces:
                if w not in windows and w not in public:
                    windows[w] = (kind, where)
        self.windows = windows
        self.kinds = sorted({k for k, _ in windows.values()})
        self.index = build_index(windows)  # once per lab; each student's scanner shares it

    def scanner(self, *public_nbs, public_texts: list[str] = ()) -> "Scanner":
        """A scanner for one student: `public_nbs` (the student's submission) and `public_texts` are
        text the student has anyway, so they are not secret for that student."""
        texts = [t for nb in public_nbs for t in shown_texts(nb)] + list(public_texts)
        blob = "\0".join(normalize(t) for t in texts)
        public = frozenset(w for w in self.windows if w in blob) if blob else frozenset()
        return Scanner(self.index, public)


_ABC = "abcdefghijklmnopqrstuvwxyz"
_ROT = [None] + [str.maketrans(_ABC, _ABC[n:] + _ABC[:n]) for n in range(1, 26)]


def build_index(windows: dict[str, tuple[str, str]]) -> dict[str, list[tuple[str, str, Hit]]]:
    """prefix -> [(variant, window, hit)] for every window and its variants: as is, reversed, and
    Caesar-shifted by 1 to 25 letters (rot13 among them)."""
    index: dict[str, list] = {}
    hits: dict[tuple, Hit] = {}
    names = ["plain", "reversed"] + ["rot13" if n == 13 else f"rot{n}" for n in range(1, 26)]
    for w, (kind, where) in windows.items():
        variants = [w, w[::-1]] + [w.translate(_ROT[n]) for n in range(1, 26)]
        for name, v in zip(names, variants):
            h = hits.get((kind, where, name))
            if h is None:
                h = hits[(kind, where, name)] = Hit(kind, where, name)
            index.setdefault(v[:KEY], []).append((v, w, h))
    return index


# ---------------------------------------------------------------------------------------------------
# matching

class Scanner:
    """Matches normalized text against secret windows (`build_index`), less the `public` ones, in every
    encoding listed in the module docstring."""

    def __init__(self, index: dict, public: frozenset = frozenset()):
        self.index, self.public = index, public

    @classmethod
    def of(cls, *scanners: "Scanner") -> "Scanner":
        """One scanner for several labs (the files that name every student: grades.csv, report.json)."""
        if len(scanners) == 1:
            return scanners[0]
        index: dict[str, list] = {}
        for sc in scanners:
            for k, lst in sc.index.items():
                index.setdefault(k, []).extend(x for x in lst if x[1] not in sc.public)
        return cls(index)

    def __bool__(self):
        return bool(self.index)

    # the core: spans of secret windows in a normalized text
    def _spans(self, norm: str) -> list[tuple[int, int, Hit]]:
        out, index, public = [], self.index, self.public
        if not index:
            return out
        get = index.get
        for p in range(len(norm) - KEY + 1):
            cands = get(norm[p:p + KEY])
            if cands:
                for full, base, hit in cands:
                    if norm.startswith(full, p) and base not in public:
                        out.append((p, p + len(full), hit))
        return out

    def _decoded(self, raw: str, depth: int) -> list[tuple[int, int, str, str]]:
        """(start, end, decoded text, how) of every decodable piece of `raw` (spans in `raw`)."""
        out = []
        if "<" in raw or "&" in raw:
            out.append((0, len(raw), html_text(raw), "html"))
        if "%" in raw:
            out.append((0, len(raw), urllib.parse.unquote(raw), "url-quoted"))
        if "\\" in raw:
            try:
                out.append((0, len(raw), raw.encode("latin-1", "backslashreplace").decode("unicode_escape"),
                            "escaped"))
            except (UnicodeDecodeError, ValueError):
                pass
        dense = _WS_RE.sub("", raw)  # base64 wrapped over lines, or printed in pieces
        spans = _dense_spans(raw)
        seen = set()
        for rx, dec, how in ((_B64_RE, _b64, "base64"), (_B32_RE, _b32, "base32"), (_HEX_RE, _hex, "hex")):
            runs = [(m.start(), m.end(), m.group(0)) for m in rx.finditer(raw)]  # runs as printed
            runs += [(spans(m.start()), spans(m.end() - 1) + 1, m.group(0)) for m in rx.finditer(dense)]
            for s, e, run in runs:
                if (how, run) in seen:
                    continue
                seen.add((how, run))
                for data in dec(run):
                    for blob, how2 in _unpacked(data, how):
                        out.append((s, e, blob, how2))
        for m in _CODES_RE.finditer(raw):
            codes = [int(x) for x in re.findall(r"\d+", m.group(0))]
            if all(0 < c < 0x110000 for c in codes):
                out.append((m.start(), m.end(), "".join(map(chr, codes)), "character codes"))
        return out

    def _find(self, raw: str, depth: int, how: str) -> list[tuple[int, int, Hit]]:
        raw = raw[:MAX_SCAN]
        norm_spans = self._spans(normalize(raw))
        hits = [(0, len(raw), _with(h, how)) for _, _, h in norm_spans[:1]]
        if hits or depth >= MAX_DEPTH:
            return hits
        for s, e, text, how2 in self._decoded(raw, depth):
            sub = self._find(text, depth + 1, how2 if how == "plain" else f"{how2} of {how}")
            if sub:
                return [(s, e, sub[0][2])]
        return []

    def find(self, text: str) -> list[Hit]:
        """The hits in `text` (at most one per encoding layer: one is enough to withhold it)."""
        if not self.index or not text:
            return []
        return [h for _, _, h in self._find(text, 0, "plain")]

    def find_in_parts(self, parts: list[str]) -> dict[int, list[Hit]]:
        """Hits per part, including secrets split across consecutive parts (each part a span of the
        joined text is marked)."""
        out: dict[int, list[Hit]] = {}
        if not self.index:
            return out
        for i, t in enumerate(parts):
            h = self.find(t)
            if h:
                out[i] = h
        # joined: normalized concatenation (pieces printed one after another), and dense raw text for
        # encodings split across parts
        norms = [normalize(t[:MAX_SCAN]) for t in parts]
        starts, pos = [], 0
        for n in norms:
            starts.append(pos)
            pos += len(n)
        joined = "".join(norms)
        for s, e, hit in self._spans(joined):
            for i in _covering(starts, [len(n) for n in norms], s, e):
                out.setdefault(i, []).append(_with(hit, "split across outputs"))
        raws = [t[:MAX_SCAN] for t in parts]
        rstarts, pos = [], 0
        for t in raws:
            rstarts.append(pos)
            pos += len(t)
        joined_raw = "".join(raws)
        if len(parts) > 1:
            for s, e, text, how in self._decoded(joined_raw, 0):
                sub = self._find(text, 1, how)
                if not sub:
                    continue
                idx = [i for i in _covering(rstarts, [len(t) for t in raws], s, e)
                       if not (s == 0 and e == len(joined_raw)) or _changes(raws[i], how)]
                for i in self._narrowed(raws, idx):
                    out.setdefault(i, []).append(_with(sub[0][2], "split across outputs"))
        return out

    def _narrowed(self, raws: list[str], idx: list[int]) -> list[int]:
        """The parts of `idx` that add to the hit: an end part is dropped while the joined rest shows as
        much secret text (an encoded run glued to a neighbour's text does not mark the neighbour; a
        part holding a piece of the secret stays marked)."""
        if len(idx) <= 1:
            return idx
        lo, hi = 0, len(idx)

        def score(a, b):
            return self._score("".join(raws[i] for i in idx[a:b]), 0)

        full = score(lo, hi)
        while hi - lo > 1 and score(lo + 1, hi) >= full:
            lo += 1
        while hi - lo > 1 and score(lo, hi - 1) >= full:
            hi -= 1
        return idx[lo:hi]

    def _score(self, raw: str, depth: int) -> int:
        """How many secret windows the best reading of `raw` shows."""
        best = len(self._spans(normalize(raw[:MAX_SCAN])))
        if depth < MAX_DEPTH:
            for _s, _e, text, _how in self._decoded(raw[:MAX_SCAN], depth):
                best = max(best, self._score(text, depth + 1))
        return best

    def scrub(self, text: str, note: str) -> tuple[str, list[Hit]]:
        """`text` with every line that carries secret text (alone or with its neighbours) replaced by
        `note`; and the hits."""
        lines = text.split("\n")
        marked = self.find_in_parts(lines)
        if not marked:
            return text, []
        hits = [h for hs in marked.values() for h in hs]
        return "\n".join(note if i in marked else ln for i, ln in enumerate(lines)), hits


def _with(hit: Hit, how: str) -> Hit:
    if how == "plain":
        return hit
    enc = how if hit.encoding == "plain" else f"{hit.encoding}, {how}"
    return Hit(hit.kind, hit.where, enc)


def _covering(starts: list[int], lengths: list[int], s: int, e: int) -> list[int]:
    return [i for i, (a, n) in enumerate(zip(starts, lengths)) if n and a < e and a + n > s]


def _changes(raw: str, how: str) -> bool:
    """Does a whole-text decoding (html, url, escapes) touch this part? (Only those parts are marked.)"""
    return {"html": "<" in raw or "&" in raw, "url-quoted": "%" in raw, "escaped": "\\" in raw}.get(how, True)


def _dense_spans(raw: str):
    """Map an index of the whitespace-free text back to an index of `raw`."""
    idx = [i for i, ch in enumerate(raw) if not ch.isspace()]
    return lambda k: idx[min(k, len(idx) - 1)] if idx else 0


def _b64(s: str) -> list[bytes]:
    """A base64 (or base64url) run decoded at each of the 4 alignments (it may be glued to other text)."""
    s = s.rstrip("=").replace("-", "+").replace("_", "/")
    out = []
    for start in range(4):
        u = s[start:]
        u = u[: len(u) - len(u) % 4]
        try:
            out.append(base64.b64decode(u, validate=True))
        except (binascii.Error, ValueError):
            continue
    return out


def _b32(s: str) -> list[bytes]:
    s = s.rstrip("=")
    out = []
    for start in range(8):
        u = s[start:]
        u = u[: len(u) - len(u) % 8]
        try:
            out.append(base64.b32decode(u))
        except (binascii.Error, ValueError):
            continue
    return out


def _hex(s: str) -> list[bytes]:
    return [bytes.fromhex(s[k: len(s) - (len(s) - k) % 2]) for k in (0, 1)]


_MAGIC = ((b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda"), (b"\x1f\x8b",), (b"BZh",),
          (b"\xfd7zXZ\x00",), (b"\x89PNG\r\n\x1a\n",))


def _unpacked(data: bytes, how: str) -> list[tuple[str, str]]:
    """Text views of decoded bytes: as UTF-8, decompressed (zlib, gzip, bz2, lzma, wherever their header
    sits: the run may have started with other text), and a PNG's text chunks."""
    out = [(data.decode("utf-8", errors="ignore"), how)]
    names = ("zlib", "gzip", "bz2", "lzma", "PNG text")
    for name, magics in zip(names, _MAGIC):
        starts = sorted({i for m in magics for i in _find_all(data, m)})[:8]
        for k in starts:
            try:
                if name == "PNG text":
                    out += [(t, f"PNG text in {how}") for t in png_texts(data[k:])]
                    continue
                if name == "zlib":
                    blob = zlib.decompressobj().decompress(data[k:], MAX_SCAN)
                else:
                    blob = {"gzip": gzip.decompress, "bz2": bz2.decompress, "lzma": lzma.decompress}[name](data[k:])
                out.append((blob[:MAX_SCAN].decode("utf-8", errors="ignore"), f"{name} in {how}"))
            except Exception:  # noqa: BLE001 - not that format after all
                continue
    return out


def _find_all(data: bytes, magic: bytes) -> list[int]:
    out, k = [], data.find(magic)
    while k >= 0 and len(out) < 8:
        out.append(k)
        k = data.find(magic, k + 1)
    return out


def png_texts(data: bytes) -> list[str]:
    """The tEXt, zTXt and iTXt chunks of a PNG, as text."""
    out, pos = [], 8
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        try:
            if kind == b"tEXt":
                out.append(body.decode("latin-1"))
            elif kind == b"zTXt":
                key, _, rest = body.partition(b"\0")
                out.append(key.decode("latin-1") + " " + zlib.decompress(rest[1:]).decode("latin-1"))
            elif kind == b"iTXt":
                key, _, rest = body.partition(b"\0")
                flag, rest = rest[0], rest[2:]
                _lang, _, rest = rest.partition(b"\0")
                _tkey, _, text = rest.partition(b"\0")
                out.append(key.decode("latin-1") + " " + (zlib.decompress(text) if flag else text).decode(
                    "utf-8", errors="ignore"))
        except (zlib.error, IndexError, UnicodeDecodeError):
            continue
        if kind == b"IEND":
            break
    return out


def string_leaves(obj) -> list[str]:
    """Every string inside a JSON-like value (keys too), in order."""
    out = []
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.append(str(k))
            out += string_leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out += string_leaves(v)
    elif obj is not None and not isinstance(obj, (int, float, bool)):
        out.append(str(obj))
    return out

