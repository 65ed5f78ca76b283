"""A training process started ahead of need: ``recover train`` under ``RECOVER_STANDBY=1``.

Starting a process of a K-process run costs more than anything else in a relaunch inside the
allocation: the interpreter, JAX and our modules take about a second of CPU per process, four
of them share two cores on the local cluster, and srun has to start the step first. The job
supervisor (:mod:`recovery.inalloc.supervisor`) therefore keeps one process waiting on every
node of its job, started in the background while the training runs. A waiting process
imports what training needs, then reads one line from its standard input: a JSON object of
the variables that place it in a launch (:data:`ASSIGNABLE`: its rank, the process count,
process 0's rendezvous and the launch's group). It sets them and trains as any process would.
End of input (the supervisor closed it: the job ends, or the node leaves the job) makes it
exit 0 having done nothing.

JAX is imported but its runtime is not started: ``jax.distributed.initialize`` must come
first, and the rank is only known at the assignment.
"""

from __future__ import annotations

import json
from typing import TextIO

from recovery.errors import UsageError
from recovery.multiproc.topology import ENV_GROUP, ENV_PROCESS_ID, ENV_PROCESSES, ENV_RENDEZVOUS

#: The variables an assignment may set; anything else is refused.
ASSIGNABLE = frozenset({ENV_PROCESS_ID, ENV_PROCESSES, ENV_RENDEZVOUS, ENV_GROUP})


def warm_up() -> None:
    """Import what a training process needs before it can join (not JAX's runtime)."""
    import jax.experimental.multihost_utils
    import jax.numpy  # noqa: F401

    import recovery.train.loop
    import recovery.train.model  # noqa: F401


def parse_assignment(line: str) -> dict[str, str] | None:
    """The variables ``line`` assigns; None for an empty line (no assignment will come).

    Raises:
        UsageError: not a JSON object of strings, or a variable outside :data:`ASSIGNABLE`.
    """
    if not line.strip():
        return None
    try:
        doc = json.loads(line)
    except ValueError as e:
        shown = line.strip()[:200]
        raise UsageError(f"standby: the assignment is not JSON ({e}): {shown!r}") from None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise UsageError(f"standby: the assignment must be an object of strings, got {doc!r}")
    unknown = sorted(set(doc) - ASSIGNABLE)
    if unknown:
        raise UsageError(
            f"standby: the assignment sets {', '.join(unknown)}; it may set only "
            f"{', '.join(sorted(ASSIGNABLE))}"
        )
    return dict(doc)


def wait(stdin: TextIO) -> dict[str, str] | None:
    """Warm up, then block for the assignment on ``stdin`` (None: end of input)."""
    warm_up()
    return parse_assignment(stdin.readline())
