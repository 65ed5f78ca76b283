"""The coordinator's service layer: adapters the core does not import.

* :mod:`recovery.service.journal` - :class:`SqliteJournal`, the durable journal (SQLite, WAL);
* :mod:`recovery.service.auth` - the tokens file and constant-time token checks;
* :mod:`recovery.service.app` - the HTTP intake and read API (FastAPI);
* :mod:`recovery.service.server` - running that app under uvicorn.

The composition root (``recover coordinator serve``) builds these and hands them the core's
ports; nothing under ``recovery/`` outside this package imports it.
"""
