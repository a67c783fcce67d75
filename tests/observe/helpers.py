"""Shared set-up for the observe tests: a server with read/admin tokens and a few real train steps."""

from __future__ import annotations

import httpx

READ = "read-token-" + "r" * 40
ADMIN = "admin-token-" + "a" * 40


def play_group(url: str, task_id: str, rewards: list[float], task_type: str = "math", turns: int = 1,
               agent: str = "agent", eval: bool = False, metadata: dict | None = None) -> list[str]:
    """One GRPO group: an episode per reward, each with ``turns`` chat calls that extend each other; ``metadata``
    goes with each end."""
    ids = []
    for reward in rewards:
        ep = httpx.post(f"{url}/swarm/v1/episodes", json={"client_id": "c1", "task_id": task_id,
                                                           "task_type": task_type, "eval": eval}).json()
        headers = {"Authorization": f"Bearer {ep['api_key']}"}
        messages = [{"role": "user", "content": f"What is 2 + {len(ids)}?"}]
        for turn in range(turns):
            r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=120,
                           json={"model": agent, "messages": messages, "max_tokens": 6, "temperature": 1.0})
            assert r.status_code == 200, r.text
            messages = [*messages, r.json()["choices"][0]["message"],
                        {"role": "user", "content": f"Check it again ({turn})."}]
        r = httpx.post(f"{url}/swarm/v1/episodes/{ep['episode_id']}/end", headers=headers, json={"reward": reward, "metadata": metadata or {}})
        assert r.status_code == 200, r.text
        ids.append(ep["episode_id"])
    return ids
