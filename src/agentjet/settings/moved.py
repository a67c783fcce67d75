"""Settings that moved when the sections began to mirror the roles (issue 33): ``engine`` split into
``generator``, ``learner`` and ``placement``; the FSDP ``trainer`` section became the learner's processes,
``learner.group``; the learning rate left ``training`` for ``learner``.

This is the one table of old names. Every entrance refuses an old name with a message naming the new one: a
config file or an ``ajet up`` entry (old sections), an ``AGENTJET_*`` variable, a command-line flag, an ``ajet ctl
set`` key and a protocol ``ConfigChange``. The short flags users type most kept their names (``--engine``,
``--train-procs``, ``--lora-rank``, ``--learning-rate``/``--lr``...), so only the ``--train-<name>`` flags of
the group were renamed (to ``--learner-<name>``). ``upgrade`` rewrites a settings dict of the old shape (as
an older checkpoint's ``agentjet_run.json`` holds) into the new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_GENERATOR = ("kind", "max_batch_size", "batch_wait_ms", "batching", "kv_cache_tokens", "cuda_graphs", "compile",
              "max_context", "seed", "null_reply", "null_delay_ms", "vllm")
_LEARNER = ("weight_decay", "max_grad_norm", "micro_batch_tokens", "logprob_chunk_tokens", "autocast_bf16",
            "gradient_checkpointing", "lora")
_PLACEMENT = ("device", "dtype", "colocate")
_GROUP = ("procs", "nnodes", "node_rank", "rdzv_endpoint", "control_host", "control_port", "auth_token", "backend",
          "device", "cuda_visible_devices", "mixed_precision", "gradient_checkpointing", "threads_per_rank",
          "startup_timeout_s", "step_timeout_s", "push_timeout_s", "collective_timeout_s", "shutdown_timeout_s",
          "work_dir", "export_dir", "recovery_dir")

# old path -> new path (a path names a setting or a whole block: ``engine.lora`` -> ``learner.lora``)
MOVED: dict[tuple[str, ...], tuple[str, ...]] = {
    **{("engine", n): ("generator", n) for n in _GENERATOR},
    **{("engine", n): ("learner", n) for n in _LEARNER},
    **{("engine", n): ("placement", n) for n in _PLACEMENT},
    **{("trainer", n): ("learner", "group", n) for n in _GROUP},
    ("training", "learning_rate"): ("learner", "learning_rate"),
}
MOVED_SECTIONS = {"engine": "generator, learner and placement", "trainer": "learner.group"}

# old flag -> new flag: the group's ``--train-<name>`` (but ``--train-procs``, still an alias) and the old alias
# ``--train-devices``; every other flag kept its name
MOVED_FLAGS: dict[str, str] = {
    **{f"train-{n}".replace("_", "-"): f"learner-{n}".replace("_", "-") for n in _GROUP if n != "procs"},
    "train-devices": "learner-devices",
}


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def env_name(path: tuple[str, ...]) -> str:
    return "AGENTJET_" + "__".join(path).upper()


def new_path(path: tuple[str, ...]) -> tuple[str, ...] | None:
    """Where an old path (a setting, a block, or a setting inside a moved block) lives now; None if it did not
    move."""
    for cut in range(len(path), 0, -1):
        target = MOVED.get(path[:cut])
        if target is not None:
            return (*target, *path[cut:])
    return None


def moved_message(old: str, new: str) -> str:
    return f"{old} moved to {new}"


def moved_in(data: Any) -> list[str]:
    """The old names in a nested settings dict, each as ``old moved to new`` (empty when there is none)."""
    if not isinstance(data, Mapping):
        return []
    problems: list[str] = []
    for section, where in MOVED_SECTIONS.items():
        block = data.get(section)
        if block is None:
            continue
        if not isinstance(block, Mapping) or not block:
            problems.append(moved_message(section, where))
            continue
        for key in block:
            path = (section, str(key))
            target = new_path(path)
            problems.append(moved_message(dotted(path), dotted(target)) if target else
                            f"{dotted(path)}: the {section} section moved to {where}")
    training = data.get("training")
    if isinstance(training, Mapping) and "learning_rate" in training:
        problems.append(moved_message("training.learning_rate", "learner.learning_rate"))
    return problems


def refuse_moved(data: Any) -> None:
    """Raise ``ValueError`` naming the new place of every old name in a nested settings dict."""
    problems = moved_in(data)
    if problems:
        raise ValueError("; ".join(problems) + " (see docs/configuration.md)")


def upgrade(data: Mapping[str, Any]) -> dict[str, Any]:
    """A settings dict of the old shape (``engine``, ``trainer``, ``training.learning_rate``) rewritten into the
    new one; a dict of the new shape comes back unchanged. For reading what an older checkpoint recorded."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items() if k not in MOVED_SECTIONS}
    moves: dict[tuple[str, ...], Any] = {}
    for section in MOVED_SECTIONS:
        block = data.get(section)
        if isinstance(block, Mapping):
            for key, value in block.items():
                target = new_path((section, str(key)))
                if target is not None:
                    moves[target] = value
    training = out.get("training")
    if isinstance(training, dict) and "learning_rate" in training:
        moves[("learner", "learning_rate")] = training.pop("learning_rate")
    for path, value in moves.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out
