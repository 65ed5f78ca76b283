"""The TPU runtime's gRPC status service, through the protos ``tpu-info`` ships.

Kept apart from :mod:`agents.tpu` so the decisions there need neither grpcio nor tpu-info.
"""

from __future__ import annotations

from typing import Any

import grpc
from tpu_info.proto import (
    tpu_metric_service_pb2,
    tpu_metric_service_pb2_grpc,
)

from agents.tpu import CoreState, RuntimeQueryFailed, RuntimeUnreachable

#: Where the runtime of a TPU workload serves its metrics and status.
DEFAULT_ADDRESS = "localhost:8431"


class GrpcTpuRuntime:
    """:class:`agents.tpu.TpuRuntime` over gRPC with local (loopback) channel credentials.

    ``timeout_s`` bounds each call (seconds). The channel is opened on first use and kept;
    :meth:`close` ends it.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, *, timeout_s: float = 5.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._stub: Any = None

    def core_states(self) -> list[CoreState]:
        """Every core's state from ``GetTpuRuntimeStatus``.

        Raises RuntimeUnreachable when nothing answers at ``address`` (UNAVAILABLE: refused,
        nothing listening), RuntimeQueryFailed for any other gRPC status.
        """
        if self._stub is None:
            self._channel = grpc.secure_channel(self.address, grpc.local_channel_credentials())
            self._stub = tpu_metric_service_pb2_grpc.RuntimeMetricServiceStub(self._channel)
        request = tpu_metric_service_pb2.GetTpuRuntimeStatusRequest(include_hlo_info=False)
        try:
            response = self._stub.GetTpuRuntimeStatus(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            detail = e.details() if callable(getattr(e, "details", None)) else str(e)
            if code == grpc.StatusCode.UNAVAILABLE:
                raise RuntimeUnreachable(f"{self.address}: {detail}") from e
            name = code.name if code is not None else "unknown status"
            raise RuntimeQueryFailed(f"{self.address}: {name}: {detail}") from e
        return [
            CoreState(
                core=int(key),
                chip=int(state.core_id.chip_id),
                launch_id=int(state.launch_id),
                error=str(state.error_message),
            )
            for key, state in sorted(response.core_states.items())
        ]

    def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
