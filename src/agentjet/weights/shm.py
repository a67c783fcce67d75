"""Fresh directories in ``/dev/shm`` (RAM) for what one host's processes hand each other (exported weights,
recovery snapshots), named after the owning server's pid so that those of servers that died without cleaning up
are swept: ``agentjet-<owner>-<kind>-<pid>-<random>``. Used by the trainer group (``distributed/group.py``) and
the engine-process layout (``layouts/engine_process.py``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SHM = Path("/dev/shm")


def shm_prefix(owner: str) -> str:
    return f"agentjet-{owner}-"


def shm_dir(owner: str, kind: str, need_bytes: int) -> Path | None:
    """A fresh directory in /dev/shm if it has twice ``need_bytes`` free, else None. Directories of ``owner`` left by
    servers that died are removed first (they would hold RAM until reboot)."""
    if not (SHM.is_dir() and os.access(SHM, os.W_OK)):
        return None
    sweep_stale(owner)
    if shutil.disk_usage(SHM).free > 2 * need_bytes + (64 << 20):
        return Path(tempfile.mkdtemp(prefix=f"{shm_prefix(owner)}{kind}-{os.getpid()}-", dir=SHM))
    return None


def sweep_stale(owner: str) -> None:
    """Remove ``owner``'s directories whose server (the pid in the name) is gone."""
    prefix = shm_prefix(owner)
    for d in SHM.glob(f"{prefix}*"):
        parts = d.name[len(prefix):].split("-")
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # alive, someone else's
            continue


def dir_bytes(path: Path) -> int:
    """The bytes of a model directory's safetensors files (as stored: fp32 copies are up to 2-4x that)."""
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
