"""The placeholders a command job's arguments may use (:mod:`scenarios.command_job`), checked
when a scenario file is read (:mod:`scenarios.schema`)."""

from __future__ import annotations

import string
from collections.abc import Sequence

#: The placeholders a command may use.
PLACEHOLDERS = ("python", "run_dir", "steps", "save_every", "seed", "step_sleep", "scenario_dir")


def check(command: Sequence[str]) -> list[str]:
    """``command`` if every placeholder in it is known and well formed.

    Raises:
        ValueError: an empty command, an unknown placeholder (the message lists the valid
            ones) or unbalanced braces.
    """
    if not command:
        raise ValueError("a command job needs at least one argument")
    for arg in command:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
        except ValueError as e:
            raise ValueError(f"{arg!r}: {e} (write {{{{ and }}}} for literal braces)") from None
        for name in fields:
            if name not in PLACEHOLDERS:
                valid = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                raise ValueError(f"{arg!r}: unknown placeholder {{{name}}}; valid: {valid}")
    return list(command)
