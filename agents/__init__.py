"""agents: the node agent's building blocks. Every source hands plain
:class:`recovery.model.HealthEvent` values to the agent.

* :mod:`agents.kmsg` - pure parser of kernel-log ``NVRM:`` lines, bus-id mapping;
* :mod:`agents.follow` - tails ``/dev/kmsg`` or a file; writes fault lines (injection);
* :mod:`agents.dedup` - folds repeats of a fault into one counted event per window;
* :mod:`agents.spool` - durable, bounded on-disk spool (write before send, remove on ack);
* :mod:`agents.nvml` - NVIDIA source through pynvml (nvidia-ml-py);
* :mod:`agents.tpu`, :mod:`agents.tpu_grpc` - TPU runtime source and its gRPC client;
* :mod:`agents.cli` - ``recover agent parse FILE``.

Importing this package imports none of pynvml, grpc or tpu-info; only the modules that need
them do.
"""
