"""The alert rules and the dashboard in k8s/monitoring: Prometheus' own tools accept the rules
and their unit tests pass (``promtool test rules``); every metric an alert or a panel names is
one the coordinator's or an agent's scrape really exposes; every alert's runbook section
exists; the dashboard's JSON is what :mod:`service.monitoring.dashboard` builds."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.metrics import AgentMetrics
from recovery.coordinator.replica import Role
from recovery.ports.clock import FakeClock
from service.httpapi.app import create_app
from service.httpapi.server import ServerThread
from service.httpapi.workmetrics import MeteredJournal, WorkMetrics
from service.journaldb.journal import SqliteJournal
from service.monitoring import dashboard
from tests.service.helpers import FakeCoordinator, tokens

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "k8s" / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
#: A metric name in PromQL: ours, and Prometheus' own ``up``.
METRIC = re.compile(r"\b(recover_[a-z_]+|up)\b")
#: The series each metric type adds to its family's name.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
            "_created"), "gauge": ("",), "unknown": ("",)}  # fmt: skip


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: run ./scripts/setup.sh --no-demo"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)  # fmt: skip


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _names(text: str) -> set[str]:
    """Every series name a scrape's text offers (families with no sample yet included)."""
    found = {"up"}
    for family in text_string_to_metric_families(text):
        found |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
        found |= {sample.name for sample in family.samples}
    return found


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The names in a real scrape of the coordinator's /metrics and of an agent's registry."""
    clock = FakeClock()
    store = SqliteJournal(tmp_path_factory.mktemp("j") / "j.db", clock, checkpoint_every_s=None)
    work = WorkMetrics()
    leading = Role("leader", "c1", "c1", 1)  # a replica: the leader's gauges too
    app: Any = create_app(journal=MeteredJournal(store, work), tokens=tokens(),
                          coordinator=FakeCoordinator(), clock=clock, work=work,
                          role=lambda: leading)  # fmt: skip
    try:
        with ServerThread(app) as server:
            coordinator = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        store.close()
    agent = AgentMetrics(spooled=lambda: 0, last_post=lambda: None, last_beat=lambda: 1.0)
    agent.detected.labels("kmsg").inc()
    return _names(coordinator) | _names(generate_latest(agent.registry).decode())


def test_the_rules_pass_promtool_check_and_their_unit_tests() -> None:
    checked = _promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", str(MONITORING / "alerts_test.yaml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert is exercised by the unit tests (one that fires somewhere in them).
    text = (MONITORING / "alerts_test.yaml").read_text()
    untested = [r["alert"] for r in _rules() if f"alertname: {r['alert']}\n" not in text]
    assert not untested, untested


def test_the_scrape_config_is_valid_and_loads_the_rules() -> None:
    checked = _promtool("check", "config", str(MONITORING / "scrape.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(_rules())} rules found" in checked.stdout + checked.stderr


def test_every_metric_an_alert_names_is_in_a_scrape(scraped: set[str]) -> None:
    for rule in _rules():
        named = set(METRIC.findall(rule["expr"]))
        assert named, rule["alert"]
        assert named <= scraped, (rule["alert"], sorted(named - scraped))


def test_every_metric_a_panel_queries_is_in_a_scrape(scraped: set[str]) -> None:
    exprs = dashboard.queries(dashboard.build())
    assert len(exprs) >= 20
    for expr in exprs:
        named = set(METRIC.findall(expr))
        assert named, expr
        assert named <= scraped, (expr, sorted(named - scraped))


def test_the_dashboard_file_is_what_the_code_builds() -> None:
    kept = (ROOT / dashboard.OUTPUT).read_text()
    assert kept == dashboard.render(), (
        "k8s/monitoring/dashboard.json is stale: run .venv/bin/python -m "
        "service.monitoring.dashboard"
    )


def test_every_alert_has_its_runbook_section() -> None:
    headings = {
        line[4:].strip().lower()
        for line in ALERTS_DOC.read_text().splitlines()
        if line.startswith("### ")
    }
    for rule in _rules():
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/alerts.md#{rule['alert'].lower()}", url
        assert rule["alert"].lower() in headings, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")


def test_a_query_naming_no_real_metric_is_caught(scraped: set[str]) -> None:
    """The check above can fail: a misspelt metric is not in the scrapes."""
    named = set(METRIC.findall("sum(recover_spare_ready)"))
    assert named == {"recover_spare_ready"}
    assert not named <= scraped
