"""The preprocessor `course grade` adds to nbgrader's generate_feedback.

nbgrader renders feedback from the autograded notebook, in which autograde has put the hidden tests
back into the test cells (that is how they ran), so nbgrader's feedback HTML shows hidden tests
verbatim. `HideHiddenTests` runs before the HTML export and:

* replaces every ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` region (and mark-scheme
  regions) with one comment line;
* in those cells, cuts error tracebacks down to their last line (``AssertionError: <message>``),
  because IPython's traceback quotes the failing source lines, hidden ones included. The assertion
  message written by the lab author (expected vs got) stays;
* truncates very large outputs, so a cell that printed megabytes does not make a megabyte page.

Scores, points and the student's own cells are untouched.
"""
from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, Unicode

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REGIONS = (("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"), ("BEGIN MARK SCHEME", "END MARK SCHEME"))


def hide_regions(source: str, note: str) -> tuple[str, bool]:
    """Source with each hidden region replaced by `note` (indented like the region's first line)."""
    out, inside, found = [], False, False
    for line in source.split("\n"):
        if any(b in line for b, _ in REGIONS):
            inside, found = True, True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + note)
        elif inside and any(e in line for _, e in REGIONS):
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out), found


class HideHiddenTests(NbGraderPreprocessor):
    note = Unicode("# [hidden tests ran here; they are not shown in feedback]").tag(config=True)
    max_output_chars = Integer(20_000, help="longer text outputs are truncated in feedback").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type in ("code", "markdown", "raw"):
            cell.source, hidden = hide_regions(cell.source, self.note if cell.cell_type == "code"
                                               else "[hidden content]")
        else:
            hidden = False
        if cell.cell_type != "code":
            return cell, resources
        outputs = []
        for out in cell.get("outputs", []):
            if out.output_type == "error" and hidden:
                last = f"{out.get('ename', 'Error')}: {_ANSI_RE.sub('', str(out.get('evalue', '')))}"
                out.traceback = [last]
            elif out.output_type == "stream" and len(out.get("text", "")) > self.max_output_chars:
                n = len(out.text)
                out.text = out.text[: self.max_output_chars] + f"\n... [output truncated: {n:,} characters]\n"
            elif out.output_type in ("display_data", "execute_result"):
                data = out.get("data", {})
                for mime in list(data):
                    val = data[mime]
                    size = len(val) if isinstance(val, str) else len(str(val))
                    if size > self.max_output_chars * (50 if mime.startswith("image/") else 1):
                        if mime.startswith("text/") and isinstance(val, str):
                            data[mime] = val[: self.max_output_chars] + f"\n... [output truncated: {size:,} characters]"
                        else:
                            del data[mime]
                            data.setdefault("text/plain", f"[{mime} output of {size:,} bytes removed]")
            outputs.append(out)
        cell.outputs = outputs
        return cell, resources
