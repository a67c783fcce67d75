"""examples/tinker_rl_loop.py runs against the server, with only the official SDK."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.tinker_api.conftest import KEY

pytestmark = pytest.mark.server
pytest.importorskip("tinker")
ROOT = Path(__file__).resolve().parents[2]


def test_the_rl_loop_example_runs(tinker_server) -> None:
    srv = tinker_server()
    out = subprocess.run([sys.executable, str(ROOT / "examples/tinker_rl_loop.py"), "--base-url", srv.url,
                          "--api-key", KEY, "--steps", "2", "--batch", "2", "--group", "2", "--max-tokens", "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "step 0 (" in out.stdout and "final, step 2 (" in out.stdout and "held-out reward" in out.stdout
    assert "agentjet" not in (ROOT / "examples/tinker_rl_loop.py").read_text().split('"""')[2]
