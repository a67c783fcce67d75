"""A small episode simulator for the tracking tests: agents with their own histories, calls recorded exactly as
the server records them, plus the ground truth the tests compare against (which assistant message came from
which generation, and the canonical vs generated token ids of every generation)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from templates import HEADERS, TEMPLATES

from agentjet.tracking import CallRecord

WORDS = ["the", "answer", "is", "sum", "of", "numbers", "value", "city", "weather", "result", "tool", "call", "function", "find", "search", "list", "key", "one", "two", "three", "first", "last", "good", "new", "old", "capital", "letters", "sort", "reply", "only", "yes", "no", "hello", "world"]

TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "search the web",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "add", "description": "add two numbers",
                                      "parameters": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                                      "y": {"type": "integer"}}}}},
]
EXTRA_TOOL = {"type": "function", "function": {"name": "weather", "description": "weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}


@dataclass
class Origin:
    """Ground truth for an assistant message of a history: the call that generated it."""

    call_index: int
    agent: str
    generated: list[int]  # the ids the model produced
    canonical: list[int]  # the ids re-encoding its text gives


@dataclass
class AgentState:
    name: str
    messages: list[dict[str, Any]]
    origins: list[Origin | None]
    tools: list[dict[str, Any]] | None = None


@dataclass
class Sim:
    tok: Any
    template: str
    calls: list[CallRecord] = field(default_factory=list)
    origins_at: dict[int, list[Origin | None]] = field(default_factory=dict)  # call -> origins of its messages
    counter: int = 0

    @property
    def eot(self) -> str:
        return TEMPLATES[self.template][3]

    @property
    def header(self) -> str:
        return HEADERS[self.template]

    def unique(self) -> int:
        self.counter += 1
        return self.counter

    def new_agent(self, name: str, system: str = "you are a helpful tool user", tools: bool = True) -> AgentState:
        return AgentState(name, [{"role": "system", "content": system},
                                 {"role": "user", "content": f"find the sum of {self.unique()} and two"}],
                          [None, None], copy.deepcopy(TOOLS) if tools else None)

    # ------------------------------------------------------------------ rendering
    def render(self, messages: list[dict[str, Any]], tools: Any, gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=gen, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def char_level(self, text: str) -> list[int]:
        """A non-canonical tokenization of ``text``: special tokens kept, every other character on its own."""
        specials = sorted(self.tok.all_special_tokens, key=len, reverse=True)
        out: list[int] = []
        i = 0
        while i < len(text):
            for s in specials:
                if text.startswith(s, i):
                    out += self.encode(s)
                    i += len(s)
                    break
            else:
                out += self.encode(text[i])
                i += 1
        return out

    # ------------------------------------------------------------------ replies
    def reply(self, tool_calls: int = 0, think: bool = False, words: int = 5) -> dict[str, Any]:
        n = self.unique()
        text = " ".join(WORDS[(n * 7 + i * 3) % len(WORDS)] for i in range(words)) + f" {n}."
        if think:
            text = f"<think>first think about {n}</think>\n" + text
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            msg["tool_calls"] = [
                {"id": f"call_{n}_{k}", "type": "function",
                 "function": {"name": "add", "arguments": json.dumps({"x": n, "y": k})}}
                for k in range(tool_calls)
            ]
        return msg

    # ------------------------------------------------------------------ a call
    def call(self, st: AgentState, reply: dict[str, Any], *, drift: bool = False, truncate: int | None = None,
             temperature: float = 1.0, raw: bool = False) -> tuple[CallRecord, Origin, dict[str, Any]]:
        """``raw``: the model generated ``content + end-of-turn`` verbatim (not what the template renders)."""
        msgs = copy.deepcopy(st.messages)
        tools = copy.deepcopy(st.tools)
        prompt_ids = list(self.tok.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))
        prefix = self.render(msgs, tools, True)
        finish = "stop"
        if truncate is not None and not reply.get("tool_calls"):
            cut = self.encode(reply["content"])[:max(1, truncate)]
            reply = {"role": "assistant", "content": self.tok.decode(cut)}
            gen_text, finish = reply["content"], "length"
            generated = cut
        elif raw:
            gen_text = reply["content"] + self.eot
            generated = self.char_level(gen_text) if drift else self.encode(gen_text)
        else:
            full = self.render(msgs + [reply], tools, False)
            assert full.startswith(prefix), "fixture templates are prefix-stable"
            rest = full[len(prefix):]
            gen_text = rest[: rest.index(self.eot) + len(self.eot)]
            generated = self.char_level(gen_text) if drift else self.encode(gen_text)
        canonical = self.encode(gen_text)
        idx = len(self.calls)
        call = CallRecord(
            call_index=idx, agent=st.name, messages=msgs, tools=tools, prompt_ids=prompt_ids,
            completion_ids=generated,
            completion_logprobs=[-0.01 * (i + 1) - 0.5 * idx for i in range(len(generated))],
            temperature=temperature, policy_version=idx % 3, response_message=copy.deepcopy(reply),
            finish_reason=finish,
        )
        self.calls.append(call)
        self.origins_at[idx] = list(st.origins)
        return call, Origin(idx, st.name, generated, canonical), reply

    def append_reply(self, st: AgentState, reply: dict[str, Any], origin: Origin, strip_think: bool = False) -> None:
        """The agent resends the reply (optionally with its reasoning stripped, as many clients do)."""
        sent = copy.deepcopy(reply)
        if strip_think and "</think>" in sent.get("content", ""):
            sent["content"] = sent["content"].split("</think>")[-1].lstrip("\n")
        # ground truth: the message is the generation only if it renders to the generated text
        full = self.render(st.messages + [sent], st.tools, False)
        prefix = self.render(st.messages, st.tools, True)
        gen_text = self.tok.decode(origin.generated, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        same = full.startswith(prefix) and full[len(prefix):].startswith(gen_text) and sent == reply
        st.messages.append(sent)
        st.origins.append(origin if same else None)

    def feedback(self, st: AgentState, reply: dict[str, Any]) -> None:
        """Environment feedback: one tool result per tool call, else a user message."""
        if reply.get("tool_calls"):
            for tc in reply["tool_calls"]:
                st.messages.append({"role": "tool", "tool_call_id": tc["id"],
                                    "content": f"result {self.unique()} ok"})
                st.origins.append(None)
        else:
            st.messages.append({"role": "user", "content": f"good, now add {self.unique()}"})
            st.origins.append(None)

    def turn(self, st: AgentState, **kw: Any) -> CallRecord:
        reply_kw = {k: kw.pop(k) for k in ("tool_calls", "think", "words") if k in kw}
        strip = kw.pop("strip_think", False)
        if reply_kw.get("think") and not reply_kw.get("tool_calls"):
            kw.setdefault("raw", True)  # the model's raw text, whatever the template does with it later
        call, origin, reply = self.call(st, self.reply(**reply_kw), **kw)
        self.append_reply(st, reply, origin, strip_think=strip)
        self.feedback(st, reply)
        return call

    # ------------------------------------------------------------------ the oracle
    def expected_prompt(self, call: CallRecord, fix_drift: bool = True) -> list[int]:
        """The repaired prompt, computed from the ground truth alone: every assistant message of the history
        that is the exact text of a same-agent generation gets the generated ids in place of the canonical
        ones (found as header + canonical ids, in order)."""
        ids = list(call.prompt_ids)
        if not fix_drift:
            return ids
        header = self.encode(self.header)
        pos = 0
        for o in self.origins_at[call.call_index]:
            if o is None or o.agent != call.agent:
                continue
            pat = header + o.canonical
            k = find_sub(ids, pat, pos)
            assert k >= 0, "the canonical ids of a resent generation must be in the prompt"
            start = k + len(header)
            ids[start:start + len(o.canonical)] = o.generated
            pos = start + len(o.generated)
        return ids


def find_sub(seq: list[int], pat: list[int], start: int = 0) -> int:
    n = len(pat)
    first = pat[0]
    i = start
    while True:
        try:
            i = seq.index(first, i)
        except ValueError:
            return -1
        if seq[i:i + n] == pat:
            return i
        i += 1


def check_samples(sim: Sim, samples: list, fix_drift: bool = True, exact_context: bool = True) -> None:
    """The reproduction invariant and the loss-mask invariant (see docs/timeline_merging.md).

    For every sample and every call c it covers, with E(c) = c's prompt with the ids generated earlier in the
    episode put back (``sim.expected_prompt``; the recorded prompt when ``fix_drift`` is off):
      input_ids[:len(E(c))] == E(c) and input_ids[len(E(c)) : len(E(c)) + len(out(c))] == out(c),
    the loss mask is 1 exactly on those output ranges (position 0 excepted), the behaviour logprobs there are
    c's recorded logprobs and 0.0 elsewhere, the last call's output ends the sequence, a sample holds the calls
    of one agent, and every call is in exactly one sample.
    """
    seen: list[int] = []
    for s in samples:
        n = len(s.input_ids)
        assert len(s.loss_mask) == n and len(s.behaviour_logprobs) == n
        expected_mask = [0] * n
        expected_lp = [0.0] * n
        spans = {sp["call_index"]: sp for sp in s.stats["call_spans"]}
        assert list(spans) == s.call_indices
        for ci in s.call_indices:
            c = sim.calls[ci]
            assert c.agent == s.agent
            g0 = spans[ci]["gen_start"]
            if exact_context:
                e = sim.expected_prompt(c, fix_drift)
                assert g0 == len(e) and s.input_ids[:g0] == e
                assert spans[ci]["exact_context"]
            out = c.completion_ids
            assert s.input_ids[g0:g0 + len(out)] == out
            for i, lp in enumerate(c.completion_logprobs):
                if g0 + i > 0:
                    expected_mask[g0 + i] = 1
                    expected_lp[g0 + i] = lp
        last = sim.calls[s.call_indices[-1]]
        assert spans[last.call_index]["gen_end"] == n
        assert s.loss_mask == expected_mask
        assert s.behaviour_logprobs == expected_lp
        assert s.loss_mask[0] == 0
        assert s.min_policy_version == min(sim.calls[i].policy_version for i in s.call_indices)
        seen += s.call_indices
    assert sorted(seen) == list(range(len(sim.calls)))
