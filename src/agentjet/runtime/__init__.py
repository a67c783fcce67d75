"""Runtime helpers for every process: supervision of children, launching a server, the injectable clock, SQLite files, provenance of measurements, OpenMP set-up."""
