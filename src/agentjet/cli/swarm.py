"""Commands that start whole swarms or models: ``ajet up``, ``ajet demo``, ``ajet model``."""

from __future__ import annotations

from pathlib import Path

import typer

from agentjet.cli.common import console, fail, require_server_extra
from agentjet.models import DEFAULT_MODEL
from agentjet.settings import EngineKind


def model(name: str = typer.Argument(DEFAULT_MODEL, help="built-in name, local HF directory or hub id ORG/NAME"),
          revision: str | None = typer.Option(None, help="branch, tag or commit of a hub model (default: main)"),
          ) -> None:
    """Resolve (and on first use convert, build or download) a model; print its local directory."""
    require_server_extra("model")
    from agentjet.models import ModelNotFoundError, resolve_model

    try:
        console.print(str(resolve_model(name, revision)), soft_wrap=True)
    except ModelNotFoundError as exc:
        fail(str(exc))


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="built-in name, local HF directory or hub id ORG/NAME"),
    task: str = typer.Option("addition", help="a built-in task (addition, calculator, lookup, toy) or rg:NAME, a "
                             "reasoning-gym dataset: rg:chain_sum:min_terms=2,max_terms=2, rg:A+B+C (a cocktail), "
                             "rg:mix.yaml (docs/environments.md)"),
    steps: int | None = typer.Option(None, min=1, help="train steps (default: the task's recommendation)"),
    learning_rate: float | None = typer.Option(None, "--lr", min=0.0, help="learning rate (default: the task's)"),
    group_size: int | None = typer.Option(None, min=1),
    batch_groups: int | None = typer.Option(None, min=1),
    eval_tasks: int | None = typer.Option(None, min=1, help="held-out eval episodes before and after (default: "
                                          "the task's recommendation)"),
    out_dir: Path = typer.Option(Path("runs/demo"), help="where the log, plot and JSON go"),
    time_budget_s: float = typer.Option(20 * 60, min=1.0, help="stop training after this many seconds"),
    concurrency: int | None = typer.Option(None, min=1, help="episodes in flight, also the engine's batch size "
                                           "(default: the task's recommendation, else 32)"),
    eval_every_s: float | None = typer.Option(None, min=0.0, help="held-out eval every this many seconds "
                                              "(default: the task's recommendation, else 120; 0: only before and "
                                              "after)"),
    curriculum: bool = typer.Option(True, help="draw each group's task by its recent results (retire solved)"),
    early_stop: bool = typer.Option(True, help="stop on an eval plateau or when groups stop teaching"),
    seed: int = typer.Option(0, min=0, help="seed of the engine's sampling and the curriculum's order"),
    engine: EngineKind = typer.Option(EngineKind.HF, help="hf: the embedded engine; vllm: roll out on a managed "
                                      "vLLM subprocess (make setup-vllm)"),
    train_procs: int = typer.Option(0, min=0, max=64, help="train on an FSDP2 trainer group of this many ranks "
                                    "(torchrun; gloo on CPU) instead of in the server process"),
    keep_best: bool = typer.Option(False, help="pin the checkpoint of the best held-out eval (a checkpoint, "
                                   "optimizer included, at each new best; `ajet export OUT_DIR/server DEST --best`)"),
) -> None:
    """Train SmolLM2 on a built-in task through a real swarm server and client; print eval before/after."""
    require_server_extra("demo")
    from agentjet.apps.demo import DemoSettings, run_demo
    from agentjet.tasks import TaskError, get_task

    try:
        get_task(task)
    except TaskError as exc:
        fail(f"--task: {exc}")
    if engine is EngineKind.NULL:
        fail("--engine null cannot learn: the demo needs hf or vllm")
    result = run_demo(DemoSettings(model=model, task=task, steps=steps, learning_rate=learning_rate,
                                   group_size=group_size, batch_groups=batch_groups, eval_tasks=eval_tasks,
                                   out_dir=out_dir, time_budget_s=time_budget_s, concurrency=concurrency,
                                   eval_every_s=eval_every_s, curriculum=curriculum,
                                   early_stop=early_stop, seed=seed, engine=engine.value,
                                   train_procs=train_procs, keep_best=keep_best), console)
    if result.eval_after <= result.eval_before:
        console.print("[yellow]the eval reward did not improve in this run[/yellow]")


def up(spec_file: Path = typer.Argument(..., help="swarm YAML: servers (and optionally clients)")) -> None:
    """Start a set of servers and clients described in one file; Ctrl-C stops them cleanly."""
    require_server_extra("up")
    import signal

    from agentjet.apps.up import Swarm, load_spec
    from agentjet.runtime.launch import ServerExited

    try:
        spec = load_spec(spec_file)
    except ValueError as exc:
        fail(str(exc))
    swarm = Swarm(spec, echo=console.print)

    def on_sigterm(*_: object) -> None:
        raise KeyboardInterrupt  # stop cleanly on SIGTERM, as on Ctrl-C

    signal.signal(signal.SIGTERM, on_sigterm)
    failed: list[str] = []
    try:
        swarm.start()
        failed = [name for name, code in swarm.wait().items() if code != 0]
    except KeyboardInterrupt:
        console.print("stopping ...")
    except (RuntimeError, ServerExited, TimeoutError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        swarm.stop()
        raise typer.Exit(1) from exc
    swarm.stop()
    if failed:
        console.print(f"[red]error:[/red] client(s) {failed} failed; see their logs in {spec.log_dir}")
        raise typer.Exit(1)
