"""Batched generation for the embedded engine: left-padded batches with a KV cache, per-row sampling
parameters, seeds and stop conditions, and exact behaviour logprobs.

Each request is prepared on its own first (its seed, its stop set, its limits checked against the model), so a
request the model cannot serve fails alone, naming its parameter, before any batch starts. Stop strings are
checked incrementally: only the last few tokens are decoded at each step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from agentjet.engines.base import FinishReason, GenerationError, GenerationResult, SamplingParams
from agentjet.engines.batcher import Request
from agentjet.engines.sampling import sample_next

# A character is at most 4 UTF-8 bytes and a byte-level token holds at least one byte, so the last
# ``4 * len(stop) + 2`` tokens always hold a stop string that the newest token completed.
_STOP_WINDOW_BYTES = 4


@dataclass
class Row:
    """One request's state inside a batch."""

    req: Request
    generator: torch.Generator
    stop_ids: frozenset[int]
    budget: int
    stop_window: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: FinishReason | None = None
    cut_text: str | None = None  # the text cut before a stop string, when one matched

    @property
    def params(self) -> SamplingParams:
        return self.req.sampling


class HFGenerator:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, device: torch.device, max_context: int,
                 stop_ids: set[int], seed: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_context = max_context
        self.stop_ids = frozenset(stop_ids)
        self.vocab_size = len(tokenizer)
        self._rng = random.Random(seed)
        self.stats = {"generate_batches": 0, "generate_requests": 0, "generated_tokens": 0}

    # ------------------------------------------------------------------ per request
    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise GenerationError("the prompt is empty", param="messages")
        if len(prompt_ids) >= self.max_context:
            raise GenerationError(f"the prompt has {len(prompt_ids)} tokens; the model's context is "
                                  f"{self.max_context} tokens", param="messages")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise GenerationError(f"prompt token ids must be in [0, {self.vocab_size})", param="messages")

    def prepare(self, req: Request) -> Row:
        """Everything about one request that can fail, done for it alone."""
        p = req.sampling
        self.check_prompt(req.prompt_ids)
        if p.top_k > self.vocab_size:
            raise GenerationError(f"top_k must be at most the vocabulary size {self.vocab_size} (got {p.top_k})",
                                  param="top_k")
        if any(t < 0 or t >= self.vocab_size for t in p.stop_token_ids):
            raise GenerationError(f"stop token ids must be in [0, {self.vocab_size})", param="stop_token_ids")
        g = torch.Generator(device=self.device)
        g.manual_seed(p.seed if p.seed is not None else self._rng.getrandbits(63))
        window = max((len(s) for s in p.stop), default=0) * _STOP_WINDOW_BYTES + 2
        return Row(req, g, self.stop_ids | frozenset(p.stop_token_ids),
                   min(p.max_tokens, self.max_context - len(req.prompt_ids)), window)

    def _stop_text(self, row: Row) -> str | None:
        """The whole text cut before the first stop string, if the newest token completed one."""
        tail = self.tokenizer.decode(row.ids[-row.stop_window:], skip_special_tokens=True)
        if not any(s in tail for s in row.params.stop):
            return None
        text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
        hits = [text.find(s) for s in row.params.stop if s in text]
        return text[: min(hits)] if hits else None

    def _accept(self, row: Row, token: int, logprob: float, top: tuple[torch.Tensor, torch.Tensor] | None,
                i: int) -> None:
        row.ids.append(token)
        row.logprobs.append(logprob)
        row.req.emit(token, logprob)
        if top is not None and row.params.top_logprobs:
            k = row.params.top_logprobs
            row.top.append(list(zip(top[1][i, :k].tolist(), top[0][i, :k].tolist(), strict=True)))
        if token in row.stop_ids:
            row.finish = FinishReason.STOP
        elif row.params.stop and (cut := self._stop_text(row)) is not None:
            row.finish, row.cut_text = FinishReason.STOP, cut
        elif len(row.ids) >= row.budget:
            row.finish = FinishReason.LENGTH

    # ------------------------------------------------------------------ the batch
    @torch.inference_mode()
    def generate_batch(self, rows: list[Row], policy_version: int) -> list[GenerationResult]:
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        bsz = len(rows)
        lengths = [len(r.req.prompt_ids) for r in rows]
        width = max(lengths)
        input_ids = torch.full((bsz, width), pad_id, dtype=torch.long)
        attn = torch.zeros((bsz, width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - lengths[i]:] = torch.tensor(r.req.prompt_ids)
            attn[i, width - lengths[i]:] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        params = [r.params for r in rows]
        generators = [r.generator for r in rows]
        n_top = max(p.top_logprobs for p in params)

        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        cur_pos = positions[:, -1:]
        for _step in range(max(r.budget for r in rows)):
            tokens, lps, top = sample_next(logits, params, generators, n_top)
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            for i, row in enumerate(rows):
                if row.finish is None:
                    self._accept(row, tok_list[i], lp_list[i], top, i)
            if all(r.finish is not None for r in rows):
                break
            attn = torch.cat([attn, attn.new_ones((bsz, 1))], dim=-1)
            cur_pos = cur_pos + 1
            out = self.model(input_ids=tokens[:, None], attention_mask=attn, position_ids=cur_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :]
        self.stats["generate_batches"] += 1
        self.stats["generate_requests"] += bsz
        self.stats["generated_tokens"] += sum(len(r.ids) for r in rows)
        return [self._result(r, policy_version) for r in rows]

    def _result(self, row: Row, policy_version: int) -> GenerationResult:
        text = row.cut_text if row.cut_text is not None else self.tokenizer.decode(row.ids, skip_special_tokens=True)
        return GenerationResult(token_ids=row.ids, logprobs=row.logprobs, finish_reason=row.finish or FinishReason.LENGTH,
                                policy_version=policy_version, text=text,
                                top_logprobs=row.top if row.params.top_logprobs else None)
