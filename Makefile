# The course's commands. A newcomer needs two:  make course  and  make test.
PYTHON ?= python3
# VENV: the course (the library, JupyterLab, the optional kernels; no instructor tools).
# DEV: tests and instructors (the course plus pytest, nbclient, nbgrader, papermill, the site's tools).
# WORK: your own copies of the notebooks and labs; JupyterLab opens here.
VENV   ?= .venv
DEV    ?= .venv-dev
WORK   ?= work
# torch is never pinned by the package (Colab brings its own). A fresh environment gets this one;
# on a machine without a GPU the CPU build is much smaller:
#   make course TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
# and a CUDA build for a given CUDA version, e.g. TORCH="torch --index-url https://download.pytorch.org/whl/cu124".
TORCH  ?= torch==2.13.0
# JupyterLab refuses to run as root (containers, cloud VMs) unless told it may.
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: course workdir test site slides release e2e browser-test colab-test setup setup-dev notebooks labs grade doctor bench train clean gpu-check

# $(call make-env,<venv>,<extras>): a venv with torch (only if it has none) and the package with those extras.
define make-env
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/python -m pip install -q $(TORCH)
	$(1)/bin/python -m pip install -q -e ".[$(2)]"
	$(1)/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)" >/dev/null
	touch $(1)/.installed
endef

$(VENV)/.installed: pyproject.toml
	$(call make-env,$(VENV),course)

$(DEV)/.installed: pyproject.toml
	$(call make-env,$(DEV),dev)

# JupyterLab's defaults in the course's environment (overrides.json in its application settings directory,
# as JupyterLab documents): no "Jupyter news?" pop-up on first start and no update check, both web requests
# (the course runs offline). A student's own choice in the Settings Editor still wins.
LAB_OVERRIDES := share/jupyter/lab/settings/overrides.json
$(VENV)/$(LAB_OVERRIDES): etc/jupyterlab/overrides.json $(VENV)/.installed
	mkdir -p $(dir $@)
	cp etc/jupyterlab/overrides.json $@

setup: $(VENV)/.installed $(VENV)/$(LAB_OVERRIDES)
setup-dev: $(DEV)/.installed

## Set up and open the course: JupyterLab on your copies of notebooks/ and labs/, offline, on the bundled
## models. Copies are made once (your work is never overwritten; delete a copy to get a fresh one).
## OMP_WAIT_POLICY=PASSIVE (unless you set it): PyTorch's CPU threads sleep while they wait for each other
## instead of spinning, so a busy laptop slows the notebooks a little rather than several-fold (measured on
## 2 cores beside two busy loops: notebook 03 in 52 s instead of 479 s; about 20% slower when the machine is
## quiet). Set OMP_WAIT_POLICY=ACTIVE for a machine that runs nothing else.
course: setup workdir
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(VENV)/bin/course doctor || true
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(WORK)

