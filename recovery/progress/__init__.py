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
from recovery.progress.stall import (
    BUDGET_KEYS,
    Budgets,
    Culprit,
    StallWatch,
    Verdict,
    attribute,
    job_budgets,
    write_job_budgets,
)

__all__ = [
    "BUDGET_KEYS",
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
    "job_budgets",
    "phase_named",
    "read_record",
    "read_records",
    "record_path",
    "write_job_budgets",
]
