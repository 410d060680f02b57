"""Check a submission against the release it came from, and repair what can be repaired safely.

nbgrader grades what it recognizes by ``metadata.nbgrader.grade_id``. Students' tools damage that:
Colab or a copy/paste can drop the metadata (nbgrader then finds no tests and scores 0 without a
word), Colab lets students delete locked cells, a copied cell duplicates a grade_id, a student edits a
visible test until it passes. Before grading, every submission is aligned cell by cell with the
release (``labs/labNN.ipynb``) and a working copy is written in which:

* every cell that still has a valid grade_id keeps it (a cell moved elsewhere is still recognized);
* cells whose metadata was lost get it back when they can be matched to a release cell: by identical
  source (test cells, locked cells, untouched answer stubs, instructions), then by position and cell
  type between two matched cells (the answer cells in between). These are safe repairs;
* remaining cells are matched by similarity (same type, similar source or the same function names
  defined); that is a guess, so the submission is flagged for review;
* locked cells (tests, read-only text) get the release's source back; an edited visible test never
  counts. Answer cells keep the student's source with the release's metadata and cell type;
* release cells that cannot be found are put back (tests and locked cells from the release, answer
  cells empty) before the next matched cell, so the student's code above them still runs first;
  when metadata had been lost as well, this is flagged for review, since the work may sit in a cell
  that could not be matched;
* duplicated grade_ids keep the first copy; later copies become ordinary cells (they still run);
  grade_ids the release does not know are removed;
* outputs are cleared (nbgrader re-executes everything); very large stored outputs are noted;
* entries that are not notebook cells are left out (flagged for review).

Flags (``Findings.flags``: flag -> grade_ids or details): safe repairs `REPAIR_FLAGS`, review
`REVIEW_FLAGS`; for information only: ``large_outputs_removed``, ``plain_code_cells_changed`` (a code
cell of the release without nbgrader metadata, such as an imports cell, was not found unchanged).

The submission file itself is never written to.
"""
from __future__ import annotations

import ast
import copy
import json
import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher

import nbformat

from .build import grade_id, is_answer, is_locked, nbgrader_meta
from .nbgrader_env import KERNELSPEC

LARGE_OUTPUT_BYTES = 1_000_000
SIMILARITY_THRESHOLD = 0.5

#: Flags that mean "graded after a safe automatic repair".
REPAIR_FLAGS = {"metadata_restored", "locked_cells_restored", "cells_restored", "cell_type_restored",
                "duplicate_grade_ids", "unknown_grade_ids", "answer_moved_before_test"}
#: Flags that mean "a human should look at this submission".
REVIEW_FLAGS = {"matched_by_similarity", "cells_unmatched", "invalid_cells_dropped"}

MISSING_ANSWER_NOTE = "# (answer cell missing from the submission: added back empty by the grader)"


@dataclass
class Findings:
    flags: dict[str, list[str]] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def add(self, flag: str, item: str = "", message: str | None = None):
        items = self.flags.setdefault(flag, [])
        if item and item not in items:
            items.append(item)
        if message:
            self.messages.append(message)

    @property
    def needs_review(self) -> bool:
        return any(f in REVIEW_FLAGS for f in self.flags)

    @property
    def repaired(self) -> bool:
        return any(f in REPAIR_FLAGS for f in self.flags)


def norm(src: str) -> str:
    return "\n".join(ln.rstrip() for ln in str(src).strip("\n").split("\n")).strip()


def _key(cell) -> tuple:
    return (cell.cell_type, norm(cell.source))


def _defined_names(src: str) -> set[str]:
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return set(re.findall(r"^\s*(?:def|class)\s+(\w+)", src, re.M))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
    return names


def _similarity(rel, sub) -> float:
    a, b = norm(rel.source)[:5000], norm(sub.source)[:5000]
    score = SequenceMatcher(None, a, b, autojunk=False).ratio()
    if rel.cell_type == "code" and is_answer(rel):
        names = _defined_names(rel.source)
        if names and names & _defined_names(sub.source):
            score += 1.0
    return score


