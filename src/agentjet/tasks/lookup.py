"""Built-in agent task where the tool is the only way to the answer: look an item's code up in a table.

Each task carries a small table made fresh from its own seed (``TABLE_SIZE`` items such as ``blue-7``, each
with a random 4-digit code and a 2-digit price) and asks for one item's code: "What is the code of the blue
item with number seven?". The agent has two tools over the table (OpenAI ``tools``): ``lookup`` (the code)
and ``price``. SmolLM2's chat template has none, so the server describes them in the system prompt and
parses Hermes ``<tool_call>`` text into ``tool_calls``. The code is in the table only, so it cannot be
guessed (1 in 9000). Reward 1.0 only when the final answer holds the right code and no other 4-digit number.

The workflow ``rollout(task, ep, sampling)`` is an ordinary openai-SDK tool loop: a tool call gets the tool's
result as a ``tool`` message (an unknown item gets an error naming the table's items) and the agent goes on,
up to ``MAX_TURNS`` calls; its first answer is final (with ``checker=True`` an answer without the code gets
``FEEDBACK`` and another turn). Each call's prompt extends the previous one, so timeline merging trains an
episode as one sample. ``trace`` (an ``EpisodeTrace``) records what the agent did: turns, tool calls,
correct calls (the ``lookup`` tool, valid arguments, the asked item), the transcript.

Prompts (``PROMPTS``): the question names the item as the tool wants it ("item blue-7") or by its parts ("the
blue item with number 7", or "... number seven"); the worked example is none, described in the system
prompt, or one or two worked episodes (question, tool call, tool result, answer) in the messages before the
question. The default, ``parts_words``, was chosen by a measured pilot ("Tool-use task" in
docs/benchmarks.md): the base model's held-out success sits in the 0.1-0.6 band, and a correct call needs
the item's name built from the question.

Splits: ``train`` and ``eval`` tables come from disjoint seed namespaces, so no held-out table (or question)
is ever trained on; ``TRAIN_TABLES`` train tasks, ``EVAL_TABLES`` eval tasks. ``generate_tasks`` cycles
through a seeded shuffle of its split. Pure Python: no agentjet server imports.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from agentjet.tasks.recommended import Recommended

NAME = "lookup"
SPLITS = ("train", "eval")
COLORS = ("red", "blue", "green", "gold", "gray", "pink", "teal", "white")
TABLE_SIZE = 5
TRAIN_TABLES = 512
EVAL_TABLES = 48
MAX_TURNS = 3
CHECKER = False  # the pilot: the checker's second chance did not raise the base success (docs/benchmarks.md)
TOOL_NAME = "lookup"
OTHER_TOOL = "price"  # a second tool over the same table, so that choosing the tool matters

_ITEM_ARG = {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}
TOOLS = [{"type": "function", "function": {
    "name": TOOL_NAME, "description": "Look up the code of an item, such as 'red-2', in the item table.",
    "parameters": _ITEM_ARG}},
    {"type": "function", "function": {
        "name": OTHER_TOOL, "description": "Look up the price of an item, such as 'red-2', in the item table.",
        "parameters": _ITEM_ARG}}]

INSTRUCTION = "You are a careful assistant. Item codes are only in the item table: call the lookup tool, then reply " \
              "with only the code."
QUESTION = "What is the {column} of {phrase}?"
# How a question names the item: as the tool wants it ("item blue-7"), or by its parts, the number in digits
# or in words ("the blue item with number seven"; the tool still wants "blue-7").
NAMINGS = ("name", "digits", "words")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# The worked example (a fixed item, code and price: the tables are random, so it gives nothing away).
EXAMPLE_ITEM, EXAMPLE_CODE, EXAMPLE_PRICE = "green-3", "5172", "45"


@dataclass(frozen=True)
class Prompt:
    """A prompt variant: how the question names the item, and the worked example: none, described in the
    system prompt, or worked episodes in the messages (one per tool in ``tools``; two go in a per-task
    random order)."""

    naming: str = "name"
    example: str = "chat"  # "none" | "system" | "chat"
    tools: tuple[str, ...] = (TOOL_NAME,)


PROMPTS = {"plain": Prompt(example="none"), "system_example": Prompt(example="system"), "fewshot": Prompt(),
           "fewshot_price": Prompt(tools=(OTHER_TOOL,)), "fewshot_both": Prompt(tools=(TOOL_NAME, OTHER_TOOL)),
           "parts_digits": Prompt(naming="digits"), "parts_words": Prompt(naming="words")}
DEFAULT_PROMPT = "parts_words"
FEEDBACK = "That is not the code. Call the lookup tool for item {item}, then reply with only the code."

SAMPLING = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 40}
EVAL_SAMPLING = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 40, "seed": 30_000}
# As the calculator task: small steps (2 groups of 4) so that a step completes in about a minute on a
# 2-core CPU, two steps' worth of episodes in flight, the held-out eval every 5 minutes of training.
RECOMMENDED = Recommended(learning_rate=2e-5, group_size=4, batch_groups=2, steps=200, eval_n=EVAL_TABLES,
                          eval_every_s=300, concurrency=16, pool=TRAIN_TABLES)

_NUM = re.compile(r"\d+")
_CODE_DIGITS = 4


def make_table(rng: random.Random) -> dict[str, dict[str, str]]:
    """``TABLE_SIZE`` distinct items (``color-digit``), each with a distinct 4-digit code and a 2-digit price."""
    items = rng.sample([f"{c}-{d}" for c in COLORS for d in range(1, 10)], TABLE_SIZE)
    codes = rng.sample(range(10 ** (_CODE_DIGITS - 1), 10 ** _CODE_DIGITS), TABLE_SIZE)
    return {item: {"code": str(code), "price": str(rng.randrange(10, 100))} for item, code in zip(items, codes,
                                                                                                 strict=True)}


def question(item: str, naming: str = "name", column: str = "code") -> str:
    """The question for ``item`` ("blue-7") named as ``naming`` says."""
    if naming == "name":
        return QUESTION.format(column=column, phrase=f"item {item}")
    color, number = item.split("-")
    return QUESTION.format(column=column, phrase=f"the {color} item with number "
                           + (NUMBER_WORDS[int(number)] if naming == "words" else number))


def _worked(tool: str, naming: str) -> list[dict[str, Any]]:
    """A worked episode for ``tool`` on the example item: question, tool call, tool result, answer."""
    column, result = ("code", EXAMPLE_CODE) if tool == TOOL_NAME else ("price", EXAMPLE_PRICE)
    call = {"id": f"call_example_{tool}", "type": "function",
            "function": {"name": tool, "arguments": json.dumps({"item": EXAMPLE_ITEM})}}
    return [{"role": "user", "content": question(EXAMPLE_ITEM, naming, column)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result},
            {"role": "assistant", "content": result}]


def prompt_messages(item: str, prompt: str = DEFAULT_PROMPT, rng: random.Random | None = None
                    ) -> list[dict[str, Any]]:
    """The messages before the agent's first call, for one of ``PROMPTS`` (``rng`` orders two worked
    episodes)."""
    if prompt not in PROMPTS:
        raise ValueError(f"prompt must be one of {sorted(PROMPTS)}, got {prompt!r}")
    p = PROMPTS[prompt]
    system = INSTRUCTION
    if p.example == "system":
        call = json.dumps({"name": TOOL_NAME, "arguments": {"item": EXAMPLE_ITEM}})
        system += (f'\nExample: for "{question(EXAMPLE_ITEM, p.naming)}" reply <tool_call>{call}</tool_call>, read '
                   f"the result {EXAMPLE_CODE}, then reply {EXAMPLE_CODE}.")
    tools = list(p.tools) if p.example == "chat" else []
    if rng is not None:
        rng.shuffle(tools)
    worked = [m for tool in tools for m in _worked(tool, p.naming)]
    return [{"role": "system", "content": system}, *worked, {"role": "user", "content": question(item, p.naming)}]


def make_task(index: int, split: str = "train", prompt: str = DEFAULT_PROMPT) -> dict[str, Any]:
    """Task ``index`` of ``split``: its table and question depend on (split, index) only."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"{NAME}:{split}:{index}")
    table = make_table(rng)
    item = rng.choice(sorted(table))
    messages = prompt_messages(item, prompt, rng)
    return {"task_id": f"{NAME}-{split}-{index}", "task_type": NAME, "messages": messages,
            "table": table, "item": item, "answer": table[item]["code"], "split": split}


