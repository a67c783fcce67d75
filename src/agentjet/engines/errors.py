"""Errors an engine raises that the layers above map to a clear answer (HTTP 503, a halted trainer)."""

from __future__ import annotations


class GenerationError(ValueError):
    """A request the engine cannot serve because of its own input (a 4xx): names the offending parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineUnavailableError(RuntimeError):
    """Generation cannot be served right now (e.g. the rollout engine's process crashed and is restarting).
    The server answers 503 with ``Retry-After``; the request may be retried."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TrainingHaltedError(RuntimeError):
    """Training must stop: going on would train on wrong data (e.g. the rollout engine serves weights that do
    not match the trainer's). The trainer pauses and reports the message instead of retrying."""
