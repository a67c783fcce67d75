"""A multi-turn runner for text games: any environment with a reset/step text interface (``TextGame``), played
by the episode's OpenAI client. TextArena is the first adapter (``agentjet.tasks.ta``).

One episode is one game. ``reset(seed)`` gives the model's first observation (the rules and the opening
position); each turn is one chat call whose reply is the model's move, handed to ``step``; the game's next
observation goes back as a user message. The messages only ever grow (system, user, assistant, user, ...), so
each call's prompt extends the previous call's prompt and reply, and the server's timeline merging trains the
whole game as one sample. The reward is the game's own reward for the model's player when the game ends.

A game that has not ended after ``max_calls`` chat calls scores 0.0 (the trace says so): a cap for games
without a turn limit of their own. Pure Python: no server or client imports (the client is duck-typed, as in
``agentjet.tasks.calculator``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

SYSTEM = ("You are playing a text game. Read the game's instructions carefully and reply with your move in "
          "exactly the format they ask for.")
TURN_CAP_REASON = "the game did not end within the runner's cap on chat calls"


@dataclass(frozen=True)
class Step:
    """What a game says after one move: the next observation for the model's player, whether the game is
    over, and (when it is) the game's reward for that player and the game's reason."""

    observation: str
    done: bool
    reward: float = 0.0
    reason: str = ""


class TextGame(Protocol):
    """A game with a text interface, seen from one player (the model's)."""

    def reset(self, seed: int) -> str:
        """Start a game (deterministic in ``seed``) and return the model's first observation."""
        ...

    def step(self, action: str) -> Step:
        """Play the model's move ``action`` (its reply, verbatim) and return what comes back to it."""
        ...


@dataclass
class GameTrace:
    """What happened in one game: the chat (every message the model saw, and its moves), the number of chat
    calls, the reward (the game's; a task that pays otherwise, e.g. ``ta:...:reward=win``, puts its own here and
    keeps the game's in ``game_reward``) and the game's reason for ending."""

    messages: list[dict[str, str]] = field(default_factory=list)
    calls: int = 0
    reward: float = 0.0
    reason: str = ""
    done: bool = False
    game_reward: float = 0.0

    @property
    def transcript(self) -> list[str]:
        """The game as read by a person: each message after the system prompt, ``role: text``, then the end."""
        lines = [f"{m['role']}: {m['content']}" for m in self.messages if m["role"] != "system"]
        return [*lines, f"end: {self.reason or 'not ended'} (game reward {self.game_reward:g})"]


def reply_text(reply: Any) -> str:
    """The text of an OpenAI chat completion's first choice ('' when it has none)."""
    return str(reply.choices[0].message.content or "")


async def play(game: TextGame, client: Any, seed: int, sampling: dict[str, Any], *, model: str = "agent",
               system: str | None = SYSTEM, max_calls: int = 64, trace: GameTrace | None = None) -> float:
    """Play one game with ``client`` (an ``openai.AsyncOpenAI``, e.g. ``ep.openai()``): one chat call per move,
    each call's messages extending the previous ones. Returns the game's reward for the model's player."""
    trace = trace if trace is not None else GameTrace()
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": game.reset(seed)})
    trace.messages = messages
    while trace.calls < max_calls:
        reply = await client.chat.completions.create(model=model, messages=list(messages), **sampling)
        trace.calls += 1
        action = reply_text(reply)
        messages.append({"role": "assistant", "content": action})
        step = game.step(action)
        if step.done:
            trace.reward, trace.reason, trace.done = float(step.reward), step.reason, True
            trace.game_reward = trace.reward
            return trace.reward
        messages.append({"role": "user", "content": step.observation})
    trace.reward, trace.reason = 0.0, TURN_CAP_REASON
    return 0.0
