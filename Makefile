# The course's commands. A newcomer needs two:  make course  and  make test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is never pinned by the package (Colab brings its own). A fresh machine gets this one;
# override it, e.g. TORCH="torch --index-url https://download.pytorch.org/whl/cu124".
TORCH  ?= torch==2.13.0

.PHONY: course test setup labs grade doctor bench train clean gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Installs torch only when the environment has none, then the package with its test/grading tools.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)" >/dev/null
	touch $@

setup: $(VENV)/.installed

## Set up and open the course: JupyterLab on notebooks/, offline, on the bundled models.
course: setup
	$(BIN)/course doctor || true
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(BIN)/jupyter lab notebooks/

## Set up and run the whole test suite (what CI runs).
test: setup
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest

## Instructors: regenerate labs/ from solutions/ (deterministic; commit the result).
labs: setup
	$(BIN)/course build-labs

## Instructors: grade a folder of downloaded submissions, e.g.  make grade SUBMISSIONS=~/Downloads/lab01
grade: setup
	$(BIN)/course grade "$(SUBMISSIONS)"

doctor: setup
	$(BIN)/course doctor

bench: setup
	$(BIN)/course bench

## Retrain the bundled models (about 90 minutes on a 2-core CPU): the target and the scratch draft,
## then the default draft distilled from the target (installed only if it beats the scratch draft).
train: setup
	$(BIN)/python -m course_lib.models.train
	$(BIN)/python -m course_lib.distill --continue-from-bundled --steps 250 --lr 1e-3 --warmup 10 --seed 1 --threads 2 --out build/distill
	$(BIN)/python -m course_lib.distill --install-from build/distill

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

## On a machine with a CUDA GPU: the whole suite, every notebook at full size, the roofline benches.
gpu-check: setup
	PYTHON=$(BIN)/python bash tools/gpu_check.sh
