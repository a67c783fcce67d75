"""Built-in agent task: single-digit arithmetic with a calculator tool and a checker, over several turns.

The agent gets "What is 7 - 5?" and a ``calculator`` tool (OpenAI ``tools``). A turn either calls the
tool (Hermes-style ``<tool_call>`` text that the server parses into ``tool_calls``; SmolLM2's chat template
has no tool support, so the server describes the tools in the system prompt) or answers. A tool result goes
back as a ``tool`` message; a wrong answer gets a checker's message (``FEEDBACK``: "too high/too low, use
the calculator"). Either way the agent takes another turn, up to ``MAX_TURNS`` calls. Reward 1.0 when an
answer's last integer is the result, else 0.0. Each turn's prompt extends the previous one, so timeline
merging turns an episode's calls into one training sample.

``rollout(task, ep, sampling)`` is the workflow, written as an ordinary openai-SDK tool loop; the demo
(``ajet demo --task calculator``) and ``examples/calculator_agent.py`` (``ajet run``) use it.

Splits: the operand pairs (a, b, op) are divided by a hash of "a op b": about one in five is held out for
``eval`` (28 of the 126 pairs with operands 1..9; use an eval ``n`` that is a multiple of 28 so every pair
weighs the same). ``generate_tasks`` cycles through a seeded shuffle of its split. Why these operands, turns
and settings: "Multi-turn agent task" in docs/benchmarks.md. Pure Python: no agentjet server imports.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

from agentjet.tasks.recommended import Recommended

NAME = "calculator"
SPLITS = ("train", "eval")
OPERANDS = range(1, 10)
OPS = ("+", "-")
EVAL_MOD = 5
MAX_TURNS = 3

SYSTEM = ("You are a careful assistant. Use the calculator tool for arithmetic, then reply with only the number.\n"
          'Example: for "What is 12 + 30?" reply <tool_call>{"name": "calculator", "arguments": {"expression": '
          '"12 + 30"}}</tool_call>, read the result 42, then reply 42.')
PROMPT = "What is {a} {op} {b}?"
TOOLS = [{"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression such as '47 + 38' and return the result.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}}]

SAMPLING = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 40}
EVAL_SAMPLING = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 40, "seed": 20_000}
# Small steps (2 groups of 4 episodes) so that a step completes in about a minute on a 2-core CPU, with two
# steps' worth of episodes in flight; ``steps`` is a ceiling (the time budget ends the run). An eval of 56
# episodes takes minutes here: every 10 minutes.
RECOMMENDED = Recommended(learning_rate=2e-5, group_size=4, batch_groups=2, steps=200, eval_n=56, eval_every_s=600,
                          concurrency=16, pool=1024)

FEEDBACK = "{hint} Use the calculator tool, then reply with only the number."

_NUM = re.compile(r"-?\d+")
_EXPR = re.compile(r"^\s*(-?\d+)\s*([-+*x×])\s*(-?\d+)\s*=?\s*$")


def _key(a: int, op: str, b: int) -> str:
    return f"{a}{op}{b}"


def in_eval_split(a: int, op: str, b: int) -> bool:
    return int(hashlib.sha256(_key(a, op, b).encode()).hexdigest(), 16) % EVAL_MOD == 0


def answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make_task(a: int, op: str, b: int, split: str = "train") -> dict[str, Any]:
    return {
        "task_id": f"{NAME}-{split}-{_key(a, op, b)}",
        "task_type": NAME,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": PROMPT.format(a=a, op=op, b=b)}],
        "answer": str(answer(a, op, b)),
        "a": a, "b": b, "op": op, "split": split,
    }


def split_pairs(split: str, operands: range = OPERANDS, ops: tuple[str, ...] = OPS) -> list[tuple[int, str, int]]:
    """The (a, op, b) of ``split``; subtraction keeps a >= b (no negative answers)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    want_eval = split == "eval"
    return [(a, op, b) for a in operands for op in ops for b in operands
            if not (op == "-" and a < b) and in_eval_split(a, op, b) == want_eval]


def generate_tasks(split: str, n: int, seed: int = 0, operands: range = OPERANDS,
                   ops: tuple[str, ...] = OPS) -> list[dict[str, Any]]:
    """``n`` tasks from ``split``, deterministic in (split, n, seed); cycles when n exceeds the split."""
    if n < 0:
        raise ValueError("n must be >= 0")
    pairs = split_pairs(split, operands, ops)
    random.Random(f"{NAME}:{split}:{seed}").shuffle(pairs)
    return [make_task(*pairs[i % len(pairs)], split=split) for i in range(n)]


def calculator(expression: str) -> str:
    """The tool: ``a op b`` for two integers (``+``, ``-``, ``*``); an error message otherwise."""
    m = _EXPR.match(str(expression))
    if not m:
        return "error: give an expression like '47 + 38'"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def run_tool(call: Any) -> str:
    """Execute one OpenAI tool call (``calculator`` only)."""
    if call.function.name != "calculator":
        return f"error: unknown tool {call.function.name!r}"
    try:
        args = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        return "error: arguments must be JSON"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    return calculator(args.get("expression", ""))


def reward(task: dict[str, Any], text: str) -> float:
    """1.0 when the last integer in the final answer is the result, else 0.0."""
    nums = _NUM.findall(text or "")
    return 1.0 if nums and nums[-1] == str(task["answer"]) else 0.0


def feedback(task: dict[str, Any], text: str) -> str:
    """The checker's message for a wrong answer."""
    nums = _NUM.findall(text or "")
    hint = "No number found." if not nums else "Too low." if int(nums[-1]) < int(task["answer"]) else "Too high."
    return FEEDBACK.format(hint=hint)


async def rollout(task: dict[str, Any], ep: Any, sampling: dict[str, Any], *, checker: bool = True,
                  max_turns: int = MAX_TURNS) -> float:
    """An ordinary tool-calling agent loop on the episode's OpenAI client; returns the reward. With
    ``checker`` a wrong answer gets ``feedback`` and another turn; without, the first answer is final."""
    client = ep.openai()
    messages: list[dict[str, Any]] = [dict(m) for m in task["messages"]]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="agent", messages=messages, tools=TOOLS, **sampling)
        msg = reply.choices[0].message
        if msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content or "",
                             "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
            messages += [{"role": "tool", "tool_call_id": tc.id, "content": run_tool(tc)} for tc in msg.tool_calls]
            continue
        text = msg.content or ""
        if reward(task, text) or not checker:
            return reward(task, text)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": feedback(task, text)}]
    return 0.0  # no right answer within max_turns calls
