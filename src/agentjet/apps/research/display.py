"""Progress on the terminal while a study runs: a live table of the runs, and one line per event."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agentjet.apps.research.spec import StudySpec
from agentjet.apps.research.state import StudyState, TrialRecord, TrialState

_STYLE = {TrialState.PLANNED: "dim", TrialState.RUNNING: "bold cyan", TrialState.DONE: "green",
          TrialState.FAILED: "red", TrialState.PRUNED: "yellow"}


@dataclass(frozen=True)
class RunView:
    run: TrialRecord
    train_steps: int
    seconds: float


class Display:
    """``console=None``: silent (tests, library use)."""

    def __init__(self, console: Console | None, spec: StudySpec) -> None:
        self.console = console
        self.spec = spec
        self._live: Live | None = None

    def __enter__(self) -> Display:
        if self.console is not None and self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def event(self, text: str) -> None:
        if self.console is not None:
            self.console.print(Text(text), soft_wrap=True)

    def update(self, state: StudyState, running: list[RunView], elapsed_s: float) -> None:
        if self._live is not None:
            self._live.update(self.render(state, running, elapsed_s))

    def render(self, state: StudyState, running: list[RunView], elapsed_s: float) -> Group:
        views = {v.run.id: v for v in running}
        metric = self.spec.metric
        table = Table(title=self.spec.question, title_justify="left", expand=False)
        for col in ("run", "seed", *self.spec.space, "state", "step", "metric", "time"):
            table.add_column(col, no_wrap=True)
        for t in state.trials:
            v = views.get(t.id)
            value = t.value(metric)
            last = t.points[-1].reward if t.points else None
            shown = value if value is not None else last
            step = f"{v.train_steps}/{self.spec.client.steps}" if v else (str(t.last_step) if t.points else "")
            secs = v.seconds if v else t.seconds
            table.add_row(t.id, str(t.seed), *[_fmt(t.params[n]) for n in self.spec.space],
                          Text(t.state.value, style=_STYLE[t.state]), step,
                          "" if shown is None else f"{shown:.3f}", f"{secs / 60:.1f}m" if secs else "")
        budget = self.spec.budget
        counts = ", ".join(f"{len(state.by_state(s))} {s.value}" for s in TrialState if state.by_state(s))
        limit = f" of {budget.minutes:.0f}" if budget.minutes else ""
        footer = Text(f"{elapsed_s / 60:.1f}{limit} min; {counts or 'no runs yet'}", style="dim")
        return Group(table, footer)


def _fmt(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
