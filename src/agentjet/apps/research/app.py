"""``ajet research``: put a study's parts together and run it (or continue it), then write the report."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from agentjet.apps.research.display import Display
from agentjet.apps.research.planner import OptunaPlanner, Planner
from agentjet.apps.research.report import write_report
from agentjet.apps.research.runner import StudyAborted, StudyRunner
from agentjet.apps.research.spec import (
    PlannerKind,
    StudySpec,
    StudySpecError,
    load_study,
    parse_scalar,
    spec_from_args,
    validate_spec,
)
from agentjet.apps.research.state import StudyBusy, StudyStore


def default_out_dir(spec: StudySpec) -> Path:
    return Path("runs/research") / spec.slug()


def build_planners(spec: StudySpec, display: Display) -> tuple[Planner, OptunaPlanner]:
    """(the planner that proposes configurations, the Optuna study that tracks runs and prunes)."""
    offline = OptunaPlanner(spec)
    if spec.planner.kind is PlannerKind.LLM:
        from agentjet.apps.research.llm_planner import LLMPlanner

        return LLMPlanner(spec, offline, note=display.event), offline
    return offline, offline


def run_study(spec: StudySpec, out_dir: Path, console: Console | None = None) -> Path:
    """Run (or continue) the study in ``out_dir``; returns the report's path."""
    display = Display(console, spec)
    planner, offline = build_planners(spec, display)
    runner = StudyRunner(spec, out_dir, planner, offline, display)
    if console is not None:
        resumed = runner.state.sessions > 1
        console.print(f"[bold]ajet research[/bold]: {spec.question}\n"
                      f"{'continuing' if resumed else 'starting'} the study in {out_dir} "
                      f"(session {runner.state.sessions})")
    try:
        state = runner.run()
    finally:
        write_report(spec, StudyStore(out_dir).load(), out_dir)
    if console is not None:
        note = "finished" if state.finished else "stopped (budget spent; runs left planned)"
        console.print(f"study {note}; report: {out_dir / 'report.md'}, results: {out_dir / 'results.tsv'}")
    return out_dir / "report.md"


def report_only(spec: StudySpec, out_dir: Path) -> Path:
    store = StudyStore(out_dir)
    if not store.exists():
        raise FileNotFoundError(f"no study in {out_dir}")
    state = store.load()
    store.write_results(state, spec)
    return write_report(spec, state, out_dir)


def resolve_spec(study: str, base: Path | None, space: list[str], client: list[str],
                 overrides: Mapping[str, object]) -> StudySpec:
    """A study from a file (with command-line overrides), or from a question, ``--base`` and ``--space``."""
    client_settings: dict[str, object] = {}
    for item in client:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StudySpecError(f"--client {item!r} must look like steps=6")
        client_settings[key.strip()] = parse_scalar(value)
    path = Path(study)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.exists():
            raise StudySpecError(f"study file {path} does not exist")
        if base is not None or space:
            raise StudySpecError("--base and --space go with a question, not with a study file")
        spec = load_study(path)
        raw = spec.model_dump(mode="json", exclude_none=True)
        root = path.parent
    else:
        if base is None:
            raise StudySpecError("a question needs --base swarm.yaml (the `ajet up` spec each trial starts from)")
        spec = spec_from_args(study, base, space, {})
        raw = spec.model_dump(mode="json", exclude_none=True)
        root = Path.cwd()
    if not overrides and not client_settings:
        return spec
    for dotted, setting in overrides.items():
        section, _, key = dotted.partition(".")
        if key:
            raw[section] = {**raw.get(section, {}), key: setting}
        else:
            raw[section] = setting
    if client_settings:
        raw["client"] = {**raw.get("client", {}), **client_settings}
    return validate_spec(raw, "the study with its command-line options", root)


def main(study: str, base: Path | None, space: list[str], client: list[str], overrides: Mapping[str, object],
         out: Path | None, report: bool, console: Console) -> int:
    """The ``ajet research`` command; returns the exit code (2: bad input, 1: the study was aborted)."""
    if overrides.get("planner.url") and "planner.kind" not in overrides:
        overrides = {**overrides, "planner.kind": "llm"}
    try:
        spec = resolve_spec(study, base, space, client, overrides)
        out_dir = out or default_out_dir(spec)
        if report:
            console.print(f"report: {report_only(spec, out_dir)}")
        else:
            run_study(spec, out_dir, console)
    except (StudySpecError, StudyBusy, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except StudyAborted as exc:
        console.print(f"[red]study aborted:[/red] {exc}")
        return 1
    return 0
