# venturi_redis: `make` (or `make help`) lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The oldest releases of what the transport reaches into (docs/operations.md,
# "Supported redis-py"): redis-py's and hiredis's floors are read from
# pyproject.toml's pins.
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
REDIS_FLOOR := $(shell sed -n 's/.*"redis\[hiredis\]>=\([0-9.]*\),.*/\1/p' pyproject.toml)
HIREDIS_FLOOR := $(shell sed -n 's/.*"hiredis>=\([0-9.]*\)".*/\1/p' pyproject.toml)
OLDEST_PINS := redis[hiredis]==$(REDIS_FLOOR) hiredis==$(HIREDIS_FLOOR)
# On the oldest: the files that exercise redis-py's internals (the fence and
# its gates, the lane, hiredis packing, the sync client's direct enqueue, TLS,
# Sentinel, the dedup merge's WATCH, the wake-up's pipelined claim, the
# worker, the bounded pools and the server's maxclients) and the contract suite's core (enqueue to finish, batches' pipelines,
# journals and events as streams, offload results by pub/sub, lost replies),
# on a single Redis and the embedded server: not the whole suite again. Redis
# Cluster refuses to start below its own floor (-m "not cluster"; the gate's
# test runs here).
OLDEST_TESTS := tests/test_redispy.py tests/test_redispy_gates.py tests/test_lane.py tests/test_fastpack.py \
	tests/test_sync.py tests/test_tls.py tests/test_sentinel.py tests/test_dedup.py tests/test_wake.py \
	tests/test_worker.py tests/test_core.py tests/test_batching.py tests/test_events.py tests/test_journal.py \
	tests/test_offload.py tests/test_resend.py tests/test_connections.py
# Redis Cluster's floor (CLUSTER_FLOOR in venturi_redis/_transport/cluster.py):
# the Cluster tests run on that release too, in .venv-cluster-oldest, unless
# .venv's newest is that very release (then `make test` already ran them on it).
CLUSTER_OLDEST := .venv-cluster-oldest
CLUSTER_OLDEST_STAMP := $(CLUSTER_OLDEST)/.installed
CLUSTER_FLOOR := $(shell sed -n 's/^CLUSTER_FLOOR = (\([0-9]*\), \([0-9]*\))/\1.\2.0/p' venturi_redis/_transport/cluster.py)
CLUSTER_TESTS := tests/test_cluster.py tests/test_cluster_reshard.py tests/test_cluster_sharded.py tests/test_dedup.py tests/test_tls.py tests/test_resend.py
# What the built wheel must install beside (docs/operations.md): each resolved
# on its own, at the release line an app already has (pip install --dry-run;
# unpinned, pip would rather fall back to a years-old peer than a lower redis-py).
# SAQ's redis-py pin (<8.0) is its `redis` extra's, which a SAQ-on-Redis app has.
PEERS := "rq>=3.0" "celery[redis]>=5.5" "saq[redis]>=0.26" "redis==$(basename $(REDIS_FLOOR)).*"

.DEFAULT_GOAL := help
.PHONY: help install oldest example test test-server test-python test-managed test-oldest test-cluster-oldest test-django6 resolves lint typecheck check bench clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the package with its dev tools

$(OLDEST_STAMP): pyproject.toml
	@test -n "$(REDIS_FLOOR)" -a -n "$(HIREDIS_FLOOR)" || { echo "no redis[hiredis]>=X,<Y or hiredis>=X pin found in pyproject.toml" >&2; exit 1; }
	$(PY) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --upgrade pip
	$(OLDEST)/bin/pip install -q -e ".[dev]" "$(word 1,$(OLDEST_PINS))" "$(word 2,$(OLDEST_PINS))"
	@touch $(OLDEST_STAMP)

oldest: $(OLDEST_STAMP) ## Create .venv-oldest: the package on the oldest redis-py and hiredis it supports

example: $(STAMP) ## Run examples/bookmarks.py end to end (REDIS_URL, else the embedded memory://)
	$(BIN)/python examples/bookmarks.py

