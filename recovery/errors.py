"""The project's own error hierarchy, rooted in :class:`RecoverError`.

Two families matter to callers:

* :class:`TransientError` - the other side could not be reached or was busy; the same call may
  succeed later, so callers retry with backoff (``delay`` is a hint in seconds).
* everything else is a verdict (bad input, a refused request, a damaged checkpoint); retrying
  the same call gives the same answer, so it is never retried.

Library errors are chained with ``raise ... from e`` so the original cause stays visible.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence


class RecoverError(Exception):
    """Root of every error this project raises on purpose."""

    #: Process exit status the CLI uses when this error ends a command.
    exit_code: int = 1


class TransientError(RecoverError):
    """The operation may succeed if retried later (transport failure, busy daemon)."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        #: Suggested wait before retrying, in seconds.
        self.delay = delay


class UsageError(RecoverError):
    """Bad input from a user: an unknown name, a malformed value, a missing path."""

    exit_code = 2


def unknown_choice(kind: str, value: object, known: Iterable[object]) -> UsageError:
    """Build the standard "Unknown <kind> 'x'. Known: a, b, c" error.

    Names are listed alphabetically, numbered ones (``xid79``) by number after the plain ones;
    a family of more than :data:`_LIST_AT_MOST` numbered names (the catalogue's NVSwitch
    SXids) is summarised by its count and range, so the common names stay in a message that
    HTTP clients cut at :data:`recovery.httpbody.LIMIT` characters."""
    plain: list[str] = []
    families: dict[str, list[tuple[int, str]]] = {}
    for k in {str(k) for k in known}:
        m = _NUMBERED.fullmatch(k)
        if m:
            families.setdefault(m.group(1), []).append((int(m.group(2)), k))
        else:
            plain.append(k)
    parts = sorted(plain)
    for prefix in sorted(families):
        numbered = [name for _, name in sorted(families[prefix])]
        if len(numbered) > _LIST_AT_MOST:
            parts.append(f"{len(numbered)} {prefix}<N> ({numbered[0]} ... {numbered[-1]})")
        else:
            parts.extend(numbered)
    return UsageError(f"Unknown {kind} {value!r}. Known: {', '.join(parts) or '(none)'}")


_NUMBERED = re.compile(r"([a-z]+)(\d+)")
_LIST_AT_MOST = 40


# --- checkpoints -----------------------------------------------------------------------------


class CheckpointError(RecoverError):
    """Something is wrong with checkpoints on disk or with the request made of them."""

    exit_code = 3


class CheckpointDamaged(CheckpointError):
    """One checkpoint failed verification; ``reason`` says which check and why."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"checkpoint step {step} is damaged: {reason}")
        self.step = step
        self.reason = reason


class NoCheckpointError(CheckpointError):
    """Resume was requested but the directory holds no checkpoint at all."""


class AllCheckpointsDamagedError(CheckpointError):
    """Every checkpoint in the directory failed verification."""

    def __init__(self, directory: str, failures: Sequence[tuple[int, str]]) -> None:
        lines = "\n".join(f"  step {step}: {reason}" for step, reason in failures)
        super().__init__(
            f"no intact checkpoint in {directory}; every one failed verification:\n{lines}"
        )
        self.failures = list(failures)


class ConfigMismatchError(CheckpointError):
    """The checkpoint was written by a run with a different configuration."""

    def __init__(self, step: int, differences: Sequence[tuple[str, object, object]]) -> None:
        lines = "\n".join(
            f"  {field}: checkpoint has {saved!r}, this run has {current!r}"
            for field, saved, current in differences
        )
        super().__init__(
            f"checkpoint step {step} was written with a different run configuration:\n{lines}\n"
            "Resume with the original settings, or start a new run in another directory."
        )
        self.step = step
        self.differences = list(differences)


class StepBehindError(CheckpointError):
    """The requested final step is before the newest checkpoint's step."""


class CheckpointExistsError(CheckpointError):
    """A fresh run was requested in a directory that already holds checkpoints."""


class RunLockedError(CheckpointError):
    """Another live process is writing checkpoints in the same directory."""


