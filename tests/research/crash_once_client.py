"""A trial client that crashes on its first attempt (no result written), then runs the built-in one.

    python crash_once_client.py MARKER -- <trial_client arguments>
"""

import sys
from pathlib import Path

marker = Path(sys.argv[1])
if not marker.exists():
    marker.write_text("crashed once")
    sys.exit(3)

from agentjet.apps.research.trial_client import main  # noqa: E402

sys.exit(main(sys.argv[3:]))
