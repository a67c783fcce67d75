.PHONY: demo test test-fast lint bench setup

VENV ?= .venv
PY := $(VENV)/bin/python

setup:
	@bash scripts/setup.sh

# The main job: the swarm demo on the embedded SmolLM2-135M-Instruct model.
demo: setup
	$(PY) -m agentjet.cli demo

# The whole test suite (lint + tests, SmolLM2 tests included).
test: setup
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m pytest -q --timeout=600

# Only the fast tests (tiny model).
test-fast: setup
	$(PY) -m pytest -q -m "not slow" --timeout=300

bench: setup
	$(PY) benchmarks/engine.py
