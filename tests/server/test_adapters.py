"""Several LoRA adapters on one server (issue 34), the server half: routing by agent name, one training lane per
adapter (its own steps, version, pool, checkpoints), exactly-once per (episode, adapter), resume, teams on one
server. The engine here is ``NullAdapters`` (a null pair per adapter), so these tests are about the server; the
engine half (mixed-adapter batches, a step of one adapter leaving the other unchanged) is tests/layouts/test_adapters.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from tests.conftest import settle, wait_until

from agentjet import SwarmClient
from agentjet.client.team import Team
from agentjet.layouts.null import NullAdapters

pytestmark = pytest.mark.server

USER = [{"role": "user", "content": "plan it"}]
ROLES = ["planner", "executor"]


@pytest.fixture
def adapters_server(make_server, tiny_model_path: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)

    def make(names: list[str] = ROLES, default: str | None = None, **kw):
        engine = NullAdapters(tokenizer, names)
        lora = {"rank": 4, "adapters": names, "default_adapter": default}
        return make_server(engine, learner={"lora": lora}, **kw), engine

    return make


async def episode(client: SwarmClient, task: str, reward, agents: list[str] = ROLES) -> str:
    async with client.episode(task_id=task) as ep:
        for agent in agents:
            await ep.openai(agent=agent).chat.completions.create(model="tiny", messages=USER, max_tokens=4)
        ep.reward(reward)
    return ep.episode_id


def test_each_agent_is_served_by_its_adapter_and_models_lists_them(adapters_server) -> None:
    srv, engine = adapters_server()

    async def main() -> None:
        async with SwarmClient(srv.url) as client, client.episode(task_id="t") as ep:
            await ep.openai(agent="planner").chat.completions.create(model="tiny", messages=USER)
            await ep.openai().chat.completions.create(model="executor", messages=USER)  # the model field
            await ep.openai().chat.completions.create(model="executor", messages=USER)
            ep.reward(1.0)

    asyncio.run(main())
    assert len(engine.engine("planner").generator.prompts) == 1
    assert len(engine.engine("executor").generator.prompts) == 2
    models = httpx.get(f"{srv.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny", "planner", "executor"]
    assert all(m["policy_version"] == 0 for m in models)


def test_an_agent_named_like_no_adapter_gets_a_404_naming_them_and_loses_nothing(adapters_server) -> None:
    srv, engine = adapters_server()

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            ep = await client.episode(task_id="t").begin()
            r = httpx.post(f"{srv.url}/v1/chat/completions", headers={"Authorization": f"Bearer {ep.api_key}",
                                                                       "X-Agent-Name": "critic"},
                           json={"model": "tiny", "messages": USER})
            assert r.status_code == 404, r.text
            err = r.json()["error"]
            assert err["param"] == "model" and "planner" in err["message"] and "executor" in err["message"]
            # the episode is untouched: a call by a served agent still works, and the end is acknowledged
            await ep.openai(agent="planner").chat.completions.create(model="tiny", messages=USER)
            result = await ep.end(1.0)
            assert result.acknowledged

    asyncio.run(main())
    assert sum(len(engine.engine(n).generator.prompts) for n in ROLES) == 1


def test_a_default_adapter_serves_unnamed_agents(adapters_server) -> None:
    srv, engine = adapters_server(default="executor")

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await episode(client, "t", 1.0, agents=["critic"])

    asyncio.run(main())
    assert len(engine.engine("executor").generator.prompts) == 1 and not engine.engine("planner").generator.prompts


def test_each_adapter_steps_when_its_own_batch_is_ready(adapters_server) -> None:
    srv, engine = adapters_server()

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await asyncio.gather(*[episode(client, "p", r, agents=["planner"]) for r in (1.0, 0.0)])
            await episode(client, "e", 1.0, agents=["executor"])  # half of the executor's group

    asyncio.run(main())
    wait_until(lambda: srv.server.status().adapters["planner"].train_steps == 1)
    settle(srv)
    status = srv.server.status()
    planner, executor = status.adapters["planner"], status.adapters["executor"]
    assert (planner.policy_version, planner.trained_episodes, planner.pending_episodes) == (1, 2, 0)
    assert (executor.policy_version, executor.train_steps, executor.pending_episodes) == (0, 0, 1)
    assert status.train_steps == 1 and status.policy_version == 0  # the sum of steps; the oldest version
    assert engine.engine("planner").learner.policy_version == 1 and engine.engine("executor").learner.policy_version == 0
    trained = engine.engine("planner").learner.trained[0]
    assert len(trained) == 2 and {s.advantages[-1] > 0 for s in trained} == {True, False}


def test_an_episode_that_used_two_adapters_is_consumed_once_by_each(adapters_server) -> None:
    srv, engine = adapters_server()

    async def main() -> list[str]:
        async with SwarmClient(srv.url) as client:
            return await asyncio.gather(*[episode(client, "both", {"planner": r, "executor": 1 - r})
                                          for r in (1.0, 0.0)])

    ids = asyncio.run(main())
    wait_until(lambda: all(a.train_steps == 1 for a in srv.server.status().adapters.values()))
    settle(srv)
    store = srv.server.store
    for name in ROLES:
        assert store.lane(name).consumed_steps() == {i: [1] for i in ids}
        [batch] = engine.engine(name).learner.trained  # one step each, of its own agent's samples
        assert len(batch) == 2
    assert {store.get_episode(i).status.value for i in ids} == {"trained"}
    # each adapter was trained on its own role's reward: the planner's winner is the executor's loser
    adv = {n: [s.advantages[-1] for s in engine.engine(n).learner.trained[0]] for n in ROLES}
    assert [a > 0 for a in adv["planner"]] == [a < 0 for a in adv["executor"]]


def test_a_team_on_one_server_trains_each_role_on_its_adapter(adapters_server) -> None:
    srv, engine = adapters_server()

    async def main() -> None:
        async with Team({"planner": srv.url, "executor": srv.url}) as team:
            async def one(r: float) -> None:
                async with team.episode(task_id="team") as ep:
                    for role in ROLES:
                        await ep.openai(role).chat.completions.create(model="tiny", messages=USER, max_tokens=4)
                    ep.reward({"planner": r, "executor": r / 2})
                assert all(not m._openai and m._heartbeat is None for m in ep.members.values())  # released
            await asyncio.gather(one(1.0), one(0.0))

    asyncio.run(main())
    wait_until(lambda: all(a.train_steps == 1 for a in srv.server.status().adapters.values()))
    assert all(len(engine.engine(n).learner.trained[0]) == 2 for n in ROLES)


def test_resume_brings_every_adapter_back_at_its_own_version_exactly_once(adapters_server, tmp_path: Path) -> None:
    data = tmp_path / "adapters-run"
    srv, _ = adapters_server(data_dir=data, training={"checkpoint_every": 1})

    async def phase1() -> list[str]:
        async with SwarmClient(srv.url) as client:
            ids = await asyncio.gather(*[episode(client, "p", r, agents=["planner"]) for r in (1.0, 0.0)])
            await asyncio.to_thread(wait_until, lambda: srv.server.status().adapters["planner"].train_steps == 1)
            ids += await asyncio.gather(*[episode(client, "p", r, agents=["planner"]) for r in (1.0, 0.0)])
            await asyncio.to_thread(wait_until, lambda: srv.server.status().adapters["planner"].train_steps == 2)
            ids.append(await episode(client, "e", 1.0, agents=["executor"]))  # half a group: stays pending
            return ids

    first = asyncio.run(phase1())
    srv.stop()
    assert (data / "checkpoints" / "adapters" / "planner" / "latest").exists()

    srv2, engine2 = adapters_server(data_dir=data, resume=True)
    status = srv2.server.status()
    assert (status.adapters["planner"].policy_version, status.adapters["planner"].train_steps) == (2, 2)
    assert (status.adapters["executor"].policy_version, status.adapters["executor"].pending_episodes) == (0, 1)
    assert engine2.engine("planner").learner.policy_version == 2

    async def phase2() -> str:
        async with SwarmClient(srv2.url) as client:
            return await episode(client, "e", 0.0, agents=["executor"])

    last = asyncio.run(phase2())
    wait_until(lambda: srv2.server.status().adapters["executor"].train_steps == 1)
    store = srv2.server.store
    assert store.lane("planner").consumed_steps() == {i: [1 if k < 2 else 2] for k, i in
                                                             enumerate(first[:4])}
    assert store.lane("executor").consumed_steps() == {first[4]: [1], last: [1]}
    assert engine2.engine("executor").learner.trained[0][0].input_ids  # trained after the resume, once


@pytest.mark.parametrize(("learner", "generator", "words"), [
    ({"lora": {"adapters": ["alpha", "beta"]}}, {}, "--lora-rank 8"),
    ({"lora": {"rank": 8, "adapters": ["alpha", "alpha"]}}, {}, "each name once"),
    ({"lora": {"rank": 8, "adapters": ["a b"]}}, {}, "letters, digits"),
    ({"lora": {"rank": 8, "adapters": ["lo"]}}, {}, "part of 'lora_'"),  # PEFT would take it for its own key
    ({"lora": {"rank": 8, "adapters": ["alpha"], "default_adapter": "zeta"}}, {}, "not one of the adapters"),
    ({"lora": {"rank": 8, "adapters": ["alpha", "beta"]}, "group": {"procs": 1}}, {"kind": "vllm"},
     "in-process learner"),
    ({"lora": {"rank": 8, "adapters": ["alpha", "beta"]}, "group": {"procs": 1}}, {}, "learner.group.procs 0"),
])
def test_a_config_that_asks_for_adapters_it_cannot_have_is_refused_with_the_fix(learner, generator, words) -> None:
    from pydantic import ValidationError

    from agentjet.settings import ServerConfig

    with pytest.raises(ValidationError, match=words):
        ServerConfig(learner=learner, generator=generator)


def test_adapters_are_added_and_removed_while_the_server_runs(adapters_server) -> None:
    from typer.testing import CliRunner

    from agentjet.cli import app

    srv, engine = adapters_server(admin_token="adm1n")
    control = f"{srv.url}/swarm/v1/control/adapters"
    auth = {"Authorization": "Bearer adm1n"}
    out = CliRunner().invoke(app, ["ctl", "adapter", "add", "critic", "--rank", "2", "--server", srv.url,
                                   "--token", "adm1n"])
    assert out.exit_code == 0 and "critic" in out.output, out.output
    assert engine.names() == ["planner", "executor", "critic"]
    for body, status, words in [({"name": "critic"}, 409, "exists already"), ({"name": "a b"}, 400, "letters"),
                                ({"name": "x", "rank": 0}, 400, "rank")]:
        r = httpx.post(control, json=body, headers=auth)
        assert r.status_code == status and words in r.text, r.text

    async def critic_group() -> None:
        async with SwarmClient(srv.url) as client:
            await asyncio.gather(*[episode(client, "c", r, agents=["critic"]) for r in (1.0, 0.0)])

    asyncio.run(critic_group())
    wait_until(lambda: "critic" in srv.server.status().adapters
               and srv.server.status().adapters["critic"].train_steps == 1)
    assert engine.engine("critic").learner.policy_version == 1

    r = httpx.delete(f"{control}/planner", headers=auth)
    assert r.status_code == 200 and r.json()["adapters"] == ["executor", "critic"], r.text
    assert "planner" not in srv.server.status().adapters and engine.names() == ["executor", "critic"]
    assert httpx.delete(f"{control}/planner", headers=auth).status_code == 404
    assert httpx.delete(f"{control}/critic", headers=auth).status_code == 200
    last = httpx.delete(f"{control}/executor", headers=auth)
    assert last.status_code == 409 and "last" in last.text

    async def planner_call() -> int:
        async with SwarmClient(srv.url) as client:
            ep = await client.episode(task_id="t").begin()
            r = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "planner", "messages": USER},
                           headers={"Authorization": f"Bearer {ep.api_key}"})
            await ep.abort()
            return r.status_code

    assert asyncio.run(planner_call()) == 404  # its agent is no longer served


def test_a_server_with_one_policy_refuses_to_add_adapters(make_server) -> None:
    srv = make_server(admin_token="adm1n")
    r = httpx.post(f"{srv.url}/swarm/v1/control/adapters", json={"name": "a"},
                   headers={"Authorization": "Bearer adm1n"})
    assert r.status_code == 400 and "--adapters" in r.text


def test_each_adapter_is_observed_on_its_own(adapters_server) -> None:
    import json

    srv, _ = adapters_server(admin_token="adm1n")

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await asyncio.gather(*[episode(client, "p", r, agents=["planner"]) for r in (1.0, 0.0)])

    asyncio.run(main())
    wait_until(lambda: srv.server.status().adapters["planner"].train_steps == 1)
    text = httpx.get(f"{srv.url}/metrics", headers={"Authorization": "Bearer adm1n"}).text
    assert 'agentjet_adapter_train_steps_total{adapter="planner"} 1.0' in text
    assert 'agentjet_adapter_train_steps_total{adapter="executor"} 0.0' in text
    assert 'agentjet_adapter_policy_version{adapter="planner"} 1.0' in text
    assert 'agentjet_adapter_step_metric{adapter="planner",name="reward_mean"} 0.5' in text
    run = httpx.get(f"{srv.url}/dashboard/api/run", headers={"Authorization": "Bearer adm1n"}).json()
    rows = run["snapshot"]["adapters"]  # the run page's one row per adapter
    assert (rows["planner"]["train_steps"], rows["executor"]["train_steps"]) == (1, 0)
    assert rows["planner"]["last_train_metrics"]["reward_mean"] == 0.5
    # the step curves are one adapter's: by default the first (the default adapter), or the one asked for
    assert [(s["step"], s["metrics"]["reward_mean"]) for s in run["steps"]] == [(1, 0.5)]  # the planner's
    admin = {"Authorization": "Bearer adm1n"}
    executor = httpx.get(f"{srv.url}/dashboard/api/run", params={"adapter": "executor"}, headers=admin).json()
    assert executor["steps"] == []  # it has not stepped
    missing = httpx.get(f"{srv.url}/dashboard/api/run", params={"adapter": "critic"}, headers=admin)
    assert missing.status_code == 404 and "critic" in missing.json()["error"]["message"]
    lines = [json.loads(x) for x in (srv.server.data_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(x["adapter"], x["step"]) for x in lines] == [("planner", 1)]


def test_a_begin_that_declares_its_agents_counts_only_against_their_adapters(adapters_server) -> None:
    srv, _ = adapters_server(training={"max_staleness": 0})

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            await episode(client, "e", 1.0, agents=["executor"])  # half a group: the executor has one accepted
            with pytest.raises(Exception, match="critic"):  # an agent no adapter serves: its 404 at begin
                await client.episode(task_id="x", agents=["critic"]).begin()

    asyncio.run(main())
    admission = srv.server.admission
    assert admission.capacity(["executor"]) == 1 and admission.capacity(None) == 1  # (0 + 0 + 1) * 2 - 1
    assert admission.capacity(["planner"]) == 2  # the planner's own bound: it has accepted nothing


@pytest.mark.browser
def test_the_run_page_draws_the_step_curves_of_the_adapter_picked(adapters_server) -> None:
    from tests.observe.browser import CHROMIUM_ARGS, chromium_path, skip_reason

    if skip_reason() is not None:
        pytest.skip(skip_reason() or "")
    from playwright.sync_api import sync_playwright

    srv, _ = adapters_server(admin_token="adm1n")

    async def main() -> None:
        async with SwarmClient(srv.url) as client:
            for _ in range(2):
                await asyncio.gather(*[episode(client, "p", r, agents=["planner"]) for r in (1.0, 0.0)])

    asyncio.run(main())
    wait_until(lambda: srv.server.status().adapters["planner"].train_steps == 2)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.goto(srv.url + "/dashboard/run")
            page.fill("#token", "adm1n")
            page.click("button[type=submit]")
            page.wait_for_url(lambda u: u.endswith("/dashboard/run"))
            pick = page.locator("#adapter-pick")
            pick.locator("option", has_text="executor").wait_for(state="attached", timeout=15000)
            assert pick.locator("option").all_inner_texts() == ["planner", "executor"]
            chart = page.locator('.card[data-title="Train reward per task type"]')
            points = "el => Number(el.dataset.points) {}"
            page.wait_for_function(points.format("> 0"), arg=chart.element_handle(), timeout=15000)  # the planner's
            pick.select_option("executor")  # no step yet: the curves empty
            page.wait_for_function(points.format("=== 0"), arg=chart.element_handle(), timeout=15000)
            pick.select_option("planner")
            page.wait_for_function(points.format("> 0"), arg=chart.element_handle(), timeout=15000)
        finally:
            browser.close()
