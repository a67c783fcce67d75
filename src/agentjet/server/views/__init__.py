"""The read side: the run's one snapshot (``run_state``), and the status and dashboard views rendered from it."""
