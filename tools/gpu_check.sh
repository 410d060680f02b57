#!/usr/bin/env bash
# The course on a GPU, in one command (issue 11): the whole test suite with CUDA present (the `gpu` tests
# included), every notebook in its default (GPU-sized) mode, and the benches that compare against the
# HBM roofline. Logs and bench JSON go to $OUT (or ./gpu-check/). Run from the project's root on a
# machine with a CUDA GPU and the course installed (`make setup`, or the wheels of
# ../shared/gpu/prepare-wheels on a machine without a package index).
set -uo pipefail
py="${PYTHON:-python3}"
out="${OUT:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 COURSE_BENCH_RESULTS="$out"
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU here'; print(torch.cuda.get_device_name())" || exit 2
status=0
# 1. Library and grading tests (quick mode for the notebook-independent tests is harmless on a GPU).
#    -rfE and -v: every test's outcome as it ends and each failure's reason, so a run cut short by a time
#    limit still says what failed (a session of 2026-11-27 lost every failure's name to a cut -q run)
"$py" -m pytest -v -rfE --tb=short -p no:cacheprovider tests 2>&1 | tee "$out/tests.log" || status=1
# 2. Every notebook at its default size (COURSE_QUICK=0): the sizes a student with a GPU gets.
#    Each one that runs through leaves its executed copy in build/executed/; they are collected in
#    $out/executed/, to be committed as executed/gpu/ for the site (README, "Publishing the site").
rm -rf build/executed   # only this run's copies (no quick CPU copy of a notebook that failed here)
COURSE_QUICK=0 "$py" -m pytest -v -rfE --tb=short -p no:cacheprovider notebooks 2>&1 | tee "$out/notebooks.log" \
  || status=1
mkdir -p "$out/executed" && cp build/executed/*.ipynb "$out/executed/" 2>/dev/null || true
# 3. The benches that the GPU issue measures, and lab 07's Part E kernel (the answer key's, read from
#    solutions/lab07.ipynb) timed against SDPA after a correctness check (on a CPU it would say why not).
for b in decode paged_attention serving lab07_kernel; do
  [ -f "bench/$b.py" ] && { "$py" "bench/$b.py" 2>&1 | tee "$out/bench-$b.log" || status=1; }
done
exit $status
