"""The LLM planner: an OpenAI-compatible chat model proposes the next configurations, each with the
hypothesis behind it, from the results so far.

The reply must be one JSON object:

    {"proposals": [{"params": {"server.lr": 3e-5, "server.group-size": 8},
                    "hypothesis": "a higher rate learns faster at this small step count"}]}

Every proposal is checked against the space: numbers out of range are clamped (noted), a numeric choice
that is not offered snaps to the nearest one (noted), a missing parameter takes its default, and a proposal
with an unknown parameter, a non-numeric value for a number, an unoffered text choice, or a configuration
already tried is rejected (noted). A reply that is not such an object gets one repair request; after that,
or on any network error, the offline planner proposes instead. Nothing the model says can crash the study.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentjet.apps.research.planner import OptunaPlanner, Proposal, params_key
from agentjet.apps.research.results import StudyResults
from agentjet.apps.research.spec import ParamType, Scalar, StudySpec
from agentjet.apps.research.state import StudyState

MAX_REPLY_CHARS = 20_000



def chat(http: httpx.Client, endpoint: str, model: str, key_env: str, timeout_s: float,
         messages: list[dict[str, str]], max_tokens: int) -> str:
    """One chat completion from an OpenAI-compatible ``endpoint`` (``.../chat/completions``), the key from the
    environment variable ``key_env``; its text, cut to ``MAX_REPLY_CHARS``, or a ``PlannerError`` saying why not.
    The planner's and the study designer's one call."""
    key = os.environ.get(key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "messages": messages, "temperature": 0.7, "max_tokens": max_tokens}
    try:
        r = http.post(endpoint, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise PlannerError(f"cannot reach {endpoint}: {exc!r}") from exc
    if r.status_code != 200:
        raise PlannerError(f"{endpoint} answered HTTP {r.status_code}: {r.text[:300]}")
    try:
        content = r.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PlannerError("the answer is not an OpenAI chat completion") from exc
    if not isinstance(content, str) or not content.strip():
        raise PlannerError("the reply is empty")
    return content[:MAX_REPLY_CHARS]

class PlannerError(RuntimeError):
    pass


class LLMProposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params: dict[str, Any]
    hypothesis: str = Field(min_length=1, max_length=2000)


class LLMReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    proposals: list[Any] = Field(max_length=64)


SYSTEM_PROMPT = """You plan reinforcement-learning experiments. You are given a research question, a metric,
a search space and the results so far. Propose the next configurations to run, each with a one-sentence
hypothesis that the run will test. Reply with ONLY one JSON object, no prose, no code fence:
{"proposals": [{"params": {"<name>": <value>, ...}, "hypothesis": "<why this configuration>"}]}
Use exactly the parameter names of the space. Numbers must lie within their ranges; choices must be one of
the listed values. Do not repeat a configuration that was already tried."""


def extract_json(text: str) -> Any:
    """The JSON object in a reply; a ```json fence or text around the object is tolerated."""
    text = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fence:
        text = fence.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise PlannerError("the reply holds no JSON object")
    try:
        return json.loads(text[start:end + 1])
    except json.JSONDecodeError as exc:
        raise PlannerError(f"the reply is not valid JSON: {exc.msg} at character {exc.pos}") from exc


def _nearest(options: list[float], value: float) -> int:
    """Index of the nearest option (on a log scale when everything is positive)."""
    if value > 0 and all(o > 0 for o in options):
        return min(range(len(options)), key=lambda i: abs(math.log(options[i]) - math.log(value)))
    return min(range(len(options)), key=lambda i: abs(options[i] - value))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class LLMPlanner:
    def __init__(self, spec: StudySpec, fallback: OptunaPlanner, http: httpx.Client | None = None,
                 note: Callable[[str], None] = lambda _: None) -> None:
        if not spec.planner.url:
            raise ValueError("the llm planner needs planner.url")
        self.spec = spec
        self.fallback = fallback
        self.note = note
        self.url = spec.planner.url.rstrip("/") + "/chat/completions"
        self._http = http or httpx.Client(timeout=spec.planner.timeout_s)
        self._queue: list[Proposal] = []

    def propose(self, state: StudyState) -> Proposal | None:
        first = self.fallback.default_proposal(state)
        if first is not None:
            return first
        tried = {params_key(c.params) for c in state.configs}
        self._queue = [p for p in self._queue if params_key(p.params) not in tried]
        if not self._queue:
            self._queue = self._ask(state, set(tried))
        if self._queue:
            return self._queue.pop(0)
        fallback = self.fallback.sample(state)
        if fallback is None:
            return None
        return Proposal(fallback.params, "llm-fallback", f"the LLM gave no usable proposal; {fallback.why}")

    def describe(self, state: StudyState, wanted: int) -> str:
        """The prompt's account of the study: the question, the metric, the space, the results so far."""
        spec = self.spec
        lines = [f"Question: {spec.question}",
                 f"Metric: {spec.metric.label()}, over {spec.seeds} seed(s) per configuration.", "Search space:"]
        for name, p in spec.space.items():
            lines.append(f"  {name}: {p.describe()}" + (f", default {p.default}" if p.default is not None else ""))
        rows = StudyResults(spec, state).configs()
        if rows:
            lines.append("Results so far (mean over finished seeds; pruned runs stopped early, value at that point):")
            for r in rows:
                mean = "n/a" if r["mean"] is None else f"{r['mean']:.3f}"
                sd = "" if r["sd"] is None else f" +- {r['sd']:.3f}"
                pruned = f", pruned at {r['pruned_values']}" if r["pruned_values"] else ""
                lines.append(f"  {json.dumps(r['params'])}: {mean}{sd} (n={r['n_done']}{pruned}); why: {r['why']}")
        else:
            lines.append("No results yet.")
        lines.append(f"Propose {wanted} new configuration(s).")
        return "\n".join(lines)

    def check(self, raw: Any, tried: set[str]) -> tuple[dict[str, Scalar] | None, list[str]]:
        """(params, notes): params inside the space, or None when the proposal is rejected; notes say what
        was clamped, filled in, or why it was rejected."""
        try:
            item = LLMProposal.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            return None, [f"rejected a malformed proposal ({'.'.join(str(x) for x in first['loc'])}: {first['msg']})"]
        unknown = sorted(set(item.params) - set(self.spec.space))
        if unknown:
            return None, [f"rejected a proposal with unknown parameters {unknown}"]
        defaults = self.spec.default_params() or {}
        params: dict[str, Scalar] = {}
        notes: list[str] = []
        for name, p in self.spec.space.items():
            if name not in item.params:
                if name not in defaults:
                    return None, [f"rejected a proposal without {name} (it has no default)"]
                params[name] = defaults[name]
                notes.append(f"{name} missing: default {defaults[name]} used")
                continue
            value = item.params[name]
            try:
                clamped = p.clamp(value)
            except ValueError as exc:
                numeric = [float(c) for c in p.choices or [] if _is_number(c)]
                if p.type is ParamType.CHOICE and _is_number(value) and len(numeric) == len(p.choices or []):
                    clamped = (p.choices or [])[_nearest(numeric, float(value))]
                    notes.append(f"{name}={value} is not offered: nearest choice {clamped} used")
                else:
                    return None, [f"rejected a proposal: {name}: {exc}"]
            else:
                if p.type is not ParamType.CHOICE and _is_number(value) and float(clamped) != float(value):
                    inside = p.low is not None and p.high is not None and p.low <= value <= p.high
                    what = "is not an integer: rounded" if inside else f"is outside [{p.low:g}, {p.high:g}]: clamped"
                    notes.append(f"{name}={value} {what} to {clamped:g}")
            params[name] = clamped
        if params_key(params) in tried:
            return None, [f"rejected a repeat of a tried configuration {params}"]
        return params, notes

    def _ask(self, state: StudyState, tried: set[str]) -> list[Proposal]:
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": self.describe(state, self.spec.planner.proposals_per_call)}]
        for round_ in range(2):  # the first answer, then one repair request
            try:
                content = self._chat(messages)
            except PlannerError as exc:
                self.note(f"LLM planner: {exc}; the offline planner proposes instead")
                return []
            try:
                reply = LLMReply.model_validate(extract_json(content))
            except (PlannerError, ValidationError) as exc:
                reason = _short(exc)
                if round_ == 0:
                    self.note(f"LLM planner: {reason}; asking once more")
                    messages += [{"role": "assistant", "content": content},
                                 {"role": "user", "content": f"That reply was not usable ({reason}). Reply with "
                                                             "only the JSON object described."}]
                    continue
                self.note(f"LLM planner: {reason}; the offline planner proposes instead")
                return []
            return self._checked(reply, tried)
        return []

    def _checked(self, reply: LLMReply, tried: set[str]) -> list[Proposal]:
        out: list[Proposal] = []
        for raw in reply.proposals:
            params, notes = self.check(raw, tried)
            for n in notes:
                self.note(f"LLM planner: {n}")
            if params is None:
                continue
            tried.add(params_key(params))
            why = str(raw["hypothesis"]).strip()
            if notes:
                why += f" [{'; '.join(notes)}]"
            out.append(Proposal(params, "llm", why))
        return out

    def _chat(self, messages: list[dict[str, str]]) -> str:
        p = self.spec.planner
        return chat(self._http, self.url, p.model, p.api_key_env, p.timeout_s, messages, max_tokens=1024)

    def close(self) -> None:
        self._http.close()


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"the reply does not match the schema ({'.'.join(str(x) for x in first['loc'])}: {first['msg']})"
    return str(exc)
