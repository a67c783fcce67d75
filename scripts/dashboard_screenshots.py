"""Screenshots of every dashboard page from a short real run on SmolLM2-135M-Instruct (for docs/dashboard/).

    flock /tmp/aj-cpu.lock .venv/bin/python scripts/dashboard_screenshots.py [--steps 5]

A server with a read token trains on the addition task through real episodes of two task types: "add" (one
call by the agent "solver") and "add-check" (the solver answers, is asked to answer again, so its two calls
merge into one sample, then a "checker" agent verifies; one reward per agent). Eval episodes run before and
after. Then headless Chromium (Debian's chromium) logs in and captures each page.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "observe"))

from browser import CHROMIUM_ARGS, chromium_path  # noqa: E402

from agentjet.client.client import SwarmClient  # noqa: E402
from agentjet.layouts import embedded_engine  # noqa: E402
from agentjet.observe import ObserveSettings  # noqa: E402
from agentjet.observe.schema import EpisodeFilter  # noqa: E402
from agentjet.runtime.launch import free_port  # noqa: E402
from agentjet.server import SwarmServer  # noqa: E402
from agentjet.server.http.app import BackgroundServer  # noqa: E402
from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig, TrainingSettings  # noqa: E402
from agentjet.tasks import get_task  # noqa: E402

TOKEN = "screenshot-read-token-0123456789abcdef"
OUT = ROOT / "docs" / "dashboard"
task = get_task("addition")


async def episode(client: SwarmClient, t: dict[str, Any], kind: str, eval: bool = False) -> None:
    sampling = dict(task.SAMPLING)
    async with client.episode(task_id=f"{kind}-{t['task_id']}", task_type=kind, eval=eval) as ep:
        llm = ep.openai()
        msgs = list(t["messages"])
        r = await llm.chat.completions.create(model="solver", messages=msgs, **sampling)
        text = r.choices[0].message.content or ""
        if kind == "add":
            ep.reward(task.reward(t, text))
            return
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Are you sure? Reply with only "
                                                                                    "the number."}]
        r2 = await llm.chat.completions.create(model="solver", messages=msgs, **sampling)
        final = r2.choices[0].message.content or ""
        check = await llm.chat.completions.create(model="checker", messages=[{"role": "user", "content": (
            f"Is {t['a']} + {t['b']} = {final.strip()[:12]}? Reply yes or no.")}], **sampling)
        right = task.reward(t, final)
        said_yes = "yes" in (check.choices[0].message.content or "").lower()
        ep.reward({"solver": right, "checker": 1.0 if said_yes == (right == 1.0) else 0.0})


async def drive(srv: BackgroundServer, steps: int, budget_s: float) -> None:
    train = task.generate_tasks("train", 400, seed=1)
    evals = task.generate_tasks("eval", 8, seed=0)
    async with SwarmClient(srv.url, client_id="screenshot-client") as client:
        await asyncio.gather(*[episode(client, t, k, eval=True) for t in evals for k in ("add", "add-check")])
        deadline, i = time.monotonic() + budget_s, 0
        while srv.server.counters.training.train_steps < steps and time.monotonic() < deadline:
            t = train[i % len(train)]
            i += 1
            await asyncio.gather(*[episode(client, t, k) for k in ("add", "add-check") for _ in range(4)])
        await asyncio.gather(*[episode(client, t, k, eval=True) for t in evals for k in ("add", "add-check")])
    async with SwarmClient(srv.url, client_id="late-client") as client:  # a second client, one episode open
        ep = client.episode(task_id="open-one", task_type="add")
        await ep.begin()


def shoot(url: str, merged_episode: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(url + "/dashboard/login")
        page.screenshot(path=str(out / "login.png"))
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(lambda u: u.endswith("/dashboard/run"))
        page.wait_for_function("() => [...document.querySelectorAll('.chart')].every(c => c.dataset.points !== '0' "
                               "|| c.dataset.title.includes('Drift'))", timeout=20000)
        page.screenshot(path=str(out / "run.png"), full_page=True)
        for name, path, sel in (("clients", "/dashboard/clients", "#clients td a"),
                                ("episodes", "/dashboard/episodes", "#episodes tr[data-status]"),
                                ("bench", "/dashboard/bench", ".chart canvas, main p")):
            page.goto(url + path)
            page.wait_for_selector(sel, timeout=20000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(out / f"{name}.png"), full_page=name != "episodes")
        page.goto(f"{url}/dashboard/trace?episode={merged_episode}")
        page.wait_for_selector(".tokens", timeout=20000)
        page.locator(".tok.t").nth(3).hover()
        page.screenshot(path=str(out / "trace.png"), full_page=True)
        page.select_option("#color-mode", "trainer")
        page.locator(".tok.t").nth(3).hover()
        page.screenshot(path=str(out / "trace_trainer_logprob.png"))
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=900)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="tiny-random: a quick check of the script")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if chromium_path() is None:
        sys.exit("needs chromium: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as tmp:
        rec = task.RECOMMENDED
        cfg = ServerConfig(model=args.model, port=free_port(), data_dir=Path(tmp), lease_seconds=300,
                           observe=ObserveSettings(read_token=TOKEN, bench_history=ROOT / "benchmarks" /
                                                   "bench_history.jsonl"),
                           learner=LearnerSettings(learning_rate=rec.learning_rate),
                           training=TrainingSettings(group_size=4, batch_groups=2, checkpoint_every=0,
                                                     max_staleness=2))
        engine = embedded_engine(args.model, GeneratorSettings(max_batch_size=16), cfg.learner)
        srv = BackgroundServer(SwarmServer(cfg, engine)).start()
        try:
            t0 = time.monotonic()
            asyncio.run(drive(srv, args.steps, args.budget_s))
            print(f"trained {srv.server.counters.training.train_steps} steps in {time.monotonic() - t0:.0f} s")
            rows = srv.server.observe.episodes(EpisodeFilter(status="trained", task_type="add-check"))
            merged = next(r.episode_id for r in rows if srv.server.metrics.trainlog.for_episode(r.episode_id))
            shoot(srv.url, merged, args.out)
        finally:
            srv.stop()
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    main()
