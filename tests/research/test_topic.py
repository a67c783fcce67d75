"""From a topic to a study: the offline planner matches the topic's words to the settings table, and an LLM's
design (from a scripted OpenAI-compatible endpoint) is validated, repaired or refused, never crashing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.research.test_llm_planner import FakeOpenAI, fake  # noqa: F401  (the fixture)

from agentjet.apps.research.llm_designer import LLMDesigner
from agentjet.apps.research.program import Findings, OfflineDesigner
from agentjet.apps.research.spec import StudySpec
from agentjet.apps.research.topic import (
    DesignError,
    describe_design,
    offline_design,
    repair_design,
    study_from_design,
)

BASE: dict[str, Any] = {"servers": {"policy": {"model": "tiny-random", "options": {"engine": "null"}}}}

TOPICS = {
    "Does a larger GRPO group help on addition at this model size?": "server.group-size",
    "Which learning rate is best for the calculator task?": "server.learning-rate",
    "Does a KL penalty to the reference model keep training stable?": "server.kl-coef",
}


def test_the_offline_planner_gives_different_topics_different_knobs() -> None:
    chosen = {}
    for topic, knob in TOPICS.items():
        design = offline_design(topic, cpus=2)
        names = [k.name for k in design.knobs]
        assert names[0] == knob, (topic, names)
        assert design.knobs[0].matched and all(w in design.knobs[0].reason for w in design.knobs[0].matched)
        spec = study_from_design(design, BASE)
        assert isinstance(spec, StudySpec) and spec.question == topic
        assert spec.default_params() is not None  # the setting's default is the baseline
        chosen[topic] = tuple(names)
    assert len(set(chosen.values())) == 3
    assert offline_design("Which learning rate is best for the calculator task?").task == "calculator"
    lr = offline_design("Which learning rate is best for the calculator task?").knobs[0]
    assert lr.low == 2.5e-6 and lr.high == 4e-5 and lr.log and lr.default == 1e-5  # around the default 1e-5


def test_a_topic_that_matches_no_setting_is_refused_with_a_message() -> None:
    try:
        offline_design("Quux zorp blarg?")
    except DesignError as exc:
        assert "no setting matches" in str(exc)
    else:
        raise AssertionError("expected a DesignError")


def good_design() -> dict[str, Any]:
    return {"question": "Does a larger group help?", "metric": "eval_reward", "metric_reason": "held out",
            "task": "addition", "task_reason": "named",
            "knobs": [{"name": "server.group-size", "type": "choice", "choices": [4, 8], "reason": "the topic"}],
            "seeds": 2, "seeds_reason": "noise", "trials": 4, "budget_reason": "small"}


def test_a_scripted_llm_designs_a_valid_study(fake: FakeOpenAI) -> None:  # noqa: F811
    fake.replies = [f"```json\n{json.dumps(good_design())}\n```"]
    notes: list[str] = []
    design = LLMDesigner("Does a larger group help?", fake.url, timeout_s=10, note=notes.append).first(
        "Does a larger group help?", 4)
    assert design.planner == "llm" and [k.name for k in design.knobs] == ["server.group-size"]
    assert design.knobs[0].choices == [4, 8] and not notes
    spec = study_from_design(design, BASE)
    assert spec.space["server.group-size"].choices == [4, 8] and spec.seeds == 2 and spec.budget.trials == 4
    prompt = fake.requests[0]["messages"][1]["content"]
    assert "server.group-size" in prompt and "episodes per GRPO group" in prompt and "addition" in prompt


def test_bad_llm_designs_are_repaired_or_refused(fake: FakeOpenAI) -> None:  # noqa: F811
    bad = good_design()
    bad["knobs"] = [{"name": "server.warp-speed", "type": "float", "low": 1, "high": 2},
                    {"name": "lr", "type": "float", "low": -1.0, "high": 5.0},
                    {"name": "server.estimator", "type": "choice", "choices": ["grpo", "ppo", "rloo"]}]
    design, notes = repair_design(bad)
    assert design is not None and [k.name for k in design.knobs] == ["server.learning-rate", "server.estimator"]
    lr = design.knobs[0]
    assert 0 < lr.low < lr.high < 1 and lr.log
    assert design.knobs[1].choices == ["grpo", "rloo"]
    text = " ".join(notes)
    assert "dropped unknown setting 'server.warp-speed'" in text and "clamped" in text and "'ppo'" in text
    study_from_design(design, BASE)

    refused, notes = repair_design({**good_design(), "knobs": [{"name": "server.nope", "type": "float"}]})
    assert refused is None and "refused" in notes[-1]
    assert repair_design("not an object")[0] is None

    # malformed JSON twice, then an unknown-only design: both fall back to the offline planner with a note
    fake.replies = ["no json here", "{broken", json.dumps({**good_design(), "knobs": [{"name": "x.y"}]})]
    notes = []
    designer = LLMDesigner("Does a larger GRPO group help?", fake.url, timeout_s=10, note=notes.append)
    first = designer.first("Does a larger GRPO group help?", 4)
    assert first.planner == "offline" and first.knobs[0].name == "server.group-size"
    assert any("asking once more" in n for n in notes) and any("refused" in n for n in notes)
    second = designer.first("Does a larger GRPO group help?", 4)
    assert second.planner == "offline" and any("dropped unknown setting 'x.y'" in n for n in notes)
    assert len(fake.requests) == 3


def results(means: dict[int, list[float]]) -> list[dict[str, Any]]:
    import statistics

    return [{"config": f"c{i}", "params": {"server.group-size": g}, "mean": statistics.fmean(v),
             "sd": statistics.stdev(v) if len(v) > 1 else None, "n_done": len(v), "values": v}
            for i, (g, v) in enumerate(means.items())]


def test_the_next_study_follows_from_the_last_results() -> None:
    topic = "Does a larger GRPO group help on addition at this model size?"
    design = offline_design(topic, trials=12, cpus=2)
    spec = study_from_design(design, BASE)
    designer = OfflineDesigner(topic)
    # group size 8 clearly ahead of the default 4, on the edge of {2, 4, 8}: past the edge, 8 against 16
    clear = designer.next(design, Findings(spec, results({4: [0.40, 0.42], 2: [0.30, 0.31], 8: [0.70, 0.72]})), "", 8)
    assert clear.action == "extend" and clear.design is not None
    assert clear.design.knobs[0].choices == [8, 16] and clear.design.knobs[0].default == 8
    assert "0.710" in clear.cites and "0.410" in clear.cites and "beats the default" in clear.conclusion
    # clearly ahead inside the range (4 of {2, 4, 8}, the default 2): no edge, nothing to narrow: held at 4, and
    # the next setting the topic matched is added, never a sibling of the knob (min-group-size, group-timeout)
    mid = designer.next(design, Findings(spec.model_copy(update={"space": {"server.group-size": spec.space[
        "server.group-size"].model_copy(update={"default": 2})}}),
        results({2: [0.40, 0.42], 4: [0.70, 0.72], 8: [0.50, 0.51]})), "", 8)
    assert mid.action == "add_knob" and mid.design is not None and mid.design.knobs[0].choices == [4]
    assert "group" not in mid.design.knobs[1].name
    # all inside the noise: the same knob with more seeds
    noisy = designer.next(design, Findings(spec, results({4: [0.40, 0.60], 2: [0.45, 0.55], 8: [0.50, 0.52]})), "", 8)
    assert noisy.action == "more_seeds" and noisy.design is not None and noisy.design.seeds == 4
    assert noisy.design.knobs[0].choices == [4, 8]  # the best (8) and the default (4) again
    assert "spread ±0.141" in noisy.cites
    assert noisy.design.trials == 8 and noisy.design.seeds_reason.startswith("4 seeds per configuration (2 before)")
    # replicates are not pruned (a spread of the lucky seeds is no spread); a new comparison is again
    assert not study_from_design(noisy.design, BASE).early_stop.enabled and "Early stopping.** off" in \
        describe_design(noisy.design)
    assert clear.design.prune and study_from_design(clear.design, BASE).early_stop.min_delta == 0.15
    # the extended study's default is the best so far; clearly better again at 16: further still
    ext_spec = study_from_design(clear.design, BASE)
    again = designer.next(clear.design, Findings(ext_spec, results({8: [0.70, 0.71], 16: [0.90, 0.91]})), "", 8)
    assert again.action == "extend" and again.design is not None and again.design.knobs[0].choices == [16, 32]
    # at the most seeds, inside the noise, but pruning left 16 with two finished runs of four: the two again,
    # none pruned (the program of docs/research/ stopped here before this rule)
    four = clear.design.model_copy(update={"seeds": 4})
    short = results({8: [0.75, 0.70, 0.80, 0.73], 16: [0.82, 0.70]})
    retry = designer.next(four, Findings(study_from_design(four, BASE), short), "", 8)
    assert retry.action == "more_seeds" and retry.design is not None and retry.design.seeds == 4
    assert not retry.design.prune and "2 finished run(s)" in retry.why
    done = designer.next(retry.design, Findings(study_from_design(retry.design, BASE), short), "", 8)
    assert done.action == "stop" and "do not differ beyond the noise" in done.conclusion
    # one seed each and the default best (tied): the runner-up is named, and it is what runs again
    tied = designer.next(design, Findings(spec, results({4: [0.591], 2: [0.318], 8: [0.591]})), "", 10)
    assert tied.action == "more_seeds" and tied.design is not None and tied.design.knobs[0].choices == [4, 8]
    assert 'best {"server.group-size": 4}: 0.591 (n=1), the default; runner-up {"server.group-size": 8}' in tied.why
    # the default clearly best: hold it and add the next setting the topic matched
    best_default = designer.next(design, Findings(spec, results({4: [0.80, 0.81], 2: [0.30, 0.31], 8: [0.50, 0.52]})), "", 8)
    assert best_default.action == "add_knob" and best_default.design is not None
    assert len(best_default.design.knobs) == 2 and best_default.conclusion
    study_from_design(best_default.design, BASE)


def test_a_topic_on_the_command_line_is_designed_shown_and_written_as_spec_yaml(tmp_path: Path) -> None:
    from rich.console import Console

    from agentjet.apps.research.app import is_topic, topic_main
    from agentjet.apps.research.spec import load_study

    topic = "Which learning rate is best for the calculator task?"
    assert is_topic(topic, []) and not is_topic(topic, ["server.lr=1e-5..1e-4"])
    console = Console(record=True, width=200)
    out = tmp_path / "study"
    code = topic_main(topic, None, ["steps=2"], {"seeds": 1}, out, program=False, hours=None, dry_run=True,
                      console=console)
    assert code == 0, console.export_text()
    shown = console.export_text()
    assert "server.learning-rate" in shown and "Matched words: ['learn', 'rat']" in shown
    spec = load_study(out / "spec.yaml")  # a person can rerun it as a study file
    assert spec.question == topic and spec.client.task == "calculator" and spec.client.steps == 2
    assert spec.seeds == 1 and list(spec.space) == ["server.learning-rate"]
    assert spec.base.servers["policy"]["model"] == "smollm2-135m-instruct"  # the default base
    assert (out / "design.json").exists() and "Matched words" in (out / "design.md").read_text()
    assert not (out / "study.json").exists()  # a dry run runs nothing


@pytest.mark.parametrize("raw", [
    None, 3, [], {}, {"knobs": 7}, {"knobs": "abc"}, {"knobs": [None, 1, "x", {"name": 5}]},
    {**good_design(), "knobs": [{"name": "server.group-size", "choices": 4}]},
    {**good_design(), "knobs": [{"name": "server.lr", "low": "fast", "high": [1]}]},
    {**good_design(), "task": ["addition"], "seeds": "many"},
    {**good_design(), "knobs": [{"name": "server.kl-coef", "low": 5.0, "high": 0.0, "default": 9}]},
])
def test_no_design_crashes_the_repair(raw: Any) -> None:
    design, notes = repair_design(raw)
    assert design is not None or (notes and "refused" in notes[-1])
    if design is not None:
        study_from_design(design, BASE)


@pytest.mark.parametrize("raw", [
    None, "stop", {}, {"action": "jump", "why": "x", "cites": "1"}, {"action": "narrow", "why": "x", "cites": "1"},
    {"action": "narrow", "why": "x", "cites": "1", "design": {"knobs": 3}},
    {"action": ["stop"], "why": "x", "cites": "1"}, {"action": "stop", "why": "", "cites": "1"},
])
def test_a_bad_next_step_is_refused_not_raised(raw: Any) -> None:
    designer = LLMDesigner("t", "http://127.0.0.1:9/v1", timeout_s=1)
    last = offline_design("Does a larger GRPO group help?")
    assert designer._checked_step(raw, last) is None
    ok = designer._checked_step({"action": "more_seeds", "why": "noise", "cites": "±0.1",
                                 "design": {"seeds": 4}}, last)
    assert ok is not None and ok.design is not None and ok.design.seeds == 4
    designer.close()


def test_the_programs_hours_cap_each_study(tmp_path: Path) -> None:
    from agentjet.apps.research.program import ProgramBudget, ProgramState, plan_next

    state = ProgramState(topic="Does a larger GRPO group help?", budget=ProgramBudget(hours=1), elapsed_s=1800)
    entry = plan_next(state, tmp_path, OfflineDesigner(state.topic), lambda d: study_from_design(d, BASE), None,
                      lambda _: None)
    assert entry is not None and entry.design.minutes == 30
    assert study_from_design(entry.design, BASE).budget.minutes == 30
    assert (tmp_path / entry.dir / "design.md").exists() and "Asked" in state.log[0]


def test_a_best_value_on_the_edge_of_a_number_range_moves_the_range_past_it() -> None:
    from agentjet.apps.research.program import extended

    lr = offline_design("Which learning rate is best for the calculator task?", trials=8, cpus=2).knobs[0]
    assert (lr.name, lr.low, lr.high, lr.log) == ("server.learning-rate", 2.5e-6, 4e-5, True)
    top = extended(lr, 4e-5)
    assert top is not None and top.default == 4e-5 and top.low == pytest.approx(2e-5) and top.high == pytest.approx(6.4e-4)
    bottom = extended(lr, 2.6e-6)
    assert bottom is not None and bottom.high == pytest.approx(5.2e-6) and bottom.low < 2.5e-6
    assert extended(lr, 1e-5) is None  # inside the range: narrow, not extend
