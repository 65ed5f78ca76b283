"""Helpers shared by test packages (import from here, never from another test module)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

#: ``recover`` as this interpreter runs it (no console script needed on the PATH).
RECOVER = [sys.executable, "-m", "recover"]
#: The ``recover`` console script beside this interpreter: what the local cluster's batch
#: scripts run on the nodes.
RECOVER_SCRIPT = str(Path(sys.executable).parent / "recover")


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


class Crash(BaseException):
    """The process "died" here (a BaseException: nothing in the code under test may catch
    it, as nothing survives a SIGKILL)."""


class CrashingOs:
    """Forwards to ``os``; the ``at``-th mutating call (0-based) raises :class:`Crash`
    instead. A write at the crash point is torn: half of it lands, as after a kill; what was
    written before stays."""

    MUTATING = frozenset(
        {"open", "write", "fsync", "rename", "close", "unlink", "mkdir", "makedirs"}
    )

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in self.MUTATING:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            n, self.calls = self.calls, self.calls + 1
            if n == self.at:
                if name == "write":
                    fd, data = args
                    os.write(fd, bytes(data[: len(data) // 2]))
                raise Crash(f"killed at call #{n}: {name}")
            return real(*args, **kwargs)

        return call


def submit_train(
    ctl: Any,
    job_dir: Path,
    name: str,
    args: list[str],
    *,
    nodes: int = 1,
    processes: int = 1,
    spares: int = 0,
    signal_lead_s: int | None = None,
    sbatch: tuple[str, ...] = (),
) -> tuple[str, Path]:
    """Submit ``recover train --run-dir JOB_DIR/NAME ARGS`` as a training job on ``nodes``
    nodes (``processes`` of them train, ``spares`` wait), its output and working directory in
    ``job_dir``; returns the job id and the run directory."""
    from slurm.sbatch import DEFAULT_SIGNAL_LEAD_S, submit_training

    run = job_dir / name
    job_id = submit_training(
        ctl,
        [RECOVER_SCRIPT, "train", "--run-dir", str(run), *args],
        sbatch_args=[
            f"--nodes={nodes}", f"--output={job_dir}/{name}-%j.out", f"--chdir={job_dir}", *sbatch
        ],
        processes=processes,
        spares=spares,
        signal_lead_s=DEFAULT_SIGNAL_LEAD_S if signal_lead_s is None else signal_lead_s,
    )  # fmt: skip
    return job_id, run


#: A pid no process has: above the kernel's largest possible pid_max (2**22).
NO_PID = 2**31 - 2


def record_gone_cluster(state: Path, nodes: tuple[str, ...]) -> Path:
    """Write the state file of a local cluster in ``state`` with ``nodes`` whose processes
    are all gone, so that :class:`slurm.cluster.LocalCluster` acts on files only
    (``crash_node``, ``down``); returns its slurm.conf's path (never written)."""
    from slurm.clusterinfo import STATE_FILE, ClusterInfo

    state.mkdir(parents=True, exist_ok=True)
    conf = state / "slurm.conf"
    pids = {f"slurmd:{n}": NO_PID for n in nodes}
    info = ClusterInfo(state, conf, nodes, (), pids, state / "munge")
    (state / STATE_FILE).write_text(json.dumps(info.to_json()))
    return conf


def flip_a_byte(checkpoints: Path, step: int) -> None:
    """Damage checkpoint ``step`` under ``checkpoints``: flip the first byte of one of its
    data files, so that its digest no longer matches."""
    from recovery.checkpoint import format as fmt

    data = sorted((checkpoints / fmt.step_dir_name(step)).glob("D*.bin"))[0]
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))


def promtool_passes(text: str) -> None:
    """Prometheus' own linter (``promtool check metrics``: names, units, suffixes, help)
    finds nothing in the scrape ``text``. scripts/setup.sh installs Debian's promtool."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: run ./scripts/setup.sh --no-demo"
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
