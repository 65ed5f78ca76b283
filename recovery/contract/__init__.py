"""The job contract: what a training process and the rest of the toolkit agree on.

Exit statuses (:mod:`.exits`), environment variables, and places on disk (the memory tier's
node directories, :mod:`.memplace`; TPU workload markers, :mod:`.workload`; standby
processes, :mod:`.standby`). The batch script, the job supervisor, the coordinator's policy,
the node agents and the local cluster import these from here, never from the trainer. Standard
library only: importing the contract costs nothing.
"""
