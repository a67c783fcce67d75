"""The math workflow with LangChain: an unmodified ChatOpenAI only needs base_url and api_key.

    ajet run examples/math_langchain.py:workflow --dataset examples/data/math.jsonl --group-size 4
"""

import re

from langchain_openai import ChatOpenAI


async def workflow(task: dict, ep) -> float:
    llm = ChatOpenAI(base_url=ep.base_url, api_key=ep.api_key, model="agent", temperature=1.0, max_tokens=24)
    reply = await llm.ainvoke(task["question"])
    return 1.0 if task["answer"] in re.findall(r"-?\d+", reply.content) else 0.0
