# Thin targets; each works from a fresh clone. See README.md.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PRESET ?= auto
TEST_JOBS ?= auto
OUT ?= _build/gpu-run
# Pinned where the project installs torch itself (CPU machines, CI): torch 2.13's own Triton pin.
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.7.1
# Optional: a pip index for PyTorch's CPU-only wheels (see README), e.g. on a Linux laptop.
TORCH_INDEX_URL ?=

.PHONY: setup test test-book test-sweep test-compat book notebooks gpu-run gpu-check gpu-plan gpu-precompile gpu-wheels gpu-import clean
setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-test.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "setup: keeping the installed torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "setup: a GPU is visible: installing the CUDA build of $(TORCH_SPEC) (it brings its own Triton)"; \
	  $(PY) -m pip install "$(TORCH_SPEC)"; \
	else \
	  echo "setup: no GPU: installing $(TORCH_SPEC) (CPU) and $(TRITON_SPEC) first"; \
	  $(PY) -m pip install $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)" && \
	  $(PY) -m pip install "$(TRITON_SPEC)"; \
	fi
	$(PY) -m pip install -r requirements.txt -r requirements-test.txt -e .
	@touch $@

# The suite without the tests that take minutes, on every core (pytest-xdist; each module on
# one worker, so a module's fixtures are built once); TEST_JOBS=0 runs it in this process.
test: setup
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadscope -m "not book and not sweep"

# The tests that take minutes: every chapter and exercise executed (cpu preset, through make
# book's cache), the HTML built with -W, the pages opened in headless Chromium, the chapters
# and the GPU run's dry run against a fixture recording.
test-book: setup
	$(PY) -m pytest -m "book"

# The whole compile sweep: every config the autotuner may keep, compiled for sm_80 and sm_90
# (six minutes of a core on a cold Triton cache). `make test` compiles its covering subset (per
# kernel and target, the kept config nearest the shared-memory limit, and one that must not
# fit); run this after editing kernels/triton/tiles.py or the kernels, and on CI's schedule.
test-sweep: setup
	$(PY) -m pytest -m "sweep"

# Write book/**/*.ipynb from their sources in notebooks/ (edit the .py files, not the .ipynb).
notebooks: setup
	$(PY) -m tools.book.convert

book: setup
	$(PY) -m tools.book.execute --preset $(PRESET) --build

# The GPU run, on a machine with a GPU (no network needed): see README "Running on a GPU".
# Writes exactly $(OUT)/gpu-run.tar.gz and $(OUT)/summary.txt, in under 8 minutes a call.
# It uses .venv's Python when there is one, else python3, and installs nothing from the network.
# STOP_AFTER=phase|chapter ends the call there; RESUME=first.tar.gz runs only what that one lacks.
gpu-run:
	bash .ci/device-run $(if $(RESUME),--resume "$(RESUME)") $(if $(STOP_AFTER),--stop-after $(STOP_AFTER)) "$(OUT)"
gpu-check: gpu-run

# The GPU run's plan (tools/gpu_plan.json): each phase's and chapter's expected seconds on an
# H100/H200 and the compile counts they come from, what is carried, the device commands.
gpu-plan:
	@test -x $(PY) || { echo "gpu-plan needs $(PY) (make setup)"; exit 2; }
	$(PY) tools/gpu_plan.py

# Triton's cache for the GPU run, compiled here for sm_90 with the GPU image's stack and then
# checked from a fresh process (every launch a hit); carried as _build/triton-cache.
# GPU_IMAGE_PYTHON: a Python 3.12 with torch 2.11, triton 3.6.0 and numpy<2.4 (README).
GPU_IMAGE_PYTHON ?=
gpu-precompile:
	@test -n "$(GPU_IMAGE_PYTHON)" || { echo "usage: make gpu-precompile GPU_IMAGE_PYTHON=path/to/python3.12 (torch 2.11, triton 3.6.0, numpy<2.4)"; exit 2; }
	$(GPU_IMAGE_PYTHON) tools/triton_cache.py build _build/triton-cache
	$(GPU_IMAGE_PYTHON) tools/triton_cache.py check _build/triton-cache

# On a networked CPU machine: the wheels the GPU image lacks (the book stack), into .wheels/.
gpu-wheels:
	$(PYTHON) tools/gpu_run.py wheels .wheels

# Back on a CPU: check a GPU run's archive, then write book/data/recorded/<gpu>/ and
# book/data/bench/<gpu>.json from it.  ACCEPT_FAILED="gpu-tests" imports despite a failed phase.
gpu-import:
	@test -n "$(ARCHIVE)" || { echo "usage: make gpu-import ARCHIVE=path/to/gpu-run.tar.gz"; exit 2; }
	$(PYTHON) tools/gpu_run.py import "$(ARCHIVE)" $(if $(ACCEPT_FAILED),--accept-failed $(ACCEPT_FAILED))

# The compatibility matrix (README "Supported versions"): make test and one chapter per part of
# the book, from fresh clones of HEAD, on the newest torch/Triton on the index (Python 3.11) and
# on the oldest supported (Python 3.12, torch 2.11, Triton 3.6). Each stack lives in its own
# environment under COMPAT_DIR, kept between runs. Its pip installs clear any machine-wide pip
# constraint file (PIP_CONSTRAINT=/dev/null), which could otherwise cap torch below the newest.
# COMPAT_ARGS: more options (tools/compat_matrix.py --help), e.g. --cells oldest, --discard.
COMPAT_DIR ?= $(HOME)/.cache/attention-profiled/compat
COMPAT_ARGS ?=
test-compat:
	COMPAT_DIR="$(COMPAT_DIR)" PIP_CONSTRAINT=/dev/null $(PYTHON) tools/compat_matrix.py $(COMPAT_ARGS)

clean:
	rm -rf _build .pytest_cache
