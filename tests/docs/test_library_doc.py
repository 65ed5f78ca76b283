"""docs/library.md and ``recovery.api`` in step: every name in ``__all__`` is documented on the
page's reference and nothing else is; the quickstart runs as written, and a real SIGTERM in the
middle of it costs nothing: the resumed run ends with the uninterrupted run's state digest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import recovery.api
from recovery.api import EXIT_PREEMPTED, read_events

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "library.md"


def subsection(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole line) up to the next heading of its level."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"^{level} ", body, maxsplit=1, flags=re.M)[0]


def table_names(text: str) -> set[str]:
    return set(re.findall(r"^\| `([\w-]+)` \|", text, flags=re.M))


def reference_names(text: str) -> set[str]:
    """Names the "Reference" section documents: its ``### `Name` `` headings and the rows of
    the errors' table."""
    section = subsection(text, "## Reference")
    headings = re.findall(r"^### `(\w+)`$", section, flags=re.M)
    return set(headings) | table_names(subsection(section, "### Errors"))


def test_every_public_name_is_documented_and_only_those() -> None:
    documented = reference_names(DOC.read_text())
    exported = set(recovery.api.__all__)
    assert documented - exported == set(), "documented but not in recovery.api.__all__"
    assert exported - documented == set(), "in recovery.api.__all__ but not in docs/library.md"
    for name in exported:
        assert hasattr(recovery.api, name), name


def test_every_checkpoint_manager_method_is_documented_and_only_those() -> None:
    section = subsection(subsection(DOC.read_text(), "## Reference"), "### `CheckpointManager`")
    documented = set(re.findall(r"`(\w+)\(", section)) - {"CheckpointManager"}
    methods = {
        name
        for name, value in vars(recovery.api.CheckpointManager).items()
        if callable(value) and not name.startswith("_")
    }
    assert documented == methods


def test_the_events_table_lists_every_event() -> None:
    table = table_names(subsection(subsection(DOC.read_text(), "## Reference"), "### `EVENTS`"))
    assert table == set(recovery.api.EVENTS)


def test_the_check_catches_a_missing_name() -> None:
    text = DOC.read_text().replace("### `Skipped`", "### Skipped")
    assert "Skipped" not in reference_names(text)


def quickstart(tmp_path: Path) -> Path:
    text = DOC.read_text()
    block = text.split("<!-- quickstart -->\n```python\n", 1)[1].split("\n```\n", 1)[0]
    script = tmp_path / "train.py"
    script.write_text(block + "\n")
    return script


def run(script: Path, run_dir: Path, steps: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), str(run_dir), str(steps)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip


def completed_digest(proc: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"completed step (\d+) state_digest (\w+)", proc.stdout)
    assert m is not None, proc.stdout
    return int(m.group(1)), m.group(2)


@pytest.mark.slow
def test_quickstart_survives_a_real_sigterm(tmp_path: Path) -> None:
    script = quickstart(tmp_path)
    run_dir = tmp_path / "run"
    # Far more steps than it will reach: SIGTERM comes once it has passed step 15.
    child = subprocess.Popen(
        [sys.executable, str(script), str(run_dir), "1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        events = run_dir / "events.jsonl"
        while time.monotonic() < deadline and child.poll() is None:
            if events.exists() and any(
                e["event"] == "step" and e["step"] >= 15 for e in read_events(events)
            ):
                break
            time.sleep(0.05)
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == EXIT_PREEMPTED, err
    logged = list(read_events(run_dir / "events.jsonl"))
    preempted = [e for e in logged if e["event"] == "preempted"]
    assert len(preempted) == 1
    assert preempted[0]["signal"] == "SIGTERM"
    stopped = preempted[0]["step"]
    assert stopped >= 15

    target = stopped + 12  # ends between two periodic saves
    resumed_step, resumed = completed_digest(run(script, run_dir, target))
    control_step, control = completed_digest(run(script, tmp_path / "control", target))
    assert resumed_step == control_step == target
    assert resumed == control
    logged = list(read_events(run_dir / "events.jsonl"))
    restored = [e for e in logged if e["event"] == "restored"]
    assert [e["step"] for e in restored] == [stopped]
    # The resumed process began at the step it restored: nothing was recomputed.
    second = logged[[i for i, e in enumerate(logged) if e["event"] == "started"][1] :]
    first_step = next(e["step"] for e in second if e["event"] == "step")
    assert first_step == stopped + 1
