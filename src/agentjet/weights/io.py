"""Weight I/O for every writer and reader of weights, with the one tied-output-head rule.

**The rule.** A model whose config ties the output head to the input embedding (``tie_word_embeddings``)
holds one tensor under two names. Every *export* written for another consumer (vLLM, the embedded engine of a
trainer group, ``ajet export``) is **untied**: an explicit ``lm_head.weight`` (a copy of the embedding) and
``tie_word_embeddings: false`` in its config. vLLM's CPU build keeps a prepacked copy of the head, and a tied
checkpoint has no ``lm_head`` tensor to trigger its re-processing on reload: the served model would be the new
body with the old head (docs/vllm.md). Every *reader* into a tied model accepts a file with or without
``lm_head.weight`` (:func:`tied_keys` names what may be missing); copying it writes the same values into the
shared tensor.

Writers (:func:`untied_state_dict`, :func:`write_safetensors`, :func:`write_model_dir`, :func:`export_full`)
and readers (:func:`copy_weights_into`, :func:`load_state_into`) are used by the in-process learner, the
trainer group's rank 0, the embedded generator and the vLLM seam. Each export goes to a directory of its own
per policy version (:func:`version_dir`), written under a temporary name and renamed in, so a reader never sees
half a checkpoint.
"""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from agentjet.files import atomic_dir, atomic_file

if TYPE_CHECKING:
    from agentjet.engines.model import ModelFacts

VERSION_DIR = re.compile(r"^v(\d{6,})$")
WEIGHTS_FILE = "model.safetensors"
HEAD_KEY = "lm_head.weight"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def tied_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys that alias another parameter (a tied output head): a reader does not require them."""
    config = getattr(model, "config", None)
    return {HEAD_KEY} if getattr(config, "tie_word_embeddings", False) else set()


def untie(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None,
          head: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``state`` as separate contiguous CPU tensors (no shared storage, as safetensors requires), cast to
    ``dtype``, with ``lm_head.weight`` present: ``head`` when given, else a copy of the input embedding when the
    state has none (a tied model's state dict may list the head once, or not at all)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if t.data_ptr() in seen:  # an alias of a tensor already taken (the tied head)
            t = t.clone()
        seen.add(t.data_ptr())
        out[name] = t.contiguous().cpu()
    if HEAD_KEY not in out:
        if head is None:
            embed = next((k for k in out if k.endswith("embed_tokens.weight")), None)
            if embed is None:
                raise ValueError("cannot untie the output head: no lm_head.weight and no embed_tokens.weight")
            out[HEAD_KEY] = out[embed].clone()
        else:
            w = head.detach()
            out[HEAD_KEY] = (w.to(dtype) if dtype is not None else w).clone().contiguous().cpu()
    return out


def untied_named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The rule for a live module (safetensors export, the NCCL transfer): its state tensors by checkpoint name,
    detached and where they live (no copy, no cast), then ``lm_head.weight`` when the state dict has none although
    the model has an output head (a tied one). A tied head may share storage with the input embedding; a writer
    that needs separate storage copies it (:func:`untie`)."""
    names: set[str] = set()
    for name, tensor in model.state_dict().items():
        names.add(name)
        yield name, tensor.detach()
    head = model.get_output_embeddings()  # type: ignore[operator]
    if HEAD_KEY not in names and head is not None:
        yield HEAD_KEY, head.weight.detach()


