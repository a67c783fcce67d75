"""``VLLMGenerator``: vLLM (a managed subprocess on loopback) generates. It trains nothing: a learner does, and
the new weights reach vLLM through a seam after every step (``generators/vllm/sync.py``: safetensors + reload, or
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
import time
from pathlib import Path
from typing import Any

from agentjet.engines.base import (
    FinishReason,
    GenerationResult,
    Generator,
    SamplingParams,
    TokenCallback,
)
from agentjet.engines.errors import EngineUnavailableError, GenerationError
from agentjet.generators.vllm.client import (
    Completion,
    VLLMClient,
    VLLMConnectionError,
    VLLMError,
    VLLMRequestError,
)
from agentjet.generators.vllm.gate import RETRY_AFTER_S, ServingGate
from agentjet.generators.vllm.launch import BASE_NAME, VLLMLaunch
from agentjet.generators.vllm.probe import probe_prompt_ids
from agentjet.generators.vllm.process import ManagedProcess, ProcessState, Timing
from agentjet.generators.vllm.swaps import ServedModels, WeightSwaps
from agentjet.runtime.proc import free_port
from agentjet.settings import VLLMSettings

log = logging.getLogger(__name__)

__all__ = ["BASE_NAME", "VLLMGenerator"]


class VLLMGenerator(Generator):
    """Generation on vLLM. Its parts: ``launch`` (the subprocess's command line), ``process`` (supervision),
    ``client`` (HTTP), ``gate`` (held during a swap), ``served`` (names and requests in flight) and ``swaps``
    (new weights and the probe, called by the weight-sync seams)."""

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
        ``weights/io.py``). ``lora_adapters``: new weights arrive as LoRA adapters under versioned names.
        ``max_context``: the model's own limit (vLLM serves ``min(max_model_len, max_context)``)."""
        self.settings = s = settings
        self._tokenizer = tokenizer
        self.uses_lora = lora_adapters
        self._model_limit = max_context
        self.launch = VLLMLaunch(s, model_dir, work_dir, s.port or free_port(s.host), seed=seed,
                                 uses_lora=lora_adapters, max_context=lambda: self.max_context)
        self.url = self.launch.url
        self.client = VLLMClient(self.url, request_timeout_s=s.request_timeout_s,
                                 control_timeout_s=s.control_timeout_s)
        self.process = ManagedProcess(self.launch.spec, Timing(
            startup_timeout_s=s.startup_timeout_s, stop_timeout_s=s.stop_timeout_s, max_restarts=s.max_restarts,
            restart_backoff_s=s.restart_backoff_s, watch_interval_s=s.watch_interval_s))
        self.policy_version = 0
        # named adapters (layouts/vllm_adapters.py): the version each one serves; requests name one of them
        self.adapter_versions: dict[str, int] = {}
        self.halted_reason: str | None = None
        self.stop_token_ids = set(stop_ids)  # tokens that end a generation (besides a request's own)
        self.gate = ServingGate(s.sync_timeout_s)
        self.served = ServedModels(self.client, self.launch)
        self.stats: dict[str, float] = {"generate_requests": 0, "generated_tokens": 0, "train_steps": 0,
                                        "syncs": 0, "last_sync_seconds": 0.0, "probe_logprob_diff": float("nan"),
                                        "unavailable_errors": 0}
        self.swaps = WeightSwaps(self.client, self.process, self.gate, self.served, s,
                                 probe_prompt_ids(tokenizer, self.max_context), self.stats,
                                 on_served=self._serve, halt=self.halt)
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

    def engine_stats(self) -> dict[str, Any]:
        c = self.process.counters
        return {**self.stats, "policy_version": self.policy_version, "process_state": self.process.state.value,
                "process_starts": c.starts, "process_crashes": c.crashes, "process_restarts": c.restarts,
                "halted_reason": self.halted_reason, "url": self.url}

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

    # ------------------------------------------------------------------ the subprocess
    def start(self) -> None:
        """Start vLLM; blocks until healthy."""
        self.process.start()

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

    # ------------------------------------------------------------------ generation
    def _validate(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) >= self.max_context:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_context} tokens")
        vocab = len(self.tokenizer)
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt_ids must be token ids in [0, {vocab})")

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams, model: str) -> dict[str, Any]:
        """The /v1/completions body for one generation (token ids in, token ids and logprobs out)."""
        body: dict[str, Any] = {
            "model": model, "prompt": list(prompt_ids),
            "max_tokens": min(sampling.max_tokens, self.max_context - len(prompt_ids)),
            "temperature": sampling.temperature, "top_p": sampling.top_p,
            "logprobs": max(1, sampling.top_logprobs),
            "return_token_ids": True, "return_tokens_as_token_ids": True,
            # our stop ids, not vLLM's idea of EOS: the same rule as the embedded engine
            "ignore_eos": True, "stop_token_ids": sorted(self.stop_token_ids | set(sampling.stop_token_ids)),
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
                       on_token: TokenCallback | None = None, adapter: str | None = None) -> GenerationResult:
        self._validate(prompt_ids)
        await self.gate.wait()
        self._check_available()
        model, version = self._route(adapter)
        body = self.request_body(prompt_ids, sampling, model)
        versions: list[int] | None = [] if self.records_token_versions else None  # per token, as it arrives
        self.served.acquire(model)
        try:
            comp = await (self._stream(body, sampling.top_logprobs, on_token, versions)
                          if on_token is not None or versions is not None
                          else self.client.complete(body, sampling.top_logprobs))
        except VLLMRequestError as exc:
            raise ValueError(str(exc)) from exc
        except VLLMError as exc:
            raise await self._unavailable(exc) from exc
        finally:
            self.served.release(model)
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

    def _route(self, adapter: str | None) -> tuple[str, int]:
        """(the name vLLM serves the request's policy under, its version): the single policy, or named adapter
        ``adapter``'s current versioned LoRA; a ``GenerationError`` (``param="model"``) for an adapter not
        served."""
        if adapter is None:
            return self.served.current(), self.policy_version
        if adapter not in self.adapter_versions or adapter not in self.launch.adapters:
            served = sorted(self.adapter_versions)
            raise GenerationError(f"no LoRA adapter {adapter!r} on this vLLM server" + (
                f": its adapters are {served}" if served else ": it serves one policy, not named adapters"),
                param="model")
        return self.served.current(adapter), self.adapter_versions[adapter]

    async def _unavailable(self, exc: VLLMError) -> EngineUnavailableError:
        """A request that vLLM failed: say whether it crashed (it is being restarted) or only failed."""
        self.stats["unavailable_errors"] += 1
        code = await self._exit_code_after(exc)
        if code is not None or self.process.state is not ProcessState.READY:
            msg = f"vLLM crashed during the request (exit code {code}); it is being restarted"
        else:
            msg = f"vLLM failed during the request: {exc}"
        return EngineUnavailableError(msg, RETRY_AFTER_S)

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

    # ------------------------------------------------------------------ the served version
    def _serve(self, version: int) -> None:
        """A swap's probe passed: ``version`` serves new requests (and labels the tokens that arrive from now)."""
        self.policy_version = version

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
        self.served.cancel()
        await asyncio.to_thread(self._stop)
        with contextlib.suppress(Exception):
            await self.client.aclose()

    def _stop(self) -> None:
        """Stop the vLLM process and remove what its launch wrote (blocking: ``close`` runs it in a thread)."""
        self.process.stop()
        self.launch.cleanup()
