"""The ``ajet`` command line."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
from pathlib import Path

import typer
from rich.console import Console

from agentjet.models import DEFAULT_MODEL, ModelNotFoundError, resolve_model

app = typer.Typer(add_completion=False, no_args_is_help=True, help="AgentJet: swarm RL training for LLM agents.")
console = Console()


@app.command("model")
def model_cmd(name: str = typer.Argument(DEFAULT_MODEL, help="registry name or local HF directory")) -> None:
    """Resolve (and on first use convert or build) a model; print its local directory."""
    try:
        console.print(str(resolve_model(name)))
    except ModelNotFoundError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


@app.command()
def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="model name or local HF directory"),
    task: str = typer.Option("addition", help="built-in task"),
    steps: int | None = typer.Option(None, help="train steps (default: the task's recommendation)"),
    learning_rate: float | None = typer.Option(None, "--lr"),
    group_size: int | None = typer.Option(None),
    batch_groups: int | None = typer.Option(None),
    eval_tasks: int | None = typer.Option(None, help="held-out eval episodes before and after (default: the "
                                                      "task's recommendation)"),
    out_dir: Path = typer.Option(Path("runs/demo"), help="where the log, plot and JSON go"),
    time_budget_s: float = typer.Option(20 * 60, help="stop training after this many seconds"),
) -> None:
    """Train SmolLM2 on a built-in task through a real swarm server and client; print eval before/after."""
    from agentjet.demo import DemoSettings, run_demo
    from agentjet.tasks import TASKS

    if task not in TASKS:
        console.print(f"[red]error:[/red] unknown task {task!r}; built-in tasks: {sorted(TASKS)}")
        raise typer.Exit(2)
    result = run_demo(DemoSettings(model=model, task=task, steps=steps, learning_rate=learning_rate,
                                   group_size=group_size, batch_groups=batch_groups, eval_tasks=eval_tasks,
                                   out_dir=out_dir, time_budget_s=time_budget_s), console)
    if result.eval_after <= result.eval_before:
        console.print("[yellow]the eval reward did not improve in this run[/yellow]")


@app.command("engine-demo")
def engine_demo(model: str = typer.Option(DEFAULT_MODEL, help="model name or directory")) -> None:
    """Generate on the embedded engine, then run one train step (a smoke test of the engine)."""
    asyncio.run(_engine_demo(model))


async def _engine_demo(model: str) -> None:
    from agentjet.engines.base import SamplingParams, TrainSample
    from agentjet.engines.hf import HFEngine

    t0 = time.perf_counter()
    engine = HFEngine(model)
    console.print(f"loaded [bold]{model}[/bold] in {time.perf_counter() - t0:.1f}s")
    msgs = [{"role": "user", "content": "What is 3 + 4?"}]
    ids = list(engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    t0 = time.perf_counter()
    results = await asyncio.gather(*[engine.generate(ids, SamplingParams(temperature=0.8, max_tokens=24, seed=s))
                                     for s in range(4)])
    dt = time.perf_counter() - t0
    n_tok = sum(len(r.token_ids) for r in results)
    for r in results:
        console.print(f"  → {r.text!r}")
    console.print(f"generated {n_tok} tokens for 4 concurrent requests in {dt:.1f}s ({n_tok / dt:.1f} tok/s)")
    rewards = [1.0 if "7" in r.text else 0.0 for r in results]
    mean = sum(rewards) / len(rewards)
    batch = [TrainSample(ids + r.token_ids, [0] * len(ids) + [1] * len(r.token_ids), [0.0] * len(ids) + r.logprobs,
                         [0.0] * len(ids) + [rw - mean] * len(r.token_ids), temperature=0.8)
             for r, rw in zip(results, rewards, strict=True)]
    metrics = await engine.train_step(batch)
    console.print(f"train step: {metrics['step_seconds']:.2f}s, policy version {engine.policy_version}, "
                  f"logprob mismatch {metrics['mean_abs_logprob_diff']:.2e}")
    await engine.close()


def _secret(value: str | None, env: str) -> str | None:
    """A token from the option, else from $ENV, else from the file named by $ENV_FILE."""
    if value:
        return value
    if os.environ.get(env):
        return os.environ[env]
    path = os.environ.get(f"{env}_FILE")
    return Path(path).read_text().strip() if path else None


def _parse_ratios(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            console.print(f"[red]error:[/red] --task-ratios item {item!r} must look like name=0.5")
            raise typer.Exit(2)
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def server(
    model: str = typer.Option(DEFAULT_MODEL, help="model name or local HF directory"),
    host: str = typer.Option("127.0.0.1", help="bind address (loopback by default)"),
    port: int = typer.Option(10086),
    data_dir: Path = typer.Option(Path("runs/server"), help="store and checkpoints"),
    resume: bool = typer.Option(False, help="continue from the latest checkpoint and the unconsumed samples"),
    swarm_token: str | None = typer.Option(None, help="gates join/begin (or $AGENTJET_SWARM_TOKEN[_FILE])"),
    admin_token: str | None = typer.Option(None, help="gates control (or $AGENTJET_ADMIN_TOKEN[_FILE])"),
    allow_insecure: bool = typer.Option(False, help="allow a non-loopback bind without tokens"),
    group_size: int = typer.Option(4, help="episodes per GRPO group"),
    batch_groups: int = typer.Option(2, help="groups per train step"),
    learning_rate: float = typer.Option(1e-5, "--lr"),
    max_staleness: int = typer.Option(4, help="max policy versions between generation and training"),
    lease_seconds: float = typer.Option(60.0),
    temperature: float = typer.Option(1.0, help="default sampling temperature"),
    max_tokens: int = typer.Option(256, help="default max_tokens"),
    checkpoint_every: int = typer.Option(10, help="train steps between checkpoints"),
    max_batch_size: int = typer.Option(8, help="max concurrent generations batched together"),
    public_url: str | None = typer.Option(None, help="base URL clients should use, if not http://host:port"),
    log_level: str = typer.Option("INFO"),
    engine: str = typer.Option("hf", help="hf (the embedded engine) or null (canned replies; for benchmarks)"),
    task_ratios: str | None = typer.Option(None, help="cocktail quotas per task type, e.g. math=0.7,code=0.3"),
    absent_policy: str = typer.Option("fill", help="strict (wait for every type) or fill"),
    merge: bool = typer.Option(True, help="timeline merging (context tracking)"),
    compare_level: str = typer.Option("token", help="merge when contexts extend each other by token or text"),
    fix_drift: bool = typer.Option(True, help="splice generated ids back over re-tokenized replies"),
    tito: bool = typer.Option(True, help="token-in, token-out at request time: resent replies keep their "
                              "generated ids in the prompt"),
    # the trainer group (issue 14; docs/distributed.md)
    train_procs: int = typer.Option(0, help="train with an FSDP2 group of N ranks on this node under torchrun "
                                    "(0: train in the server process)"),
    train_nnodes: int = typer.Option(1, help="nodes in the trainer group"),
    train_node_rank: int = typer.Option(0, help="this node's rank in the trainer group"),
    rdzv_endpoint: str | None = typer.Option(None, help="HOST:PORT of the torchrun rendezvous (several nodes)"),
    train_control: str | None = typer.Option(None, help="HOST:PORT where ranks reach this server (several nodes;"
                                             " the secret comes from $AGENTJET_TRAINER_TOKEN[_FILE])"),
    train_devices: str | None = typer.Option(None, help="GPUs of this node for the trainer ranks, e.g. 1,2,3"),
) -> None:
    """Run a swarm server: one trainable model behind an OpenAI-compatible API."""
    from pydantic import ValidationError

    from agentjet.server.app import serve
    from agentjet.server.config import SamplingDefaults, ServerConfig, TrackingSettings, TrainingSettings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    swarm_token = _secret(swarm_token, "AGENTJET_SWARM_TOKEN")
    admin_token = _secret(admin_token, "AGENTJET_ADMIN_TOKEN")
    if not _is_loopback(host) and not (swarm_token and admin_token):
        msg = (f"binding to {host} without both a swarm token and an admin token lets anyone on the network "
               "run episodes and control training")
        if not allow_insecure:
            console.print(f"[red]refusing:[/red] {msg}. Set --swarm-token and --admin-token, or pass --allow-insecure.")
            raise typer.Exit(2)
        console.print(f"[bold red]WARNING:[/bold red] {msg}.")
    try:
        config = ServerConfig(
            model=model, host=host, port=port, data_dir=data_dir, swarm_token=swarm_token, admin_token=admin_token,
            lease_seconds=lease_seconds, max_batch_size=max_batch_size, public_url=public_url,
            sampling=SamplingDefaults(temperature=temperature, max_tokens=max_tokens),
            training=TrainingSettings(group_size=group_size, batch_groups=batch_groups, learning_rate=learning_rate,
                                      max_staleness=max_staleness, checkpoint_every=checkpoint_every,
                                      task_ratios=_parse_ratios(task_ratios), absent_policy=absent_policy),
            tracking=TrackingSettings(merge=merge, compare_level=compare_level, fix_drift=fix_drift, tito=tito),
        )
    except ValidationError as exc:
        console.print(f"[red]invalid settings:[/red]\n{exc}")
        raise typer.Exit(2) from exc
    try:
        resolve_model(model)
    except ModelNotFoundError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if engine not in ("hf", "null"):
        console.print(f"[red]error:[/red] --engine must be 'hf' or 'null', not {engine!r}")
        raise typer.Exit(2)
    if train_procs and engine != "hf":
        console.print("[red]error:[/red] --train-procs trains the embedded engine's model; it needs --engine hf")
        raise typer.Exit(2)
    console.print(f"AgentJet server: model [bold]{model}[/bold] on http://{host}:{port}/v1, data in {data_dir}")
    built = _null_engine(model) if engine == "null" else None
    if train_procs:
        built = _group_engine(config, train_procs, train_nnodes, train_node_rank, rdzv_endpoint, train_control,
                              train_devices)
    serve(config, engine=built, resume=resume)


def _group_engine(config, procs: int, nnodes: int, node_rank: int, rdzv: str | None,  # noqa: ANN001, ANN202
                  control: str | None, devices: str | None):
    """The embedded engine for rollouts plus a trainer group of ``procs`` ranks per node."""
    from pydantic import ValidationError

    from agentjet.distributed import TrainerGroupError, TrainerGroupSettings
    from agentjet.distributed.engine import build_group_engine
    from agentjet.engines.base import TrainConfig

    host, _, port = (control or "127.0.0.1:0").rpartition(":")
    try:
        settings = TrainerGroupSettings(procs=procs, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv,
                                        control_host=host or "127.0.0.1", control_port=int(port or 0),
                                        auth_token=_secret(None, "AGENTJET_TRAINER_TOKEN"),
                                        cuda_visible_devices=devices)
    except (ValidationError, ValueError) as exc:
        console.print(f"[red]invalid trainer group settings:[/red]\n{exc}")
        raise typer.Exit(2) from exc
    console.print(f"starting a trainer group: {settings.world_size} ranks ({procs} on this node)")
    try:
        return build_group_engine(config.model, settings, TrainConfig(learning_rate=config.training.learning_rate),
                                  data_dir=config.data_dir, max_batch_size=config.max_batch_size,
                                  max_context=config.max_context)
    except TrainerGroupError as exc:
        console.print(f"[red]the trainer group did not start:[/red] {exc}")
        raise typer.Exit(2) from exc


def _null_engine(model: str):  # noqa: ANN202
    from transformers import AutoTokenizer

    from agentjet.engines.null import NullEngine

    return NullEngine(AutoTokenizer.from_pretrained(resolve_model(model)), reply="The answer is 7.")


@app.command()
def run(
    workflow: str = typer.Argument(..., help="path/to/workflow.py:fn with `async def fn(task, ep) -> reward`"),
    server_url: str = typer.Option("http://127.0.0.1:10086", "--server", help="swarm server URL"),
    dataset: Path = typer.Option(..., help="JSONL file, one task object per line"),
    group_size: int = typer.Option(4, help="episodes per task (GRPO group)"),
    concurrency: int = typer.Option(8, help="episodes in flight at once"),
    token: str | None = typer.Option(None, help="swarm token (or $AGENTJET_SWARM_TOKEN[_FILE])"),
    client_id: str | None = typer.Option(None, help="a stable id: a restarted client releases its old episodes"),
    eval: bool = typer.Option(False, "--eval", help="run as eval episodes (never trained on)"),
    epochs: int = typer.Option(1, help="passes over the dataset"),
    cursor: Path | None = typer.Option(None, help="file recording finished tasks, to resume a run"),
    limit: int | None = typer.Option(None, help="use only the first N tasks"),
) -> None:
    """Drive a workflow over a dataset against a swarm server."""
    from agentjet.client.runner import Cursor, load_dataset, load_workflow

    try:
        fn = load_workflow(workflow)
        tasks = load_dataset(dataset, limit)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if epochs > 1 and cursor is not None:
        console.print("[red]error:[/red] --cursor resumes a single pass; it cannot be combined with --epochs > 1")
        raise typer.Exit(2)
    token = _secret(token, "AGENTJET_SWARM_TOKEN")
    summary = asyncio.run(_run(fn, tasks, server_url, token, client_id, group_size, concurrency, eval, epochs,
                               Cursor(cursor)))
    console.print(f"{summary.episodes} episodes, {summary.failed} failed, mean reward {summary.mean_reward:.3f}, "
                  f"{summary.seconds:.0f}s")
    if summary.failed:
        console.print(f"failures by kind: {dict(summary.failure_kinds)}")


async def _run(fn, tasks, url, token, client_id, group_size, concurrency, eval, epochs, cursor):  # noqa: ANN001
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentjet.client.client import SwarmClient
    from agentjet.client.runner import RunSummary, run_workflow

    total = len(tasks) * group_size * epochs
    total_summary = RunSummary()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as progress:
        bar = progress.add_task("episodes", total=total, info="")

        def update(s: RunSummary) -> None:
            done = total_summary.episodes + s.episodes
            recent = s.rewards[-64:]
            mean = sum(recent) / len(recent) if recent else float("nan")
            progress.update(bar, completed=done,
                            info=f"reward {mean:.3f}  policy v{s.last_policy_version}  failed {s.failed}")

        async with SwarmClient(url, token=token, client_id=client_id) as client:
            for _ in range(epochs):
                s = await run_workflow(client, fn, tasks, group_size=group_size, concurrency=concurrency, eval=eval,
                                       cursor=cursor, on_progress=update)
                total_summary.merge(s)
    return total_summary


@app.command()
def status(
    server_url: str = typer.Option("http://127.0.0.1:10086", "--server"),
    token: str | None = typer.Option(None, help="swarm or admin token"),
) -> None:
    """Print a server's status."""
    import json

    import httpx

    token = token or _secret(None, "AGENTJET_ADMIN_TOKEN") or _secret(None, "AGENTJET_SWARM_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{server_url.rstrip('/')}/swarm/v1/status", headers=headers, timeout=10)
    except httpx.TransportError as exc:
        console.print(f"[red]error:[/red] cannot reach {server_url}: {exc}")
        raise typer.Exit(2) from exc
    if r.status_code != 200:
        console.print(f"[red]error {r.status_code}:[/red] {r.text}")
        raise typer.Exit(2)
    console.print_json(json.dumps(r.json()))


