"""recovery: the core of the toolkit.

Domain model, policy, coordinator, incident journal, verified checkpoints, the JAX training
entrypoint, reports and the ``recover`` CLI. This package never runs Slurm commands, never
imports ``kubernetes`` or ``pynvml``: those live behind ports in ``slurm/``, ``k8s/`` and
``agents/``.
"""

__version__ = "0.1.0"
