"""The swarm client SDK.

    async with SwarmClient("http://127.0.0.1:10086") as swarm:
        async with swarm.episode(task_id="t1") as ep:
            reply = await ep.openai().chat.completions.create(model="x", messages=[...])
            ep.reward(1.0)

An exception inside the block aborts the episode and re-raises. Network errors and 5xx/429 answers are
retried with exponential backoff; ``end`` is idempotent on the server, so retrying it is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from agentjet.client.harness import harness_env
from agentjet.protocol import (
    AGENT_HEADER,
    SWARM_PREFIX,
    BeginEpisodeRequest,
    BeginEpisodeResponse,
    CheckpointRequest,
    CheckpointResult,
    EndEpisodeRequest,
    EndEpisodeResponse,
    JoinRequest,
    JoinResponse,
    PauseRequest,
    PauseState,
    Reward,
    ServerStatus,
)

log = logging.getLogger(__name__)

RETRY_STATUSES = {429, 502, 503, 504}
# 429s that mean "not yet", not "failed": a cocktail quota ahead of its share, or the swarm at capacity (admission
# within the staleness bound). Waited out for up to ``defer_timeout`` seconds. By default the server holds a begin
# beyond capacity until its group fits (a long poll) and answers these only when that wait runs out; the client
# then asks again at once.
DEFER_CODES = {"deferred", "at_capacity"}


class SwarmError(RuntimeError):
    """The server refused a request (a 4xx), or kept failing after every retry."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.code = status, message, code
        self.retry_after: float | None = None  # seconds the server asked to wait (429 / 503)


class _Deferred(Exception):
    """A cocktail-quota deferral: not a failure, wait ``wait_s`` and try again."""

    def __init__(self, error: SwarmError, wait_s: float) -> None:
        self.error, self.wait_s = error, wait_s


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after", "")
    return float(value) if value.replace(".", "", 1).isdigit() else None


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, SwarmError) and exc.status in RETRY_STATUSES)


def _backoff(state: RetryCallState) -> float:
    """0.2 s doubling to 10 s, +-20 % jitter, and never less than the server's Retry-After."""
    base = min(0.2 * 2 ** (state.attempt_number - 1), 10.0) * (0.8 + 0.4 * random.random())
    exc = state.outcome.exception() if state.outcome is not None else None
    asked = exc.retry_after if isinstance(exc, SwarmError) else None
    return max(base, asked or 0.0)


def _log_retry(method: str, path: str) -> Callable[[RetryCallState], None]:
    def log_it(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s %s failed (%r); retrying in %.1fs", method, path, exc,
                    state.next_action.sleep if state.next_action else 0.0)

    return log_it


def _error_of(resp: httpx.Response) -> SwarmError:
    try:
        err = resp.json()["error"]
        return SwarmError(resp.status_code, err.get("message", resp.text), err.get("code"))
    except Exception:
        return SwarmError(resp.status_code, resp.text[:500])