def _longest_increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest subsequence of (i, j) pairs (sorted by i) with increasing j."""
    if not pairs:
        return []
    best_len, prev = [1] * len(pairs), [-1] * len(pairs)
    for k in range(len(pairs)):
        for q in range(k):
            if pairs[q][1] < pairs[k][1] and best_len[q] + 1 > best_len[k]:
                best_len[k], prev[k] = best_len[q] + 1, q
    k = max(range(len(pairs)), key=lambda x: best_len[x])
    out = []
    while k != -1:
        out.append(pairs[k])
        k = prev[k]
    return out[::-1]


def _output_bytes(cell) -> int:
    if cell.get("cell_type") != "code":
        return 0
    try:
        return len(json.dumps(cell.get("outputs", [])))
    except (TypeError, ValueError):
        return LARGE_OUTPUT_BYTES


def _new_cell(cell_type: str, source: str, metadata: dict, attachments=None):
    if cell_type == "code":
        c = nbformat.v4.new_code_cell(source, metadata=metadata)
    elif cell_type == "markdown":
        c = nbformat.v4.new_markdown_cell(source, metadata=metadata)
        if attachments:
            c["attachments"] = attachments
    else:
        c = nbformat.v4.new_raw_cell(source, metadata=metadata)
    return c


def _answers_before_tests(out: list, R: list, f: Findings) -> list:
    """An answer cell that sits below a test of its own exercise would be graded as missing: it goes
    back to just before the first such test (its place in the release), and that is reported."""
    tests_of: dict[str, set[str]] = {}
    for i, c in enumerate(R):
        if is_answer(c):
            mine = set()
            for c2 in R[i + 1:]:
                if is_answer(c2):
                    break
                if grade_id(c2) and not is_answer(c2) and (nbgrader_meta(c2) or {}).get("grade"):
                    mine.add(grade_id(c2))
            tests_of[grade_id(c)] = mine
    for _ in range(len(out)):
        moved = False
        pos = {grade_id(c): k for k, c in enumerate(out) if grade_id(c)}
        for g, tests in tests_of.items():
            if g not in pos:
                continue
            before = [pos[t] for t in tests if t in pos and pos[t] < pos[g]]
            if before:
                cell = out.pop(pos[g])
                out.insert(min(before), cell)
                f.add("answer_moved_before_test", g, f"answer cell {g!r} was below its test; it was moved back "
                      "above it (its place in the release)")
                moved = True
                break
        if not moved:
            break
    return out


def repair(submission_nb, release_nb) -> tuple[object, Findings]:
    """Align `submission_nb` with `release_nb` and return (working copy, findings). See the module doc."""
    f = Findings()
    R = release_nb.cells
    S = []
    for k, c in enumerate(submission_nb.cells):  # tolerate hand-edited or half-broken JSON
        if not isinstance(c, dict) or c.get("cell_type") not in ("code", "markdown", "raw"):
            f.add("invalid_cells_dropped", str(k), f"cell {k} is not a notebook cell and was left out")
            continue
        c = copy.deepcopy(c)
        if not isinstance(c.get("metadata"), dict):
            c["metadata"] = nbformat.NotebookNode()
        src = c.get("source", "")
        c["source"] = "".join(map(str, src)) if isinstance(src, list) else str(src)
        S.append(nbformat.from_dict(c))
    n, m = len(R), len(S)
    rel_index = {grade_id(c): i for i, c in enumerate(R) if grade_id(c)}

    # 0. outputs: cleared (nbgrader re-runs everything); huge ones are noted
    total = 0
    for c in S:
        b = _output_bytes(c)
        total += b
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    if total > LARGE_OUTPUT_BYTES:
        f.add("large_outputs_removed", f"{total / 1e6:.1f} MB",
              f"stored outputs of {total / 1e6:.1f} MB were removed before grading")

    # 1. grade_ids: unknown ones removed, duplicates keep the first copy
    sub_gid: list[str | None] = [None] * m
    for j, c in enumerate(S):
        meta = c.metadata.get("nbgrader")
        if meta is None:
            continue
        g = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(g, str) and g in rel_index:
            sub_gid[j] = g
        else:
            del c.metadata["nbgrader"]
            if g:
                f.add("unknown_grade_ids", str(g), f"cell {j} had grade_id {g!r}, which the release does not "
                      "have; its nbgrader metadata was removed")
    groups: dict[str, list[int]] = {}
    for j, g in enumerate(sub_gid):
        if g is not None:
            groups.setdefault(g, []).append(j)
    for g, js in groups.items():
        if len(js) > 1:
            rel = R[rel_index[g]]
            keep = js[0]
            if is_locked(rel):
                same = [j for j in js if norm(S[j].source) == norm(rel.source)]
                keep = same[0] if same else js[0]
            for j in js:
                if j != keep:
                    sub_gid[j] = None
                    del S[j].metadata["nbgrader"]
            f.add("duplicate_grade_ids", g, f"grade_id {g!r} appeared in {len(js)} cells; cell {keep} keeps it, "
                  "the copies run as ordinary cells")

    # 2. match by grade_id; the in-order ones are anchors
    pairs: dict[int, tuple[int, str]] = {}  # release index -> (submission index, how)
    for j, g in enumerate(sub_gid):
        if g is not None:
            pairs[rel_index[g]] = (j, "id")
    anchors = _longest_increasing(sorted((i, j) for i, (j, _) in pairs.items()))
    used = {j for j, _ in pairs.values()}
    any_id_match = bool(pairs)

    def sub_gap(Ri: list[int], Sj: list[int]):
        if not Ri or not Sj:
            return
        if len(Ri) == len(Sj) and all(R[i].cell_type == S[j].cell_type for i, j in zip(Ri, Sj)):
            for i, j in zip(Ri, Sj):
                # a locked cell (a test) is only taken for the student's cell in its place when they look
                # alike; otherwise the student's cell stays as it is and the release's cell is put back
                if not is_locked(R[i]) or _similarity(R[i], S[j]) > SIMILARITY_THRESHOLD:
                    pairs[i] = (j, "position")
            return
        pos = 0
        for i in Ri:
            if nbgrader_meta(R[i]) is None:
                continue
            best, best_k = SIMILARITY_THRESHOLD, None
            for k in range(pos, len(Sj)):
                s = S[Sj[k]]
                if s.cell_type != R[i].cell_type:
                    continue
                score = _similarity(R[i], s)
                if score > best:
                    best, best_k = score, k
            if best_k is not None:
                pairs[i] = (Sj[best_k], "similarity")
                pos = best_k + 1

    def gap(Ri: list[int], Sj: list[int]):
        if not Ri:
            return
        ka, kb = [_key(R[i]) for i in Ri], [_key(S[j]) for j in Sj]
        prev_a = prev_b = 0
        for a, b, size in SequenceMatcher(None, ka, kb, autojunk=False).get_matching_blocks():
            sub_gap(Ri[prev_a:a], Sj[prev_b:b])
            for k in range(size):
                pairs[Ri[a + k]] = (Sj[b + k], "exact")
            prev_a, prev_b = a + size, b + size

    bounds = [(-1, -1)] + anchors + [(n, m)]
    for (i0, j0), (i1, j1) in zip(bounds, bounds[1:]):
        gap([i for i in range(i0 + 1, i1) if i not in pairs],
            [j for j in range(j0 + 1, j1) if j not in used])

    # 3. what the matching says about the submission
    lost = [grade_id(R[i]) for i, (j, how) in sorted(pairs.items())
            if how != "id" and nbgrader_meta(R[i]) is not None]
    if lost:
        f.add("metadata_restored", "", f"nbgrader metadata was missing on {len(lost)} cell(s) and was restored "
              f"from the release: {', '.join(lost)}")
        for g in lost:
            f.flags["metadata_restored"].append(g)
    similar = [grade_id(R[i]) for i, (j, how) in sorted(pairs.items()) if how == "similarity"]
    for g in similar:
        f.add("matched_by_similarity", g)
    if similar:
        f.messages.append(f"cells matched by similarity only (check them): {', '.join(similar)}")
    metadata_lost = bool(lost) or not any_id_match
    missing = [i for i in range(n) if nbgrader_meta(R[i]) is not None and i not in pairs]
    ordered = _longest_increasing(sorted((i, j) for i, (j, _) in pairs.items()))
    paired_sub = {j for j, _ in pairs.values()}
    unsure = []
    for i in missing:
        # could the student's version be one of the unmatched cells around where this one belongs?
        j_prev = max([j for (i2, j) in ordered if i2 < i], default=-1)
        j_next = min([j for (i2, j) in ordered if i2 > i], default=m)
        around = [j for j in range(j_prev + 1, j_next) if j not in paired_sub and S[j].cell_type == R[i].cell_type]
        sure = not metadata_lost or (not around and not similar)
        f.add("cells_restored" if sure else "cells_unmatched", grade_id(R[i]))
        if not sure:
            unsure.append(grade_id(R[i]))
    restored_ids = [grade_id(R[i]) for i in missing if grade_id(R[i]) not in unsure]
    if restored_ids:
        f.messages.append(f"release cells deleted from the submission were put back: {', '.join(restored_ids)}")
    if unsure:
        f.messages.append("release cells not found in the submission, put back from the release (the student's "
                          f"work may be in cells that could not be matched): {', '.join(unsure)}")
    plain_code_missing = [i for i in range(n) if nbgrader_meta(R[i]) is None and R[i].cell_type == "code"
                          and i not in pairs and i > 1]
    if plain_code_missing:
        f.add("plain_code_cells_changed", ",".join(str(i) for i in plain_code_missing))

    # 4. where the missing cells go: before the next in-order matched cell
    inserts: dict[int, list[int]] = {}
    for i in missing:
        nxt = [j for (i2, j) in ordered if i2 > i]
        inserts.setdefault(nxt[0] if nxt else m, []).append(i)
    by_sub = {j: i for i, (j, _) in pairs.items()}

    def restored(i: int, j: int | None):
        rel = R[i]
        g = grade_id(rel)
        if j is None:
            if is_locked(rel) or not is_answer(rel):
                return copy.deepcopy(rel)
            src = MISSING_ANSWER_NOTE if rel.cell_type == "code" else ""
            return _new_cell(rel.cell_type, src, copy.deepcopy(dict(rel.metadata)))
        s = S[j]
        if s.cell_type != rel.cell_type:
            f.add("cell_type_restored", g, f"cell {g!r} was turned from {rel.cell_type} into {s.cell_type}; "
                  f"it is graded as {rel.cell_type}")
        if is_locked(rel):
            if norm(s.source) != norm(rel.source):
                f.add("locked_cells_restored", g, f"locked cell {g!r} had been edited; the release's version "
                      "was put back")
            return copy.deepcopy(rel)
        meta = {k: v for k, v in dict(s.metadata).items() if k not in ("nbgrader", "deletable", "editable")}
        for k in ("nbgrader", "deletable", "editable"):
            if k in rel.metadata:
                meta[k] = copy.deepcopy(rel.metadata[k])
        return _new_cell(rel.cell_type, s.source, meta, s.get("attachments"))

    out = []
    for j in range(m + 1):
        for i in inserts.get(j, []):
            out.append(restored(i, None))
        if j == m:
            break
        if j in by_sub and nbgrader_meta(R[by_sub[j]]) is not None:
            out.append(restored(by_sub[j], j))
        else:
            out.append(S[j])

    out = _answers_before_tests(out, R, f)

    nb = nbformat.v4.new_notebook()
    meta = {k: v for k, v in dict(submission_nb.metadata).items() if k not in ("widgets",)}
    meta["kernelspec"] = dict(KERNELSPEC)
    meta.setdefault("language_info", {"name": "python"})
    nb.metadata = nbformat.from_dict(meta)
    for k, c in enumerate(out):
        c = nbformat.from_dict(dict(c))
        c["id"] = f"w{k:03d}"
        for key in [key for key in c if key not in ("id", "cell_type", "source", "metadata", "outputs",
                                                    "execution_count", "attachments")]:
            del c[key]
        if c.cell_type == "code":
            c.setdefault("outputs", [])
            c.setdefault("execution_count", None)
        out[k] = c
    nb.cells = out
    return nb, f
