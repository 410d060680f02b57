"""Collect submissions: find each notebook's student and assignment from how students download files.

Accepted layouts (both may be mixed in one SUBMISSIONS folder):

1. One folder per student:  SUBMISSIONS/<student>/<any name with labNN>.ipynb
   The student id is the folder's name (an LMS folder such as ``Alice Smith_12345_assignsubmission_file_``
   gives ``Alice Smith (12345)``: the LMS's id stays in the key, so two students of one name stay two). Notebooks may
   sit deeper inside the student's folder.
2. Flat:  SUBMISSIONS/<file>.ipynb, with the student id in the file name:
     <student>_labNN.ipynb   <student>-labNN.ipynb   <student> - labNN.ipynb   <student> labNN.ipynb
     labNN_<student>.ipynb   labNN-<student>.ipynb   labNN - <student>.ipynb
     LMS exports:  <name>_<number>_<number>_<original file name>.ipynb       (Canvas)
                   <name>_LATE_<number>_<number>_<original file name>.ipynb  (Canvas, late; flagged)
                   <name>_<number>_assignsubmission_file_<original>.ipynb     (Moodle)
   where the student id is ``<name> (<first number>)``: the display name and the LMS's user id.

The assignment is the ``labNN`` token anywhere in the name, case-insensitive, with an optional
separator and leading zeros (``lab01``, ``Lab1``, ``lab_01``, ``LAB 01`` -> lab01). Copy decorations
added by browsers, Colab, Windows and macOS are ignored:
``Copy of lab01.ipynb``, ``lab01 (1).ipynb``, ``lab01(2).ipynb``, ``lab01 - Copy.ipynb``,
``lab01 - Copy (2).ipynb``, ``lab01 copy.ipynb``, ``lab01 copy 2.ipynb``, ``lab01-1.ipynb`` (Canvas
resubmission), ``lab01.ipynb.ipynb``.

With ``--assignment labNN`` every notebook without a lab token is taken as that assignment (a flat
file's whole cleaned name is then the student id); notebooks whose token names another lab are
skipped and listed. Without it, a notebook in a student folder with no lab token is identified by its
content (the release's grade_ids and locked cells) when exactly one lab matches.

Nothing is dropped silently: notebooks that cannot be attributed are returned in `Collection.unattributed`
(NOT GRADED), every other entry that is skipped in `Collection.ignored`, each with the reason. When a
student has several notebooks for one lab, the most recently modified one is graded, the others are
listed, and the submission is flagged for review.

Links are never followed: a symbolic link anywhere in the tree (to a file or a folder, inside or outside
SUBMISSIONS) is NOT GRADED with the reason, and neither it nor its target is opened (a link to another
student's notebook or to /etc/shadow is not read as root). Entries that are not regular files or folders
(FIFOs, sockets, devices) are listed and never opened. Hidden entries (a name starting with ".") are
listed too: a notebook inside a hidden folder is NOT GRADED (rename the folder to grade it); the
folders tools leave behind (``.ipynb_checkpoints``, ``__MACOSX``, ``__pycache__``) and macOS' ``._*``
and ``.DS_Store`` files are listed once, as skipped. A submission is read with `read_submission`
(``O_NOFOLLOW``, regular files only), never through a path that could have become a link.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

LAB_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])lab[ _-]?(\d{1,3})(?![0-9])", re.IGNORECASE)
# Copy decorations, applied repeatedly.
_COPY_PREFIX_RE = re.compile(r"^\s*copy\s+of\s+", re.IGNORECASE)
_COPY_SUFFIX_RES = [
    re.compile(r"\s*\(\d+\)\s*$"),                          # "x (1)", "x(2)"
    re.compile(r"\s+-\s+copy(\s*\(\d+\))?\s*$", re.IGNORECASE),  # "x - Copy", "x - Copy (2)"
    re.compile(r"\s+copy(\s+\d+)?\s*$", re.IGNORECASE),      # macOS "x copy", "x copy 2"
]
_INNER_COPY_RE = re.compile(r"(^|[\s_\-.])copy\s+of\s+", re.IGNORECASE)
_LMS_RES = [
    re.compile(r"^(?P<name>.+?)_(?P<late>LATE_)?(?P<id>\d+)_\d+_?$"),                 # Canvas: user id, file id
    re.compile(r"^(?P<name>.+?)_(?P<id>\d+)_assignsubmission_[a-z]+_?$", re.IGNORECASE),  # Moodle: participant id
]
_SEPARATORS = " _-.\t"
# Folders tools leave in a download; listed once as skipped, never looked into.
IGNORED_DIRS = {".ipynb_checkpoints": "Jupyter's autosave checkpoints (the notebook beside them is what is graded)",
                "__MACOSX": "macOS archive metadata", "__pycache__": "Python bytecode cache"}


@dataclass
class Submission:
    path: Path
    student: str
    assignment: str
    layout: str  # "folder" or "flat"
    flags: list[str] = field(default_factory=list)
    superseded: list[Path] = field(default_factory=list)  # other files of the same student and lab


@dataclass
class Collection:
    submissions: list[Submission]
    unattributed: list[tuple[Path, str]]   # (file, why)
    ignored: list[tuple[Path, str]]        # (file, why): not notebooks, other assignments


def strip_copy_decorations(stem: str) -> str:
    """'Copy of lab01 (1)' -> 'lab01'; 'lab01 - Copy (2)' -> 'lab01'; 'lab01.ipynb' -> 'lab01'."""
    s = stem
    for _ in range(10):
        before = s
        while s.lower().endswith(".ipynb"):
            s = s[: -len(".ipynb")]
        s = _COPY_PREFIX_RE.sub("", s)
        s = _INNER_COPY_RE.sub(lambda m: m.group(1), s)
        for rx in _COPY_SUFFIX_RES:
            s = rx.sub("", s)
        s = s.strip()
        if s == before:
            break
    return s


def lab_tokens(name: str) -> list[int]:
    return [int(m.group(1)) for m in LAB_TOKEN_RE.finditer(name)]


def _clean_student(s: str) -> str:
    """The student id of a name: an LMS export's display name keeps the LMS's own id beside it
    ("Alice Smith (111)"), so that two students of one name stay two students."""
    s = s.strip(_SEPARATORS)
    for rx in _LMS_RES:
        m = rx.match(s)
        if m:
            return f"{m.group('name').strip(_SEPARATORS)} ({m.group('id')})"
    return s


def terminal_safe(text: str) -> str:
    """`text` with every control or format character (terminal escapes, bidirectional overrides, a carriage
    return that would overwrite the line) written as an escape: what a student named a folder is printed,
    never obeyed, on the instructor's terminal."""
    import unicodedata
    out = []
    for ch in str(text):
        cat = unicodedata.category(ch)
        out.append(ch.encode("unicode_escape").decode("ascii") if cat[0] == "C" or cat in ("Zl", "Zp") else ch)
    return "".join(out)


