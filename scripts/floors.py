"""The floors of agentjet as its imports make them: each package (or top-level module) of ``src/agentjet`` is a
room; it sits one floor above the highest room it imports (a room that imports none of the others is on floor 1).
import-linter's contracts (``pyproject.toml``) say which imports are allowed; this says which exist. Its table is
the one in docs/architecture.md ("The floors as the imports make them"), and tests/test_docs.py checks they agree.

    .venv/bin/python scripts/floors.py          # the table (markdown)
    .venv/bin/python scripts/floors.py --json   # the same, as JSON
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import grimp

PACKAGE = "agentjet"
ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / PACKAGE


@dataclass(frozen=True)
class Room:
    name: str
    floor: int
    modules: int
    lines: int
    imports: tuple[str, ...]  # the other rooms it imports, by name


def room_of(module: str) -> str | None:
    """``agentjet.server.http.app`` -> ``server``; the package itself (``agentjet``) is no room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def lines_of(module: str) -> int:
    rel = Path(*module.split(".")[1:])
    path = SRC / rel / "__init__.py" if (SRC / rel).is_dir() else (SRC / rel).with_suffix(".py")
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def rooms() -> list[Room]:
    graph = grimp.build_graph(PACKAGE, include_external_packages=False, exclude_type_checking_imports=False)
    modules: dict[str, list[str]] = defaultdict(list)
    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        room = room_of(module)
        if room is None or room == "__main__":
            continue
        modules[room].append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            other = room_of(imported)
            if other is not None and other != room:
                edges[room].add(other)
    floors: dict[str, int] = {}

    def floor(room: str, path: tuple[str, ...] = ()) -> int:
        if room in path:
            raise SystemExit(f"an import cycle between rooms: {' -> '.join((*path, room))}")
        if room not in floors:
            floors[room] = 1 + max((floor(o, (*path, room)) for o in edges[room] if o in modules), default=0)
        return floors[room]

    return sorted((Room(r, floor(r), len(ms), sum(lines_of(m) for m in ms), tuple(sorted(edges[r] & modules.keys())))
                   for r, ms in modules.items()), key=lambda r: (-r.floor, r.name))


def contract_layers() -> dict[str, int]:
    """Each room's layer in the ``floors`` contract of pyproject.toml (0: the top)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (floors,) = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("id") == "floors"]
    return {name.strip(): i for i, layer in enumerate(floors["layers"]) for name in layer.split("|")}


def against_the_contract(found: list[Room]) -> list[str]:
    """The arrows that do not run down the contract's layers (one room importing another on its layer or above)."""
    layer = contract_layers()
    missing = [r.name for r in found if r.name not in layer]
    if missing:
        raise SystemExit(f"rooms not in the floors contract (pyproject.toml): {', '.join(missing)}")
    return [f"{r.name} -> {o}" for r in found for o in r.imports if layer[o] <= layer[r.name]]


def table(found: list[Room]) -> str:
    arrows = sum(len(r.imports) for r in found)
    wrong = against_the_contract(found)
    rows = ["| floor | room | modules | imports |", "|---:|---|---:|---|"]  # lines: --json (they move with every edit)
    rows += [f"| {r.floor} | `{r.name}` | {r.modules} | {', '.join(r.imports) or '-'} |" for r in found]
    top = max(r.floor for r in found)
    rows.append(f"\n{len(found)} rooms on {top} floors, {arrows} arrows between rooms (each room's imports of another), "
                f"{len(wrong)} against the contract's layers{': ' + ', '.join(wrong) if wrong else ''}, no cycle.")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON, not the markdown table")
    found = rooms()
    if parser.parse_args().json:
        print(json.dumps([r.__dict__ for r in found], indent=1))
    else:
        print(table(found))


if __name__ == "__main__":
    main()
