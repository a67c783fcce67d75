"""TextArena games as a task source: ``ta:GAME`` works wherever a built-in task name does
(``agentjet.tasks.get_task``), e.g. ``ta:GuessTheNumber-v0`` or ``ta:TowerOfHanoi-v0``. Needs the ``ta`` extra
(``pip install 'agentjet[ta]'``, textarena 0.7.4). The game runner is ``agentjet.tasks.games``; this module is
its TextArena adapter (``TextArenaGame``) and the task source around it.

Names (docs/environments.md): ``ta:GAME`` is a TextArena environment id (``textarena.envs.registration``);
``ta:GAME:k=v,...`` overrides its constructor's arguments (``ta:GuessTheNumber-v0:max_number=50``), values read
as in ``rg:`` names. One knob is the runner's, not the game's: ``reward=game`` (default: the game's own reward,
partial credit included) or ``reward=win`` (1.0 when the game pays its full 1.0, a win; else 0.0). An unknown id
fails with the close ids; a game that is not single-player fails (only the model's seat is played); a game that
downloads data (the word games call ``nltk.download``) fails with a message naming the game and the data, unless
that data is already on disk: no game downloads anything here.

A mixture, ``ta:A+B[:k=v,...]`` (``ta:GuessTheNumber-v0+TowerOfHanoi-v0``), is one task source with one task type
per game: ``generate_tasks`` takes the games in turn, and the recommended settings give each an equal share of a
batch (``task_ratios``: the cocktail), as for ``rg:A+B``. Each game appears once in a mixture.

One task is one game at one seed. ``train`` seeds come from ``[0, TRAIN_SEEDS)`` and ``eval`` seeds from
``[EVAL_SEED0, EVAL_SEED0 + EVAL_SEEDS)``: disjoint by construction. A game whose start does not depend on the
seed (TowerOfHanoi) is the same game at every seed. The task id carries the seed, so a GRPO group plays one game.

The observations are TextArena's raw ones (the environment without its observation wrappers): the game's new
messages since the model's last move, one user message per turn (the model's own move is not echoed back), so
the chat only grows and the turns merge. The game's default action wrappers are kept (e.g. ``[`` ``]`` added
around a bare move). TextArena seeds Python's global ``random``; each game keeps its own ``random`` state, swapped
in around its calls, so concurrent games neither disturb each other nor the process.

Difficulty levels (``ladders()``, for ``ajet demo --levels``; docs/environments.md): GuessTheNumber's number range
and turns, ``GUESS_LEVELS``: 1..5 in 5 turns, 1..10 in 8, 1..20 in 10 (``GuessTheNumber-v0`` as registered), 1..50
in 10 (``-hardcore``), 1..100 in 10. The game as named is the level its range and turns equal (none: training
starts at level 0). Other games have no levels. Pure Python: no server imports; textarena is imported on first use.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import importlib
import inspect
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from agentjet.tasks.games import GameTrace, Step, play
from agentjet.tasks.recommended import Recommended
from agentjet.tasks.rg import parse_knobs
from agentjet.tasks.source import TaskError, TaskLadder, in_turn

PREFIX = "ta:"
EXTRA_HINT = "pip install 'agentjet[ta]'"
SPLITS = ("train", "eval")
VARIANTS = ("-raw", "-train")  # TextArena's wrapper variants of every id (the runner drops observation wrappers)
PLAYER = 0  # the model's seat: single-player games only
TRAIN_SEEDS = 1_000_000  # train games: seeds [0, TRAIN_SEEDS)
EVAL_SEED0 = 10_000_000  # eval games: seeds [EVAL_SEED0, EVAL_SEED0 + EVAL_SEEDS)
EVAL_SEEDS = 1000
WIN_REWARD = 1.0  # a game's full reward: a win (GuessTheNumber's number, TowerOfHanoi solved)
MIN_CALLS = 64  # the runner's cap on chat calls per game, at least; twice the game's own turn limit if higher
NLTK_CATEGORIES = ("corpora", "taggers", "tokenizers", "chunkers", "models", "grammars", "misc", "sentiment",
                   "stemmers", "help")

# GuessTheNumber's levels: the number range and the turns (the game's constructor arguments)
GUESS_LEVELS: tuple[dict[str, int], ...] = (
    {"min_number": 1, "max_number": 5, "max_turns": 5}, {"min_number": 1, "max_number": 10, "max_turns": 8},
    {"min_number": 1, "max_number": 20, "max_turns": 10}, {"min_number": 1, "max_number": 50, "max_turns": 10},
    {"min_number": 1, "max_number": 100, "max_turns": 10})
LEVELLED_GAMES = {"GuessTheNumber-v0": GUESS_LEVELS, "GuessTheNumber-v0-hardcore": GUESS_LEVELS}

SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 48}
EVAL_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 48, "seed": 30_000}
# A starting point, not yet measured on a game: 64 eval games (the win rate needs 50 or more).
RECOMMENDED = Recommended(learning_rate=2e-5, group_size=8, batch_groups=2, steps=60, eval_n=64, eval_every_s=300,
                          concurrency=16, stop={"patience": 2, "min_delta": 0.02, "min_evals": 3},
                          levels={"window": 6})  # a game group is slow (up to 11 calls a game): a shorter window


# ---- names -------------------------------------------------------------------------------------------------


class GameReward(enum.StrEnum):
    """What an episode is paid: the game's reward as it is, or only a win (the game's full reward, 1.0)."""

    GAME = "game"
    WIN = "win"

    def of(self, game_reward: float) -> float:
        return game_reward if self is GameReward.GAME else float(game_reward >= WIN_REWARD)


@dataclass(frozen=True)
class GameSpec:
    """A ``ta:`` name: the TextArena environment id, its constructor overrides and what an episode is paid."""

    game: str
    knobs: dict[str, Any] = field(default_factory=dict)
    reward: GameReward = GameReward.GAME

    def label(self) -> str:
        """``GAME[:k=v,...]`` (knobs sorted, ``reward`` among them unless the default): the canonical form,
        without the prefix."""
        knobs = {**self.knobs, **({"reward": self.reward.value} if self.reward is not GameReward.GAME else {})}
        return self.game + (":" + ",".join(f"{k}={v}" for k, v in sorted(knobs.items())) if knobs else "")


def parse_names(name: str) -> list[GameSpec]:
    """``ta:A[:k=v,...]+B[:k=v,...]`` (or the part after ``ta:``) -> the specs of its games, each game once."""
    body = name.removeprefix(PREFIX).strip()
    if not body:
        raise TaskError("ta: needs a TextArena game id, e.g. ta:GuessTheNumber-v0")
    specs = []
    for part in body.split("+"):
        if not part.strip():
            raise TaskError(f"ta:{body}: an empty game id (write ta:A+B)")
        specs.append(parse_name(part))
    games = [s.game for s in specs]
    dup = sorted({g for g in games if games.count(g) > 1})
    if dup:
        raise TaskError(f"ta:{body}: game(s) {dup} appear twice; each game is one task type")
    return specs


def parse_name(name: str) -> GameSpec:
    """``ta:GAME[:k=v,...]`` (or the part after ``ta:``) -> its spec: one game."""
    body = name.removeprefix(PREFIX).strip()
    game, _, text = body.partition(":")
    if not game.strip():
        raise TaskError("ta: needs a TextArena game id, e.g. ta:GuessTheNumber-v0")
    knobs = parse_knobs(text, f"ta:{body}")
    reward = str(knobs.pop("reward", GameReward.GAME.value))
    if reward not in set(GameReward):
        raise TaskError(f"ta:{body}: reward={reward!r} is not one of {[r.value for r in GameReward]} (game: the "
                        "game's own reward; win: 1.0 for a win only)")
    return GameSpec(game.strip(), knobs, GameReward(reward))


# ---- textarena ---------------------------------------------------------------------------------------------


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise TaskError(f"ta: tasks need textarena, which is not installed: {EXTRA_HINT}") from exc
    return textarena


def registry() -> dict[str, Any]:
    """TextArena's environment ids -> their specs."""
    return dict(_textarena().envs.registration.ENV_REGISTRY)