def _is_late(s: str) -> bool:
    return bool(re.search(r"_LATE_\d+_\d+", s))


def parse_name(filename: str, labs: dict[int, str], assignment: str | None = None,
               flat: bool = True) -> tuple[str | None, str | None, str]:
    """(student, assignment, why) from a file name.

    `labs` maps lab numbers to assignment names ({1: "lab01"}). For folder-layout files (flat=False)
    the student is not looked for in the name. `why` explains a None.
    """
    stem = filename[:-len(".ipynb")] if filename.lower().endswith(".ipynb") else filename
    stem = strip_copy_decorations(stem)
    tokens = list(LAB_TOKEN_RE.finditer(stem))
    numbers = {int(m.group(1)) for m in tokens}
    if len(numbers) > 1:
        return None, None, f"names several labs ({', '.join('lab%02d' % n for n in sorted(numbers))})"
    if numbers:
        n = numbers.pop()
        if n not in labs:
            return None, None, f"lab{n:02d} is not a released lab ({', '.join(sorted(labs.values())) or 'none'})"
        lab = labs[n]
        m = tokens[0]
        before, after = stem[: m.start()], stem[m.end():]
        # Canvas resubmission suffix "lab01-1" and leftover decorations right after the token
        after = re.sub(r"^-\d+(?=$|[\s_.])", "", after)
        after = strip_copy_decorations(after)
    else:
        if assignment is None:
            return None, None, "no labNN in the name"
        lab, before, after = assignment, stem, ""
    if not flat:
        return None, lab, ""
    student = _clean_student(before)
    if not student:
        a = after.strip(_SEPARATORS)
        if a and not re.fullmatch(r"[\d\s_\-.]+", a):
            student = _clean_student(a)
    if not student:
        return None, lab, "no student id in the name (expected e.g. <student>_" + lab + ".ipynb)"
    return student, lab, ""


