# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# The CPU build on this machine's disk; GPU users install the torch that matches their CUDA first.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.dreams-nas-installed

.PHONY: install test demo lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: letting pip resolve it on its own downloads a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# ruff, then the layer contracts of pyproject.toml ([tool.importlinter]).
lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/dreams-nas demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
