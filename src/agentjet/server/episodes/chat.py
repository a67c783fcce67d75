"""Chat formatting: OpenAI messages -> prompt token ids through the model's own chat template, and the
model's output -> an assistant message (content and tool calls, in the model family's format:
``agentjet.server.episodes.tool_parsers``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError

from agentjet.server.episodes.tool_parsers import ToolCallParser, tool_parser_for
from agentjet.settings import ToolParserKind

KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class ChatFormatError(ValueError):
    """The request's messages or tools cannot be rendered. Carries the offending parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def content_text(content: Any, where: str) -> str:
    """OpenAI content (a string, a list of parts, or None) -> plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise ChatFormatError(f"{where}.content[{i}] must be an object with a 'type'", f"{where}.content")
            if part["type"] in ("text", "input_text"):
                if not isinstance(part.get("text"), str):
                    raise ChatFormatError(f"{where}.content[{i}].text must be a string", f"{where}.content")
                pieces.append(part["text"])
            else:
                raise ChatFormatError(f"{where}.content[{i}] has type {part['type']!r}; this text model only "
                                      "accepts text parts", f"{where}.content")
        return "".join(pieces)
    raise ChatFormatError(f"{where}.content must be a string or a list of content parts", f"{where}.content")


def _tool_call_json(tc: dict[str, Any], where: str) -> dict[str, Any]:
    fn = tc.get("function") if isinstance(tc, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ChatFormatError(f"{where} must have function.name", where)
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ChatFormatError(f"{where}.function.arguments is not valid JSON: {exc.msg}", where) from exc
    return {"name": fn["name"], "arguments": args}


def normalize_messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validate OpenAI-style messages and make every ``content`` a string."""
    if not raw:
        raise ChatFormatError("messages must contain at least one message", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatFormatError(f"{where} must be an object", where)
        role = m.get("role")
        if not isinstance(role, str) or role not in KNOWN_ROLES:  # (a list or dict role is unhashable)
            raise ChatFormatError(f"{where}.role {role!r} is not one of {sorted(KNOWN_ROLES)}", f"{where}.role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": content_text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise ChatFormatError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
            calls = []
            for j, tc in enumerate(m["tool_calls"]):
                parsed = _tool_call_json(tc, f"{where}.tool_calls[{j}]")
                calls.append({"id": str(tc.get("id") or f"call_{j}"), "type": "function",
                              "function": {"name": parsed["name"], "arguments": parsed["arguments"]}})
            msg["tool_calls"] = calls
        if role in ("tool", "function"):
            msg["role"] = "tool"
            if m.get("tool_call_id") is not None:
                msg["tool_call_id"] = str(m["tool_call_id"])
            if m.get("name") is not None:
                msg["name"] = str(m["name"])
        out.append(msg)
    return out


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatFormatError("tools must be a list", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise ChatFormatError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools")
        params = fn.get("parameters")
        if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
            raise ChatFormatError(f"tools[{i}].function.parameters must be a JSON Schema object "
                                  "({'type': 'object', 'properties': ...})", f"tools[{i}].function.parameters")
    return tools or None


def validate_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> None:
    """``none`` / ``auto`` / ``required``, or ``{"type": "function", "function": {"name": <a given tool>}}``."""
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ChatFormatError(f"tool_choice {choice!r} must be 'none', 'auto', 'required' or a function",
                                  "tool_choice")
        if choice == "required" and not tools:
            raise ChatFormatError("tool_choice 'required' needs tools", "tool_choice")
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or choice.get("type", "function") != "function":
        raise ChatFormatError("tool_choice must be {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    known = [t["function"]["name"] for t in tools or []]
    if name not in known:
        raise ChatFormatError(f"tool_choice names the function {name!r}, which is not among the tools "
                              f"{known}", "tool_choice")


class ChatFormatter:
    def __init__(self, tokenizer: Any, tool_parser: ToolParserKind = ToolParserKind.AUTO) -> None:
        self.tokenizer = tokenizer
        template = tokenizer.chat_template or ""
        if not template:
            raise ValueError("the tokenizer has no chat template")
        self.native_tools = "tools" in template
        self.native_tool_calls = "tool_calls" in template
        self.tool_parser: ToolCallParser = tool_parser_for(tool_parser, template)
        # The Rust tokenizer behind a fast tokenizer: encoding through it directly skips the Python layers
        # of ``apply_chat_template(tokenize=True)`` (the same ids; a test checks this).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def render_messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                        ) -> list[dict[str, Any]]:
        """Adapt messages to what the template understands (tools and tool calls as text if needed)."""
        out = [dict(m) for m in messages]
        if not self.native_tool_calls:
            for m in out:
                if m.get("tool_calls"):
                    blocks = self.tool_parser.render_calls(m.pop("tool_calls"))
                    m["content"] = (m["content"] + "\n" if m["content"] else "") + blocks
        if tools and not self.native_tools:
            text = self.tool_parser.system_text(tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def as_rendered(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The (messages, tools) that render to exactly these prompt ids through the plain chat template:
        what context tracking must re-render. Tools the template cannot take are already in the messages."""
        return self.render_messages(messages, tools), (tools if tools and self.native_tools else None)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        kwargs: dict[str, Any] = {"tools": tools} if tools and self.native_tools else {}
        try:
            rendered = self.render_messages(messages, tools)
            if self._backend is None:
                return list(self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True,
                                                               return_dict=False, **kwargs))
            text = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False, **kwargs)
        except (TemplateError, TypeError, KeyError, IndexError) as exc:
            raise ChatFormatError(f"the model's chat template rejected these messages: {exc}", "messages") from exc
        except RecursionError as exc:  # e.g. tool-call arguments nested hundreds of levels deep
            raise ChatFormatError("the messages or tools are nested too deeply to render", "messages") from exc
        try:
            return self._backend.encode(text, add_special_tokens=False).ids
        except TypeError as exc:  # the Rust tokenizer refuses str that is not valid Unicode (lone surrogates)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as uexc:
                raise ChatFormatError("the messages or tools contain text that is not valid Unicode (a lone "
                                      f"surrogate such as {text[uexc.start]!r})", "messages") from exc
            raise ChatFormatError(f"the messages cannot be tokenized: {exc}", "messages") from exc

    def parse_reply(self, text: str, token_ids: Sequence[int], tools_given: bool
                    ) -> tuple[str, list[dict[str, Any]] | None]:
        """Split a reply into content and tool calls (in the model family's format). Without tools, or when no
        call parses, the reply is plain text. A parser whose marker is a special token (Mistral's
        ``[TOOL_CALLS]``) reads the ids decoded with special tokens kept, less a final end-of-sequence."""
        if not tools_given:
            return text, None
        if self.tool_parser.reads_special_tokens:
            full = self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
            eos = self.tokenizer.eos_token
            full = full.removesuffix(eos) if eos else full
            content, calls = self.tool_parser.parse(full)
            return (content, calls) if calls else (text, None)
        return self.tool_parser.parse(text)
