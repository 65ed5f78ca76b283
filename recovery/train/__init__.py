"""The JAX training entrypoint: a small real model, resumable and deterministic."""