class UnsafeSubmission(OSError):
    """A submission path that is not a regular file (a link, a FIFO, a device ...): never read."""


def read_submission(path: str | Path, limit: int | None = None) -> str:
    """The text of a submitted file, opened without following a link (``O_NOFOLLOW``) and only when it
    is a regular file (``O_NONBLOCK``: a FIFO does not hang the grader). Raises `UnsafeSubmission`
    otherwise; the file's content is never part of an error message. `limit`: read at most that many
    bytes."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if Path(path).is_symlink():
            raise UnsafeSubmission(f"{path} is a symbolic link; links are never followed") from None
        raise UnsafeSubmission(f"{path} cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSubmission(f"{path} is not a regular file ({_kind(st.st_mode)})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read() if limit is None else fh.read(limit)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def identify_by_content(path: Path, release_keys: dict[str, tuple[set, set]]) -> str | None:
    """The one assignment whose release this notebook resembles (grade_ids or locked cell sources)."""
    try:
        nb = json.loads(read_submission(path))
        cells = nb.get("cells", [])
    except Exception:
        return None
    ids, srcs = set(), set()
    for c in cells:
        if not isinstance(c, dict):
            continue
        g = (c.get("metadata") or {}).get("nbgrader", {})
        if isinstance(g, dict) and g.get("grade_id"):
            ids.add(g["grade_id"])
        src = c.get("source", "")
        srcs.add(("".join(src) if isinstance(src, list) else str(src)).strip())
    scores = {}
    for name, (rel_ids, rel_srcs) in release_keys.items():
        s = max(len(ids & rel_ids) / max(len(rel_ids), 1), len(srcs & rel_srcs) / max(len(rel_srcs), 1))
        if s >= 0.5:
            scores[name] = s
    if len(scores) == 1:
        return next(iter(scores))
    if scores:
        best = sorted(scores.values())
        if best[-1] > best[-2] + 0.25:
            return max(scores, key=scores.get)
    return None


def _student_folder_name(name: str) -> str:
    return _clean_student(name) or name


def _link_reason(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"a symbolic link (to {target}): links are never followed; hand in the file itself"


def _skip_reason(name: str, is_dir: bool) -> str | None:
    """Why a tool's leftover is skipped (None: not a leftover)."""
    if is_dir and name in IGNORED_DIRS:
        return IGNORED_DIRS[name]
    if not is_dir and name.startswith("._"):
        return "macOS resource-fork file (._*), not a notebook"
    if not is_dir and name == ".DS_Store":
        return "macOS folder settings (.DS_Store)"
    return None


