"""Recovery inside the allocation: a job that holds spare nodes of its own relaunches its
training step on one when a node is lost, instead of being requeued
(:mod:`recovery.inalloc.decide`: the rules; :mod:`recovery.inalloc.supervisor`: the loop;
``docs/in-allocation.md``)."""
