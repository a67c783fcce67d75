"""Writing files and directories atomically, in one way: write under a temporary name beside the target, then
rename it in, so a reader (or a restart after a crash) sees the old content or the new, never half of either.

Every temporary name has one style, ``.<target name>.<pid>-<random>.tmp``: hidden, unique to a writer (two
processes writing the same target never share a temp), and ending in ``.tmp`` so no pattern a reader scans for
(``*.safetensors``, ``step-*``, ``v000012``) matches one. On an error the temporary is removed and the target is
left as it was.

This module is on the lowest floor (it imports nothing from AgentJet) so that every part, the settings and the
model cache included, writes through it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_path(target: Path) -> Path:
    """The temporary name ``target`` is written under (the one style)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for the caller to write (by name: a library's ``save_file``); when
    the block ends without an error it is synced and replaces ``path``. The temporary exists (empty) before the
    block, created with ``mode`` when given (then exactly that mode: ``0o600`` is never readable by others, not
    even while being written), else with the default permissions (``0o666`` less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # the umask may have taken bits away
    finally:
        os.close(fd)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)  # a writer that recreated the file
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; ``mode`` as for :func:`atomic_file`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_file(path, mode=mode) as tmp, open(tmp, "wb") as f:
        f.write(raw)
    return Path(path)


@contextmanager
def atomic_dir(target: Path, *, mode: int | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``target`` to fill; when the block ends without an error it
    replaces ``target`` (an old ``target`` is removed first) in one rename. ``mode``: the directory's permissions
    (default: ``0o777`` less the umask)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(target)
    tmp.mkdir()
    if mode is not None:
        os.chmod(tmp, mode)
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