def check_game_name(game: str, known: list[str]) -> None:
    """Raise a ``TaskError`` listing the close ids when ``game`` is not a TextArena environment id."""
    if game in known:
        return
    base = [k for k in known if not k.endswith(VARIANTS)]  # the -raw/-train variants only crowd the list
    close = difflib.get_close_matches(game, base, n=5, cutoff=0.6)
    hint = f"close names: {', '.join(close)}" if close else "no close names"
    raise TaskError(f"unknown TextArena game {game!r} ({hint}); the {len(known)} ids are listed by "
                    "python -c 'import textarena; print(sorted(textarena.envs.registration.ENV_REGISTRY))'")


def nltk_has(resource: str) -> bool:
    """Whether NLTK data ``resource`` (an ``nltk.download`` id such as "words") is on disk."""
    import nltk

    for category in NLTK_CATEGORIES:
        for path in (f"{category}/{resource}", f"{category}/{resource}.zip"):
            try:
                nltk.data.find(path)
                return True
            except LookupError:
                continue
    return False


def _download_error(game: str, resources: list[str] | None, detail: str = "") -> TaskError:
    what = f"the NLTK data {resources}" if resources else f"NLTK data that is not on disk{detail}"
    fetch = f"python -m nltk.downloader {' '.join(resources)}" if resources else "python -m nltk.downloader NAME"
    return TaskError(f"ta:{game} needs {what}, which TextArena downloads at run time (nltk.download); AgentJet "
                     f"does not let a game download: fetch it once beforehand ({fetch}) or pick a game that runs "
                     "offline (docs/environments.md)")


