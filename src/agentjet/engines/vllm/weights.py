"""Weight export for vLLM: the trainer's weights as a loadable model directory (full fine-tuning) or a
PEFT adapter directory (LoRA), each in its own versioned directory.

Full exports are always *untied*: ``tie_word_embeddings: false`` and an explicit ``lm_head.weight`` (the rule
is :func:`untied_named_tensors`, which the NCCL transfer follows too). vLLM's CPU build keeps a prepacked copy
of the output head, and a tied checkpoint has no ``lm_head`` tensor to trigger its re-processing on reload: the
served model would be the new body with the old head (see docs/vllm.md). vLLM is started from an untied export
too, so its head is a parameter of its own that every reload replaces.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

VERSION_DIR = re.compile(r"^v(\d{6,})$")
WEIGHTS_FILE = "model.safetensors"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:06d}"


def untied_named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tied-head rule, for every writer (safetensors export, NCCL transfer): the model's state tensors by
    checkpoint name, detached and where they live (no copy, no cast), then ``lm_head.weight`` when the state
    dict has none although the model has an output head (a tied one). A tied head may share storage with the
    input embedding; a writer that needs separate storage copies it."""
    names: set[str] = set()
    for name, tensor in model.state_dict().items():
        names.add(name)
        yield name, tensor.detach()
    head = model.get_output_embeddings()
    if "lm_head.weight" not in names and head is not None:
        yield "lm_head.weight", head.weight.detach()


def untied_state_dict(model: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The model's tensors, each its own contiguous copy (no shared storage, as safetensors requires), with
    ``lm_head.weight`` present even when the model ties it to the input embedding."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in untied_named_tensors(model):
        t = tensor
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if t.data_ptr() in seen:  # tied to a tensor already taken (the output head)
            t = t.clone()
        seen.add(t.data_ptr())
        out[name] = t.contiguous().cpu()
    return out


def _write_atomically(target: Path, write: Any) -> Path:
    """Write into a temp dir beside ``target`` and rename it in: vLLM never sees half a checkpoint."""
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def export_full(model: Any, tokenizer: Any, target: Path, dtype: str = "bfloat16") -> Path:
    """A complete, untied Hugging Face model directory (config, generation config, tokenizer, weights)."""
    from safetensors.torch import save_file

    torch_dtype = DTYPES.get(dtype)

    def write(tmp: Path) -> None:
        save_file(untied_state_dict(model, torch_dtype), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        config.tie_word_embeddings = False
        if torch_dtype is not None:
            config.dtype = torch_dtype
        config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _write_atomically(target, write)


def export_lora(peft_model: Any, target: Path) -> Path:
    """The PEFT adapter (adapter_config.json + adapter_model.safetensors) that vLLM loads at run time."""
    return _write_atomically(target, lambda tmp: peft_model.save_pretrained(tmp, safe_serialization=True))


def prune_versions(root: Path, keep: int, protect: set[Path] | frozenset[Path] = frozenset()) -> list[Path]:
    """Delete all but the newest ``keep`` version directories (never one in ``protect``)."""
    if not root.is_dir():
        return []
    versions = sorted((p for p in root.iterdir() if p.is_dir() and VERSION_DIR.match(p.name)),
                      key=lambda p: int(p.name[1:]))
    protected = {p.resolve() for p in protect}
    removed = []
    for path in versions[:-keep] if keep else versions:
        if path.resolve() in protected:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
