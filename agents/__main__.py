"""``python -m agents run ...`` / ``parse ...``: the agent without the rest of ``recover``."""

import sys

from agents.cli import main

sys.exit(main())