@contextmanager
def no_downloads(game: str) -> Iterator[None]:
    """While a game's code runs: ``nltk.download`` of data that is not on disk raises a ``TaskError`` naming the
    game and the data (instead of a network call that may hang), and NLTK's missing-resource error becomes one."""
    try:
        import nltk
    except ImportError:  # textarena without nltk: nothing to guard
        yield
        return
    real = nltk.download

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        ids = [info_or_id] if isinstance(info_or_id, str) else [str(i) for i in (info_or_id or [])]
        missing = [i for i in ids if not nltk_has(i)]
        if missing or not ids:
            raise _download_error(game, missing or ["all"])
        return True  # already on disk: nothing to fetch

    nltk.download = refuse
    try:
        yield
    except LookupError as exc:  # NLTK's own (not a KeyError): a corpus read found no data (a game swallowed the refusal)
        if type(exc) is not LookupError:
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise _download_error(game, None, f" ({first})" if first else "") from exc
    finally:
        nltk.download = real


def env_class(game: str, spec: Any) -> Any:
    """The environment class of ``spec`` (importing its module, where the word games download)."""
    entry = spec.entry_point
    if not isinstance(entry, str):
        return entry
    module, _, name = entry.partition(":")
    with no_downloads(game):
        return getattr(importlib.import_module(module), name)


# ---- one game ----------------------------------------------------------------------------------------------


def render(messages: list[Any], player: int = PLAYER) -> str:
    """TextArena's raw observations as one user message: the game's prompt as is, other messages as
    ``[GAME] text`` (or ``[Player N] text``); the player's own move is left out (the chat has it), also when a
    game echoes it as its own message (TowerOfHanoi)."""
    ta = _textarena()
    lines = []
    for sender, text, kind in messages:
        if kind == ta.ObservationType.PLAYER_ACTION and sender in (player, ta.GAME_ID):
            continue
        if kind == ta.ObservationType.PROMPT:
            lines.append(str(text))
        else:
            lines.append(f"[{'GAME' if sender == ta.GAME_ID else f'Player {sender}'}] {text}")
    return "\n".join(lines) if lines else "[GAME] Your move."


