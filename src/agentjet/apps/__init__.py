"""The applications built on the library: the demo, `ajet up`, export, bench and research."""
