"""Tinker clients in the run's one snapshot: the status, the dashboard's run API and Prometheus show the sessions,
the training clients (adapters), their steps and their latest loss."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from agentjet.protocol import ServerStatus  # noqa: E402
from agentjet.settings import ObserveSettings  # noqa: E402

ADMIN, READ = "adm1n-token", "read-token-0123"


def test_status_dashboard_and_prometheus_show_tinker_clients(tinker_server, service_client) -> None:
    srv = tinker_server(admin_token=ADMIN, observe=ObserveSettings(read_token=READ))
    read = {"Authorization": f"Bearer {READ}"}
    status = ServerStatus.model_validate(httpx.get(f"{srv.url}/swarm/v1/status",
                                                   headers={"Authorization": f"Bearer {ADMIN}"}).json())
    assert status.tinker is not None and (status.tinker.sessions, status.tinker.training_clients) == (0, {})

    tc = service_client(srv).create_lora_training_client(base_model="tiny", rank=4).result()
    data = [types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9, 13]),
                        loss_fn_inputs={"target_tokens": [5, 9, 13, 17], "weights": [1.0] * 4})]
    loss = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    mid = tc.model_id

    status = ServerStatus.model_validate(httpx.get(f"{srv.url}/swarm/v1/status",
                                                   headers={"Authorization": f"Bearer {ADMIN}"}).json())
    assert status.tinker is not None and status.tinker.sessions == 1
    client = status.tinker.training_clients[mid]
    assert (client.rank, client.steps, client.forward_backward_calls) == (4, 1, 1)
    assert client.last_loss == pytest.approx(loss, rel=1e-5)
    assert mid not in status.adapters  # not a swarm lane: the swarm's adapters table stays the swarm's

    snap = httpx.get(f"{srv.url}/dashboard/api/run", params={"evals": "false"}, headers=read).json()["snapshot"]
    assert snap["tinker"]["training_clients"][mid]["steps"] == 1 and snap["tinker"]["sessions"] == 1

    prom = httpx.get(f"{srv.url}/metrics", headers=read).text
    assert "agentjet_tinker_sessions 1.0" in prom
    assert "agentjet_tinker_training_clients 1.0" in prom
    assert f'agentjet_tinker_optim_steps_total{{model_id="{mid}"}} 1.0' in prom
    assert f'agentjet_tinker_forward_backward_total{{model_id="{mid}"}} 1.0' in prom
    assert f'agentjet_tinker_last_loss{{model_id="{mid}"}}' in prom


def test_without_a_key_there_are_no_tinker_figures(make_server) -> None:
    srv = make_server(admin_token=ADMIN, observe=ObserveSettings(read_token=READ))
    status = httpx.get(f"{srv.url}/swarm/v1/status", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert status["tinker"] is None
    assert "agentjet_tinker_" not in httpx.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {READ}"}).text


@pytest.mark.browser
def test_the_run_page_shows_a_table_of_tinker_clients(tinker_server, service_client) -> None:
    from tests.observe.browser import CHROMIUM_ARGS, chromium_path, skip_reason

    if skip_reason() is not None:
        pytest.skip(skip_reason() or "")
    from playwright.sync_api import sync_playwright

    srv = tinker_server(admin_token=ADMIN, observe=ObserveSettings(read_token=READ))
    tc = service_client(srv).create_lora_training_client(base_model="tiny", rank=4).result()
    data = [types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9]),
                        loss_fn_inputs={"target_tokens": [5, 9, 13], "weights": [1.0] * 3})]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.goto(srv.url + "/dashboard/run")
            page.fill("#token", READ)
            page.click("button[type=submit]")
            page.wait_for_url(lambda u: u.endswith("/dashboard/run"))
            table = page.locator("#tinker")
            table.locator("td", has_text=tc.model_id).wait_for(timeout=15000)
            text = table.inner_text()
            assert "1 sessions, 1 training clients" in text and "Tinker training client" in text
            row = table.locator("tr", has_text=tc.model_id).locator("td").all_inner_texts()
            assert row[2:5] == ["4", "1", "1"]  # rank, steps, forward_backward calls
        finally:
            browser.close()
