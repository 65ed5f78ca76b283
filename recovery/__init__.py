"""recovery: the core of the toolkit.

Domain model, policy, coordinator, incident journal, verified checkpoints, the published
library (``recovery.api``), the JAX training entrypoint, reports, and the job contract the
adapters share with the trainer (``recovery.contract``). This package imports no adapter and
no composition root: Slurm, Kubernetes and node hardware live behind ports in ``slurm/``,
``k8s/`` and ``agents/``; the command line is ``recover/``, the assembled service ``service/``.
"""

__version__ = "0.1.0"