@app.command()
def up(spec_file: Path = typer.Argument(..., help="swarm YAML: servers (and optionally clients)")) -> None:
    """Start a set of servers and clients described in one file; Ctrl-C stops them cleanly."""
    import signal as _signal

    from agentjet.up import Swarm, load_spec

    try:
        spec = load_spec(spec_file)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    swarm = Swarm(spec, echo=console.print)

    def on_sigterm(*_: object) -> None:
        raise KeyboardInterrupt  # stop cleanly on SIGTERM, as on Ctrl-C

    _signal.signal(_signal.SIGTERM, on_sigterm)
    try:
        swarm.start()
        swarm.wait()
    except KeyboardInterrupt:
        console.print("stopping ...")
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {exc}")
        swarm.stop()
        raise typer.Exit(1) from exc
    swarm.stop()


ctl = typer.Typer(no_args_is_help=True, help="Control a running server (needs the admin token).")
app.add_typer(ctl, name="ctl")


def _ctl_call(method: str, path: str, server_url: str, token: str | None, body: dict | None = None) -> dict:
    import httpx

    token = token or _secret(None, "AGENTJET_ADMIN_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.request(method, f"{server_url.rstrip('/')}/swarm/v1/control/{path}", json=body, headers=headers,
                          timeout=600)
    except httpx.TransportError as exc:
        console.print(f"[red]error:[/red] cannot reach {server_url}: {exc}")
        raise typer.Exit(2) from exc
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text
        console.print(f"[red]error {r.status_code}:[/red] {message}")
        raise typer.Exit(2)
    return r.json()


