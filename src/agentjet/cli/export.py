"""``ajet export``: a run's checkpoint as a standalone Hugging Face model directory (``agentjet.apps.export``)."""

from __future__ import annotations

from pathlib import Path

import typer

from agentjet.cli.common import console, fail, require_server_extra


def export(
    run_dir: Path = typer.Argument(..., help="the server's data dir (holds checkpoints/ and store.sqlite)"),
    out: Path = typer.Argument(..., help="a new directory for the model"),
    step: int | None = typer.Option(None, min=0, help="the checkpoint at this train step (default: the latest)"),
    version: int | None = typer.Option(None, min=0, help="the checkpoint at this policy version"),
    best: bool = typer.Option(False, "--best", help="the checkpoint pinned as the run's best held-out eval "
                              "(checkpoints/best.json; a client's keep_best)"),
    adapter_only: bool = typer.Option(False, "--adapter-only", help="write the LoRA adapter alone, not merged "
                                      "into the base weights"),
    adapter: str | None = typer.Option(None, "--adapter", metavar="NAME", help="a run with several LoRA adapters "
                                       "(--adapters): export this one (merged, or alone with --adapter-only)"),
    push_to_hub: str | None = typer.Option(None, "--push-to-hub", metavar="ORG/NAME",
                                           help="then upload the directory to this hub repo (HF_TOKEN)"),
    public: bool = typer.Option(False, "--public", help="with --push-to-hub: create the repo public, not private"),
) -> None:
    """Write a run's checkpoint as a standalone Hugging Face model directory: weights (LoRA merged), config,
    tokenizer with its chat template, and a README.md model card."""
    require_server_extra("export")
    from agentjet.apps.export import ExportError, export_checkpoint, upload_to_hub

    try:
        ckpt = export_checkpoint(run_dir, out, step, version, adapter_only, adapter, best)
        what = f"adapter {adapter}'s step" if adapter else "step"
        console.print(f"exported {what} {ckpt.step} (policy version {ckpt.policy_version}) of {run_dir} to {out}",
                      soft_wrap=True)
        if push_to_hub:
            console.print(f"pushed to {upload_to_hub(out, push_to_hub, ckpt, private=not public)}", soft_wrap=True)
    except ExportError as exc:
        fail(str(exc))