def untied_state_dict(model: Any, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """A ``*ForCausalLM``'s tensors, untied, as separate contiguous CPU copies (see :func:`untie`)."""
    return untie(dict(untied_named_tensors(model)), dtype)


def write_safetensors(state: Mapping[str, torch.Tensor], path: Path) -> Path:
    """Write ``state`` as one safetensors file at ``path``, atomically (temp name, then rename)."""
    from safetensors.torch import save_file

    path = Path(path)
    with atomic_file(path) as tmp:
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    return path


def write_atomically(target: Path, write: Any) -> Path:
    """Write a directory into a temp dir beside ``target`` and rename it in."""
    target = Path(target)
    with atomic_dir(target) as tmp:
        write(tmp)
    return target


def untied_config(config: Any, dtype: torch.dtype | None = None) -> Any:
    out = copy.deepcopy(config)
    out.tie_word_embeddings = False
    if dtype is not None:
        out.dtype = dtype
    return out


def write_model_dir(target: Path, state: Mapping[str, torch.Tensor], config: Any, tokenizer: Any,
                    generation_config: Any = None, dtype: torch.dtype | None = None) -> Path:
    """A complete, untied Hugging Face model directory: config, generation config, tokenizer, weights."""
    def write(tmp: Path) -> None:
        write_safetensors(untie(state, dtype), tmp / WEIGHTS_FILE)
        untied_config(config, dtype).save_pretrained(tmp)
        if generation_config is not None:
            generation_config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    return write_atomically(target, write)


def export_full(model: Any, tokenizer: Any, target: Path, dtype: str | None = "bfloat16") -> Path:
    """A ``*ForCausalLM`` (LoRA merged views are the caller's) as an untied model directory."""
    torch_dtype = DTYPES.get(dtype) if dtype else None
    return write_model_dir(target, untied_state_dict(model, torch_dtype), model.config, tokenizer,
                           getattr(model, "generation_config", None), torch_dtype)


def export_untied_copy(facts: ModelFacts, target: Path) -> Path:
    """A model directory's weights rewritten untied into ``target`` (without building the model), with its
    config (untied), generation config and tokenizer: what vLLM starts from when the weights it will later reload
    come from elsewhere (a trainer group)."""
    from safetensors.torch import load_file

    source = facts.path
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {source}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return write_model_dir(target, state, facts.config, facts.tokenizer, facts.generation_config)


def export_lora(peft_model: Any, target: Path) -> Path:
    """The PEFT adapter (adapter_config.json + adapter_model.safetensors) that vLLM loads at run time."""
    return write_atomically(target, lambda tmp: peft_model.save_pretrained(tmp, safe_serialization=True))


ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"  # PEFT's names: what ``PeftModel.from_pretrained`` reads
ADAPTER_CONFIG_FILE = "adapter_config.json"


def adapter_state(peft_model: Any, adapter: str, embeddings: bool | Literal["auto"] = "auto") -> dict[str, torch.Tensor]:
    """One named adapter's tensors under PEFT's saved names (the adapter's name left out, as PEFT saves them).
    ``embeddings``: PEFT's ``save_embedding_layers`` (``auto``: the base's embedding matrix too when the adapter
    targets a layer tied to it, as LoRA on SmolLM2's output layer does; False: the LoRA tensors alone)."""
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(peft_model, adapter_name=adapter, save_embedding_layers=embeddings))


def write_adapter_files(peft_model: Any, adapter: str, directory: Path,
                        embeddings: bool | Literal["auto"] = "auto") -> None:
    """Adapter ``adapter`` alone as a standard PEFT adapter in ``directory`` (``adapter_config.json`` and
    ``adapter_model.safetensors``). Not ``save_pretrained``: that writes every adapter, a non-default one in a
    subdirectory of its name. ``embeddings``: as for :func:`adapter_state`."""
    write_safetensors(adapter_state(peft_model, adapter, embeddings), Path(directory) / ADAPTER_WEIGHTS_FILE)
    peft_model.peft_config[adapter].save_pretrained(str(directory))


def export_named_adapter(peft_model: Any, adapter: str, target: Path) -> Path:
    """:func:`write_adapter_files` into a directory of its own, written atomically (a version's export)."""
    return write_atomically(target, lambda tmp: write_adapter_files(peft_model, adapter, tmp))


def load_adapter_state(peft_model: Any, adapter: str, state: Mapping[str, torch.Tensor], source: Path) -> None:
    """Copy a saved adapter's tensors (PEFT's saved names) into adapter ``adapter``'s weights in place; they must
    cover all of its weights and nothing else (a different rank fails on the shapes)."""
    from peft import set_peft_model_state_dict

    result: Any = set_peft_model_state_dict(peft_model, dict(state), adapter_name=adapter)
    own = {name for name in peft_model.state_dict() if f".{adapter}." in name and ".lora_" in name}
    missing = sorted(own & set(result.missing_keys))
    if result.unexpected_keys or missing:
        raise ValueError(f"adapter weights {source} do not fit adapter {adapter!r}: missing={missing[:5]} "
                         f"unexpected={list(result.unexpected_keys)[:5]}")


