"""A task's recommended run, typed. The names are those of the settings each value feeds: ``learning_rate``
goes to the server's ``learner`` section, ``group_size`` and ``batch_groups`` to its ``training`` section; the rest drive the client side (the
demo, a study's trial client, ``ajet bench``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Recommended(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(gt=0, description="learner.learning_rate")
    group_size: int = Field(ge=1, description="training.group_size: episodes per task id")
    batch_groups: int = Field(ge=1, description="training.batch_groups: groups per train step")
    steps: int = Field(ge=1, description="a ceiling on train steps (the demo's stopping rule may end it sooner)")
    eval_n: int = Field(44, ge=1, description="held-out episodes per eval point")
    eval_every_s: float = Field(120.0, ge=0, description="periodic held-out eval, in training seconds (0: none)")
    concurrency: int = Field(32, ge=1, description="episodes in flight")
    pool: int = Field(1024, ge=1, description="training tasks drawn per round")
    stop: dict[str, float] = Field(default_factory=dict, description="the stopping rule's settings "
                                   "(agentjet.schedule.StopSettings)")
    levels: dict[str, float] = Field(default_factory=dict, description="the difficulty levels' window and "
                                     "thresholds for this task (agentjet.schedule.LevelSettings; unset: its "
                                     "defaults); used when levels are on (ajet demo --levels)")
    task_ratios: dict[str, float] = Field(default_factory=dict, description="training.task_ratios: a cocktail's "
                                          "share of each batch per task type (empty: no quotas)")

    def training(self) -> dict[str, float | int | dict[str, float]]:
        """The values for the server's ``training`` section (``task_ratios`` only when set)."""
        values: dict[str, float | int | dict[str, float]] = {"group_size": self.group_size,
                                                              "batch_groups": self.batch_groups}
        if self.task_ratios:
            values["task_ratios"] = dict(self.task_ratios)
        return values

    def learner(self) -> dict[str, float]:
        """The values for the server's ``learner`` section."""
        return {"learning_rate": self.learning_rate}
