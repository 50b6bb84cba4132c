# venturi_redis: `make` (or `make help`) lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The oldest releases of what the transport reaches into (docs/operations.md,
# "Supported redis-py"): redis-py's floor is read from pyproject.toml's pin;
# hiredis's is redis-py's own (its `hiredis` extra).
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
REDIS_FLOOR := $(shell sed -n 's/.*"redis\[hiredis\]>=\([0-9.]*\),.*/\1/p' pyproject.toml)
OLDEST_PINS := redis[hiredis]==$(REDIS_FLOOR) hiredis==3.2.0
# The contract tests of every path that touches redis-py's internals.
OLDEST_TESTS := tests/test_redispy.py tests/test_lane.py tests/test_fastpack.py tests/test_sync.py \
	tests/test_dedup.py tests/test_wake.py tests/test_worker.py tests/test_cluster.py tests/test_tls.py

.DEFAULT_GOAL := help
.PHONY: help install oldest example test test-oldest lint typecheck check bench clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the package with its dev tools

$(OLDEST_STAMP): pyproject.toml
	@test -n "$(REDIS_FLOOR)" || { echo "no redis[hiredis]>=X,<Y pin found in pyproject.toml" >&2; exit 1; }
	$(PY) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --upgrade pip
	$(OLDEST)/bin/pip install -q -e ".[dev]" "$(word 1,$(OLDEST_PINS))" "$(word 2,$(OLDEST_PINS))"
	@touch $(OLDEST_STAMP)

oldest: $(OLDEST_STAMP) ## Create .venv-oldest: the package on the oldest redis-py and hiredis it supports

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

test-oldest: $(OLDEST_STAMP) ## The redis-py contract tests on the oldest supported redis-py and hiredis
	$(OLDEST)/bin/python -c "import redis, hiredis; print('oldest: redis-py', redis.__version__, 'hiredis', hiredis.__version__)"
	$(OLDEST)/bin/python -m pytest -q $(OLDEST_TESTS)

check: lint typecheck test test-oldest ## Everything CI runs

bench: $(STAMP) ## Run the benchmarks (see benchmarks/README.md)
	$(BIN)/python benchmarks/run.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) $(OLDEST) .pytest_cache .mypy_cache .ruff_cache dist build