def collect(submissions: str | Path, labs: dict[int, str], assignment: str | None = None,
            release_keys: dict[str, tuple[set, set]] | None = None) -> Collection:
    """Walk `submissions` and attribute every notebook (see the module docstring for the forms).
    No link is followed and no file but a regular one is opened."""
    root = Path(submissions)
    if not root.exists():
        raise FileNotFoundError(f"submissions folder {root} does not exist")
    root = root.resolve()  # the instructor's own argument may be a link; nothing below it is followed
    found: list[Submission] = []
    unattributed: list[tuple[Path, str]] = []
    ignored: list[tuple[Path, str]] = []

    def consider(path: Path, student_folder: str | None):
        if path.suffix.lower() != ".ipynb":
            ignored.append((path, "not a notebook (.ipynb)"))
            return
        flat = student_folder is None
        student, lab, why = parse_name(path.name, labs, assignment, flat=flat)
        if lab is None and not flat and release_keys and "no labNN" in why:
            lab = identify_by_content(path, release_keys)
            why = "" if lab else "no labNN in the name and its content matches no released lab"
            flags = ["assignment_from_content"] if lab else []
        else:
            flags = []
        if not flat:
            student = student_folder
        if lab is not None and assignment is not None and lab != assignment:
            ignored.append((path, f"{lab}, not {assignment}"))
            return
        if lab is None or not student:
            unattributed.append((path, why or "cannot tell the student"))
            return
        if flat and _is_late(path.name):
            flags.append("late")
        found.append(Submission(path, student, lab, "flat" if flat else "folder", flags))

    def notebooks_below(folder: Path) -> list[Path]:
        """Notebook-named entries under a hidden folder (links not followed), for the NOT GRADED list."""
        out = []
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            out += [Path(dirpath) / f for f in filenames + dirnames if f.lower().endswith(".ipynb")]
        return sorted(out)

    def visit(path: Path, student: str | None, top: bool):
        """One entry: `student` is the student folder's id (None at the top level: flat layout)."""
        try:
            st = os.lstat(path)
        except OSError as e:
            unattributed.append((path, f"cannot be read: {e.strerror}"))
            return
        name = path.name
        if stat.S_ISLNK(st.st_mode):
            unattributed.append((path, _link_reason(path)))
            return
        is_dir = stat.S_ISDIR(st.st_mode)
        leftover = _skip_reason(name, is_dir)
        if leftover:
            ignored.append((path, leftover))
            return
        if name.startswith("."):
            what = "folder" if is_dir else "file"
            inside = notebooks_below(path) if is_dir else ([path] if name.lower().endswith(".ipynb") else [])
            for nb in inside:
                where = "a hidden folder" if is_dir else "a hidden file"
                unattributed.append((nb, f"in {where} ({name!r} starts with '.'): not graded; rename it to grade it"))
            if not inside:
                ignored.append((path, f"hidden {what} ({name!r} starts with '.'), no notebook in it" if is_dir
                                else f"hidden file ({name!r} starts with '.')"))
            return
        if is_dir:
            sub_student = _student_folder_name(name) if top else student
            try:
                children = sorted(os.listdir(path))
            except OSError as e:
                unattributed.append((path, f"folder cannot be read: {e.strerror}"))
                return
            for child in children:
                visit(path / child, sub_student, False)
            return
        if not stat.S_ISREG(st.st_mode):
            why = f"{_kind(st.st_mode)}, not a file: never opened"
            (unattributed if name.lower().endswith(".ipynb") else ignored).append((path, why))
            return
        consider(path, student)

    if root.is_file():
        consider(root, None)
    elif not root.is_dir():
        raise FileNotFoundError(f"submissions {root} is neither a folder nor a notebook")
    else:
        for name in sorted(os.listdir(root)):
            visit(root / name, None, True)

    # one submission per (student, assignment): the newest file wins, the others are listed
    by_key: dict[tuple[str, str], list[Submission]] = {}
    for s in found:
        by_key.setdefault((s.student, s.assignment), []).append(s)
    chosen = []
    for key in sorted(by_key):
        group = sorted(by_key[key], key=lambda s: (os.lstat(s.path).st_mtime, str(s.path)))
        best = group[-1]
        if len(group) > 1:
            best.superseded = [s.path for s in group[:-1]]
            best.flags.append("several_files")
        chosen.append(best)
    return Collection(chosen, unattributed, ignored)
