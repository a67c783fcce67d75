"""A blocking facade over the async client: it runs the async client on a private event-loop thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from agentjet.client.client import Episode, SwarmClient
from agentjet.protocol import AGENT_HEADER, JoinResponse, Reward, ServerStatus

T = TypeVar("T")


class SyncEpisode:
    def __init__(self, episode: Episode) -> None:
        self._ep = episode

    episode_id = property(lambda self: self._ep.episode_id)
    api_key = property(lambda self: self._ep.api_key)
    base_url = property(lambda self: self._ep.base_url)
    policy_version = property(lambda self: self._ep.policy_version)
    anthropic_base_url = property(lambda self: self._ep.anthropic_base_url)
    model = property(lambda self: self._ep.model)

    def env(self, agent: str | None = None, base: Mapping[str, str] | None = None,
            codex_home: Path | None = None) -> dict[str, str]:
        """The environment for a harness subprocess on this episode (``Episode.env``)."""
        return self._ep.env(agent, base, codex_home)

    def reward(self, value: Reward, **metadata: Any) -> None:
        self._ep.reward(value, **metadata)

    def openai(self, agent: str | None = None) -> Any:
        """A blocking ``openai.OpenAI`` bound to this episode."""
        import openai

        headers = {AGENT_HEADER: agent} if agent else None
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, default_headers=headers, max_retries=2)


class SyncSwarmClient:
    def __init__(self, url: str, token: str | None = None, client_id: str | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentjet-client", daemon=True)
        self._thread.start()
        self._client: SwarmClient = self._run(self._make(url, token, client_id, kwargs))

    @staticmethod
    async def _make(url: str, token: str | None, client_id: str | None, kwargs: dict[str, Any]) -> SwarmClient:
        return SwarmClient(url, token, client_id, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def client_id(self) -> str:
        return self._client.client_id

    def join(self) -> JoinResponse:
        return self._run(self._client.join())

    def status(self) -> ServerStatus:
        return self._run(self._client.status())

    @contextlib.contextmanager
    def episode(self, task_id: str, task_type: str = "default", group_id: str | None = None, eval: bool = False,
                metadata: dict[str, Any] | None = None) -> Iterator[SyncEpisode]:
        ep = self._client.episode(task_id, task_type, group_id, eval, metadata)
        self._run(ep.begin())
        try:
            yield SyncEpisode(ep)
        except BaseException as exc:
            self._run(ep.__aexit__(type(exc), exc, None))
            raise
        self._run(ep.__aexit__(None, None, None))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> SyncSwarmClient:
        self.join()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
