PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: install demo test check lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## make demo: install, then run the fraud example on embedded defaults and print results
demo: $(STAMP)
	$(BIN)/python -m examples.fraud.demo

## make test: install dev dependencies, then run the whole suite
test: $(STAMP)
	$(BIN)/python -m pytest

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
