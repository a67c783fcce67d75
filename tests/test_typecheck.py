"""The type checker `make test` runs (mypy, configured by pyproject.toml's [tool.mypy]) catches a variable bound
on one branch only and used after it: a planted one fails it, the fixed module passes. mypy runs on one small
file here; `make test` checks the whole package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PLANTED = '''\
def pick(flag: bool) -> int:
    if flag:
        value = 1
    else:
        other = 2
    return value + other
'''

FIXED = '''\
def pick(flag: bool) -> int:
    if flag:
        value, other = 1, 0
    else:
        value, other = 0, 2
    return value + other
'''


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy")
    module = tmp_path / "planted.py"
    module.write_text(source)
    # the project's settings, on this one file (a file named on the command line replaces `files`)
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / ".mypy_cache"), str(module)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_planted_unbound_variable_fails_the_type_check(tmp_path: Path) -> None:
    out = _mypy(tmp_path, PLANTED)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[possibly-undefined]" in out.stdout
    assert '"value" may be undefined' in out.stdout and '"other" may be undefined' in out.stdout


def test_the_fixed_module_passes_the_type_check(tmp_path: Path) -> None:
    out = _mypy(tmp_path, FIXED)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout
