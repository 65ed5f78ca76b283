"""Standby training processes: the variable that starts ``recover train`` as a standby, which
the job supervisor's ``srun`` sets (``slurm.jobstep``) and the trainer reads
(:mod:`recovery.train.standby`)."""

from __future__ import annotations

from collections.abc import Mapping

#: Set to 1 to start ``recover train`` as a standby (what the supervisor's srun sets).
ENV_STANDBY = "RECOVER_STANDBY"


def requested(environ: Mapping[str, str]) -> bool:
    """Whether a process started with ``environ`` is a standby."""
    return environ.get(ENV_STANDBY, "") not in ("", "0")
