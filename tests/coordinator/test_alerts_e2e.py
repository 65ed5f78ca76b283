"""The shipped alert rules on a real Prometheus (Debian's) scraping a real coordinator on the
session's Slurm: before anything happens nothing fires; an injected xid79 takes node2 out and
``RecoverNodeTakenOut`` fires for it (the first take-out the coordinator ever made: its series
exist at 0 from the start); the coordinator killed, ``RecoverCoordinatorDown`` goes pending.
Prometheus scrapes and evaluates every second here (the rules' ``for:`` are the shipped ones)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from slurm.cli_slurm import CliSlurm
from tests.coordinator.helpers import Coordinator
from tests.slurm.helpers import down_node, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RULES = Path(__file__).resolve().parents[2] / "k8s" / "monitoring" / "alerts.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus(coordinator: Coordinator, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping the coordinator every second with the shipped rules; its
    URL. Stopped by pid afterwards."""
    binary = shutil.which("prometheus", path=os.environ["PATH"] + ":/usr/bin:/usr/sbin")
    assert binary is not None, "prometheus is missing: run ./scripts/setup.sh --no-demo"
    assert coordinator.endpoint is not None
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "recover-coordinator",
            "static_configs": [{"targets": [urlparse(coordinator.endpoint.url).netloc]}],
        }],
    }  # fmt: skip
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{_free_port()}"
    with (tmp_path / "prometheus.log").open("w") as log:
        server = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address={urlparse(url).netloc}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: _ready(url, server), 60, "Prometheus ready")
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def _ready(url: str, server: subprocess.Popen[bytes]) -> bool:
    assert server.poll() is None, f"prometheus exited with {server.returncode}"
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _alerts(url: str, name: str, state: str) -> list[dict[str, Any]]:
    answer = httpx.get(url + "/api/v1/alerts", timeout=5).json()
    return [
        a
        for a in answer["data"]["alerts"]
        if a["labels"]["alertname"] == name and a["state"] == state
    ]


def test_a_take_out_fires_its_alert_and_a_dead_coordinator_goes_pending(
    coordinator: Coordinator,
    agents: dict[str, int],
    slurm_ctl: CliSlurm,
    prometheus: str,
) -> None:
    url = prometheus
    taken = 'recover_actions_total{kind="down",outcome="done"}'
    # Scraped, with the take-outs' series at 0 before any: the first one is an increase.
    wait_for(lambda: _query(url, 'up{job="recover-coordinator"} == 1'), 30, "the scrape")
    (zero,) = wait_for(lambda: _query(url, taken), 30, "the take-out series")
    assert float(zero["value"][1]) == 0
    wait_for(
        lambda: httpx.get(url + "/api/v1/rules", timeout=5).json()["data"]["groups"],
        30,
        "the rules loaded",
    )
    assert not _alerts(url, "RecoverNodeTakenOut", "firing")
    done = coordinator.cli("inject", "--fault", "xid79", "--node", "node2", "--via", "agent",
                           "--wait", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_for(lambda: down_node(slurm_ctl, "node2"), 30, "node2 DOWN")
    (alert,) = wait_for(
        lambda: _alerts(url, "RecoverNodeTakenOut", "firing"), 60, "RecoverNodeTakenOut firing"
    )
    assert alert["labels"]["kind"] == "down"
    assert alert["labels"]["severity"] == "info"
    # increase() extrapolates a little past the samples it has: about one node.
    summary = alert["annotations"]["summary"]
    assert re.fullmatch(r"The coordinator took [12] node\(s\) out by down in 10 minutes", summary)
    assert not _alerts(url, "RecoverCoordinatorDown", "pending")
    coordinator.kill()
    (down,) = wait_for(
        lambda: _alerts(url, "RecoverCoordinatorDown", "pending"),
        30,
        "RecoverCoordinatorDown pending",
    )
    assert down["labels"]["severity"] == "critical"
