"""The store's interface: named operations, no SQL. The server is written against these protocols; the SQLite
backend (``sqlite.SQLiteStore``, ``lanes.SQLiteLane``, ``reader.SQLiteReader``) sits behind them, chosen once in
``swarm.py``, as Agent Lightning's ``LightningStore`` has one interface over its backends.

Three roles, one protocol each:

- ``TrainingStore``: what one training core reads and writes (the one policy's, or one LoRA adapter's lane).
- ``SampleStore``: the server's durable store. An episode is acknowledged only after its row and all its samples
  are committed (``commit_episode``). Each episode row moves ``pending`` -> ``trained`` | ``dropped_stale`` |
  ``dropped_uniform`` exactly once, in the same transaction that records the train step which consumed it
  (``mark_consumed``). Eval episodes are stored as ``eval``. On resume from a checkpoint taken at step k,
  episodes consumed after step k go back to ``pending`` (``rewind_to_step``).
- ``StoreReader``: the read side (the status, the dashboard, ``/metrics``, ``ajet export``), on a connection of
  its own that cannot write, so its reads never wait on the writer's lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from agentjet.server.store.records import EvalReward, StepRecord, StoredEpisode, StoredStatus, TraceRow
from agentjet.tracking import EpisodeSample


class TrainingStore(Protocol):
    """What a training core reads and writes of the store: the whole store (one policy) or one adapter's lane
    (``SampleStore.lane``), with the same meaning."""

    def pending_episodes(self) -> list[StoredEpisode]:
        """The episodes yet to be consumed, oldest first."""
        ...

    def samples_for(self, episode_ids: list[str]) -> dict[str, list[EpisodeSample]]:
        """Each episode's samples, in order."""
        ...

    def mark_consumed(self, statuses: dict[str, StoredStatus], step: int | None,
                      step_record: tuple[int, dict[str, float]] | None = None) -> None:
        """Move pending episodes to their final status, together with the step (``step_record``: its policy
        version and metrics) that consumed them, in one transaction."""
        ...

    def rewind_to_step(self, step: int) -> int:
        """Resume: what was consumed after ``step`` (not in the checkpointed weights) is pending again, and the
        steps after it are forgotten. Returns how many episodes went back."""
        ...

    def consumed_steps(self) -> dict[str, list[int]]:
        """episode id -> the steps that consumed it (for exactly-once audits: each list has length 1)."""
        ...

    def step_metrics(self) -> list[StepRecord]:
        """Every committed step, oldest first."""
        ...


class SampleStore(TrainingStore, Protocol):
    """The server's durable store of episodes and their samples, team decisions and train steps."""

    @property
    def path(self) -> Path: ...

    def probe(self) -> None:
        """Raise ``StoreError`` unless a durable write works right now (disk full, read-only, ...)."""
        ...

    def close(self) -> None: ...

    def commit_episode(self, ep: StoredEpisode, samples: list[EpisodeSample], metadata: dict[str, Any],
                       tracking: dict[str, Any] | None = None, adapters: Mapping[str, str] | None = None) -> bool:
        """Durably store an ended episode with its samples, in one transaction; ``StoreError`` if it cannot. False
        if it was already stored (idempotent; nothing written). ``adapters`` (a server with several LoRA
        adapters): agent -> the adapter that generated its calls; the episode waits to be consumed once by each
        adapter it used."""
        ...

    def get_episode(self, episode_id: str) -> StoredEpisode | None: ...

    def trace_row(self, episode_id: str) -> TraceRow | None:
        """A stored episode with what its trace shows besides the samples (None: not stored)."""
        ...

    def tracking_report(self, episode_id: str) -> dict[str, Any] | None: ...

    def episode_adapters(self, episode_id: str) -> list[str]:
        """The adapters an episode waits to be consumed by (a server with several adapters; else none)."""
        ...

    def lane(self, adapter: str) -> TrainingStore:
        """One adapter's view, for its own training core: the episodes it has yet to consume, its samples (only
        those it generated), its steps. An episode whose calls used two adapters is consumed once by each; it
        leaves ``pending`` when the last of them has consumed it (``trained`` if any trained it), and a rewind
        of one adapter puts it back."""
        ...

    def prepared_episodes(self) -> list[StoredEpisode]:
        """Team episodes after phase one (durable, not trainable until their team commits), oldest first."""
        ...

    def resolve_prepared(self, episode_id: str, commit: bool) -> tuple[StoredEpisode, bool]:
        """Phase two: a prepared episode becomes trainable (commit) or aborted. On the coordinator, the team's
        decision is recorded in the same transaction (a decision recorded earlier stands). Idempotent: returns
        (episode, whether this call changed it); ``KeyError`` if it is not stored."""
        ...

    def team_decision(self, team_id: str, secret: str) -> str | None:
        """The coordinator's decision for a team ('committed' / 'aborted'); None while undecided or when the
        secret does not match."""
        ...


class StoreReader(Protocol):
    """The read side's queries on the store, on a connection of its own that cannot write."""

    def close(self) -> None: ...

    def count_by_status(self) -> dict[str, int]:
        """Stored episodes per status: every ``StoredStatus``, 0 where none is stored."""
        ...

    def counts_by_client(self) -> dict[str, dict[str, int]]:
        """Stored episodes per client and status (every status, as ``count_by_status``)."""
        ...

    def steps(self, after: int, limit: int, adapter: str | None = None) -> list[StepRecord]:
        """The steps after ``after``, oldest first, at most ``limit``: the one policy's, or one LoRA adapter's (a
        server with several keeps each adapter's steps apart)."""
        ...

    def eval_rewards(self) -> list[EvalReward]:
        """Every eval episode's reward (policy version at begin, task type, reward), oldest first."""
        ...

    def episodes(self, statuses: tuple[str, ...] | None, equals: dict[str, Any], eval: bool | None,
                 limit: int) -> list[dict[str, Any]]:
        """The newest stored episodes (``reader.EPISODE_SUMMARY_COLS``, reward decoded) with one of ``statuses``, the
        column values in ``equals`` (task_type, client_id, begin_policy_version; ``ValueError`` for another) and,
        if given, eval or not."""
        ...

    def team_episodes(self, team_id: str) -> list[str]:
        """The stored episodes of a team, oldest first."""
        ...
