"""What an engine process is started with (``EngineSpec``): the model directory, the generator's and the placement's
settings, and the socket to connect to. The server writes it to a file in the engine's private directory and passes
the file's path as the one argument (nothing on the command line but that path)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentjet.settings import GeneratorSettings, PlacementSettings


@dataclass(frozen=True)
class EngineSpec:
    model: Path  # a local model directory (resolved by the server)
    generator: GeneratorSettings
    placement: PlacementSettings
    socket: Path  # the server's listening Unix socket, in a directory only this user can enter

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"model": str(self.model), "socket": str(self.socket),
                                    "generator": self.generator.model_dump(mode="json"),
                                    "placement": self.placement.model_dump(mode="json")}))
        return path

    @classmethod
    def read(cls, path: Path) -> EngineSpec:
        data = json.loads(path.read_text())
        return cls(model=Path(data["model"]), socket=Path(data["socket"]),
                   generator=GeneratorSettings.model_validate(data["generator"]),
                   placement=PlacementSettings.model_validate(data["placement"]))
