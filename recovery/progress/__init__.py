"""Progress of a training job's processes, cheap to report and read from outside them:
:mod:`~recovery.progress.record` (each process's record in a small mapped file) and
:mod:`~recovery.progress.stall` (the watcher's rule: stalled or not, and who holds it up).
"""

from recovery.progress.record import (
    PHASES,
    Phase,
    ProgressWriter,
    Record,
    RecordError,
    phase_named,
    read_record,
    read_records,
    record_path,
)
from recovery.progress.stall import Budgets, Culprit, StallWatch, Verdict, attribute

__all__ = [
    "PHASES",
    "Budgets",
    "Culprit",
    "Phase",
    "ProgressWriter",
    "Record",
    "RecordError",
    "StallWatch",
    "Verdict",
    "attribute",
    "phase_named",
    "read_record",
    "read_records",
    "record_path",
]
