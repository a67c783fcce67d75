"""A multi-turn tool agent: the raw openai SDK with ``tools``, a calculator, and a checker's feedback.

    ajet server --model smollm2-135m-instruct --group-size 4 --batch-groups 2 --lr 2e-5
    ajet run examples/calculator_agent.py:workflow --dataset examples/data/calculator.jsonl --group-size 4

Each episode asks "What is a +/- b?" (single digits). The agent may call the ``calculator`` tool (its result
comes back as a ``tool`` message) or answer; a wrong answer gets "Too high/Too low. Use the calculator tool
..." and another turn, up to 3 calls. Reward 1 for a right answer. Every call's prompt extends the previous one, so the server's
timeline merging trains each episode as ONE sample (``ajet run`` prints calls per sample). ``make demo-agent``
trains this agent end to end (``ajet demo --task calculator``: eval before/after, reward curve, merge ratio).
"""

from agentjet.tasks.calculator import MAX_TURNS, TOOLS, feedback, reward, run_tool


async def workflow(task: dict, ep) -> float:
    client = ep.openai()  # an openai.AsyncOpenAI bound to this episode
    messages = [dict(m) for m in task["messages"]]
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="agent", messages=messages, tools=TOOLS,
                                                     temperature=0.7, max_tokens=40)
        msg = reply.choices[0].message
        if msg.tool_calls:  # run the tools, hand back their results, and let the agent go on
            messages.append({"role": "assistant", "content": msg.content or "",
                             "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
            messages += [{"role": "tool", "tool_call_id": tc.id, "content": run_tool(tc)} for tc in msg.tool_calls]
            continue
        if reward(task, msg.content):
            return 1.0
        messages += [{"role": "assistant", "content": msg.content or ""},
                     {"role": "user", "content": feedback(task, msg.content)}]
    return 0.0
