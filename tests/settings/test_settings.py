"""One settings object with many entrances: every leaf of ServerConfig is reachable from the command line, a
config file and the environment; --help is generated from it; precedence and errors are as documented."""

from __future__ import annotations

import enum
import json
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import yaml
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from agentjet.cli import app
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import (
    EngineKind,
    FleetSettings,
    LogSink,
    ServerConfig,
    SettingField,
    SettingsError,
    TrainingSettings,
    find_field,
    load_server_config,
    options_values,
    server_fields,
)
from agentjet.settings.fields import _strip_optional
from agentjet.settings.load import env_values


def sample_value(f: SettingField) -> tuple[str, Any]:
    """A valid, non-default value for a field: (as typed on a command line, as the model holds it)."""
    special = {"model": ("tiny-random", "tiny-random"), "device": ("cpu", "cpu"), "host": ("localhost", "localhost"),
               "min_group_size": ("3", 3), "task_ratios": ("a=0.7,b=0.3", {"a": 0.7, "b": 0.3}),
               "targets": ("q_proj,v_proj", ["q_proj", "v_proj"]), "adapters": ("alpha,beta", ["alpha", "beta"]), "data_dir": ("/tmp/aj-x", Path("/tmp/aj-x")),
               "log_level": ("debug", "DEBUG"), "compare_level": ("text", "text"), "dtype": ("bfloat16", "bfloat16"),
               "public_url": ("http://h:1", "http://h:1"), "seed": ("7", 7), "max_context": ("512", 512),
               "log_to": ("tensorboard", [LogSink.TENSORBOARD]), "kind": ("null", EngineKind.NULL),
               "python": ("/usr/bin/python3", Path("/usr/bin/python3")),
               "extra_args": ("--seed 3", ["--seed", "3"]), "extra_env": ("A=1,B=x", {"A": "1", "B": "x"}), "bench_history": ("/tmp/h.jsonl", Path("/tmp/h.jsonl")),
               "rdzv_endpoint": ("node0:29400", "node0:29400"), "cuda_visible_devices": ("0,1", "0,1"),
               "control_host": ("0.0.0.0", "0.0.0.0"), "work_dir": ("/tmp/aj-w", Path("/tmp/aj-w")),
               "export_dir": ("/tmp/aj-e", Path("/tmp/aj-e")), "recovery_dir": ("/tmp/aj-r", Path("/tmp/aj-r")),
               "model_revision": ("v1", "v1"),
               "correction_high": ("3.5", 3.5), "heartbeat_timeout_s": ("4.5", 4.5),
               "listen": ("0.0.0.0:29600", "0.0.0.0:29600"), "resources": ("replica_slot=1", {"replica_slot": 1.0})}
    if f.path[-1] in special:
        return special[f.path[-1]]
    inner = _strip_optional(f.annotation)
    if inner is bool:
        return ("", not f.info.default)
    if f.is_secret:
        return ("tml-s3cret-token", "tml-s3cret-token")  # tinker_key must start with tml-; the others take any
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        value = next(m for m in inner if m != f.info.default)
        return (str(value.value), value)
    if typing.get_origin(inner) is typing.Literal:
        value = next(a for a in typing.get_args(inner) if a != f.info.default)
        return (str(value), value)
    if inner is int:
        low = next((int(m.ge) for m in f.info.metadata if isinstance(m, annotated_types.Ge)), 0)
        value = low + 3 if f.info.default != low + 3 else low + 5
        return (str(value), value)
    if inner is float:
        return ("0.125", 0.125)
    if inner is str:
        return ("custom", "custom")
    raise AssertionError(f"no sample value for {f.dotted} ({f.annotation})")


# Settings that are only valid together with others (cross-field rules): the companions, as typed on a command line.
_MULTI_NODE = {"learner.group.rdzv_endpoint": "node0:29400", "learner.group.control_port": "29500",
               "learner.group.auth_token": "t0k"}
