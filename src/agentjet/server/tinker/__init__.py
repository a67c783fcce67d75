"""The Tinker training API's domain (issue 35): sessions with leases on the server's clock, the registry of Tinker
training clients (each one LoRA adapter of the served base), the futures the SDK polls, and each model's
``seq_id`` order. No web framework here: ``server.http.tinker_api`` is the HTTP edge."""

from agentjet.server.tinker.service import TinkerError, TinkerModel, TinkerService

__all__ = ["TinkerError", "TinkerModel", "TinkerService"]
