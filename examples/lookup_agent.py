"""A tool agent that must use its tool: the raw openai SDK with ``tools``, over a table only the tool can read.

    ajet server --model smollm2-135m-instruct --group-size 4 --batch-groups 2 --lr 2e-5
    ajet run examples/lookup_agent.py:workflow --dataset examples/data/lookup.jsonl --group-size 4

Each task carries its own small table (items such as ``blue-7`` with random 4-digit codes and prices) and
asks "What is the code of the blue item with number seven?". The agent has two tools, ``lookup`` (an item's
code) and ``price``; a tool call gets the result back as a ``tool`` message (an unknown item gets an error
listing the table's items) and the agent goes on, up to 3 calls. Its first answer is final: reward 1 only
for the right code, which no guess finds. Every call's prompt extends the previous one, so the server's
timeline merging trains each episode as ONE sample (``ajet run`` prints calls per sample).
``make demo-agent TASK=lookup`` trains this agent end to end (``ajet demo --task lookup``).
"""

from agentjet.tasks.lookup import MAX_TURNS, TOOLS, parse_call, reward, run_tool


async def workflow(task: dict, ep) -> float:
    client = ep.openai()  # an openai.AsyncOpenAI bound to this episode
    messages = [dict(m) for m in task["messages"]]
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="agent", messages=messages, tools=TOOLS,
                                                     temperature=0.7, max_tokens=40)
        msg = reply.choices[0].message
        if not msg.tool_calls:  # an answer: final
            return reward(task, msg.content or "")
        # run the tools against this task's table, hand back their results, and let the agent go on
        messages.append({"role": "assistant", "content": msg.content or "",
                         "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": tc.id,
                      "content": run_tool(task, parse_call(tc.function.name, tc.function.arguments))}
                     for tc in msg.tool_calls]
    return 0.0  # no answer within MAX_TURNS calls
