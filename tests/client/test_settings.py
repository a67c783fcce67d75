"""A run's client-side settings (``agentjet.client.settings.RunSettings``): declared once, with bounds, and what the
driver makes of them (its pause points and its budget)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
from pydantic import BaseModel, ValidationError

from agentjet.client.settings import Budget, PauseAt, PauseEvery, RunSettings

# Where a run's settings could be declared again: the client, and the apps that run one (the demo, the bench).
MODULES = ["agentjet.client.client", "agentjet.client.driver", "agentjet.client.runner", "agentjet.client.scheduled",
           "agentjet.client.settings", "agentjet.client.team", "agentjet.apps.demo", "agentjet.apps.bench.suite"]
# the values RunSettings makes (pauses(), budget()) for the driver's schedule: derived, not declared
DERIVED = {PauseAt, PauseEvery, Budget}


def _declared(cls: type) -> set[str]:
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return set(cls.model_fields)
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def test_each_run_setting_is_declared_in_one_class() -> None:
    classes = {cls for name in MODULES for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass)
               if cls.__module__ == name and cls not in DERIVED}
    assert {"DemoSettings", "LearnSettings", "RunSettings", "DriverRun"} <= {c.__name__ for c in classes}
    for setting in RunSettings.model_fields:
        owners = sorted(c.__name__ for c in classes if setting in _declared(c))
        assert owners == ["RunSettings"], (setting, owners)


def test_the_pause_points_and_the_budget() -> None:
    assert RunSettings().pauses() is None  # evals before and after training only
    assert RunSettings(eval_every_s=0).pauses() is None
    assert RunSettings(eval_every_s=90).pauses() == PauseEvery(seconds=90)
    assert RunSettings(eval_every_s=90, eval_every_steps=4).pauses() == PauseEvery(seconds=90, steps=4)
    assert RunSettings(eval_every_s=90, eval_at_steps=(3,)).pauses() == PauseAt(steps=(3,))  # fixed points win
    assert RunSettings(max_steps=9, time_budget_s=None).budget() == Budget(max_steps=9, train_seconds=None)
    assert RunSettings().budget() == Budget(train_seconds=20 * 60)  # the one default budget


def test_bounds_and_the_command_line_form() -> None:
    assert RunSettings.model_validate({"eval_at_s": "60, 120", "max_steps": "3"}).eval_at_s == (60.0, 120.0)
    for bad in ({"concurrency": 0}, {"time_budget_s": 0}, {"eval_every_steps": 0}, {"keeep_best": True}):
        with pytest.raises(ValidationError):
            RunSettings.model_validate(bad)
    with pytest.raises(ValidationError):
        RunSettings().concurrency = 4  # type: ignore[misc]  # frozen: a run's settings do not change under it
