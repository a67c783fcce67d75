"""The layering contracts (import-linter, ``[tool.importlinter]`` in pyproject.toml): the tree keeps them, and a
planted upward import, an impure import into ``tracking``, a cycle through a ``TYPE_CHECKING`` import, a web
import in the server's domain and a server import on the client's floor each break them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentjet

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(agentjet.__file__).resolve().parent
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"


def lint(src_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src_root)}
    return subprocess.run([LINT_IMPORTS, str(ROOT / "pyproject.toml"), "--no-cache"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=src_root)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package to plant imports in."""
    shutil.copytree(SRC, tmp_path / "agentjet", ignore=shutil.ignore_patterns("__pycache__", "static"))
    return tmp_path


def plant(tree: Path, module: str, line: str) -> None:
    path = tree / "agentjet" / module
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_the_tree_keeps_every_contract() -> None:
    result = lint(SRC.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_copy_keeps_them_too(tree: Path) -> None:  # the planting tests below start from a clean copy
    assert lint(tree).returncode == 0


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("engines/base.py", "import agentjet.server.swarm", "Floors"),  # an engine reaching up into the server
    ("settings/fields.py", "from agentjet.client import SwarmClient", "Floors"),
    ("tracking/__init__.py", "import agentjet.settings", "tracking and algorithms are pure"),
    ("algorithms/loss.py", "import httpx", "tracking and algorithms are pure"),
    ("server/store/sqlite.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import agentjet.server.swarm",
     "No import cycles inside a package"),
    ("server/swarm.py", "from fastapi import Request", "Only server.http imports a web framework"),
    ("server/training/pool.py", "import starlette", "Only server.http imports a web framework"),
    ("generators/vllm/client.py", "import uvicorn", "Only server.http imports a web framework"),
    ("server/training/loop.py", "import agentjet.server.episodes.ingest", "Server floors"),  # the core reaching up
    # the client's floor: the record the driver made once came from observe (which pulls in the settings)
    ("client/driver.py", "from agentjet.observe.learncurve import LearnCurve", "The client stands alone"),
    ("tasks/addition.py", "import torch", "The client stands alone"),  # a task needing the server's dependencies
    ("schedule/stopping.py", "from agentjet.settings import ServerConfig", "The client stands alone"),
    ("runtime/clock.py", "import agentjet.runtime.launch", "The client stands alone"),  # reached through the clock
])
def test_a_planted_import_breaks_its_contract(tree: Path, module: str, line: str, contract: str) -> None:
    plant(tree, module, line)
    result = lint(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [ln for ln in result.stdout.splitlines() if " BROKEN" in ln]
    assert any(ln.startswith(contract) for ln in broken), result.stdout