# The pytest stage of `make test` (and of `make test-server`): the whole
# suite. The slow tests (`-m slow`: processes, chaos, failover;
# tests/conftest.py SLOW_MODULES) mostly wait on processes and servers: they
# run beside the rest (BESIDE), in a second pytest whose log is printed when
# both have ended.
BESIDE = $(BIN)/python -m pytest -q -p no:cacheprovider -m slow
BESIDE_NAME = the slow tests (-m slow: processes, chaos, failover)
PYTEST_STAGE = log=$$(mktemp); \
	( $(BESIDE) ) > "$$log" 2>&1 & slow=$$!; \
	$(BIN)/python -m pytest -q -m "not slow"; fast=$$?; \
	wait $$slow; status=$$?; \
	echo "== $(BESIDE_NAME)"; cat "$$log"; rm -f "$$log"; \
	[ $$fast -eq 0 ] && [ $$status -eq 0 ]

# `make test`: the managed set-ups follow the slow tests, beside the rest
# too (the slow tests end in about 40% of the rest's time; the managed runs
# then take about 2 minutes, which after the rest made CI 1.5-2 minutes
# longer on a slow machine).
test: BESIDE = $(BIN)/python -m pytest -q -p no:cacheprovider -m slow; slow=$$?; \
	$(MAKE) --no-print-directory test-managed; managed=$$?; \
	[ $$slow -eq 0 ] && [ $$managed -eq 0 ]
test: BESIDE_NAME = the slow tests (-m slow: processes, chaos, failover), then the managed set-ups
test: $(STAMP) ## Run the whole test suite (starts its own redis-server processes), the managed set-ups beside it
	@$(PYTEST_STAGE)

# Another server release (docs/operations.md, "Servers tested"): the same
# pytest stage with REDIS_BIN, a directory holding that build's redis-server
# (for Valkey, a redis-server link to valkey-server), first on PATH; every
# server the suite starts (single, TLS, Cluster, Sentinel) is that one.
test-server: $(STAMP) ## The suite on another redis-server: make test-server REDIS_BIN=DIR (DIR/redis-server first on PATH)
	@test -n "$(REDIS_BIN)" || { echo "make test-server: say which server, REDIS_BIN=DIR (a directory holding redis-server)" >&2; exit 1; }
	@test -x "$(REDIS_BIN)/redis-server" -a -f "$(REDIS_BIN)/redis-server" || { echo "make test-server: no redis-server in REDIS_BIN=$(REDIS_BIN)" >&2; exit 1; }
	@export PATH="$(abspath $(REDIS_BIN)):$$PATH"; \
	echo "test-server: $$(command -v redis-server): $$(redis-server --version)"; \
	$(PYTEST_STAGE)

# Another Python (docs/operations.md, "Pythons tested"): the same pytest stage
# as test-server, in .venv-py<major><minor> (.venv-py313), built with PYTHON
# and stamped like .venv; BIN is that virtualenv's for the stage. The stamp
# is made by a make of its own, which does not take test-python's BIN.
PYTHON_TAG = $(if $(PYTHON),$(shell "$(PYTHON)" -c 'import sys; print("%d%d" % sys.version_info[:2])' 2>/dev/null))
PYVENV = .venv-py$(PYTHON_TAG)
PYVENV_STAMP = $(PYVENV)/.installed

ifneq ($(PYTHON_TAG),)
$(PYVENV_STAMP): pyproject.toml
	"$(PYTHON)" -m venv $(PYVENV)
	$(PYVENV)/bin/pip install -q --upgrade pip
	$(PYVENV)/bin/pip install -q -e ".[dev]"
	@touch $(PYVENV_STAMP)
endif

test-python: BIN = $(PYVENV)/bin
test-python: ## The suite on another Python: make test-python PYTHON=/path/to/python3.X (in .venv-py3X)
	@test -n "$(PYTHON)" || { echo "make test-python: say which Python, PYTHON=/path/to/python3.X" >&2; exit 1; }
	@test -n "$(PYTHON_TAG)" || { echo "make test-python: PYTHON=$(PYTHON) does not run" >&2; exit 1; }
	@$(MAKE) --no-print-directory $(PYVENV_STAMP)
	@echo "test-python: $(PYTHON): $$($(BIN)/python --version)"; \
	$(PYTEST_STAGE)