COMPANIONS: dict[str, dict[str, str]] = {
    "training.min_group_size": {"training.group_size": "4"},
    "learner.group.nnodes": _MULTI_NODE,
    "learner.group.node_rank": {**_MULTI_NODE, "learner.group.nnodes": "8", "learner.group.export_dir": "/tmp/aj-e"},
    "generator.vllm.weight_transfer": {"generator.vllm.platform": "gpu"},
    "model_revision": {"model": "acme/tiny-chat"},  # a revision is a hub model's (the offline hub_cache has it)
    "learner.lora.adapters": {"learner.lora.rank": "8"},  # adapters are LoRA adapters
    "learner.lora.default_adapter": {"learner.lora.rank": "8", "learner.lora.adapters": "custom,other"},
}


def companion_args(f: SettingField) -> list[str]:
    return [a for dotted, typed in COMPANIONS.get(f.dotted, {}).items() for a in (f"--{find_field(dotted).flag}", typed)]


def got(config: ServerConfig, f: SettingField) -> Any:
    value: Any = config
    for part in f.path:
        value = getattr(value, part)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path) -> list[ServerConfig]:
    """`ajet server` up to the point where it would serve: the config it would serve is captured."""
    configs: list[ServerConfig] = []
    monkeypatch.setattr("agentjet.server.http.app.serve", lambda config: configs.append(config))
    for name in list(__import__("os").environ):
        if name.startswith("AGENTJET_") and name != "AGENTJET_HOME":
            monkeypatch.delenv(name)
    return configs


FIELDS = server_fields()


@pytest.mark.parametrize("field", FIELDS, ids=[f.dotted for f in FIELDS])
def test_every_setting_reaches_the_cli(field: SettingField, captured: list[ServerConfig],
                                      request: pytest.FixtureRequest) -> None:
    typed, want = sample_value(field)
    if field.dotted == "model_revision":
        request.getfixturevalue("offline")
        request.getfixturevalue("hub_cache")
    args = [f"--{field.flag}" if field.info.default is False else f"--no-{field.flag}"] if field.is_bool \
        else [f"--{field.flag}", typed]
    result = CliRunner().invoke(app, ["server", "--model", "tiny-random", *companion_args(field), *args])
    assert result.exit_code == 0, result.output
    assert got(captured[-1], field) == want


@pytest.mark.parametrize("field", FIELDS, ids=[f.dotted for f in FIELDS])
def test_every_setting_reaches_the_file_and_the_environment(field: SettingField, tmp_path: Path) -> None:
    typed, want = sample_value(field)
    raw: Any = json.loads(json.dumps(want, default=lambda v: v.value if isinstance(v, enum.Enum) else str(v)))
    companions = COMPANIONS.get(field.dotted, {})
    file_data = options_values({**companions, field.dotted: raw})
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(file_data))
    assert got(load_server_config(config_file=path), field) == want
    env_text = typed if not field.is_bool else str(want).lower()
    if field.path[-1] in ("targets", "log_to", "extra_args", "extra_env"):
        env_text = typed
    environ = {find_field(dotted).env: typed for dotted, typed in companions.items()}
    assert got(load_server_config(environ={**environ, field.env: env_text}), field) == want


def test_help_lists_every_setting_with_its_description_and_bounds() -> None:
    out = CliRunner().invoke(app, ["server", "--help"], terminal_width=100).output
    flat = " ".join(out.split())
    for f in FIELDS:
        assert f"--{f.flag}" in out, f.dotted
        words = " ".join((f.info.description or "").split()[:4])
        assert words in flat, (f.dotted, words)
    assert "1 ≤ x ≤ 1024; default 4" in flat  # group_size's bounds and default
    assert "--swarm-token-file" in out and "AGENTJET_SWARM_TOKEN_FILE" in flat


def test_help_fits_80_columns_without_cutting() -> None:
    out = CliRunner().invoke(app, ["server", "--help"], terminal_width=80).output
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "…" not in out and "--admin-token-file" in out


