"""Heterogeneous multi-model teams: several servers, each training its own model, in one episode.

    team = Team({"planner": "http://a:10086", "executor": "http://b:10086"})
    async with team.episode(task_id="t1") as ep:
        plan = await ep.openai("planner").chat.completions.create(...)     # trains the model on server a
        act = await ep.openai("executor").chat.completions.create(...)     # trains the model on server b
        ep.reward({"planner": 1.0, "executor": 0.3})

The team episode commits on every server or on none (two-phase): each member server first *prepares*
(samples durable, not trainable), then the coordinator (the first server) commits and records the
decision, then the others commit. If the client dies between the phases, each prepared member resolves
itself after its lease: the coordinator aborts, and the participants follow the coordinator's decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from typing import Any

from agentjet.client.client import Episode, SwarmClient, SwarmError
from agentjet.protocol import SWARM_PREFIX, PrepareEpisodeRequest, Reward


class Team:
    def __init__(self, roles: dict[str, str], token: str | None = None, client_id: str | None = None,
                 **client_kwargs: Any) -> None:
        if not roles:
            raise ValueError("a team needs at least one role")
        self.roles = dict(roles)
        self.client_id = client_id or f"team-{uuid.uuid4().hex[:12]}"
        self.servers = list(dict.fromkeys(u.rstrip("/") for u in roles.values()))  # first = coordinator
        self.clients = {url: SwarmClient(url, token=token, client_id=self.client_id, **client_kwargs)
                        for url in self.servers}

    async def __aenter__(self) -> Team:
        await asyncio.gather(*[c.join() for c in self.clients.values()])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*[c.close() for c in self.clients.values()])

    def episode(self, task_id: str, task_type: str = "default", group_id: str | None = None,
                metadata: dict[str, Any] | None = None, eval: bool = False) -> TeamEpisode:
        """A team episode: one episode per server, committed on all or none. ``eval``: held-out (never trained)."""
        return TeamEpisode(self, task_id, task_type, group_id, metadata or {}, eval)


class TeamEpisode:
    def __init__(self, team: Team, task_id: str, task_type: str, group_id: str | None,
                 metadata: dict[str, Any], eval: bool = False) -> None:
        self.team = team
        self.team_id = f"team-{uuid.uuid4().hex}"
        self._secret = secrets.token_urlsafe(32)
        self.members: dict[str, Episode] = {
            url: client.episode(task_id=task_id, task_type=task_type, group_id=group_id, eval=eval,
                                metadata={**metadata, "team_id": self.team_id},
                                agents=[role for role, u in team.roles.items() if u.rstrip("/") == url])
            for url, client in team.clients.items()}
        self._reward: Reward | None = None
        self.committed = False

    def episode_for(self, role: str) -> Episode:
        if role not in self.team.roles:
            raise KeyError(f"unknown role {role!r}; the team's roles are {sorted(self.team.roles)}")
        return self.members[self.team.roles[role].rstrip("/")]

    def openai(self, role: str) -> Any:
        """An ``openai.AsyncOpenAI`` for this role: its server, its episode, the role as the agent name."""
        return self.episode_for(role).openai(agent=role)

    def reward(self, value: Reward) -> None:
        if isinstance(value, dict):
            unknown = set(value) - set(self.team.roles)
            if unknown:
                raise KeyError(f"reward names unknown roles {sorted(unknown)}; roles are {sorted(self.team.roles)}")
        self._reward = value

    def _reward_for(self, url: str) -> Reward:
        assert self._reward is not None
        if not isinstance(self._reward, dict):
            return self._reward
        mine = {role: r for role, r in self._reward.items() if self.team.roles[role].rstrip("/") == url}
        if not mine:
            served = sorted(role for role, u in self.team.roles.items() if u.rstrip("/") == url)
            raise ValueError(f"the reward names none of the roles served by {url} ({served}): give each role a "
                             "reward, or a scalar for all")
        return mine

    async def __aenter__(self) -> TeamEpisode:
        begun: list[Episode] = []
        try:
            for ep in self.members.values():
                begun.append(await ep.begin())
        except BaseException:
            await self._abort_all(begun, "team begin failed")
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        members = list(self.members.values())
        try:
            if exc is not None:
                await self._abort_all(members, f"{exc_type.__name__ if exc_type else 'error'}: {exc}")
                return
            if self._reward is None:
                await self._abort_all(members, "no reward was given")
                raise ValueError("the team episode exited without a reward: call ep.reward(...) inside it")
            await self.finish()
        finally:
            await asyncio.gather(*[ep.release() for ep in members])  # heartbeats and OpenAI clients

    async def prepare(self) -> None:
        """Phase one on every member; if any fails, abort all and raise."""
        coordinator = self.team.servers[0]

        async def prepare_one(url: str, ep: Episode) -> None:
            await ep._stop_heartbeat()
            body = PrepareEpisodeRequest(reward=self._reward_for(url), ignore_unused_agents=True,
                                         metadata={"team_roles": self.team.roles},  # dashboard links the members
                                         team_id=self.team_id, team_secret=self._secret,
                                         coordinator_url=None if url == coordinator else coordinator)
            await ep.client.request("POST", f"{SWARM_PREFIX}/episodes/{ep.episode_id}/prepare",
                                    json=body.model_dump(), key=ep.api_key)

        results = await asyncio.gather(*[prepare_one(u, ep) for u, ep in self.members.items()],
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._abort_all(list(self.members.values()), f"a member failed to prepare: {errors[0]}")
            raise errors[0]

    async def commit(self) -> None:
        """Phase two: the coordinator first (it records the decision), then the others."""
        urls = self.team.servers
        await self._commit(urls[0])
        await asyncio.gather(*[self._commit(u) for u in urls[1:]])
        self.committed = True

    async def finish(self) -> None:
        await self.prepare()
        await self.commit()

    async def _commit(self, url: str) -> None:
        ep = self.members[url]
        await ep.client.request("POST", f"{SWARM_PREFIX}/episodes/{ep.episode_id}/commit", key=ep.api_key)

    async def _abort_all(self, episodes: list[Episode], reason: str) -> None:
        async def abort(ep: Episode) -> None:
            if ep.info is None:
                return
            with contextlib.suppress(SwarmError, Exception):
                await ep.abort(reason)

        await asyncio.gather(*[abort(ep) for ep in episodes])
