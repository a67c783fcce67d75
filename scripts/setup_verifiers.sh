#!/usr/bin/env bash
# Create or reuse .venv-verifiers: verifiers 0.4 (PrimeIntellect's environment library) in a venv of its own, in
# which `ajet verifiers` runs its worker (src/agentjet/apps/verifiers/worker.py). It cannot share AgentJet's venv:
# verifiers pins openai<3 and AgentJet uses openai 3. The main .venv stays as it is; the two talk over a socket.
# Idempotent: re-runs only when this script changed. About 0.6 GB and a minute or two on first run.
#
# uv goes into the venv too: verifiers sets up its harness program (a PEP 723 script) with `uv sync --script`
# from PyPI on first use, and the worker puts this venv's bin first on PATH. Without it verifiers would fetch
# uv's installer from astral.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AGENTJET_VERIFIERS_VENV:-.venv-verifiers}
VERIFIERS_VERSION=0.4.0
UV_VERSION=0.13.9
stamp="$VENV/.agentjet-verifiers-setup"
want=$(sha256sum scripts/setup_verifiers.sh | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "==> setting up $VENV with verifiers==$VERIFIERS_VERSION (first run takes a minute or two, ~0.6 GB)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "verifiers==$VERIFIERS_VERSION" "uv==$UV_VERSION"
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md

import verifiers.v1 as vf

for name in ("EvalClientConfig", "ModelContext", "SubprocessConfig", "load_environment", "resolve_env_config"):
    assert hasattr(vf, name), f"verifiers.v1 has no {name}: the worker is written against verifiers 0.4.0"
from verifiers.v1.harnesses.null import NullHarness  # noqa: F401  (the harness the worker uses by default)

print(f"==> verifiers {md.version('verifiers')}, openai {md.version('openai')}, uv {md.version('uv')}")
PYEOF
echo "$want" > "$stamp"
echo "==> $VENV ready (ajet verifiers uses $VENV/bin/python; --verifiers-python to change)"
