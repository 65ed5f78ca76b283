"""scenarios: fault scenarios as data (YAML, ``scenarios/shipped/``) and the runner that starts
a test cluster, injects the faults, observes, checks the expectations and writes the run
directory the incident report reads.

Modules: :mod:`scenarios.schema` (the file format, documented there and in
``docs/scenarios.md``), :mod:`scenarios.loader` (YAML with line-numbered errors),
:mod:`scenarios.rig` (the cluster), :mod:`scenarios.watch` (progress), :mod:`scenarios.actions`
(faults and operator actions), :mod:`scenarios.runner`, :mod:`scenarios.expect`,
:mod:`scenarios.control` (cached control runs), :mod:`scenarios.rundir`,
:mod:`scenarios.reporting` (the call into ``recovery.report``), :mod:`scenarios.main` (what the
``recover scenario`` and ``recover demo`` commands do).

A layer of the composition root: it builds and drives every part (Slurm, the coordinator, the
agents, training), and nothing below it imports it (import-linter contracts in pyproject.toml).
"""