class TextArenaGame:
    """One TextArena environment behind the runner's ``TextGame`` interface, seen from seat ``PLAYER``."""

    def __init__(self, spec: GameSpec) -> None:
        ta = _textarena()
        known = registry()
        check_game_name(spec.game, sorted(known))
        entry = known[spec.game]
        cls = env_class(spec.game, entry)
        try:
            with no_downloads(spec.label()):  # some games load their word lists here
                env = cls(**{**entry.kwargs, **spec.knobs})
        except TypeError as exc:
            params = sorted(p for p in inspect.signature(cls).parameters if p != "self")
            raise TaskError(f"ta:{spec.label()}: TextArena refuses these knobs ({exc}); its knobs are {params}") from exc
        for wrapper in entry.default_wrappers or []:  # its action wrappers only: observations are rendered here
            if issubclass(wrapper, ta.ActionWrapper):
                env = wrapper(env)
        self.spec = spec
        self.env = env
        self.max_calls = max(MIN_CALLS, 2 * int(getattr(env, "max_turns", 0) or 0))
        self._random: Any = None

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Python's global ``random`` holds this game's state while its code runs, and the caller's after."""
        outer = random.getstate()
        if self._random is not None:
            random.setstate(self._random)
        try:
            with no_downloads(self.spec.label()):
                yield
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def reset(self, seed: int) -> str:
        self._random = None
        with self._own_random():
            random.seed(seed)
            try:
                self.env.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError) as exc:
                raise self._not_single_player(f"one player refused: {exc or type(exc).__name__}") from exc
            if not isinstance(self.env.state, _textarena().SinglePlayerState):
                raise self._not_single_player(f"its state is a {type(self.env.state).__name__}")
            player, messages = self.env.get_observation()
        return render(messages, player)

    def _not_single_player(self, why: str) -> TaskError:
        return TaskError(f"ta:{self.spec.label()} is not a single-player game ({why}); only single-player games run "
                         "for now")

    def step(self, action: str) -> Step:
        with self._own_random():
            done, _ = self.env.step(action)
            if not done:
                player, messages = self.env.get_observation()
                return Step(render(messages, player), done=False)
            rewards, info = self.env.close()
        reason = (info or {}).get(PLAYER, {}).get("reason") or ""
        return Step("", done=True, reward=float((rewards or {}).get(PLAYER, 0.0)), reason=str(reason))


# ---- the task source ---------------------------------------------------------------------------------------


