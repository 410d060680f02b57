"""Is this commit ready to be released? (`make release`): checks everything a release needs, offline.

    python tools/release.py               every check, the site's strict build included (minutes)
    python tools/release.py --skip-site   every check but the site (then it cannot say "ready")

Where the course is published and which release students get is said once, in course_lib/__init__.py:
`REPO`, `RELEASE` (= "v" + the package version), `INSTALL_SPEC`, `SITE_URL`. A release is the commit
tagged RELEASE, with every badge, install cell and link pointing at exactly that repository and tag, and
the site built from it. Each check prints one line (ok / FAIL, and what to do when it fails):

  version  course_lib.__version__ equals pyproject's version, and RELEASE is "v" + it
  tag      the tag RELEASE exists here and points at HEAD
  clean    the working tree has no change and no untracked file (what is released is what is committed)
  links    every Colab badge, install cell, repository link and site link in README, syllabus, notebooks,
           labs and solutions (and the built site) uses exactly REPO and RELEASE; each notebook and lab has
           its badge and install cell, README a badge for each and the site's address
  site     `tools/site.py build --strict` (no page whose timing claim did not hold) and its link check
  edition  the student edition, built into build/student-edition/ (`student_edition`): the tree students and
           the public repository and site get, this repository's tracked files without what only the
           instructor may hold (solutions/, judges/, the tests that grade with them, the CI); checked to hold
           no solution, answer key, judge, hidden input or planted mistake, and to import. The instructor's
           repository (this one) stays private.

Then it says what it cannot check offline (the tag on GitHub, GitHub Pages serving SITE_URL, Colab opening
the badges), and exits 1 if any check failed (or was skipped).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE_OUT = "build/site"
SHOWN = 8   # problems listed per check; the rest are counted


@dataclass
class Check:
    name: str
    ok: bool
    detail: str                 # what was found (ok) or what is wrong and what to do (FAIL)
    problems: tuple = ()        # one line each


@dataclass
class Published:
    """What course_lib at the root says about where and what is published."""
    version: str
    repo: str
    release: str
    install_spec: str
    site_url: str

    @property
    def repo_url(self) -> str:
        return f"https://github.com/{self.repo}"

    def colab_url(self, rel: str) -> str:
        return f"https://colab.research.google.com/github/{self.repo}/blob/{self.release}/{rel}"


def published(root: Path) -> Published:
    """Read REPO, RELEASE, ... from the root's course_lib, in a fresh interpreter (the package at `root`,
    not whichever this process imported)."""
    code = ("import json, course_lib as c; print(json.dumps([c.__version__, c.REPO, c.RELEASE, c.INSTALL_SPEC, "
            "c.SITE_URL]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(root)})
    if r.returncode:
        raise SystemExit(f"release: cannot read course_lib at {root}:\n{r.stderr.strip()}")
    return Published(*json.loads(r.stdout))


def _git(root: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


# --- the checks --------------------------------------------------------------------------------------------

def check_version(root: Path, pub: Published) -> Check:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    project = m.group(1) if m else None
    problems = []
    if project != pub.version:
        problems.append(f"pyproject.toml says version {project!r}, course_lib.__version__ {pub.version!r}: "
                        "make them equal")
    if pub.release != f"v{pub.version}":
        problems.append(f"RELEASE is {pub.release!r}, not 'v' + the version ({pub.version!r})")
    if problems:
        return Check("version", False, "the package version and the tag disagree", tuple(problems))
    return Check("version", True, f"course_lib {pub.version} (pyproject.toml too), tag {pub.release}")


def check_tag(root: Path, pub: Published) -> Check:
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if head.returncode:
        return Check("tag", False, f"{root} is not a git repository with a commit ({head.stderr.strip()})")
    tagged = _git(root, "rev-parse", "--verify", "--quiet", f"refs/tags/{pub.release}^{{commit}}")
    create = (f'on the release commit: git tag -a {pub.release} -m "{pub.release}", then '
              f"git push origin {pub.release}")
    if tagged.returncode:
        return Check("tag", False, f"no tag {pub.release} in this repository; {create}")
    if tagged.stdout.strip() != head.stdout.strip():
        return Check("tag", False, f"the tag {pub.release} points at {tagged.stdout.strip()[:12]}, HEAD is "
                                   f"{head.stdout.strip()[:12]}: check out the tag (git checkout {pub.release}) "
                                   f"to release it, or, if HEAD is the release, move the tag: git tag -f -a "
                                   f"{pub.release} -m \"{pub.release}\" (a tag already pushed should not move)")
    return Check("tag", True, f"{pub.release} points at HEAD ({head.stdout.strip()[:12]})")


def check_clean(root: Path, pub: Published) -> Check:
    r = _git(root, "status", "--porcelain", "--untracked-files=all")
    if r.returncode:
        return Check("clean", False, f"git status failed: {r.stderr.strip()}")
    changed = [line for line in r.stdout.splitlines() if line.strip()]
    if changed:
        return Check("clean", False, f"{len(changed)} changed or untracked file(s): commit them (and tag that "
                                     "commit) or remove them", tuple(changed))
    return Check("clean", True, "no change, no untracked file")


# a Colab badge of a GitHub notebook; an install spec of the library; a link into a GitHub repository (with
# the ref after blob/ or tree/, or after @ in a pip URL); a GitHub Pages address
_COLAB = re.compile(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/([^/\s]+)/([^\s)\"'<>\\]+)")
_SPEC = re.compile(r"course_lib\s*@\s*git\+([^\s\"'<>\\]+)")
_GITHUB = re.compile(r"(?<![\w.])github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?(?:/(?:blob|tree)/([^/\s)\"'<>\\]+)"
                     r"|@([^\s)\"'<>\\]+))?(?=[/\s)\"'<>\\#?]|$)")
_PAGES = re.compile(r"https?://([\w-]+)\.github\.io/([^\s)\"'<>\\]*)")


def link_problems(text: str, where: str, pub: Published) -> list[str]:
    """Each badge, install spec, repository link or site link in `text` that is not at exactly REPO and
    RELEASE (or SITE_URL), one line each naming `where`. Links to other people's repositories are fine; a
    link to another repository of REPO's owner is stale."""
    owner = pub.repo.split("/")[0].lower()
    problems = []
    for m in _COLAB.finditer(text):
        if (m.group(1), m.group(2)) != (pub.repo, pub.release):
            problems.append(f"{where}: Colab badge of {m.group(3)} opens {m.group(1)}@{m.group(2)}, "
                            f"not {pub.repo}@{pub.release}")
    specs = []
    for m in _SPEC.finditer(text):
        specs.append(m.span())
        if f"course_lib @ git+{m.group(1)}" != pub.install_spec:
            problems.append(f"{where}: installs course_lib from git+{m.group(1)}, not {pub.install_spec!r}")
    for m in _GITHUB.finditer(text):
        if any(a <= m.start() < b for a, b in specs):   # the install spec's URL: reported above
            continue
        repo, ref = f"{m.group(1)}/{m.group(2)}", m.group(3) or m.group(4)
        if repo == pub.repo:
            if ref is not None and ref != pub.release:
                problems.append(f"{where}: links {repo} at {ref!r}, not at the release {pub.release}")
        elif m.group(1).lower() == owner:
            problems.append(f"{where}: links {repo}, not {pub.repo}")
    for m in _PAGES.finditer(text):
        if m.group(1).lower() == owner and not m.group(0).startswith(pub.site_url.rstrip("/")):
            problems.append(f"{where}: links the site at {m.group(0)}, not {pub.site_url}")
    return problems


