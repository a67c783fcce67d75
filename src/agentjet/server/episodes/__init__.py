"""The episode lifecycle: registry and leases, keys, admission, chat calls and ingest, team two-phase commits."""
