"""Options several commands share: ``--json``, and the ``--slurm-*`` options of the commands
that talk to Slurm (see :class:`service.wiring.SlurmAccess`; an option left out falls back to
its environment variable, then to the default)."""

from __future__ import annotations

from typing import Annotated

import typer

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

SlurmBackend = Annotated[
    str | None,
    typer.Option(
        "--slurm-backend",
        help="How to reach Slurm: cli (Slurm's commands), rest (slurmrestd) or pyslurm "
        "(Slurm 25.11's C API) [default: $RECOVER_SLURM_BACKEND, else cli].",
    ),
]
SlurmRestd = Annotated[
    str | None,
    typer.Option(
        "--slurmrestd",
        help="slurmrestd as http(s)://HOST:PORT or unix:PATH [default: $RECOVER_SLURMRESTD, "
        "else the local cluster's].",
    ),
]
SlurmJwtFile = Annotated[
    str | None,
    typer.Option(
        "--slurm-jwt-file",
        help="File with a JWT from `scontrol token` (rest: sent to slurmrestd; cli: as "
        "SLURM_JWT, no munge needed) [default: $RECOVER_SLURM_JWT_FILE].",
    ),
]
SlurmUser = Annotated[
    str | None,
    typer.Option(
        "--slurm-user", help="The user the JWT was made for [default: $RECOVER_SLURM_USER]."
    ),
]
SlurmVersion = Annotated[
    str | None,
    typer.Option(
        "--slurm",
        help="Which Slurm the local cluster runs: auto (25.11 when ./scripts/build-slurm.sh "
        "built it, else 22.05), 25.11 or 22.05 (Debian's) [default: $RECOVER_SLURM, else auto].",
    ),
]
