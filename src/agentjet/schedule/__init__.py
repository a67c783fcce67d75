"""Deciding what to roll out next and when to stop: a per-task curriculum that retires solved tasks, and a
stopping rule on the held-out eval and on the share of groups with no learning signal. Pure Python (no
server or client imports): the demo, the benchmarks and user clients drive them."""

from agentjet.schedule.curriculum import Curriculum, CurriculumSettings, TaskState
from agentjet.schedule.stopping import StoppingRule, StopReason, StopSettings

__all__ = ["Curriculum", "CurriculumSettings", "StopReason", "StopSettings", "StoppingRule", "TaskState"]
