"""The Grafana dashboard for slurm-k8s-recover, built in code with Grafana's own SDK
(grafana-foundation-sdk) and written as JSON to ``k8s/monitoring/dashboard.json``.

Regenerate after changing a panel (tests/monitoring/test_dashboard.py fails while the file
and this code differ, and checks that every query names a metric the scrapes expose)::

    .venv/bin/python -m service.monitoring.dashboard

Rows: the fleet now (incidents, spares, breaker, silent agents, coordinators up); what the
coordinator decided and did (decisions, actions, their latency); how far incidents got and
how soon (phase times); the journal and the intake; the agents. Every panel reads the
Prometheus data source chosen in the dashboard's ``datasource`` variable.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

#: Where the generated dashboard is kept, from the repository's root.
OUTPUT = Path("k8s/monitoring/dashboard.json")
UID = "slurm-k8s-recover"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel and its legend."""

    expr: str
    legend: str = ""


def _targets(panel: Any, queries: tuple[Query, ...]) -> Any:
    for i, q in enumerate(queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i))
        if q.legend:
            target = target.legend_format(q.legend)
        panel = panel.with_target(target)
    return panel


def _stat(title: str, description: str, *queries: Query, unit: str = "short") -> Any:
    panel = stat.Panel().title(title).description(description).datasource(DATASOURCE)
    return _targets(panel.unit(unit).height(4).span(4), queries)


def _series(title: str, description: str, *queries: Query, unit: str = "short") -> Any:
    panel = timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
    return _targets(panel.unit(unit).height(8).span(12), queries)


def _quantiles(metric: str, by: str, rate: str = "5m") -> tuple[Query, ...]:
    """The p50 and p99 of a histogram, by one label."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket[{rate}])))",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.99)
    )


def build() -> dict[str, Any]:
    """The dashboard, as Grafana's JSON model."""
    datasource = dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    board = (
        dashboard.Dashboard("slurm-k8s-recover")
        .uid(UID)
        .tags(["slurm", "recover"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(datasource)
    )
    rows: dict[str, tuple[Any, ...]] = {}
    rows["The fleet now"] = (
        _stat("Open incidents", "Incidents not yet closed.",
              Query("sum(recover_open_incidents)")),
        _stat("Ready spares", "Spares in the pool that could be promoted now.",
              Query("sum(recover_spares_ready)")),
        _stat("Breaker", "1 while the breaker holds take-outs (recover breaker reset).",
              Query("max(recover_breaker_tripped)")),
        _stat("Held actions", "Actions the breaker holds.",
              Query("sum(recover_held_actions)")),
        _stat("Silent agents", "Nodes whose agent's heartbeats stopped.",
              Query("sum(recover_agent_silent)")),
        _stat("Coordinators up", "Coordinator targets answering scrapes.",
              Query('sum(up{job="recover-coordinator"})')),
    )  # fmt: skip
    rows["Decisions and actions"] = (
        _series("Decisions by verdict", "Decisions committed in each interval, by verdict.",
                Query("sum by (verdict) (increase(recover_decisions_total[$__rate_interval]))",
                      "{{verdict}}")),
        _series("Open incidents by fault", "Incidents not yet closed, by fault.",
                Query("sum by (fault) (recover_open_incidents_by_fault)", "{{fault}}")),
        _series("Actions by kind and outcome",
                "Action outcomes recorded in each interval (down, drain, requeue, promote ...).",
                Query("sum by (kind, outcome) "
                      "(increase(recover_actions_total[$__rate_interval]))",
                      "{{kind}} {{outcome}}")),
        _series("Action latency", "From an action planned to its outcome, by kind.",
                *_quantiles("recover_action_duration_seconds", "kind"), unit="s"),
    )  # fmt: skip
    rows["Incidents: how far and how soon"] = (
        _series("Time to each phase",
                "From an incident's opening to each phase it reached (node-down, "
                "spare-promoted, job-running, closed ...).",
                *_quantiles("recover_incident_phase_seconds", "phase", "30m"), unit="s"),
        _series("Spares promoted and rejected, incidents closed",
                "Each in the interval: promotions, spares that failed their check, closings.",
                Query('sum(increase(recover_incident_phase_seconds_count{phase="spare-promoted"}'
                      "[$__rate_interval]))", "promoted"),
                Query('sum(increase(recover_incident_phase_seconds_count{phase="spare-rejected"}'
                      "[$__rate_interval]))", "rejected"),
                Query("sum(increase(recover_incidents_closed_total[$__rate_interval]))",
                      "closed")),
    )  # fmt: skip
    rows["Replicas"] = (
        _series("Leader", "1 for the coordinator replica that leads (--lease), 0 standing by.",
                Query("max by (instance) (recover_leader)", "{{instance}}")),
        _series("Lease term", "How many times the lead changed hands.",
                Query("max(recover_leader_term)", "term")),
    )  # fmt: skip
    rows["Journal and intake"] = (
        _series("Journal commit latency", "Each journal write, durable when it returns.",
                *_quantiles("recover_journal_commit_duration_seconds", "write"), unit="s"),
        _series("Events received", "Events the intake accepted or found duplicate, per second.",
                Query("sum by (outcome) (rate(recover_intake_events_total[$__rate_interval]))",
                      "{{outcome}}"),
                Query("sum by (status) "
                      "(rate(recover_intake_rejected_requests_total[$__rate_interval]))",
                      "rejected {{status}}"),
                unit="reqps"),
        _series("HTTP latency", "The coordinator's API, by route.",
                *_quantiles("recover_http_request_duration_seconds", "route"), unit="s"),
        _series("Events per commit", "How well group commit batches the intake.",
                Query("sum(rate(recover_intake_commit_events_sum[$__rate_interval])) / "
                      "sum(rate(recover_intake_commit_events_count[$__rate_interval]))",
                      "events per commit")),
    )  # fmt: skip
    rows["Agents"] = (
        _series("Heartbeat age", "Seconds since the coordinator last answered each agent.",
                Query("max by (instance) (recover_agent_heartbeat_age_seconds)",
                      "{{instance}}"), unit="s"),
        _series("Spool depth", "Events each agent holds, not yet delivered.",
                Query("max by (instance) (recover_agent_spool_events)", "{{instance}}")),
        _series("Faults detected by source", "Fault events the agents detected, per interval.",
                Query("sum by (source) "
                      "(increase(recover_agent_events_detected_total[$__rate_interval]))",
                      "{{source}}")),
    )  # fmt: skip
    for title, panels in rows.items():  # each row, then its panels
        board = board.with_row(dashboard.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    built: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    for i, panel in enumerate(built["panels"], 1):  # Grafana wants each panel's own id
        panel["id"] = i
    return built


def render() -> str:
    """The dashboard's JSON text, as written to :data:`OUTPUT`."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def queries(model: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard model, rows' panels included."""
    found: list[str] = []
    for panel in model.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            found += [t["expr"] for t in inner.get("targets") or [] if t.get("expr")]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m service.monitoring.dashboard",
        description="Write the Grafana dashboard's JSON (default: k8s/monitoring/dashboard.json).",
    )
    parser.add_argument("--out", type=Path, default=OUTPUT, help="where to write it")
    args = parser.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out} ({len(queries(build()))} queries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
