"""The embedded engine: transformers + torch on CPU or one CUDA device, configured by ``EngineSettings``.

``HFEngine`` composes three parts around one copy of the weights:
- the request batcher (``engines/batcher.py``) gathers concurrent ``generate`` calls;
- ``HFGenerator`` (``generation.py``) runs a batch with a KV cache and exact behaviour logprobs;
- ``PolicyTrainer`` (``training.py``) runs policy-gradient steps that update the weights in place.

All torch work runs on one worker thread, so generation and training never overlap: a call that arrives
during a train step waits for it, then generates with the new weights (its reply carries the new version).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentjet.engines.base import (
    Engine,
    GenerationError,
    GenerationResult,
    SamplingParams,
    TokenCallback,
    TrainSample,
)
from agentjet.engines.batcher import Request, RequestBatcher
from agentjet.engines.hf.generation import HFGenerator
from agentjet.engines.hf.training import PolicyTrainer
from agentjet.models import resolve_model
from agentjet.settings import EngineSettings, LoraSettings, LossSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
STATE_FILE = "agentjet_state.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(setting: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. An explicit CUDA device must exist."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {setting!r} was asked for, but torch sees no CUDA device")
    return device


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA, float32 on CPU."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]


def _stop_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for value in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    return ids


class HFEngine(Engine):
    def __init__(self, model: str | Path = "smollm2-135m-instruct", settings: EngineSettings | None = None,
                 loss: LossSettings | None = None, learning_rate: float = 1e-5) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.settings = settings = settings or EngineSettings()
        self.model_path = resolve_model(str(model))
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.dtype, self.device)
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        causal_lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype).to(self.device)
        causal_lm.eval()
        if settings.gradient_checkpointing:
            causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.causal_lm = causal_lm
        self.model = self._with_lora(causal_lm, settings.lora)
        model_ctx = int(getattr(causal_lm.config, "max_position_embeddings", 4096))
        self._max_context = min(settings.max_context or model_ctx, model_ctx)
        self.generator = HFGenerator(self.model, self._tokenizer, self.device, self._max_context,
                                     _stop_ids(causal_lm, self._tokenizer), settings.seed)
        pad_id = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        self.trainer = PolicyTrainer(self.model, causal_lm, pad_id, self.device, settings, loss or LossSettings(),
                                     learning_rate)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentjet-engine")
        self.batcher = RequestBatcher(self._run_batch, settings.max_batch_size, settings.batch_wait_ms / 1000)
        self.policy_version = 0

    @staticmethod
    def _with_lora(causal_lm: Any, lora: LoraSettings) -> Any:
        if not lora.enabled:
            return causal_lm
        from peft import LoraConfig, get_peft_model

        return get_peft_model(causal_lm, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                    target_modules=list(lora.targets), task_type="CAUSAL_LM"))

    # ----------------------------------------------------------------- properties
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def lora(self) -> LoraSettings | None:
        """The LoRA settings when adapters are trained, else None (full fine-tuning)."""
        return self.settings.lora if self.settings.lora.enabled else None

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.generator.stats, **self.batcher.stats}

    def describe(self) -> dict[str, Any]:
        lora = self.settings.lora
        return {"kind": "hf", "model": str(self.model_path), "device": str(self.device),
                "dtype": str(self.dtype).removeprefix("torch."),
                "lora": {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)} if lora.enabled
                else None,
                "gradient_checkpointing": self.settings.gradient_checkpointing,
                "max_batch_size": self.settings.max_batch_size, "max_context": self._max_context}

    # ----------------------------------------------------------------- generation
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None) -> GenerationResult:
        self.generator.check_prompt(prompt_ids)
        return await self.batcher.submit(prompt_ids, sampling, on_token)

    async def _run_batch(self, reqs: list[Request]) -> list[GenerationResult | Exception]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_batch_sync, reqs)

    def _run_batch_sync(self, reqs: list[Request]) -> list[GenerationResult | Exception]:
        out: list[GenerationResult | Exception | None] = [None] * len(reqs)
        rows, where = [], []
        for i, r in enumerate(reqs):
            try:
                rows.append(self.generator.prepare(r))
                where.append(i)
            except GenerationError as exc:  # this request alone
                out[i] = exc
        if rows:
            for i, res in zip(where, self.generator.generate_batch(rows, self.policy_version), strict=True):
                out[i] = res
        return [r for r in out if r is not None]

    # ----------------------------------------------------------------- training
    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        if not batch:
            raise ValueError("train_step needs at least one sample")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.train_step_sync, batch)

    def train_step_sync(self, batch: list[TrainSample]) -> dict[str, float]:
        """A train step on the caller's thread (prefer ``await train_step``)."""
        metrics = self.trainer.train_step(batch)
        self.policy_version += 1
        return {**metrics, "policy_version": float(self.policy_version)}

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine's torch thread: between generation batches and train steps, never during one
        (to swap in weights trained elsewhere: ``agentjet.distributed``)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def score(self, samples: list[TrainSample]) -> list[list[float]]:
        return self.trainer.score(samples)

    def set_learning_rate(self, lr: float) -> None:
        self.trainer.set_learning_rate(lr)

    def set_loss(self, loss: LossSettings) -> None:
        self.trainer.loss = loss

    # ----------------------------------------------------------------- persistence
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        self._tokenizer.save_pretrained(path)
        self.trainer.save_optimizer(path)
        state = {"policy_version": self.policy_version, "engine": self.settings.model_dump(mode="json"),
                 "source_model": str(self.model_path)}
        (path / STATE_FILE).write_text(json.dumps(state, indent=2))

    def load(self, path: Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors weights in {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f), device=str(self.device)))
        if self.settings.lora.enabled:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state)
        else:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if self.causal_lm.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise ValueError(f"checkpoint {path} does not fit the model: missing={missing} unexpected={unexpected}")
        self.trainer.load_optimizer(path)
        state_file = path / STATE_FILE
        if state_file.exists():
            self.policy_version = int(json.loads(state_file.read_text())["policy_version"])

    async def close(self) -> None:
        await self.batcher.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
