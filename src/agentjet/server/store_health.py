"""Whether the store takes writes: after a failed durable write the server accepts no new episode until a probe
write succeeds (disk full, read-only file system). Marked by the ingest, checked by admission."""

from __future__ import annotations

from agentjet.server.errors import unavailable
from agentjet.server.store import SampleStore, StoreError


class StoreHealth:
    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self.healthy = True  # False after a failed write, until a probe succeeds

    def failed(self) -> None:
        self.healthy = False

    def check(self) -> None:
        """503 ``store_unavailable`` while the store cannot be written; a probe write clears a failure."""
        if self.healthy:
            return
        try:
            self.store.probe()
        except StoreError as exc:
            raise unavailable(f"{exc}; the server accepts no new episodes until its store can be written "
                              "(disk full or read-only?)", "store_unavailable", retry_after_s=10) from exc
        self.healthy = True
