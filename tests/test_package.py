"""Package-level behaviour: importing agentjet prefers sleeping OpenMP waiters (before torch loads libgomp),
and a value the user set wins."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = "import sys, os, agentjet; print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))"


def run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env_extra
    return subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def test_import_sets_passive_openmp_before_torch() -> None:
    assert run({}) == "False PASSIVE"


def test_user_value_wins() -> None:
    assert run({"OMP_WAIT_POLICY": "ACTIVE"}) == "False ACTIVE"