def generate_tasks(split: str, n: int, seed: int = 0, prompt: str = DEFAULT_PROMPT) -> list[dict[str, Any]]:
    """``n`` tasks from ``split``, deterministic in (split, n, seed); cycles when n exceeds the split."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    indices = list(range(TRAIN_TABLES if split == "train" else EVAL_TABLES))
    random.Random(f"{NAME}:{split}:order:{seed}").shuffle(indices)
    return [make_task(indices[i % len(indices)], split, prompt) for i in range(n)]


def lookup(table: dict[str, dict[str, str]], item: str, column: str = "code") -> str:
    """The tools: the item's code (``lookup``) or price (``price``), or an error naming the table's items."""
    key = str(item).strip().lower()
    if key in table:
        return table[key][column]
    return f"error: no item {item!r}; the items are {', '.join(sorted(table))}"


@dataclass
class ToolCall:
    name: str
    arguments: str
    valid: bool  # arguments are a JSON object with a string "item"
    item: str | None


def parse_call(name: str, arguments: str | None) -> ToolCall:
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        args = None
    item = args.get("item") if isinstance(args, dict) else None
    valid = isinstance(item, str)
    return ToolCall(name=name, arguments=arguments or "", valid=valid, item=item if valid else None)


def run_tool(task: dict[str, Any], call: ToolCall) -> str:
    """Execute one parsed tool call against the task's table."""
    if call.name not in (TOOL_NAME, OTHER_TOOL):
        return f"error: unknown tool {call.name!r}; the tools are {TOOL_NAME!r} and {OTHER_TOOL!r}"
    if not call.valid:
        return 'error: arguments must be a JSON object like {"item": "red-2"}'
    return lookup(task["table"], call.item or "", "code" if call.name == TOOL_NAME else "price")


