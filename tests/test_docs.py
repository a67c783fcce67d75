"""The docs stay complete: every route of the app is in docs/protocol.md, and every setting in
docs/configuration.md."""

from __future__ import annotations

from pathlib import Path

from agentjet.server.http.app import create_app
from agentjet.server.swarm import SwarmServer
from agentjet.settings import ServerConfig, server_fields

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_route_is_documented(tmp_path: Path, tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine

    config = ServerConfig(model=str(tiny_model_path), data_dir=tmp_path, admin_token="adm1n")
    app = create_app(SwarmServer(config, null_engine(AutoTokenizer.from_pretrained(tiny_model_path))))
    doc = (DOCS / "protocol.md").read_text()
    routes = [(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops]
    assert len(routes) >= 19
    missing = [f"{m} {p}" for m, p in routes if f"`{m} {p}`" not in doc]
    assert not missing, f"routes missing from docs/protocol.md: {missing}"


def test_every_setting_is_documented() -> None:
    doc = (DOCS / "configuration.md").read_text()
    missing = [f.dotted for f in server_fields() if f"`--{f.flag}`" not in doc or f"`{f.env}`" not in doc]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"
    from agentjet.settings.__main__ import page, table

    assert table() in doc
    assert doc == page(), "docs/configuration.md is stale: python -m agentjet.settings > docs/configuration.md"


def test_every_package_is_named_in_the_architecture() -> None:
    """docs/architecture.md names every package and sub-package of agentjet (as ``agentjet/x/`` or ``x/``), so
    a new room cannot appear without a place on the map; and its floor picture names every top-level package."""
    import agentjet

    src = Path(agentjet.__file__).resolve().parent
    text = (DOCS / "architecture.md").read_text()
    packages = sorted(p.parent.relative_to(src).as_posix() for p in src.rglob("__init__.py")
                      if p.parent != src and "static" not in p.parts)
    missing = [pkg for pkg in packages if f"agentjet/{pkg}/" not in text and f"`{pkg}/" not in text]
    assert missing == [], f"packages missing from docs/architecture.md: {missing}"
    floors = text.split("## Packages and their floors", 1)[1].split("```")[1]
    top = sorted({pkg.split("/")[0] for pkg in packages})
    assert [pkg for pkg in top if pkg not in floors] == [], "every top-level package has a floor in the picture"
