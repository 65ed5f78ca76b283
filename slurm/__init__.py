"""slurm: everything that talks to Slurm - the adapter behind the ``SlurmControl`` port, the
sbatch wrapper for training jobs, and a real local cluster for development and tests."""
