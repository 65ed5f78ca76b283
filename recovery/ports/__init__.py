"""Ports: the small interfaces the core uses and the adapters implement, and the plain values
that cross them.

``slurm`` (SlurmControl, with NodeInfo, JobInfo, BatchJob and the ``recover:`` ownership mark;
implemented by ``slurm.cli_slurm`` and ``slurm.rest_slurm``), ``nodes`` (NodeControl: the
Kubernetes side of a Slurm-on-Kubernetes cluster; ``k8s.nodes``), ``journal`` (the incident
journal; ``service.journaldb``), ``clock`` (time, both clocks; SystemClock and FakeClock),
``checks`` (RepairChecker: is a repaired node healthy again; ``service.startup.checks``),
``owners`` (other tools' marks on Slurm nodes and Kubernetes objects, read so that we never
clear them; pure).
"""
