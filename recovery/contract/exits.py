"""The exit statuses a training process and the toolkit agree on, and the signals that ask a
training process to save and stop.

Kept free of JAX and of the checkpoint code so that the ``recover sbatch`` wrapper (which
requeues a job that exits with :data:`EXIT_PREEMPTED`), the coordinator's policy (which never
requeues a job that exits with :data:`EXIT_DO_NOT_RESTART`) and user code can import them
cheaply. Every exit status the toolkit gives a meaning to is named here once (the command
line's own statuses are its errors', :mod:`recovery.errors`); code elsewhere uses the name.
"""

from __future__ import annotations

import signal

from recovery.errors import PeerLostError

#: Exit status after a SIGTERM/SIGUSR1 that was handled by saving: EX_TEMPFAIL, "try again".
EXIT_PREEMPTED = 75
#: Exit status that means "do not restart me": the job failed in a way another run would
#: repeat (bad configuration, a bug, data that cannot be read). The coordinator never requeues
#: a job whose batch script exited with it, even when its node was taken out for a fault at
#: the same moment. Training code exits with it (``sys.exit(EXIT_DO_NOT_RESTART)``); a batch
#: script must pass its status on (``recover sbatch``'s does). 93 stays clear of the shell's
#: 126-165, of 75, and of `recover`'s own statuses (0-10).
EXIT_DO_NOT_RESTART = 93
#: Exit status of a process that stopped because a peer was lost (76, EX_PROTOCOL): the status
#: of `recover`'s :class:`~recovery.errors.PeerLostError`.
EXIT_PEER_LOST = PeerLostError.exit_code
#: A failure with no more to say: the status the job supervisor gives a step whose own status
#: it overrules (srun reported success, or a save, for a step that lost a node).
EXIT_FAILED = 1


def signal_status(signum: int) -> int:
    """The exit status a shell (and srun, and Slurm) reports for a process killed by signal
    ``signum``: 128 + ``signum``."""
    return 128 + signum


#: A process SIGKILLed from outside (137): the kernel's OOM killer, or slurmctld.
EXIT_KILLED = signal_status(signal.SIGKILL)
#: Slurm sends USR1 ahead of the time limit (``--signal``) and TERM on cancel or node loss.
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
