# Two commands on a fresh machine: `make demo` and `make test`.
# Both bootstrap .venv by themselves: torch first (pinned, so pip takes the CPU
# wheel on this disk instead of a multi-GB CUDA build), then the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test lint types bench venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH_PIN)"
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH_PIN)" -e '.[dev,ucx]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/tensorhub demo

test: $(STAMP)
	timeout -k 30 1200 $(BIN)/python -m pytest
	$(BIN)/ruff check tensorhub sim tests bench
	$(BIN)/ruff format --check tensorhub sim tests bench
	$(BIN)/mypy

lint: $(STAMP)
	$(BIN)/ruff check tensorhub sim tests bench

types: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/p2p.py --size 1GiB --json out/p2p.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
