"""The coordinator's HTTP API: the FastAPI app with its raw-ASGI event fast path, the durable
group-commit intake, the agent channel (heartbeats, commands, fault injection), tokens,
metrics, running it under uvicorn, and the small client the operator verbs use.

Built by the start-up (:mod:`service.startup`) around the core's :class:`Engine` and a
journal; the core never imports it.
"""