def _notebook_cells(path: Path) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]


def check_links(root: Path, pub: Published, site: Path | None = None) -> Check:
    files = [root / name for name in ("README.md", "syllabus.md", "CONTRIBUTING.md", "ARCHITECTURE.md",
                                      "pyproject.toml") if (root / name).is_file()]
    for folder in ("notebooks", "labs", "solutions"):
        files += sorted((root / folder).glob("*.ipynb")) + sorted((root / folder).glob("*.py"))
    if site is not None and site.is_dir():
        files += sorted(site.rglob("*.html"))
    problems = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        problems += link_problems(f.read_text(encoding="utf-8", errors="replace"), rel, pub)
    readme = (root / "README.md").read_text() if (root / "README.md").is_file() else ""
    students = sorted([*(root / "notebooks").glob("*.ipynb"), *(root / "labs").glob("*.ipynb")])
    def badges(text, rel):   # Colab links to `rel`, at any repository and tag (a wrong one is named above)
        return [m for m in _COLAB.finditer(text) if m.group(3) == rel]

    for nb in [*students, *sorted((root / "solutions").glob("*.ipynb"))]:
        rel = nb.relative_to(root).as_posix()
        cells = _notebook_cells(nb)
        if not cells or not badges(cells[0], rel):
            problems.append(f"{rel}: its first cell is not its badge {pub.colab_url(rel)} "
                            "(python tools/nb.py build writes it)")
        if len(cells) < 2 or len(_SPEC.findall(cells[1])) != 1:
            problems.append(f"{rel}: its second cell is not the install cell of {pub.install_spec!r}")
        if nb in students and not badges(readme, rel):
            problems.append(f"README.md: no Colab badge for {rel} ({pub.colab_url(rel)})")
    if pub.site_url not in readme:
        problems.append(f"README.md: no link to the site, {pub.site_url}")
    scanned = f"{len(files)} files ({len(students)} notebooks and labs{', the built site' if site else ''})"
    if problems:
        return Check("links", False, f"{len(problems)} link(s) not at {pub.repo}@{pub.release} in {scanned}",
                     tuple(problems))
    return Check("links", True, f"every badge, install cell and link in {scanned} is at {pub.repo}@{pub.release}")


