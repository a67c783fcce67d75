"""The engine process itself: ``python -m agentjet.generators.hf.engine_process.child SPEC`` (started by
``generator.py``, never by hand). It connects to the server's socket, loads the model, builds the same
``ContinuousHFGenerator`` the server would run in process (the model, the slot KV cache, the scheduler, CUDA
graphs, the per-token versions and ``load_weights`` on its one worker thread), says HELLO and serves the wire
(``wire.py``) on its event loop until the server says SHUTDOWN or goes away (the socket closes; the parent-death
signal covers a server that was killed).

The server names every stop id of a request (the model's own and the request's): the engine's own stop set is
emptied, so a row stops on exactly what the server asked for.

What the event loop sends is gathered per loop iteration and written as one frame (``EngineServer.flush``): a
decode step's stream tokens of every streaming row in one TOKENS message, the results that finished, and the
counters (STATS: at most every ``STATS_INTERVAL_S`` while requests run, and whenever the last one ends, so an
idle engine's counters are exact).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentjet.engines.errors import EngineUnavailableError
from agentjet.generators.hf.engine_process import wire
from agentjet.generators.hf.engine_process.spec import EngineSpec
from agentjet.generators.hf.engine_process.wire import Kind, Op

if TYPE_CHECKING:
    from agentjet.generators.hf.continuous import ContinuousHFGenerator

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.25
READ_BYTES = 1 << 20


class EngineServer:
    """Serves one ``ContinuousHFGenerator`` on one connection."""

    def __init__(self, generator: ContinuousHFGenerator, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.gen = generator
        self.reader = reader
        self.writer = writer
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._rids: list[int] = []
        self._tokens: list[int] = []
        self._logprobs: list[float] = []
        self._out: list[list[Any]] = []
        self._flush_scheduled = False
        self._last_stats = 0.0
        self._closing = False

    # ------------------------------------------------------------------ sending
    def send(self, message: list[Any]) -> None:
        self._out.append(message)
        self._schedule()

    def _token(self, rid: int, token: int, logprob: float) -> None:
        self._rids.append(rid)
        self._tokens.append(token)
        self._logprobs.append(logprob)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """One frame: the counters first (the server stores them before it settles the results), then the stream
        tokens, then results, failures and replies, in the order they happened."""
        self._flush_scheduled = False
        messages: list[list[Any]] = []
        now = time.monotonic()
        if not self.tasks or now - self._last_stats >= STATS_INTERVAL_S:
            messages.append(self.stats_message())
            self._last_stats = now
        if self._rids:
            messages.append([Kind.TOKENS, self._rids, self._tokens, self._logprobs])
            self._rids, self._tokens, self._logprobs = [], [], []
        messages += self._out
        self._out = []
        if not self.writer.is_closing():
            self.writer.write(wire.pack(messages))

    def stats_message(self) -> list[Any]:
        return [Kind.STATS, dict(self.gen.stats), self.describe()]

    def describe(self) -> dict[str, Any]:
        return {**self.gen.describe(), "pid": os.getpid(), "policy_version": self.gen.policy_version}

    # ------------------------------------------------------------------ receiving
    async def serve(self) -> None:
        self.send([Kind.HELLO, self.describe()])
        beat = asyncio.create_task(self._beat())
        unpacker = wire.unpacker()
        try:
            while not self._closing:
                data = await self.reader.read(READ_BYTES)
                if not data:
                    if not self._closing:
                        log.warning("the server closed the connection: the engine process exits")
                    return
                unpacker.feed(data)
                for frame in unpacker:
                    for message in frame:
                        self.handle(message)
        finally:
            beat.cancel()
            for task in list(self.tasks.values()):
                task.cancel()
            await self.gen.close()
            self.flush()
            await self.writer.drain()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(wire.BEAT_INTERVAL_S)
            self.send([Kind.BEAT])

    def handle(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == Kind.GENERATE:
            _, rid, prompt, sampling, stream = message
            self.tasks[rid] = asyncio.ensure_future(self._generate(rid, prompt, sampling, stream))
        elif kind == Kind.CANCEL:
            task = self.tasks.pop(message[1], None)
            if task is not None:
                task.cancel()
        elif kind == Kind.CALL:
            _, cid, op, args = message
            call = asyncio.ensure_future(self._call(cid, Op(op), args))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        else:
            log.error("unknown message kind %r from the server", kind)

    async def _generate(self, rid: int, prompt: list[int], sampling: list[Any], stream: bool) -> None:
        try:
            params = wire.decode_sampling(sampling)
            on_token = (lambda t, lp: self._token(rid, t, lp)) if stream else None
            result = await self.gen.generate(prompt, params, on_token)
            self.send([Kind.DONE, rid, wire.encode_result(result)])
        except asyncio.CancelledError:
            return  # the server cancelled it: nothing to answer
        except Exception as exc:  # noqa: BLE001 - every failure goes back to its caller
            self.send([Kind.FAIL, rid, wire.encode_error(exc)])
        finally:
            self.tasks.pop(rid, None)

    async def _call(self, cid: int, op: Op, args: list[Any]) -> None:
        try:
            value = await self._run(op, args)
            self.send([Kind.REPLY, cid, True, value])
        except Exception as exc:  # noqa: BLE001 - the caller gets it
            self.send([Kind.REPLY, cid, False, wire.encode_error(exc)])

    async def _run(self, op: Op, args: list[Any]) -> Any:
        if op is Op.LOAD_WEIGHTS:
            path, version = args
            await self.gen.load_weights(Path(path), int(version))
            return version
        if op is Op.STATS:
            return dict(self.gen.stats)
        if op is Op.DESCRIBE:
            return self.describe()
        if op is Op.PING:
            return "pong"
        if op is Op.SHUTDOWN:
            self._closing = True
            for task in list(self.tasks.values()):
                task.cancel()
            self.tasks.clear()
            self.reader.feed_eof()  # the read loop ends after this frame
            return None
        raise EngineUnavailableError(f"unknown control call {op!r}")


async def run(spec: EngineSpec) -> None:
    from agentjet.engines.model import load_policy_model
    from agentjet.generators.hf.continuous import ContinuousHFGenerator

    reader, writer = await asyncio.open_unix_connection(str(spec.socket), limit=READ_BYTES)

    policy = await asyncio.to_thread(load_policy_model, spec.model, spec.placement)
    generator = ContinuousHFGenerator(policy, spec.generator)
    generator.rules.stop_ids = frozenset()  # the server names every stop id with each request
    await EngineServer(generator, reader, writer).serve()


def main(argv: list[str]) -> int:
    from agentjet.runtime.proc import die_with_parent

    die_with_parent()  # also set by the supervisor before exec; here for a process started otherwise
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-process %(levelname)s %(message)s")
    spec = EngineSpec.read(Path(argv[0]))
    if spec.generator.gil_switch_interval_ms is not None:
        sys.setswitchinterval(spec.generator.gil_switch_interval_ms / 1000)
    asyncio.run(run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
