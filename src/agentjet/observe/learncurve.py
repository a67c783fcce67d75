"""Learning curves for ``ajet bench``: a run's held-out eval against train steps and training minutes, read from
a demo result (``ajet demo``'s ``demo_result.json``, any version's format), and the figures taken from it.

- **steps to the target**: the first crossing of ``target`` by the eval curve, by linear interpolation in train
  steps between the last eval below the target and the first at or above it (0 when the first eval is there
  already; none when no eval reaches it). Evals run at fixed points of the training clock, so the steps at
  each eval depend on the machine; the interpolation reads the curve between them;
- **eval at step S**: the curve linearly interpolated at S train steps (none past the last eval's steps);
- training minutes to the target likewise, on the training clock (recorded, never gated);
- **decline after the target**: the best eval since the first crossing minus the last eval (learning that
  holds; gated against the task's absolute ``max_decline``).

Pure data: no server imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from agentjet.protocol import EvalPoint  # the one eval-point record (the client's and the server's)
from agentjet.tasks import addition, lookup, toy


def _from_stored(data: Any) -> Any:
    """A point as ``bench_history.jsonl`` keeps it (``steps``, ``reward``, ``train_minutes``, ``minutes``: the
    dashboard's bench page reads these) -> the fields of :class:`EvalPoint`."""
    if isinstance(data, dict) and "steps" in data and "train_steps" not in data:
        tm, m = data.get("train_minutes"), data.get("minutes")
        return {"train_steps": data["steps"], "reward": data["reward"], "policy_version": None,
                "train_seconds": None if tm is None else float(tm) * 60, "seconds": None if m is None else float(m) * 60}
    return data


def _to_stored(p: EvalPoint) -> dict[str, Any]:
    return {"steps": p.train_steps, "reward": p.reward, "train_minutes": p.train_minutes, "minutes": p.minutes}


class LearnCurve(BaseModel):
    """A run's held-out eval curve: its eval points in order. Stored (``BenchRecord.curves``) in the compact point
    shape the bench page reads (``steps``, ``reward``, ``train_minutes``, ``minutes``); read from it or from
    whole :class:`EvalPoint` records."""

    model_config = ConfigDict(extra="forbid")
    task: str
    points: list[EvalPoint]
    target: float | None = None
    source: str = ""  # how the points were read (which demo format)

    @field_validator("points", mode="before")
    @classmethod
    def _read_stored(cls, v: Any) -> Any:
        return [_from_stored(p) for p in v] if isinstance(v, list) else v

    @field_serializer("points")
    def _write_stored(self, points: list[EvalPoint]) -> list[dict[str, Any]]:
        return [_to_stored(p) for p in points]


class CurveSpec(BaseModel):
    """What the bench reads off a task's curve and which figures it gates."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target: float | None = Field(None, description="held-out eval the run should reach (steps to the target)")
    at_steps: tuple[int, ...] = Field((), description="eval read at these train steps (gated)")
    final_gated: bool = Field(False, description="gate the final eval (only for a run bounded by steps, not time)")
    max_decline: float | None = Field(None, ge=0, description="the most the held-out eval may fall, by the end of "
                                      "the budget, below its best since it first reached the target (an absolute "
                                      "bound, gated whatever the baseline: learning that holds)")


# addition: 0.75 is the target docs/benchmarks.md has used since the vs-TRL runs (time to 0.75)
SPECS: dict[str, CurveSpec] = {
    addition.NAME: CurveSpec(target=0.75, at_steps=(2, 4), max_decline=0.06),  # issue 38's bar
    lookup.NAME: CurveSpec(target=0.75, at_steps=(2,)),
    toy.NAME: CurveSpec(final_gated=True),
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
    return first_crossing([(p.x(axis), p.reward) for p in curve.points], curve.target)


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


def decline_after_target(curve: LearnCurve) -> float | None:
    """How far the last eval sits below the best eval since the curve first reached its target (0: it ends at its
    best); None when it never reached the target (or has none)."""
    if curve.target is None:
        return None
    first = next((i for i, p in enumerate(curve.points) if p.reward >= curve.target), None)
    if first is None:
        return None
    late = [p.reward for p in curve.points[first:]]
    return max(late) - late[-1]


def eval_at_step(curve: LearnCurve, step: float) -> float | None:
    """The eval curve linearly interpolated at ``step`` train steps; None past the last eval (or before the first).
    At a step several evals share, the latest of them."""
    pts = curve.points
    if not pts or step > pts[-1].train_steps or step < pts[0].train_steps:
        return None
    at = [p for p in pts if p.train_steps == step]
    if at:
        return at[-1].reward
    before = [p for p in pts if p.train_steps < step][-1]
    after = next(p for p in pts if p.train_steps > step)
    return before.reward + ((step - before.train_steps) / (after.train_steps - before.train_steps)
                            * (after.reward - before.reward))


def curve_from_demo(data: dict[str, Any], task: str | None = None, target: float | None = None) -> LearnCurve:
    """The held-out eval curve of a demo result. Since the scheduled client (e547190) a demo records every
    periodic eval (``evals``: wall and training seconds, train steps, reward); the first demos recorded only the
    eval before and after training, which become a two-point curve (the last at the run's wall minutes, its
    training minutes unknown)."""
    settings = data.get("settings") or {}
    task = task or str(settings.get("task", addition.NAME))  # the first demos recorded no task: they ran addition
    if target is None:
        target = spec_for(task).target
    evals = data.get("evals") or []
    if evals:
        points = [demo_eval(e) for e in evals]
        return LearnCurve(task=task, points=points, target=target, source="the demo's periodic evals (evals[])")
    points = [EvalPoint(train_steps=0, reward=float(data["eval_before"]), train_seconds=0.0, seconds=0.0),
              EvalPoint(train_steps=int(data["train_steps"]), reward=float(data["eval_after"]),
                        policy_version=data.get("policy_version"), train_seconds=None,
                        seconds=float(data["seconds"]) if "seconds" in data else None)]
    return LearnCurve(task=task, points=points, target=target,
                      source="eval before and after only (this demo had no periodic eval); the last point's "
                             "minutes are the run's wall minutes")


def demo_eval(e: dict[str, Any]) -> EvalPoint:
    """One entry of a demo result's ``evals``: an :class:`EvalPoint` dump plus ``minutes`` (wall), or, before the
    driver, ``train_steps``, ``reward`` and some of ``train_seconds``, ``seconds``, ``minutes``."""
    if "minutes" in e and "seconds" not in e:
        seconds: float | None = None if e["minutes"] is None else float(e["minutes"]) * 60
    else:
        seconds = float(e["seconds"]) if "seconds" in e else None
    fields = {k: e[k] for k in ("policy_version", "episodes", "failed", "eval_seconds") if k in e}
    return EvalPoint(train_steps=int(e["train_steps"]), reward=float(e["reward"]), seconds=seconds,
                     train_seconds=float(e["train_seconds"]) if "train_seconds" in e else None, **fields)
