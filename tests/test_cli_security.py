"""`ajet server` security defaults: a public bind without both tokens is refused (before any model loads) unless
--allow-insecure. (Where tokens come from is tested with the other settings, in tests/settings/test_settings.py.)"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentjet.cli import app


@pytest.mark.parametrize("extra", [[], ["--swarm-token", "s3cret"], ["--admin-token", "adm1n"]])
def test_public_bind_without_both_tokens_is_refused(extra: list[str], monkeypatch) -> None:
    monkeypatch.delenv("AGENTJET_SWARM_TOKEN", raising=False)
    monkeypatch.delenv("AGENTJET_ADMIN_TOKEN", raising=False)
    served = []
    monkeypatch.setattr("agentjet.server.http.app.serve", served.append)
    result = CliRunner().invoke(app, ["server", "--host", "0.0.0.0", *extra], terminal_width=200)
    assert result.exit_code == 2 and not served
    assert "refusing" in result.output and "--allow-insecure" in result.output


def test_allow_insecure_warns_and_serves(monkeypatch) -> None:
    served = []
    monkeypatch.setattr("agentjet.server.http.app.serve", served.append)
    result = CliRunner().invoke(app, ["server", "--model", "tiny-random", "--host", "0.0.0.0", "--allow-insecure"],
                                terminal_width=200)
    assert result.exit_code == 0 and "WARNING" in result.output and served[0].host == "0.0.0.0"
