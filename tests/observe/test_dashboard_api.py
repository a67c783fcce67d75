"""The dashboard's access rules, JSON APIs and /metrics against real servers (null and tiny engines)."""

from __future__ import annotations

import json

import httpx
import pytest
from tests.conftest import wait_until
from tests.observe.helpers import ADMIN, READ, play_group

from agentjet.observe import ObserveSettings

BEARER = {"Authorization": f"Bearer {READ}"}


@pytest.fixture
def server(make_server):
    return make_server(admin_token=ADMIN, observe=ObserveSettings(read_token=READ))


def _trained(srv, steps: int) -> None:
    wait_until(lambda: srv.server.counters.training.train_steps >= steps)


def test_without_a_token_everything_is_refused(server) -> None:
    for path in ("/dashboard/api/run", "/dashboard/api/clients", "/dashboard/api/episodes",
                 "/dashboard/api/episodes/ep-x/trace", "/dashboard/api/bench", "/metrics"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401, path
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key" and "message" in err
        wrong = httpx.get(server.url + path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    page = httpx.get(server.url + "/dashboard/run")
    assert page.status_code == 303 and page.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Frun"
    assert httpx.get(server.url + "/dashboard/login").status_code == 200
    assert httpx.get(server.url + "/dashboard/static/common.js").status_code == 200  # code, no data


def test_read_and_admin_tokens_read_the_apis(server) -> None:
    assert httpx.get(server.url + "/dashboard/api/run", headers=BEARER).status_code == 200
    assert httpx.get(server.url + "/dashboard/api/run", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
    # the read token is no admin token: control stays closed to it
    assert httpx.post(server.url + "/swarm/v1/control/pause", headers=BEARER).status_code == 401
    status = httpx.get(server.url + "/swarm/v1/status", headers={"Authorization": f"Bearer {ADMIN}"})
    assert READ not in status.text and "read_token" not in status.json()["config"]["observe"]


def test_login_sets_an_httponly_strict_session_cookie(server) -> None:
    with httpx.Client(base_url=server.url) as http:
        bad = http.post("/dashboard/login", data={"token": "wrong"})
        assert bad.status_code == 303 and bad.headers["location"] == "/dashboard/login?error=wrong"
        assert "set-cookie" not in bad.headers
        ok = http.post("/dashboard/login", data={"token": READ, "next": "/dashboard/episodes"})
        assert ok.status_code == 303 and ok.headers["location"] == "/dashboard/episodes"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert READ not in cookie  # a random session id, not the token
        assert http.get("/dashboard/api/run").status_code == 200  # the cookie is enough
        page = http.get("/dashboard/run")
        assert page.status_code == 200 and "Content-Security-Policy" in page.headers
        http.post("/dashboard/logout")
        assert http.get("/dashboard/api/run").status_code == 401
    evil = httpx.post(server.url + "/dashboard/login", data={"token": READ, "next": "https://evil.example/"})
    assert evil.headers["location"] == "/dashboard/run"  # no open redirect


def test_a_server_given_no_tokens_opens_only_to_its_generated_admin_token(make_server) -> None:
    srv = make_server()
    assert httpx.get(srv.url + "/dashboard/api/run").status_code == 401
    assert httpx.post(srv.url + "/dashboard/login", data={"token": "guess"}).headers["location"] == \
        "/dashboard/login?error=wrong"
    token = (srv.server.config.data_dir / "admin_token").read_text().strip()
    assert httpx.get(srv.url + "/dashboard/api/run", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_run_api_has_steps_with_timing_staleness_and_rates(server) -> None:
    play_group(server.url, "t1", [1.0, 0.0])
    _trained(server, 1)
    play_group(server.url, "t2", [0.0, 0.0])  # a uniform group: dropped
    play_group(server.url, "t3", [0.5, 0.0], task_type="code")
    _trained(server, 2)
    data = httpx.get(server.url + "/dashboard/api/run", headers=BEARER).json()
    snap = data["snapshot"]
    assert snap["train_steps"] == 2 and snap["policy_version"] == 2
    assert snap["dropped"]["uniform"] == 2 and snap["trained_episodes"] == 4
    steps = data["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    m = steps[1]["metrics"]
    for key in ("time/waiting_s", "time/prepare_s", "time/training_s", "time/sync_s", "staleness/mean",
                "staleness/hist/0", "throughput/generated_tokens_per_s", "throughput/trained_tokens_per_s",
                "dropped/uniform", "merge/ratio", "reward/code", "reward_agent/agent"):
        assert key in m, key
    assert m["dropped/uniform"] == 2 and m["reward/code"] == 0.25 and m["staleness/hist/0"] == 2
    after = httpx.get(server.url + "/dashboard/api/run", params={"after": 1, "evals": "false"}, headers=BEARER).json()
    assert [s["step"] for s in after["steps"]] == [2] and "evals" not in after
    clients = httpx.get(server.url + "/dashboard/api/clients", headers=BEARER).json()["clients"]
    assert clients[0]["client_id"] == "c1" and clients[0]["trained_episodes"] == 4


def test_jsonl_metrics_file_has_a_line_per_step(server) -> None:
    play_group(server.url, "t1", [1.0, 0.0])
    _trained(server, 1)
    wait_until(lambda: (server.server.config.data_dir / "metrics.jsonl").exists()
               and (server.server.config.data_dir / "metrics.jsonl").read_text().strip() != "")
    lines = [json.loads(x) for x in (server.server.config.data_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 1 and lines[0]["policy_version"] == 1 and "reward_mean" in lines[0]


def test_eval_curves_per_task_type_and_agent(server) -> None:
    for tt, reward in (("math", 1.0), ("math", 0.0), ("code", 0.5)):
        play_group(server.url, f"e-{tt}", [reward], task_type=tt, eval=True)
    evals = httpx.get(server.url + "/dashboard/api/run", headers=BEARER).json()["evals"]
    by = {(e["task_type"], e["agent"]): e for e in evals}
    assert by[("math", "*")]["reward_mean"] == 0.5 and by[("math", "*")]["episodes"] == 2
    assert by[("code", "*")]["reward_mean"] == 0.5


def test_eval_curves_per_difficulty_level(server) -> None:
    """Eval episodes noted with a difficulty level (``Episode.note(level=...)``, ``ajet demo --levels``) make one
    curve per level; those without one stay the task type's own curve."""
    play_group(server.url, "e-a", [1.0, 0.0], task_type="add", eval=True, metadata={"level": 0})
    play_group(server.url, "e-b", [0.25], task_type="add", eval=True, metadata={"level": 2})
    play_group(server.url, "e-c", [0.75], task_type="add", eval=True)
    evals = httpx.get(server.url + "/dashboard/api/run", headers=BEARER).json()["evals"]
    by = {(e["task_type"], e["level"]): (e["reward_mean"], e["episodes"]) for e in evals if e["agent"] == "*"}
    assert by == {("add", 0): (0.5, 2), ("add", 2): (0.25, 1), ("add", None): (0.75, 1)}
    status = httpx.get(server.url + "/swarm/v1/status").json()
    assert sum(status["eval_reward"].values()) == pytest.approx((1.0 + 0.0 + 0.25 + 0.75) / 4)  # all, as before


def test_episode_filters(server) -> None:
    play_group(server.url, "t1", [1.0, 0.0])
    play_group(server.url, "t2", [0.25], task_type="code", eval=True)
    ep = httpx.post(server.url + "/swarm/v1/episodes", json={"client_id": "c2", "task_id": "t9"}).json()
    httpx.post(f"{server.url}/swarm/v1/episodes/{ep['episode_id']}/abort", json={"reason": "test"},
               headers={"Authorization": f"Bearer {ep['api_key']}"})
    open_ep = httpx.post(server.url + "/swarm/v1/episodes", json={"client_id": "c2", "task_id": "t10"}).json()

    def ids(**params) -> set[str]:
        r = httpx.get(server.url + "/dashboard/api/episodes", params=params, headers=BEARER)
        assert r.status_code == 200, r.text
        return {e["episode_id"] for e in r.json()["episodes"]}

    assert len(ids()) == 5
    assert len(ids(task_type="code")) == 1 and len(ids(eval="true")) == 1
    assert len(ids(min_reward=0.5)) == 1 and len(ids(max_reward=0.3)) == 2
    assert ids(status="failed") == {ep["episode_id"]} == ids(status="aborted")
    assert ids(status="open") == {open_ep["episode_id"]}
    began_at = {e: server.server.registry.get(e).begin_policy_version for e in (ep["episode_id"], open_ep["episode_id"])}
    v = began_at[ep["episode_id"]]
    assert ids(version=v, eval="false", status="failed") == {ep["episode_id"]}
    assert ids(version=v + 1) == set()
    bad = httpx.get(server.url + "/dashboard/api/episodes", params={"status": "nope"}, headers=BEARER)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_metrics_endpoint_is_protected_and_scrapes(server) -> None:
    play_group(server.url, "t1", [1.0, 0.0])
    _trained(server, 1)
    text = httpx.get(server.url + "/metrics", headers=BEARER).text
    assert "agentjet_train_steps_total 1.0" in text
    assert "agentjet_policy_version 1.0" in text
    assert 'agentjet_dropped_episodes_total{reason="uniform"} 0.0' in text
    assert 'agentjet_train_step_phase_seconds_count{phase="training"} 1.0' in text
    assert 'agentjet_trained_episode_staleness_versions_bucket{le="0.0"} 2.0' in text
    assert 'agentjet_step_reward{task_type="math"} 0.5' in text
    assert 'agentjet_step_metric{name="staleness/masked_token_share"} 0.0' in text


def test_metrics_open_scrapes_without_a_token_and_registries_are_per_server(make_server) -> None:
    a = make_server(observe=ObserveSettings(metrics_open=True))
    b = make_server(observe=ObserveSettings(metrics_open=True))
    play_group(a.url, "t1", [1.0, 0.0])
    _trained(a, 1)
    assert "agentjet_train_steps_total 1.0" in httpx.get(a.url + "/metrics").text
    assert "agentjet_train_steps_total 0.0" in httpx.get(b.url + "/metrics").text


def test_tensorboard_event_files_are_written(make_server) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra (pip install 'agentjet[tracking]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    srv = make_server(observe=ObserveSettings(log_to=["tensorboard"]))
    play_group(srv.url, "t1", [1.0, 0.0])
    _trained(srv, 1)
    logdir = srv.server.config.data_dir / "tensorboard"
    wait_until(lambda: any(logdir.glob("events.out.tfevents.*")))
    acc = EventAccumulator(str(logdir))
    wait_until(lambda: "reward_mean" in acc.Reload().Tags()["scalars"])
    events = acc.Scalars("reward_mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.5)]


def test_trace_of_a_merged_multi_turn_episode_has_the_trainer_view(make_server) -> None:
    srv = make_server(engine="tiny", admin_token=ADMIN, observe=ObserveSettings(read_token=READ))
    ids = play_group(srv.url, "t1", [1.0, 0.0], turns=3)
    _trained(srv, 1)
    wait_until(lambda: srv.server.metrics.trainlog.for_episode(ids[0]) != {})
    r = httpx.get(f"{srv.url}/dashboard/api/episodes/{ids[0]}/trace", headers=BEARER)
    assert r.status_code == 200
    trace = r.json()
    assert trace["status"] == "trained" and trace["consumed_step"] == 1 and trace["calls"] == 3
    [sample] = trace["samples"]  # three calls merged into one sample
    assert len(sample["calls"]) == 3 and sample["stats"]["merged_calls"] == 2
    trainer = sample["trainer"]
    assert trainer["step"] == 1 and trainer["advantage"] > 0
    lps = trainer["logprobs"]
    assert len(lps) == len(sample["token_ids"])
    for mask, behaviour, lp in zip(sample["loss_mask"], sample["logprobs"], lps, strict=True):
        if mask:  # the update ran on the weights that generated the tokens: the logprobs agree closely
            assert lp is not None and lp == pytest.approx(behaviour, abs=1e-3)
        else:
            assert lp is None
    assert httpx.get(f"{srv.url}/dashboard/api/episodes/ep-nope/trace", headers=BEARER).status_code == 404


def test_team_episode_trace_links_the_other_server(make_server) -> None:
    import asyncio

    from agentjet.client.team import Team

    a = make_server(observe=ObserveSettings(read_token=READ))
    b = make_server(observe=ObserveSettings(read_token=READ))

    async def play() -> str:
        async with Team({"planner": a.url, "executor": b.url}) as team:
            async with team.episode(task_id="t1") as ep:
                await ep.openai("planner").chat.completions.create(model="planner", messages=[
                    {"role": "user", "content": "plan"}], max_tokens=4)
                await ep.openai("executor").chat.completions.create(model="executor", messages=[
                    {"role": "user", "content": "act"}], max_tokens=4)
                ep.reward({"planner": 1.0, "executor": 0.5})
            return ep.team_id

    team_id = asyncio.run(play())
    [on_a] = httpx.get(f"{a.url}/dashboard/api/teams/{team_id}", headers=BEARER).json()["episodes"]
    [on_b] = httpx.get(f"{b.url}/dashboard/api/teams/{team_id}", headers=BEARER).json()["episodes"]
    trace = httpx.get(f"{a.url}/dashboard/api/episodes/{on_a}/trace", headers=BEARER).json()
    assert trace["team"]["team_id"] == team_id
    assert trace["team"]["roles"] == {"planner": a.url, "executor": b.url}
    assert on_a != on_b


def test_wandb_sink_logs_offline(make_server, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="wandb is an optional extra (pip install 'agentjet[tracking]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    srv = make_server(observe=ObserveSettings(log_to=["wandb"]))
    play_group(srv.url, "t1", [1.0, 0.0])
    _trained(srv, 1)
    srv.stop()  # finishes the run
    runs = list((srv.server.config.data_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0


def test_trace_marks_the_drift_repair(make_server, tiny_model_path) -> None:
    from tests.server.test_tracking_server import drifted_two_turns

    from agentjet.settings import TrackingSettings

    run = drifted_two_turns(make_server, tiny_model_path, tracking=TrackingSettings(tito=False),
                            observe=ObserveSettings(read_token=READ))
    trace = httpx.get(f"{run.srv.url}/dashboard/api/episodes/{run.episode_id}/trace", headers=BEARER).json()
    [sample] = trace["samples"]
    [region] = sample["drift_regions"]
    assert region["status"] == "repaired" and region["call_index"] == 0
    assert sample["token_ids"][region["start"]:region["end"]][:len(run.ids)] == run.ids  # the generated ids, spliced
    assert run.srv.server.counters.tracking.drift_repaired == 1
