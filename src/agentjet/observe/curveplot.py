"""The one learning-curve plot: panels of lines, each line a :class:`LearnCurve`'s eval points on an axis (train
steps, training minutes or wall minutes) or plain ``(x, y)`` pairs (a train-reward series, a mean of seeds).
The demo's ``reward_curve.png``, the bench's learning curves, ``ajet research``'s ``metric_vs_step.png`` and the
benchmark scripts' figures are drawn here. matplotlib is imported when a plot is drawn (False without it).

    plot_curves([Panel([Line(curve, label="seed 0")], x="train_minutes", target=0.75)], path, "title")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentjet.observe.learncurve import LearnCurve

AXES = ("steps", "train_minutes", "minutes")


@dataclass(frozen=True)
class Line:
    """One line: ``curve``'s points on ``x`` (default: the panel's axis; points without that x are left out),
    else the ``xy`` pairs. ``style``: matplotlib keywords (color, linestyle, marker, alpha, ...)."""

    curve: LearnCurve | None = None
    xy: Sequence[tuple[float, float]] = ()
    x: str | None = None
    label: str | None = None
    style: dict[str, Any] = field(default_factory=dict)

    def data(self, axis: str) -> tuple[list[float], list[float]]:
        if self.curve is None:
            return [float(x) for x, _ in self.xy], [float(y) for _, y in self.xy]
        pts = [(p.x(self.x or axis), p.reward) for p in self.curve.points]
        kept = [(x, y) for x, y in pts if x is not None]
        return [x for x, _ in kept], [y for _, y in kept]


@dataclass(frozen=True)
class Panel:
    lines: Sequence[Line]
    x: str = "steps"  # one of AXES
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    target: float | None = None  # a dotted grey line at the target
    target_label: str | None = None
    ylim: tuple[float, float] | None = None
    legend: str | None = "lower right"  # the legend's place; None: no legend
    legend_fontsize: float | None = None
    title_fontsize: float | None = None


def plot_curves(panels: Panel | Sequence[Panel], path: Path, title: str = "", *, cols: int = 1,
                figsize: tuple[float, float] = (8, 4.5), dpi: int = 120, title_fontsize: float | None = None) -> bool:
    """Draw ``panels`` (row by row, ``cols`` a row) into the PNG at ``path``; ``title`` is the figure's title
    (the panel's own title when there is one panel). False without matplotlib or panels."""
    panels = [panels] if isinstance(panels, Panel) else list(panels)
    if not panels:
        return False
    for p in panels:
        if p.x not in AXES:
            raise ValueError(f"unknown curve axis {p.x!r} (one of {', '.join(AXES)})")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=figsize, squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for line in panel.lines:
            xs, ys = line.data(panel.x)
            ax.plot(xs, ys, label=line.label, **line.style)
        if panel.target is not None:
            ax.axhline(panel.target, color="grey", linestyle=":", label=panel.target_label,
                       **({} if panel.target_label else {"linewidth": 0.8}))
        ax_title = panel.title or (title if len(panels) == 1 else "")
        if ax_title:
            ax.set_title(ax_title, **_size(panel.title_fontsize or (title_fontsize if not panel.title else None)))
        if panel.xlabel:
            ax.set_xlabel(panel.xlabel)
        if panel.ylabel:
            ax.set_ylabel(panel.ylabel)
        if panel.ylim is not None:
            ax.set_ylim(*panel.ylim)
        ax.grid(alpha=0.3)
        if panel.legend is not None:
            ax.legend(loc=panel.legend, **_size(panel.legend_fontsize))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title and len(panels) > 1:
        fig.suptitle(title, **_size(title_fontsize))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return True


def _size(fontsize: float | None) -> dict[str, Any]:
    return {} if fontsize is None else {"fontsize": fontsize}
