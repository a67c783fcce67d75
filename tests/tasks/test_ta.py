"""The multi-turn game runner (``agentjet.tasks.games``) and its TextArena adapter (``ta:GAME``,
``agentjet.tasks.ta``): the reward is the game's own, the turns extend one chat so the server merges them into one
sample, games are seeded with eval seeds apart from train's, and the games that would download, need more seats or
do not exist fail with a message that says so. Nothing here downloads; the model is scripted."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentjet.tasks import TaskError, games, get_task, ta

NEEDS_TA = pytest.mark.skipif(importlib.util.find_spec("textarena") is None,
                              reason="textarena is not installed: pip install 'agentjet[ta]' (the dev extra has it)")
GUESS = "ta:GuessTheNumber-v0"  # a number in 1..20, 10 turns, "higher"/"lower" hints
HANOI = "ta:TowerOfHanoi-v0"  # 3 disks, the same start at every seed
HANOI_SOLUTION = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


# ---- a scripted model ------------------------------------------------------------------------------------------


def binary_search_move(transcript: str, low: int = 1, high: int = 20) -> str:
    """The next guess of a binary search over GuessTheNumber, read from the chat so far (after the rules)."""
    history = transcript.split("Enter your guess.", 1)[-1]
    events = re.findall(r"\[(\d+)\]|target number is (higher|lower)", history)
    guess = None
    for number, hint in events:
        if number:
            guess = int(number)
        elif guess is not None:
            low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return f"[{(low + high) // 2}]"


def _reply(text: str) -> Any:
    message = type("M", (), {"content": text})
    return type("R", (), {"choices": [type("C", (), {"message": message})]})


class ScriptedClient:
    """An OpenAI-SDK-shaped client whose replies come from ``move(messages)``; it records every call's messages."""

    def __init__(self, move: Any) -> None:
        self.move = move
        self.sent: list[list[dict[str, str]]] = []
        self.chat = type("Chat", (), {"completions": self})()

    async def create(self, *, model: str, messages: list[dict[str, str]], **sampling: Any) -> Any:
        self.sent.append([dict(m) for m in messages])
        return _reply(self.move(messages))


class ScriptedEpisode:
    def __init__(self, client: ScriptedClient) -> None:
        self.client = client

    def openai(self) -> ScriptedClient:
        return self.client


