"""The coordinator's start-up (``recover coordinator serve``): reads the options and the
policy, builds the adapters through :mod:`service.wiring`, the engine through
:func:`recovery.coordinator.build.build_engine`, and serves the HTTP API; plus the pieces
only a running coordinator needs (the Kubernetes readiness watch, the repair-check command,
opening a journal for ``recover policy replay``)."""
