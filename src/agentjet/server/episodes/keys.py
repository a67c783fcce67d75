"""Episode keys: which episode a bearer key opens (open, recently closed, or stored after a restart), and who
may read a stored episode's trace. Raises 401/403 ``APIError``s; knows nothing of HTTP."""

from __future__ import annotations

from agentjet.server.digest import matches
from agentjet.server.episodes.registry import Episode, EpisodeRegistry
from agentjet.server.errors import forbidden, unauthorized
from agentjet.server.store import SampleStore


class EpisodeKeys:
    def __init__(self, registry: EpisodeRegistry, store: SampleStore) -> None:
        self.registry = registry
        self.store = store

    def by_key(self, key: str | None, episode_id: str | None = None) -> Episode:
        """The episode this key belongs to (open or recently closed); 401/403 otherwise."""
        if not key:
            raise unauthorized("missing episode key (Authorization: Bearer <episode api_key>)")
        ep = self.registry.by_key(key)
        if ep is None:
            raise unauthorized("unknown or expired episode key")
        if episode_id is not None and ep.episode_id != episode_id:
            raise forbidden("this episode key belongs to another episode")
        return ep

    def open_by_key(self, key: str | None) -> Episode:
        ep = self.by_key(key)
        if not ep.is_open:
            raise unauthorized(f"episode {ep.episode_id} is {ep.status.value}; its key no longer accepts calls")
        return ep

    def authorize_stored(self, key: str | None, episode_id: str) -> None:
        """The episode key authorises its own episode, also after a restart (the store keeps its digest)."""
        if self.registry.get(episode_id) is not None:
            self.by_key(key, episode_id)
            return
        stored = self.store.get_episode(episode_id)
        if stored is None or not matches(key, stored.key_hash):
            raise unauthorized("unknown or expired episode key")

    def authorize_trace(self, key: str | None, episode_id: str, is_admin: bool) -> None:
        """A stored episode's trace is for the admin, or for the episode's own key."""
        if not is_admin:
            self.authorize_stored(key, episode_id)
