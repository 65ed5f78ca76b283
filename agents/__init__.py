"""agents: the node agent's building blocks. Every source hands plain
:class:`recovery.model.HealthEvent` values to the agent.

* :mod:`agents.kmsg` - pure parser of kernel-log ``NVRM:`` lines, bus-id mapping;
* :mod:`agents.follow` - tails ``/dev/kmsg`` or a file; writes fault lines (injection);
* :mod:`agents.dedup` - folds repeats of a fault into one counted event per window;
* :mod:`agents.spool` - durable, bounded on-disk spool (write before send, remove on ack);
* :mod:`agents.nvml` - NVIDIA source through pynvml (nvidia-ml-py);
* :mod:`agents.tpu`, :mod:`agents.tpu_grpc` - TPU runtime source and its gRPC client;
* :mod:`agents.link` - HTTP requests to the coordinator; the agent's token file;
* :mod:`agents.publisher` - spool -> ``POST /v1/events`` -> ack; refused events kept aside;
* :mod:`agents.inject` - carries out the coordinator's ``inject`` commands;
* :mod:`agents.runtime` - the running agent: threads, pipeline, heartbeats, commands;
* :mod:`agents.cli` - ``recover agent run ...``, ``recover agent parse FILE``
  (also ``python -m agents``).

Importing this package imports none of pynvml, grpc or tpu-info; only the modules that need
them do.
"""