class SwarmClient:
    def __init__(self, url: str, token: str | None = None, client_id: str | None = None, *,
                 retries: int = 6, timeout: float = 600.0, join: bool = True, defer_timeout: float = 3600.0,
                 admission_wait_s: float | None = None) -> None:
        """``admission_wait_s``: how long the server may hold a begin beyond capacity (a long poll); None: the
        server's ``training.admission_wait_s``; 0: answer 429 at once, and the client backs off and retries."""
        self.url = url.rstrip("/")
        self.token = token
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self.retries = retries
        self.defer_timeout = defer_timeout  # how long to wait out "deferred" answers (cocktail quotas)
        self.admission_wait_s = admission_wait_s
        self._auto_join = join
        self._joined: JoinResponse | None = None
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def __aenter__(self) -> SwarmClient:
        if self._auto_join:
            await self.join()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    # ---------------------------------------------------------------- transport
    async def request(self, method: str, path: str, *, json: Any = None, key: str | None = None) -> dict[str, Any]:
        """One call, retried (tenacity) on network errors and 429/5xx answers with jittered exponential back-off
        that honours ``Retry-After``. A cocktail-quota deferral ("deferred") is waited out for up to
        ``defer_timeout`` seconds without counting as a failure."""
        headers = {"Authorization": f"Bearer {key or self.token}"} if (key or self.token) else {}
        deferred_until = asyncio.get_running_loop().time() + self.defer_timeout
        while True:
            try:
                async for attempt in AsyncRetrying(stop=stop_after_attempt(self.retries + 1), wait=_backoff,
                                                   retry=retry_if_exception(_retryable), reraise=True,
                                                   before_sleep=_log_retry(method, path)):
                    with attempt:
                        return await self._once(method, path, json, headers)
            except _Deferred as exc:
                if asyncio.get_running_loop().time() >= deferred_until:
                    raise exc.error from None
                await asyncio.sleep(exc.wait_s)  # a quota deferral is not a failure: wait for our turn
            except httpx.TransportError as exc:
                raise SwarmError(0, f"cannot reach the swarm server at {self.url}: {exc!r}") from exc

    async def _once(self, method: str, path: str, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        resp = await self._http.request(method, path, json=body, headers=headers)
        if resp.status_code < 400:
            return resp.json()
        error = _error_of(resp)
        if error.code in DEFER_CODES:
            wait_ms = resp.headers.get("retry-after-ms", "500")
            raise _Deferred(error, float(wait_ms) / 1000 if wait_ms.isdigit() else 0.5)
        if resp.status_code in RETRY_STATUSES:
            error.retry_after = _retry_after(resp)
        raise error

    # ---------------------------------------------------------------- API
    async def join(self) -> JoinResponse:
        data = await self.request("POST", f"{SWARM_PREFIX}/join", json=JoinRequest(client_id=self.client_id).model_dump())
        self._joined = JoinResponse.model_validate(data)
        return self._joined

    @property
    def joined(self) -> JoinResponse | None:
        """The server's answer to ``join`` (its group size and sampling defaults), once joined."""
        return self._joined

    def group_size(self, requested: int | None = None) -> int:
        """Episodes per task: the server's ``group_size`` unless ``requested`` says otherwise. A mismatch is
        warned about: the server would wait ``group_timeout_s`` for each group and train partial groups."""
        server = self._joined.group_size if self._joined is not None else None
        if requested is None:
            if server is None:
                raise RuntimeError("the server did not report its group size: pass group_size explicitly")
            return server
        if server is not None and requested != server:
            log.warning("group_size %d differs from the server's group_size %d: each group would wait for the "
                        "server's group timeout and be trained partial (or not at all); omit group_size to use the "
                        "server's", requested, server)
        return requested

    async def status(self) -> ServerStatus:
        return ServerStatus.model_validate(await self.request("GET", f"{SWARM_PREFIX}/status"))

    async def pause(self, wait_for_step: bool = True, *, admin_token: str | None = None) -> PauseState:
        """Pause training (the admin token: ``admin_token``, else the client's token). ``wait_for_step``: return
        only once a train step in progress has finished, so the policy stays as answered until :meth:`resume`."""
        body = PauseRequest(wait_for_step=wait_for_step).model_dump()
        return PauseState.model_validate(await self.request("POST", f"{SWARM_PREFIX}/control/pause", json=body,
                                                            key=admin_token))

    async def resume(self, *, admin_token: str | None = None) -> PauseState:
        return PauseState.model_validate(await self.request("POST", f"{SWARM_PREFIX}/control/resume",
                                                            key=admin_token))

    async def checkpoint(self, best_eval: float | None = None, *, admin_token: str | None = None) -> CheckpointResult:
        """A checkpoint of the committed step; with ``best_eval`` (the held-out eval of the policy served now,
        measured with training paused), the step is pinned as the run's best if that eval beats the pinned one."""
        body = CheckpointRequest(best_eval=best_eval).model_dump()
        return CheckpointResult.model_validate(await self.request("POST", f"{SWARM_PREFIX}/control/checkpoint",
                                                                  json=body, key=admin_token))

    def episode(self, task_id: str, task_type: str = "default", group_id: str | None = None, eval: bool = False,
                metadata: dict[str, Any] | None = None, agents: list[str] | None = None) -> Episode:
        """An episode (begun on entering ``async with``). ``agents``: the agent names it will call, when known (a
        server with several LoRA adapters then counts it only against theirs)."""
        req = BeginEpisodeRequest(client_id=self.client_id, task_id=task_id, task_type=task_type, group_id=group_id,
                                  eval=eval, metadata=metadata or {}, wait_s=self.admission_wait_s, agents=agents)
        return Episode(self, req)


class Episode:
    """One episode: an async context manager that begins it, keeps its lease alive and ends it."""

    def __init__(self, client: SwarmClient, req: BeginEpisodeRequest) -> None:
        self.client = client
        self.request = req
        self.info: BeginEpisodeResponse | None = None
        self.result: EndEpisodeResponse | None = None
        self._reward: Reward | None = None
        self._metadata: dict[str, Any] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._openai: dict[str | None, Any] = {}
        self._codex_home: Path | None = None  # made by ``env``, removed on release

    # ---------------------------------------------------------------- properties
    def _info(self) -> BeginEpisodeResponse:
        if self.info is None:
            raise RuntimeError("the episode has not begun: use `async with client.episode(...) as ep`")
        return self.info

    @property
    def episode_id(self) -> str:
        return self._info().episode_id

    @property
    def api_key(self) -> str:
        return self._info().api_key

    @property
    def base_url(self) -> str:
        return self._info().base_url

    @property
    def policy_version(self) -> int:
        return self._info().policy_version

    @property
    def anthropic_base_url(self) -> str:
        """The base URL an Anthropic client takes (it appends ``/v1/messages`` itself)."""
        return self._info().anthropic_base_url or self.base_url.removesuffix("/v1")

    @property
    def model(self) -> str:
        """The served model's name."""
        joined = self.client.joined
        model = self._info().model or (joined.model if joined is not None else None)
        if model is None:
            raise RuntimeError("the server did not name its model: join first, or use a newer server")
        return model

    def env(self, agent: str | None = None, base: Mapping[str, str] | None = None,
            codex_home: Path | None = None) -> dict[str, str]:
        """The environment for a harness subprocess on this episode (``base``, by default this process's, with the
        OpenAI, Anthropic and Codex variables of ``agentjet.client.harness``): ``subprocess.run(cmd,
        env=ep.env())``. ``codex_home``: where Codex's ``config.toml`` goes (default: a temporary directory,
        removed when the episode is released). ``agent``: the agent name of every call."""
        if codex_home is None:
            if self._codex_home is None:
                self._codex_home = Path(tempfile.mkdtemp(prefix="agentjet-codex-"))
            codex_home = self._codex_home
        return harness_env(os.environ if base is None else base, base_url=self.base_url,
                           anthropic_base_url=self.anthropic_base_url, api_key=self.api_key, model=self.model,
                           codex_home=codex_home, agent=agent)

    def openai(self, agent: str | None = None) -> Any:
        """An ``openai.AsyncOpenAI`` bound to this episode (and to an agent name, if given)."""
        if agent not in self._openai:
            import openai

            headers = {AGENT_HEADER: agent} if agent else None
            self._openai[agent] = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key,
                                                     default_headers=headers, max_retries=2)
        return self._openai[agent]

    def reward(self, value: Reward, **metadata: Any) -> None:
        """Set the reward (a scalar, or one per agent name) sent when the block exits."""
        self._reward = value
        self._metadata.update(metadata)

    def note(self, **metadata: Any) -> None:
        """Metadata sent with the end and kept with the episode on the server (``level``, a task's difficulty
        level, splits the dashboard's eval curves)."""
        self._metadata.update(metadata)

    # ---------------------------------------------------------------- lifecycle
    async def begin(self) -> Episode:
        # unset optional fields are left out: the server's own defaults (wait_s: its wait; agents: any adapter),
        # and a server that predates a field accepts the begin
        body = self.request.model_dump(exclude_none=True)
        data = await self.client.request("POST", f"{SWARM_PREFIX}/episodes", json=body)
        self.info = BeginEpisodeResponse.model_validate(data)
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat(self.info.lease_seconds / 3))
        return self

    async def _beat(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.client.request("POST", f"{SWARM_PREFIX}/episodes/{self.episode_id}/heartbeat",
                                          key=self.api_key)
            except SwarmError as exc:
                log.warning("heartbeat for %s failed: %s", self.episode_id, exc)
                if exc.status == 409:
                    return

    async def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    async def end(self, reward: Reward | None = None, **metadata: Any) -> EndEpisodeResponse:
        if reward is not None:
            self.reward(reward, **metadata)
        if self._reward is None:
            raise ValueError("the episode has no reward: call ep.reward(x) before it ends")
        await self._stop_heartbeat()
        body = EndEpisodeRequest(reward=self._reward, metadata=self._metadata).model_dump()
        data = await self.client.request("POST", f"{SWARM_PREFIX}/episodes/{self.episode_id}/end", json=body,
                                         key=self.api_key)
        self.result = EndEpisodeResponse.model_validate(data)
        return self.result

    async def abort(self, reason: str = "") -> None:
        await self._stop_heartbeat()
        await self.client.request("POST", f"{SWARM_PREFIX}/episodes/{self.episode_id}/abort",
                                  json={"reason": reason[:2000]}, key=self.api_key)

    async def __aenter__(self) -> Episode:
        return self if self.info is not None else await self.begin()  # begun already: ``begin_unless_stopped``

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if exc is not None:
                with contextlib.suppress(Exception):
                    await self.abort(f"{exc_type.__name__ if exc_type else 'error'}: {exc}")
                return
            if self.result is not None:
                return
            if self._reward is None:
                with contextlib.suppress(Exception):
                    await self.abort("no reward was given")
                raise ValueError("the episode block exited without a reward: call ep.reward(x) inside it")
            await self.end()
        finally:
            await self.release()

    async def release(self) -> None:
        """Stop the heartbeat, close the OpenAI clients bound to this episode (on the loop that made them) and
        remove the Codex home ``env`` made."""
        await self._stop_heartbeat()
        clients, self._openai = list(self._openai.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
        if self._codex_home is not None:
            shutil.rmtree(self._codex_home, ignore_errors=True)
            self._codex_home = None
