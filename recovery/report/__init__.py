"""The incident report: what a failure cost and where the time went, rebuilt from a run
directory. Pure (no plotting here; ``timeline.png`` is drawn by :mod:`service.reportgen`).

A run directory, as the scenario runner writes it::

    DIR/run.json         {"format": 1, "scenario", "started", "finished" (wall s),
                          "cluster": {"nodes", "spares"},
                          "job": {"id", "nodes", "steps", "save_every", "model", "run_dir"},
                          "faults": [{"fault", "node", "via", "at" (wall s)}],
                          "control_digest", "final_digest", "notes"}
    DIR/incidents.json   [each incident as GET /v1/incidents/{id} returns it]
    DIR/events.jsonl     the training job's event log (recovery.events)

:func:`load_run` reads it (:class:`RunDirError` names the file and field that is wrong),
:func:`build_report` computes the :class:`Report`.
"""

from recovery.report.build import build_report
from recovery.report.goodput import BADPUT, Bucket, Goodput
from recovery.report.model import ActionLine, IncidentReport, Report
from recovery.report.phases import PHASES
from recovery.report.run import (
    EVENTS_FILE,
    INCIDENTS_FILE,
    RUN_FILE,
    RunDirError,
    RunRecord,
    load_run,
)

__all__ = [
    "BADPUT",
    "EVENTS_FILE",
    "INCIDENTS_FILE",
    "PHASES",
    "RUN_FILE",
    "ActionLine",
    "Bucket",
    "Goodput",
    "IncidentReport",
    "Report",
    "RunDirError",
    "RunRecord",
    "build_report",
    "load_run",
]
