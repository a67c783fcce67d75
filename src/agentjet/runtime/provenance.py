"""Where a measurement was taken: the commit, the machine and the device, recorded beside every figure that is
saved (benchmarks, the demo, ``ajet bench``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}"


def device() -> str:
    import torch

    return f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"


COMMIT_ENV = "AGENTJET_COMMIT"  # the commit of a copy without its git history (e.g. a tree sent to a GPU machine)


def git_commit(root: Path | None = None) -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes to tracked files); ``$AGENTJET_COMMIT`` when
    set; ``unknown`` outside a git checkout."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + ("-dirty" if dirty else "")