def build_site(root: Path, out: Path) -> tuple[bool, list[str]]:
    """`tools/site.py build --strict`, then `check`; (whether both passed, their output's last lines)."""
    lines = []
    for cmd in (["build", "--out", str(out), "--strict"], ["check", str(out)]):
        r = subprocess.run([sys.executable, str(root / "tools" / "site.py"), *cmd], cwd=root,
                           capture_output=True, text=True)
        lines += [f"site.py {cmd[0]}: {line}" for line in (r.stdout + r.stderr).strip().splitlines()[-12:]]
        if r.returncode:
            return False, lines
    return True, lines


def check_site(root: Path, pub: Published, builder=build_site) -> Check:
    out = root / SITE_OUT
    ok, lines = builder(root, out)
    if not ok:
        return Check("site", False, f"the strict build of {SITE_OUT} or its link check failed (the previous "
                                    "site, if any, is left as it was)", tuple(lines))
    return Check("site", True, f"built in strict mode into {SITE_OUT} (no timing claim that did not hold), "
                               "every link and asset resolves")


# What only the instructor may hold: the answers (solutions/, with the answer keys), the judges (the hidden cases'
# generators and the planted mistakes), the tests and tools that grade with them, and the maintainers' CI and
# end-to-end tier. Everything else tracked goes to the student edition.
INSTRUCTOR_ONLY = ("solutions/", "judges/", "tests/", "e2e/", ".ci/", "conftest.py", "tools/gpu_check.sh")
EDITION_OUT = "build/student-edition"
EDITION_NOTE = """# Student edition

This tree is the course as students and the public site get it (built by `make release` from the instructor's
repository, which stays private): the library, the notebooks, the labs, the site's tools. It holds no solution,
answer key, grading judge or test suite; `make course` sets it up and opens it.
"""


def tracked_files(root: Path) -> list[str]:
    r = _git(root, "ls-files", "-z")
    if r.returncode:
        raise SystemExit(f"release: git ls-files failed in {root}: {r.stderr.strip()}")
    return sorted(f for f in r.stdout.split("\0") if f)


def student_edition(root: Path, out: Path) -> list[str]:
    """Copy the tracked files of `root` but the instructor's (`INSTRUCTOR_ONLY`) to `out` (made afresh), with
    STUDENT_EDITION.md; the files copied."""
    import shutil
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    kept = [f for f in tracked_files(root) if not f.startswith(INSTRUCTOR_ONLY)]
    for f in kept:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, out / f)
    (out / "STUDENT_EDITION.md").write_text(EDITION_NOTE, encoding="utf-8")
    return kept


