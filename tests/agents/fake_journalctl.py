"""A stand-in for ``journalctl`` in the journald source's tests (installed on PATH as
``journalctl``): it serves the entries of a journal kept as JSON lines and behaves as the real
one does for what the agent asks of it.

Reads ``$FAKE_JOURNAL`` (one JSON entry per line; the test appends to follow) and honours:
``-k``/``--dmesg`` (kernel transport of the boot ``$FAKE_BOOT_ID`` only), ``-f``/``--follow``
(keeps printing appended entries until SIGTERM), ``-o``/``--output`` ``json`` or ``json-seq``
(anything else is refused), ``-n``/``--lines`` ``N|all``, ``--no-tail``, ``--after-cursor``
(an unknown cursor fails as the real one does: a message on stderr and status 1),
``--no-pager``. With ``-f`` and no ``-n``/cursor it starts with the last 10 entries, like the
real one. Entries without ``__CURSOR`` get ``s=fake;i=<index>``. Every start is appended to
``$FAKE_JOURNAL.starts`` (its pid and arguments), so tests can see how it was called. Unlike
the real one (which notices only at its next write), it exits as soon as its parent is gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any


def _entries(path: str, boot: str | None, kernel_only: bool, offset: int) -> tuple[list[Any], int]:
    """Entries from byte ``offset`` of the journal file (complete lines only), and the new
    offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for number, line in enumerate(data[:end].splitlines()):
        if not line.strip():
            continue
        entry = json.loads(line)
        entry.setdefault("__CURSOR", f"s=fake;i={offset + number}")
        if kernel_only and (
            entry.get("_TRANSPORT") != "kernel" or (boot and entry.get("_BOOT_ID") != boot)
        ):
            continue
        out.append(entry)
    return out, offset + end


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    path = os.environ["FAKE_JOURNAL"]
    with open(path + ".starts", "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    kernel = follow = False
    output, lines, cursor = "short", None, None
    args = iter(argv)
    for arg in args:
        if arg in ("-k", "--dmesg"):
            kernel = True
        elif arg in ("-f", "--follow"):
            follow = True
        elif arg in ("-o", "--output"):
            output = next(args)
        elif arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg in ("-n", "--lines"):
            lines = next(args)
        elif arg.startswith("--lines="):
            lines = arg.split("=", 1)[1]
        elif arg == "--no-tail":
            lines = "all"
        elif arg == "--after-cursor":
            cursor = next(args)
        elif arg.startswith("--after-cursor="):
            cursor = arg.split("=", 1)[1]
        elif arg == "--no-pager":
            pass
        else:
            print(f"journalctl: unrecognized option '{arg}'", file=sys.stderr)
            return 1
    if output not in ("json", "json-seq"):
        print(f"fake journalctl: output mode {output!r} is not served here", file=sys.stderr)
        return 1
    boot = os.environ.get("FAKE_BOOT_ID")
    entries, offset = _entries(path, boot, kernel, 0)
    if cursor is not None:
        found = [i for i, e in enumerate(entries) if e["__CURSOR"] == cursor]
        if not found:
            print("Failed to seek to cursor: Invalid argument", file=sys.stderr)
            return 1
        entries = entries[found[0] + 1 :]
    elif lines is not None and lines != "all":
        entries = entries[len(entries) - int(lines) :] if int(lines) else []
    elif lines is None and follow:
        entries = entries[-10:]
    prefix = "\x1e" if output == "json-seq" else ""
    parent = os.getppid()
    while True:
        for entry in entries:
            sys.stdout.write(prefix + json.dumps(entry) + "\n")
        sys.stdout.flush()
        if not follow:
            return 0
        if os.getppid() != parent:  # the agent died without stopping us: do not linger
            return 0
        time.sleep(0.02)
        entries, offset = _entries(path, boot, kernel, offset)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
