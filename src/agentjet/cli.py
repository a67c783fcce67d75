"""The ``ajet`` command line."""

from __future__ import annotations

import asyncio
import time

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
