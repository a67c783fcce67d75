"""Fixtures for the HTTP API fuzz suite: real swarm servers (null engine, swarm and admin tokens set),
a client that checks every answer against invariant 5, and a count of the cases run.

Knobs (environment):
  AGENTJET_FUZZ_EXAMPLES  hypothesis examples per endpoint (default 150)
  AGENTJET_FUZZ_RECORD    if set, write the count to benchmarks/results/fuzz_count.json at the end
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentjet.runtime import provenance

SWARM_TOKEN = "fuzz-swarm-token-0123456789abcdef"
ADMIN_TOKEN = "fuzz-admin-token-fedcba9876543210"
REPLY = 'Sure. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'  # parsed as a call when tools are given
MAX_BODY = 2 * 1024 * 1024  # the fuzz servers' body limit: the nasty list sends bodies just below and above it
ROOT = Path(__file__).resolve().parents[2]
COUNT_FILE = ROOT / "benchmarks" / "results" / "fuzz_count.json"

_COUNTS = pytest.StashKey[Counter]()
_STATUSES = pytest.StashKey[Counter]()  # (group, status class) -> answers
_STARTED = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_COUNTS] = Counter()
    config.stash[_STATUSES] = Counter()
    config.stash[_STARTED] = time.monotonic()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker, hand this worker's counts to the controller, which prints the summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["agentjet_fuzz"] = {
            "counts": [[g, n] for g, n in session.config.stash.get(_COUNTS, Counter()).items()],
            "statuses": [[g, c, n] for (g, c), n in session.config.stash.get(_STATUSES, Counter()).items()]}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: add a finished worker's counts (see pytest_sessionfinish)."""
    out = getattr(node, "workeroutput", {}).get("agentjet_fuzz")
    if out:
        for g, n in out["counts"]:
            node.config.stash[_COUNTS][g] += n
        for g, c, n in out["statuses"]:
            node.config.stash[_STATUSES][g, c] += n


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    counts = config.stash.get(_COUNTS, Counter())
    if not counts:
        return
    cases = sum(n for g, n in counts.items() if g.startswith(("hypothesis:", "nasty:")))
    other = sum(counts.values()) - cases
    tr = terminalreporter
    tr.section("agentjet fuzz cases")
    statuses = config.stash.get(_STATUSES, Counter())
    for group, n in sorted(counts.items()):
        split = "  ".join(f"{c}: {statuses[group, c]}" for c in ("2xx", "3xx", "4xx") if statuses[group, c])
        tr.write_line(f"  {group:<28} {n:>7}   {split}")
    failed = len(tr.stats.get("failed", [])) + len(tr.stats.get("error", []))
    tr.write_line(f"  fuzz cases run: {cases} (hypothesis + nasty list), plus {other} setup/health requests, "
                  f"all checked; {failed} failing tests")
    if os.environ.get("AGENTJET_FUZZ_RECORD"):
        COUNT_FILE.parent.mkdir(parents=True, exist_ok=True)
        COUNT_FILE.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "commit": provenance.git_commit(ROOT),
            "machine": provenance.machine(), "device": provenance.device(),
            "fuzz_cases": cases, "setup_requests": other,
            "by_group": dict(sorted(counts.items())),
            "by_group_and_status": {f"{g} {c}": n for (g, c), n in sorted(config.stash[_STATUSES].items())},
            "examples_per_endpoint": examples(), "failing_tests": failed,
            "passed_tests": len(tr.stats.get("passed", [])),
            "seconds": round(time.monotonic() - config.stash[_STARTED], 1)}, indent=2) + "\n")
        tr.write_line(f"  saved {COUNT_FILE}")


def examples() -> int:
    return int(os.environ.get("AGENTJET_FUZZ_EXAMPLES", "150"))


# ---------------------------------------------------------------------------------------------- the client
def assert_error_shape(r: httpx.Response) -> dict[str, Any]:
    """Invariant 5: a 4xx carries ``{"error": {"message", "type", "param", "code"}}`` with a real message."""
    assert r.headers.get("content-type", "").startswith("application/json"), (r.status_code, r.text[:300])
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err, dict) and set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and len(err["message"].strip()) >= 8, err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    return err


