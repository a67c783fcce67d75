"""The LLM designer: an OpenAI-compatible chat model designs a program's studies from the topic, the settings
table, the task list and the budget, then reads each report and proposes the next study.

Every reply goes through ``topic.repair_design`` (unknown settings dropped, ranges clamped to the settings'
bounds); a reply that is not JSON gets one repair request. A design that is refused, or any network error,
falls back to the offline designer, with a note that says why. Nothing the model says crashes the program.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import ValidationError

from agentjet.apps.research.llm_planner import PlannerError, chat, extract_json
from agentjet.apps.research.program import Findings, NextStep, OfflineDesigner
from agentjet.apps.research.topic import StudyDesign, repair_design, settings_catalog
from agentjet.tasks import TASKS

DESIGN_PROMPT = """You design reinforcement-learning studies for AgentJet. Given a research topic, the settings
table (name, description, bounds, default), the tasks and the budget, reply with ONLY one JSON object:
{"question": "<the question restated>", "metric": "eval_reward", "metric_reason": "...",
 "task": "<a task name>", "task_reason": "...",
 "knobs": [{"name": "server.<flag>", "type": "float|choice", "low": x, "high": y, "choices": [...],
            "reason": "...", "matched": ["<topic words>"]}],
 "seeds": n, "seeds_reason": "...", "trials": n, "budget_reason": "...", "prune": true, "prune_reason": "..."}
Use only settings from the table, within their bounds. "prune" stops runs clearly behind early (ASHA); set it
false when the study repeats configurations to measure the noise."""

NEXT_PROMPT = """You read an RL study's report and decide the program's next study. Reply with ONLY one JSON object:
{"action": "narrow|extend|add_knob|more_seeds|stop", "why": "...", "cites": "<the number from the report that motivates
this>", "design": <a study design as before, or null when stopping>, "conclusion": "<what is concluded, if anything>"}"""


def settings_table() -> str:
    rows = []
    for s in settings_catalog():
        f = s.field
        rows.append(f"{s.space_name}: {f.info.description} [{f.bounds_text() or 'any'}; default {f.default_text()}]")
    return "\n".join(rows)


class LLMDesigner:
    def __init__(self, topic: str, url: str, model: str = "default", key_env: str = "AJET_PLANNER_API_KEY",
                 timeout_s: float = 60.0, http: httpx.Client | None = None,
                 note: Callable[[str], None] = lambda _: None) -> None:
        self.url, self.model, self.key_env, self.timeout_s = url, model, key_env, timeout_s
        self.offline = OfflineDesigner(topic)
        self.note = note
        self._http = http or httpx.Client(timeout=timeout_s)

    def _ask_json(self, system: str, user: str) -> Any:
        """The reply's JSON object, after at most one repair request; None when there is none."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        for round_ in range(2):
            try:
                content = chat(self._http, self.url.rstrip("/") + "/chat/completions", self.model, self.key_env,
                               self.timeout_s, messages, max_tokens=2048)
            except PlannerError as exc:
                self.note(f"LLM designer: {exc}")
                return None
            try:
                return extract_json(content)
            except PlannerError as exc:
                self.note(f"LLM designer: {exc}" + ("; asking once more" if round_ == 0 else ""))
                messages += [{"role": "assistant", "content": content},
                             {"role": "user", "content": f"That reply was not usable ({exc}). Reply with only the "
                                                         "JSON object described."}]
        return None

    def first(self, topic: str, trials: int | None) -> StudyDesign:
        user = (f"Topic: {topic}\nTasks: {', '.join(TASKS)}\nBudget: {trials or 'not limited'} runs, "
                f"{os.cpu_count()} CPU cores\nSettings:\n{settings_table()}")
        design = self._checked(self._ask_json(DESIGN_PROMPT, user))
        if design is None:
            self.note("LLM designer: the design was refused; the offline planner designs the study")
            return self.offline.first(topic, trials)
        return design

    def _checked(self, raw: Any) -> StudyDesign | None:
        if raw is None:
            return None
        design, notes = repair_design(raw)
        for n in notes:
            self.note(f"LLM designer: {n}")
        return design

    def next(self, design: StudyDesign, findings: Findings, report: str, trials_left: int | None) -> NextStep:
        user = (f"Last study's design:\n{design.model_dump_json()}\nResults per configuration:\n"
                f"{json.dumps(findings.configs)[:8000]}\nSummary: {findings.summary()}\nReport:\n{report[:8000]}\n"
                f"Trials left: {trials_left or 'not limited'}\nSettings:\n{settings_table()}")
        raw = self._ask_json(NEXT_PROMPT, user)
        step = self._checked_step(raw, design)
        if step is None:
            self.note("LLM designer: the next step was refused; the offline planner decides instead")
            return self.offline.next(design, findings, report, trials_left)
        return step

    def _checked_step(self, raw: Any, last: StudyDesign) -> NextStep | None:
        if not isinstance(raw, dict):
            return None
        proposed = raw.get("design")
        design = None
        if raw.get("action") != "stop":
            if isinstance(proposed, dict):
                merged = {**last.model_dump(exclude={"notes", "planner"}), **proposed}
                design = self._checked(merged)
            if design is None:
                return None
        try:
            return NextStep.model_validate({**{k: v for k, v in raw.items() if k != "design"}, "design": design})
        except ValidationError as exc:
            self.note(f"LLM designer: the next step does not match the schema ({exc.errors()[0]['msg']})")
            return None

    def close(self) -> None:
        self._http.close()