def _chat_text(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


def _extends(calls: list[list[dict[str, str]]]) -> bool:
    """Each call's messages begin with the previous call's messages (what timeline merging needs)."""
    return all(later[:len(earlier)] == earlier for earlier, later in zip(calls, calls[1:], strict=False))


# ---- the runner, on a game of its own (no TextArena) -----------------------------------------------------------


class CountDown:
    """A toy TextGame: say the numbers from ``start`` down to 1; a wrong number ends the game with reward 0.25."""

    def __init__(self, start: int = 3) -> None:
        self.start = start

    def reset(self, seed: int) -> str:
        self.next = self.start + seed
        return f"Count down from {self.next}."

    def step(self, action: str) -> games.Step:
        if action.strip() != str(self.next):
            return games.Step("", done=True, reward=0.25, reason="wrong number")
        self.next -= 1
        if self.next == 0:
            return games.Step("", done=True, reward=1.0, reason="done")
        return games.Step("next", done=False)


async def test_the_runner_plays_until_the_game_ends_and_returns_its_reward() -> None:
    def count(messages: list[dict[str, str]]) -> str:
        return str(int(re.findall(r"\d+", messages[1]["content"])[0]) - sum(m["role"] == "assistant" for m in messages))

    client = ScriptedClient(count)
    trace = games.GameTrace()
    assert await games.play(CountDown(), client, seed=1, sampling={"max_tokens": 8}, trace=trace) == 1.0
    assert trace.calls == 4 and trace.done and trace.reason == "done"
    assert [m["role"] for m in client.sent[-1]] == ["system", "user"] + ["assistant", "user"] * 3
    assert _extends(client.sent)
    assert [m["content"] for m in trace.messages if m["role"] == "assistant"] == ["4", "3", "2", "1"]

    wrong = ScriptedClient(lambda messages: "7")
    assert await games.play(CountDown(), wrong, seed=0, sampling={}) == 0.25  # whatever the game gives
    assert len(wrong.sent) == 1


async def test_a_game_that_does_not_end_scores_zero_at_the_runners_cap() -> None:
    class Endless:
        def reset(self, seed: int) -> str:
            return "go"

        def step(self, action: str) -> games.Step:
            return games.Step("again", done=False)

    client = ScriptedClient(lambda messages: "x")
    trace = games.GameTrace()
    assert await games.play(Endless(), client, seed=0, sampling={}, max_calls=5, trace=trace) == 0.0
    assert len(client.sent) == 5 and not trace.done and trace.reason == games.TURN_CAP_REASON


# ---- names (no TextArena needed) --------------------------------------------------------------------------------


def test_names_and_knobs_parse() -> None:
    spec = ta.parse_name("ta:GuessTheNumber-v0:max_number=50,min_number=1")
    assert spec == ta.GameSpec("GuessTheNumber-v0", {"max_number": 50, "min_number": 1})
    assert spec.label() == "GuessTheNumber-v0:max_number=50,min_number=1"
    assert ta.parse_name("ta:TowerOfHanoi-v0").knobs == {}
    with pytest.raises(TaskError, match="needs a TextArena game id"):
        ta.parse_name("ta:")
    with pytest.raises(TaskError, match="must look like name=value"):
        ta.parse_name("ta:GuessTheNumber-v0:max_number")


def test_without_textarena_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textarena", None)  # None in sys.modules: ImportError on import
    with pytest.raises(TaskError, match=r"pip install 'agentjet\[ta\]'"):
        ta.TextArenaTask(ta.parse_name("ta:SomeGame-v0"))


def test_close_names_are_listed_without_the_wrapper_variants() -> None:
    known = ["GuessTheNumber-v0", "GuessTheNumber-v0-raw", "GuessTheNumber-v0-train", "GuessTheNumber-v0-hardcore",
             "TowerOfHanoi-v0"]
    with pytest.raises(TaskError, match=r"close names: GuessTheNumber-v0, GuessTheNumber-v0-hardcore\)"):
        ta.check_game_name("GuessTheNumbr-v0", known)
    with pytest.raises(TaskError, match="no close names"):
        ta.check_game_name("zzzzzz", known)
    ta.check_game_name("GuessTheNumber-v0-raw", known)  # a real id passes


# ---- TextArena ---------------------------------------------------------------------------------------------------


@NEEDS_TA
def test_an_unknown_game_lists_close_names_at_every_entry_point() -> None:
    from agentjet.cli import app

    with pytest.raises(TaskError, match=r"unknown TextArena game 'GuessTheNumbr-v0' \(close names: GuessTheNumber-v0"):
        get_task("ta:GuessTheNumbr-v0")
    result = CliRunner().invoke(app, ["demo", "--task", "ta:TowerOfHanoy-v0"])
    assert result.exit_code == 2, result.output
    assert "unknown TextArena game 'TowerOfHanoy-v0'" in result.output and "TowerOfHanoi-v0" in result.output


@NEEDS_TA
@pytest.mark.parametrize(("game", "data"), [("Hangman-v0", r"\['words'\]"),  # downloads at import
                                             ("Wordle-v0", r"\['averaged_perceptron_tagger_eng'\]"),  # in a try
                                             ("SpellingBee-v0", r"\['words'\]")])  # in its constructor
def test_a_game_that_downloads_fails_naming_the_game_and_the_data(
        game: str, data: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, network_attempts: list[str]) -> None:
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # no NLTK data on disk, whatever this machine has
    with pytest.raises(TaskError, match=rf"ta:{game} needs the NLTK data {data}.*nltk.downloader"):
        get_task(f"ta:{game}")
    assert network_attempts == []  # refused before any connection
    assert nltk.download.__module__.startswith("nltk")  # the guard is gone afterwards


@NEEDS_TA
def test_data_already_on_disk_is_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with ta.no_downloads("G"), pytest.raises(TaskError, match=r"ta:G needs the NLTK data \['words'\]"):
        nltk.download("words")
    (tmp_path / "corpora" / "words").mkdir(parents=True)
    with ta.no_downloads("G"):
        assert nltk.download("words") is True
        with pytest.raises(KeyError):  # only NLTK's own missing-data error is read as one
            raise KeyError("not about data")


@NEEDS_TA
@pytest.mark.parametrize("game", ["TicTacToe-v0", "QuantumTicTacToe-v0"])  # the second accepts one player
def test_a_game_for_more_players_is_refused(game: str) -> None:
    with pytest.raises(TaskError, match=rf"ta:{game} is not a single-player game"):
        get_task(f"ta:{game}")


@NEEDS_TA
def test_bad_knobs_name_the_games_knobs() -> None:
    with pytest.raises(TaskError, match=r"its knobs are \['max_number', 'max_turns', 'min_number'\]"):
        get_task("ta:GuessTheNumber-v0:max_numbr=5")
    task = get_task("ta:GuessTheNumber-v0:max_number=3")
    game = task.new_game()
    assert "between 1 and 3" in game.reset(0)
    assert task.generate_tasks("train", 1)[0]["task_id"].startswith("ta-GuessTheNumber-v0-")  # no comma in an id


@NEEDS_TA
def test_games_are_seeded_and_eval_seeds_are_apart_from_train() -> None:
    task = get_task(GUESS)
    assert get_task(GUESS) is task  # one resolver, cached per process
    train = task.generate_tasks("train", 3000, seed=0)
    ev = task.generate_tasks("eval", task.RECOMMENDED.eval_n, seed=0)
    assert {t["seed"] for t in train}.isdisjoint(t["seed"] for t in ev)
    assert len({t["task_id"] for t in ev}) == task.RECOMMENDED.eval_n >= 50
    assert task.generate_tasks("eval", 64, seed=0) == ev[:64] and task.generate_tasks("train", 5, seed=1) != train[:5]
    assert all(t["task_id"] == f"ta-GuessTheNumber-v0-{t['split']}-{t['seed']}" for t in train[:5] + ev[:5])
    with pytest.raises(ValueError):
        task.generate_tasks("test", 1)

    def target(seed: int) -> int:
        game = task.new_game()
        game.reset(seed)
        return int(game.env.game_number)

    outer = random.getstate()
    targets = [target(t["seed"]) for t in ev[:20]]
    assert targets == [target(t["seed"]) for t in ev[:20]]  # the same seed is the same game
    assert len(set(targets)) > 5  # and the seed decides it
    assert random.getstate() == outer  # TextArena seeds the global random: the game's state is its own


@NEEDS_TA
async def test_the_reward_is_the_games_own_for_the_models_player() -> None:
    import textarena

    task_src = get_task(GUESS)
    for task in task_src.generate_tasks("eval", 6):
        client = ScriptedClient(lambda messages: binary_search_move(_chat_text(messages)))
        trace = games.GameTrace()
        assert await task_src.rollout(task, ScriptedEpisode(client), {}, trace=trace) == 1.0  # binary search wins
        assert trace.reason.startswith("Congratulations") and 1 <= trace.calls <= 5 and _extends(client.sent)
        # a player that repeats itself: the game's partial score, as TextArena itself gives it to the same moves
        stubborn = ScriptedClient(lambda messages: "[10]")
        got = await task_src.rollout(task, ScriptedEpisode(stubborn), {})
        env = textarena.make("GuessTheNumber-v0")
        env.reset(num_players=1, seed=task["seed"])
        for _ in stubborn.sent:
            env.step("[10]")
        rewards, _ = env.close()
        assert got == rewards[0]
        assert got == (1.0 if env.game_number == 10 else 1 - abs(10 - env.game_number) / 19)
    hanoi = get_task(HANOI)
    task = hanoi.generate_tasks("eval", 1)[0]
    moves = iter(HANOI_SOLUTION)
    client = ScriptedClient(lambda messages: next(moves))
    assert await hanoi.rollout(task, ScriptedEpisode(client), {}) == 1.0 and len(client.sent) == 7
    assert "[A C]" not in client.sent[1][-1]["content"]  # the game's echo of the move is not repeated to the model
    assert hanoi.reward(task, " ".join(HANOI_SOLUTION)) == 1.0 and hanoi.reward(task, "[A C]") == 0.0


@NEEDS_TA
async def test_reward_win_pays_a_win_only_and_the_game_is_told_nothing_of_it() -> None:
    """``reward=win``: GuessTheNumber's partial credit for a close guess (which a trained policy learned to collect
    by ending the game early with an invalid move) pays 0; a win pays 1.0, as the game's own reward does."""
    spec = ta.parse_name(GUESS + ":reward=win")
    assert spec.reward is ta.GameReward.WIN and spec.knobs == {} and spec.label() == "GuessTheNumber-v0:reward=win"
    assert ta.parse_name(GUESS).label() == "GuessTheNumber-v0"
    with pytest.raises(TaskError, match="reward='wins' is not one of"):
        ta.parse_name(GUESS + ":reward=wins")
    wins, plain = get_task(GUESS + ":reward=win"), get_task(GUESS)
    assert wins.make_task("eval", 3)["task_id"] != plain.make_task("eval", 3)["task_id"]  # another task, another id
    for task in wins.generate_tasks("eval", 4):
        won = ScriptedClient(lambda messages: binary_search_move(_chat_text(messages)))
        assert await wins.rollout(task, ScriptedEpisode(won), {}) == 1.0
        stubborn = ScriptedClient(lambda messages: "[10]")
        partial = await plain.rollout(task, ScriptedEpisode(ScriptedClient(lambda messages: "[10]")), {})
        assert await wins.rollout(task, ScriptedEpisode(stubborn), {}) == (1.0 if partial == 1.0 else 0.0)
        assert partial > 0.0  # the game's own reward pays the close guess



@NEEDS_TA
async def test_a_mixture_of_games_is_one_task_type_per_game_with_equal_shares() -> None:
    """``ta:A+B``: the games take turns, each keeps its own held-out games (the first of its single-game source's),
    its own knobs and reward, and the cocktail gives each an equal share of a batch."""
    name = f"{GUESS}:reward=win+{HANOI.removeprefix('ta:')}"
    mix = get_task(name)
    assert [s.label() for s in ta.parse_names(name)] == ["GuessTheNumber-v0:reward=win", "TowerOfHanoi-v0"]
    assert mix.RECOMMENDED.task_ratios == {"GuessTheNumber-v0": 0.5, "TowerOfHanoi-v0": 0.5}
    assert mix.RECOMMENDED.eval_n == 2 * get_task(GUESS).RECOMMENDED.eval_n
    ev = mix.generate_tasks("eval", 10)
    assert [t["task_type"] for t in ev] == ["GuessTheNumber-v0", "TowerOfHanoi-v0"] * 5
    guess_alone = get_task(GUESS + ":reward=win").generate_tasks("eval", 5)
    assert [t for t in ev if t["task_type"] == "GuessTheNumber-v0"] == guess_alone
    assert mix.generate_tasks("eval", 10) == ev and len({t["task_id"] for t in ev}) == 10
    # each task is played by its own game, paid by its own rule
    hanoi = next(t for t in ev if t["task_type"] == "TowerOfHanoi-v0")
    solved = iter(HANOI_SOLUTION)
    assert await mix.rollout(hanoi, ScriptedEpisode(ScriptedClient(lambda messages: next(solved))), {}) == 1.0
    guess = next(t for t in ev if t["task_type"] == "GuessTheNumber-v0")
    stubborn = ScriptedClient(lambda messages: "[10]")
    partial = await get_task(GUESS).rollout(guess, ScriptedEpisode(ScriptedClient(lambda messages: "[10]")), {})
    assert await mix.rollout(guess, ScriptedEpisode(stubborn), {}) == (1.0 if partial == 1.0 else 0.0)
    with pytest.raises(TaskError, match="is a mixture of 2 games"):
        _ = mix.spec
    with pytest.raises(TaskError, match=r"\['GuessTheNumber-v0'\] appear twice"):
        ta.parse_names(f"{GUESS}+GuessTheNumber-v0:reward=win")
    with pytest.raises(TaskError, match="an empty game id"):
        ta.parse_names(f"{GUESS}+")

@NEEDS_TA
async def test_the_runner_traces_each_game_so_the_demo_keeps_its_transcript() -> None:
    """A game task's episodes are traced (``EpisodeTrace``): the demo's JSON keeps the first eval games' chats
    (before, it kept none, and the transcripts had to be decoded from the server's store)."""
    from agentjet.apps.demo import question_of
    from agentjet.client.runner import task_workflow

    wins = get_task(GUESS + ":reward=win")
    traces: list[tuple[dict[str, Any], Any]] = []
    workflow = task_workflow(wins, {}, traces=traces)
    task = wins.generate_tasks("eval", 1)[0]
    paid = await workflow(task, ScriptedEpisode(ScriptedClient(lambda messages: "[10]")))  # type: ignore[arg-type]
    (_, trace), = traces
    assert isinstance(trace, games.GameTrace) and trace.reward == paid  # what the task paid
    assert trace.transcript[0].startswith("user: ") and "assistant: [10]" in trace.transcript
    assert trace.transcript[-1].startswith("end: ") and f"game reward {trace.game_reward:g}" in trace.transcript[-1]
    assert (paid == 1.0) == (trace.game_reward == 1.0) and question_of(task) == f"GuessTheNumber-v0:reward=win at " \
        f"seed {task['seed']}"


@NEEDS_TA
def test_a_game_through_the_swarm_merges_its_turns_into_one_sample(make_server, tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    from agentjet import SwarmClient
    from agentjet.client.runner import run_workflow, task_workflow
    from agentjet.layouts.null import NullGenerator, NullLearner, compose_null

    class BinarySearch(NullGenerator):  # the null engine, replying with the next guess read from the prompt
        async def generate(self, prompt_ids: list[int], sampling: Any, on_token: Any = None) -> Any:
            move = binary_search_move(self.tokenizer.decode(prompt_ids))
            self.reply_ids = list(self.tokenizer.encode(move, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
            return await super().generate(prompt_ids, sampling, on_token)

    generator = BinarySearch(AutoTokenizer.from_pretrained(tiny_model_path))
    srv = make_server(engine=compose_null(generator, NullLearner()))
    task_src = get_task(GUESS)
    tasks = task_src.generate_tasks("train", 3)

    async def main() -> Any:
        async with SwarmClient(srv.url) as client:
            return await run_workflow(client, task_workflow(task_src, task_src.SAMPLING), tasks, group_size=2,
                                      concurrency=4)

    def turns(seed: int) -> int:  # the same player, off the swarm
        game, chat, moves = task_src.new_game(), "", 0
        step = games.Step(game.reset(seed), done=False)
        while not step.done:
            move = binary_search_move(chat + step.observation)
            chat, moves = chat + step.observation + move, moves + 1
            step = game.step(move)
        return moves

    summary = asyncio.run(main())
    assert summary.failed == 0 and summary.rewards == [1.0] * 6  # the game's reward: binary search wins
    assert summary.calls == 2 * sum(turns(t["seed"]) for t in tasks) > summary.episodes == 6  # several turns a game
    assert summary.samples == 6  # each game's turns merged into one training sample
    last = generator.tokenizer.decode(generator.prompts[-1])
    assert "You are playing Guess The Number" in last and last.count("The target number is") >= 1
