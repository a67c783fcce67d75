"""Study files and --space items: validation with errors that name the field, clamping, the trial spec."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentjet.apps.research.executor import TrialTemplate
from agentjet.apps.research.spec import (
    Param,
    ParamType,
    StudySpec,
    StudySpecError,
    load_study,
    parse_space_item,
    spec_from_args,
)
from agentjet.apps.research.state import StudyState

BASE = {"servers": {"policy": {"model": "tiny-random", "options": {"engine": "null", "group-size": 4}}}}


def make_spec(**over) -> StudySpec:
    raw = {"question": "which lr?", "base": BASE,
           "space": {"server.lr": {"type": "float", "low": 1e-5, "high": 1e-4, "log": True, "default": 2e-5},
                     "server.group-size": {"type": "choice", "choices": [4, 8]}},
           **over}
    return StudySpec.model_validate(raw)


def test_param_clamps_numbers_and_refuses_unoffered_choices() -> None:
    lr = Param(type=ParamType.FLOAT, low=1e-5, high=1e-4, log=True)
    assert lr.clamp(1.0) == 1e-4 and lr.clamp(0) == 1e-5 and lr.clamp("3e-5") == pytest.approx(3e-5)
    with pytest.raises(ValueError, match="not a number"):
        lr.clamp("fast")
    with pytest.raises(ValueError, match="not a number"):
        lr.clamp(True)
    steps = Param(type=ParamType.INT, low=1, high=10)
    assert steps.clamp(3.6) == 4 and isinstance(steps.clamp(3.6), int) and steps.clamp(99) == 10
    size = Param(type=ParamType.CHOICE, choices=[4, 8])
    assert size.clamp(8.0) == 8
    with pytest.raises(ValueError, match="not one of"):
        size.clamp(6)
    flag = Param(type=ParamType.CHOICE, choices=[True, False])
    with pytest.raises(ValueError):
        flag.clamp(1)  # 1 is not True here
    assert lr.grid_points() == pytest.approx([1e-5, 10 ** -4.5, 1e-4])


@pytest.mark.parametrize("fields, message", [
    ({"type": "float", "low": 1}, "needs `low` and `high`"),
    ({"type": "float", "low": 2, "high": 1}, "must be below"),
    ({"type": "float", "low": 0, "high": 1, "log": True}, "log-scale parameter needs `low` > 0"),
    ({"type": "choice", "choices": []}, "non-empty"),
    ({"type": "choice", "choices": [4, 8], "default": 6}, "default value 6 is outside"),
    ({"type": "int", "low": 1.5, "high": 3}, "integer"),
])
def test_param_errors_say_what_is_wrong(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Param.model_validate(fields)


def test_study_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "study.yaml"
    bad.write_text("question: q\nbase: {servers: {a: {model: tiny-random}}}\nspace:\n  lr: {type: float, low: 1, high: 2}\n")
    with pytest.raises(StudySpecError, match=r"space name 'lr' must start with `server.` or `client.`"):
        load_study(bad)
    bad.write_text("question: q\nbase: {servers: {a: {model: tiny-random}}}\n"
                   "space:\n  client.tempreature: {type: float, low: 0.1, high: 1}\n")
    with pytest.raises(StudySpecError, match="no setting 'tempreature'"):
        load_study(bad)
    bad.write_text("question: q\nbase: {servers: {a: {}, b: {}}}\nspace:\n  server.lr: {type: float, low: 0.1, high: 1}\n")
    with pytest.raises(StudySpecError, match="name the watched one"):
        load_study(bad)
    bad.write_text("question: q\nbase: {servers: {a: {}}}\nbudget: {}\n"
                   "space:\n  server.lr: {type: float, low: 0.1, high: 1}\n")
    with pytest.raises(StudySpecError, match="budget"):
        load_study(bad)
    bad.write_text("question: q\nbase: {servers: {a: {}}}\nseeds: 3\nbudget: {trials: 2}\n"
                   "space:\n  server.lr: {type: float, low: 0.1, high: 1}\n")
    with pytest.raises(StudySpecError, match=r"budget.trials \(2\) is below seeds \(3\)"):
        load_study(bad)
    with pytest.raises(StudySpecError, match="cannot read"):
        load_study(tmp_path / "missing.yaml")


def test_base_may_be_a_swarm_file_next_to_the_study(tmp_path: Path) -> None:
    (tmp_path / "swarm.yaml").write_text("servers:\n  policy: {model: tiny-random, port: 10086}\n")
    study = tmp_path / "study.yaml"
    study.write_text("question: q\nbase: swarm.yaml\nspace:\n  server.lr: {type: float, low: 1.0e-5, high: 1.0e-4}\n")
    spec = load_study(study)
    assert spec.primary == "policy" and spec.base.servers["policy"]["model"] == "tiny-random"


def test_space_items_from_the_command_line(tmp_path: Path) -> None:
    name, p = parse_space_item("server.lr=1e-5..1e-4:log:default=2e-5")
    assert name == "server.lr" and p.type is ParamType.FLOAT and p.log and p.default == 2e-5
    _, p = parse_space_item("server.group-size=4,8")
    assert p.type is ParamType.CHOICE and p.choices == [4, 8]
    _, p = parse_space_item("client.steps=2..6")
    assert p.type is ParamType.INT and (p.low, p.high) == (2, 6)
    _, p = parse_space_item("server.estimator=grpo,rloo")
    assert p.choices == ["grpo", "rloo"]
    for bad in ("server.lr", "server.lr=1..x", "server.lr=1e-5..1e-4:loog", "server.lr=4,8:int"):
        with pytest.raises(StudySpecError, match="--space"):
            parse_space_item(bad)
    (tmp_path / "swarm.yaml").write_text("servers:\n  policy: {model: tiny-random, port: 10086}\n")
    spec = spec_from_args("q?", tmp_path / "swarm.yaml", ["server.lr=1e-5..1e-4:log"], {"seeds": 2})
    assert spec.seeds == 2 and spec.space["server.lr"].log


def test_default_params_come_from_defaults_then_the_base_options() -> None:
    spec = make_spec()
    assert spec.default_params() == {"server.lr": 2e-5, "server.group-size": 4}  # group-size from base options
    no_default = make_spec(space={"server.lr": {"type": "float", "low": 1e-5, "high": 1e-4}})
    assert no_default.default_params() is None


def test_the_digest_ignores_the_budget_but_not_the_space() -> None:
    a, b = make_spec(), make_spec(budget={"trials": 99}, parallel=3)
    assert a.digest() == b.digest()
    c = make_spec(seeds=3)
    assert a.digest() != c.digest()


def test_trial_swarm_puts_server_settings_on_fresh_ports_and_uses_the_builtin_client(tmp_path: Path) -> None:
    spec = make_spec()
    state = StudyState(digest="x", created_at=0)
    state.add_config({"server.lr": 3e-5, "server.group-size": 8}, "grid", "test", seeds=1)
    swarm = TrialTemplate.of(spec).swarm(state.trials[0], tmp_path / "a1", {"policy": 45678})
    server = swarm["servers"]["policy"]
    assert server["port"] == 45678 and server["data_dir"] == str(tmp_path / "a1" / "server-policy")
    assert server["options"] == {"engine": "null", "group-size": 8, "lr": 3e-5}
    cmd = swarm["clients"]["trial"]["command"]
    assert cmd[:3] == [sys.executable, "-m", "agentjet.apps.research.trial_client"]
    assert cmd[cmd.index("--server") + 1] == "http://127.0.0.1:45678"


def test_trial_swarm_fills_placeholders_of_custom_clients(tmp_path: Path) -> None:
    base = {**BASE, "clients": {"mine": {"command": ["python", "agent.py", "--url", "{server_url}", "--dir",
                                                     "{trial_dir}", "--seed={seed}"]}}}
    spec = make_spec(base=base, space={"client.temperature": {"type": "float", "low": 0.1, "high": 1.0}})
    state = StudyState(digest="x", created_at=0)
    state.add_config({"client.temperature": 0.5}, "grid", "test", seeds=2)
    swarm = TrialTemplate.of(spec).swarm(state.trials[1], tmp_path, {"policy": 1234})
    client = swarm["clients"]["mine"]
    assert client["command"] == ["python", "agent.py", "--url", "http://127.0.0.1:1234", "--dir", str(tmp_path),
                                 "--seed=1"]
    assert client["env"]["AJET_TRIAL_PARAMS"] == '{"temperature": 0.5}' and client["env"]["AJET_TRIAL_SEED"] == "1"


def test_command_line_overrides_apply_to_a_question_and_to_a_study_file(tmp_path: Path) -> None:
    from agentjet.apps.research.app import resolve_spec

    swarm = tmp_path / "swarm.yaml"
    swarm.write_text("servers:\n  policy: {model: tiny-random, port: 10086}\n")
    spec = resolve_spec("Is 3e-5 better?", swarm, ["server.lr=1e-5..1e-4:log"], ["steps=3", "task=addition"],
                        {"seeds": 2, "budget.minutes": 30, "planner.kind": "random"})
    assert (spec.seeds, spec.budget.minutes, spec.budget.trials, spec.planner.kind.value) == (2, 30, 8, "random")
    assert spec.client.steps == 3 and spec.question == "Is 3e-5 better?"
    study = tmp_path / "study.yaml"
    study.write_text(f"question: q\nbase: {swarm.name}\nbudget: {{trials: 4}}\n"
                     "space:\n  server.lr: {type: float, low: 1.0e-5, high: 1.0e-4}\n")
    spec = resolve_spec(str(study), None, [], [], {"budget.minutes": 10, "parallel": 2})
    assert (spec.budget.trials, spec.budget.minutes, spec.parallel) == (4, 10, 2)
    with pytest.raises(StudySpecError, match="--base"):
        resolve_spec("a question without a base", None, ["server.lr=1..2"], [], {})
    with pytest.raises(StudySpecError, match="does not exist"):
        resolve_spec(str(tmp_path / "nope.yaml"), None, [], [], {})
    with pytest.raises(StudySpecError, match="client.steps"):
        resolve_spec(str(study), None, [], ["steps=0"], {})
