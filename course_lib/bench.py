"""`course bench [NAME ...]`: run the benchmark scripts in the repository's bench/ folder.

Each script measures one claim of the course, prints a table, and writes JSON (with the device named)
to bench/results/. Ratios are measured within one run; absolute numbers only mean something on the
device they name.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def scripts() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BENCH_DIR.glob("*.py")) if not p.name.startswith("_")}


def main(argv=None) -> int:
    argv = list(argv or [])
    if not BENCH_DIR.is_dir():
        print("course bench: no bench/ folder next to the package; run it from a clone of the course "
              "repository (pip install -e .)", file=sys.stderr)
        return 2
    available = scripts()
    names = argv or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"course bench: unknown benchmark(s) {unknown}; available: {sorted(available)}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"\n=== bench/{name}.py ===", flush=True)
        rc = subprocess.call([sys.executable, str(available[name])], cwd=BENCH_DIR.parent)
        if rc:
            failed.append(name)
    if failed:
        print(f"\ncourse bench: failed: {failed}", file=sys.stderr)
        return 1
    return 0
