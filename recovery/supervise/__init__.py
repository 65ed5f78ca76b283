"""Local process supervision: the coordinator and the node agents as background processes of
the local cluster, started, found and stopped by pid (``recover cluster up``, the scenario rig,
the test fixtures)."""