def is_correct(task: dict[str, Any], call: ToolCall) -> bool:
    """The right tool, valid arguments, and the item the question asks about."""
    return call.name == TOOL_NAME and call.valid and str(call.item).strip().lower() == task["item"]


def reward(task: dict[str, Any], text: str) -> float:
    """1.0 when ``text`` holds the item's code and no other number of the code's length or longer."""
    long_numbers = [n for n in _NUM.findall(text or "") if len(n) >= _CODE_DIGITS]
    return 1.0 if long_numbers and set(long_numbers) == {task["answer"]} else 0.0


def feedback(task: dict[str, Any]) -> str:
    return FEEDBACK.format(item=task["item"])


@dataclass
class EpisodeTrace:
    """What one episode's agent did (for the pilot, the demo's tool-use report and transcripts)."""

    turns: int = 0  # chat calls
    calls: list[ToolCall] = field(default_factory=list)  # every tool call the server parsed
    unparsed: int = 0  # replies with "<tool_call>" text the server could not parse
    reward: float = 0.0
    transcript: list[str] = field(default_factory=list)

    def called(self) -> bool:
        return bool(self.calls)

    def called_correctly(self, task: dict[str, Any]) -> bool:
        return any(is_correct(task, c) for c in self.calls)


async def rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], *, checker: bool = CHECKER,
                  max_turns: int = MAX_TURNS, trace: EpisodeTrace | None = None) -> float:
    """An ordinary tool-calling agent loop on the episode's OpenAI client; returns the reward. With
    ``checker`` an answer without the code gets ``feedback`` and another turn; without, the first answer is
    final."""
    trace = trace if trace is not None else EpisodeTrace()
    client = ep.openai()
    messages: list[dict[str, Any]] = [dict(m) for m in task["messages"]]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="agent", messages=messages, tools=TOOLS, **sampling)
        msg = reply.choices[0].message
        trace.turns += 1
        if msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content or "",
                             "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
            for tc in msg.tool_calls:
                call = parse_call(tc.function.name, tc.function.arguments)
                result = run_tool(task, call)
                trace.calls.append(call)
                trace.transcript.append(f"call {call.name}({call.arguments}) -> {result}")
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
            continue
        text = msg.content or ""
        trace.unparsed += "<tool_call>" in text
        trace.transcript.append(f"answer {text!r}")
        trace.reward = reward(task, text)
        if trace.reward or not checker:
            return trace.reward
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": feedback(task)}]
    return 0.0  # no right answer within max_turns calls


def tool_use_summary(tasks: list[dict[str, Any]], traces: list[EpisodeTrace]) -> dict[str, float]:
    """Shares over episodes: success, any tool call, a correct call; turns and tool calls per episode."""
    n = max(len(traces), 1)
    return {"episodes": float(len(traces)),
            "success": sum(t.reward for t in traces) / n,
            "tool_call_share": sum(t.called() for t in traces) / n,
            "correct_call_share": sum(t.called_correctly(task) for task, t in zip(tasks, traces, strict=True)) / n,
            "unparsed_call_share": sum(t.unparsed > 0 for t in traces) / n,
            "turns_per_episode": sum(t.turns for t in traces) / n,
            "tool_calls_per_episode": sum(len(t.calls) for t in traces) / n}
