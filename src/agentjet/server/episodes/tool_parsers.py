"""Tool calls in a model's own format: one parser per model family, found from the chat template (or set with
``--tool-parser``). Each turns the model's output text into OpenAI ``tool_calls`` and back:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, SmolLM2,
  Hermes). Also the format of the system-prompt fallback for templates with no tool support.
- ``llama3_json``: a bare JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.1 / 3.2 / 3.3's JSON tool
  calling; an optional ``<|python_tag|>`` first, several calls separated by ``;``).
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": "<9 letters or digits>"}]`` (Mistral's
  v3 tokenizer format). ``[TOOL_CALLS]`` is a special token, so this parser reads the text with special tokens
  kept. The call id is the one the model wrote (the template renders it back), or a new 9-character one.

A reply that does not parse stays plain text (no error): an agent sees what the model wrote.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from abc import ABC, abstractmethod
from typing import Any

from agentjet.settings import ToolParserKind

ToolCalls = list[dict[str, Any]]
_DECODER = json.JSONDecoder()


def _openai_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


def _default_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call_object(obj: Any, args_keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """``(name, arguments)`` of a parsed call object, or None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    return (obj["name"], args) if isinstance(args, dict | str) else None


class ToolCallParser(ABC):
    kind: ToolParserKind
    reads_special_tokens = False  # True: parse the text decoded with special tokens kept

    @abstractmethod
    def parse(self, text: str) -> tuple[str, ToolCalls | None]:
        """``(content, tool_calls)``; ``(text, None)`` when the text holds no well-formed call."""

    @abstractmethod
    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """Calls as the model writes them (for templates that cannot render ``tool_calls`` themselves)."""

    @abstractmethod
    def instructions(self) -> str:
        """How to call a function, for the system prompt of templates with no tool support."""

    def system_text(self, tools: list[dict[str, Any]]) -> str:
        specs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
        return ("You can call functions. Their signatures are listed between <tools> and </tools>:\n"
                f"<tools>\n{specs}\n</tools>\n" + self.instructions())


class HermesParser(ToolCallParser):
    kind = ToolParserKind.HERMES
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> tuple[str, ToolCalls | None]:
        if "<tool_call>" not in text:
            return text, None
        calls = []
        for raw in self._BLOCK.findall(text):
            try:
                call = _call_object(json.loads(raw), ("arguments",))
            except json.JSONDecodeError:
                return text, None
            if call is None:
                return text, None
            calls.append(_openai_call(*call, _default_id()))
        if not calls:
            return text, None
        return text[: text.index("<tool_call>")].strip(), calls

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return "\n".join("<tool_call>\n" + json.dumps(tc["function"], ensure_ascii=False) + "\n</tool_call>"
                         for tc in calls)

    def instructions(self) -> str:
        return ("To call a function, reply with one JSON object per call inside <tool_call></tool_call> tags:\n"
                '<tool_call>\n{"name": "function-name", "arguments": {"arg": "value"}}\n</tool_call>')


def _json_sequence(text: str, separator: str) -> list[Any] | None:
    """JSON values one after another, ``separator`` (optional) and whitespace between them, filling all of
    ``text``; None when anything else is there."""
    values, pos = [], 0
    while True:
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        values.append(value)
        rest = text[pos:].lstrip()
        if not rest:
            return values
        rest = rest.removeprefix(separator).lstrip()
        pos = len(text) - len(rest)


class Llama3JsonParser(ToolCallParser):
    kind = ToolParserKind.LLAMA3_JSON
    PYTHON_TAG = "<|python_tag|>"

    def parse(self, text: str) -> tuple[str, ToolCalls | None]:
        body = text.strip()
        body = body.removeprefix(self.PYTHON_TAG).lstrip()
        if not body.startswith("{"):
            return text, None
        objs = _json_sequence(body, ";")
        if not objs or not all(self._is_call(o) for o in objs):
            return text, None
        calls = [_call_object(o, ("parameters", "arguments")) for o in objs]
        if any(c is None for c in calls):
            return text, None
        return "", [_openai_call(*c, _default_id()) for c in calls if c is not None]

    @staticmethod
    def _is_call(obj: Any) -> bool:
        """Only a call's keys: a bare JSON answer such as ``{"name": "Ada", "age": 36}`` stays text."""
        return (isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj)
                and set(obj) <= {"name", "parameters", "arguments", "type"})

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return "; ".join(json.dumps({"name": tc["function"]["name"], "parameters": tc["function"]["arguments"]},
                                    ensure_ascii=False) for tc in calls)

    def instructions(self) -> str:
        return ('To call a function, respond with JSON for a function call in the format {"name": function name, '
                '"parameters": dictionary of argument name and its value}. Do not use variables.')


class MistralParser(ToolCallParser):
    kind = ToolParserKind.MISTRAL
    MARKER = "[TOOL_CALLS]"
    reads_special_tokens = True
    ID_CHARS = string.ascii_letters + string.digits
    ID_LEN = 9  # Mistral's templates refuse other ids

    def parse(self, text: str) -> tuple[str, ToolCalls | None]:
        if self.MARKER not in text:
            return text, None
        content, _, body = text.partition(self.MARKER)
        values = _json_sequence(body.strip(), ",")
        if not values:
            return text, None
        objs = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        calls = []
        for obj in objs:
            call = _call_object(obj, ("arguments",))
            if call is None:
                return text, None
            calls.append(_openai_call(*call, self.call_id(obj.get("id"))))
        return (content.strip(), calls) if calls else (text, None)

    def call_id(self, written: Any) -> str:
        """The model's own id when it is a valid one (so the re-rendered call is what it wrote), else a new one."""
        if isinstance(written, str) and len(written) == self.ID_LEN and all(c in self.ID_CHARS for c in written):
            return written
        return "".join(secrets.choice(self.ID_CHARS) for _ in range(self.ID_LEN))

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return self.MARKER + " " + json.dumps(
            [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"], "id": tc.get("id")}
             for tc in calls], ensure_ascii=False)

    def instructions(self) -> str:
        return ('To call functions, reply with [TOOL_CALLS] and a JSON list of calls: [TOOL_CALLS] [{"name": '
                '"function-name", "arguments": {"arg": "value"}, "id": "<9 letters or digits>"}]')


PARSERS: dict[ToolParserKind, type[ToolCallParser]] = {
    ToolParserKind.HERMES: HermesParser, ToolParserKind.LLAMA3_JSON: Llama3JsonParser,
    ToolParserKind.MISTRAL: MistralParser,
}


def detect_tool_parser(template: str) -> ToolParserKind:
    """The family a chat template renders tool calls in: Mistral's ``[TOOL_CALLS]``, Hermes ``<tool_call>``,
    Llama 3.x's ``"parameters"`` JSON (or its ``<|python_tag|>``); Hermes otherwise (the fallback's format)."""
    if MistralParser.MARKER in template:
        return ToolParserKind.MISTRAL
    if "<tool_call>" in template:
        return ToolParserKind.HERMES
    if '"parameters"' in template or Llama3JsonParser.PYTHON_TAG in template:
        return ToolParserKind.LLAMA3_JSON
    return ToolParserKind.HERMES


def tool_parser_for(kind: ToolParserKind, template: str) -> ToolCallParser:
    return PARSERS[detect_tool_parser(template) if kind is ToolParserKind.AUTO else kind]()