@torch.no_grad()
def merged_adapter_state(causal_lm: Any, adapter: str) -> dict[str, torch.Tensor]:
    """The ``*ForCausalLM``'s state under its own checkpoint names, with adapter ``adapter`` merged into the
    weights it adapts and every adapter's own tensors left out. Computed (weight + delta) into new tensors, so
    the live module keeps its adapters unmerged and nothing is copied whole but the adapted weights."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers: dict[str, Any] = {prefix: module for prefix, module in causal_lm.named_modules() if isinstance(module, BaseTunerLayer)}
    state: dict[str, torch.Tensor] = {}
    for key, tensor in causal_lm.state_dict().items():
        parts = key.split(".")
        prefix = next((p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if p in layers), None)
        if prefix is None:
            state[key] = tensor
            continue
        rest = key[len(prefix) + 1:]
        if not rest.startswith("base_layer."):
            continue  # an adapter's own tensor (lora_A, lora_B, ...)
        name = f"{prefix}.{rest.removeprefix('base_layer.')}"
        layer = layers[prefix]
        if name.endswith(".weight") and adapter in getattr(layer, "lora_A", {}):
            tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        state[name] = tensor
    return state


def export_merged_adapter(causal_lm: Any, adapter: str, tokenizer: Any, target: Path,
                          dtype: str | None = "bfloat16") -> Path:
    """The base with adapter ``adapter`` merged (:func:`merged_adapter_state`) as an untied model directory."""
    torch_dtype = DTYPES.get(dtype) if dtype else None
    return write_model_dir(target, merged_adapter_state(causal_lm, adapter), causal_lm.config, tokenizer,
                           getattr(causal_lm, "generation_config", None), torch_dtype)


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version:06d}"


def prune_versions(root: Path, keep: int, protect: set[Path] | frozenset[Path] = frozenset()) -> list[Path]:
    """Delete all but the newest ``keep`` version directories (never one in ``protect``)."""
    root = Path(root)
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


def weights_file(path: Path) -> Path:
    """A safetensors file, or the one in a model directory."""
    path = Path(path)
    return path / WEIGHTS_FILE if path.is_dir() else path


@torch.no_grad()
def copy_weights_into(model: torch.nn.Module, path: Path) -> int:
    """Copy the tensors of a safetensors file (or a model directory's ``model.safetensors``) into ``model``'s
    parameters and buffers in place (cast to each one's dtype and device), which keeps every reference to them
    valid (optimizer, CUDA graphs, PEFT). The file must cover every parameter (tied ones may be missing) and
    hold nothing else; shapes must match; every check runs before the first copy, so a bad file leaves the
    model untouched. Returns the number of tensors copied."""
    from safetensors import safe_open

    own = model.state_dict(keep_vars=True)
    required = {k for k, _ in model.named_parameters()} - tied_keys(model)
    with safe_open(str(weights_file(path)), framework="pt", device="cpu") as f:
        names = sorted(f.keys())
        unexpected = sorted(set(names) - set(own))
        missing = sorted(required - set(names))
        if unexpected or missing:
            raise ValueError(f"weights {path} do not fit the model: missing={missing[:5]} unexpected={unexpected[:5]}")
        for name in names:
            shape = tuple(f.get_slice(name).get_shape())
            if shape != tuple(own[name].shape):
                raise ValueError(f"weights {path}: {name} has shape {shape}, the model {tuple(own[name].shape)}")
        for name in names:
            dst = own[name]
            dst.copy_(f.get_tensor(name).to(device=dst.device, dtype=dst.dtype))
    return len(names)


def load_state_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: Path) -> None:
    """``model.load_state_dict`` that allows only the tied head to be missing (a checkpoint's full weights)."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    if unexpected or set(missing) - tied_keys(model):
        raise ValueError(f"checkpoint {source} does not fit the model: missing={missing} unexpected={unexpected}")
