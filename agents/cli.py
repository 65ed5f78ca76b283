"""``recover agent ...``: agent commands for operators. ``parse`` shows what the kernel-log
source would report for a saved log (a dmesg, journalctl -k or /dev/kmsg dump from a real
incident), so a detector can be checked against the incident before it is trusted.

Only light imports here (no pynvml, no grpc): the ``recover`` CLI imports this module at start.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from agents.dedup import Deduplicator
from agents.kmsg import bus_map, parse_line, to_event
from recovery.errors import UsageError
from recovery.model import HealthEvent
from recovery.ports.clock import Stamp

app = typer.Typer(
    name="agent",
    help="The node agent: check what it would detect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """The node agent: check what it would detect."""  # keeps ``parse`` a subcommand


@dataclass
class _LineClock:
    """Time as the log tells it: mono = the kernel timestamp of the line being replayed."""

    wall: float
    mono: float = 0.0

    def now(self) -> Stamp:
        return Stamp(self.wall, self.mono)


def parse_buses(specs: Sequence[str]) -> dict[str, int]:
    """``["0=00000000:18:00.0", ...]`` -> a bus map. Raises UsageError naming the form."""
    devices = []
    for spec in specs:
        index, sep, bus = spec.partition("=")
        try:
            if not sep or not index.isdigit():
                raise ValueError(spec)
            devices.append((int(index), bus))
            bus_map(devices[-1:])  # validates the bus id
        except ValueError as e:
            raise UsageError(
                f"--gpu {spec!r}: expected INDEX=BUSID, e.g. 0=00000000:18:00.0"
            ) from e
    return bus_map(devices)


def parse_file(
    path: Path,
    node: str,
    as_json: bool,
    *,
    boot_id: str = "saved-log",
    observed_at: float = 0.0,
    buses: dict[str, int] | None = None,
    window_s: float = 0.0,
) -> str:
    """The events the kernel-log source would emit for the log at ``path``, as text (one line
    per event with the log's line number, then a summary) or as a JSON array of events.

    ``observed_at`` (Unix seconds) stamps every event; ``window_s`` > 0 folds repeats as the
    agent's deduplicator would, timed by the lines' kernel timestamps. Raises UsageError for
    a missing or unreadable file or an invalid node name.
    """
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        raise UsageError(f"cannot read kernel log {path}: {e.strerror or e}") from e
    clock = _LineClock(observed_at)
    dedup = Deduplicator(clock, window_s) if window_s > 0 else None
    found: list[tuple[int, HealthEvent]] = []
    for number, line in enumerate(lines, start=1):
        fault = parse_line(line)
        if fault is None:
            continue
        try:
            event = to_event(
                fault, node=node, boot_id=boot_id, observed_at=observed_at, buses=buses
            )
        except ValidationError as e:
            raise UsageError(f"invalid node name {node!r}: use letters, digits, '.-_'") from e
        if dedup is None:
            found.append((number, event))
            continue
        clock.mono = max(clock.mono, fault.kernel_ts or clock.mono)
        found += [(number, e) for e in dedup.offer(event)]
    if dedup is not None:
        found += [(len(lines), e) for e in dedup.drain()]
    if as_json:
        return json.dumps([e.model_dump(mode="json") for _, e in found], indent=2)
    return _render(path, lines, found)


def _render(path: Path, lines: list[str], found: list[tuple[int, HealthEvent]]) -> str:
    out = []
    for number, e in found:
        gpu = f"gpu {e.accelerator}" if e.accelerator is not None else "gpu ?"
        folded = f" x{e.count}" if e.count > 1 else ""
        out.append(f"line {number}: {e.fault}{folded} {gpu} {e.bus_id or '-'}: {e.message}")
    faults = sorted({e.fault for _, e in found})
    out.append(
        f"{path}: {len(found)} event(s) from {len(lines)} line(s)"
        + (f"; faults: {', '.join(faults)}" if faults else "; no fault lines")
    )
    return "\n".join(out)


@app.command("parse")
def parse_cmd(
    file: Annotated[Path, typer.Argument(help="A saved kernel log (dmesg, journalctl -k, kmsg).")],
    node: Annotated[str, typer.Option(help="Node name to put in the events.")] = "local",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array of events.")] = False,
    gpu: Annotated[
        list[str] | None,
        typer.Option(help="INDEX=BUSID (NVML form), repeatable: fills in accelerator indices."),
    ] = None,
    window: Annotated[
        float, typer.Option(help="Fold repeats within this many seconds (0: show every line).")
    ] = 0.0,
) -> None:
    """Print the events the kernel-log source would emit for FILE."""
    text = parse_file(file, node, as_json, buses=parse_buses(gpu or []), window_s=window)
    typer.echo(text)