_SERVER = typer.Option("http://127.0.0.1:10086", "--server", help="swarm server URL")
_TOKEN = typer.Option(None, "--token", help="admin token (or $AGENTJET_ADMIN_TOKEN[_FILE])")


def _parse_assignment(item: str) -> tuple[str, str, object]:
    import json

    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{item!r} must look like key=value (e.g. learning_rate=3e-5)")
    section, dot, name = key.partition(".")
    if not dot:
        section, name = ("sampling", key) if key in ("temperature", "top_p", "max_tokens") else ("training", key)
    if section not in ("training", "sampling"):
        raise typer.BadParameter(f"{key!r}: the section must be training or sampling")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return section, name, value


@ctl.command("status")
def ctl_status(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Print the live settings and the change log."""
    import json

    console.print_json(json.dumps(_ctl_call("GET", "config", server_url, token)))


@ctl.command("set")
def ctl_set(assignments: list[str] = typer.Argument(..., help="key=value, e.g. learning_rate=3e-5 group_size=8 "
                                                             "sampling.temperature=0.7"),
            server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Change settings live; they take effect from the next batch, without a restart."""
    body: dict[str, dict[str, object]] = {"training": {}, "sampling": {}}
    for item in assignments:
        section, name, value = _parse_assignment(item)
        body[section][name] = value
    rec = _ctl_call("POST", "config", server_url, token, body)
    console.print(f"applied at policy v{rec['policy_version']} (after step {rec['train_step']}): {rec['changes']}")


@ctl.command("pause")
def ctl_pause(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Pause training (episodes and generation continue; acknowledged episodes wait in the store)."""
    console.print(_ctl_call("POST", "pause", server_url, token))


@ctl.command("resume")
def ctl_resume(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Resume training."""
    console.print(_ctl_call("POST", "resume", server_url, token))


@ctl.command("checkpoint")
def ctl_checkpoint(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Save a checkpoint now (between train steps)."""
    console.print(_ctl_call("POST", "checkpoint", server_url, token))


@ctl.command("stop")
def ctl_stop(server_url: str = _SERVER, token: str | None = _TOKEN) -> None:
    """Checkpoint and stop the server."""
    console.print(_ctl_call("POST", "stop", server_url, token))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
