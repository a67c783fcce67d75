"""The verifiers side of ``ajet verifiers``: runs inside the verifiers venv (``make setup-verifiers``), never in
AgentJet's. It imports only the standard library and verifiers 0.4 (which pins ``openai<3``), so it is run by
its file path, not as a module of ``agentjet``.

It loads one verifiers environment, holds its serving resources, and runs one verifiers episode per request
against the base URL and key it is given: a swarm episode's. It talks to its parent (``bridge.py``) in JSON
lines over a Unix socket (``--socket``), one connection; its stdout and stderr are the parent's log file.

    -> {"type": "ready", "env_id": ..., "verifiers": "0.4.0", "tasks": [{"index", "key", "id", "name"}, ...]}
    <- {"id": 7, "index": 3, "base_url": "http://.../v1", "api_key": "aj-ep-..."}
    -> {"type": "episode", "id": 7, "ok": true, "reward": 0.8, "traces": [{"agent", "reward", "rewards",
        "reply", "ok", "errors"}], "errors": []}

The environment runs with AgentJet's defaults, not verifiers': each agent's runtime is ``subprocess`` (verifiers'
default is Prime's cloud sandbox) and its harness is ``null``, a plain chat loop (verifiers' default ``bash``
harness executes the model's code). The harness program is a PEP 723 script that ``uv`` sets up from PyPI the
first time it is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

KEY_VAR_PREFIX = "AGENTJET_EPISODE_API_KEY_"  # verifiers reads a client's key from an environment variable


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the Unix socket to listen on for the parent")
    p.add_argument("--taskset", required=True, help="the verifiers taskset id (an installed package)")
    p.add_argument("--env-id", default="", help="a verifiers env id to pair with the taskset")
    p.add_argument("--path", action="append", default=[], help="a directory to import tasksets from")
    p.add_argument("--harness", default="null", help="every agent's harness id (verifiers' default: bash)")
    p.add_argument("--runtime", default="subprocess", help="every agent's runtime type (verifiers' default: prime)")
    p.add_argument("--model", default="agent", help="the model name the harness sends")
    p.add_argument("--limit", type=int, default=None, help="the first N tasks (needed for an endless taskset)")
    p.add_argument("--env-config", default="{}", help="more of the env's config, as JSON (merged in)")
    p.add_argument("--sampling", default="{}", help="sampling for every call, as JSON (e.g. max_tokens)")
    p.add_argument("--recycle-every", type=int, default=256,
                   help="restart the serving resources after this many episodes (verifiers keeps one HTTP "
                        "client per distinct key, and every swarm episode has its own key)")
    p.add_argument("--loopback-only", action="store_true",
                   help="refuse, at name resolution, every address of this process's connections that is not "
                        "loopback")
    return p.parse_args(argv)


def agent_overrides(harness: str, runtime: str) -> dict[str, Any]:
    """What each agent seat gets in place of verifiers' defaults."""
    return {"harness": {"id": harness}, "runtime": {"type": runtime}}


def env_config_data(args: argparse.Namespace, role_names: list[str]) -> dict[str, Any]:
    """The env's config: the taskset, then ``--env-config``, then every role's harness and runtime, unless
    ``--env-config`` pinned them for that role."""
    data: dict[str, Any] = json.loads(args.env_config)
    data.setdefault("taskset", {})["id"] = args.taskset
    if args.env_id:
        data["id"] = args.env_id
    for role in role_names:
        seat = data.setdefault(role, {})
        for key, value in agent_overrides(args.harness, args.runtime).items():
            seat.setdefault(key, value)
    return data


