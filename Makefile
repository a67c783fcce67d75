.PHONY: demo demo-agent test test-fast lint bench bench-vs-trl setup setup-bench

VENV ?= .venv
PY := $(VENV)/bin/python

setup:
	@bash scripts/setup.sh

# The main job: the swarm demo on the embedded SmolLM2-135M-Instruct model.
demo: setup
	$(PY) -m agentjet.cli demo

# The second thing to try: a multi-turn tool agent (calculator + checker) learns through the same swarm.
demo-agent: setup
	$(PY) -m agentjet.cli demo --task calculator --out-dir runs/demo-agent

# TRL for the side-by-side benchmark (trl 1.16 works with this venv's transformers; nothing pinned changes).
setup-bench: setup
	$(PY) -m pip install -q -e ".[bench]"

# AgentJet vs TRL's GRPOTrainer by wall clock (default 20 min each x 2 seeds; see docs/benchmarks.md).
bench-vs-trl: setup-bench
	$(PY) benchmarks/vs_trl.py

# The whole test suite (lint + tests, SmolLM2 tests included).
test: setup
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m pytest -q --timeout=600

# Only the fast tests (tiny model).
test-fast: setup
	$(PY) -m pytest -q -m "not slow" --timeout=300

bench: setup
	$(PY) benchmarks/engine.py
