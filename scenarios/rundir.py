"""The run directory a scenario leaves behind, in the format ``recovery.report`` reads:

* ``run.json`` - format 1: ``scenario``, ``started``/``finished`` (wall seconds), ``cluster``
  (``nodes`` in service at start, ``spares``), ``job`` (``id``, ``nodes``, ``steps``,
  ``save_every``, ``model``, ``run_dir``, ``processes``: how many training processes, one
  per node), ``faults`` (``fault``, ``node``: ``""`` for a
  checkpoint damaged or the coordinator killed, ``via``, ``at``: wall seconds when injected;
  more keys where they apply: ``gpu``, ``event_id``, ``step``),
  ``control_digest``, ``final_digest`` (hex or null) and free-text ``notes``;
* ``incidents.json`` - the journal's incidents as ``GET /v1/incidents/{id}`` returns them;
* ``events.jsonl`` - a copy of the training job's events (process 0's), and
  ``events.rank<r>.jsonl`` of each other process of a multi-process job;
* ``scenario.yaml`` - the scenario as it was given;
* ``result.json`` - the expectations and how each fared (written by the runner, last);
* ``job/`` - the job's own run directory (checkpoints, events) and ``job-<id>.out``;
* ``cluster/`` - the local cluster's state and logs (slurmctld, slurmd, coordinator, agents).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery import fsutil

FORMAT = 1


@dataclass
class RunRecord:
    """What ``run.json`` holds, filled in as the run goes."""

    scenario: str
    started: float
    steps: int
    save_every: int
    model: str
    run_dir: Path
    finished: float | None = None
    nodes: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)
    job_id: str | None = None
    job_nodes: list[str] = field(default_factory=list)
    processes: int = 1
    faults: list[dict[str, Any]] = field(default_factory=list)
    control_digest: str | None = None
    final_digest: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "scenario": self.scenario,
            "started": self.started,
            "finished": self.finished,
            "cluster": {"nodes": self.nodes, "spares": self.spares},
            "job": {
                "id": self.job_id,
                "nodes": self.job_nodes,
                "steps": self.steps,
                "save_every": self.save_every,
                "model": self.model,
                "run_dir": str(self.run_dir),
                "processes": self.processes,
            },
            "faults": self.faults,
            "control_digest": self.control_digest,
            "final_digest": self.final_digest,
            "notes": self.notes,
        }


def write(out: Path, record: RunRecord, incidents: Sequence[dict[str, Any]]) -> None:
    """Write ``run.json``, ``incidents.json`` and the copy of ``events.jsonl`` into ``out``
    (each atomically). The scenario's text is written at the start of the run."""
    out.mkdir(parents=True, exist_ok=True)
    for events in [record.run_dir / "events.jsonl", *record.run_dir.glob("events.rank*.jsonl")]:
        if events.exists():
            tmp = out / f".{events.name}.tmp"
            shutil.copyfile(events, tmp)
            tmp.replace(out / events.name)
    _json(out / "incidents.json", list(incidents))
    _json(out / "run.json", record.to_json())


def write_result(out: Path, doc: dict[str, Any]) -> None:
    """``result.json``: the expectations' results and the run's summary."""
    _json(out / "result.json", doc)


def _json(path: Path, doc: object) -> None:
    fsutil.atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode())
