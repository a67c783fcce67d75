"""Deciding what to roll out next and when to stop: a per-task curriculum that retires solved tasks, difficulty
levels that move a task type up and down its harder versions (retirement working within each level), and a
stopping rule on the held-out eval and on the share of groups with no learning signal. Pure Python (no server or
client imports): the demo, the benchmarks and user clients drive them."""

from agentjet.schedule.curriculum import Curriculum, CurriculumSettings, TaskState
from agentjet.schedule.levelled import Ladder, LevelledTasks
from agentjet.schedule.levels import LevelChange, LevelMove, LevelRule, LevelSettings
from agentjet.schedule.stopping import StoppingRule, StopReason, StopSettings

__all__ = ["Curriculum", "CurriculumSettings", "Ladder", "LevelChange", "LevelMove", "LevelRule", "LevelSettings",
           "LevelledTasks", "StopReason", "StopSettings", "StoppingRule", "TaskState"]
