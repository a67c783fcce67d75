"""The one error of the Tinker domain (``server.http.tinker_api`` renders it as a 4xx, or inside a failed future)."""

from __future__ import annotations


class TinkerError(Exception):
    """A refusal the SDK can act on: an HTTP status (4xx only) and a message; or, inside a future, a failed
    result with a category (``user`` for bad input, ``server`` for the server's own faults)."""

    def __init__(self, message: str, status: int = 400, category: str = "user") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.category = category
