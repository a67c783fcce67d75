"""Chaos tests: a real server process and client processes, with SIGKILLs on both sides."""
