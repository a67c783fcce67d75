#!/usr/bin/env bash
# Create or reuse .venv-cookbook: Thinking Machines' tinker-cookbook 0.5.8, unchanged, with the SDK at the server's pin
# (tinker==0.38.0), in a venv of its own. Its recipes run as a new user would run them, against `ajet server
# --tinker-key ...` (docs/tinker.md, "Pointing a cookbook recipe at AgentJet"; `make test-cookbook`). It cannot
# share AgentJet's venv: the cookbook pins transformers<=5.5.4. The two talk only over the Tinker API.
# Idempotent: re-runs only when this script changed. About 1.5 GB and a few minutes on first run.
#
# 0.5.8, not 0.6.x: 0.6 needs tml-renderers>=0.4.1, which the registry does not have. torch first (the CPU build;
# an open range could pull a multi-GB CUDA build). The math-rl extra: math_rl's graders (math-verify, sympy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AGENTJET_COOKBOOK_VENV:-.venv-cookbook}
COOKBOOK_VERSION=0.5.8
TINKER_VERSION=0.38.0
TORCH_VERSION=2.13.0
stamp="$VENV/.agentjet-cookbook-setup"
want=$(sha256sum scripts/setup_cookbook.sh | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "==> setting up $VENV with tinker-cookbook==$COOKBOOK_VERSION, tinker==$TINKER_VERSION (a few minutes, ~1.5 GB)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "torch==$TORCH_VERSION"
"${pip[@]}" install "tinker-cookbook[math-rl]==$COOKBOOK_VERSION" "tinker==$TINKER_VERSION" "torch==$TORCH_VERSION"
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md

import tinker_cookbook.recipes.chat_sl.train  # noqa: F401  (the recipes make test-cookbook runs)
import tinker_cookbook.recipes.math_rl.train  # noqa: F401
import tinker_cookbook.weights  # noqa: F401

assert md.version("tinker") == "0.38.0", md.version("tinker")
print(f"==> tinker-cookbook {md.version('tinker-cookbook')}, tinker {md.version('tinker')}, "
      f"transformers {md.version('transformers')}, torch {md.version('torch')}")
PYEOF
echo "$want" > "$stamp"
echo "==> $VENV ready (make test-cookbook runs its recipes against ajet server)"
