"""Training runs as the SDK's REST client reads them (``GET training_runs/{id}``, tinker 0.38.0's ``TrainingRun``):
a training client's base, LoRA rank, ``user_metadata`` (given to ``create_model`` or to a ``load_weights`` that makes
a client) and its latest checkpoints. Each run is a file ``<data dir>/tinker/<adapter>/run.json`` beside its saved
states, so a run's metadata outlives the process: the cookbook reads ``renderer_name`` back from it on resume."""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentjet.files import write_atomic
from agentjet.runtime.clock import Clock
from agentjet.server.tinker.errors import TinkerError

RUN_FILE = "run.json"
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")  # an adapter's name: a path segment of its tinker:// paths
MAX_METADATA_KEYS = 64
MAX_METADATA_CHARS = 16_384


def user_metadata(value: Any) -> dict[str, str] | None:
    """The SDK's ``user_metadata`` (a JSON object; values that are not strings are kept as their JSON), bounded."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TinkerError("user_metadata must be an object with string keys")
    out = {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
    if len(out) > MAX_METADATA_KEYS or sum(len(k) + len(v) for k, v in out.items()) > MAX_METADATA_CHARS:
        raise TinkerError(f"user_metadata is too large (at most {MAX_METADATA_KEYS} keys, "
                          f"{MAX_METADATA_CHARS} characters)")
    return out


@dataclass
class RunRecord:
    training_run_id: str  # the adapter's name: the first segment of the run's tinker:// paths
    model_id: str
    base_model: str
    lora_rank: int
    last_request_time: str  # ISO 8601, UTC: the run's creation or its latest checkpoint
    user_metadata: dict[str, str] | None = None
    last_checkpoint: dict[str, Any] | None = None
    last_sampler_checkpoint: dict[str, Any] | None = None
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)  # checkpoint id -> its Checkpoint record

    def view(self) -> dict[str, Any]:
        """The SDK's ``TrainingRun``."""
        return {"training_run_id": self.training_run_id, "base_model": self.base_model, "model_owner": "agentjet",
                "is_lora": True, "corrupted": False, "lora_rank": self.lora_rank,
                "last_request_time": self.last_request_time, "last_checkpoint": self.last_checkpoint,
                "last_sampler_checkpoint": self.last_sampler_checkpoint, "user_metadata": self.user_metadata}


class TrainingRuns:
    def __init__(self, data_dir: Path, clock: Clock) -> None:
        self.data_dir = data_dir
        self.clock = clock

    def _now(self) -> str:
        return datetime.datetime.fromtimestamp(self.clock.time(), datetime.UTC).isoformat()

    def _file(self, run_id: str) -> Path:
        return self.data_dir / run_id / RUN_FILE

    def record(self, run_id: str, model_id: str, base_model: str, rank: int,
               metadata: dict[str, str] | None) -> RunRecord:
        """A new training client's run (its adapter's, so a client made from a saved state is a run of its own)."""
        run = RunRecord(run_id, model_id, base_model, rank, self._now(), metadata)
        self._write(run)
        return run

    def checkpointed(self, run_id: str, checkpoint_id: str, tinker_path: str, size_bytes: int | None,
                     expires_at: str | None = None) -> None:
        """A checkpoint of the run was written (``weights/...``, ``sampler_weights/...``, ``external_weights/...``)."""
        run = self.find(run_id)
        if run is None:
            return
        kind = {"weights": "training", "sampler_weights": "sampler"}.get(checkpoint_id.split("/", 1)[0], "external")
        now = self._now()
        record = {"checkpoint_id": checkpoint_id, "checkpoint_type": kind, "time": now, "tinker_path": tinker_path,
                  "size_bytes": size_bytes, "public": False, "expires_at": expires_at}
        run.checkpoints[checkpoint_id] = record
        run.last_request_time = now
        if kind == "training":
            run.last_checkpoint = record
        elif kind == "sampler":
            run.last_sampler_checkpoint = record
        self._write(run)

    def forget_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        run = self.find(run_id)
        if run is not None and run.checkpoints.pop(checkpoint_id, None) is not None:
            self._write(run)

    def find(self, run_id: str) -> RunRecord | None:
        if not RUN_ID.match(run_id):
            return None
        file = self._file(run_id)
        if not file.is_file():
            return None
        return RunRecord(**json.loads(file.read_text()))

    def get(self, run_id: str) -> RunRecord:
        run = self.find(run_id)
        if run is None:
            raise TinkerError(f"unknown training run {run_id!r} (a training client's model id, or the first segment "
                              "of its tinker:// paths)", 404)
        return run

    def _write(self, run: RunRecord) -> None:
        self._file(run.training_run_id).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self._file(run.training_run_id), json.dumps(asdict(run), indent=1))
