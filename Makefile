# Two commands on a fresh machine: `make demo` and `make test`.
# Both bootstrap .venv by themselves: torch first (pinned, so pip takes the CPU
# wheel on this disk instead of a multi-GB CUDA build), then the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
TORCH_PIN ?= torch==2.13.0
PIP := $(BIN)/pip install --disable-pip-version-check --progress-bar on

.PHONY: demo test lint types bench venv clean

# `make demo` needs only the runtime: torch (CPU) and tensorhub's own dependencies.
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "make: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: installing $(TORCH_PIN) and tensorhub's runtime dependencies into $(VENV)"
	@$(PIP) "$(TORCH_PIN)" -e .
	@$(BIN)/python -c "import tensorhub" && touch $(RUN_STAMP)

# `make test` adds the test, lint and type tools, and UCX's bindings (its tests run on loopback).
$(DEV_STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "make: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: installing $(TORCH_PIN), tensorhub and its dev and UCX extras into $(VENV)"
	@$(PIP) "$(TORCH_PIN)" -e '.[dev,ucx]'
	@$(BIN)/python -c "import tensorhub, pytest" && touch $(DEV_STAMP) $(RUN_STAMP)

venv: $(DEV_STAMP)

demo: $(RUN_STAMP)
	$(BIN)/tensorhub demo

# Two workers: most tests wait on processes, sockets and timers, so on 2 cores the suite
# takes about half the time of one worker (610 s against 1149 s, docs/results.md). Tests
# that start a Ray cluster share one worker (xdist_group "ray").
TEST_WORKERS ?= 2

# Each test's start and end go to .test-progress as they happen (tests/progress.py): a run
# killed by the timeout loses pytest's summary, and this names what it was in, with seeds.
test: $(DEV_STAMP)
	rm -f .test-progress
	TENSORHUB_TEST_PROGRESS=$(CURDIR)/.test-progress timeout -k 30 1200 \
		$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup \
		|| { $(BIN)/python -m tests.progress .test-progress; exit 1; }
	$(BIN)/ruff check tensorhub sim tests bench examples
	$(BIN)/ruff format --check tensorhub sim tests bench examples
	$(BIN)/mypy

lint: $(DEV_STAMP)
	$(BIN)/ruff check tensorhub sim tests bench examples

types: $(DEV_STAMP)
	$(BIN)/mypy

bench: $(DEV_STAMP)
	$(BIN)/python bench/p2p.py --size 1GiB --json out/p2p.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