def edition_problems(out: Path) -> list[str]:
    """What the student edition must not hold, one line each: instructor folders, notebooks with solution or
    hidden-test markers or answer-key cells, a judge or planted mistakes anywhere; and that its course_lib
    imports."""
    problems = [f"{d}/ is in the edition" for d in ("solutions", "judges", "tests") if (out / d).exists()]
    for nb in sorted(out.rglob("*.ipynb")):
        text = nb.read_text(encoding="utf-8", errors="replace")
        for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "BEGIN MARK SCHEME", '"answer-key"'):
            if marker in text:
                problems.append(f"{nb.relative_to(out)} holds {marker}")
    for py in sorted(out.rglob("*.py")):
        text = py.read_text(encoding="utf-8", errors="replace")
        if re.search(r"^(judge = Judge\(|def mutants\()", text, re.M):
            problems.append(f"{py.relative_to(out)} is a lab's judge")
    r = subprocess.run([sys.executable, "-c", "import course_lib"],
                       cwd=out, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(out)})
    if r.returncode:
        problems.append(f"course_lib does not import from the edition: {r.stderr.strip().splitlines()[-1:]}")
    for need in ("labs", "notebooks", "course_lib", "README.md", "pyproject.toml"):
        if not (out / need).exists():
            problems.append(f"{need} is missing from the edition")
    return problems


def check_edition(root: Path, pub: Published) -> Check:
    out = root / EDITION_OUT
    kept = student_edition(root, out)
    problems = edition_problems(out)
    if problems:
        return Check("edition", False, f"the student edition in {EDITION_OUT} holds what it must not",
                     tuple(problems))
    return Check("edition", True, f"{len(kept)} files in {EDITION_OUT} (no solutions, judges or tests): publish it "
                                  f"as {pub.repo}, tagged {pub.release}")


def offline_limits(pub: Published) -> list[str]:
    return [f"that the tag is on GitHub: git ls-remote --tags {pub.repo_url} {pub.release}",
            f"that GitHub Pages serves the site at {pub.site_url} (push {SITE_OUT} to the gh-pages branch: "
            "README, \"Publishing a release\")",
            f"that Colab opens the badges: open one, e.g. {pub.colab_url('notebooks/00_measuring_inference.ipynb')}"]


def run(root: Path = ROOT, site: bool = True, builder=build_site, out=print) -> int:
    """Every check, reported; returns the exit status (0 only when every check passed and none was skipped)."""
    root = Path(root).resolve()
    pub = published(root)
    out(f"release {pub.release} of {pub.repo} (from {root})")
    checks = [check_version(root, pub), check_tag(root, pub), check_clean(root, pub), check_edition(root, pub)]
    site_check = check_site(root, pub, builder) if site else None
    built = root / SITE_OUT if site_check is not None and site_check.ok else None
    checks.insert(3, check_links(root, pub, built))
    if site_check is not None:
        checks.append(site_check)
    for c in checks:
        out(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name:8s} {c.detail}")
        for p in c.problems[:SHOWN]:
            out(f"          - {p}")
        if len(c.problems) > SHOWN:
            out(f"          ... and {len(c.problems) - SHOWN} more")
    if not site:
        out(f"  skip  {'site':8s} not built (--skip-site): run without it before releasing")
    out("not checked here (they need the network):")
    for line in offline_limits(pub):
        out(f"  - {line}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        out(f"not ready: {len(failed)} check(s) failed ({', '.join(failed)})")
        return 1
    if not site:
        out("not ready: the site was not checked")
        return 1
    out(f"ready to release {pub.release}: publish {EDITION_OUT} as {pub.repo} with the tag, then {SITE_OUT} "
        "(README, \"Publishing a release\")")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/release.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-site", action="store_true", help="skip the site's strict build (minutes)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return run(args.root, site=not args.skip_site)


if __name__ == "__main__":
    sys.exit(main())
