"""``ajet export``: a run's checkpoint as a standalone Hugging Face model directory that transformers, vLLM or
the hub take as is: the weights (LoRA merged into the base model, or the adapter alone), config, the tokenizer
with its chat template, and a ``README.md`` model card (base model, run, step, eval reward, settings). Optionally
pushed to the hub with ``huggingface_hub``.

A run directory is a server's data dir: ``checkpoints/step-NNNNNN/`` (Hugging Face weights as the engine saved
them, plus its optimizer and state files, which are not exported) and ``store.sqlite`` (eval rewards)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentjet.models import hub_offline
from agentjet.protocol import reward_mean
from agentjet.weights import checkpoints as layout

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
WEIGHT_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")


class ExportError(RuntimeError):
    """The run, the checkpoint or the destination is not usable; the message says which and why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    policy_version: int
    state: dict[str, Any]  # the trainer's state file
    engine_state: dict[str, Any]  # the engine's state file (source model, engine settings)
    run: dict[str, Any]  # the model as named and the public settings (absent in checkpoints of older versions)

    @property
    def is_adapter(self) -> bool:
        return (self.path / "adapter_config.json").exists()

    @property
    def base_model(self) -> str:
        """The model as the user named it (a hub id, a built-in name or a directory)."""
        return str(self.run.get("model") or self.engine_state.get("source_model") or "unknown")

    @property
    def base_dir(self) -> Path:
        """The local directory the engine loaded (for a hub id, its snapshot)."""
        source = self.engine_state.get("source_model")
        if not source:
            raise ExportError(f"{self.path / layout.LEARNER_STATE} does not name the source model; cannot merge the adapter")
        return Path(source)

    @property
    def base_revision(self) -> str | None:
        """The hub commit of the base model, when it was loaded from a hub snapshot."""
        source = self.engine_state.get("source_model")
        path = Path(source) if source else None
        return path.name if path is not None and path.parent.name == "snapshots" else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return layout.read_json(path)
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from exc


def run_adapters(run_dir: Path) -> list[str]:
    """The LoRA adapters a run with several checkpointed (``checkpoints/adapters/<name>/``)."""
    root = run_dir / "checkpoints" / "adapters"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def checkpoint_dir(run_dir: Path, adapter: str | None = None) -> Path:
    """Where a run's checkpoints are: its one policy's, or one adapter's of a run with several."""
    adapters = run_adapters(run_dir)
    if adapter is None:
        if adapters and not layout.step_dirs(run_dir / "checkpoints"):
            raise ExportError(f"{run_dir} trained several LoRA adapters ({', '.join(adapters)}): name one with "
                              "--adapter NAME")
        return run_dir / "checkpoints"
    if adapter not in adapters:
        raise ExportError(f"{run_dir} has no checkpoint of adapter {adapter!r}; its adapters: "
                          f"{', '.join(adapters) or 'none (it trained one policy: leave out --adapter)'}")
    return run_dir / "checkpoints" / "adapters" / adapter


def list_checkpoints(run_dir: Path, adapter: str | None = None) -> list[Checkpoint]:
    ckpt_dir = checkpoint_dir(run_dir, adapter)
    if not ckpt_dir.is_dir():
        raise ExportError(f"{run_dir} is not a run directory: it has no checkpoints/ (pass the server's --data-dir)")
    out = []
    for path in layout.complete_checkpoints(ckpt_dir):
        state = _read_json(path / layout.SERVER_STATE)
        out.append(Checkpoint(path, int(state["train_steps"]), int(state["policy_version"]), state,
                              _read_json(path / layout.LEARNER_STATE), _read_json(path / layout.RUN_INFO)))
    if not out:
        raise ExportError(f"{ckpt_dir} holds no complete checkpoint yet (the server writes one every "
                          "--checkpoint-every steps and on stop)")
    return out


def find_checkpoint(run_dir: Path, step: int | None = None, version: int | None = None,
                    adapter: str | None = None, best: bool = False) -> Checkpoint:
    """The checkpoint at ``step``, at policy ``version`` or pinned as the run's ``best`` (of ``adapter``, in a
    run with several), else the latest."""
    if sum((step is not None, version is not None, best)) > 1:
        raise ExportError("give one of --step, --version and --best")
    pin = layout.best(checkpoint_dir(run_dir, adapter)) if best else None
    if best and pin is None:
        raise ExportError(f"{run_dir} has no best checkpoint pinned: a client pins one with keep_best "
                          "(`ajet demo --keep-best`, RunSettings(keep_best=True)) or POST "
                          "/swarm/v1/control/checkpoint {\"best_eval\": ...}")
    ckpts = list_checkpoints(run_dir, adapter)
    if pin is not None:
        return next(c for c in ckpts if c.path.name == pin["checkpoint"])
    if step is None and version is None:
        return max(ckpts, key=lambda c: c.step)
    found = [c for c in ckpts if (c.step == step if step is not None else c.policy_version == version)]
    if not found:
        what = f"step {step}" if step is not None else f"policy version {version}"
        have = ", ".join(f"step {c.step} (version {c.policy_version})" for c in ckpts)
        raise ExportError(f"no checkpoint at {what} in {run_dir / 'checkpoints'}; kept: {have} "
                          "(--keep-checkpoints sets how many are kept)")
    return found[-1]


@dataclass(frozen=True)
class EvalResult:
    mean: float | None
    episodes: int


