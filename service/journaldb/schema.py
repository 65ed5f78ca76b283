"""The journal's SQLite schema and its migrations.

The schema version lives in SQLite's ``user_version``. :data:`MIGRATIONS` holds one script per
version step: ``MIGRATIONS[0]`` takes an empty file to version 1, ``MIGRATIONS[1]`` version 1
to 2, and so on. They run on open, each in its own transaction together with the new
``user_version``, so a crash mid-upgrade leaves the old version intact. A file whose version is
newer than :data:`SCHEMA_VERSION` was written by newer code and is never touched.

Stamps are stored as two REAL columns (``*_wall`` Unix seconds, ``*_mono`` CLOCK_MONOTONIC
seconds); JSON columns hold the model's own JSON forms (``HealthEvent`` JSON,
``Decision.to_json``, ``Action.to_json``).
"""

from __future__ import annotations

_V1 = """
CREATE TABLE events (
    -- Arrival order 1, 2, ... without gaps (no AUTOINCREMENT: that would burn a number on
    -- each duplicate id; events are never deleted, so numbers are never reused).
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,                    -- the agent's event id
    node TEXT NOT NULL,
    body TEXT NOT NULL,                         -- HealthEvent JSON
    received_wall REAL NOT NULL,
    received_mono REAL NOT NULL,
    decided INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE incidents (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    fault TEXT NOT NULL,
    verdict TEXT NOT NULL,
    status TEXT NOT NULL,
    opened_wall REAL NOT NULL,
    opened_mono REAL NOT NULL,
    closed_wall REAL,
    closed_mono REAL,
    jobs TEXT NOT NULL DEFAULT '[]',            -- JSON list of Slurm job ids
    info TEXT NOT NULL DEFAULT '{}'             -- JSON object
);
CREATE TABLE decisions (
    event_id TEXT PRIMARY KEY REFERENCES events(id),
    incident TEXT REFERENCES incidents(id),
    body TEXT NOT NULL,                         -- Decision.to_json
    at_wall REAL NOT NULL,
    at_mono REAL NOT NULL
);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident TEXT NOT NULL REFERENCES incidents(id),
    event_id TEXT NOT NULL REFERENCES events(id),
    position INTEGER NOT NULL,                  -- order within its decision
    body TEXT NOT NULL,                         -- Action.to_json: kind and parameters
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '',
    planned_wall REAL,
    planned_mono REAL,
    finished_wall REAL,
    finished_mono REAL
);
CREATE TABLE phases (
    incident TEXT NOT NULL REFERENCES incidents(id),
    name TEXT NOT NULL,
    wall REAL NOT NULL,
    mono REAL NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (incident, name)
);
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# Version 2: the restart path reads undecided events and pending/held actions; without these
# indexes each read scans the whole table, which grows by every event ever received.
_V2 = """
CREATE INDEX events_undecided ON events(seq) WHERE decided = 0;
CREATE INDEX actions_by_status ON actions(status, id);
CREATE INDEX actions_by_incident ON actions(incident, id);
CREATE INDEX decisions_by_incident ON decisions(incident);
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2)
"""``MIGRATIONS[v]`` upgrades a file at version ``v`` to ``v + 1``."""

SCHEMA_VERSION = len(MIGRATIONS)
"""The version this code reads and writes."""
