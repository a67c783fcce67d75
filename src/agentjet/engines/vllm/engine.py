"""``VLLMGenerator``: vLLM (a managed subprocess on loopback) generates. It trains nothing: a learner does, and
the new weights reach vLLM through a seam after every step (``engines/vllm/sync.py``: safetensors + reload, or
``native_sync.py``: NCCL), each checked by a probe re-scored against the learner.

Policy versions: ``policy_version`` is the version vLLM *serves*. A request records the version current when
it was sent to vLLM. New requests wait while weights are being swapped, and the version changes only once
the new weights serve and have passed the probe. Whether a request already running can span a swap depends on
how the weights arrive:
- full weights with ``pause_mode="keep"`` (reload or NCCL): yes. ``/pause`` freezes it, the swap resets the
  prefix cache with ``reset_running_requests`` (it recomputes its KV with the new weights) and it finishes on
  them. Such requests are always streamed from vLLM, and each token is labelled with the version served when
  it arrived: tokens that arrive before the new version is announced (after the probe) count as the old one,
  so a token is never labelled newer than the weights that sampled it (staleness is never under-counted);
- ``pause_mode="wait"``: no. ``/pause`` waits for running requests to finish before the swap starts;
- ``pause_mode="abort"``: no. Running requests are aborted (the caller gets an error);
- LoRA: no. Each request names the adapter it started on, and an old adapter is unloaded only after its last
  request has finished.
Per-token behaviour logprobs are exact in every case.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentjet.engines.base import (
    FinishReason,
    GenerationResult,
    Generator,
    SamplingParams,
    TokenCallback,
    TrainSample,
)
from agentjet.engines.errors import EngineUnavailableError, TrainingHaltedError
from agentjet.engines.vllm.client import (
    Completion,
    VLLMClient,
    VLLMConnectionError,
    VLLMError,
    VLLMRequestError,
)
from agentjet.engines.vllm.probe import ProbeResult, compare, probe_prompt_ids
from agentjet.engines.vllm.process import LaunchSpec, ManagedProcess, ProcessState, Timing
from agentjet.proc import free_port
from agentjet.settings import VLLMSettings

log = logging.getLogger(__name__)

BASE_NAME = "policy"  # the name vLLM serves the base (full-weights) model under
PROBE_SEED = 1234
RETRY_AFTER_S = 30.0
MAX_SOCKET_DIR = 64  # longest TMPDIR for vLLM: its ZMQ socket paths (+ "/" + a uuid) must fit in sun_path (107)

Scorer = Callable[[list[TrainSample]], Awaitable[list[list[float]]]]  # a learner's ``score``


class VLLMGenerator(Generator):
    def __init__(
        self,
        model_dir: Path,
        tokenizer: Any,
        settings: VLLMSettings,
        *,
        stop_ids: set[int],
        max_context: int,
        seed: int = 0,
        lora_adapters: bool = False,
        work_dir: Path = Path("runs/vllm"),
        start: bool = True,
    ) -> None:
        """vLLM serving the model directory ``model_dir`` (for full-weight training an untied export: see
        ``engines/weights.py``). ``lora_adapters``: new weights arrive as LoRA adapters under versioned names.
        ``max_context``: the model's own limit (vLLM serves ``min(max_model_len, max_context)``)."""
        self.settings = s = settings
        self._tokenizer = tokenizer
        self.seed = seed
        self.uses_lora = lora_adapters
        self._model_limit = max_context
        self.work_dir = Path(work_dir).resolve()
        self.port = s.port or free_port(s.host)
        self.url = f"http://{s.host}:{self.port}"
        self.client = VLLMClient(self.url, request_timeout_s=s.request_timeout_s,
                                 control_timeout_s=s.control_timeout_s)
        self.process = ManagedProcess(self._launch_spec, Timing(
            startup_timeout_s=s.startup_timeout_s, stop_timeout_s=s.stop_timeout_s, max_restarts=s.max_restarts,
            restart_backoff_s=s.restart_backoff_s, watch_interval_s=s.watch_interval_s))
        self.policy_version = 0
        self._model_dir = Path(model_dir).resolve()  # what vLLM (re)starts from
        self._adapter: tuple[str, Path] | None = None  # LoRA: the adapter that serves now
        self._inflight: Counter[str] = Counter()  # requests in flight per served model / adapter name
        self._retired: set[str] = set()  # adapters to unload once their last request finishes
        self._tasks: set[asyncio.Task[Any]] = set()
        self._syncing = False
        self._serving_events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        self.halted_reason: str | None = None
        self._stop_ids = set(stop_ids)
        self._short_tmp: Path | None = None  # vLLM's TMPDIR when the run's directory is too deep for a socket
        self._probe_ids = probe_prompt_ids(self.tokenizer, self.max_context)
        self.stats: dict[str, float] = {"generate_requests": 0, "generated_tokens": 0, "train_steps": 0,
                                        "syncs": 0, "last_sync_seconds": 0.0, "probe_logprob_diff": float("nan"),
                                        "unavailable_errors": 0}
        if start:
            self.start()

    # ------------------------------------------------------------------ properties
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return min(self.settings.max_model_len, int(self._model_limit))

    @property
    def capacity(self) -> int:
        return 256  # vLLM schedules its own batch; the client's connection pool bounds what is in flight

    @property
    def stop_token_ids(self) -> set[int]:
        """Tokens that end a generation (besides a request's own); empty: generate to max_tokens."""
        return self._stop_ids

    @stop_token_ids.setter
    def stop_token_ids(self, ids: set[int]) -> None:
        self._stop_ids = set(ids)

    def engine_stats(self) -> dict[str, Any]:
        c = self.process.counters
        return {**self.stats, "policy_version": self.policy_version, "process_state": self.process.state.value,
                "process_starts": c.starts, "process_crashes": c.crashes, "process_restarts": c.restarts,
                "halted_reason": self.halted_reason, "url": self.url}

    # ------------------------------------------------------------------ the subprocess
    def start(self) -> None:
        """Start vLLM; blocks until healthy."""
        self.process.start()

    def _launch_spec(self) -> LaunchSpec:
        s = self.settings
        argv = [str(s.python_path()), "-m", s.module, "--model", str(self._model_dir), "--host", s.host,
                "--port", str(self.port), "--served-model-name", BASE_NAME, "--max-model-len", str(self.max_context),
                "--dtype", s.dtype, "--logprobs-mode", "processed_logprobs", "--seed", str(self.seed),
                "--max-logprobs", "20"]
        if s.enforce_eager:
            argv.append("--enforce-eager")
        if self.uses_lora:
            argv += ["--enable-lora", "--max-lora-rank", str(s.lora_max_rank), "--max-loras", "2",
                     "--max-cpu-loras", "4"]
            if self._adapter is not None:
                argv += ["--lora-modules", f"{self._adapter[0]}={self._adapter[1]}"]
        if s.platform == "gpu":
            argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
        if s.weight_transfer == "nccl":
            from agentjet.engines.vllm.native_sync import vllm_args

            argv += vllm_args()
        argv += s.extra_args
        run = self.work_dir
        for sub in ("cache/vllm", "cache/inductor"):
            (run / sub).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({
            "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume, /collective_rpc, /reset_prefix_cache
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(run / "cache/vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(run / "cache/inductor"),
            "TMPDIR": str(self._tmp_dir()),
        })
        if s.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = s.cuda_visible_devices
        if s.platform == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{s.kv_cache_gib:g}"
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(s.reserved_cpus)
        env.update(s.extra_env)
        return LaunchSpec(argv=argv, env=env, health_url=f"{self.url}/health", log_path=run / "vllm.log")

    def _tmp_dir(self) -> Path:
        """vLLM's TMPDIR: its ZMQ sockets and dist files go there, not loose in /tmp. In the run's directory when
        that path is short enough for a unix socket (a socket path holds at most 107 bytes, and vLLM appends a
        36-character name), else a private directory under the system's temp dir, removed when vLLM stops."""
        own = self.work_dir / "tmp"
        if len(str(own)) <= MAX_SOCKET_DIR:
            own.mkdir(parents=True, exist_ok=True)
            return own
        if self._short_tmp is None or not self._short_tmp.exists():
            self._short_tmp = Path(tempfile.mkdtemp(prefix="agentjet-vllm-"))
        return self._short_tmp

    def _check_available(self) -> None:
        if self.halted_reason is not None:
            raise EngineUnavailableError(f"generation is stopped: {self.halted_reason}")
        state = self.process.state
        if state is ProcessState.READY:
            return
        if state is ProcessState.FAILED:
            raise EngineUnavailableError(f"vLLM is down and could not be restarted: {self.process.last_error}")
        raise EngineUnavailableError(f"vLLM is {state.value} (crash #{self.process.counters.crashes}); "
                                     "retry shortly", retry_after_s=RETRY_AFTER_S)

    async def _wait_process_ready(self, timeout: float) -> None:
        if self.process.state is ProcessState.READY:
            return
        if not await asyncio.to_thread(self.process.wait_ready, timeout):
            raise VLLMConnectionError(f"vLLM is {self.process.state.value}, not ready within {timeout:.0f}s"
                                      + (f": {self.process.last_error}" if self.process.last_error else ""))

    # ------------------------------------------------------------------ serving gate (closed during a swap)
    def _serving_event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        ev = self._serving_events.get(loop)
        if ev is None:
            for old in [lp for lp in self._serving_events if lp.is_closed()]:
                del self._serving_events[old]
            ev = asyncio.Event()
            if not self._syncing:
                ev.set()
            self._serving_events[loop] = ev
        return ev

    def _set_gate(self, serving: bool) -> None:
        """Open or close the gate on every loop. The calling loop's event changes at once, so that a request
        that this loop runs next cannot slip past a gate that is closing; other loops change on their next turn."""
        self._syncing = not serving
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, ev in list(self._serving_events.items()):
            if loop.is_closed():
                continue
            if loop is current:
                ev.set() if serving else ev.clear()
            else:
                loop.call_soon_threadsafe(ev.set if serving else ev.clear)

    async def _wait_serving(self) -> None:
        ev = self._serving_event()
        if not ev.is_set():
            try:
                await asyncio.wait_for(ev.wait(), self.settings.sync_timeout_s)
            except TimeoutError as exc:
                raise EngineUnavailableError("a weight swap has held generation for more than "
                                             f"{self.settings.sync_timeout_s:.0f}s", RETRY_AFTER_S) from exc

    # ------------------------------------------------------------------ generation
    def _validate(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) >= self.max_context:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_context} tokens")
        vocab = len(self.tokenizer)
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt_ids must be token ids in [0, {vocab})")

    def _served_name(self) -> str:
        return self._adapter[0] if self._adapter is not None else BASE_NAME

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams, model: str) -> dict[str, Any]:
        """The /v1/completions body for one generation (token ids in, token ids and logprobs out)."""
        body: dict[str, Any] = {
            "model": model, "prompt": list(prompt_ids),
            "max_tokens": min(sampling.max_tokens, self.max_context - len(prompt_ids)),
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "logprobs": max(1, sampling.top_logprobs),
            "return_token_ids": True, "return_tokens_as_token_ids": True,
            # our stop ids, not vLLM's idea of EOS: the same rule as the embedded engine
            "ignore_eos": True, "stop_token_ids": sorted(self._stop_ids | set(sampling.stop_token_ids)),
            "skip_special_tokens": True,
        }
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return body

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None) -> GenerationResult:
        self._validate(prompt_ids)
        await self._wait_serving()
        self._check_available()
        model, version = self._served_name(), self.policy_version
        body = self.request_body(prompt_ids, sampling, model)
        versions: list[int] | None = [] if self.records_token_versions else None  # per token, as it arrives
        self._inflight[model] += 1
        try:
            comp = await (self._stream(body, sampling.top_logprobs, on_token, versions)
                          if on_token is not None or versions is not None
                          else self.client.complete(body, sampling.top_logprobs))
        except VLLMRequestError as exc:
            raise ValueError(str(exc)) from exc
        except VLLMError as exc:
            self.stats["unavailable_errors"] += 1
            code = await self._exit_code_after(exc)
            if code is not None or self.process.state is not ProcessState.READY:
                msg = f"vLLM crashed during the request (exit code {code}); it is being restarted"
            else:
                msg = f"vLLM failed during the request: {exc}"
            raise EngineUnavailableError(msg, RETRY_AFTER_S) from exc
        finally:
            self._release(model)
        if comp.finish_reason not in ("stop", "length"):
            raise EngineUnavailableError(f"vLLM ended the request early (finish_reason={comp.finish_reason!r})",
                                         RETRY_AFTER_S)
        self.stats["generate_requests"] += 1
        self.stats["generated_tokens"] += len(comp.token_ids)
        return GenerationResult(
            token_ids=comp.token_ids, logprobs=comp.logprobs,
            finish_reason=FinishReason.STOP if comp.finish_reason == "stop" else FinishReason.LENGTH,
            policy_version=version, text=comp.text,
            top_logprobs=comp.top_logprobs if sampling.top_logprobs else None,
            token_versions=versions if versions is not None and len(versions) == len(comp.token_ids) else None)

    @property
    def records_token_versions(self) -> bool:
        """Whether requests are streamed from vLLM so that each token carries its version: they can span a swap
        and ``generator.vllm.token_versions`` is on."""
        return self.spans_swaps and self.settings.token_versions

    @property
    def spans_swaps(self) -> bool:
        """Whether a request in flight can span a weight swap (see the module's docstring): full weights with
        ``pause_mode="keep"``."""
        return not self.uses_lora and self.settings.pause_mode == "keep"

    async def _exit_code_after(self, exc: VLLMError, wait_s: float = 1.0) -> int | None:
        """After a dropped connection, the exit code of a vLLM that died (a killed process closes its
        sockets a moment before it can be reaped), else None."""
        deadline = time.monotonic() + (wait_s if isinstance(exc, VLLMConnectionError) else 0.0)
        while True:
            code = self.process.exit_code()
            if code is not None or time.monotonic() >= deadline:
                return code
            await asyncio.sleep(0.05)

    async def _stream(self, body: dict[str, Any], top_k: int, on_token: TokenCallback | None,
                      versions: list[int] | None = None) -> Completion:
        """Stream the completion: each token to ``on_token`` (if given) and the version served when it arrived
        to ``versions`` (if given)."""
        final: Completion | None = None
        async for item in self.client.stream(body, top_k):
            if isinstance(item, Completion):
                final = item
            else:
                for tok, lp in zip(*item, strict=True):
                    if versions is not None:
                        versions.append(self.policy_version)
                    if on_token is not None:
                        on_token(tok, lp)
        assert final is not None
        return final

    def _release(self, model: str) -> None:
        self._inflight[model] -= 1
        if self._inflight[model] <= 0:
            del self._inflight[model]
            if model in self._retired:
                self._spawn(self._unload_adapter(model))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unload_adapter(self, name: str) -> None:
        self._retired.discard(name)
        try:
            await self.client.unload_lora(name)
        except VLLMError as exc:  # a restart already dropped it, or vLLM is down: nothing to free
            log.info("unloading LoRA adapter %s: %s", name, exc)

    # ------------------------------------------------------------------ new weights (called by the seams)
    @property
    def syncing(self) -> bool:
        return self._syncing

    def open_gate(self) -> None:
        self._set_gate(True)

    async def best_effort_resume(self) -> None:
        if self.uses_lora:
            return
        with contextlib.suppress(VLLMError):
            await self.client.resume()

    async def swap_full(self, path: Path, version: int, scorer: Scorer) -> dict[str, float]:
        """Serve the full weights of the model directory ``path`` as ``version``: pause -> reload -> reset the
        prefix cache -> resume (requests wait meanwhile), then the probe against ``scorer``."""
        self._model_dir = Path(path)  # a restart from now on loads these weights from disk
        t1 = time.perf_counter()
        for attempt in (1, 2):  # one retry when vLLM went down mid-swap (it restarts from `path`)
            await self._wait_process_ready(self.settings.sync_timeout_s)
            self._set_gate(False)
            try:
                await self._swap(path)
                break
            except VLLMConnectionError:
                if attempt == 2:
                    raise
                log.warning("vLLM went away during the weight swap; retrying once it is back")
        swap_s = time.perf_counter() - t1
        probe = await self._checked_probe(BASE_NAME, version, scorer)
        self.policy_version = version
        self._after_sync(swap_s)
        return {**probe.as_metrics(), "swap_seconds": swap_s}

    async def _swap(self, path: Path) -> None:
        """pause -> reload -> reset prefix cache -> resume (resume also when a step in between fails)."""
        await self.client.pause(self.settings.pause_mode)
        try:
            await self.client.reload_weights(str(path))
            if not await self.client.reset_prefix_cache(reset_running_requests=True):
                raise VLLMError("vLLM could not reset its prefix cache after the reload: KV computed with the "
                                "old weights would be reused")
        finally:
            await self.client.resume()

    async def swap_adapter(self, path: Path, version: int, scorer: Scorer) -> dict[str, float]:
        """Serve the LoRA adapter at ``path`` as ``version``, under a new name (its prefix cache is its own);
        the previous adapter is unloaded once its last request has finished."""
        name = f"{BASE_NAME}-v{version}"
        await self._wait_process_ready(self.settings.sync_timeout_s)
        t1 = time.perf_counter()
        await self.client.load_lora(name, str(path))
        swap_s = time.perf_counter() - t1
        probe = await self._checked_probe(name, version, scorer)
        old = self._adapter
        self._adapter = (name, Path(path))  # new requests use it from here on; restarts load it
        self.policy_version = version
        if old is not None:
            self._retired.add(old[0])
            if not self._inflight.get(old[0]):
                await self._unload_adapter(old[0])
        self._after_sync(swap_s)
        return {**probe.as_metrics(), "swap_seconds": swap_s}

    def _after_sync(self, seconds: float) -> None:
        self.stats["syncs"] += 1
        self.stats["last_sync_seconds"] = seconds

    async def _checked_probe(self, model: str, version: int, scorer: Scorer) -> ProbeResult:
        probe = await self.probe(scorer, model)
        self.stats["probe_logprob_diff"] = probe.diff
        log.info("probe after the sync to v%d: mean |logprob diff| prompt %.4f, sampled %.4f", version,
                 probe.prompt_diff, probe.gen_diff)
        if probe.diff > self.settings.probe_threshold:
            self.halt(f"after the sync to policy v{version}, vLLM and the trainer disagree on the probe prompt: "
                      f"mean |logprob difference| {probe.diff:.3f} (prompt {probe.prompt_diff:.3f}, sampled "
                      f"{probe.gen_diff:.3f}) > probe_threshold {self.settings.probe_threshold}; vLLM does not "
                      "serve the trained weights (stale or half-loaded weights, or a stale prefix cache)")
            raise TrainingHaltedError(self.halted_reason or "")
        return probe

    async def probe(self, scorer: Scorer, model: str | None = None) -> ProbeResult:
        """Score the probe prompt (and a few tokens sampled after it) on vLLM and with ``scorer``."""
        model = model or self._served_name()
        ids = self._probe_ids
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

    def halt(self, reason: str) -> None:
        if self.halted_reason is None:
            self.halted_reason = reason
            log.error("training halted: %s", reason)

    # ------------------------------------------------------------------ the rest
    def describe(self) -> dict[str, Any]:
        return {"kind": "vllm", "device": self.settings.platform, "vllm_url": self.url,
                "vllm_platform": self.settings.platform,
                "vllm_dtype": self.settings.dtype, "halted": self.halted_reason,
                "probe_logprob_diff": self.stats.get("probe_logprob_diff")}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.to_thread(self.close_sync)
        with contextlib.suppress(Exception):
            await self.client.aclose()

    def shutdown(self) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        """Stop vLLM without an event loop (scripts, test teardown)."""
        self.process.stop()
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)
