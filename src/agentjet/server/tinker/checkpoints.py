"""``tinker://`` checkpoints of training clients: ``save_state``, ``load_state`` and a new client from a saved state.
A state is a file ``<data dir>/tinker/<adapter>/<name>.pt`` (LoRA weights, the Adam state): it survives a restart."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from agentjet.learners.tinker_ops import checkpoint_shape, load_adapter_state, save_adapter_state
from agentjet.server.tinker.errors import TinkerError
from agentjet.server.tinker.models import TinkerModel, TinkerModels

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_STATE_PATH = re.compile(r"^tinker://(?P<model>[A-Za-z0-9_-]{1,100})/weights/(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]{0,99})$")


class TinkerCheckpoints:
    def __init__(self, models: TinkerModels, data_dir: Path) -> None:
        self.models = models
        self.data_dir = data_dir  # tinker://<adapter>/weights/<name> lives in <adapter>/<name>.pt

    def state_file(self, path: str) -> Path:
        m = _STATE_PATH.match(path)
        if m is None:
            raise TinkerError(f"{path!r} is not a checkpoint path of this server (tinker://<model id>/weights/<name>)")
        return self.data_dir / m["model"] / f"{m['name']}.pt"

    async def save(self, model: TinkerModel, name: str) -> dict[str, Any]:
        if not _NAME.match(name):
            raise TinkerError("a checkpoint name is letters, digits, _ . and - (at most 100)")
        learner = self.models.learner(model)
        path = f"tinker://{model.adapter}/weights/{name}"  # the adapter's name: a path segment (a model id may not be)
        file = self.state_file(path)
        await learner.worker.run(save_adapter_state, learner, file)
        self.models.runs.checkpointed(model.adapter, f"weights/{name}", path, file.stat().st_size)
        return {"type": "save_weights", "path": path}

    async def load(self, model: TinkerModel, path: str, optimizer: bool) -> dict[str, Any]:
        file = self.state_file(path)
        if not file.is_file():
            raise TinkerError(f"no checkpoint at {path!r}", 404)
        learner = self.models.learner(model)
        await learner.worker.run(load_adapter_state, learner, file, optimizer)
        return {"type": "load_weights", "path": path, "model_id": model.model_id}

    async def create_from(self, session_id: str, model_seq_id: int, path: str, optimizer: bool,
                          base_model: str | None, metadata: dict[str, str] | None = None) -> TinkerModel:
        """``create_training_client_from_state[_with_optimizer]``: a new training client of the saved state's rank,
        loaded from it. Its model id is the one the SDK derives, ``<session id>:train:<model_seq_id>``."""
        models = self.models
        session = models.sessions.get(session_id)
        if base_model is not None:
            models.check_base(base_model)
        file = self.state_file(path)
        if not file.is_file():
            raise TinkerError(f"no checkpoint at {path!r}", 404)
        adapters = models.need_adapters()
        mid = f"{session_id}:train:{model_seq_id}"
        if mid in models.live:
            raise TinkerError(f"model {mid!r} exists already (model_seq_id {model_seq_id} is taken)", 409)
        rank, unembed = await asyncio.to_thread(checkpoint_shape, file)
        adapter = models.new_name("tinker")
        await adapters.add(adapter, rank, unembed=unembed)
        model = models.adopt(TinkerModel(mid, session_id, adapter, rank, models.served_name, unembed), session,
                             metadata)
        try:
            await self.load(model, path, optimizer)
        except BaseException:
            await models.drop(mid)
            raise
        return model