class Api:
    """An httpx client on one server; every answer is counted and checked: never a 5xx, and every
    4xx in OpenAI's error shape (``check_error``; the Tinker API's suite checks its own shape)."""

    check_error = staticmethod(assert_error_shape)

    def __init__(self, bg: Any, counts: Counter, statuses: Counter | None = None) -> None:
        self.bg = bg
        self.server = bg.server
        self.url = bg.url
        self.counts = counts
        self.statuses = Counter() if statuses is None else statuses
        self.http = httpx.Client(base_url=bg.url, timeout=httpx.Timeout(60.0))

    def request(self, method: str, path: str, *, group: str, json_body: Any = None, raw: bytes | None = None,
                token: str | None = None, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        h: dict[str, str] = {}
        if token is not None:
            h["Authorization"] = f"Bearer {token}".strip()  # (h11 refuses trailing whitespace)
        content = raw
        if json_body is not None:
            # Python's json writes NaN / Infinity tokens; the server must refuse them cleanly, not crash.
            content = json.dumps(json_body, allow_nan=True).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        r = self.http.request(method, path, content=content, headers=h, **kw)
        self.counts[group] += 1
        self.statuses[group, f"{r.status_code // 100}xx"] += 1
        assert r.status_code < 500, (method, path, r.status_code, r.text[:500])
        if r.status_code >= 400:
            self.check_error(r)
        return r

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return self.request("POST", path, json_body=body, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def begin(self, client_id: str = "fuzz", task_id: str = "t", **extra: Any) -> dict[str, Any]:
        r = self.post("/swarm/v1/episodes", {"client_id": client_id, "task_id": task_id, **extra},
                      token=SWARM_TOKEN, group="setup")
        assert r.status_code == 200, r.text
        return r.json()

    def chat_ok(self, ep: dict[str, Any], agent: str | None = None) -> None:
        r = self.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
                      token=ep["api_key"], headers={"X-Agent-Name": agent} if agent else None, group="setup")
        assert r.status_code == 200, r.text

    def healthy(self) -> None:
        r = self.http.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ready", r.text
        self.counts["health"] += 1

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="session")
def fuzz_counts(pytestconfig: pytest.Config) -> Counter:
    return pytestconfig.stash.setdefault(_COUNTS, Counter())


@pytest.fixture(scope="session")
def fuzz_statuses(pytestconfig: pytest.Config) -> Counter:
    return pytestconfig.stash.setdefault(_STATUSES, Counter())


@pytest.fixture(scope="module")
def fuzz_server_factory(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path,
                        fuzz_counts: Counter, fuzz_statuses: Counter) -> Iterator[Any]:
    """Start real servers (uvicorn on a loopback port, both tokens set, a null engine whose reply holds a
    tool call)."""
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import ServerConfig, TrainingSettings

    started: list[tuple[BackgroundServer, Api]] = []
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)

    def make(reply: str = REPLY, engine: Any = None, **config: Any) -> Api:
        """``engine``: None for the null engine, or an engine instance (a real batched one, say)."""
        config = {"lease_seconds": 600.0, "max_body_bytes": MAX_BODY, **config}
        cfg = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(),
                           data_dir=tmp_path_factory.mktemp("fuzz-server"), swarm_token=SWARM_TOKEN,
                           admin_token=ADMIN_TOKEN,
                           training=TrainingSettings(group_size=2, batch_groups=1, checkpoint_every=0,
                                                     admission=False), **config)  # episodes held open on purpose
        bg = BackgroundServer(SwarmServer(cfg, engine or null_engine(tokenizer, reply=reply))).start()
        api = Api(bg, fuzz_counts, fuzz_statuses)
        started.append((bg, api))
        return api

    yield make
    for bg, api in started:
        try:
            assert bg._thread.is_alive(), "the server thread died"
            api.healthy()  # the server still answers after everything the module threw at it
        finally:
            api.close()
            bg.stop()


@pytest.fixture(scope="module")
def api(fuzz_server_factory: Any) -> Api:
    """The module's shared server."""
    return fuzz_server_factory()
