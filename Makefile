# venturi_redis: `make` (or `make help`) lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install example test lint typecheck check bench clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the package with its dev tools

example: $(STAMP) ## Run examples/bookmarks.py end to end (REDIS_URL, else the embedded memory://)
	$(BIN)/python examples/bookmarks.py

test: $(STAMP) ## Run the whole test suite (starts its own redis-server processes)
	$(BIN)/python -m pytest -q

lint: $(STAMP) ## ruff (lint and format), and the import contracts (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP) ## mypy --strict on the package
	$(BIN)/mypy

check: lint typecheck test ## Everything CI runs

bench: $(STAMP) ## Run the benchmarks (see benchmarks/README.md)
	$(BIN)/python benchmarks/run.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
