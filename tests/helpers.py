"""Helpers shared by test packages (import from here, never from another test module)."""

from __future__ import annotations

import signal
import subprocess


def kill_and_drain(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGKILL ``proc`` and return the rest of its stdout and stderr.

    Reads through the same buffered streams that ``proc.stdout.readline()`` uses:
    ``communicate()`` reads the raw pipes and misses lines readline had already buffered,
    which under load made crash tests lose track of what the child had reported.
    """
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    assert proc.stderr is not None
    with proc.stdout, proc.stderr:
        return proc.stdout.read(), proc.stderr.read()
