"""``ajet research``: put a study's parts together and run it (or continue it), then write the report."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape

from agentjet.apps.research.display import Display
from agentjet.apps.research.executor import LocalExecutor, TrialExecutor
from agentjet.apps.research.program import Designer, OfflineDesigner, ProgramBudget, run_program
from agentjet.apps.research.report import StudyReport
from agentjet.apps.research.results import StudyResults
from agentjet.apps.research.runner import StudyAborted, StudyRunner
from agentjet.apps.research.spec import (
    StudySpec,
    StudySpecError,
    load_study,
    parse_scalar,
    spec_from_args,
    validate_spec,
)
from agentjet.apps.research.state import StudyBusy, StudyStore
from agentjet.apps.research.study import Study
from agentjet.apps.research.topic import (
    DesignError,
    StudyDesign,
    default_base,
    describe_design,
    design_or_error,
)
from agentjet.files import write_atomic

RESEARCH_DIR = Path("runs/research")  # where a study or a program goes without --out


def make_executor(ray: str | None) -> TrialExecutor:
    """Where the runs execute: this machine, or the Ray cluster at ``ray`` (an address, ``auto`` or ``local``)."""
    if ray is None:
        return LocalExecutor()
    try:
        from agentjet.apps.research.ray_executor import RayExecutor
    except ImportError as exc:
        raise StudySpecError(f"--ray needs Ray ({exc}); install the ray extra: pip install 'agentjet[ray]'") from exc
    return RayExecutor(ray)


def run_study(spec: StudySpec, out_dir: Path, console: Console | None = None,
              executor: TrialExecutor | None = None) -> Path:
    """Run (or continue) the study in ``out_dir`` (its runs on ``executor``: by default, this machine); returns
    the report's path."""
    display = Display(console, spec)
    study = Study(spec, out_dir, executor, event=display.event)
    if console is not None:
        sessions = study.state.sessions
        where = f" on the Ray cluster {getattr(executor, 'address', '')}" if executor and executor.name == "ray" else ""
        console.print(f"[bold]ajet research[/bold]: {spec.question}\n"
                      f"{'continuing' if sessions > 1 else 'starting'} the study in {out_dir}{where} "
                      f"(session {sessions})")
    try:
        with study:
            state = StudyRunner(study, display).run()
    finally:
        StudyReport(StudyResults.load(spec, out_dir)).write(out_dir)
    if console is not None:
        note = "finished" if state.finished else "stopped (budget spent; runs left planned)"
        console.print(f"study {note}; report: {out_dir / 'report.md'}, results: {out_dir / 'results.tsv'}")
    return out_dir / "report.md"


def report_only(spec: StudySpec, out_dir: Path) -> Path:
    """Rewrite ``report.md`` and ``results.*`` of the study in ``out_dir`` (its runs untouched)."""
    results = StudyResults.load(spec, out_dir)
    results.write(out_dir)
    return StudyReport(results).write(out_dir)


def parse_client(items: list[str]) -> dict[str, object]:
    """``--client key=value`` items as the study's client settings (values parsed as scalars)."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StudySpecError(f"--client {item!r} must look like steps=6")
        out[key.strip()] = parse_scalar(value)
    return out


def resolve_spec(study: str, base: Path | None, space: list[str], client: list[str],
                 overrides: Mapping[str, object]) -> StudySpec:
    """A study from a file (with command-line overrides), or from a question, ``--base`` and ``--space``."""
    client_settings = parse_client(client)
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
            raise StudySpecError("a question with --space needs --base swarm.yaml (the `ajet up` spec each trial "
                                 "starts from); with no --space the planner designs the study from the topic")
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
         out: Path | None, report: bool, console: Console, ray: str | None = None) -> int:
    """The ``ajet research`` command; returns the exit code (2: bad input, 1: the study was aborted). ``ray``: run
    the trials on that Ray cluster."""
    if overrides.get("planner.url") and "planner.kind" not in overrides:
        overrides = {**overrides, "planner.kind": "llm"}

    def body(executor: Callable[[], TrialExecutor]) -> int:
        spec = resolve_spec(study, base, space, client, overrides)
        out_dir = out or RESEARCH_DIR / spec.slug()
        if report:
            console.print(f"report: {report_only(spec, out_dir)}")
        else:
            run_study(spec, out_dir, console, executor())
        return 0

    return run_guarded(console, ray, body)


def run_guarded(console: Console, ray: str | None, body: Callable[[Callable[[], TrialExecutor]], int]) -> int:
    """Run a command's ``body`` with a getter of its trial executor (made on first use, for ``ray`` or this
    machine, and closed at the end); its exit code, 2 for bad input (printed) and 1 for an aborted study."""
    made: list[TrialExecutor] = []

    def executor() -> TrialExecutor:
        if not made:
            made.append(make_executor(ray))
        return made[0]

    try:
        return body(executor)
    except (StudySpecError, DesignError, StudyBusy, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except StudyAborted as exc:
        console.print(f"[red]study aborted:[/red] {escape(str(exc))}")
        return 1
    finally:
        for e in made:
            e.close()


# ---------------------------------------------------------------------- from a topic
def is_topic(study: str, space: list[str]) -> bool:
    """A question with no --space and no study file: the planner designs the study."""
    path = Path(study)
    return not space and path.suffix not in (".yaml", ".yml", ".json") and not path.exists()


def topic_extra(client: list[str], overrides: Mapping[str, object]) -> dict[str, object]:
    """The command line's settings that a designed study takes as given (the client, seeds, parallel, minutes)."""
    extra: dict[str, object] = {}
    client_settings = parse_client(client)
    if client_settings:
        extra["client"] = client_settings
    for key in ("seeds", "parallel"):
        if key in overrides:
            extra[key] = overrides[key]
    if "budget.minutes" in overrides:
        extra["budget"] = {"minutes": overrides["budget.minutes"]}
    ray = {k.removeprefix("ray."): v for k, v in overrides.items() if k.startswith("ray.")}
    if ray:
        extra["ray"] = ray
    return extra


