"""The package as a user installs it, with nothing imported from the source tree.

- **The server extra** (``agentjet[server]``): a wheel built from this tree, installed into a clean venv, runs
  ``ajet --version``, ``ajet --help``, ``ajet model tiny-random``, a 2-step training through ``ajet server`` and
  ``ajet run``, and ``ajet export`` of the run. No download: the wheel is built without build isolation, and the
  venv sees this interpreter's packages (torch included, as the README pins it) through a path file, so pip finds
  every dependency already installed (``--no-index``: a missing one fails the install instead of fetching it).
- **The base install** (``agentjet``, no extra): the same wheel in a venv of its own, its dependencies installed
  for real from the package index (none of this interpreter's), is a working client: no torch, ``ajet run`` and
  ``ajet status`` against a server on the tiny model (run from this venv), an episode begun, a chat call, an end
  with a reward that the server trains on; and ``ajet server`` says which extra it needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import httpx
import pytest

from agentjet import __version__
from agentjet.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = '''
import random


async def workflow(task, ep):
    reply = await ep.openai().chat.completions.create(
        model="agent", messages=[{"role": "user", "content": task["question"]}], max_tokens=6)
    return random.random() + len(reply.choices[0].message.content or "") * 0.0
'''


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(out: Path) -> Path:
    """From a copy of the project's files: an in-tree build would leave build/ behind, whose stale copies of
    deleted modules a later build packs again."""
    tree = out.parent / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(tree)], dict(os.environ), tree, timeout=300)
    (wheel,) = out.glob("agentjet-*.whl")
    return wheel


def clean_venv(where: Path) -> Path:
    """A venv whose ``site-packages`` also reads this interpreter's (torch, transformers, pip...) after its own,
    and not the source tree. No bundled pip: its older bundled setuptools would shadow the one torch needs."""
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(where)
    py = where / "bin" / "python"
    own = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], {}, where).strip()
    (Path(own) / "zz_parent_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_wheel(tmp_path_factory.mktemp("wheel") / "dist")
    assert built.name == f"agentjet-{__version__}-py3-none-any.whl"
    return built


def venv_env(py: Path, agentjet_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return env | {"AGENTJET_HOME": str(agentjet_home), "HF_HUB_OFFLINE": "1",
                  "PATH": f"{py.parent}{os.pathsep}{env.get('PATH', '')}"}


@pytest.mark.server
def test_wheel_installs_into_a_clean_venv_and_trains(tmp_path: Path, agentjet_home: Path, wheel: Path) -> None:
    py = clean_venv(tmp_path / "venv")
    env = venv_env(py, agentjet_home)
    work = tmp_path / "work"
    work.mkdir()
    run([str(py), "-m", "pip", "install", "--no-index", "-q", f"{wheel}[server]"], env, work, timeout=300)
    ajet = str(py.parent / "ajet")
    where = run([str(py), "-c", "import agentjet; print(agentjet.__file__)"], env, work).strip()
    assert where.startswith(str(tmp_path / "venv")), where  # the installed package, not the source tree
    assert run([ajet, "--version"], env, work).strip() == f"agentjet {__version__}"
    assert {"server", "run", "model", "export"} <= set(run([ajet, "--help"], env, work).split())
    model_dir = run([ajet, "model", "tiny-random"], env, work).strip()
    assert (Path(model_dir) / "config.json").exists()

    (work / "wf.py").write_text(WORKFLOW)
    (work / "tasks.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"what is {i} + 1?"})
                                              + "\n" for i in range(6)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "server.log").open("w")
    server = subprocess.Popen(
        [ajet, "server", "--model", "tiny-random", "--port", str(port), "--data-dir", str(work / "data"),
         "--device", "cpu", "--group-size", "2", "--batch-groups", "1", "--no-drop-uniform-groups",
         "--max-tokens", "6", "--checkpoint-every", "1"], env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (work / "server.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the installed server did not start"
            time.sleep(0.2)
        run([ajet, "run", "wf.py:workflow", "--server", url, "--dataset", "tasks.jsonl", "--group-size", "2",
             "--concurrency", "4"], env, work, timeout=180)
        deadline = time.monotonic() + 120
        while (steps := httpx.get(f"{url}/swarm/v1/status", timeout=5).json()["train_steps"]) < 2:
            assert time.monotonic() < deadline, f"only {steps} train steps"
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    assert list((work / "data" / "checkpoints").glob("step-*")), "no checkpoint written"
    run([ajet, "export", str(work / "data"), str(work / "model")], env, work)
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in (work / "model").iterdir()}


CLIENT = '''
import asyncio, json, sys

from agentjet import SwarmClient


async def main(url: str) -> None:
    rewards = []
    async with SwarmClient(url, client_id="base-install") as swarm:
        for i, reward in enumerate((1.0, 0.0)):  # one group of two: unequal rewards, so the server trains on it
            async with swarm.episode(task_id="t-base", task_type="base") as ep:
                reply = await ep.openai().chat.completions.create(
                    model="agent", messages=[{"role": "user", "content": f"say {i}"}], max_tokens=4)
                assert reply.choices[0].message.content is not None
                ep.reward(reward)
            rewards.append(reward)
    heavy = sorted(m for m in ("torch", "transformers", "fastapi", "uvicorn") if m in sys.modules)
    server_side = sorted(m for m in sys.modules if m.startswith(("agentjet.server", "agentjet.settings")))
    print(json.dumps({"rewards": rewards, "heavy": heavy, "server_side": server_side}))


asyncio.run(main(sys.argv[1]))
'''


def base_venv(where: Path) -> Path:
    """A venv that sees none of this interpreter's packages, with its own pip (from ensurepip)."""
    venv.EnvBuilder(system_site_packages=False, with_pip=True, symlinks=True).create(where)
    return where / "bin" / "python"


