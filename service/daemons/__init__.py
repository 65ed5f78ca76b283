"""Local process supervision: the coordinator (:mod:`.coordinator`) and the node agents
(:mod:`.agents`) as background processes of the local cluster, started, found and stopped by
pid. :mod:`service.bringup` starts them for ``recover cluster up`` and the scenario runner;
the test fixtures call them directly."""
