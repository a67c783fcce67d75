"""The Tinker training API's domain (issue 35): sessions with leases on the server's clock, the registry of Tinker
training clients (each one LoRA adapter of the served base), the futures the SDK polls, each model's ``seq_id``
order, checkpoints and sampling clients; one module a concern, composed in ``service.TinkerService``. No web
framework here: ``server.http.tinker_api`` is the HTTP edge."""

from agentjet.server.tinker.errors import TinkerError
from agentjet.server.tinker.models import TinkerModel
from agentjet.server.tinker.service import TinkerService

__all__ = ["TinkerError", "TinkerModel", "TinkerService"]
