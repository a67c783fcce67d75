"""See the training: metrics (Prometheus, a JSONL file, TensorBoard / W&B), the dashboard (pages, JSON APIs and
the token-level trace viewer) and the benchmark history (``ajet bench``).

Layering: this room sits below ``server``. It defines what it needs from a running server as protocols and
plain data (``schema``); ``agentjet.server.views.observe_source`` implements them on a ``SwarmServer``, and
``agentjet.server.http.app`` mounts the routes.
"""

from agentjet.settings import LogSink, ObserveSettings

__all__ = ["LogSink", "ObserveSettings"]
