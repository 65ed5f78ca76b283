"""The journald source: the kernel's lines as the journal keeps them, through
``journalctl -k -f -o json``.

Why besides ``/dev/kmsg``: the journal keeps the whole boot's kernel log where the ring buffer
may have overwritten its start (a fault logged long before the agent started), and a
container that may read the host's journal but not ``/dev/kmsg`` can use it. Only the kernel
transport is read (``-k``), so a busy user space cannot rotate a fault out before it is read.

Where it starts: at the start of this boot's kernel log (``-n all``), or after the cursor a
previous run of this boot saved (``--after-cursor``, :mod:`agents.readmark`), or at the end
(``from_start=False``). When ``journalctl`` exits (journald restarted, a rotated-away cursor)
it is started again after a pause, after the last entry read. Without ``journalctl`` on PATH
the source says so in one line and stops; the others go on.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agents.kmsg import KernelLogParser, to_event
from agents.logform import json_entry
from agents.readmark import Mark
from recovery.model import HealthEvent
from recovery.ports.clock import Clock

Emit = Callable[[HealthEvent, Mark], None]
Log = Callable[[str], None]
#: Pause before starting ``journalctl`` again after it exited, in seconds (doubling, capped).
RESTART_S = (0.5, 30.0)


@dataclass
class JournaldSource:
    """Follows the kernel log in the journal; see the module docstring. ``command`` is the
    ``journalctl`` to run (a path or a name on PATH)."""

    node: str
    boot_id: str
    clock: Clock
    buses: Mapping[str, int] | None = None
    command: Sequence[str] = ("journalctl",)
    from_start: bool = True
    resume: Mark | None = None
    log: Log = print
    agent_version: str = ""
    _cursor: str | None = field(default=None, init=False, repr=False)
    _parser: KernelLogParser = field(default_factory=KernelLogParser, init=False, repr=False)

    def argv(self) -> list[str]:
        """The command line for the next start of ``journalctl``."""
        argv = [*self.command, "-k", "-f", "-o", "json", "--no-pager"]
        cursor = self._cursor
        if cursor is None and self.resume is not None and self.resume.boot_id == self.boot_id:
            cursor = self.resume.cursor
        if cursor:
            return [*argv, f"--after-cursor={cursor}"]
        return [*argv, "-n", "all" if self.from_start else "0"]

    def run(self, emit: Emit, stop: threading.Event) -> None:
        """Read until ``stop``, handing each fault's event and its mark to ``emit``."""
        pause = RESTART_S[0]
        while not stop.is_set():
            argv = self.argv()
            try:
                proc = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
                )
            except FileNotFoundError:
                self.log(f"journald: {argv[0]} not found (no journald here?); source stopped")
                return
            read, why = self._follow(proc, emit, stop)
            if stop.is_set():
                return
            self.log(f"journald: {argv[0]} exited ({proc.returncode}): {why or 'no message'}; "
                     f"starting it again in {pause:g} s")  # fmt: skip
            if not read and any(a.startswith("--after-cursor") for a in argv):
                # a cursor the journal no longer has: read this boot's kernel log again (the
                # coordinator drops what it already has)
                self.resume, self._cursor = None, None
            stop.wait(pause)
            pause = RESTART_S[0] if read else min(pause * 2, RESTART_S[1])

    def _follow(
        self, proc: subprocess.Popen[bytes], emit: Emit, stop: threading.Event
    ) -> tuple[int, str]:
        """Read ``proc``'s entries until it exits or ``stop``; returns how many were read and
        what it said on stderr when it exited."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        read, partial = 0, b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            try:
                while not stop.is_set():
                    if not sel.select(timeout=0.2):
                        continue
                    chunk = _read_some(fd)
                    if chunk is None:
                        continue
                    if not chunk:
                        proc.wait()
                        err = proc.stderr.read() if proc.stderr else b""
                        return read, err.decode(errors="replace").strip()[-500:]
                    *lines, partial = (partial + chunk).split(b"\n")
                    for line in lines:
                        read += self._entry(line, emit)
            finally:
                _stop(proc)
        return read, ""

    def _entry(self, line: bytes, emit: Emit) -> int:
        entry = json_entry(line.decode("utf-8", errors="replace"))
        if entry is None:
            return 0
        cursor = entry.get("__CURSOR")
        if isinstance(cursor, str):
            self._cursor = cursor
        now = self.clock.now().wall
        for fault in self._parser.feed_entry(entry):
            event = to_event(
                fault,
                node=self.node,
                boot_id=self.boot_id,
                observed_at=now,
                buses=self.buses,
                agent_version=self.agent_version,
            )
            emit(event, Mark(self.boot_id, cursor=self._cursor))
        return 1


def _read_some(fd: int) -> bytes | None:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