def split_seeds(split: str) -> range:
    """The game seeds of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return range(TRAIN_SEEDS) if split == "train" else range(EVAL_SEED0, EVAL_SEED0 + EVAL_SEEDS)


class TextArenaTask:
    """The task source of a ``ta:`` name (``agentjet.tasks.source.TaskSource``); a multi-turn task (``rollout``)."""

    SAMPLING = SAMPLING
    EVAL_SAMPLING = EVAL_SAMPLING
    RECOMMENDED = RECOMMENDED
    EpisodeTrace = GameTrace  # the runner traces each game (the demo keeps the first eval games' transcripts)

    def __init__(self, specs: GameSpec | list[GameSpec], name: str | None = None) -> None:
        specs = [specs] if isinstance(specs, GameSpec) else list(specs)
        if not specs:
            raise TaskError("ta: needs a TextArena game id, e.g. ta:GuessTheNumber-v0")
        self.NAME = name or PREFIX + "+".join(s.label() for s in specs)
        self.specs = {s.game: s for s in specs}  # by task type: one per game
        for spec in specs:
            try:  # fail now, at the name, on a game that cannot run here (downloads, seats, knobs, its own bugs)
                TextArenaGame(spec).reset(0)
            except TaskError:
                raise
            except Exception as exc:
                raise TaskError(f"ta:{spec.label()} does not start here: TextArena raised {type(exc).__name__}: "
                                f"{str(exc).strip()[:300]}") from exc
        if len(specs) > 1:
            self.RECOMMENDED = RECOMMENDED.model_copy(update={"eval_n": RECOMMENDED.eval_n * len(specs),
                                                              "task_ratios": {g: 1 / len(specs) for g in self.specs}})

    @property
    def spec(self) -> GameSpec:
        """The one game's spec (a mixture has one per task type: ``specs``)."""
        if len(self.specs) != 1:
            raise TaskError(f"{self.NAME} is a mixture of {len(self.specs)} games: pick one from .specs")
        return next(iter(self.specs.values()))

    def spec_of(self, task: dict[str, Any]) -> GameSpec:
        """The spec of the game a task plays (its task type)."""
        return self.specs[str(task["task_type"])]

    def new_game(self, game: str | None = None) -> TextArenaGame:
        """A fresh game: the task type ``game``'s (default: the one game of a single-game source)."""
        return TextArenaGame(self.spec if game is None else self.specs[game])

    @staticmethod
    def _id(spec: GameSpec) -> str:
        label = spec.label()
        return spec.game + (f"-{hashlib.sha256(label.encode()).hexdigest()[:8]}" if label != spec.game else "")

    def make_task(self, split: str, seed: int, game: str | None = None) -> dict[str, Any]:
        spec = self.spec if game is None else self.specs[game]
        return {"task_id": f"ta-{self._id(spec)}-{split}-{seed}", "task_type": spec.game, "split": split,
                "game": spec.label(), "seed": seed}

    def generate_tasks(self, split: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` games from ``split``, the games of a mixture in turn (equal shares); each game a seeded sample of
        the split's seeds (cycling when its share exceeds them). Deterministic in (split, n, seed)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        seeds = split_seeds(split)
        games = list(self.specs)
        shares = {g: len(range(i, n, len(games))) for i, g in enumerate(games)}
        picked = {g: random.Random(f"ta:{self.specs[g].label()}:{split}:{seed}").sample(seeds, min(k, len(seeds)))
                  for g, k in shares.items()}
        return [self.make_task(split, game_seed, game) for game, game_seed in in_turn(picked, n)]

    async def rollout(self, task: dict[str, Any], ep: Any, sampling: dict[str, Any], *,
                      trace: GameTrace | None = None) -> float:
        """One game on the episode's OpenAI client (``agentjet.tasks.games.play``); the game's reward (or, with
        ``reward=win``, 1.0 for a win only)."""
        spec = self.spec_of(task)
        game = TextArenaGame(spec)
        paid = spec.reward.of(await play(game, ep.openai(), int(task["seed"]), sampling,
                                         max_calls=game.max_calls, trace=trace))
        if trace is not None:
            trace.reward = paid
        return paid

    def ladders(self) -> dict[str, TaskLadder]:
        """The difficulty levels of each game that has them (``LEVELLED_GAMES``), by task type (the game id); in a
        mixture where some have them, each other game is one level, as named. None when no game has levels."""
        if not LEVELLED_GAMES.keys() & self.specs.keys():
            return {}
        return {game: game_ladder(spec) if game in LEVELLED_GAMES else fixed_ladder(spec)
                for game, spec in self.specs.items()}

    def reward(self, task: dict[str, Any], text: str) -> float:
        """The game's reward when ``text`` is the first move at the task's seed (0.0 if the game goes on). The
        episode's reward is ``rollout``'s, over the whole game."""
        spec = self.spec_of(task)
        game = TextArenaGame(spec)
        game.reset(int(task["seed"]))
        step = game.step(text)
        return spec.reward.of(step.reward) if step.done else 0.0


def game_ladder(spec: GameSpec) -> TaskLadder:
    """A game's levels (``LEVELLED_GAMES``): its spec with each level's knobs; the named level is the one its
    registered arguments and knobs equal."""
    rungs = LEVELLED_GAMES[spec.game]
    mine = {**dict(registry()[spec.game].kwargs), **spec.knobs}
    named = next((k for k, knobs in enumerate(rungs) if all(mine.get(f) == v for f, v in knobs.items())), None)
    other = {k: v for k, v in spec.knobs.items() if k not in rungs[0]}

    def make(k: int) -> TextArenaTask:
        return TextArenaTask(GameSpec(spec.game, {**other, **rungs[k]}, spec.reward))

    labels = tuple(",".join(f"{f}={v}" for f, v in knobs.items()) for knobs in rungs)
    return TaskLadder(task_type=spec.game, labels=labels, make=make, start=named if named is not None else 0,
                      named=named)


def fixed_ladder(spec: GameSpec) -> TaskLadder:
    """A game without levels in a mixture that has them: one level, the game as named."""
    return TaskLadder(task_type=spec.game, labels=(f"as named: {spec.label()}",), make=lambda _: TextArenaTask(spec),
                      start=0, named=0)


@lru_cache(maxsize=16)
def load(name: str) -> TextArenaTask:
    """The task source of ``ta:...`` (cached per process): one game, or a mixture ``ta:A+B``."""
    return TextArenaTask(parse_names(name), name)
