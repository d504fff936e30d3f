PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
# make demo installs only what the demo needs (the `demo` extra), not the dev set
DEMO_STAMP := $(VENV)/.installed-demo
# the dashboard's browser tests drive Debian's chromium (Playwright never downloads one here)
CHROMIUM := /usr/bin/chromium

.PHONY: install demo test check lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

## make demo: install what the demo needs, then run the fraud example on embedded defaults
demo: $(DEMO_STAMP)
	$(BIN)/python -m examples.fraud.demo

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	command -v apt-get >/dev/null && $$SUDO apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null || \
	echo "make test: could not install chromium (apt-get install chromium as root); the browser tests will skip"

## make test: install dev dependencies (and chromium for the browser tests), then run the whole suite
## on two workers (pytest-xdist), a test file to a worker: its module fixtures are built once
test: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -n 2 --dist loadfile

## make check: lint, format check, type check and the import contracts (pyproject.toml)
check: $(STAMP)
	$(BIN)/ruff check src tests examples bench
	$(BIN)/ruff format --check src tests examples bench
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix src tests examples bench
	$(BIN)/ruff format src tests examples bench

bench: $(STAMP)
	$(BIN)/python bench/online_inprocess.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .kairos examples/fraud/data
