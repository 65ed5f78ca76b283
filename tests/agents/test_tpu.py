"""The TPU source against an in-process gRPC server serving the real RuntimeMetricService
proto from tpu-info, on a free loopback port with local credentials."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc
from tpu_info.proto import tpu_telemetry_pb2 as telemetry

from agents.tpu import CoreState, RuntimeQueryFailed, RuntimeUnreachable, TpuSource
from agents.tpu_grpc import GrpcTpuRuntime
from recovery.model import Source
from recovery.ports.clock import FakeClock


class FakeRuntime(pb_grpc.RuntimeMetricServiceServicer):  # type: ignore[misc]
    """Answers GetTpuRuntimeStatus with ``cores``: ``{core: (chip, launch_id, error)}``."""

    def __init__(self) -> None:
        self.cores: dict[int, tuple[int, int, str]] = {}
        self.fail_with: grpc.StatusCode | None = None

    def GetTpuRuntimeStatus(self, request: Any, context: Any) -> Any:
        if self.fail_with is not None:
            context.abort(self.fail_with, "injected failure")
        response = pb.GetTpuRuntimeStatusResponse(host_name="tpu-host")
        for core, (chip, launch, error) in self.cores.items():
            state = response.core_states[core]
            state.core_id.global_core_id = core
            state.core_id.chip_id = chip
            state.core_id.core_on_chip.type = telemetry.TPU_CORE_TYPE_TENSOR_CORE
            state.launch_id = launch
            state.error_message = error
        return response


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Start/stop the fake runtime on one fixed port (stopping it makes the port refuse)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.runtime = FakeRuntime()
        self._server: Any = None

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(self.runtime, self._server)
        creds = grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        assert self._server.add_secure_port(f"localhost:{self.port}", creds) == self.port
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.start()
    yield s
    s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[GrpcTpuRuntime]:
    c = GrpcTpuRuntime(f"localhost:{server.port}", timeout_s=5)
    yield c
    c.close()


def _source(runtime: Any, clock: FakeClock, logs: list[str], registered: bool) -> TpuSource:
    return TpuSource(
        node="tpu-n1",
        boot_id="b1",
        clock=clock,
        runtime=runtime,
        workload_registered=lambda: registered,
        log=logs.append,
    )


def test_the_grpc_client_reads_core_states(server: Server, client: GrpcTpuRuntime) -> None:
    server.runtime.cores = {0: (0, 7, ""), 1: (0, 7, ""), 2: (1, 7, "HBM uncorrectable error")}
    assert client.core_states() == [
        CoreState(0, 0, 7, ""),
        CoreState(1, 0, 7, ""),
        CoreState(2, 1, 7, "HBM uncorrectable error"),
    ]


def test_cores_reporting_errors_become_events_once(
    server: Server, client: GrpcTpuRuntime, clock: FakeClock
) -> None:
    logs: list[str] = []
    src = _source(client, clock, logs, registered=True)
    server.runtime.cores = {0: (0, 1, ""), 1: (1, 1, "")}
    assert src.poll_once() == []
    server.runtime.cores[1] = (1, 1, "TensorCore halted: program error")
    (event,) = src.poll_once()
    assert (event.source, event.fault, event.accelerator) == (Source.tpu, "tpu-runtime-error", 1)
    assert "TensorCore halted" in event.message
    assert src.poll_once() == [], "the same error is reported once"
    server.runtime.cores[1] = (1, 2, "TensorCore halted: program error")
    (relaunch,) = src.poll_once()
    assert relaunch.id != event.id, "a new launch failing again is a new observation"


def test_the_runtime_disappearing_under_a_workload_is_a_fault(
    server: Server, client: GrpcTpuRuntime, clock: FakeClock
) -> None:
    logs: list[str] = []
    src = _source(client, clock, logs, registered=True)
    server.runtime.cores = {0: (0, 1, "")}
    assert src.poll_once() == []
    server.stop()  # the port now refuses connections
    (event,) = src.poll_once()
    assert (event.fault, event.accelerator) == ("tpu-runtime-gone", None)
    assert src.poll_once() == [], "one event per disappearance"


def test_connection_refused_with_no_workload_is_not_a_fault(clock: FakeClock) -> None:
    logs: list[str] = []
    runtime = GrpcTpuRuntime(f"localhost:{_free_port()}", timeout_s=5)
    try:
        src = _source(runtime, clock, logs, registered=False)
        assert src.poll_once() == []
        assert src.poll_once() == []
        with pytest.raises(RuntimeUnreachable):
            runtime.core_states()
    finally:
        runtime.close()
    assert len(logs) == 1
    assert "no TPU workload: not a fault" in logs[0]


def test_a_runtime_that_ends_with_no_workload_registered_is_not_a_fault(
    server: Server, client: GrpcTpuRuntime, clock: FakeClock
) -> None:
    logs: list[str] = []
    src = _source(client, clock, logs, registered=False)
    src.poll_once()
    server.stop()
    assert src.poll_once() == []


def test_other_grpc_failures_are_logged_once_not_faults(
    server: Server, client: GrpcTpuRuntime, clock: FakeClock
) -> None:
    logs: list[str] = []
    src = _source(client, clock, logs, registered=True)
    server.runtime.fail_with = grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(RuntimeQueryFailed, match="UNIMPLEMENTED"):
        client.core_states()
    assert src.poll_once() == []
    assert src.poll_once() == []
    assert [line for line in logs if "query failed" in line] == [
        f"tpu: runtime status query failed: localhost:{server.port}: UNIMPLEMENTED: "
        "injected failure"
    ]


def test_the_chips_the_runtime_answers_for_go_in_the_heartbeat(
    server: Server, client: GrpcTpuRuntime, clock: FakeClock
) -> None:
    from agents.accel import AcceleratorSummary

    src = _source(client, clock, [], registered=True)
    src.summary = AcceleratorSummary()
    server.runtime.cores = {0: (0, 1, ""), 1: (0, 1, ""), 2: (1, 1, ""), 3: (1, 1, "")}
    assert src.poll_once() == []
    said = src.summary.to_json()
    assert (said["source"], said["devices"]) == ("tpu", 2)  # two chips, two cores each