@pytest.mark.slow  # the base dependencies come from the package index (seconds with pip's cache, a minute without)
@pytest.mark.server
def test_the_base_install_alone_is_a_client(tmp_path: Path, agentjet_home: Path, wheel: Path, make_server) -> None:
    py = base_venv(tmp_path / "base")
    env = venv_env(py, agentjet_home)
    work = tmp_path / "work"
    work.mkdir()
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], env, work, timeout=600)
    installed = {line.split("==")[0].lower() for line in run([str(py), "-m", "pip", "freeze"], env, work).split()}
    assert {"agentjet", "httpx", "pydantic", "openai", "typer", "tenacity"} <= installed, installed
    assert not installed & {"torch", "transformers", "fastapi", "uvicorn", "safetensors", "tokenizers"}, installed
    where = run([str(py), "-c", "import agentjet; print(agentjet.__file__)"], env, work).strip()
    assert where.startswith(str(tmp_path / "base")), where  # the installed package, not the source tree
    ajet = str(py.parent / "ajet")
    assert {"server", "run", "status"} <= set(run([ajet, "--help"], env, work).split())
    refused = subprocess.run([ajet, "server", "--model", "tiny-random"], env=env, cwd=work, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "pip install 'agentjet[server]'" in refused.stdout, refused

    srv = make_server(engine="tiny", training={"group_size": 2, "batch_groups": 1, "drop_uniform_groups": False})
    (work / "client.py").write_text(CLIENT)
    got = json.loads(run([str(py), "client.py", srv.url], env, work, timeout=180).strip().splitlines()[-1])
    assert got == {"rewards": [1.0, 0.0], "heavy": [], "server_side": []}, got
    (work / "wf.py").write_text(WORKFLOW)
    (work / "tasks.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"what is {i} + 1?"})
                                              + "\n" for i in range(2)))
    out = run([ajet, "run", "wf.py:workflow", "--server", srv.url, "--dataset", "tasks.jsonl", "--group-size", "2",
               "--concurrency", "4"], env, work, timeout=180)
    assert "4 episodes, 0 failed" in out, out
    deadline = time.monotonic() + 120
    while (status := httpx.get(f"{srv.url}/swarm/v1/status", timeout=5).json())["train_steps"] < 3:
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["task_types"]["base"] == {"episodes": 2, "reward_mean": 0.5}, status["task_types"]
    assert "base-install" in status["clients"], status["clients"]
    shown = run([ajet, "status", "--server", srv.url], env, work)
    assert "train" in shown.lower() and status["model"] in shown, shown
