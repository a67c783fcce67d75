"""Issue 51's runner (``benchmarks/learning/wave51.py``): every job is one command under the CPU lock, resumable
(``vs_trl.py --resume``; a demo job done once its results file is there), the levels' files say ``levels``, and the
3-seed summaries are the mean and standard error of each seed's figures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def wave51() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wave51_test", ROOT / "benchmarks" / "learning" / "wave51.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_jobs_cover_the_issue_each_resumable_and_named_by_its_task() -> None:
    w = wave51()
    jobs = w.jobs()
    names = [j.name for j in jobs]
    assert len(set(names)) == len(names) and len({j.out for j in jobs}) == len(jobs)
    trl = [j for j in jobs if j.name.startswith("a-")]
    assert {j.cmd[j.cmd.index("--task") + 1] for j in trl} == {w.CHAIN_SUM, w.PRODUCTS}
    for j in (j for j in jobs if j.demo_dir is None):
        assert "--resume" in j.cmd and j.cmd[j.cmd.index("--budget-min") + 1] == "15"
        assert j.cmd[j.cmd.index("--seeds") + 1:j.cmd.index("--seeds") + 4] == ["0", "1", "2"]
    levels = [j for j in jobs if j.name.startswith(("b-", "c-"))]
    assert len(levels) == 2 + 6 and all("levels" in j.out.name for j in levels)
    assert all("--levels" in j.cmd for j in levels if j.demo_dir is not None)
    groups = {j.group for j in jobs if j.group}
    assert groups == {"c-levels_gcd", "c-levels_letter_counting", "d-chain_sum", "d-products", "d-cocktail",
                      "d-guess_win"}
    assert all(sorted(j.extra["seed"] for j in jobs if j.group == g) == [0, 1, 2] for g in groups)
    assert 10 < sum(j.hours for j in jobs) < 16


def test_a_job_is_done_by_its_results_file_and_the_groups_are_summarised(tmp_path: Path, monkeypatch) -> None:
    w = wave51()
    out = tmp_path / "vs.json"
    job = w.Job("a-x", ["true"], out, 1.0)
    assert not job.done()
    out.write_text(json.dumps({"complete": True, "runs": [{"seed": 0}, {"seed": 1}]}))
    assert not job.done()  # seed 2 missing: --resume runs it
    out.write_text(json.dumps({"complete": True, "runs": [{"seed": s} for s in (0, 1, 2)]}))
    assert job.done()

    def result(before: float, after: float, level: int) -> dict:
        return {"eval_before": before, "eval_after": after, "train_steps": 5, "eval_by_type": [],
                "levels": {"highest": {"gcd": level}},
                "evals": [{"levels": {"gcd": level}, "level_rewards": {"gcd": after / 2}}]}

    members = []
    for seed, (b, a, lv) in enumerate([(0.2, 0.3, 1), (0.2, 0.5, 2), (0.3, 0.4, 1)]):
        path = tmp_path / f"levels_gcd_seed{seed}.json"
        path.write_text(json.dumps(result(b, a, lv)))
        members.append(w.Job(f"c-levels_gcd-seed{seed}", ["true"], path, 0.2, demo_dir=tmp_path, group="c-levels_gcd",
                             extra={"task": "rg:gcd", "seed": seed}))
    (written,) = w.summarize(members)
    summary = json.loads(written.read_text())
    assert written.name == "levels_gcd_3seeds.json" and summary["seeds"] == [0, 1, 2]
    rise = summary["summary"]["rise"]
    assert rise["mean"] == pytest.approx(0.5 / 3) and rise["n"] == 3
    assert rise["se"] == pytest.approx(0.2 / 3, abs=1e-6)  # stdev(0.1, 0.3, 0.1) = 0.2 / sqrt(3), over sqrt(3)
    assert summary["summary"]["highest_level"]["mean"] == pytest.approx(4 / 3)


def test_rule_d_holds_only_above_two_standard_errors_and_a_summary_names_the_commands_run(tmp_path: Path) -> None:
    w = wave51()
    assert w.rule_d({"mean": 0.57, "se": 0.115}) == "holds"
    assert w.rule_d({"mean": 0.2, "se": 0.1}) == "not shown"  # exactly two standard errors: not more
    assert w.rule_d({"mean": 0.3, "se": None}) == "not shown"  # one seed has no standard error
    members = []
    for seed, after in enumerate([0.5, 0.6, 0.7]):
        path = tmp_path / f"products_seed{seed}.json"
        path.write_text(json.dumps({"eval_before": 0.1, "eval_after": after, "train_steps": 9, "eval_by_type": [],
                                    "wave51": {"command": f"ajet demo --seed {seed} --out-dir /elsewhere"}}))
        members.append(w.Job(f"d-products-seed{seed}", ["now", "different"], path, 0.2, demo_dir=tmp_path,
                             group="d-products", extra={"task": "rg:products", "seed": seed}))
    (written,) = w.summarize(members)
    summary = json.loads(written.read_text())
    assert summary["verdict"] == "holds"  # rise 0.5 ± 0.058
    assert summary["commands"] == [f"ajet demo --seed {s} --out-dir /elsewhere" for s in (0, 1, 2)]


def test_rule_b_is_written_into_a_finished_levels_file_from_its_own_figures(tmp_path: Path) -> None:
    w = wave51()

    def arm(uniform: float, steps: float, highest: list[int | None], at2: float) -> dict:
        return {"uniform_share_after_5": uniform, "steps_after_5": steps, "fall_from_best_by_seed": [0.0] * 3,
                "late_mean_eval": 0.9, "highest_level_by_seed": highest, "final_by_level": {"2": at2}}

    ladders = {"levels": {"ladders": {"addition": {"start": 0, "top": 4}}}}
    runs = [{"side": side, "seed": s, **(ladders if side.endswith("levels") else {})}
            for s in (0, 1, 2) for side in ("agentjet", "agentjet:levels")]
    out = tmp_path / "levels_addition_15min.json"
    out.write_text(json.dumps({"complete": True, "runs": runs, "summary": {
        "agentjet": arm(0.85, 8, [None] * 3, 0.30), "agentjet:levels": arm(0.45, 13, [2, 2, 3], 0.40)}}))
    job = w.Job("b-addition", ["true"], out, 2.0)
    assert w.judge_levels([job]) == [out]
    checks = json.loads(out.read_text())["summary"]["levels_checks"]
    assert checks["win"] and checks["progress"]["level"] == 2
    assert w.judge_levels([job]) == []  # already there: the file is left as it is
