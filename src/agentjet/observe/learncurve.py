"""Learning curves for ``ajet bench``: a run's held-out eval against train steps and training minutes, read from
a demo result (``ajet demo``'s ``demo_result.json``, any version's format), and the figures taken from it.

- **steps to the target**: the first crossing of ``target`` by the eval curve, by linear interpolation in train
  steps between the last eval below the target and the first at or above it (0 when the first eval is there
  already; none when no eval reaches it). Evals run at fixed points of the training clock, so the steps at
  each eval depend on the machine; the interpolation reads the curve between them;
- **eval at step S**: the curve linearly interpolated at S train steps (none past the last eval's steps);
- training minutes to the target likewise, on the training clock (recorded, never gated).

Pure data: no server imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CurvePoint(BaseModel):
    """One held-out eval."""

    model_config = ConfigDict(extra="forbid")
    steps: int  # train steps done when the eval ran
    reward: float  # mean held-out reward
    train_minutes: float | None = None  # training clock (evals excluded); None: the demo did not record it
    minutes: float | None = None  # wall clock since the run started (evals included)


class LearnCurve(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str
    points: list[CurvePoint]
    target: float | None = None
    source: str = ""  # how the points were read (which demo format)


class CurveSpec(BaseModel):
    """What the bench reads off a task's curve and which figures it gates."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target: float | None = Field(None, description="held-out eval the run should reach (steps to the target)")
    at_steps: tuple[int, ...] = Field((), description="eval read at these train steps (gated)")
    final_gated: bool = Field(False, description="gate the final eval (only for a run bounded by steps, not time)")


# addition: 0.75 is the target docs/benchmarks.md has used since the vs-TRL runs (time to 0.75)
SPECS: dict[str, CurveSpec] = {
    "addition": CurveSpec(target=0.75, at_steps=(2, 4)),
    "lookup": CurveSpec(target=0.75, at_steps=(2,)),
    "toy": CurveSpec(final_gated=True),
}


def spec_for(task: str) -> CurveSpec:
    return SPECS.get(task, CurveSpec())


def _cross(a: float, b: float, ra: float, rb: float, target: float) -> float:
    return a if rb == ra else a + (target - ra) / (rb - ra) * (b - a)


def steps_to_target(curve: LearnCurve) -> float | None:
    """Train steps at the first crossing of the target (module docstring), or None."""
    return _to_target(curve, "steps")


def train_minutes_to_target(curve: LearnCurve) -> float | None:
    """Training minutes at the first crossing of the target, or None (not reached, or minutes not recorded)."""
    return _to_target(curve, "train_minutes")


def _to_target(curve: LearnCurve, axis: str) -> float | None:
    if curve.target is None:
        return None
    return first_crossing([(getattr(p, axis), p.reward) for p in curve.points], curve.target)


def first_crossing(points: Sequence[tuple[float | None, float]], target: float) -> float | None:
    """``x`` where the curve of ``(x, eval)`` points, in order, first reaches ``target``: linear between the last
    point below it and the first at or above it; the first point's ``x`` when that one is already there; None
    when no point reaches it (or an ``x`` it needs is unknown). The one rule for steps and minutes to a target."""
    prev: tuple[float | None, float] | None = None
    for x, reward in points:
        if reward >= target:
            if prev is None:
                return None if x is None else float(x)
            x0, r0 = prev
            return None if x is None or x0 is None else _cross(float(x0), float(x), r0, reward, target)
        prev = (x, reward)
    return None


def eval_at_step(curve: LearnCurve, step: float) -> float | None:
    """The eval curve linearly interpolated at ``step`` train steps; None past the last eval (or before the first).
    At a step several evals share, the latest of them."""
    pts = curve.points
    if not pts or step > pts[-1].steps or step < pts[0].steps:
        return None
    at = [p for p in pts if p.steps == step]
    if at:
        return at[-1].reward
    before = [p for p in pts if p.steps < step][-1]
    after = next(p for p in pts if p.steps > step)
    return before.reward + (step - before.steps) / (after.steps - before.steps) * (after.reward - before.reward)


def curve_from_demo(data: dict[str, Any], task: str | None = None, target: float | None = None) -> LearnCurve:
    """The held-out eval curve of a demo result. Since the scheduled client (e547190) a demo records every
    periodic eval (``evals``: wall and training seconds, train steps, reward); the first demos recorded only the
    eval before and after training, which become a two-point curve (the last at the run's wall minutes, its
    training minutes unknown)."""
    settings = data.get("settings") or {}
    task = task or str(settings.get("task", "addition"))
    if target is None:
        target = spec_for(task).target
    evals = data.get("evals") or []
    if evals:
        points = [CurvePoint(steps=int(e["train_steps"]), reward=float(e["reward"]),
                             train_minutes=float(e["train_seconds"]) / 60 if "train_seconds" in e else None,
                             minutes=float(e["seconds"]) / 60 if "seconds" in e else e.get("minutes"))
                  for e in evals]
        return LearnCurve(task=task, points=points, target=target, source="the demo's periodic evals (evals[])")
    points = [CurvePoint(steps=0, reward=float(data["eval_before"]), train_minutes=0.0, minutes=0.0),
              CurvePoint(steps=int(data["train_steps"]), reward=float(data["eval_after"]),
                         minutes=float(data["seconds"]) / 60 if "seconds" in data else None)]
    return LearnCurve(task=task, points=points, target=target,
                      source="eval before and after only (this demo had no periodic eval); the last point's "
                             "minutes are the run's wall minutes")