def eval_reward_at(run_dir: Path, version: int) -> EvalResult:
    """The mean eval reward of the episodes begun at ``version`` (eval episodes are never trained on)."""
    store_path = run_dir / "store.sqlite"
    if not store_path.exists():
        return EvalResult(None, 0)
    from agentjet.server.store import SQLiteReader

    reader = SQLiteReader(store_path)  # read-only: the run's store is neither written nor migrated
    try:
        rewards = [reward_mean(e.reward) for e in reader.eval_rewards() if e.policy_version == version]
    finally:
        reader.close()
    return EvalResult(sum(rewards) / len(rewards) if rewards else None, len(rewards))


def _copy_patterns(src: Path, out: Path, patterns: tuple[str, ...]) -> None:
    for pattern in patterns:
        for f in src.glob(pattern):
            shutil.copy2(f, out / f.name)


def _write_weights(ckpt: Checkpoint, out: Path, adapter_only: bool) -> None:
    if adapter_only:
        if not ckpt.is_adapter:
            raise ExportError(f"--adapter-only: {ckpt.path} holds full weights (the run trained without LoRA)")
        _copy_patterns(ckpt.path, out, ADAPTER_FILES)
        config = json.loads((out / "adapter_config.json").read_text())
        if ckpt.base_revision is not None:  # a hub model: name it as the hub does, so the adapter loads anywhere
            config["base_model_name_or_path"] = ckpt.base_model
            config["revision"] = ckpt.base_revision
        (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    elif ckpt.is_adapter:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(ckpt.base_dir, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, ckpt.path).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
    else:
        _copy_patterns(ckpt.path, out, WEIGHT_FILES)


def export_checkpoint(run_dir: Path, out: Path, step: int | None = None, version: int | None = None,
                      adapter_only: bool = False, adapter: str | None = None, best: bool = False) -> Checkpoint:
    """Write the chosen checkpoint of ``run_dir`` (of one ``adapter``, in a run with several) to ``out`` as a
    standalone model directory: that adapter merged into the base, or the adapter alone."""
    from transformers import AutoTokenizer

    ckpt = find_checkpoint(run_dir, step, version, adapter, best)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    _write_weights(ckpt, out, adapter_only)
    tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    if not tokenizer.chat_template:
        raise ExportError(f"the tokenizer in {ckpt.path} has no chat template")
    tokenizer.save_pretrained(out)
    # the eval episodes of a run with several adapters are tagged with the oldest adapter's version, not this one's
    evals = eval_reward_at(run_dir, ckpt.policy_version) if adapter is None else EvalResult(None, 0)
    (out / "README.md").write_text(model_card(ckpt, run_dir, evals, adapter_only, adapter))
    return ckpt


def model_card(ckpt: Checkpoint, run_dir: Path, evals: EvalResult, adapter_only: bool,
               adapter: str | None = None) -> str:
    hub_base = ckpt.base_revision is not None
    front = ["---", f"library_name: {'peft' if adapter_only else 'transformers'}",
             "tags:", "- agentjet", "- reinforcement-learning"]
    if hub_base:
        front.append(f"base_model: {ckpt.base_model}")
    front.append("---")
    kind = ("a LoRA adapter" if adapter_only else
            "the LoRA adapter merged into the base weights" if ckpt.is_adapter else "full weights")
    base = f"`{ckpt.base_model}`" + (f" (revision `{ckpt.base_revision}`)" if hub_base else "")
    reward = (f"{evals.mean:.4f} (mean of {evals.episodes} eval episodes begun at this version)"
              if evals.mean is not None else "not measured per adapter" if adapter else
              "not measured (no eval episodes began at this version)")
    settings = ckpt.run.get("settings")
    lines = [
        *front, "", f"# {Path(str(ckpt.run.get('served_model_name') or ckpt.base_model)).name} (AgentJet)", "",
        f"Trained with reinforcement learning by AgentJet from {base}; {kind}.", "",
        "| | |", "|---|---|",
        f"| base model | {base} |",
        f"| run | `{run_dir.resolve()}` |",
        *([f"| adapter | `{adapter}` (one of the run's LoRA adapters) |"] if adapter else []),
        f"| checkpoint | `{ckpt.path.name}` |",
        f"| step | {ckpt.step} |",
        f"| policy version | {ckpt.policy_version} |",
        f"| trained episodes | {ckpt.state.get('trained_episodes', 'unknown')} |",
        f"| eval reward | {reward} |", "",
        "## Settings", "",
        "The server's settings when this checkpoint was written (secrets left out):", "",
        "```json", json.dumps(settings, indent=2, sort_keys=True, default=str) if settings else
        "(not recorded: the checkpoint predates agentjet_run.json)", "```", "",
        "## Use", "",
        "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        'tok = AutoTokenizer.from_pretrained("THIS_DIR")',
        'model = AutoModelForCausalLM.from_pretrained("THIS_DIR")' if not adapter_only else
        'from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained("THIS_DIR")',
        "```", "",
    ]
    return "\n".join(lines)


def upload_to_hub(out: Path, repo_id: str, ckpt: Checkpoint, private: bool = True) -> str:
    """Upload ``out`` to the hub repo ``repo_id`` (created if missing; private unless asked otherwise)."""
    from huggingface_hub import HfApi

    if hub_offline():
        raise ExportError(f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set; the export in {out} was kept")
    api = HfApi(token=os.environ.get("HF_TOKEN") or None)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(out),
                             commit_message=f"AgentJet export: step {ckpt.step}, policy version {ckpt.policy_version}")
    return str(getattr(info, "commit_url", None) or f"https://huggingface.co/{repo_id}")
