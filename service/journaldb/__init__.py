"""The journal port (:class:`recovery.ports.journal.Journal`) on SQLite:
:class:`service.journaldb.journal.SqliteJournal`, its schema and migrations, the row
mapping, the planning writes, and the WAL checkpointer."""
