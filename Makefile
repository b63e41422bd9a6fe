# Two commands for a newcomer: `make demo` (set-up + sample data → store → console) and
# `make test` (set-up + the whole test suite). Each creates its own virtualenv in .venv.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint browser-deps clean

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
