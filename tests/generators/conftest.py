"""The engines the generators' tests build: ``make_engine(layout, **generator_settings)``, on the tiny model, closed
after the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentjet.layouts import embedded_engine
from agentjet.layouts.composed import ComposedEngine
from agentjet.layouts.engine_process import engine_process_engine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import GeneratorSettings


@pytest.fixture
def make_engine(tiny_model_path: Path):
    made: list[ComposedEngine] = []

    def make(layout: str = "in-process", **settings) -> ComposedEngine:
        build = embedded_engine if layout == "in-process" else engine_process_engine
        engine = build(tiny_model_path, GeneratorSettings(**{"max_batch_size": 4, **settings}))
        engine.generator.rules.stop_ids = frozenset()  # fixed lengths: every request runs to its max_tokens
        made.append(engine)
        return engine

    yield make
    for engine in made:
        run_blocking(engine.close())
