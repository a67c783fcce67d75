"""`ajet server` security defaults: a public bind without both tokens is refused (before any model loads) unless
--allow-insecure; tokens come from the option, the environment, or a file named by the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentjet.cli import _secret, app


@pytest.mark.parametrize("extra", [[], ["--swarm-token", "s3cret"], ["--admin-token", "adm1n"]])
def test_public_bind_without_both_tokens_is_refused(extra: list[str], monkeypatch) -> None:
    monkeypatch.delenv("AGENTJET_SWARM_TOKEN", raising=False)
    monkeypatch.delenv("AGENTJET_ADMIN_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["server", "--host", "0.0.0.0", *extra])
    assert result.exit_code == 2
    assert "refusing" in result.output and "--allow-insecure" in result.output


def test_token_from_option_then_environment_then_file(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AJ_TEST_TOKEN", raising=False)
    monkeypatch.delenv("AJ_TEST_TOKEN_FILE", raising=False)
    assert _secret(None, "AJ_TEST_TOKEN") is None
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    monkeypatch.setenv("AJ_TEST_TOKEN_FILE", str(token_file))
    assert _secret(None, "AJ_TEST_TOKEN") == "from-file"  # stripped
    monkeypatch.setenv("AJ_TEST_TOKEN", "from-env")
    assert _secret(None, "AJ_TEST_TOKEN") == "from-env"
    assert _secret("from-option", "AJ_TEST_TOKEN") == "from-option"
