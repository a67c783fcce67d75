"""An in-process learner's weights and state on disk: its exports (full weights, a PEFT adapter directory) and its
checkpoints (weights, optimizer, policy version). Each function runs on the learner's worker thread; ``activate``
makes a named adapter the active one first (``InProcessLearner.activate``), so nothing runs between the switch
and the work. A named adapter's files hold that adapter alone (another adapter's checkpoint is its own).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentjet.engines.model import PolicyModel
from agentjet.learners.policy_step import PolicyOptimizer
from agentjet.weights.checkpoints import LEARNER_STATE, read_policy_version
from agentjet.weights.io import (
    ADAPTER_WEIGHTS_FILE,
    export_full,
    export_lora,
    export_merged_adapter,
    export_named_adapter,
    load_adapter_state,
    load_state_into,
    write_adapter_files,
)

OPTIMIZER_FILE = "optimizer.pt"


def merged_weights(policy: PolicyModel, adapter: str | None, activate: Callable[[], None], target: Path,
                   dtype: str | None) -> Path:
    """Full weights; under LoRA, a merged copy (the live module keeps its adapters); a named adapter's: the base
    with that adapter alone merged, computed without copying the module."""
    if adapter is not None:
        activate()  # fails clearly when the adapter was removed
        return export_merged_adapter(policy.causal_lm, adapter, policy.tokenizer, target, dtype)
    lm = policy.causal_lm if policy.lora is None else copy.deepcopy(policy.model).merge_and_unload()
    return export_full(lm, policy.tokenizer, target, dtype)


def adapter_directory(policy: PolicyModel, adapter: str | None, activate: Callable[[], None], target: Path) -> Path:
    """The PEFT adapter directory: a named adapter's alone, else the module's (``save_pretrained``)."""
    if adapter is None:
        return export_lora(policy.model, target)
    activate()
    return export_named_adapter(policy.model, adapter, target)


def save_checkpoint(policy: PolicyModel, adapter: str | None, activate: Callable[[], None],
                    optimizer: PolicyOptimizer, state: dict[str, Any], path: Path) -> None:
    """The weights (a named adapter's alone), the tokenizer, the optimizer's state and ``state`` (the learner's
    version and settings) in ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    if adapter is not None:
        activate()
        write_adapter_files(policy.model, adapter, path)
    else:
        policy.model.save_pretrained(path, safe_serialization=True)
    policy.tokenizer.save_pretrained(path)
    torch.save(optimizer.state_dict(), path / OPTIMIZER_FILE)
    (path / LEARNER_STATE).write_text(json.dumps(state, indent=2))


def load_checkpoint(policy: PolicyModel, adapter: str | None, activate: Callable[[], None],
                    optimizer: Callable[[], PolicyOptimizer], has_optimizer: bool, path: Path) -> int:
    """A checkpoint's weights into the module in place, and its optimizer state into ``optimizer()`` (when the
    learner has made none yet and the checkpoint holds none, none is made); its policy version."""
    from safetensors.torch import load_file

    files = [path / ADAPTER_WEIGHTS_FILE] if adapter is not None else sorted(path.glob("*.safetensors"))
    if not files or not all(f.exists() for f in files):
        what = f"adapter weights ({ADAPTER_WEIGHTS_FILE})" if adapter is not None else ".safetensors weights"
        raise FileNotFoundError(f"no {what} in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f), device=str(policy.device)))
    if adapter is not None:
        activate()
        load_adapter_state(policy.model, adapter, state, path)
    elif policy.lora is not None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy.model, state)
    else:
        load_state_into(policy.model, state, path)
    opt_file = path / OPTIMIZER_FILE
    if has_optimizer or opt_file.exists():
        if opt_file.exists():
            optimizer().load_state_dict(torch.load(opt_file, map_location=policy.device, weights_only=True))
        else:
            optimizer().sync_masters()
    return read_policy_version(path)
