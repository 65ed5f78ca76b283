"""service: the running toolkit put together, below the command line and the scenario runner.

The coordinator's start-up (``startup``) and its HTTP API (``httpapi``), its SQLite journal
(``journaldb``), the local cluster's bring-up (``bringup``), the wiring that builds adapters
from configuration (``wiring``), supervision of local daemons (``daemons``) and the report's
picture (``reportgen``). It imports the adapters (``slurm``, ``k8s``, ``agents``) and the core
(``recovery``); nothing below it imports it.
"""
