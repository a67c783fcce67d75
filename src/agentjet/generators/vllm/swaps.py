"""New weights into a running vLLM, for the weight-sync seams (``sync.py``, ``native_sync.py``): full weights
reloaded in place (pause -> reload -> reset the prefix cache -> resume, new requests held at the gate), or a LoRA
adapter loaded under a new versioned name; then a probe re-scored by vLLM and by the learner. A version is served
(``on_served``) only after its probe passed; a failed probe halts generation with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from agentjet.engines.base import TrainSample
from agentjet.engines.errors import TrainingHaltedError
from agentjet.generators.vllm.client import VLLMClient, VLLMConnectionError, VLLMError
from agentjet.generators.vllm.gate import ServingGate
from agentjet.generators.vllm.launch import BASE_NAME, VLLMLaunch
from agentjet.generators.vllm.probe import ProbeResult, compare
from agentjet.generators.vllm.process import ManagedProcess, ProcessState
from agentjet.settings import VLLMSettings

log = logging.getLogger(__name__)

PROBE_SEED = 1234

Scorer = Callable[[list[TrainSample]], Awaitable[list[list[float]]]]  # a learner's ``score``


class ServedModels:
    """The names vLLM serves (the base, or the LoRA adapter of the current version), the requests in flight on
    each, and adapters retired by a newer version: each is unloaded once its last request has finished."""

    def __init__(self, client: VLLMClient, launch: VLLMLaunch) -> None:
        self.client = client
        self.launch = launch
        self.inflight: Counter[str] = Counter()
        self._retired: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def current(self, slot: str | None = None) -> str:
        """The name vLLM serves now: the single policy's (``slot`` None), or named adapter ``slot``'s current
        versioned LoRA (a KeyError when there is no such adapter)."""
        if slot is not None:
            return self.launch.adapters[slot][0]
        adapter = self.launch.adapter
        return adapter[0] if adapter is not None else BASE_NAME

    def acquire(self, name: str) -> None:
        self.inflight[name] += 1

    def release(self, name: str) -> None:
        self.inflight[name] -= 1
        if self.inflight[name] <= 0:
            del self.inflight[name]
            if name in self._retired:
                self._spawn(self.unload(name))

    async def replace(self, name: str, path: Path, slot: str | None = None) -> None:
        """Serve the adapter ``name`` from now on (for named adapter ``slot``, when given); the previous one is
        unloaded when it is idle."""
        if slot is None:
            old = self.launch.adapter
            self.launch.adapter = (name, Path(path))  # new requests use it from here on; restarts load it
        else:
            old = self.launch.adapters.get(slot)
            self.launch.adapters[slot] = (name, Path(path))
        if old is not None:
            await self.retire(old[0])

    async def retire(self, name: str) -> None:
        """Unload ``name`` now if no request runs on it, else once its last one has finished."""
        self._retired.add(name)
        if not self.inflight.get(name):
            await self.unload(name)

    async def drop(self, slot: str) -> None:
        """Named adapter ``slot`` is no longer served: new requests for it are refused (``current`` raises) and
        its LoRA is unloaded once idle."""
        old = self.launch.adapters.pop(slot, None)
        if old is not None:
            await self.retire(old[0])

    async def unload(self, name: str) -> None:
        self._retired.discard(name)
        try:
            await self.client.unload_lora(name)
        except VLLMError as exc:  # a restart already dropped it, or vLLM is down: nothing to free
            log.info("unloading LoRA adapter %s: %s", name, exc)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class WeightSwaps:
    def __init__(self, client: VLLMClient, process: ManagedProcess, gate: ServingGate, served: ServedModels,
                 settings: VLLMSettings, probe_ids: list[int], stats: dict[str, float], *,
                 on_served: Callable[[int], None], halt: Callable[[str], None]) -> None:
        self.client = client
        self.process = process
        self.gate = gate
        self.served = served
        self.settings = settings
        self.probe_ids = probe_ids
        self.stats = stats  # the generator's: syncs, last_sync_seconds, probe_logprob_diff
        self._on_served = on_served
        self._halt = halt

    async def full(self, path: Path, version: int, scorer: Scorer) -> dict[str, float]:
        """Serve the full weights of the model directory ``path`` as ``version``: pause -> reload -> reset the
        prefix cache -> resume (requests wait meanwhile), then the probe against ``scorer``."""
        self.served.launch.model_dir = Path(path)  # a restart from now on loads these weights from disk
        t1 = time.perf_counter()
        for attempt in (1, 2):  # one retry when vLLM went down mid-swap (it restarts from `path`)
            await self.wait_process_ready(self.settings.sync_timeout_s)
            self.gate.set(False)
            try:
                await self._reload(path)
                break
            except VLLMConnectionError:
                if attempt == 2:
                    raise
                log.warning("vLLM went away during the weight swap; retrying once it is back")
        swap_s = time.perf_counter() - t1
        probe = await self._checked_probe(BASE_NAME, version, scorer)
        self._served(version, swap_s)
        return {**probe.as_metrics(), "swap_seconds": swap_s}

    async def adapter(self, path: Path, version: int, scorer: Scorer, slot: str | None = None,
                      on_served: Callable[[int], None] | None = None) -> dict[str, float]:
        """Serve the LoRA adapter at ``path`` as ``version``, under a new name (its prefix cache is its own);
        the previous adapter is unloaded once its last request has finished. ``slot``: the named adapter it is a
        version of (``<slot>-v<version>``; the others are untouched), whose version ``on_served`` records
        instead of the generator's."""
        name = f"{slot or BASE_NAME}-v{version}"
        await self.wait_process_ready(self.settings.sync_timeout_s)
        t1 = time.perf_counter()
        await self.client.load_lora(name, str(path))
        swap_s = time.perf_counter() - t1
        probe = await self._checked_probe(name, version, scorer)
        await self.served.replace(name, path, slot)
        self._served(version, swap_s, on_served)
        return {**probe.as_metrics(), "swap_seconds": swap_s}

    async def best_effort_resume(self) -> None:
        """After a failed swap: make sure vLLM is not left paused (LoRA swaps never pause it)."""
        if self.served.launch.uses_lora:
            return
        with contextlib.suppress(VLLMError):
            await self.client.resume()

    async def wait_process_ready(self, timeout: float) -> None:
        if self.process.state is ProcessState.READY:
            return
        if not await asyncio.to_thread(self.process.wait_ready, timeout):
            raise VLLMConnectionError(f"vLLM is {self.process.state.value}, not ready within {timeout:.0f}s"
                                      + (f": {self.process.last_error}" if self.process.last_error else ""))

    async def probe(self, scorer: Scorer, model: str | None = None) -> ProbeResult:
        """Score the probe prompt (and a few tokens sampled after it) on vLLM and with ``scorer``."""
        model = model or self.served.current()
        ids = self.probe_ids
        prompt_lps = await self.client.prompt_logprobs(model, ids, temperature=1.0)
        gen = await self.client.complete({
            "model": model, "prompt": ids, "max_tokens": self.settings.probe_tokens, "temperature": 1.0,
            "seed": PROBE_SEED, "logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "ignore_eos": True})
        seq = ids + gen.token_ids
        sample = TrainSample(input_ids=seq, loss_mask=[0] + [1] * (len(seq) - 1), behaviour_logprobs=[0.0] * len(seq),
                             advantages=[0.0] * len(seq), temperature=1.0)
        trainer_lps = (await scorer([sample]))[0]
        return compare(prompt_lps, gen.logprobs, trainer_lps)

    async def _reload(self, path: Path) -> None:
        """pause -> reload -> reset prefix cache -> resume (resume also when a step in between fails)."""
        await self.client.pause(self.settings.pause_mode)
        try:
            await self.client.reload_weights(str(path))
            if not await self.client.reset_prefix_cache(reset_running_requests=True):
                raise VLLMError("vLLM could not reset its prefix cache after the reload: KV computed with the "
                                "old weights would be reused")
        finally:
            await self.client.resume()

    async def _checked_probe(self, model: str, version: int, scorer: Scorer) -> ProbeResult:
        probe = await self.probe(scorer, model)
        self.stats["probe_logprob_diff"] = probe.diff
        log.info("probe after the sync to v%d: mean |logprob diff| prompt %.4f, sampled %.4f", version,
                 probe.prompt_diff, probe.gen_diff)
        if probe.diff > self.settings.probe_threshold:
            reason = (f"after the sync to policy v{version}, vLLM and the trainer disagree on the probe prompt: "
                      f"mean |logprob difference| {probe.diff:.3f} (prompt {probe.prompt_diff:.3f}, sampled "
                      f"{probe.gen_diff:.3f}) > probe_threshold {self.settings.probe_threshold}; vLLM does not "
                      "serve the trained weights (stale or half-loaded weights, or a stale prefix cache)")
            self._halt(reason)
            raise TrainingHaltedError(reason)
        return probe

    def _served(self, version: int, seconds: float, on_served: Callable[[int], None] | None = None) -> None:
        (on_served or self._on_served)(version)
        self.stats["syncs"] += 1
        self.stats["last_sync_seconds"] = seconds