def guard_loopback() -> None:
    """Make every lookup that gives an address other than loopback fail, in this process (its connections resolve
    through ``socket.getaddrinfo``, an IP address too); not in the harness program, a child process."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        infos = real(host, *args, **kwargs)
        for info in infos:
            address = str(info[4][0])
            if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
                raise OSError(f"loopback only: refused {host!r} ({address})")
        return infos

    socket.getaddrinfo = getaddrinfo


def load_env(args: argparse.Namespace) -> Any:
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import AgentConfig

    sys.path[:0] = [os.path.abspath(p) for p in args.path]
    config_cls = vf.env_config_type(args.taskset, args.env_id)
    roles = [name for name, f in config_cls.model_fields.items() if isinstance(f.default, AgentConfig)]
    config = vf.resolve_env_config(env_config_data(args, roles))
    return vf.load_environment(config)


def task_list(env: Any, limit: int | None) -> list[Any]:
    taskset = env.taskset if limit is None else env.taskset.take(limit)
    if not taskset.bounded:
        raise SystemExit(f"taskset {env.config.taskset.id!r} is endless: give --limit")
    return list(taskset)


def describe_trace(trace: Any) -> dict[str, Any]:
    harness, runtime = getattr(trace.agent.config, "harness", None), trace.agent.runtime
    return {
        "agent": trace.agent.name,
        "harness": getattr(harness, "id", None),
        "runtime": getattr(runtime, "type", None),
        "reward": trace.reward,
        "rewards": {k: (None if r is None else {"score": r.score, "weight": r.weight})
                    for k, r in trace.rewards.items()},
        "reply": trace.last_reply,
        "ok": trace.ok,
        "errors": [f"{e.type}: {e.message}" for e in trace.errors],
    }


def describe_episode(episode: Any) -> dict[str, Any]:
    """The episode as the parent needs it: its reward is the mean of its traces' rewards (a single-agent env has
    one trace, so it is that trace's reward: the sum of its weighted rewards)."""
    traces = [describe_trace(t) for t in episode.traces]
    ok = bool(episode.ok) and bool(traces) and all(t["reward"] is not None for t in traces)
    reward = sum(t["reward"] for t in traces) / len(traces) if ok else None
    errors = [f"{e.type}: {e.message}" for e in episode.errors] + [e for t in traces for e in t["errors"]]
    return {"ok": ok, "reward": reward, "traces": traces, "errors": errors}


class Serving:
    """The env's serving resources, restarted once ``recycle_every`` episodes have begun and none is running."""

    def __init__(self, env: Any, recycle_every: int) -> None:
        self.env = env
        self.recycle_every = recycle_every
        self.stack = contextlib.AsyncExitStack()
        self.begun = 0
        self.running = 0
        self.cond = asyncio.Condition()

    async def __aenter__(self) -> Serving:
        await self.stack.enter_async_context(self.env.serving())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self.cond:
            await self.cond.wait_for(lambda: self.begun < self.recycle_every or self.running == 0)
            if self.begun >= self.recycle_every:
                await self.stack.aclose()
                self.stack = contextlib.AsyncExitStack()
                await self.stack.enter_async_context(self.env.serving())
                self.begun = 0
            self.begun += 1
            self.running += 1
        try:
            yield
        finally:
            async with self.cond:
                self.running -= 1
                self.cond.notify_all()


async def run_one(env: Any, serving: Serving, tasks: list[Any], request: dict[str, Any], model: str,
                  sampling: dict[str, Any]) -> dict[str, Any]:
    import verifiers.v1 as vf

    var = f"{KEY_VAR_PREFIX}{request['id']}"
    os.environ[var] = request["api_key"]
    try:
        client = vf.EvalClientConfig(base_url=request["base_url"], api_key_var=var)
        ctx = vf.ModelContext(model=model, client=client, sampling=vf.SamplingConfig(**sampling))
        async with serving.slot():
            episode = await env.run_episode(tasks[request["index"]], ctx)
        return describe_episode(episode)
    finally:
        os.environ.pop(var, None)


async def serve(args: argparse.Namespace) -> None:
    env = load_env(args)
    tasks = task_list(env, args.limit)
    sampling = json.loads(args.sampling)
    import verifiers

    ready = {"type": "ready", "env_id": env.config.env_id, "verifiers": verifiers.__version__,
             "tasks": [{"index": i, "key": t.key, "id": t.data.id, "name": t.data.name} for i, t in enumerate(tasks)]}
    done = asyncio.Event()

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        write = line_writer(writer)
        write(ready)
        running: set[asyncio.Task[None]] = set()
        try:
            async with Serving(env, args.recycle_every) as serving:
                while line := await reader.readline():
                    request = json.loads(line)
                    task = asyncio.create_task(answer(env, serving, tasks, request, args.model, sampling, write))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await asyncio.gather(*running)
        finally:
            writer.close()
            done.set()

    server = await asyncio.start_unix_server(session, path=args.socket)
    async with server:
        await done.wait()  # one parent, one connection: when it closes, the worker ends


async def answer(env: Any, serving: Serving, tasks: list[Any], request: dict[str, Any], model: str,
                 sampling: dict[str, Any], write: Callable[[dict[str, Any]], None]) -> None:
    try:
        reply = await run_one(env, serving, tasks, request, model, sampling)
    except Exception as exc:  # one failed episode is reported, the worker goes on
        reply = {"ok": False, "reward": None, "traces": [], "errors": [f"{type(exc).__name__}: {exc}"]}
    write({"type": "episode", "id": request["id"], **reply})


def line_writer(writer: asyncio.StreamWriter) -> Callable[[dict[str, Any]], None]:
    def write(obj: dict[str, Any]) -> None:
        writer.write((json.dumps(obj) + "\n").encode())

    return write


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.loopback_only:
        guard_loopback()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
