"""The course's glossary (glossary.yaml at the repository root) and its links from a notebook's first use of a term.

    ttft:                                   # the anchor on the glossary page
      term: TTFT (time to first token)      # the entry's title
      match: [TTFT, time to first token]    # the forms linked in notebooks (a plural s/es is matched too)
      module: "00"                          # the module that introduces it
      definition: >-                        # 1-3 sentences of markdown, in the course's words
        ...
      see: [tpot, prefill]                  # optional: related entries

A form matches with its first letter in either case and the rest exactly as written ("KV cache" and "Prefill"
match, "kv cache" does not), as a whole word. tools/site.py links the first use of each entry on each
notebook page: in prose only, never inside code, math, headings, links, HTML tags or URLs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools.references import GLOSSARY, ReferenceError, read_yaml

ID_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
FIELDS = {"term", "match", "module", "definition", "see"}


@dataclass(frozen=True)
class Entry:
    id: str
    term: str
    match: tuple[str, ...]
    module: str
    definition: str
    see: tuple[str, ...] = ()


def validate(data, where: str = "glossary.yaml") -> list[str]:
    if not isinstance(data, dict):
        return [f"{where}: expected a mapping of anchors to entries, got {type(data).__name__}"]
    problems, forms = [], {}
    for key, e in data.items():
        here = f"{where}: {key}"
        if not (isinstance(key, str) and ID_RE.fullmatch(key)):
            problems.append(f"{here}: an anchor is lowercase letters and digits joined by hyphens (kv-cache)")
        if not isinstance(e, dict):
            problems.append(f"{here}: expected a mapping with term, match, module, definition")
            continue
        for f in ("term", "match", "module", "definition"):
            if not e.get(f):
                problems.append(f"{here}: missing {f}")
        if set(e) - FIELDS:
            problems.append(f"{here}: unknown field(s) {', '.join(sorted(map(str, set(e) - FIELDS)))} "
                            f"(expected {', '.join(sorted(FIELDS))})")
        if e.get("module") is not None and not (isinstance(e["module"], str) and re.fullmatch(r"\d\d", e["module"])):
            problems.append(f"{here}: module must be a quoted two-digit module number (\"05\"), got {e['module']!r}")
        match = e.get("match") or []
        if not (isinstance(match, list) and all(isinstance(m, str) and m.strip() for m in match)):
            problems.append(f"{here}: match must be a list of the forms to link, got {match!r}")
            continue
        for m in match:
            norm = _norm(m)
            if norm in forms:
                problems.append(f"{here}: the form {m!r} is also {forms[norm]}'s: a form links to one entry")
            forms.setdefault(norm, key)
    for key, e in data.items():
        for other in (e.get("see") or []) if isinstance(e, dict) else []:
            if other not in data:
                problems.append(f"{where}: {key}: see: {other!r} is not an entry")
    return problems


def load(path: Path = GLOSSARY) -> dict[str, Entry]:
    """The glossary at `path`, validated (ReferenceError naming every problem); {} if there is none."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = read_yaml(path) or {}
    problems = validate(data, path.name)
    if problems:
        raise ReferenceError("\n".join(problems))
    return {k: Entry(k, e["term"], tuple(e["match"]), e["module"], e["definition"].strip(), tuple(e.get("see") or ()))
            for k, e in data.items()}


def _norm(form: str) -> str:
    form = " ".join(form.split())
    return form[:1].lower() + form[1:]


# what is never linked: code, math, headings, links and images, HTML blocks (markdown is not read inside
# them) and tags (with the text of <a>, <code>, <pre>), reference definitions, URLs
_PROTECTED = re.compile(
    r"^[ \t]*(?P<fence>```+|~~~+).*?^[ \t]*(?P=fence)[ \t]*$"
    r"|(?P<ticks>`+).+?(?P=ticks)"
    r"|\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<![\\$])\$(?!\$).+?(?<!\\)\$"
    r"|^[ \t]{0,3}#{1,6}(?:[ \t][^\n]*)?$"
    r"|^[ \t]{0,3}\[[^\]\n]+\]:[^\n]*$"
    r"|!?\[(?:[^\[\]]|\[[^\]]*\])*\]\([^()\s]*(?:\s+\"(?:[^\"\\]|\\.)*\")?\s*\)"
    r"|!?\[(?:[^\[\]]|\[[^\]]*\])*\]\[[^\]]*\]"
    r"|^[ \t]{0,3}<[A-Za-z/!][^\n]*(?:\n(?![ \t]*\n)[^\n]*)*"     # an HTML block: raw to a blank line
    r"|<(?P<tag>a|code|pre|script|style)\b.*?</(?P=tag)\s*>"
    r"|<[^<>\n]+>"
    r"|https?://\S+",
    re.S | re.M | re.I)


def _gaps(text: str):
    i = 0
    for m in _PROTECTED.finditer(text):
        yield i, m.start()
        i = m.end()
    yield i, len(text)


class Linker:
    """Links the first use of each entry on one page: `link(markdown)` cell by cell, in page order."""

    def __init__(self, entries: dict[str, Entry], href):
        self.href, self.linked = href, []
        self._by_form = {_norm(f): e.id for e in entries.values() for f in e.match}
        forms = sorted({f for e in entries.values() for f in e.match}, key=len, reverse=True)
        alts = []
        for f in forms:
            words = [re.escape(w) for w in f.split()]
            first = words[0]
            if f[0].isalpha():
                first = f"[{f[0].lower()}{f[0].upper()}]" + re.escape(f.split()[0][1:])
            alts.append(r"\s+".join([first, *words[1:]]))
        self._re = re.compile(r"(?<![\w-])(?:" + "|".join(alts) + r")(?:e?s)?(?![\w-])") if alts else None

    def _entry(self, text: str) -> str | None:
        norm = _norm(text)
        for cut in (norm, norm[:-1] if norm.endswith("s") else None, norm[:-2] if norm.endswith("es") else None):
            if cut and cut in self._by_form:
                return self._by_form[cut]
        return None

    def link(self, markdown: str) -> str:
        if self._re is None:
            return markdown
        out, i = [], 0
        for a, b in _gaps(markdown):
            for m in self._re.finditer(markdown, a, b):
                entry = self._entry(m.group(0))
                if entry is None or entry in self.linked:
                    continue
                self.linked.append(entry)
                out += [markdown[i:m.start()], f"[{m.group(0)}]({self.href(entry)})"]
                i = m.end()
        return "".join(out) + markdown[i:]
