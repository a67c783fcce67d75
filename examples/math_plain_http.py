"""The math workflow over plain HTTP: no agentjet import, only httpx. Any language can do the same.

    python examples/math_plain_http.py --server http://127.0.0.1:10086 [--token SWARM_TOKEN]

Protocol (JSON over HTTP):
  POST /swarm/v1/join                    {"client_id"}                         (swarm token)
  POST /swarm/v1/episodes                {"client_id", "task_id", "task_type"} (swarm token) -> episode_id, api_key, base_url
  POST {base_url}/chat/completions       OpenAI chat request                   (episode api_key)
  POST /swarm/v1/episodes/{id}/heartbeat                                        (episode api_key)
  POST /swarm/v1/episodes/{id}/end       {"reward": 1.0}                        (episode api_key; safe to retry)
  POST /swarm/v1/episodes/{id}/abort     {"reason": "..."}                     (episode api_key)
"""

import argparse
import json
import re
import sys
from pathlib import Path

import httpx


def run(server: str, token: str | None, dataset: Path, limit: int, group_size: int) -> float:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.Client(base_url=server, timeout=300)
    http.post("/swarm/v1/join", json={"client_id": "plain-http-example"}, headers=auth).raise_for_status()
    rewards = []
    tasks = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()][:limit]
    for task in tasks:
        for _ in range(group_size):
            ep = http.post("/swarm/v1/episodes", headers=auth, json={
                "client_id": "plain-http-example", "task_id": task["task_id"], "task_type": "math"}).json()
            key = {"Authorization": f"Bearer {ep['api_key']}"}
            try:
                reply = http.post(f"{ep['base_url']}/chat/completions", headers=key, json={
                    "model": "agent", "max_tokens": 24,
                    "messages": [{"role": "user", "content": task["question"]}]})
                reply.raise_for_status()
                text = reply.json()["choices"][0]["message"]["content"]
                reward = 1.0 if task["answer"] in re.findall(r"-?\d+", text) else 0.0
            except Exception as exc:  # tell the server to discard this episode
                http.post(f"/swarm/v1/episodes/{ep['episode_id']}/abort", headers=key, json={"reason": repr(exc)})
                raise
            ack = http.post(f"/swarm/v1/episodes/{ep['episode_id']}/end", headers=key, json={"reward": reward})
            ack.raise_for_status()
            rewards.append(reward)
    return sum(rewards) / len(rewards)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--server", default="http://127.0.0.1:10086")
    p.add_argument("--token", default=None)
    p.add_argument("--dataset", type=Path, default=Path(__file__).parent / "data" / "math.jsonl")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--group-size", type=int, default=2)
    args = p.parse_args()
    mean = run(args.server, args.token, args.dataset, args.limit, args.group_size)
    print(f"mean reward {mean:.3f}")
    sys.exit(0)
