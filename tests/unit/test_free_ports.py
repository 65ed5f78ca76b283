"""recovery.proc.free_ports: ports handed to concurrent callers never repeat while claimed,
and a claimed port is skipped even though nothing is bound to it yet."""

from __future__ import annotations

import json
import multiprocessing
import socket
from pathlib import Path

import pytest

from recovery import proc


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ports.json"
    monkeypatch.setattr(proc, "PORT_CLAIMS", path)
    return path


def _take(path: str, count: int) -> list[int]:
    proc.PORT_CLAIMS = Path(path)
    return proc.free_ports(count)


def test_concurrent_callers_never_share_a_port(claims: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        got = pool.starmap(_take, [(str(claims), 25)] * 8)
    ports = [p for batch in got for p in batch]
    assert len(ports) == 200
    assert len(set(ports)) == 200
    assert all(20000 <= p < 32000 for p in ports)
    assert set(json.loads(claims.read_text())) == {str(p) for p in ports}


def test_a_claimed_port_is_not_handed_out_again_until_it_expires(
    claims: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claims alone are under test: a cluster of another test worker may hold one of these
    # ports for real (CI saw it), so every port counts as bindable here.
    monkeypatch.setattr(proc, "_bindable", lambda host, port: True)
    monkeypatch.setattr(proc, "_LOW", 20000)
    monkeypatch.setattr(proc, "_HIGH", 20003)
    first = proc.free_ports(3)
    with pytest.raises(OSError, match="found only 0 of 1 free ports"):
        proc.free_ports(1)
    # Claims older than the TTL lapse: the same ports come back.
    aged = {k: v - proc.CLAIM_TTL_S - 1 for k, v in json.loads(claims.read_text()).items()}
    claims.write_text(json.dumps(aged))
    assert sorted(proc.free_ports(3)) == sorted(first)


def test_a_bound_port_is_skipped_and_a_torn_claims_file_is_survived(
    claims: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims.write_text("{not json")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        monkeypatch.setattr(proc, "_LOW", port)
        monkeypatch.setattr(proc, "_HIGH", port + 1)
        with pytest.raises(OSError, match="found only 0 of 1"):
            proc.free_ports(1)
