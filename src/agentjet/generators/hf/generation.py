"""Static batching, the embedded engine's earlier generation path (``EngineSettings.batching = "static"``): a
batch of requests gathered by the request batcher is left-padded and run with a dynamic KV cache until its
longest request ends. Kept as the baseline that ``benchmarks/serving/engine.py`` measures the continuous scheduler
(``scheduler.py``) against, and as a fallback for models the slot cache does not fit.
"""

from __future__ import annotations

from typing import Any

import torch

from agentjet.engines.base import GenerationResult
from agentjet.engines.sampling import sample_next
from agentjet.generators.hf.batcher import Request
from agentjet.generators.hf.rows import Row, RowRules, top_lists


class StaticGenerator:
    def __init__(self, model: torch.nn.Module, rules: RowRules, device: torch.device) -> None:
        self.model = model
        self.rules = rules
        self.device = device
        self.stats = {"generate_batches": 0, "generate_requests": 0, "generated_tokens": 0}

    @property
    def tokenizer(self) -> Any:
        return self.rules.tokenizer

    def prepare(self, req: Request, policy_version: int = 0) -> Row:
        return self.rules.prepare(req, policy_version)

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
            r.policy_version = policy_version
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
            tops = top_lists(top, rows)
            for i, row in enumerate(rows):
                if row.finish is None:
                    self.rules.accept(row, tok_list[i], lp_list[i], tops[i])
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
        return [self.rules.result(r) for r in rows]
