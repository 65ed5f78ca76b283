"""The incident report: what a failure cost and where the time went, rebuilt from a run
directory. Pure (no plotting here; ``timeline.png`` is drawn by :mod:`service.reportgen`).

A run directory, as the scenario runner writes it::

    DIR/run.json         {"format": 1, "scenario", "started", "finished" (wall s),
                          "cluster": {"nodes", "spares"},
                          "job": {"id", "nodes", "steps", "save_every", "model", "run_dir"},
                          "faults": [{"fault", "node", "via", "at" (wall s)}],
                          "control_digest", "final_digest", "notes"}
    DIR/incidents.json   [each incident as GET /v1/incidents/{id} returns it]
    DIR/events.jsonl     the training job's event log (recovery.events); a job of K
                         processes adds events.rank<r>.jsonl for r = 1..K-1

A run started by hand (``recover train``, a loop of one's own on :mod:`recovery.api`) leaves
only the event logs: its report is what the events tell (steps, restarts, restores,
checkpoints, steps recomputed, the phases of each restart), and :attr:`Report.unknown` says
what cannot be known without the runner's files.

:func:`load_run` reads either (:class:`RunDirError` names the file and field that is wrong),
:func:`build_report` computes the :class:`Report`.
"""

from recovery.report.build import build_report
from recovery.report.goodput import BADPUT, Bucket, Goodput
from recovery.report.load import load_run
from recovery.report.model import ActionLine, IncidentReport, Report
from recovery.report.phases import PHASES
from recovery.report.restarts import RESTART_PHASES, Restart
from recovery.report.run import (
    EVENTS_FILE,
    INCIDENTS_FILE,
    RUN_FILE,
    RunDirError,
    RunRecord,
)

__all__ = [
    "BADPUT",
    "EVENTS_FILE",
    "INCIDENTS_FILE",
    "PHASES",
    "RESTART_PHASES",
    "RUN_FILE",
    "ActionLine",
    "Bucket",
    "Goodput",
    "IncidentReport",
    "Report",
    "Restart",
    "RunDirError",
    "RunRecord",
    "build_report",
    "load_run",
]
