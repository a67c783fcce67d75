"""The ``ajet bench`` suite: a fixed set of measurements, recorded version by version.

Quick and full mode:
1. engine: generation tok/s serial and 8 concurrent (their ratio is gated), train tok/s;
2. swarm overhead: chat calls/s through the server's HTTP path against the same null engine (100 ms per call)
   called directly, 8 concurrent episodes, in one process (the ratio is gated);
3. timeline merging: 8-turn agent episodes through the real server and tracker (null engine, fixed replies):
   tokens without merging / with merging and merged calls / calls (deterministic; gated);
4. learning. Quick: the demo (``agentjet.apps.demo.run_demo``) on the tiny model and the toy task
   (``agentjet.tasks.toy``), a fixed number of steps and a fixed seed; its final held-out eval is gated (a check
   that can fail: the learning rate / 100 leaves the eval where it started). Full: a short learning curve on the
   demo task through a real server and client (reward per step, recorded, not gated).

Learn mode (``ajet bench --learn``): the demo itself on SmolLM2 (the addition task, or ``--task lookup``) with a
fixed seed and a fixed training budget (5 minutes), held-out evals at fixed points of the training clock; the
record holds the eval curve (steps and minutes at each eval) and the figures read off it
(``agentjet.observe.learncurve``: steps to the target and eval at fixed steps are gated).

History, baseline, the gate and the report: ``agentjet.apps.bench.report``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from rich.console import Console

from agentjet.apps.bench.report import baseline_runs, gate, record_from_demo, render_report
from agentjet.models import DEFAULT_MODEL, TINY_RANDOM
from agentjet.observe.bench_records import (
    BaselineRef,
    BenchMetric,
    BenchRecord,
    GateResult,
    Mode,
    append_history,
    load_baseline,
    load_history,
    save_baseline,
)
from agentjet.runtime.provenance import device, git_commit, machine

if TYPE_CHECKING:
    from agentjet.apps.demo import DemoSettings

M = BenchMetric


@dataclass(frozen=True)
class SuiteSettings:
    quick: bool = True
    model: str | None = None  # default: tiny-random (quick) or DEFAULT_MODEL (full)
    learn_steps: int | None = None  # default: 3 (quick) or 6 (full)
    commit: str | None = None  # default: git HEAD of the working directory

    @property
    def model_name(self) -> str:
        return self.model or (TINY_RANDOM if self.quick else DEFAULT_MODEL)


# ------------------------------------------------------------------------------------------------ 1. engine
def engine_metrics(model: str, quick: bool) -> dict[str, BenchMetric]:
    from agentjet.engines.base import SamplingParams, TrainSample
    from agentjet.layouts import embedded_engine
    from agentjet.settings import GeneratorSettings

    engine = embedded_engine(model, GeneratorSettings(max_batch_size=8))
    prompt = list(engine.tokenizer.apply_chat_template([{"role": "user", "content": "Count from one to twenty."}],
                                                       add_generation_prompt=True, tokenize=True, return_dict=False))
    max_tokens = 32

    async def gen(n: int, seed: int) -> int:
        res = await asyncio.gather(*[engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=max_tokens,
                                                                            seed=seed + i)) for i in range(n)])
        return sum(len(r.token_ids) for r in res)

    async def measure() -> dict[str, float]:
        await gen(2, 0)  # warm-up
        reps = 2 if quick else 4
        t0 = time.perf_counter()
        serial = sum([await gen(1, 100 + i) for i in range(reps)])
        t1 = time.perf_counter()
        batched = sum([await gen(8, 200 + 8 * i) for i in range(reps)])
        t2 = time.perf_counter()
        batch = [TrainSample(prompt + list(range(10, 10 + max_tokens)), [0] * len(prompt) + [1] * max_tokens,
                             [0.0] * len(prompt) + [-1.0] * max_tokens, [0.0] * len(prompt) + [0.5] * max_tokens)
                 for _ in range(8)]
        await engine.train_step(batch)  # warm-up (optimizer state)
        t3 = time.perf_counter()
        steps = 1 if quick else 3
        for _ in range(steps):
            await engine.train_step(batch)
        t4 = time.perf_counter()
        await engine.close()
        tokens = steps * sum(len(s.input_ids) for s in batch)
        return {"serial": serial / (t1 - t0), "batched": batched / (t2 - t1), "train": tokens / (t4 - t3)}

    r = asyncio.run(measure())
    return {
        "engine/serial_tok_s": M(value=r["serial"], unit="tok/s", gated=False, note="one request at a time"),
        "engine/batch8_tok_s": M(value=r["batched"], unit="tok/s", gated=False, note="8 concurrent requests"),
        "engine/batch8_speedup": M(value=r["batched"] / r["serial"], unit="x", note="8 concurrent vs serial tok/s"),
        "engine/train_tok_s": M(value=r["train"], unit="tok/s", gated=False, note="train step, 8 x ~60 tokens"),
    }


# ------------------------------------------------------------------------------------------------ 2-3. swarm
def _null_server(tmp: Path, delay_s: float) -> Any:
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine
    from agentjet.models import resolve_model
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import ServerConfig, TrainingSettings

    path = resolve_model("tiny-random")
    engine = null_engine(AutoTokenizer.from_pretrained(path), reply="Let me check the next item.", delay_s=delay_s)
    cfg = ServerConfig(model=str(path), port=free_port(), data_dir=tmp, lease_seconds=120,
                       training=TrainingSettings(group_size=4, batch_groups=1000))  # no training in the way
    return BackgroundServer(SwarmServer(cfg, engine)).start()


def swarm_metrics(quick: bool) -> dict[str, BenchMetric]:
    """The same null engine (100 ms per generation) at 8 concurrent requests: called directly on the server's
    event loop, then through the HTTP API with 8 concurrent episodes; calls/s each way. The load stays well below
    the server's capacity, so the ratio is the time a call adds on its way through the server (HTTP, auth,
    template, recording) relative to a 100 ms generation; the load generator runs in this process, so its own
    HTTP cost counts too. (A saturated server's calls/s depend on what else the machine runs: see
    benchmarks/serving/swarm_overhead.py.)"""
    from agentjet.engines.base import SamplingParams

    seconds, conc, delay = (4.0 if quick else 10.0), 8, 0.1
    messages = [{"role": "user", "content": "What is 3 + 4? Answer with a number."}]
    with tempfile.TemporaryDirectory() as tmp:
        srv = _null_server(Path(tmp), delay)
        try:
            engine = srv.server.engine
            ids = srv.server.formatter.prompt_ids(messages, None)

            async def direct() -> float:
                stop, n = time.monotonic() + seconds, 0

                async def worker() -> None:
                    nonlocal n
                    while time.monotonic() < stop:
                        await engine.generate(ids, SamplingParams(max_tokens=16))
                        n += 1

                t0 = time.perf_counter()
                await asyncio.gather(*[worker() for _ in range(conc)])
                return n / (time.perf_counter() - t0)

            direct_rate = float(srv.call(direct()))
            api_rate, p50 = asyncio.run(_api_load(srv.url, conc, seconds, messages))
        finally:
            srv.stop()
    return {
        "swarm/overhead_ratio": M(value=api_rate / direct_rate, unit="x",
                                  note=f"calls/s through the API / direct, {conc} concurrent, {delay * 1000:.0f} ms engine"),
        "swarm/api_calls_per_s": M(value=api_rate, unit="calls/s", gated=False),
        "swarm/api_p50_ms": M(value=p50, unit="ms", higher_is_better=False, gated=False),
    }


async def _api_load(url: str, conc: int, seconds: float, messages: list[dict[str, str]]) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=conc + 4)) as http:
        eps = [(await http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"t{i}"})).json()
               for i in range(conc)]
        stop, lat = time.monotonic() + seconds, []

        async def worker(ep: dict[str, Any]) -> None:
            headers = {"Authorization": f"Bearer {ep['api_key']}"}
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = await http.post("/v1/chat/completions", headers=headers,
                                    json={"model": "agent", "messages": messages, "max_tokens": 16})
                r.raise_for_status()
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker(ep) for ep in eps])
        elapsed = time.perf_counter() - t0
        for ep in eps:
            await http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "bench"},
                            headers={"Authorization": f"Bearer {ep['api_key']}"})
    return len(lat) / elapsed, 1000 * statistics.median(lat)


def merging_metrics(turns: int = 8, episodes: int = 4) -> dict[str, BenchMetric]:
    """Agent-style episodes (each call resends the whole history) through the real server path and tracker."""
    with tempfile.TemporaryDirectory() as tmp:
        srv = _null_server(Path(tmp), 0.0)
        ids = []
        try:
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                for e in range(episodes):
                    ep = http.post("/swarm/v1/episodes", json={"client_id": "bench", "task_id": f"m{e}"}).json()
                    ids.append(ep["episode_id"])
                    headers = {"Authorization": f"Bearer {ep['api_key']}"}
                    messages: list[dict[str, Any]] = [
                        {"role": "system", "content": "You are an agent. Check each item, then answer."},
                        {"role": "user", "content": f"Task {e}: check items 1 to {turns}."}]
                    for t in range(turns):
                        r = http.post("/v1/chat/completions", headers=headers,
                                      json={"model": "agent", "messages": messages, "max_tokens": 16})
                        r.raise_for_status()
                        messages += [r.json()["choices"][0]["message"],
                                     {"role": "user", "content": f"Item {t + 1}: ok, value {7 * t + e}."}]
                    http.post(f"/swarm/v1/episodes/{ep['episode_id']}/end", headers=headers,
                              json={"reward": 1.0}).raise_for_status()
            reports = [srv.server.store.tracking_report(eid) or {} for eid in ids]
        finally:
            srv.stop()
    total = {k: sum(r.get(k, 0) for r in reports) for k in ("tokens_unmerged", "tokens_merged", "merged_calls", "calls")}
    return {
        "merge/token_ratio": M(value=total["tokens_unmerged"] / max(total["tokens_merged"], 1), unit="x",
                               note=f"tokens one-sample-per-call / merged, {turns}-turn agent episodes"),
        "merge/merged_call_ratio": M(value=total["merged_calls"] / max(total["calls"], 1), unit="",
                                     note="calls absorbed into a longer call's sample"),
    }


# ------------------------------------------------------------------------------------------------ 4. learning
def learning_metrics(model: str, steps: int, quick: bool) -> tuple[dict[str, BenchMetric], dict[str, list[float]]]:
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig, TrainingSettings
    from agentjet.tasks import DEFAULT_TASK, get_task

    task = get_task(DEFAULT_TASK)
    rec = task.RECOMMENDED
    group = 4 if quick else rec.group_size
    lr = 1e-3 if quick else rec.learning_rate
    learner = LearnerSettings(learning_rate=lr)
    engine = embedded_engine(model, GeneratorSettings(max_batch_size=8), learner)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServerConfig(model=model, port=free_port(), data_dir=Path(tmp), learner=learner, training=TrainingSettings(
            group_size=group, batch_groups=1 if quick else rec.batch_groups,
            checkpoint_every=0, drop_uniform_groups=not quick, max_staleness=2))  # quick: the tiny model scores 0
        srv = BackgroundServer(SwarmServer(cfg, engine)).start()
        try:
            t0 = time.perf_counter()
            asyncio.run(_train_until(srv, task, group, steps, budget_s=90 if quick else None))
            elapsed = time.perf_counter() - t0
            done = srv.server.counters.training.train_steps
            curve = [m["reward_mean"] for _, _, m, _ in srv.server.store.step_metrics()]
        finally:
            srv.stop()
    first, last = (curve[0], curve[-1]) if curve else (0.0, 0.0)
    metrics = {
        "learn/steps": M(value=done, gated=False),
        "learn/seconds_per_step": M(value=elapsed / max(done, 1), unit="s", higher_is_better=False, gated=False),
        "learn/reward_first": M(value=first, gated=False),
        "learn/reward_last": M(value=last, gated=False),
    }
    return metrics, {"learn/reward": curve}


async def _train_until(srv: Any, task: Any, group: int, steps: int, budget_s: float | None) -> None:
    """Train on the task's train split until the server has taken ``steps`` steps or ``budget_s`` has passed
    (None: the run's default budget)."""
    import itertools

    from agentjet.client.client import SwarmClient
    from agentjet.client.driver import Driver
    from agentjet.client.runner import task_workflow
    from agentjet.client.settings import RunSettings

    budget = {"time_budget_s": budget_s} if budget_s is not None else {}
    async with SwarmClient(srv.url, client_id="bench") as client:
        driver = Driver(client, task_workflow(task, task.SAMPLING, model="bench"),
                        RunSettings(group_size=group, concurrency=group, poll_s=0.2, max_steps=steps, **budget))
        await driver.run(itertools.cycle(task.generate_tasks("train", 1000, seed=0)))


# ------------------------------------------------------------------------------------------------ 5. the demo's curve
LEARN_BUDGET_S = 300.0  # training seconds per learn run (the demo's training clock: evals excluded)
# Held-out evals this many times as often as the task recommends: the learn run's budget is a quarter of the demo's
# (5 of 20 minutes), so its curve has points where the demo's would (addition: every 60 s, lookup: 150 s).
LEARN_EVAL_DENSITY = 2.0
# a ceiling on train steps far above what the budget allows, so the budget binds in every version (the first
# demo's default ceiling for addition was 12 steps)
LEARN_STEPS_CEILING = 1000
TOY_STEPS = 14  # the quick check: train steps of the toy task (its RECOMMENDED), or fewer when it stops teaching
TOY_MIN_STEPS = 7  # the quick check trained for real: at step 7 the toy's groups still teach (reward ~0.85)


def learn_demo(**changes: Any) -> DemoSettings:
    """The demo run ``ajet bench --learn`` measures: ``changes`` (DemoSettings' fields; ``run`` a dict of
    RunSettings' fields) over the bench's own: a ``LEARN_BUDGET_S`` budget that binds (``LEARN_STEPS_CEILING``)
    and no early stop."""
    from agentjet.apps.demo import DemoSettings

    run = {"time_budget_s": LEARN_BUDGET_S, "max_steps": LEARN_STEPS_CEILING, **changes.pop("run", {})}
    return DemoSettings.model_validate({"early_stop": False, **changes, "run": run})


@dataclass(frozen=True)
class LearnSettings:
    """One learning run: ``ajet demo`` with ``demo`` (``learn_demo``; ``demo_flags`` gives the same as CLI flags,
    which the backfill script hands to a past commit's demo), recorded under ``commit`` (default: git HEAD of the
    working directory)."""

    demo: DemoSettings = field(default_factory=learn_demo)
    commit: str | None = None

    @property
    def eval_interval_s(self) -> float:
        """Seconds of training between held-out evals: the run's, else the task's recommendation times
        ``LEARN_EVAL_DENSITY`` as often (0: before and after only)."""
        run = self.demo.run
        if "eval_every_s" in run.model_fields_set:
            return run.eval_every_s or 0.0
        from agentjet.tasks import get_task

        return get_task(self.demo.task).RECOMMENDED.eval_every_s / LEARN_EVAL_DENSITY

    def recorded(self) -> dict[str, Any]:
        """The run's settings as a history record keeps them (``settings.bench``): flat, the interval used."""
        demo = self.demo.model_dump(mode="json", exclude={"out_dir", "run"})
        return {**demo, **self.demo.run.model_dump(mode="json"), "eval_every_s": self.eval_interval_s,
                "commit": self.commit}

    def with_seed(self, seed: int) -> LearnSettings:
        return replace(self, demo=self.demo.model_copy(update={"seed": seed}))

    def demo_settings(self, out_dir: Path) -> DemoSettings:
        run = self.demo.run.model_copy(update={"eval_every_s": self.eval_interval_s})
        return self.demo.model_copy(update={"out_dir": out_dir, "run": run})


def demo_flags(s: LearnSettings) -> dict[str, str | None]:
    """``ajet demo`` flags for the same run (flag -> value; None for a switch)."""
    d, run = s.demo, s.demo.run
    flags: dict[str, str | None] = {"--model": d.model, "--task": d.task, "--seed": str(d.seed),
                                    "--time-budget-s": f"{run.time_budget_s:g}",
                                    "--eval-every-s": f"{s.eval_interval_s:g}"}
    if not d.early_stop:
        flags["--no-early-stop"] = None
    if run.max_steps is not None:
        flags["--steps"] = str(run.max_steps)
    if d.learning_rate is not None:
        flags["--lr"] = f"{d.learning_rate:g}"
    return flags


def run_learn(s: LearnSettings, console: Console | None = None, mode: Mode = "learn") -> BenchRecord:
    """Run the demo with ``s`` and turn its result (``demo_result.json``) into a history record."""
    import json

    from agentjet.apps.demo import run_demo

    console = console or Console()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run_demo(s.demo_settings(Path(tmp)), console)
        data = json.loads((Path(tmp) / "demo_result.json").read_text())
    record = record_from_demo(data, mode=mode, commit=s.commit or git_commit(), machine=machine(), device=device(),
                              date=_now(), notes=f"ajet bench: the demo run in process, {_describe(s)}")
    return record.model_copy(update={"seconds": time.perf_counter() - start,
                                     "settings": {**record.settings, "bench": s.recorded()}})


def _describe(s: LearnSettings) -> str:
    d, run = s.demo, s.demo.run
    bound = (f"{run.max_steps} steps" if run.max_steps is not None and s.eval_interval_s == 0
             else f"{(run.time_budget_s or 0) / 60:g} min budget")
    return f"{d.model} on {d.task}, seed {d.seed}, {bound}, evals every {s.eval_interval_s:g} s of training"


def toy_settings(model: str) -> LearnSettings:
    """The quick check's run: the toy task, ``TOY_STEPS`` steps (seed 0), eval before and after only, on-policy.

    On-policy (``max_staleness`` 0) so that the result does not depend on the machine's load: with the demo's
    bound of 2, the same seeded run beside two busy processes ended at a held-out eval of 0.45 to 0.74 instead of
    1.0 (stale tokens masked out of a 14-step run); on-policy it ended at 1.0 both times, loaded or not.

    It stops early when the groups stop teaching (the demo's no-signal rule): the toy task is often solved by
    step 10, and then nearly every group has equal rewards and is skipped, so the last steps could take minutes
    (7.1 min for 14 steps in one run beside a busy test suite: 14,360 episodes, 1,767 of 1,795 groups uniform)."""
    from agentjet.tasks import toy

    return LearnSettings(demo=learn_demo(task=toy.NAME, model=model, seed=0, max_staleness=0, early_stop=True,
                                         run={"eval_every_s": 0, "max_steps": TOY_STEPS, "time_budget_s": 600}))


def toy_learning(model: str, console: Console | None = None) -> BenchRecord:
    """The quick check: does the tiny model learn the toy task (``toy_settings``)?"""
    return run_learn(toy_settings(model), Console(quiet=True) if console is None else console, mode="quick")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ------------------------------------------------------------------------------------------------ the suite
def run_suite(s: SuiteSettings, console: Console | None = None,
              progress: Callable[[str], None] | None = None) -> BenchRecord:
    from agentjet.models import resolve_model

    console = console or Console()
    say = progress or (lambda msg: console.print(f"[bold]{msg}[/bold]"))
    model = str(resolve_model(s.model_name))
    start = time.perf_counter()
    metrics: dict[str, BenchMetric] = {}
    say(f"1/4 engine ({s.model_name})")
    metrics |= engine_metrics(model, s.quick)
    say("2/4 swarm overhead (null engine)")
    metrics |= swarm_metrics(s.quick)
    say("3/4 timeline merging (null engine, real tracker)")
    metrics |= merging_metrics()
    notes = f"model {s.model_name}"
    curves = {}
    if s.quick:
        say(f"4/4 learning check: the demo on the toy task, {TOY_STEPS} steps ({s.model_name})")
        toy = toy_learning(model, console)  # its progress shows: a run that stalls says where
        metrics |= toy.metrics
        curves = toy.curves
    else:
        say(f"4/4 learning curve on the demo task ({s.model_name})")
        learn, rewards = learning_metrics(model, s.learn_steps or 6, s.quick)
        metrics |= learn
        notes += "; curves: " + ", ".join(f"{k}={[round(v, 3) for v in c]}" for k, c in rewards.items())
    return BenchRecord(commit=s.commit or git_commit(), date=_now(), machine=machine(), device=device(),
                       mode="quick" if s.quick else "full", seconds=time.perf_counter() - start, metrics=metrics,
                       notes=notes, curves=curves)


# ------------------------------------------------------------------------------------------------ ajet bench
@dataclass(frozen=True)
class BenchOptions:
    quick: bool = True
    learn: LearnSettings | None = None  # learn mode: these runs (quick is then ignored)
    repeat: int = 1  # runs in a row (learn mode: seeds seed, seed + 1, ...); a baseline wants 3 or more
    history: Path = Path("benchmarks/bench_history.jsonl")
    baseline: Path = Path("benchmarks/bench_baseline.json")
    sigmas: float | None = None  # default: the baseline file's (2)
    set_baseline: bool = False
    record: bool = True
    compare_only: bool = False  # re-check the latest history record of this mode; run nothing
    report_only: bool = False  # render the report from the history; run and compare nothing
    inject: dict[str, float] | None = None  # metric -> factor applied before the comparison (tests the gate)
    report_dir: Path | None = Path("runs/bench")
    suite: SuiteSettings | None = None

    @property
    def mode(self) -> str:
        return "learn" if self.learn is not None else "quick" if self.quick else "full"


Runner = Callable[[int], BenchRecord]


def _runner(opts: BenchOptions, console: Console, suite: Callable[[SuiteSettings, Console], BenchRecord],
            learn: Callable[[LearnSettings, Console], BenchRecord]) -> Runner:
    if opts.learn is not None:
        settings = opts.learn
        return lambda i: learn(settings.with_seed(settings.demo.seed + i), console)
    return lambda i: suite(opts.suite or SuiteSettings(quick=opts.quick), console)


def run_bench(opts: BenchOptions, console: Console | None = None,
              suite: Callable[[SuiteSettings, Console], BenchRecord] = run_suite,
              learn: Callable[[LearnSettings, Console], BenchRecord] = run_learn) -> int:
    """Run (or re-check) the suite, append to the history, gate each run against the baseline runs, render the
    report. Returns the exit code: 1 on a regression, 2 on bad input, else 0."""
    console = console or Console()
    mode = opts.mode
    if opts.report_only:
        return _report(opts, console)
    if opts.compare_only:
        runs = [r for r in load_history(opts.history) if r.mode == mode]
        if not runs:
            console.print(f"[red]error:[/red] no {mode} run in {opts.history} to compare")
            return 2
        records = [runs[-1]]
    else:
        run = _runner(opts, console, suite, learn)
        records = []
        for i in range(opts.repeat):
            if opts.repeat > 1:
                console.print(f"[bold]run {i + 1} of {opts.repeat}[/bold]")
            records.append(run(i))
            if opts.record and not opts.inject:
                append_history(opts.history, records[-1])
                console.print(f"appended to {opts.history}")
    if opts.inject:
        unknown = set(opts.inject) - {n for r in records for n in r.metrics}
        if unknown:
            console.print(f"[red]error:[/red] --inject-regression names unknown metrics {sorted(unknown)}; "
                          f"metrics: {sorted({n for r in records for n in r.metrics})}")
            return 2
        records = [r.model_copy(update={"metrics": {
            k: m.model_copy(update={"value": m.value * opts.inject.get(k, 1.0)}) for k, m in r.metrics.items()}})
            for r in records]
    baseline = load_baseline(opts.baseline)
    if opts.sigmas is not None:
        baseline = baseline.model_copy(update={"sigmas": opts.sigmas})
    if opts.set_baseline and not opts.inject:
        baseline.modes[mode] = BaselineRef(commit=records[-1].commit)
        save_baseline(opts.baseline, baseline)
        console.print(f"baseline for {mode} runs set to commit {records[-1].commit[:10]} in {opts.baseline}")
    history = load_history(opts.history)
    failed = 0
    for record in records:
        runs = baseline_runs(history, baseline, mode, like=record)
        results = gate(record, runs, baseline)
        _print_gate(console, record, results)
        if not runs:
            console.print(f"[yellow]no {mode} baseline runs for this record in {opts.baseline} and "
                          f"{opts.history}: nothing compared with a baseline (--set-baseline)[/yellow]")
        elif len(runs) < baseline.min_runs:
            console.print(f"[yellow]the {mode} baseline has {len(runs)} run(s); the rule asks for "
                          f"{baseline.min_runs} (--repeat {baseline.min_runs} --set-baseline): its spread is "
                          "the floor or a thin estimate[/yellow]")
        regressions = [c for c in results if c.regressed]
        if regressions:
            failed += 1
            console.print(f"[red]{len(regressions)} regression(s) (beyond {baseline.sigmas:g} standard deviations "
                          f"of the baseline, or over an absolute bound):[/red] " + ", ".join(
                              f"{c.name} {'missing' if c.value is None else f'{c.value:.4g}'} (limit {c.limit:.4g})"
                              for c in regressions))
    if opts.report_dir is not None:
        _report(opts, console)
    return 1 if failed else 0


def _print_gate(console: Console, record: BenchRecord, results: list[GateResult]) -> None:
    from rich.table import Table

    table = Table(title=f"ajet bench ({record.mode}, commit {record.commit[:10]}, {record.seconds:.0f} s)")
    for col in ("metric", "value", "unit", "baseline: mean±std (k)", "limit", ""):
        table.add_column(col, justify="left" if col in ("metric", "unit", "") else "right",
                         no_wrap=col in ("metric", ""))
    by_name = {c.name: c for c in results}
    for name in sorted(set(record.metrics) | set(by_name)):
        m, c = record.metrics.get(name), by_name.get(name)
        verdict = ("[red]REGRESSION[/red]" if c.regressed else "ok") if c else (
            "not gated" if m is not None and not m.gated else "")
        table.add_row(name, "missing" if m is None else f"{m.value:.4g}", m.unit if m else "",
                      ("absolute bound" if c.k == 0 else f"{c.mean:.3g}±{c.std:.2g} ({c.k})") if c else "",
                      f"{c.limit:.4g}" if c else "", verdict)
    console.print(table)


def _report(opts: BenchOptions, console: Console) -> int:
    out_dir = opts.report_dir or Path("runs/bench")
    out = render_report(load_history(opts.history), out_dir, load_baseline(opts.baseline))
    console.print("report: " + ", ".join(out.values()))
    return 0
