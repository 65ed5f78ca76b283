"""Which coordinator replica leads, and whether it still may act: the election over a
:class:`~recovery.ports.lease.LeaseStore`, pure but for the store.

Each replica calls :meth:`Elector.tick` every ``retry_s``:

* **leading**: it renews the record (same holder, same term). A renewal that fails (the store
  unreachable, or someone else's write: a conflict) does not depose it at once; it keeps
  trying, and it is deposed when ``renew_deadline_s`` passes since its last renewal that
  succeeded, or at once when the record names someone else.
* **standing by**: it reads the record. A record held by another is expired only once this
  replica has seen the *same version* for ``duration_s`` by its own monotonic clock (the
  holder's clock and the store's timestamps are never trusted); then it takes the record with
  ``term + 1``. No record: it creates one at term 1. A record whose holder gave it up (holder
  "") is taken at once.

**Fencing**: :meth:`Elector.may_act` is true only while this replica leads and its last
successful renewal is younger than ``renew_deadline_s``, which is shorter than
``duration_s`` by at least ``retry_s``: a leader that cannot renew stops acting before anyone
else may take the lease. The coordinator asks it before every Slurm or Kubernetes action
(:meth:`Elector.fence` raises :class:`Deposed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from recovery.errors import RecoverError, UsageError
from recovery.ports.lease import LeaseConflict, LeaseRecord, LeaseStore

#: Defaults: a leader renews every 0.5 s, stops acting 2.5 s after its last renewal that
#: succeeded, and a standby takes over 4 s after it first saw the record's last version (so a
#: standby leads within about 4-4.5 s of the leader's death). Kubernetes' own controllers use
#: 15 / 10 / 2 s; ours are shorter because a fleet in trouble is when the coordinator is needed.
DURATION_S = 4.0
RENEW_DEADLINE_S = 2.5
RETRY_S = 0.5


class Deposed(Exception):
    """This replica may not act: it does not lead, or its lease may have passed to another.

    Not a RecoverError on purpose: every handler that records an action as failed (or as a
    failed attempt) catches RecoverError, and a deposed leader must leave the journal as it is:
    the action stays planned, and the next leader does it once."""


@dataclass(frozen=True)
class Standing:
    """What one tick found."""

    leading: bool
    holder: str
    """Who holds the lease as last seen ("" when nobody)."""
    term: int
    changed: bool
    """This replica became leader, or stopped being it, on this tick."""
    detail: str
    """In words, for the log."""


@dataclass
class _Seen:
    version: str
    at: float
    """Our monotonic time when we first saw this version."""


class Elector:
    """One replica's side of the election. ``clock`` is monotonic seconds; ``wall`` Unix
    seconds (only written into the record, for people)."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        clock: Callable[[], float],
        wall: Callable[[], float],
        *,
        duration_s: float = DURATION_S,
        renew_deadline_s: float = RENEW_DEADLINE_S,
        retry_s: float = RETRY_S,
    ) -> None:
        if not identity:
            raise UsageError("a coordinator replica needs a non-empty identity")
        if not (retry_s > 0 and renew_deadline_s + retry_s <= duration_s):
            raise UsageError(
                "leader election: need retry_s > 0 and renew_deadline_s + retry_s <= "
                f"duration_s (got {retry_s:g}, {renew_deadline_s:g}, {duration_s:g})"
            )
        self.store = store
        self.identity = identity
        self.clock = clock
        self.wall = wall
        self.duration_s = duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_s = retry_s
        self._record: LeaseRecord | None = None
        self._seen: _Seen | None = None
        self._renewed_at: float | None = None
        """Our monotonic time of our last write that succeeded while leading."""

    # --- what the coordinator asks ------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self._renewed_at is not None

    @property
    def term(self) -> int:
        """The term of the record as last seen (this replica's own while it leads)."""
        return self._record.term if self._record is not None else 0

    def may_act(self) -> bool:
        """Whether this replica leads with a renewal young enough to act on."""
        at = self._renewed_at
        return at is not None and self.clock() - at < self.renew_deadline_s

    def fence(self, what: str) -> None:
        """Raise :class:`Deposed` unless this replica may act now (``what``: the action)."""
        if not self.may_act():
            held = self._record.holder if self._record is not None else ""
            why = (
                f"the lease is held by {held}"
                if held and held != self.identity
                else ("its lease is not renewed")
            )
            raise Deposed(f"not the leader: {what} not done ({why}; {self.store.where})")

    # --- the loop ------------------------------------------------------------------------

    def tick(self) -> Standing:
        """One round: renew, or try to take the lease. Store errors (RecoverError) count as a
        failed round; they never escape."""
        was = self.leading
        try:
            detail = self._renew() if was else self._try_take()
        except LeaseConflict:
            detail = "someone else wrote the lease first"
            self._forget_version()
        except RecoverError as e:
            detail = f"the lease store failed: {e}"
        if self.leading and self.clock() - (self._renewed_at or 0.0) >= self.renew_deadline_s:
            self._renewed_at = None
            detail = f"not renewed for {self.renew_deadline_s:g} s: stepped down ({detail})"
        holder = self._record.holder if self._record is not None else ""
        return Standing(self.leading, holder, self.term, was != self.leading, detail)

    def release(self) -> None:
        """Give the lease up (a clean shutdown): the next replica takes it at once."""
        if not self.leading or self._record is None:
            return
        self._renewed_at = None
        with contextlib.suppress(LeaseConflict, RecoverError):  # else it expires by itself
            self._record = self.store.update(
                self._record, "", self._record.term, self.duration_s, self.wall()
            )

    def _renew(self) -> str:
        current = self._record
        assert current is not None
        # Counted from before the write: the record may be written (and seen by the others)
        # well before its answer comes back.
        started = self.clock()
        try:
            self._record = self.store.update(
                current, self.identity, current.term, self.duration_s, self.wall()
            )
        except LeaseConflict:
            # Someone wrote it: read who. Another holder deposes us at once.
            self._record = self.store.read()
            if self._record is None or self._record.holder != self.identity:
                self._renewed_at = None
                holder = self._record.holder if self._record is not None else "nobody"
                return f"deposed: the lease is now held by {holder or 'nobody'}"
            raise
        self._renewed_at = started
        return "renewed"

    def _try_take(self) -> str:
        now = self.clock()
        record = self.store.read()
        self._record = record
        if record is None:
            started = self.clock()
            self._record = self.store.create(self.identity, self.duration_s, self.wall())
            self._renewed_at = started
            return f"created the lease: leader at term {self._record.term}"
        if record.holder == self.identity:
            # Still ours: this replica stepped down when it could not renew, or a process
            # restarted with the same identity. Taken again as a new term: whatever was
            # started under the old one is not to be trusted as still ours.
            return self._take(record, "still ours after stepping down")
        if record.holder == "":
            return self._take(record, "given up")
        if self._seen is None or self._seen.version != record.version:
            self._seen = _Seen(record.version, now)
            return f"{record.holder} leads (term {record.term})"
        if now - self._seen.at < record.duration_s:
            return f"{record.holder} leads (term {record.term})"
        return self._take(record, f"{record.holder} did not renew for {record.duration_s:g} s")

    def _take(self, record: LeaseRecord, why: str) -> str:
        started = self.clock()
        self._record = self.store.update(
            record, self.identity, record.term + 1, self.duration_s, self.wall()
        )
        self._renewed_at = started
        self._seen = None
        return f"took the lease ({why}): leader at term {self._record.term}"

    def _forget_version(self) -> None:
        self._seen = None
