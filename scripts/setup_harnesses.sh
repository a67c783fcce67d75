#!/usr/bin/env bash
# Create or reuse .harnesses/: the pinned Claude Code and Codex CLIs from npm, for `make test-harnesses` and
# examples/{codex,claude_code}_task.py (docs/harnesses.md, "Running the real CLIs"). Both packages carry their native
# binary (Claude Code's postinstall copies it into place; Codex's wrapper starts it), so nothing is downloaded when
# they run. About 760 MB, hence opt-in and not part of `make setup`.
#
# Also the Claude Agent SDK (the `harnesses` extra, pinned to the release that bundles this Claude Code), into .venv:
# it only adds packages (mcp and its dependencies), and this script checks that before installing: a release that
# would change an installed package stops here instead.
# Idempotent: re-runs only when this script changed. Needs node >= 18 and npm on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${AGENTJET_HARNESSES_DIR:-.harnesses}
PY=${PYTHON:-.venv/bin/python}
CLAUDE_CODE_VERSION=2.1.328
CODEX_VERSION=0.169.0
stamp="$DIR/.agentjet-harnesses-setup"
want=$( (sha256sum scripts/setup_harnesses.sh pyproject.toml) | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "setup-harnesses: npm is not on PATH (install Node.js 18 or newer)" >&2; exit 1; }
echo "==> installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION and @openai/codex@$CODEX_VERSION into $DIR (~760 MB)"
mkdir -p "$DIR"
# Claude Code's package asks for node >= 22 only for its JavaScript fallback; the native binary needs no node.
npm install --prefix "$DIR" --no-fund --no-audit --save-exact --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
bin="$DIR/node_modules/.bin"
# The native binary replaces bin/claude.exe in the postinstall; run it again if npm skipped install scripts.
if ! "$bin/claude" --version 2>/dev/null | grep -q "^$CLAUDE_CODE_VERSION "; then
  node "$DIR/node_modules/@anthropic-ai/claude-code/install.cjs"
fi
probe=$(mktemp -d "$PWD/$DIR/.probe-XXXXXX")  # Codex writes its home on every start; not under /tmp (it warns)
trap 'rm -rf "$probe"' EXIT
got_claude=$(HOME="$probe" "$bin/claude" --version)
got_codex=$(HOME="$probe" CODEX_HOME="$probe" "$bin/codex" --version 2>/dev/null)
[ "$got_claude" = "$CLAUDE_CODE_VERSION (Claude Code)" ] || { echo "unexpected claude --version: $got_claude" >&2; exit 1; }
[ "$got_codex" = "codex-cli $CODEX_VERSION" ] || { echo "unexpected codex --version: $got_codex" >&2; exit 1; }
echo "==> $got_claude; $got_codex"

echo "==> the Claude Agent SDK (agentjet[harnesses]) into $(dirname "$(dirname "$PY")")"
report=$(mktemp)
"$PY" -m pip install -q --disable-pip-version-check --dry-run --report "$report" -e ".[harnesses]"
"$PY" - "$report" <<'PYEOF'
import importlib.metadata as md
import json
import sys

changed = []
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name == "agentjet":
        continue
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        continue
    if have != version:
        changed.append(f"{name} {have} -> {version}")
if changed:
    sys.exit("setup-harnesses: the harnesses extra would change installed packages: " + ", ".join(changed))
PYEOF
rm -f "$report"
"$PY" -m pip install -q --disable-pip-version-check -e ".[harnesses]"
"$PY" -c "import claude_agent_sdk as s, claude_agent_sdk._cli_version as c; print(f'==> claude-agent-sdk {s.__version__} (bundles Claude Code {c.__cli_version__})')"
echo "$want" > "$stamp"
echo "==> $DIR ready: $bin/claude, $bin/codex"