## Your copies of the notebooks and labs (JupyterLab saves outputs into them, not into the tracked files).
workdir:
	@mkdir -p $(WORK)/notebooks $(WORK)/labs
	@for f in notebooks/*.ipynb labs/*.ipynb; do \
	  if [ -e "$(WORK)/$$f" ]; then echo "kept your $(WORK)/$$f"; else cp "$$f" "$(WORK)/$$f"; fi; done

## Set up and run the whole test suite (what CI runs, before `make e2e`): the library, every notebook (their
## executed copies kept in build/executed/), the grading round trips, then the site built from those copies
## and its link check. The suite runs in TEST_WORKERS processes (pytest-xdist, one test file per worker at a
## time: 23 min instead of 47 on 2 cores; a notebook's budget counts its own CPU seconds, so sharing the
## machine does not push it over); then the grading sandbox's tests alone, because they check that a grading
## run leaves no cgroup, mount or file anywhere on the machine, which a run on another worker would; then the
## decks' check again, now that every notebook's executed copy exists (figures counted on every deck).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))" 2>/dev/null || echo 2)
test: setup-dev
	$(DEV)/bin/ruff check .   # pyproject's [tool.ruff]: undefined names, unused imports, 120 columns
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile \
	  --ignore=tests/test_grading_sandbox.py
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python -m pytest tests/test_grading_sandbox.py
	COURSE_DECKS_NEED_OUTPUTS=1 $(DEV)/bin/python -m pytest -q tests/test_slides.py -k every_module_deck
	$(MAKE) --no-print-directory site

## The course as a static site in build/site/ (open build/site/index.html), then its link check. Uses the
## executed notebooks that `make test` leaves in build/executed/ and executes the others (README, "The course site").
## All or nothing: a build that fails leaves the previous site as it was.
site: setup-dev
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python tools/site.py build --out build/site
	$(DEV)/bin/python tools/site.py check build/site

## Instructors: a reveal.js slide deck per module in build/slides/ (open build/slides/index.html: arrows to move,
## S for speaker notes), from the executed notebooks `make site` uses, offline (tools/slides.py states the rule
## that makes slides from headings); then the decks' link check. `make site` builds them too, in build/site/slides/.
slides: setup-dev
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python tools/slides.py build --out build/slides
	$(DEV)/bin/python tools/site.py check build/slides

## Maintainers: build the student edition (build/student-edition/: this repository's tracked files without
## solutions/, judges/, tests/ and the CI, checked to hold no answer, judge or hidden input: what students and
## the public repository get; this repository stays private) and check that the commit is ready to release:
## the tag RELEASE at HEAD, a clean tree, every badge, install cell and link at REPO and RELEASE, the version,
## the site built in strict mode and its link check; says what it cannot check offline. Exit 1 on any failed
## check (README, "Publishing a release").
release: setup-dev
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python tools/release.py

## The end-to-end tier (e2e/, outside pytest's default paths; CI runs it after `make test`): the browser
## tests, then the Colab install test.
e2e: browser-test colab-test

## The browser tests: JupyterLab in headless Chromium runs each widget notebook and changes a control; every
## page of the built site (build/site) loads with no console error and no request off this machine.
## Installs Debian's Chromium when missing (root or sudo); failures leave screenshots and console logs in
## build/browser-artifacts/.
browser-test: site
	bash tools/install_chromium.sh
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python -m pytest e2e --ignore=e2e/test_colab_install.py

## The Colab install cell, run as on Colab: a Python 3.12 environment with Colab's torch (CUDA build) and
## ipywidgets 7.7.1 (tools/colab_env.py; built once into build/colab/, about 5 GB and 3 minutes, or into
## COLAB_ENV_CACHE), the course installed from a wheel of this tree, then each lab's first cells and a solved
## lab's visible tests (e2e/test_colab_install.py, about 3 minutes). Needs Python 3.12 (skips without it).
colab-test: setup-dev
	COURSE_OFFLINE=1 HF_HUB_OFFLINE=1 $(DEV)/bin/python -m pytest e2e/test_colab_install.py

## Authors: build each notebooks/*.ipynb and solutions/*.ipynb from the .py source beside it (jupytext's
## percent format, tools/nb.py; commit both). `make test` fails while a notebook is not what its source builds.
notebooks: setup-dev
	$(DEV)/bin/python tools/nb.py build

## Instructors: regenerate labs/ from solutions/ (deterministic; commit the result).
labs: notebooks
	$(DEV)/bin/course build-labs

## Instructors: grade a folder of downloaded submissions, e.g.  make grade SUBMISSIONS=~/Downloads/lab01
## (GRADE_FLAGS=--require-sandbox refuses to grade without bubblewrap; see README "For instructors")
grade: setup-dev
	$(DEV)/bin/course grade "$(SUBMISSIONS)" $(GRADE_FLAGS)

doctor: setup
	$(VENV)/bin/course doctor

bench: setup
	$(VENV)/bin/course bench

## Retrain the bundled models (about 3 h on a 2-core CPU; on a CUDA GPU the training stages run
## there): the target and the scratch draft, the default draft distilled from the target (installed only
## if it beats the scratch draft), then the target's Medusa heads, EAGLE head and MTP modules (they read
## the target's hidden states, so they are retrained with it).
train: setup
	$(VENV)/bin/python -m course_lib.training.train
	$(VENV)/bin/python -m course_lib.training.distill_draft --continue-from-bundled --steps 250 --lr 1e-3 --warmup 10 --seed 1 --threads 2 --out build/distill
	$(VENV)/bin/python -m course_lib.training.distill_draft --install-from build/distill
	$(VENV)/bin/python -m course_lib.speculative.medusa --threads 2
	$(VENV)/bin/python -m course_lib.speculative.eagle --kind eagle --threads 2
	$(VENV)/bin/python -m course_lib.speculative.eagle --kind mtp --threads 2

## On a machine with a CUDA GPU: the whole suite, every notebook at full size, the roofline benches.
gpu-check: setup-dev
	PYTHON=$(DEV)/bin/python bash tools/gpu_check.sh

clean:
	rm -rf $(VENV) $(DEV) build *.egg-info .pytest_cache