# The contract suite again on each server set-up of managed Redis and
# least-privilege users (tests/servers.py, MANAGED_SETUPS; docs/deployment.md):
# CONFIG renamed away, `+@all -@dangerous`, and that with `+info`.
MANAGED_SETUPS := noconfig acl acl+info
# The three runs go side by side (each starts its own redis-server on free
# ports; they wait on Redis and on each other's sleeps as much as on a core),
# each into a log of its own, printed in order once all have ended.
test-managed: $(STAMP) ## The contract suite on CONFIG-less and ACL-restricted redis-servers
	@logs=$$(mktemp -d); pids=""; \
	for setup in $(MANAGED_SETUPS); do \
		VENTURI_REDIS_SETUP=$$setup $(BIN)/python -m pytest -q -p no:cacheprovider > "$$logs/$$setup.log" 2>&1 & \
		pids="$$pids $$!"; \
	done; \
	status=0; for pid in $$pids; do wait $$pid || status=1; done; \
	for setup in $(MANAGED_SETUPS); do echo "== VENTURI_REDIS_SETUP=$$setup"; cat "$$logs/$$setup.log"; done; \
	rm -rf "$$logs"; exit $$status

lint: $(STAMP) ## ruff (lint and format), and the import contracts (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP) ## mypy --strict on the package
	$(BIN)/mypy

test-oldest: $(OLDEST_STAMP) ## The redis-py contract tests on the oldest supported redis-py and hiredis
	$(OLDEST)/bin/python -c "import redis, hiredis; print('oldest: redis-py', redis.__version__, 'hiredis', hiredis.__version__)"
	$(OLDEST)/bin/python -m pytest -q -p no:cacheprovider -m "not cluster" $(OLDEST_TESTS)

# Real Django 6 (docs/integrations.md, "Django 6"): .venv-django6, on a Python
# 3.12 (Django 6's floor; DJANGO6_PYTHON, else python3.12 or pyenv's 3.12.x),
# holds the package, the dev tools but Django 5.2 and the django-tasks backport,
# and the newest Django 6 instead; Django's own tests of its Tasks framework
# (tests/tasks/ of that release's sdist) are unpacked beside it. The Django
# tests run there against django.tasks itself, with Django's own held to
# VenturiBackend (tests/test_django_own.py).
DJANGO6 := .venv-django6
DJANGO6_STAMP := $(DJANGO6)/.installed
DJANGO6_SPEC ?= django>=6,<7
DJANGO6_PYTHON ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12.*/bin/python; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12); print(sys.executable)' 2>/dev/null && break; done)
DJANGO6_TESTS := tests/test_django.py tests/test_django_probes.py tests/test_django_upstream.py tests/test_django_own.py

$(DJANGO6_STAMP): pyproject.toml
	@test -n "$(DJANGO6_PYTHON)" || { echo "make test-django6: no Python 3.12 found (python3.12, ~/.pyenv/versions/3.12.*): Django 6 needs one; name it with DJANGO6_PYTHON=/path/to/python3.12" >&2; exit 1; }
	@"$(DJANGO6_PYTHON)" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else "DJANGO6_PYTHON=$(DJANGO6_PYTHON) is Python %d.%d: Django 6 needs 3.12+" % sys.version_info[:2])'
	rm -rf $(DJANGO6)
	"$(DJANGO6_PYTHON)" -m venv $(DJANGO6)
	$(DJANGO6)/bin/pip install -q --upgrade pip
	$(DJANGO6)/bin/python -c "import re, tomllib; \
		dev = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev']; \
		print('\n'.join(d for d in dev if re.split(r'[^A-Za-z0-9_.-]', d)[0].lower() not in ('django', 'django-tasks')))" \
		> $(DJANGO6)/dev-requirements.txt
	$(DJANGO6)/bin/pip install -q -e . "$(DJANGO6_SPEC)" -r $(DJANGO6)/dev-requirements.txt
	$(DJANGO6)/bin/python -c "import importlib.util as u, sys; sys.exit('django-tasks must not be in $(DJANGO6)' if u.find_spec('django_tasks') else 0)"
	$(DJANGO6)/bin/pip download -q --no-deps --no-binary :all: --dest $(DJANGO6)/sdist \
		"django==$$($(DJANGO6)/bin/python -c 'import django; print(django.__version__)')"
	mkdir -p $(DJANGO6)/django-tests
	tar -xzf $(DJANGO6)/sdist/django-*.tar.gz -C $(DJANGO6)/django-tests --strip-components=2 --wildcards '*/tests/tasks/*'
	@test -f $(DJANGO6)/django-tests/tasks/test_tasks.py || { echo "no tests/tasks/ in Django's sdist" >&2; exit 1; }
	@touch $(DJANGO6_STAMP)