class BackgroundSaveError(CheckpointError):
    """An asynchronous save failed in the background; the cause is chained."""


# --- multi-process jobs ----------------------------------------------------------------------


class GroupError(RecoverError):
    """The processes of a multi-process job could not form their group (a process missing at
    the join, a rendezvous refused), or a collective among them failed."""

    exit_code = 11


class PeerLostError(GroupError):
    """Another process of the job died or left while this one needed it; ``rank`` says which
    (None when unknown) and ``reason`` how it was noticed."""

    #: The status a process exits with when it stops because a peer was lost (EX_PROTOCOL).
    exit_code = 76

    def __init__(self, rank: int | None, reason: str) -> None:
        who = "a peer process" if rank is None else f"process {rank}"
        super().__init__(f"{who} was lost: {reason}")
        self.rank = rank
        self.reason = reason


class NoAgreedCheckpointError(CheckpointError):
    """The processes of a job found no checkpoint that verifies for every one of them."""

    def __init__(self, directory: str, refusals: Sequence[tuple[int, str]]) -> None:
        lines = "\n".join(f"  step {step}: {why}" for step, why in refusals)
        super().__init__(
            f"the processes found no checkpoint in {directory} that verifies for all of them:"
            f"\n{lines}"
        )
        self.refusals = list(refusals)


# --- slurm -----------------------------------------------------------------------------------


class SlurmError(RecoverError):
    """Slurm answered, but not with what was asked: a refused request, an unexpected reply."""

    exit_code = 4


class SlurmUnavailableError(TransientError):
    """slurmctld could not be reached (down, connection refused, timed out); retry later."""


class SlurmRefusedError(SlurmError):
    """slurmctld refused the request (invalid state transition, permission); never retried."""


class ReasonNotOursError(SlurmRefusedError):
    """The node is out of service for a reason someone else set; we only undo our own marks."""

    def __init__(self, node: str, reason: str, set_by: str) -> None:
        who = set_by or "unknown user"
        super().__init__(
            f"node {node} is out of service with reason {reason!r} set by {who}; "
            "it is not ours (no 'recover:' prefix), so it is left alone. "
            "Pass force=True (--force) to resume it anyway."
        )
        self.node = node
        self.reason = reason
        self.set_by = set_by


class SlurmUnsupportedError(SlurmError):
    """The Slurm backend in use cannot even ask this of this Slurm (e.g. slurmrestd 22.05 has
    no node update); the message names what can. Not a refusal (Slurm was never asked, so no
    re-read can show it done), but a verdict all the same: retrying cannot help."""


class NoSpareError(SlurmError):
    """A spare was requested but none is held in the pool."""


class SlurmNotInstalledError(RecoverError):
    """A Slurm or munge program is missing from this machine."""

    exit_code = 5


class ClusterError(RecoverError):
    """The local Slurm cluster could not be started, inspected or stopped."""

    exit_code = 6


# --- coordinator -----------------------------------------------------------------------------


class JournalError(RecoverError):
    """The incident journal could not be read or written (disk full, corrupt, newer schema)."""

    exit_code = 7


class CoordinatorUnavailableError(TransientError):
    """The coordinator did not answer (not running, wrong URL); the message says how to start it."""

    exit_code = 8


class AuthError(RecoverError):
    """A request to the coordinator was refused: no token, a wrong one, or not allowed."""

    exit_code = 9


# --- kubernetes ------------------------------------------------------------------------------


class KubeError(RecoverError):
    """The Kubernetes API answered, but not with what was asked."""

    exit_code = 10


class KubeUnavailableError(TransientError):
    """The Kubernetes API server could not be reached, timed out or was overloaded (5xx,
    429); retry later."""


class KubeRefusedError(KubeError):
    """The API server refused the request (invalid, 422; bad request, 400); never retried."""


class KubeForbiddenError(KubeRefusedError):
    """403: the coordinator's ServiceAccount may not do this; the message names the verb and
    the resource, and where the permissions are granted (k8s/deploy/rbac.yaml)."""


class KubeNotFoundError(KubeError):
    """A Kubernetes object that had to exist does not (a node to mark or promote)."""
