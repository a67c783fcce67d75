"""The Bench page in headless Chromium: the learning curves of three versions overlaid, one colour per version,
against train steps and training minutes; unticking a version removes its curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.observe.browser import CHROMIUM_ARGS, chromium_path, skip_reason
from tests.observe.helpers import READ
from tests.observe.test_bench import BASE_CURVES, RESULTS, demo_result

from agentjet.apps.bench.report import record_from_demo
from agentjet.observe import ObserveSettings
from agentjet.observe.bench_records import append_history

pytestmark = [pytest.mark.browser, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def write_history(path: Path) -> None:
    """Version "base" (three seeds), "v2" (one run) and the first demo (backfilled, before/after only)."""
    for i, (rewards, steps) in enumerate(BASE_CURVES):
        append_history(path, record_from_demo(demo_result("base", rewards, steps, seed=i), date=f"2026-01-0{i + 1}"))
    append_history(path, record_from_demo(demo_result("v2", [0.27, 0.6, 0.8, 0.9], [0, 2, 4, 6]), date="2026-01-05"))
    append_history(path, record_from_demo(json.loads((RESULTS / "demo.json").read_text()), commit="v1first",
                                          date="2026-01-06", backfilled=True))


def test_bench_page_overlays_the_learning_curves_of_three_versions(make_server, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    history = tmp_path / "bench_history.jsonl"
    write_history(history)
    srv = make_server(observe=ObserveSettings(read_token=READ, bench_history=history))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.goto(srv.url + "/dashboard/login?next=/dashboard/bench")
            page.fill("#token", READ)
            page.click("button[type=submit]")
            page.wait_for_url(lambda u: u.endswith("/dashboard/bench"))
            by_steps = page.locator('.card[data-title="addition: held-out eval vs train steps"]')
            by_minutes = page.locator('.card[data-title="addition: held-out eval vs training minutes"]')
            by_steps.wait_for(timeout=15000)
            for card in (by_steps, by_minutes):
                assert card.get_attribute("data-versions") == "3"
                assert int(card.get_attribute("data-points")) >= 3 * 6 + 4 + 2 - 1
                assert card.locator("canvas").count() >= 1
            # a legend entry per run (5), one colour per version (3)
            markers = by_steps.locator(".u-legend .u-series:not(:first-child) .u-marker")
            assert markers.count() == 5
            colours = {markers.nth(i).evaluate("m => getComputedStyle(m).borderColor") for i in range(5)}
            assert len(colours) == 3
            assert "(wall min)" in by_minutes.inner_text()  # the first demo had no training clock
            assert page.locator("#versions input[type=checkbox]").count() == 3
            page.locator('#versions input[data-commit="v2"]').uncheck()
            page.wait_for_function("() => document.querySelector('.card[data-title=\"addition: held-out eval vs "
                                   "train steps\"]').dataset.versions === '2'", timeout=5000)
            assert page.locator('.card[data-title="learn/addition/steps_to_target (steps)"]').count() == 1
        finally:
            browser.close()