test-django6: ## The Django tests on real Django 6 (Python 3.12, .venv-django6), and Django's own tasks tests
	@$(MAKE) --no-print-directory $(DJANGO6_STAMP)
	@$(DJANGO6)/bin/python -c "import sys, django; print('django6:', sys.executable, sys.version.split()[0], 'Django', django.__version__)"
	VENTURI_DJANGO_TESTS=$(abspath $(DJANGO6)/django-tests) $(DJANGO6)/bin/python -m pytest -q -p no:cacheprovider $(DJANGO6_TESTS)

$(CLUSTER_OLDEST_STAMP): pyproject.toml venturi_redis/_transport/cluster.py
	@test -n "$(CLUSTER_FLOOR)" || { echo "no CLUSTER_FLOOR = (X, Y) in venturi_redis/_transport/cluster.py" >&2; exit 1; }
	$(PY) -m venv $(CLUSTER_OLDEST)
	$(CLUSTER_OLDEST)/bin/pip install -q --upgrade pip
	$(CLUSTER_OLDEST)/bin/pip install -q -e ".[dev]" "redis[hiredis]==$(CLUSTER_FLOOR)"
	@touch $(CLUSTER_OLDEST_STAMP)

test-cluster-oldest: $(STAMP) ## The Redis Cluster tests on the oldest redis-py that runs Cluster
	@if [ "$$($(BIN)/python -c 'import redis; print(redis.__version__)')" = "$(CLUSTER_FLOOR)" ]; then \
		echo "cluster-oldest: redis-py $(CLUSTER_FLOOR) is .venv's own: make test ran the Cluster tests on it"; \
	else \
		$(MAKE) --no-print-directory $(CLUSTER_OLDEST_STAMP) && \
		$(CLUSTER_OLDEST)/bin/python -c "import redis; print('cluster-oldest: redis-py', redis.__version__)" && \
		$(CLUSTER_OLDEST)/bin/python -m pytest -q -p no:cacheprovider -m cluster $(CLUSTER_TESTS); \
	fi

resolves: $(STAMP) ## pip resolves the built wheel beside rq, celery[redis], saq, and redis at the floor (dry run)
	rm -rf dist && $(BIN)/python -m build -q --wheel --no-isolation --outdir dist . >/dev/null
	@for peer in $(PEERS); do \
		$(BIN)/pip install -q --dry-run --ignore-installed --report dist/report.json dist/*.whl "$$peer" \
			|| { echo "venturi-redis does not install beside $$peer" >&2; exit 1; }; \
		$(BIN)/python -c "import json, re, sys; peer = sys.argv[1]; name = re.split(r'[^A-Za-z0-9_.-]', peer)[0]; \
			got = {p['metadata']['name'].lower(): p['metadata']['version'] for p in json.load(open('dist/report.json'))['install']}; \
			print(f'resolves beside {peer}:' + ('' if name == 'redis' else f' {name} {got[name]},') + f' redis {got[\"redis\"]}, hiredis {got[\"hiredis\"]}')" "$$peer"; \
	done

check: lint typecheck test test-oldest test-cluster-oldest test-django6 resolves ## Everything CI runs

bench: $(STAMP) ## Run the benchmarks (see benchmarks/README.md)
	$(BIN)/python benchmarks/run.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) $(OLDEST) $(CLUSTER_OLDEST) $(DJANGO6) .venv-py[0-9]* .pytest_cache .mypy_cache .ruff_cache dist build
