"""Ports: the small interfaces the core uses and the adapters implement.

``slurm`` (SlurmControl, NodeInfo, JobInfo and the ownership mark), ``journal`` (the incident
journal), ``clock`` (time), ``nodes`` (Kubernetes NodeControl, to come with the Kubernetes
adapter).
"""
