"""Process-level defaults: a server (`ajet server`) prefers sleeping OpenMP waiters, set before torch loads libgomp,
and a value the user set wins; importing the client SDK changes nothing in the process."""

from __future__ import annotations

import os
import subprocess
import sys

SERVER = ("import sys, os; from agentjet.runtime.omp import prefer_passive_openmp; prefer_passive_openmp(); "
          "print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))")
CLIENT = "import sys, os, agentjet; print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))"


def run(code: str, env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env_extra
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def test_server_entry_point_sets_passive_openmp_before_torch() -> None:
    assert run(SERVER, {}) == "False PASSIVE"


def test_user_value_wins() -> None:
    assert run(SERVER, {"OMP_WAIT_POLICY": "ACTIVE"}) == "False ACTIVE"


def test_a_client_only_process_is_left_alone() -> None:
    assert run(CLIENT, {}) == "False None"


def test_ajet_server_sets_it(monkeypatch) -> None:
    from typer.testing import CliRunner

    from agentjet.cli import app

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    seen = []
    monkeypatch.setattr("agentjet.server.http.app.serve", lambda config: seen.append(os.environ.get("OMP_WAIT_POLICY")))
    assert CliRunner().invoke(app, ["server", "--model", "tiny-random"]).exit_code == 0
    assert seen == ["PASSIVE"]
