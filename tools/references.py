"""The course's bibliography (references.yaml) and glossary (glossary.yaml), and citations in notebook markdown.

A citation in a notebook's or lab's markdown is `[@key]`, several `[@key1; @key2]`, each optionally with a
locator: `[@dao2022flashattention, Algorithm 1]`; key is an entry of references.yaml at the repository root:

    dao2022flashattention:
      authors: [Tri Dao, Daniel Y. Fu, Stefano Ermon, Atri Rudra, Christopher Ré]
      title: "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"
      venue: NeurIPS
      year: 2022
      arxiv: "2205.14135"          # and/or doi: "10.…", or url: (specifications, documentation)
      uses: "Tiling with online softmax; the IO-complexity analysis and tile sizes of Module 07."

How a citation reads:
- in the source (.py) and in a text editor: `[@key]`, as written;
- in the notebook (.ipynb, built by tools/nb.py): `([Dao et al., 2022](https://arxiv.org/abs/2205.14135 "…"))`,
  the author and year, linked to the paper itself (one click to the source, in JupyterLab, Colab or on
  GitHub alike), with the title and venue as the link's tooltip; the notebook's "Further reading" lists it;
- on the site (tools/site.py): the same text, linked to the entry on the bibliography page.
`unrender` inverts the notebook's form exactly (tools/nb.py's source_text needs it).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "references.yaml"
GLOSSARY = ROOT / "glossary.yaml"

REQUIRED = ("authors", "title", "venue", "year", "uses")
IDENTIFIERS = ("arxiv", "doi", "url")
# arXiv's identifiers: YYMM.NNNN (April 2007 to 2014) or YYMM.NNNNN (from 2015), optionally a version
ARXIV_RE = re.compile(r"(?P<yy>\d\d)(?P<mm>\d\d)\.(?P<num>\d{4,5})(?:v\d+)?")
ARXIV_OLD_RE = re.compile(r"[a-z-]+(?:\.[A-Z]{2})?/\d{7}(?:v\d+)?")    # before April 2007: hep-th/9901001
DOI_RE = re.compile(r"10\.\d{4,9}/\S+")
KEY_RE = re.compile(r"[a-z][a-z0-9]*")
ET_AL = "et al."      # a long author list may end with it


class ReferenceError(ValueError):
    """references.yaml or glossary.yaml is not as the course needs it, or a citation names no entry; the
    message names the file, the key and what was expected."""


# --- YAML, refusing duplicate keys (PyYAML silently keeps the last one: a merge could lose an entry) --------

def _yaml():
    try:
        import yaml
    except ImportError as e:  # an error, not an exit: the caller says which file needed it
        raise ReferenceError(f"reading references.yaml and glossary.yaml needs PyYAML, a dev dependency "
                             f"(pip install -e '.[dev]'): {e}") from e
    return yaml


@functools.lru_cache(maxsize=1)
def _loader():
    yaml = _yaml()

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ReferenceError(f"line {key_node.start_mark.line + 1}: the key {key!r} appears twice "
                                         "(each entry once; two helpers may have added the same one)")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)
    return UniqueKeyLoader


def read_yaml(path: Path):
    path = Path(path)
    yaml = _yaml()
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_loader())
    except ReferenceError as e:
        raise ReferenceError(f"{path.name}: {e}") from None
    except yaml.YAMLError as e:
        raise ReferenceError(f"{path.name}: not valid YAML: {e}") from None


# --- the bibliography ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    key: str
    authors: tuple[str, ...]
    title: str
    venue: str
    year: int
    uses: str
    arxiv: str | None = None
    doi: str | None = None
    url: str | None = None

    @property
    def link(self) -> str:
        """Where the work is read: its arXiv page, else its DOI, else its URL."""
        if self.arxiv:
            return f"https://arxiv.org/abs/{self.arxiv}"
        if self.doi:
            return f"https://doi.org/{self.doi}"
        return self.url

    @property
    def links(self) -> list[tuple[str, str]]:
        """(label, URL) for every identifier it has."""
        out = []
        if self.arxiv:
            out.append((f"arXiv:{self.arxiv}", f"https://arxiv.org/abs/{self.arxiv}"))
        if self.doi:
            out.append((f"doi:{self.doi}", f"https://doi.org/{self.doi}"))
        if self.url:
            out.append(("web", self.url))
        return out

    @property
    def label(self) -> str:
        """Author and year, as a citation reads: "Shazeer, 2019", "Dao and Gu, 2024", "Kwon et al., 2023"."""
        names = [a.split()[-1] for a in self.authors[:2]]
        many = len(self.authors) > 2 or self.authors[-1] == ET_AL
        who = f"{names[0]} et al." if many else names[0] if len(self.authors) == 1 else f"{names[0]} and {names[1]}"
        return f"{who}, {self.year}"

    @property
    def tooltip(self) -> str:
        return f"{self.title}. {self.venue}, {self.year}."


def validate(data, where: str = "references.yaml") -> list[str]:
    """Every problem of the bibliography `data` (as read from YAML), one line each naming the key."""
    if not isinstance(data, dict):
        return [f"{where}: expected a mapping of keys to entries, got {type(data).__name__}"]
    problems = []
    links = {}
    for key, entry in data.items():
        here = f"{where}: {key}"
        if not (isinstance(key, str) and KEY_RE.fullmatch(key)):
            problems.append(f"{here}: a key is lowercase ASCII letters and digits (first author's family name, "
                            "year, first significant word of the title)")
        if not isinstance(entry, dict):
            problems.append(f"{here}: expected a mapping with {', '.join(REQUIRED)} and one of "
                            f"{', '.join(IDENTIFIERS)}")
            continue
        for f in REQUIRED:
            if f not in entry or entry[f] in (None, "", []):
                problems.append(f"{here}: missing {f}")
        unknown = set(entry) - set(REQUIRED) - set(IDENTIFIERS)
        if unknown:
            problems.append(f"{here}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                            f"(expected {', '.join(REQUIRED + IDENTIFIERS)})")
        if not any(entry.get(f) for f in IDENTIFIERS):
            problems.append(f"{here}: no identifier: give at least one of arxiv, doi, url")
        authors = entry.get("authors")
        if authors is not None and not (isinstance(authors, list) and authors
                                        and all(isinstance(a, str) and a.strip() for a in authors)):
            problems.append(f"{here}: authors must be a list of names, got {authors!r}")
        for f in ("title", "venue", "uses"):
            if f in entry and entry[f] is not None and not isinstance(entry[f], str):
                problems.append(f"{here}: {f} must be text, got {entry[f]!r}")
        year = entry.get("year")
        if year is not None and not (isinstance(year, int) and not isinstance(year, bool) and 1900 <= year <= 2100):
            problems.append(f"{here}: year must be a year such as 2023, got {year!r}")
        elif isinstance(year, int) and isinstance(key, str) and str(year) not in key:
            problems.append(f"{here}: the key does not hold the year {year} (key = family name + year + word)")
        arxiv = entry.get("arxiv")
        if arxiv is not None:
            if not isinstance(arxiv, str):
                problems.append(f"{here}: arxiv must be a quoted string (\"2309.06180\"): unquoted, YAML reads "
                                f"a number and drops trailing zeros; got {arxiv!r}")
            elif m := ARXIV_RE.fullmatch(arxiv):
                mm, num = int(m["mm"]), m["num"]
                yymm = int(m["yy"] + m["mm"])
                if not 1 <= mm <= 12 or yymm < 704 or (len(num) == 4) != (yymm < 1501):
                    problems.append(f"{here}: arxiv {arxiv!r} is not an arXiv identifier (YYMM.NNNN to 2014, "
                                    "YYMM.NNNNN from 2015)")
                elif isinstance(year, int) and 2000 + int(m["yy"]) > year:
                    problems.append(f"{here}: arxiv {arxiv!r} was posted in 20{m['yy']}, after the year {year}")
            elif not ARXIV_OLD_RE.fullmatch(arxiv):
                problems.append(f"{here}: arxiv {arxiv!r} is not an arXiv identifier such as \"2309.06180\" "
                                "(no prefix, no URL)")
        doi = entry.get("doi")
        if doi is not None and not (isinstance(doi, str) and DOI_RE.fullmatch(doi)):
            problems.append(f"{here}: doi {doi!r} is not a DOI such as \"10.1145/1498765.1498785\" (no URL)")
        url = entry.get("url")
        if url is not None and not (isinstance(url, str) and re.fullmatch(r"https?://\S+", url)):
            problems.append(f"{here}: url {url!r} is not an http(s) URL")
        for f in IDENTIFIERS:
            if isinstance(entry.get(f), str):
                if (f, entry[f]) in links:
                    problems.append(f"{here}: {f} {entry[f]} is also {links[f, entry[f]]}'s: one entry per work")
                links.setdefault((f, entry[f]), key)
    return problems


def references_from(data, where: str = "references.yaml") -> dict[str, Reference]:
    problems = validate(data, where)
    if problems:
        raise ReferenceError("\n".join(problems))
    return {key: Reference(key=key, authors=tuple(e["authors"]), title=e["title"].strip(), venue=e["venue"],
                           year=e["year"], uses=e["uses"].strip(),
                           **{f: e.get(f) for f in IDENTIFIERS}) for key, e in data.items()}


def load(path: Path = REFERENCES) -> dict[str, Reference]:
    """The bibliography at `path`, validated (ReferenceError naming every problem); {} if there is none."""
    path = Path(path)
    if not path.is_file():
        return {}
    return references_from(read_yaml(path) or {}, path.name)


# --- citations in markdown -------------------------------------------------------------------------------

# code is never a citation: fenced blocks, then code spans
_CODE = re.compile(r"^[ \t]*(?P<fence>```+|~~~+).*?^[ \t]*(?P=fence)[ \t]*$|(?P<ticks>`+).+?(?P=ticks)", re.S | re.M)
_CITATION = re.compile(r"\[(@[^\[\]]*)\]")
_ITEM = re.compile(r"\s*@(?P<key>[^\s,;\]]+)\s*(?:,\s*(?P<locator>[^;]*?))?\s*")


@dataclass(frozen=True)
class Citation:
    start: int
    end: int
    items: tuple[tuple[str, str | None], ...]    # (key, locator)

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self.items]


def _outside_code(text: str):
    """(start, end) of the stretches of `text` that are not code."""
    i = 0
    for m in _CODE.finditer(text):
        yield i, m.start()
        i = m.end()
    yield i, len(text)


def find_citations(markdown: str) -> list[Citation]:
    """The citations `[@key]`, `[@a; @b, locator]` of a markdown text, outside code. A bracket that opens with
    @ but does not read as a citation is refused (ReferenceError), so a typo never shows as literal text."""
    found = []
    for a, b in _outside_code(markdown):
        for m in _CITATION.finditer(markdown, a, b):
            items = []
            for part in m.group(1).split(";"):
                item = _ITEM.fullmatch(part)
                if item is None:
                    raise ReferenceError(f"{m.group(0)!r} is not a citation: write [@key], [@key1; @key2] or "
                                         "[@key, locator]")
                items.append((item["key"], item["locator"] or None))
            found.append(Citation(m.start(), m.end(), tuple(items)))
    return found


def cited_keys(markdown: str) -> list[str]:
    return [k for c in find_citations(markdown) for k in c.keys]


def _md_url(url: str) -> str:
    """A URL as a markdown link destination (parentheses and spaces would end it)."""
    return url.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _md_title(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _link_text(ref: Reference, locator: str | None) -> str:
    return ref.label + (f", {locator}" if locator else "")


def _rendered_link(ref: Reference, locator: str | None, url: str | None = None) -> str:
    return f"[{_link_text(ref, locator)}]({_md_url(url or ref.link)} {_md_title(ref.tooltip)})"


def _lookup(refs: dict, key: str) -> Reference:
    if key not in refs:
        raise ReferenceError(f"the citation key {key!r} is not in references.yaml (add the entry there, or fix "
                             "the key)")
    return refs[key]


def render(markdown: str, refs: dict[str, Reference], url=None) -> str:
    """`markdown` with each citation written as the notebook shows it: `([Kwon et al., 2023](link "title"))`,
    several in one pair of parentheses separated by "; ". `url(ref)` gives each link's target (default: the
    work itself). A key that is not in `refs` is a ReferenceError naming it."""
    out, i = [], 0
    for c in find_citations(markdown):
        links = [_rendered_link(_lookup(refs, k), loc, url(refs[k]) if url else None) for k, loc in c.items]
        out += [markdown[i:c.start], "(" + "; ".join(links) + ")"]
        i = c.end
    return "".join(out) + markdown[i:]


_LINK = r'\[(?P<text>[^\[\]]+)\]\((?P<url>[^\s()]+) (?P<title>"(?:[^"\\]|\\.)*")\)'
_LINK_NC = r'\[[^\[\]]+\]\([^\s()]+ "(?:[^"\\]|\\.)*"\)'    # the same, without groups
_RENDERED = re.compile(r"\((?P<links>" + _LINK_NC + r"(?:; " + _LINK_NC + r")*)\)")
_ONE = re.compile(_LINK)


def _rendered_citations(markdown: str, refs: dict[str, Reference]):
    """(start, end, items) of each citation `render` wrote (with any link target), outside code."""
    by_tooltip = {}
    for ref in refs.values():
        by_tooltip.setdefault(_md_title(ref.tooltip), []).append(ref)
    for a, b in _outside_code(markdown):
        for m in _RENDERED.finditer(markdown, a, b):
            items = []
            for link in _ONE.finditer(m.group("links")):
                text = link["text"]
                ref = next((r for r in by_tooltip.get(link["title"], [])
                            if text == r.label or text.startswith(r.label + ", ")), None)
                if ref is None:
                    break
                locator = text[len(ref.label) + 2:] if text != ref.label else None
                items.append((ref, locator, link["url"]))
            else:
                yield m.start(), m.end(), items


def unrender(markdown: str, refs: dict[str, Reference]) -> str:
    """The source of a markdown text `render` wrote: each rendered citation back to `[@key; ...]`."""
    out, i = [], 0
    for start, end, items in _rendered_citations(markdown, refs):
        if not all(u == _md_url(r.link) for r, _, u in items):
            continue
        body = "; ".join(f"@{r.key}" + (f", {loc}" if loc else "") for r, loc, _ in items)
        out += [markdown[i:start], f"[{body}]"]
        i = end
    return "".join(out) + markdown[i:]


def link_citations(markdown: str, refs: dict[str, Reference], href) -> tuple[str, list[str]]:
    """For the site: every citation, as the notebook renders it or still in its source form, rendered with its
    link pointing at `href(key)` (the bibliography entry); returns the text and the keys cited, in order."""
    keys = []

    def to_site(ref):
        keys.append(ref.key)
        return href(ref.key)
    out, i = [], 0
    for start, end, items in _rendered_citations(markdown, refs):
        out += [markdown[i:start], "(" + "; ".join(_rendered_link(r, loc, to_site(r)) for r, loc, _ in items) + ")"]
        i = end
    text = "".join(out) + markdown[i:]
    return render(text, refs, url=lambda r: to_site(r)), keys


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime_ns: int, size: int) -> dict[str, Reference]:
    return load(Path(path))


def current(path: Path = REFERENCES) -> dict[str, Reference]:
    """`load(path)`, read again only when the file changed."""
    path = Path(path)
    if not path.is_file():
        return {}
    st = path.stat()
    return _cached(str(path), st.st_mtime_ns, st.st_size)
