"""The client stands alone: every module of ``agentjet.client``, imported in a clean interpreter, loads nothing of
the server (the packages the "client-floor" contract in pyproject.toml forbids) and neither torch nor
transformers. import-linter checks the imports as written; this checks what an interpreter really loads (package
``__init__`` files and imports made at run time included)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOAD = """
import importlib, json, pkgutil, sys
mods = sys.argv[1:]
if mods == ["agentjet.client.*"]:
    import agentjet.client
    mods = ["agentjet.client"] + sorted(m.name for m in pkgutil.walk_packages(agentjet.client.__path__,
                                                                             "agentjet.client."))
for m in mods:
    importlib.import_module(m)
print(json.dumps({"imported": mods, "loaded": sorted(sys.modules)}))
"""


def forbidden() -> list[str]:
    """What the client may not load: the contract's list, read from pyproject.toml (one list for both checks)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (floor,) = [c for c in contracts if c["id"] == "client-floor"]
    return list(floor["forbidden_modules"])


def load(*modules: str) -> dict[str, list[str]]:
    """Import ``modules`` in a fresh, isolated interpreter (``-I``: no PYTHON* variables, no user site, no
    current directory on the path); what it loaded."""
    done = subprocess.run([sys.executable, "-I", "-c", LOAD, *modules], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def offenders(loaded: list[str]) -> list[str]:
    banned = forbidden()
    return [m for m in loaded if any(m == b or m.startswith(b + ".") for b in banned)]


def test_every_client_module_loads_nothing_of_the_server() -> None:
    got = load("agentjet.client.*")
    assert {"agentjet.client.driver", "agentjet.client.scheduled", "agentjet.client.runner",
            "agentjet.client.team", "agentjet.client.sync"} <= set(got["imported"])
    assert {"torch", "transformers", "agentjet.settings", "agentjet.observe"} <= set(forbidden())
    assert offenders(got["loaded"]) == []
    assert "agentjet.protocol" in got["loaded"] and "agentjet.runtime.clock" in got["loaded"]


def test_the_check_sees_a_server_module_loaded() -> None:
    """The same check on a module of the server's side: it finds what that module drags in (so the test above
    could fail)."""
    bad = offenders(load("agentjet.observe.learncurve")["loaded"])
    assert "agentjet.observe" in bad and "agentjet.settings" in bad
