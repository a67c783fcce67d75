"""The one atomic writer (``agentjet.files``): a failed write leaves the old content and no temporary behind,
permissions are what the caller asked for, and every writer in the package goes through it."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from agentjet.files import atomic_dir, atomic_file, temp_path, write_atomic

SRC = Path(__file__).resolve().parents[1] / "src" / "agentjet"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    write_atomic(path, "one")
    write_atomic(path, b"two")
    assert path.read_text() == "two" and leftovers(path.parent) == []


def test_a_crash_mid_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError, match="killed"), atomic_file(path) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_a_kill_mid_write_in_a_child_keeps_the_old_file(tmp_path: Path) -> None:
    """A real crash: the writer is SIGKILLed while the temporary is half written; the target is untouched (the
    temporary stays, under its hidden ``.tmp`` name that no reader matches)."""
    path = tmp_path / "cursor.json"
    write_atomic(path, '{"done": [1]}')
    pid = os.fork()
    if pid == 0:  # the child: start a write, then die without cleaning up
        with atomic_file(path) as tmp:
            tmp.write_text('{"done": [1, 2')
            os.kill(os.getpid(), 9)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert path.read_text() == '{"done": [1]}'
    assert all(re.fullmatch(r"\.cursor\.json\.\d+-[0-9a-f]{8}\.tmp", n) for n in leftovers(tmp_path))


def test_owner_only_mode_is_kept_even_under_a_permissive_umask(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    old = os.umask(0)
    try:
        write_atomic(path, "secret\n", mode=0o600)
        write_atomic(path, "rotated\n", mode=0o600)
        plain = write_atomic(tmp_path / "plain.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "rotated\n"
    assert stat.S_IMODE(plain.stat().st_mode) == 0o666  # no mode: the default permissions, as open() gives


def test_the_temporary_is_owner_only_before_anything_is_written(tmp_path: Path) -> None:
    with atomic_file(tmp_path / "token", mode=0o600) as tmp:
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o600 and tmp.read_text() == ""
        tmp.write_text("t")


def test_atomic_dir_replaces_in_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "v000001"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(ValueError), atomic_dir(target) as tmp:
        (tmp / "a").write_text("2")
        raise ValueError("export failed")
    assert (target / "a").read_text() == "1" and leftovers(tmp_path) == []
    with atomic_dir(target) as tmp:
        (tmp / "b").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["b"]  # the old directory is gone, not merged


def test_atomic_dir_mode(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "model", mode=0o700) as tmp:
        (tmp / "config.json").write_text("{}")
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o700


def test_one_temp_name_style() -> None:
    a, b = temp_path(Path("/d/model.safetensors")), temp_path(Path("/d/model.safetensors"))
    assert a != b and a.parent == Path("/d") and a.name.startswith(".model.safetensors.") and a.suffix == ".tmp"
    assert not a.match("*.safetensors")  # what readers of a weights directory glob for


def test_no_other_atomic_writer_in_the_package() -> None:
    """Every write-then-rename goes through agentjet.files: no other module renames or replaces a path."""
    rename = re.compile(r"os\.replace\(|os\.rename\(|\.rename\(|\.replace\([a-z_.]*(path|target)|mkstemp|NamedTemporaryFile")
    offenders = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p.name != "files.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if rename.search(line)]
    assert offenders == []