def make_designer(topic: str, overrides: Mapping[str, object], display_note: Callable[[str], None]) -> Designer:
    url = overrides.get("planner.url")
    if isinstance(url, str) and url:
        from agentjet.apps.research.llm_designer import LLMDesigner

        return LLMDesigner(topic, url, str(overrides.get("planner.model", "default")), note=display_note)
    return OfflineDesigner(topic)


def base_mapping(base: Path | None) -> dict[str, object]:
    if base is None:
        return default_base()
    raw = yaml.safe_load(base.read_text()) if base.exists() else None
    if not isinstance(raw, dict):
        raise StudySpecError(f"--base {base} is not an `ajet up` spec (a mapping with servers)")
    return raw


def design_study(topic: str, out_dir: Path, designer: Designer, trials: int | None) -> StudyDesign:
    """The study's design: the one already in ``out_dir`` (a continued study), else a new one, written there."""
    path = out_dir / "design.json"
    if path.exists():
        return StudyDesign.model_validate_json(path.read_text())
    design = designer.first(topic, trials)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, design.model_dump_json(indent=1))
    write_atomic(out_dir / "design.md", describe_design(design))
    return design


def topic_main(topic: str, base: Path | None, client: list[str], overrides: Mapping[str, object], out: Path | None,
               program: bool, hours: float | None, dry_run: bool, console: Console, ray: str | None = None) -> int:
    """``ajet research "a topic"``: design a study (or a program of studies) from the topic and run it (``ray``: its
    trials on that Ray cluster)."""

    def body(executor: Callable[[], TrialExecutor]) -> int:
        base_raw = base_mapping(base)
        extra = topic_extra(client, overrides)
        trials = overrides.get("budget.trials")
        trials = trials if isinstance(trials, int) else None
        designer = make_designer(topic, overrides, lambda m: console.print(f"[yellow]{m}[/yellow]"))
        slug = re.sub(r"[^a-z0-9]+", "-", topic.lower()).strip("-")[:48] or "topic"
        if not dry_run:
            executor()  # a bad --ray fails here, before any design
        if program:
            root = out or RESEARCH_DIR / f"program-{slug}"
            state = run_program(topic, root, designer, lambda d: design_or_error(d, base_raw, extra),
                                lambda spec, d: run_study(spec, d, console, None if dry_run else executor()),
                                ProgramBudget(trials=trials, hours=hours),
                                note=lambda m: console.print(f"[bold]program[/bold]: {m}"))
            console.print(f"program {'finished' if state.finished else 'stopped'}: {root / 'program.md'}")
            return 0
        out_dir = out or RESEARCH_DIR / slug
        design = design_study(topic, out_dir, designer, trials)
        spec = design_or_error(design, base_raw, extra)
        console.print(describe_design(design))
        StudyStore(out_dir).save_spec(spec)
        console.print(f"the study: {out_dir / 'spec.yaml'} (rerun it with `ajet research {out_dir / 'spec.yaml'}`)")
        if not dry_run:
            run_study(spec, out_dir, console, executor())
        return 0

    return run_guarded(console, ray, body)
