"""Headless Chromium for the dashboard tests: Debian's `chromium` package driven by Python Playwright
(Playwright's own browser download cannot work here). Tests skip with a plain reason when it is missing."""

from __future__ import annotations

import os
import shutil

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """$AGENTJET_CHROMIUM, else /usr/bin/chromium, else a `chromium` on PATH."""
    for candidate in (os.environ.get("AGENTJET_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def skip_reason() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the dashboard browser tests need Python playwright (pip install -e '.[dev]')"
    if chromium_path() is None:
        return ("the dashboard browser tests need a chromium: apt-get install -y chromium (or set AGENTJET_CHROMIUM); "
                "skipped")
    return None
