"""The server's clock is the project's one injectable clock (``agentjet.clock``): the registry (leases) and the
trainer (group timeouts, absent task types) read it, so their timing rules are tested with a fake clock."""

from agentjet.clock import Clock, FakeClock, SystemClock

__all__ = ["Clock", "FakeClock", "SystemClock"]
