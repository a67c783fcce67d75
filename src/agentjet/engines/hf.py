"""The embedded engine: transformers + torch on CPU or one CUDA device.

All torch work (generation batches and train steps) runs on one worker thread, so generation and
training never overlap: calls that arrive during an update wait, then run with the new weights.
Concurrent ``generate`` calls are gathered into left-padded batches with a KV cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentjet.engines.base import (
    Engine,
    FinishReason,
    GenerationResult,
    SamplingParams,
    TokenCallback,
    TrainConfig,
    TrainSample,
)
from agentjet.engines.policy_step import (
    StepSums,
    collate,
    micro_batch_loss,
    micro_batches,
    total_loss_weight,
    trained_token_logprobs,
)
from agentjet.engines.sampling import sample_next
from agentjet.models import resolve_model

log = logging.getLogger(__name__)

T = TypeVar("T")

STATE_FILE = "agentjet_state.json"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj")


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[GenerationResult]
    on_token: TokenCallback | None = None

    def emit(self, token: int, logprob: float) -> None:
        """Called on the worker thread: hand the token to the event loop."""
        if self.on_token is not None and not self.future.done():
            self.future.get_loop().call_soon_threadsafe(self.on_token, token, logprob)


class HFEngine(Engine):
    def __init__(
        self,
        model: str | Path = "smollm2-135m-instruct",
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = 8,
        batch_wait_ms: float = 5.0,
        max_context: int | None = None,
        train_config: TrainConfig | None = None,
        lora: LoraSettings | None = None,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(str(model))
        self.model_path = path
        self.device = torch.device(device)
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        net = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        net.eval()
        self.lora = lora
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            net = get_peft_model(
                net,
                LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
            )
        self.model = net
        self.config = train_config or TrainConfig()
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        model_ctx = int(getattr(self._base_model().config, "max_position_embeddings", 4096))
        self._max_context = min(max_context or model_ctx, model_ctx)
        self._stop_ids = self._default_stop_ids()
        self._rng = random.Random(seed)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentjet-engine")
        self._queue: asyncio.Queue[_Request] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._reference: torch.nn.Module | None = None
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.config.learning_rate,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )
        self.policy_version = 0
        self.stats = {"generate_batches": 0, "generate_requests": 0, "generated_tokens": 0, "train_steps": 0}

    # ----------------------------------------------------------------- properties
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_context(self) -> int:
        return self._max_context

    def _base_model(self) -> Any:
        """The underlying ``*ForCausalLM`` (unwrapping PEFT)."""
        return self.model.get_base_model() if self.lora is not None else self.model

    def _default_stop_ids(self) -> set[int]:
        ids: set[int] = set()
        eos = self._base_model().generation_config.eos_token_id
        for value in (eos, self._tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(value)
        return ids

    # ----------------------------------------------------------------- generation
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       on_token: TokenCallback | None = None) -> GenerationResult:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) >= self._max_context:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self._max_context} tokens"
            )
        vocab = len(self._tokenizer)
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt_ids must be token ids in [0, {vocab})")
        loop = asyncio.get_running_loop()
        if self._queue is None or self._batcher is None or self._batcher.done() or self._batcher.get_loop() is not loop:
            self._queue = asyncio.Queue()  # (re)start the batcher on the current event loop
            self._batcher = loop.create_task(self._batch_loop())
        fut: asyncio.Future[GenerationResult] = loop.create_future()
        await self._queue.put(_Request(list(prompt_ids), sampling, fut, on_token))
        return await fut

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            batch = [first]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout))
                except TimeoutError:
                    break
            while len(batch) < self.max_batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            live = [r for r in batch if not r.future.cancelled()]
            if not live:
                continue
            try:
                results = await loop.run_in_executor(self._executor, self._generate_batch, live)
            except Exception as exc:  # deliver the failure to every waiting caller, keep serving
                log.exception("generation batch failed")
                for r in live:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            for r, res in zip(live, results, strict=True):
                if not r.future.done():
                    r.future.set_result(res)

    def _generator_for(self, sampling: SamplingParams) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(sampling.seed if sampling.seed is not None else self._rng.getrandbits(63))
        return g

    @torch.inference_mode()
    def _generate_batch(self, reqs: list[_Request]) -> list[GenerationResult]:
        tok = self._tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        bsz = len(reqs)
        lengths = [len(r.prompt_ids) for r in reqs]
        width = max(lengths)
        input_ids = torch.full((bsz, width), pad_id, dtype=torch.long)
        attn = torch.zeros((bsz, width), dtype=torch.long)
        for i, r in enumerate(reqs):
            input_ids[i, width - lengths[i]:] = torch.tensor(r.prompt_ids)
            attn[i, width - lengths[i]:] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        params = [r.sampling for r in reqs]
        generators = [self._generator_for(p) for p in params]
        budgets = [min(p.max_tokens, self._max_context - n) for p, n in zip(params, lengths, strict=True)]
        stop_ids = [self._stop_ids | set(p.stop_token_ids) for p in params]
        n_top = max(p.top_logprobs for p in params)

        out_ids: list[list[int]] = [[] for _ in reqs]
        out_lp: list[list[float]] = [[] for _ in reqs]
        out_top: list[list[list[tuple[int, float]]]] = [[] for _ in reqs]
        texts: list[str | None] = [None] * bsz  # set when a stop string cut the text
        finish: list[FinishReason | None] = [None] * bsz

        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        cur_pos = positions[:, -1:]
        for _step in range(max(budgets)):
            tokens, lps, top = sample_next(logits, params, generators, n_top)
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            for i in range(bsz):
                if finish[i] is not None:
                    continue
                out_ids[i].append(tok_list[i])
                out_lp[i].append(lp_list[i])
                reqs[i].emit(tok_list[i], lp_list[i])
                if top is not None and params[i].top_logprobs:
                    k = params[i].top_logprobs
                    out_top[i].append(list(zip(top[1][i, :k].tolist(), top[0][i, :k].tolist(), strict=True)))
                if tok_list[i] in stop_ids[i]:
                    finish[i] = FinishReason.STOP
                elif params[i].stop and (cut := self._match_stop_string(out_ids[i], params[i].stop)) is not None:
                    finish[i], texts[i] = FinishReason.STOP, cut
                elif len(out_ids[i]) >= budgets[i]:
                    finish[i] = FinishReason.LENGTH
            if all(f is not None for f in finish):
                break
            attn = torch.cat([attn, attn.new_ones((bsz, 1))], dim=-1)
            cur_pos = cur_pos + 1
            out = self.model(input_ids=tokens[:, None], attention_mask=attn, position_ids=cur_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :]

        results = []
        for i in range(bsz):
            text = texts[i] if texts[i] is not None else tok.decode(out_ids[i], skip_special_tokens=True)
            results.append(GenerationResult(
                token_ids=out_ids[i], logprobs=out_lp[i], finish_reason=finish[i] or FinishReason.LENGTH,
                policy_version=self.policy_version, text=text,
                top_logprobs=out_top[i] if params[i].top_logprobs else None,
            ))
        self.stats["generate_batches"] += 1
        self.stats["generate_requests"] += bsz
        self.stats["generated_tokens"] += sum(len(x) for x in out_ids)
        return results

    def _match_stop_string(self, ids: list[int], stops: tuple[str, ...]) -> str | None:
        """If the decoded text contains a stop string, return the text cut before it."""
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        hits = [text.find(s) for s in stops if s and s in text]
        return text[: min(hits)] if hits else None

    # ----------------------------------------------------------------- training
    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        if not batch:
            raise ValueError("train_step needs at least one sample")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.train_step_sync, batch)

    def _decoder_and_head(self) -> tuple[torch.nn.Module, torch.Tensor]:
        base = self._base_model()
        return base.base_model, base.get_output_embeddings().weight

    def _micro_batches(self, batch: list[TrainSample]) -> list[list[TrainSample]]:
        return micro_batches(batch, self.config.micro_batch_tokens)

    def _forward_trained_logprobs(
        self, samples: list[TrainSample], model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs of every trained token (loss_mask == 1) in ``samples``, flattened in order.
        Returns (logprobs [N], the trained-position mask over ``[:, 1:]`` of the padded batch)."""
        decoder, head = self._decoder_and_head()
        if model is not None:
            decoder, head = model.base_model, model.get_output_embeddings().weight
        padded = collate(samples, self._tokenizer.pad_token_id or 0, self.device)
        lp = trained_token_logprobs(decoder, head, padded, self.config.logprob_chunk_tokens, self.config.bf16)
        return lp, padded.predicted_mask

    def _reference_model(self) -> torch.nn.Module:
        if self._reference is None:
            import copy

            self._reference = copy.deepcopy(self._base_model()).eval().requires_grad_(False)
        return self._reference

    def train_step_sync(self, batch: list[TrainSample]) -> dict[str, float]:
        """Synchronous train step (on the caller's thread). Prefer ``await train_step``."""
        start = time.perf_counter()
        cfg = self.config
        total_weight = total_loss_weight(batch)
        if total_weight <= 0:
            raise ValueError("train_step: the batch has no trained tokens (all loss masks are 0)")
        self.model.train()
        sums = StepSums()
        for mb in self._micro_batches(batch):
            lp, _ = self._forward_trained_logprobs(mb)
            ref = None
            if cfg.kl_coef > 0:
                with torch.no_grad():
                    ref = self._forward_trained_logprobs(mb, model=self._reference_model())[0]
            res = micro_batch_loss(lp, mb, cfg, ref)
            (res.loss_sum / total_weight).backward()
            sums.add(res, lp.numel())
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.policy_version += 1
        self.stats["train_steps"] += 1
        return {
            **sums.metrics(total_weight),
            "grad_norm": float(grad_norm),
            "samples": float(len(batch)),
            "step_seconds": time.perf_counter() - start,
            "policy_version": float(self.policy_version),
        }

    @torch.no_grad()
    def score(self, samples: list[TrainSample]) -> list[list[float]]:
        """Current-policy logprobs of each sample's trained tokens (teacher forcing)."""
        self.model.eval()
        out = []
        for s in samples:
            lp, _ = self._forward_trained_logprobs([s])
            out.append(lp.tolist())
        return out

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine's torch thread: between generation batches and train steps, never during
        one (used to swap in weights trained elsewhere: ``agentjet.distributed``)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def set_learning_rate(self, lr: float) -> None:
        if not lr > 0:
            raise ValueError("learning rate must be > 0")
        self.config.learning_rate = lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ----------------------------------------------------------------- persistence
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        self._tokenizer.save_pretrained(path)
        torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
        state = {"policy_version": self.policy_version, "train_config": asdict(self.config),
                 "lora": asdict(self.lora) if self.lora else None, "source_model": str(self.model_path)}
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
        if self.lora is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state)
        else:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise ValueError(f"checkpoint {path} does not fit the model: missing={missing} unexpected={unexpected}")
        opt_file = path / OPTIMIZER_FILE
        if opt_file.exists():
            self.optimizer.load_state_dict(torch.load(opt_file, map_location=self.device, weights_only=True))
        state_file = path / STATE_FILE
        if state_file.exists():
            self.policy_version = int(json.loads(state_file.read_text())["policy_version"])

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._batcher
            self._batcher = None
            self._queue = None
        self._executor.shutdown(wait=False, cancel_futures=True)
