"""agents: the node agent - health sources (NVML, kernel log, TPU runtime, injected faults)
and the publisher that delivers health events to the coordinator. Not built yet."""
