"""A two-role cooperative team: a planner and an executor, each trained on its own reward.

Two servers, two models (each role its own copy of the weights):

    ajet server --model smollm2-135m-instruct --port 10086 --data-dir runs/planner &
    ajet server --model tiny-random --port 10087 --data-dir runs/executor &
    python examples/team_two_models.py --planner http://127.0.0.1:10086 --executor http://127.0.0.1:10087

One server, one base, one LoRA adapter per role (the role's agent name picks its adapter; one copy of the base):

    ajet server --lora-rank 8 --adapters planner,executor --port 10086 --data-dir runs/team &
    python examples/team_two_models.py --one-server http://127.0.0.1:10086
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re

from agentjet import Team


def make_task(rng: random.Random, i: int) -> dict:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return {"task_id": f"team-{i}", "a": a, "b": b, "answer": str(a + b)}


def closeness(text: str, answer: str) -> float:
    """1.0 for the exact number; partial credit for being close (keeps groups informative)."""
    numbers = [int(x) for x in re.findall(r"-?\d+", text or "")]
    if not numbers:
        return 0.0
    return max(0.0, 1.0 - abs(numbers[-1] - int(answer)) / 10)


async def team_episode(team: Team, task: dict, task_type: str = "math", temperature: float = 1.0,
                       eval: bool = False) -> dict[str, float]:
    """One team episode; ``eval``: a held-out one (never trained; greedy with ``temperature`` 0)."""
    async with team.episode(task_id=task["task_id"], task_type=task_type, eval=eval) as ep:
        plan = await ep.openai("planner").chat.completions.create(
            model="planner", max_tokens=24, temperature=temperature,
            messages=[{"role": "user", "content": f"Explain in one short sentence how to compute {task['a']} + "
                                                  f"{task['b']}."}])
        answer = await ep.openai("executor").chat.completions.create(
            model="executor", max_tokens=8, temperature=temperature,
            messages=[{"role": "system", "content": f"Hint: {plan.choices[0].message.content}"},
                      {"role": "user", "content": f"What is {task['a']} + {task['b']}? Reply with the number."}])
        executor_reward = closeness(answer.choices[0].message.content, task["answer"])
        planner_reward = 0.5 * executor_reward + 0.5 * (task["answer"] in (plan.choices[0].message.content or ""))
        rewards = {"planner": planner_reward, "executor": executor_reward}
        ep.reward(rewards)
    return rewards


async def main(planner: str, executor: str, tasks: int, group_size: int, seed: int) -> None:
    rng = random.Random(seed)
    async with Team({"planner": planner, "executor": executor}, client_id="team-example") as team:
        for i in range(tasks):
            task = make_task(rng, i)
            results = await asyncio.gather(*[team_episode(team, task) for _ in range(group_size)])
            mean = {role: sum(r[role] for r in results) / len(results) for role in ("planner", "executor")}
            print(f"task {task['task_id']}: planner {mean['planner']:.2f} executor {mean['executor']:.2f}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--planner", default="http://127.0.0.1:10086")
    p.add_argument("--executor", default="http://127.0.0.1:10087")
    p.add_argument("--one-server", default=None, help="one server with an adapter per role (--adapters "
                   "planner,executor): both roles go to it")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    planner_url = args.one_server or args.planner
    executor_url = args.one_server or args.executor
    asyncio.run(main(planner_url, executor_url, args.tasks, args.group_size, args.seed))
