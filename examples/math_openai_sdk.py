"""The math workflow with the raw OpenAI SDK.

    ajet run examples/math_openai_sdk.py:workflow --dataset examples/data/math.jsonl --group-size 4
"""

import re


def reward(answer: str, text: str) -> float:
    return 1.0 if answer in re.findall(r"-?\d+", text or "") else 0.0


async def workflow(task: dict, ep) -> float:
    client = ep.openai()  # an openai.AsyncOpenAI bound to this episode
    reply = await client.chat.completions.create(
        model="agent",
        messages=[{"role": "user", "content": task["question"]}],
        temperature=1.0,
        max_tokens=24,
    )
    return reward(task["answer"], reply.choices[0].message.content)
