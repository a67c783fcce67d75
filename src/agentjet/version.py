"""The package version, in one place: pyproject reads it (dynamic version), ``ajet --version`` prints it, the
server reports it. A leaf module, so any layer may import it."""

__version__ = "0.1.0"
