"""Which TextArena games run as ``ta:GAME`` here, offline (the list in docs/environments.md).

    python scripts/ta_games.py [--json out.json]

For every TextArena id (without its -raw/-train wrapper variants) it resolves ``ta:ID`` as ``get_task`` does, with
every connection off loopback refused, then starts a game at one seed and plays one move ("[1]"). Each id is
``runs`` (it started and took a move), ``download`` (it wants NLTK data that is not on disk), ``players`` (not a
single-player game), ``fails`` (it does not start here: its own error) or ``timeout`` (20 s). About a minute.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentjet.tasks import ta
from agentjet.tasks.source import TaskError

TIMEOUT_S = 20


class _Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Timeout


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise OSError("scripts/ta_games.py: no network")


def classify(game: str) -> tuple[str, str]:
    """(kind, detail) of one TextArena id."""
    signal.alarm(TIMEOUT_S)
    try:
        task = ta.TextArenaTask(ta.parse_name(ta.PREFIX + game))
        play = task.new_game()
        play.reset(123)
        play.step("[1]")
        return "runs", ""
    except TaskError as exc:
        text = str(exc)
        kind = "download" if "NLTK" in text else "players" if "single-player" in text else "fails"
        return kind, text
    except _Timeout:
        return "timeout", f"no move within {TIMEOUT_S} s"
    except Exception as exc:  # a game's own error on its first move
        return "fails", f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write {id: [kind, detail]} here")
    args = parser.parse_args()
    socket.socket.connect = _refuse  # type: ignore[method-assign]
    socket.getaddrinfo = _refuse
    signal.signal(signal.SIGALRM, _alarm)
    ids = sorted(k for k in ta.registry() if not k.endswith(ta.VARIANTS))
    result = {game: classify(game) for game in ids}
    by_kind: dict[str, list[str]] = defaultdict(list)
    for game, (kind, _) in result.items():
        by_kind[kind].append(game)
    print(f"{len(ids)} TextArena ids (without -raw/-train variants)")
    for kind in ("runs", "download", "fails", "timeout", "players"):
        names = by_kind.get(kind, [])
        print(f"\n{kind} ({len(names)}):")
        print("  " + (", ".join(names) if kind != "players" else f"{', '.join(names[:8])}, ..."))
        if kind in ("download", "fails", "timeout"):
            for game in names:
                print(f"    {game}: {result[game][1][:160]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