def test_precedence_cli_over_file_over_environment(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("port = 2000\n[training]\ngroup_size = 6\nbatch_groups = 3\n")
    env = {"AGENTJET_PORT": "1000", "AGENTJET_TRAINING__GROUP_SIZE": "5", "AGENTJET_LEARNER__LEARNING_RATE": "0.01",
           "AGENTJET_HOME": "/ignored", "AGENTJET_VENV": ".venv"}
    cfg = load_server_config({"training": {"batch_groups": "9"}}, path, env)
    assert (cfg.port, cfg.training.group_size, cfg.training.batch_groups, cfg.learner.learning_rate) == \
        (2000, 6, 9, 0.01)


def test_secrets_from_environment_file_and_cli(tmp_path: Path, captured: list[ServerConfig]) -> None:
    token_file = tmp_path / "tok"
    token_file.write_text("from-file\n")
    assert load_server_config(environ={"AGENTJET_SWARM_TOKEN_FILE": str(token_file)}).swarm_token == \
        SecretStr("from-file")
    env = {"AGENTJET_SWARM_TOKEN_FILE": str(token_file), "AGENTJET_SWARM_TOKEN": "from-env"}
    assert load_server_config(environ=env).swarm_token == SecretStr("from-env")
    result = CliRunner().invoke(app, ["server", "--model", "tiny-random", "--admin-token-file", str(token_file)])
    assert result.exit_code == 0, result.output
    assert captured[-1].admin_token == SecretStr("from-file")
    assert "from-file" not in json.dumps(captured[-1].public_dict())  # never shown


@pytest.mark.parametrize(("args", "message"), [
    (["--group-size", "0"], "training.group_size (--group-size): Input should be greater than or equal to 1"),
    (["--group-size", "2", "--min-group-size", "3"], "min_group_size (3) cannot exceed group_size (2)"),
    (["--dtype", "int4"], "placement.dtype (--dtype)"),
    (["--task-ratios", "math"], "must look like name=value"),
    (["--port", "http"], "port (--port)"),
])
def test_bad_options_fail_naming_the_field(args: list[str], message: str, captured: list[ServerConfig]) -> None:
    result = CliRunner().invoke(app, ["server", *args], terminal_width=200)
    assert result.exit_code == 2 and not captured
    assert message in " ".join(result.output.split())


def test_misspelt_environment_setting_is_an_error() -> None:
    with pytest.raises(SettingsError, match="AGENTJET_TRAINING__GROUP_SIZ"):
        env_values({"AGENTJET_TRAINING__GROUP_SIZ": "4"})


def test_find_field_by_flag_alias_and_path() -> None:
    assert find_field("lr").dotted == find_field("--learning-rate").dotted == "learner.learning_rate"
    assert find_field("--train-procs").dotted == find_field("learner-procs").dotted == "learner.group.procs"
    assert find_field("group_size").dotted == find_field("training.group_size").dotted == "training.group_size"
    with pytest.raises(KeyError, match="did you mean"):
        find_field("group-siz")


def test_engine_settings_reach_the_engine(captured: list[ServerConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    from agentjet.layouts import build_engine

    result = CliRunner().invoke(app, ["server", "--model", "tiny-random", "--device", "cpu", "--dtype", "bfloat16",
                                      "--lora-rank", "8", "--lora-alpha", "16", "--max-batch-size", "3",
                                      "--kl-coef", "0.05", "--lr", "0.002"])
    assert result.exit_code == 0, result.output
    engine = build_engine(captured[-1])
    info = engine.describe()
    assert info["device"] == "cpu" and info["dtype"] == "bfloat16" and info["max_batch_size"] == 3
    assert info["lora"] == {"rank": 8, "alpha": 16.0, "targets": list(captured[-1].learner.lora.targets)}
    assert any("lora_" in n for n, p in engine.generator.model.named_parameters() if p.requires_grad)
    assert engine.generator.model is engine.learner.policy.model  # one module, shared (the in-place seam)
    assert str(engine.generator.dtype) == "torch.bfloat16"
    assert engine.learner.config.kl_coef == 0.05 and engine.learner.learning_rate == 0.002
    run_blocking(engine.close())


def test_config_file_written_for_a_child_reads_back(tmp_path: Path) -> None:
    from agentjet.settings import write_config_file

    cfg = load_server_config({"admin_token": "adm1n", "training": {"group_size": 8},
                              "learner": {"lora": {"rank": 4}, "group": {"auth_token": "s3cret"}}})
    path = write_config_file(cfg, tmp_path / "c.yaml")
    assert path.stat().st_mode & 0o777 == 0o600  # it holds the token
    again = load_server_config(config_file=path)
    assert again == cfg


def test_every_optional_setting_defaults_to_none() -> None:
    """A config file leaves None values out (``dump_config``), so a child reading it gets each field's default:
    that is the same None only where the default is None. (``generator.vllm.tis_cap``, optional with a default of
    2.0, once reached a child as 2.0 when set to None.)"""
    for f in server_fields():
        if type(None) in typing.get_args(f.info.annotation):
            assert f.info.get_default(call_default_factory=True) is None, ".".join(f.path)


def test_the_moved_tis_cap_is_refused_with_where_it_went() -> None:
    with pytest.raises(SettingsError, match="loss.correction"):
        load_server_config({"generator": {"vllm": {"tis_cap": 2.0}}})


def test_a_nested_secret_from_a_file_named_in_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "read"
    token_file.write_text("r34d\n")
    env = {"AGENTJET_OBSERVE__READ_TOKEN_FILE": str(token_file)}
    assert load_server_config(environ=env).observe.read_token == SecretStr("r34d")
    both = {**env, "AGENTJET_OBSERVE__READ_TOKEN": "direct"}  # the variable wins; the _FILE one is not "unknown"
    assert load_server_config(environ=both).observe.read_token == SecretStr("direct")


SECRETS = [f for f in FIELDS if f.is_secret]


@pytest.mark.parametrize("field", SECRETS, ids=[f.dotted for f in SECRETS])
def test_every_secret_reaches_a_child_config_file_intact(field: SettingField, tmp_path: Path) -> None:
    """A secret at any depth survives the file a parent writes for a child server (``ajet up``, the demo,
    research); a mask written there would lock out the real token and let the mask in."""
    from agentjet.settings import write_config_file
    from agentjet.settings.load import dump_config

    companions = COMPANIONS.get(field.dotted, {})
    cfg = load_server_config(options_values({**companions, field.dotted: "tml-the-real-s3cret"}))
    assert got(load_server_config(config_file=write_config_file(cfg, tmp_path / "c.yaml")), field) == "tml-the-real-s3cret"
    masked = dump_config(cfg, reveal_secrets=False)
    for part in field.path[:-1]:
        masked = masked[part]
    assert masked[field.path[-1]] == "**********"


# ------------------------------------------------------------------ settings by role (issue 33), and the old names
BEFORE_ROLES = json.loads((Path(__file__).parents[1] / "fixtures" / "settings_before_roles.json").read_text())


def test_the_sections_mirror_the_roles() -> None:
    sections = {f.section for f in FIELDS}
    assert {"generator", "learner", "placement"} <= sections and not sections & {"engine", "trainer"}
    assert find_field("--engine").dotted == "generator.kind"
    assert find_field("--lora-rank").dotted == "learner.lora.rank"
    assert find_field("--colocate").dotted == "placement.colocate"
    assert find_field("--learner-nnodes").dotted == "learner.group.nnodes"
    assert "learning_rate" not in TrainingSettings.model_fields  # the default learning rate is written once
    from agentjet.layouts import embedded_engine

    assert "learning_rate" not in __import__("inspect").signature(embedded_engine).parameters


def test_live_is_a_property_of_each_setting() -> None:
    live = {f.dotted for f in FIELDS if f.live}
    assert "learner.learning_rate" in live
    assert {"learner.weight_decay", "learner.lora.rank", "learner.group.procs", "generator.max_batch_size"}.isdisjoint(live)
    by_section = {s: {f.dotted for f in FIELDS if f.section == s} for s in ("training", "sampling", "loss")}
    assert set().union(*by_section.values()) <= live  # every training, sampling and loss setting, as before
    assert live - set().union(*by_section.values()) == {"learner.learning_rate"}
    help_text = CliRunner().invoke(app, ["server", "--help"], terminal_width=200).output
    assert "(learner, live) AdamW learning rate" in " ".join(help_text.split())


@pytest.mark.parametrize(("data", "message"), [
    ({"engine": {"max_batch_size": 4}}, "engine.max_batch_size moved to generator.max_batch_size"),
    ({"engine": {"device": "cpu"}}, "engine.device moved to placement.device"),
    ({"engine": {"colocate": True}}, "engine.colocate moved to placement.colocate"),
    ({"engine": {"weight_decay": 0.1}}, "engine.weight_decay moved to learner.weight_decay"),
    ({"engine": {"lora": {"rank": 4}}}, "engine.lora moved to learner.lora"),
    ({"engine": {"vllm": {"port": 1}}}, "engine.vllm moved to generator.vllm"),
    ({"trainer": {"procs": 2}}, "trainer.procs moved to learner.group.procs"),
    ({"training": {"learning_rate": 0.01}}, "training.learning_rate moved to learner.learning_rate"),
    ({"engine": {"warp": 9}}, "the engine section moved to generator, learner and placement"),
])
def test_an_old_section_in_a_config_file_is_refused_naming_the_new_place(data: dict, message: str,
                                                                        tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SettingsError) as err:
        load_server_config(config_file=path)
    assert message in str(err.value)
    with pytest.raises(ValidationError, match="moved"):  # the model itself refuses them too
        ServerConfig.model_validate(data)


@pytest.mark.parametrize(("name", "new"), [
    ("AGENTJET_ENGINE__MAX_BATCH_SIZE", "AGENTJET_GENERATOR__MAX_BATCH_SIZE"),
    ("AGENTJET_ENGINE__LORA__RANK", "AGENTJET_LEARNER__LORA__RANK"),
    ("AGENTJET_ENGINE__DEVICE", "AGENTJET_PLACEMENT__DEVICE"),
    ("AGENTJET_ENGINE__VLLM__PORT", "AGENTJET_GENERATOR__VLLM__PORT"),
    ("AGENTJET_TRAINING__LEARNING_RATE", "AGENTJET_LEARNER__LEARNING_RATE"),
    ("AGENTJET_TRAINER__PROCS", "AGENTJET_LEARNER__GROUP__PROCS"),
    ("AGENTJET_TRAINER__AUTH_TOKEN_FILE", "AGENTJET_LEARNER__GROUP__AUTH_TOKEN_FILE"),
])
def test_an_old_environment_variable_is_refused_naming_the_new_one(name: str, new: str) -> None:
    with pytest.raises(SettingsError, match=f"{name} moved to {new}"):
        load_server_config(environ={name: "2"})
    assert new.removesuffix("_FILE") in {f.env for f in FIELDS}


@pytest.mark.parametrize(("args", "message"), [
    (["--train-nnodes", "2"], "--train-nnodes moved to --learner-nnodes"),
    (["--train-control-port", "5"], "--train-control-port moved to --learner-control-port"),
    (["--train-devices", "0"], "--train-devices moved to --learner-devices"),
    (["--train-mixed-precision"], "--train-mixed-precision moved to --learner-mixed-precision"),
])
def test_a_flag_renamed_for_its_role_fails_naming_the_new_one(args: list[str], message: str,
                                                             captured: list[ServerConfig]) -> None:
    result = CliRunner().invoke(app, ["server", *args], terminal_width=200)
    assert result.exit_code == 2 and not captured
    assert message in " ".join(result.output.split())


def test_the_short_flags_keep_working(captured: list[ServerConfig]) -> None:
    result = CliRunner().invoke(app, ["server", "--model", "tiny-random", "--engine", "null", "--train-procs", "1",
                                      "--group-size", "6", "--batch-groups", "3", "--learning-rate", "0.003"])
    assert result.exit_code == 0, result.output
    cfg = captured[-1]
    assert (cfg.generator.kind, cfg.learner.group.procs, cfg.training.group_size, cfg.training.batch_groups,
            cfg.learner.learning_rate) == ("null", 1, 6, 3, 0.003)
    result = CliRunner().invoke(app, ["server", "--model", "tiny-random", "--lr", "0.004", "--lora-rank", "2"])
    assert result.exit_code == 0, result.output
    assert captured[-1].learner.learning_rate == 0.004 and captured[-1].learner.lora.rank == 2


@pytest.mark.parametrize(("key", "message"), [
    ("training.learning_rate", "training.learning_rate moved to learner.learning_rate"),
    ("engine.lora.rank", "engine.lora.rank moved to learner.lora.rank"),
    ("trainer.procs", "trainer.procs moved to learner.group.procs"),
    ("train-nnodes", "--train-nnodes moved to --learner-nnodes"),
])
def test_an_old_key_is_refused_naming_the_new_one(key: str, message: str) -> None:
    with pytest.raises(KeyError, match=message):
        find_field(key)
    with pytest.raises(SettingsError, match=message):
        options_values({key: 1})


def test_ctl_set_accepts_the_live_settings_and_refuses_the_others_and_the_old_keys() -> None:
    import typer as _typer

    from agentjet.cli.ctl import parse_assignment

    assert parse_assignment("learning_rate=3e-5") == (("learner", "learning_rate"), 3e-5)
    assert parse_assignment("lr=3e-5") == parse_assignment("learner.learning_rate=3e-5")
    assert parse_assignment("group_size=8") == (("training", "group_size"), 8)
    with pytest.raises(_typer.BadParameter, match="training.learning_rate moved to learner.learning_rate"):
        parse_assignment("training.learning_rate=3e-5")
    with pytest.raises(_typer.BadParameter, match="learner.weight_decay cannot change while the server runs"):
        parse_assignment("weight_decay=0.1")
    with pytest.raises(_typer.BadParameter, match="engine.kind moved to generator.kind"):
        parse_assignment("engine.kind=vllm")


def test_a_settings_dict_written_before_the_moves_upgrades_to_the_same_settings() -> None:
    """An older checkpoint's ``agentjet_run.json`` holds the settings in the old shape (this fixture was dumped
    by the code before the moves); ``upgrade`` reads it into the new one, value for value."""
    from agentjet.settings.moved import upgrade

    assert moved_in_names(BEFORE_ROLES) >= {"engine.kind", "trainer.procs", "training.learning_rate"}
    cfg = ServerConfig.model_validate(upgrade(BEFORE_ROLES))
    assert cfg.generator.max_batch_size == 8 and cfg.placement.device == "cpu"
    assert cfg.learner.weight_decay == 0.01 and cfg.learner.learning_rate == 1e-3
    assert cfg.learner.group.threads_per_rank == 2 and cfg.training.checkpoint_every == 1
    assert upgrade(cfg.public_dict()) == cfg.public_dict()  # the new shape is left as it is
    from agentjet.settings.moved import new_path

    old_leaves, new_leaves = _leaves(BEFORE_ROLES), _leaves(cfg.public_dict())
    added_since = {"learner.lora.adapters", "learner.lora.default_adapter",  # settings new after the moves
                   "generator.vllm.max_loras", "generator.gil_switch_interval_ms",
                   "learner.flat_masters", "learner.compile_logprobs", "generator.engine_process",
                   *(f"generator.process.{name}" for name in ("startup_timeout_s", "request_timeout_s",
                                                              "control_timeout_s", "heartbeat_timeout_s",
                                                              "stop_timeout_s")),
                   "generator.replicas", "generator.prefix_cache_tokens",
                   *(f"generator.fleet.{name}" for name in FleetSettings.model_fields if name != "token")}
    assert len(old_leaves) == len(new_leaves) - len(added_since) and added_since <= set(new_leaves)  # none lost
    for old, value in old_leaves.items():  # each where the table says it went, with its value
        path = tuple(old.split("."))
        assert new_leaves[".".join(new_path(path) or path)] == value, old


def moved_in_names(data: dict) -> set[str]:
    from agentjet.settings.moved import moved_in

    return {line.split(" moved to ")[0] for line in moved_in(data)}


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_leaves(value, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: data}
