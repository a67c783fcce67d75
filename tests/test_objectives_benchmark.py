"""benchmarks/learning/objectives.py: time to the target on hand-made curves, the aggregator on synthetic run files (a
table and a PNG), the clear error for a vLLM config without vLLM, and one --quick run on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "learning" / "objectives.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("objectives_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_time_to_target_interpolates_the_first_crossing(bench: ModuleType) -> None:
    # 0.5 at 1 min, 0.9 at 2 min: 0.75 is 0.25 / 0.4 of the way, at 1.625 min; the first eval above is at 2
    rising = bench.time_to_target([(0.0, 0.3), (1.0, 0.5), (2.0, 0.9)], 0.75)
    assert rising == {"interpolated": pytest.approx(1.625), "first_eval": 2.0}
    # the FIRST crossing counts, even if the eval dips below later
    dip = bench.time_to_target([(0.0, 0.2), (1.0, 0.8), (2.0, 0.6), (3.0, 0.9)], 0.75)
    assert dip == {"interpolated": pytest.approx(0.55 / 0.6), "first_eval": 1.0}
    # an eval exactly at the target reaches it; a base model already there takes no time
    assert bench.time_to_target([(0.0, 0.5), (2.0, 0.75)], 0.75) == {"interpolated": 2.0, "first_eval": 2.0}
    assert bench.time_to_target([(0.0, 0.8), (1.0, 0.9)], 0.75) == {"interpolated": 0.0, "first_eval": 0.0}
    assert bench.time_to_target([(0.0, 0.3), (5.0, 0.74)], 0.75) == {"interpolated": None, "first_eval": None}


def test_eval_points_and_their_nominal_minutes(bench: ModuleType) -> None:
    assert bench.eval_minutes(5, 60) == [0.0, 1.0, 2.0, 3.0, 4.0, 5]
    assert bench.eval_minutes(2.5, 60) == [0.0, 1.0, 2.0, 2.5]
    nominal = [0.0, 1.0, 2.0, 5.0]
    assert [bench.nominal_minute(m, nominal) for m in (0.0, 1.02, 2.3, 5.01)] == [0.0, 1.0, 2.0, 5.0]


def _run_file(config: str, seed: int, curve: list[tuple[float, float]], *, engine: str = "hf",
              masked: float | None = None, loss: dict[str, Any] | None = None) -> dict[str, Any]:
    nominal = [0.0, 1.0, 2.0, 3.0]
    return {
        "config": config, "seed": seed, "engine": engine, "what": f"{config} (synthetic)",
        "loss": loss or {"aggregation": config}, "model": "smollm2-135m-instruct", "budget_min": 3.0,
        "quick": False, "train_steps": 10 + seed,
        "evals": [{"target_min": n, "train_min": x, "train_steps": i * 3, "reward": y}
                  for i, (n, (x, y)) in enumerate(zip(nominal, curve, strict=True))],
        "step_means": {"mismatch_kl": 1e-3 * (seed + 1), "is_masked_frac": masked, "clip_frac": 0.01},
    }


def test_aggregate_writes_the_table_the_json_and_the_plot(bench: ModuleType, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    files = {
        # reaches 0.75 at 1.5 and 2.5 min (interpolated): mean 2.0; eval at the budget 0.9 and 0.8
        "dapo_seed0": _run_file("dapo", 0, [(0.0, 0.3), (1.0, 0.6), (2.0, 0.9), (3.1, 0.9)]),
        "dapo_seed1": _run_file("dapo", 1, [(0.0, 0.3), (1.05, 0.5), (2.0, 0.7), (3.0, 0.8)]),
        # one seed never reaches it: no mean time, 1 of 2 reached
        "vllm_tis_seed0": _run_file("vllm_tis", 0, [(0.0, 0.2), (1.0, 0.4), (2.0, 0.5), (3.0, 0.6)],
                                    engine="vllm", masked=0.0),
        "vllm_tis_seed1": _run_file("vllm_tis", 1, [(0.0, 0.2), (1.0, 0.5), (2.0, 1.0), (3.0, 1.0)],
                                    engine="vllm", masked=0.02),
    }
    for name, data in files.items():
        (runs / f"{name}.json").write_text(json.dumps(data))
    results = tmp_path / "out" / "objectives.json"

    md = bench.aggregate(runs, results)

    png = results.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    saved = json.loads(results.read_text())
    dapo, tis = saved["summary"]["dapo"], saved["summary"]["vllm_tis"]
    assert dapo["time_to_target_min"]["each"] == [pytest.approx(1.5), pytest.approx(2.5)]
    assert dapo["time_to_target_min"]["mean"] == pytest.approx(2.0)
    assert dapo["time_to_target_min"]["first_eval_each"] == [2.0, 3.0]
    assert dapo["eval_at_budget"] == {"mean": pytest.approx(0.85), "each": [0.9, 0.8]}
    assert tis["time_to_target_min"]["mean"] is None and tis["time_to_target_min"]["reached"] == 1
    assert tis["time_to_target_min"]["each"] == [None, pytest.approx(1.5)]
    assert tis["step_means"]["is_masked_frac"] == pytest.approx(0.01)
    assert dapo["step_means"]["is_masked_frac"] is None  # not recorded: no masking in that config
    # the mean curve: per scheduled point, the seeds' mean minutes and eval
    assert dapo["mean_curve"][1] == [pytest.approx(1.025), pytest.approx(0.55)]
    assert dapo["loss"] == {"aggregation": "dapo"} and len(saved["runs"]) == 4

    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in md.splitlines()[2:] if line.startswith("|")}
    assert list(rows) == ["dapo", "vllm_tis"]  # in the order of the script's table
    assert rows["dapo"][:5] == ["hf", "2", "2.00", "1.50 / 2.50", "0.850"]
    assert rows["dapo"][5] == "0.900 / 0.800" and rows["dapo"][9] == "-"
    # steps to 0.75 on the train-step axis (evals at steps 0, 3, 6, 9): 4.5 and 7.5
    assert dapo["steps_to_target"] == {"mean": pytest.approx(6.0), "each": [pytest.approx(4.5), pytest.approx(7.5)]}
    assert rows["dapo"][6] == "6.0" and rows["vllm_tis"][6] == "-"
    assert rows["vllm_tis"][2] == "— (1/2 reached)" and rows["vllm_tis"][3] == "not reached / 1.50"
    # mean eval after 0: seed 0 (0.4 + 0.5 + 0.6) / 3, seed 1 (0.5 + 1 + 1) / 3
    assert rows["vllm_tis"][8:] == ["1.50e-03", "0.010", "0.667"]
    assert dapo["mean_eval"] == {"mean": pytest.approx((0.8 + 2 / 3) / 2), "each": [pytest.approx(0.8), pytest.approx(2 / 3)]}
    assert md == saved["table"]


def _summary(engine: str, times: list[float | None], evals: list[float]) -> dict[str, Any]:
    reached = [t for t in times if t is not None]
    return {"engine": engine, "seeds": list(range(len(times))),
            "time_to_target_min": {"mean": sum(reached) / len(times) if len(reached) == len(times) else None,
                                   "each": times},
            "eval_at_budget": {"mean": sum(evals) / len(evals), "each": evals}}


def test_a_config_beats_the_default_only_beyond_the_seed_noise_on_every_seed(bench: ModuleType) -> None:
    summary = {
        "dapo": _summary("hf", [1.0, 1.2], [0.90, 0.90]),  # the incumbent; seed sd 0.141
        "grpo": _summary("hf", [0.4, 0.6], [0.90, 0.92]),  # 0.6 min faster on both seeds, eval not lower
        "cispo": _summary("hf", [0.9, 1.1], [0.95, 0.95]),  # 0.1 faster: inside the noise
        "gspo": _summary("hf", [0.7, 1.3], [0.95, 0.95]),  # faster on average, slower on seed 1
        "dr_grpo": _summary("hf", [0.4, 0.6], [0.85, 0.85]),  # faster, but a lower eval at the budget
        "vllm_tis": _summary("vllm", [1.5, 1.7], [0.9, 0.9]),
        "vllm_none": _summary("vllm", [1.0, None], [0.8, 0.9]),  # a seed never reached the target
    }
    noise = bench.seed_noise(summary)
    # pooled over the configs that reached the target on both seeds: variances 0.02, 0.02, 0.02, 0.18, 0.02
    assert noise["hf"] == pytest.approx(0.052 ** 0.5) and noise["vllm"] == pytest.approx(0.02 ** 0.5)
    found = bench.verdicts(summary, noise)
    assert {k: v["beats"] for k, v in found.items()} == {
        "grpo": True, "cispo": False, "gspo": False, "dr_grpo": False, "vllm_none": False}
    assert found["grpo"]["gain_min"] == pytest.approx(0.6) and found["grpo"]["bar_min"] == pytest.approx(2 * noise["hf"])
    assert found["gspo"]["faster_every_seed"] is False and found["dr_grpo"]["eval_not_lower"] is False
    assert "dapo" not in found and "vllm_tis" not in found and found["vllm_none"]["against"] == "vllm_tis"
    assert found["vllm_none"]["why"].startswith("not comparable")
    assert "grpo vs dapo: 0.60 min faster to 0.75 (bar 0.46 faster)" in bench.verdict_lines(noise, found)


def test_aggregate_refuses_mixed_or_foreign_files(bench: ModuleType, tmp_path: Path) -> None:
    curve = [(0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)]
    (tmp_path / "dapo_seed0.json").write_text(json.dumps(_run_file("dapo", 0, curve)))
    quick = {**_run_file("dapo", 1, curve), "quick": True}
    (tmp_path / "dapo_seed1.json").write_text(json.dumps(quick))
    with pytest.raises(SystemExit, match="mixes runs"):
        bench.aggregate(tmp_path, tmp_path / "o.json")
    stale = _run_file("dapo", 1, curve, loss={"aggregation": "other"})
    (tmp_path / "dapo_seed1.json").write_text(json.dumps(stale))
    with pytest.raises(SystemExit, match="different loss configs"):
        bench.aggregate(tmp_path, tmp_path / "o.json")
    (tmp_path / "dapo_seed1.json").write_text(json.dumps({"config": "dapo"}))
    with pytest.raises(SystemExit, match="not a run file"):
        bench.aggregate(tmp_path, tmp_path / "o.json")


def test_every_config_is_a_valid_loss_block(bench: ModuleType, tmp_path: Path) -> None:
    """Each name in the table builds the demo's server settings with exactly its loss block (a typo in a setting
    or a value out of bounds fails here, not an hour into the ablation)."""
    for name, cfg in bench.CONFIGS.items():
        config = bench.build_server_config(name, 1, "tiny-random", tmp_path, 1234, "t", tmp_path / "python")
        assert config.loss.model_dump(mode="json") == cfg.loss, name
        assert config.engine.kind == cfg.engine and config.engine.seed == 1
        assert config.training.batch_groups == 4 and config.training.group_size == 8  # the demo's
        if cfg.engine == "vllm":
            assert config.engine.vllm.python == tmp_path / "python"


def test_a_vllm_config_without_vllm_fails_before_any_run(bench: ModuleType, tmp_path: Path) -> None:
    missing = tmp_path / "no-venv" / "bin" / "python"
    with pytest.raises(SystemExit, match=r"vllm_tis roll out on vLLM.*no-venv/bin/python.*make setup-vllm"):
        bench.main(["--configs", "dapo", "vllm_tis", "--seeds", "0", "--vllm-python", str(missing),
                    "--out-dir", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.server
def test_quick_run_records_the_loss_config_and_the_eval_curve(tiny_model_path: Path, tmp_path: Path,
                                                               bench: ModuleType) -> None:
    """One embedded config, --quick (tiny model, 30 s of training, 4 eval tasks), through the demo's server
    process and scheduled client; then a rerun skips it and the aggregator reads it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(SCRIPT), "--quick", "--configs", "cispo", "--seeds", "3", "--model",
           str(tiny_model_path), "--out-dir", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = tmp_path / "runs" / "cispo_seed3.json"
    run = json.loads(path.read_text())

    assert run["config"] == "cispo" and run["seed"] == 3 and run["quick"] is True
    assert run["loss"] == bench.CONFIGS["cispo"].loss == run["server"]["loss"]  # as the server reported it
    assert run["server"]["engine"]["seed"] == 3 and run["server"]["training"]["batch_groups"] == 1
    assert run["server"]["engine"]["max_batch_size"] == 8  # one group in flight
    assert run["provenance"]["device"] == "cpu" and run["provenance"]["commit"] and run["provenance"]["machine"]
    # evals at 0, every 10 s of training and at the 30 s budget, on the training clock
    assert [e["target_min"] for e in run["evals"]] == pytest.approx([0.0, 1 / 6, 1 / 3, 0.5])
    mins = [e["train_min"] for e in run["evals"]]
    assert mins[0] == 0.0 and mins == sorted(mins) and mins[-1] >= 0.5
    assert all(e["episodes"] == 4 for e in run["evals"])
    assert run["eval_at_budget"] == run["evals"][-1]["reward"]
    # every train step is in the file, from the server's store, with the loss's metrics
    assert run["train_steps"] >= 1 and [s["step"] for s in run["steps"]] == list(range(1, run["train_steps"] + 1))
    assert all("mismatch_kl" in s and "clip_frac" in s for s in run["steps"])
    assert run["step_means"]["clip_frac"] is not None
    assert "cispo, seed 3" in proc.stdout and "eval" in proc.stdout

    before = path.read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "0 runs" in again.stdout and "1 already done" in again.stdout
    assert path.read_text() == before

    md = bench.aggregate(tmp_path / "runs", tmp_path / "objectives.json")
    assert md.splitlines()[2].startswith("| cispo | hf | 1 |")
