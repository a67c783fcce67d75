"""Fleets of embedded replicas in the test's process (the tiny model, one model copy each), on a fake clock where a
timing rule is checked."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentjet.engines.base import GenerationResult, Generator, SamplingParams, TokenCallback


class Recording(Generator):
    """A replica's generator that records every prompt it was given (tests read where calls went)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.fail_after: int | None = None  # die after streaming this many tokens (a killed replica)
        self.dead = False

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        self.inner.policy_version = v

    def counters(self) -> dict[str, int]:
        return self.inner.counters()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, on_token: TokenCallback | None = None,
                       adapter: str | None = None) -> GenerationResult:
        from agentjet.generators.fleet import ReplicaDown

        self.prompts.append(list(prompt_ids))
        if self.dead:
            raise ReplicaDown("the replica process is gone")
        if self.fail_after is None:
            return await self.inner.generate(prompt_ids, sampling, on_token)
        streamed = []

        def tap(tok: int, lp: float) -> None:
            if len(streamed) < self.fail_after:
                streamed.append(tok)
                if on_token is not None:
                    on_token(tok, lp)

        import asyncio

        task = asyncio.ensure_future(self.inner.generate(prompt_ids, sampling, tap))
        while len(streamed) < self.fail_after and not task.done():
            await asyncio.sleep(0.001)
        task.cancel()
        self.dead = True
        raise ReplicaDown(f"the replica process died after {len(streamed)} tokens")

    async def load_weights(self, path: Path, version: int) -> None:
        await self.inner.load_weights(path, version)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture
def hf_replicas(tiny_model_path: Path) -> Iterator:
    """``make(n)``: n embedded tiny-model replicas in this process (``InProcessReplica`` over a ``Recording``),
    closed after the test."""
    from agentjet.engines.model import load_policy_model
    from agentjet.generators.fleet import InProcessReplica
    from agentjet.generators.hf.build import hf_generator
    from agentjet.runtime.blocking import run_blocking
    from agentjet.settings import GeneratorSettings

    made: list[Recording] = []

    def make(n: int) -> list:
        out = []
        for i in range(n):
            gen = Recording(hf_generator(load_policy_model(tiny_model_path), GeneratorSettings(max_batch_size=8)))
            made.append(gen)

            async def ping(g=gen) -> None:
                await g.inner.run_exclusive(lambda: None)

            replica = InProcessReplica(f"r{i}", gen, load=gen.load_weights, ping=ping)
            out.append(replica)
        return out

    yield make
    for gen in made:
        run_blocking(gen.close())


def block_worker(gen: Recording) -> threading.Event:
    """Hang a replica's engine thread (a job that waits): no decode step, no ping answered, until set."""
    release = threading.Event()
    gen.inner.worker.submit(release.wait)
    return release
