# Thin targets; each works from a fresh clone. See README.md.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PRESET ?= auto
TEST_JOBS ?= auto
OUT ?= _build/gpu-run
# Seconds `make gpu-run` may spend (tools/gpu_run.py --budget): a lent machine allows about 10
# minutes a command; the A100 workflow passes one that covers every phase.
BUDGET ?= 540
# Where `make gpu-wheels` puts the book stack's wheels, and packages to add to them (e.g. pandas
# matplotlib, for a GPU machine that lacks them).
WHEELS ?= .wheels
WHEELS_EXTRA ?=
# Pinned where the project installs torch itself (CPU machines, CI): torch 2.13's own Triton pin.
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.7.1
# Optional: a pip index for PyTorch's CPU-only wheels (see README), e.g. on a Linux laptop.
TORCH_INDEX_URL ?=

.PHONY: setup test test-haswell test-book test-sweep book notebooks gpu-run gpu-wheels gpu-import clean
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

# The Triton and contract tests again with OpenBLAS's Haswell kernels, which AMD machines and
# OPENBLAS_CORETYPE=Haswell select: the interpreter's tl.dot is NumPy's matmul, and which kernel
# OpenBLAS picks changes its rounding (kernels/reference.py's float32 bound must not depend on it).
test-haswell: setup
	OPENBLAS_CORETYPE=Haswell $(PY) -m pytest -n $(TEST_JOBS) --dist loadscope -m "not book and not sweep" \
	  tests/triton tests/attention/test_contract.py

# The tests that take minutes: every chapter and exercise executed (cpu preset, through make
# book's cache), the HTML built with -W, the pages opened in headless Chromium, the chapters
# and the GPU run's dry run against a fixture recording.
test-book: setup
	$(PY) -m pytest -m "book"

# The whole compile sweep: every config the autotuner may keep, compiled for sm_80 and sm_90
# (six minutes of a core on a cold Triton cache). `make test` compiles its covering subset (per
# kernel and target, the kept config nearest the shared-memory limit, and one that must not
# fit); run this after editing kernels/triton/configs.py or the kernels (CI runs it weekly).
test-sweep: setup
	$(PY) -m pytest -m "sweep"

# Write book/**/*.ipynb from their sources in notebooks/ (edit the .py files, not the .ipynb).
notebooks: setup
	$(PY) -m tools.book.convert

book: setup
	$(PY) -m tools.book.execute --preset $(PRESET) --build

# On a machine with a GPU: the GPU tests, the benchmark's core points, the chapters on the cuda
# preset, the full benchmark and the HTML, in that order until $(BUDGET) seconds are spent,
# packed into $(OUT)/gpu-run.tar.gz with a manifest. Without a GPU it stops and says so
# (tools/gpu_run.py run OUT --dry-run packs stand-ins).
gpu-run: setup
	$(PY) tools/gpu_run.py run "$(OUT)" --budget $(BUDGET)

# For a GPU machine with no package index: the book stack (requirements-gpu-run.txt) as CPython
# 3.12 manylinux wheels in $(WHEELS)/, to carry there (MAINTAINING.md, "On a lent GPU machine").
gpu-wheels:
	$(PYTHON) -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  -d "$(WHEELS)" -r requirements-gpu-run.txt $(WHEELS_EXTRA)
	@du -sh "$(WHEELS)"

# Back on any machine: an archive -> book/data/recorded/<gpu>/ and book/data/bench/<gpu>.json
# (a partial archive imports what it holds and says what it lacks).
gpu-import: setup
	@test -n "$(ARCHIVE)" || { echo "usage: make gpu-import ARCHIVE=path/to/gpu-run.tar.gz"; exit 2; }
	$(PY) tools/gpu_run.py import "$(ARCHIVE)"

clean:
	rm -rf _build .pytest_cache
