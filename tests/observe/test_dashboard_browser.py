"""The dashboard in headless Chromium against a real server on the tiny model, after a few train steps:
the run page draws curves with data points, the trace viewer colours the tokens of a merged multi-turn episode,
and nothing opens without the token."""

from __future__ import annotations

import httpx
import pytest
from tests.conftest import wait_until
from tests.observe.browser import CHROMIUM_ARGS, chromium_path, skip_reason
from tests.observe.helpers import ADMIN, READ, play_group

from agentjet.observe import ObserveSettings

pytestmark = [pytest.mark.browser, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@pytest.fixture(scope="module")
def trained_server(tmp_path_factory, tiny_model_path):
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig, TrainingSettings

    cfg = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(),
                       data_dir=tmp_path_factory.mktemp("dash"), admin_token=ADMIN,
                       observe=ObserveSettings(read_token=READ),
                       learner=LearnerSettings(learning_rate=1e-3),
                       training=TrainingSettings(group_size=2, batch_groups=1, checkpoint_every=0))
    engine = embedded_engine(tiny_model_path, GeneratorSettings(max_batch_size=8))
    srv = BackgroundServer(SwarmServer(cfg, engine)).start()
    merged = play_group(srv.url, "multi", [1.0, 0.0], turns=3)
    play_group(srv.url, "t2", [0.0, 1.0], task_type="code")
    play_group(srv.url, "t3", [1.0, 0.5])
    play_group(srv.url, "ev", [1.0], eval=True)
    wait_until(lambda: srv.server.counters.training.train_steps >= 3, timeout=120)
    wait_until(lambda: srv.server.metrics.trainlog.for_episode(merged[0]) != {})
    yield srv, merged[0]
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


def login(browser, url: str, target: str):
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.goto(url + target)
    assert "/dashboard/login" in page.url  # no session: the login form
    page.fill("#token", READ)
    page.click("button[type=submit]")
    page.wait_for_url(lambda u: u.endswith(target))
    return page


def test_run_page_shows_curves_with_data_points(trained_server, browser) -> None:
    srv, _ = trained_server
    page = login(browser, srv.url, "/dashboard/run")
    for title in ("Train reward per task type", "Step time split (s)", "Tokens per second",
                  "Eval reward per task type / agent", "Dropped episodes by reason (total)"):
        chart = page.locator(f'.card[data-title="{title}"]')
        page.wait_for_function("el => Number(el.dataset.points) > 0", arg=chart.element_handle(), timeout=15000)
        assert chart.locator("canvas").count() >= 1  # uPlot drew it
    assert int(page.locator('.card[data-title="Train reward per task type"]').get_attribute("data-points")) >= 3
    assert page.locator(".tile").count() >= 10
    syncs = page.locator(".tile", has_text="weight syncs").locator(".v").inner_text()  # the in-place seam's pushes
    assert int(syncs) == srv.server.engine.weight_sync.syncs >= 3
    assert "policy v" in page.locator("h1").inner_text()


def test_trace_viewer_colours_the_tokens_of_a_merged_multi_turn_episode(trained_server, browser) -> None:
    srv, episode = trained_server
    page = login(browser, srv.url, f"/dashboard/trace?episode={episode}")
    tokens = page.locator(".tokens").first
    tokens.wait_for(timeout=15000)
    assert int(tokens.get_attribute("data-boundaries")) == 3  # three calls merged into one sample
    assert page.locator(".call").count() == 3
    trained, prompt = page.locator(".tok.t"), page.locator(".tok.p")
    assert trained.count() > 0 and prompt.count() > 0
    colour = lambda loc: loc.evaluate("el => getComputedStyle(el).backgroundColor")  # noqa: E731
    assert colour(trained.first) != colour(prompt.first)
    page.select_option("#color-mode", "trainer")
    grey = "rgba(156, 163, 175, 0.4)"  # "no trainer record"
    assert all(colour(trained.nth(i)) != grey for i in range(min(trained.count(), 10)))
    trained.first.hover()
    tip = page.locator("#tip")
    assert tip.is_visible()
    text = tip.inner_text()
    assert "token id" in text and "behaviour logprob" in text and "trainer logprob" in text and "advantage" in text


def test_other_pages_render_their_data(trained_server, browser) -> None:
    srv, episode = trained_server
    page = login(browser, srv.url, "/dashboard/episodes")
    page.wait_for_selector("#episodes tr[data-status]", timeout=15000)
    assert page.locator("#episodes tr[data-status]").count() == 7
    page.goto(srv.url + "/dashboard/episodes?status=trained&task_type=code")
    page.wait_for_selector("#episodes tr[data-status]", timeout=15000)
    assert page.locator("#episodes tr[data-status]").count() == 2
    page.goto(srv.url + "/dashboard/clients")
    page.wait_for_selector("#clients td a", timeout=15000)
    assert page.locator("#clients td a").first.inner_text() == "c1"


def test_without_the_token_nothing_opens(trained_server, browser) -> None:
    srv, episode = trained_server
    page = browser.new_context().new_page()
    page.goto(f"{srv.url}/dashboard/trace?episode={episode}")
    assert "/dashboard/login" in page.url
    status = page.evaluate("async () => (await fetch('/dashboard/api/run')).status")
    assert status == 401
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    page.wait_for_url(lambda u: u.endswith("/dashboard/login?error=wrong"))
    assert "not this server's" in page.locator("#error").inner_text()
    assert httpx.get(f"{srv.url}/dashboard/api/episodes/{episode}/trace").status_code == 401


def test_trace_viewer_marks_where_the_version_changed_inside_a_reply(tiny_model_path, tmp_path, browser) -> None:
    """A reply that spans a weight update (the null engine moves the version after its second token): the trace
    marks the change between the two tokens and the hover names each token's version."""
    from transformers import AutoTokenizer

    from agentjet.layouts.null import null_engine
    from agentjet.runtime.launch import free_port
    from agentjet.server import SwarmServer
    from agentjet.server.http.app import BackgroundServer
    from agentjet.settings import ServerConfig, TrainingSettings

    engine = null_engine(AutoTokenizer.from_pretrained(tiny_model_path), reply="one two three", update_at_token=2)
    cfg = ServerConfig(model=str(tiny_model_path), served_model_name="tiny", port=free_port(), data_dir=tmp_path,
                       admin_token=ADMIN, observe=ObserveSettings(read_token=READ),
                       training=TrainingSettings(group_size=4, checkpoint_every=0))
    srv = BackgroundServer(SwarmServer(cfg, engine)).start()
    try:
        episode = play_group(srv.url, "v", [1.0])[0]
        page = login(browser, srv.url, f"/dashboard/trace?episode={episode}")
        tokens = page.locator(".tokens").first
        tokens.wait_for(timeout=15000)
        assert tokens.get_attribute("data-version-changes") == "1"
        marker = tokens.locator(".boundary.version")
        assert marker.inner_text() == "v0→v1"
        at = int(marker.get_attribute("data-version-change"))
        page.locator(f'.tok[data-i="{at}"]').hover()
        assert "generated by policy v1 (the reply was at v0 before this token)" in page.locator("#tip").inner_text()
        page.locator(f'.tok[data-i="{at - 1}"]').hover()
        assert "generated by policy v0" in page.locator("#tip").inner_text()
        assert "v0→v1" in page.locator(".call .flag").first.inner_text()
    finally:
        srv.stop()
