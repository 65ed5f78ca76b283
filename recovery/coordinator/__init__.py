"""The coordinator: decides on health events and drives Slurm (and Kubernetes) through the
ports, recording every step in the journal."""
