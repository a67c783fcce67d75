"""Hub ids (``--model ORG/NAME``, ``--model-revision``) resolve through a Hugging Face cache these tests build
offline, in huggingface_hub's own layout (``hub_cache`` in conftest). A socket guard (``network_attempts``)
refuses and records any try at a network; the ``offline`` fixture fails the test if there was one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.conftest import SHA_MAIN, SHA_V1, add_hub_snapshot
from typer.testing import CliRunner

from agentjet.models import ModelNotFoundError, resolve_model, resolve_model_ref
from agentjet.runtime.blocking import run_blocking


def test_hub_id_resolves_to_the_cached_snapshot_of_main(offline: None, hub_cache: dict[str, Path]) -> None:
    ref = resolve_model_ref("acme/tiny-chat")
    assert ref.path == hub_cache["main"] and ref.revision == SHA_MAIN and ref.hub_id == "acme/tiny-chat"
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(ref.path).model_type == "llama"  # a loadable model directory
    assert AutoTokenizer.from_pretrained(ref.path).chat_template


def test_revision_by_tag_and_by_commit(offline: None, hub_cache: dict[str, Path]) -> None:
    assert resolve_model_ref("acme/tiny-chat", "v1").path == hub_cache["v1"]
    assert resolve_model_ref("acme/tiny-chat", SHA_V1).revision == SHA_V1
    assert resolve_model("acme/tiny-chat", SHA_MAIN) == hub_cache["main"]


def test_hf_home_is_respected(offline: None, hub_cache: dict[str, Path], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "hf-home"
    home.mkdir()
    shutil.move(hub_cache["cache"], home / "hub")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(home))
    assert resolve_model("acme/tiny-chat", "v1") == home / "hub" / "models--acme--tiny-chat" / "snapshots" / SHA_V1


def test_offline_and_not_cached_is_one_clear_error(offline: None, hub_cache: dict[str, Path]) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("acme/other-model")
    msg = str(err.value)
    assert str(hub_cache["cache"]) in msg and "HF_HUB_OFFLINE is set" in msg
    assert "`hf download acme/other-model`" in msg
    with pytest.raises(ModelNotFoundError, match="hf download acme/tiny-chat --revision v2"):
        resolve_model("acme/tiny-chat", "v2")  # a revision that is not cached


def test_no_route_to_the_hub_uses_the_cache_or_says_so(hub_cache: dict[str, Path], network_attempts: list[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Online (HF_HUB_OFFLINE unset) but no route, as on this machine: huggingface_hub tries the hub (the guard
    refuses it), then falls back to the cache; a model not cached is the same clear error."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # it reads the variable at import
    assert resolve_model("acme/tiny-chat") == hub_cache["main"]
    assert network_attempts, "online, huggingface_hub should have asked the hub for main's commit"
    with pytest.raises(ModelNotFoundError, match="the hub could not be reached.*hf download acme/nothing-here"):
        resolve_model("acme/nothing-here")


def test_a_download_goes_to_the_cache_with_hf_token(hub_cache: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                    network_attempts: list[str]) -> None:
    """Not cached and online: huggingface_hub's snapshot_download (its progress bars on) is asked for the
    repo into the configured cache, with HF_TOKEN; faked here, since tests never download."""
    import huggingface_hub

    calls: list[dict[str, object]] = []

    def fake_download(repo_id: str, **kwargs: object) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(add_hub_snapshot(Path(str(kwargs["cache_dir"])), repo_id, "c" * 40, hub_cache["main"], ("main",)))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    ref = resolve_model_ref("acme/fresh")
    assert ref.revision == "c" * 40 and (ref.path / "config.json").exists()
    assert calls[0]["cache_dir"] == hub_cache["cache"] and calls[0]["token"] == "hf_secret"
    assert calls[0]["local_files_only"] is False and calls[0]["revision"] == "main"
    assert "*.safetensors" in calls[0]["allow_patterns"]  # type: ignore[operator]
    assert network_attempts == []


def test_builtin_names_and_local_directories_keep_working(offline: None, hub_cache: dict[str, Path],
                                                          tiny_model_path: Path, tmp_path: Path) -> None:
    assert resolve_model("tiny-random") == tiny_model_path
    assert resolve_model(str(hub_cache["v1"])) == hub_cache["v1"]  # a local directory, even inside the cache
    with pytest.raises(ModelNotFoundError, match="only applies to a Hugging Face Hub id"):
        resolve_model("tiny-random", "v1")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="Unknown model 'tiny-randm'"):
        resolve_model("tiny-randm")  # a bare name is a mistyped built-in, not a hub lookup


def test_every_engine_part_gets_the_one_resolved_directory(offline: None, hub_cache: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """build_engine resolves the hub id once; the embedded engine, vLLM and the trainer group all get that
    snapshot's directory (one commit), not the id to resolve again."""
    from agentjet.layouts import build as layouts
    from agentjet.layouts import build_engine
    from agentjet.settings import EngineKind, ServerConfig

    config = ServerConfig(model="acme/tiny-chat", model_revision="v1", data_dir=tmp_path)
    engine = build_engine(config)
    try:
        assert engine.generator.model_path == hub_cache["v1"]  # type: ignore[attr-defined]
    finally:
        run_blocking(engine.close())
    seen: dict[str, object] = {}
    monkeypatch.setattr(layouts, "group_engine", lambda cfg: seen.setdefault("group", cfg.model))
    monkeypatch.setattr(layouts, "vllm_engine", lambda cfg, work_dir: seen.setdefault("vllm", cfg.model))
    group = config.learner.model_copy(update={"group": config.learner.group.model_copy(update={"procs": 2})})
    build_engine(config.model_copy(update={"learner": group}))
    build_engine(config.model_copy(update={"generator": config.generator.model_copy(update={"kind": EngineKind.VLLM})}))
    assert seen == {"group": str(hub_cache["v1"]), "vllm": str(hub_cache["v1"])}


def test_cli_model_and_server_settings(offline: None, hub_cache: dict[str, Path]) -> None:
    from agentjet.cli import app
    from agentjet.settings import load_server_config

    result = CliRunner().invoke(app, ["model", "acme/tiny-chat", "--revision", "v1"])
    assert result.exit_code == 0 and result.output.strip() == str(hub_cache["v1"])
    result = CliRunner().invoke(app, ["model", "acme/missing"])
    assert result.exit_code != 0 and "hf download acme/missing" in result.output
    config = load_server_config({"model": "Qwen/Qwen2.5-1.5B-Instruct", "model_revision": "main"}, None, {})
    assert (config.model, config.model_revision) == ("Qwen/Qwen2.5-1.5B-Instruct", "main")
    assert config.resolved_data_dir(Path("/h")) == Path("/h/runs/Qwen2.5-1.5B-Instruct")
