"""Opening a journal file for ``recover policy replay`` (the composition side)."""

from __future__ import annotations

from pathlib import Path

from recovery.coordinator.history_replay import replay_history
from recovery.errors import UsageError
from recovery.policy import ReplayDifference, load_catalogue, load_policy_config
from recovery.ports.clock import SystemClock
from service.journaldb.journal import SqliteJournal


def replay_journal(path: Path, config: Path | None) -> list[ReplayDifference]:
    """Re-decide the history in the journal at ``path`` under the policy file ``config`` (the
    built-in defaults when None). Raises UsageError for a missing journal or a bad policy file."""
    if not path.is_file():
        raise UsageError(f"no journal at {path} (a coordinator's STATE_DIR/journal.sqlite)")
    catalogue = load_catalogue()
    policy = load_policy_config(config, catalogue=catalogue)
    journal = SqliteJournal(path, SystemClock(), checkpoint_every_s=None)
    try:
        return replay_history(journal, policy, catalogue)
    finally:
        journal.close()
