"""``ajet ctl``: the control plane of a running server (admin token). Settings changed with ``ajet ctl set``
are resolved and checked against the same settings table as ``ajet server``; the server re-validates the
whole configuration before applying anything."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from agentjet.cli.client import SERVER_URL
from agentjet.cli.common import admin_token_for, console, fail

app = typer.Typer(no_args_is_help=True, help="Control a running server (needs the admin token; a server on this "
                  "machine that generated its own is found automatically).")

_SERVER = typer.Option(SERVER_URL, "--server", help="swarm server URL")
_TOKEN = typer.Option(None, "--token", help="admin token (or $AGENTJET_ADMIN_TOKEN[_FILE])")


def call(method: str, path: str, server_url: str, token: str | None, body: dict[str, Any] | None = None) -> dict:
    import httpx

    token = admin_token_for(server_url, token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, f"{server_url.rstrip('/')}/swarm/v1/control/{path}", json=body, headers=headers,
                          timeout=600)
    except httpx.TransportError as exc:
        fail(f"cannot reach {server_url}: {exc}")
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text
        fail(f"HTTP {r.status_code}: {message}")
    return r.json()


def parse_assignment(item: str) -> tuple[tuple[str, ...], Any]:
    """``learning_rate=3e-5`` (a flag name, alias or dotted path, then a JSON or plain value) -> (path, value),
    checked against the setting's type and bounds."""
    from pydantic import Field, TypeAdapter, ValidationError

    from agentjet.settings import find_field

    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{item!r} must look like key=value (e.g. learning_rate=3e-5)")
    try:
        field = find_field(key)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0])) from exc
    if not field.live:
        from agentjet.settings import server_fields

        live = ", ".join(f.dotted for f in server_fields() if f.live and f.section not in ("training", "loss"))
        raise typer.BadParameter(f"{field.dotted} cannot change while the server runs (restart it with the new "
                                 f"value); live: the training and loss settings, {live}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    meta = [m for m in field.info.metadata]
    try:
        annotated: Any = Annotated[field.annotation, Field(), *meta]  # a type built at run time
        TypeAdapter(annotated).validate_python(value)
    except ValidationError as exc:
        raise typer.BadParameter(f"{field.dotted} (--{field.flag}): {exc.errors()[0]['msg']} (got {raw!r})") from exc
    return field.path, value


@app.command("status")
def ctl_status(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Print the live settings and the change log."""
    console.print_json(json.dumps(call("GET", "config", server_url, token)))


@app.command("set")
def ctl_set(assignments: list[str] = typer.Argument(..., help="key=value, e.g. learning_rate=3e-5 group_size=8 "
                                                             "temperature=0.7 task_ratios='{\"a\": 1}'"),
            force: bool = typer.Option(False, help="apply a task_ratios change even if it shuts out task types "
                                       "that clients are running"),
            server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Change settings live; they take effect from the next batch (training, loss) or call (sampling)."""
    body: dict[str, Any] = {"force": force}
    for item in assignments:
        (section, name), value = parse_assignment(item)
        body.setdefault(section, {})[name] = value
    rec = call("POST", "config", server_url, token, body)
    console.print(f"applied at policy v{rec['policy_version']} (after step {rec['train_step']}): {rec['changes']}")


@app.command("pause")
def ctl_pause(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Pause training (episodes and generation continue; acknowledged episodes wait in the store)."""
    console.print(call("POST", "pause", server_url, token))


@app.command("resume")
def ctl_resume(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Resume training."""
    console.print(call("POST", "resume", server_url, token))


@app.command("checkpoint")
def ctl_checkpoint(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Save a checkpoint now (between train steps)."""
    console.print(call("POST", "checkpoint", server_url, token))


@app.command("stop")
def ctl_stop(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Checkpoint and stop the server."""
    console.print(call("POST", "stop", server_url, token))


adapter_app = typer.Typer(no_args_is_help=True, help="Add or remove LoRA adapters of a running server that hosts "
                          "several (started with --lora-rank N --adapters a,b).")
app.add_typer(adapter_app, name="adapter")


@adapter_app.command("add")
def ctl_adapter_add(name: Annotated[str, typer.Argument(help="the adapter's name (the agent name that uses it)")],
                    rank: Annotated[int | None, typer.Option("--rank", min=1, max=1024,
                                                             help="its LoRA rank (default: the server's)")] = None,
                    server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Add an adapter: it serves its agent and trains on its rewards from now on."""
    console.print(call("POST", "adapters", server_url, token, {"name": name, "rank": rank}))


@adapter_app.command("remove")
def ctl_adapter_remove(name: Annotated[str, typer.Argument(help="the adapter to remove")],
                       server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Remove an adapter: its agent is no longer served by it (a 404, or the default adapter)."""
    console.print(call("DELETE", f"adapters/{name}", server_url, token))
