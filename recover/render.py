"""Plain-text tables for the operator verbs. Pure: JSON documents in, text out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def _wall(at: Any) -> float | None:
    """Wall seconds from a stamp (``{"wall": s, "mono": s}``) or a plain number."""
    if isinstance(at, dict):
        return float(at["wall"])
    return None if at is None else float(at)


def _ts(at: Any) -> str:
    wall = _wall(at)
    if wall is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall * 1000) % 1000:03d}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns, as wide as their widest cell."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def render_status(doc: dict[str, Any]) -> str:
    """``recover status``: nodes, open incidents, spares, breaker."""
    nodes = table(
        ("NODE", "STATE", "HELD BY", "INCIDENT", "REASON"),
        [
            (
                n["name"] + (" (suspect: agent silent)" if n.get("suspect") else ""),
                "+".join([n["state"], *n["flags"]]),
                _held_by(n),
                n["incident"] or "-",
                n["reason"] or "-",
            )
            for n in doc["nodes"]
        ],
    )
    parts = [nodes, "", render_incidents(doc["incidents"])]
    parts.append("")
    parts.append(f"spares ready: {', '.join(doc['spares']) or 'none'}")
    if doc.get("checks"):
        parts += ["", render_checks(doc["checks"])]
    parts.append(render_breaker(doc["breaker"]).splitlines()[0])
    if doc.get("dry_run"):
        parts.append("DRY RUN: decisions are recorded, no action is applied")
    return "\n".join(parts)


def render_checks(rows: Sequence[dict[str, Any]]) -> str:
    """Each spare's (and each checked node's) last check: verdict, age, time, what failed."""
    return table(
        ("NODE", "LAST CHECK", "AGE", "TOOK", "WHAT FAILED"),
        [
            (
                r["node"] + (" (spare)" if r.get("spare") else ""),
                r["verdict"] or "never checked",
                "-" if r["age_s"] is None else f"{r['age_s']:.0f} s ago",
                "-" if r["took_s"] is None else f"{r['took_s']:.1f} s",
                r.get("detail") or "-",
            )
            for r in rows
        ],
    )


def render_check(doc: dict[str, Any]) -> str:
    """``recover node check``: the verdict, then each check's result."""
    lines = [f"{doc['node']}: {doc['verdict']} ({doc['took_s']:.1f} s)"]
    marks = {True: "ok", False: "FAILED", None: "skipped"}
    for r in doc["results"]:
        took = f" ({r['took_s']:.1f} s)" if r.get("took_s") else ""
        lines.append(f"  {r['name']:<13} {marks[r['ok']]:<8} {r['detail']}{took}")
    return "\n".join(lines)


def _held_by(row: dict[str, Any]) -> str:
    """Slurm's holder, then whoever else holds the Kubernetes node: ``recover, sunk (k8s)``."""
    who = [row["held_by"]] if row.get("held_by") else []
    kube = row.get("k8s") or {}
    who += [f"{o} (k8s)" for o in kube.get("held_by", [])]
    return ", ".join(who) or "-"


def render_incidents(items: Sequence[dict[str, Any]]) -> str:
    """A list of incidents, one per line."""
    if not items:
        return "no incidents"
    return table(
        ("INCIDENT", "NODE", "FAULT", "VERDICT", "STATUS", "OPENED", "LAST PHASE"),
        [
            (
                i["id"],
                i["node"],
                i["fault"],
                i["verdict"],
                i["status"],
                _ts(i["opened"]),
                i.get("last_phase") or _last_phase(i),
            )
            for i in items
        ],
    )


def _phases(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(doc.get("phases", []), key=lambda p: _wall(p["at"]) or 0.0)


def _last_phase(doc: dict[str, Any]) -> str:
    phases = _phases(doc)
    return str(phases[-1]["name"]) if phases else ""


def render_incident(doc: dict[str, Any]) -> str:
    """One incident's timeline: each phase with its offset from the fault, then actions."""
    phases = _phases(doc)
    t0 = _wall(phases[0]["at"]) if phases else _wall(doc.get("opened"))
    lines = [
        f"incident {doc['id']}: {doc['fault']} on {doc['node']} -> {doc['verdict']} "
        f"({doc['status']})"
    ]
    if doc.get("jobs"):
        lines.append(f"jobs: {' '.join(doc['jobs'])}")
    for job, note in sorted((doc.get("info") or {}).get("requeues", {}).items()):
        # Jobs the fault ended before Slurm could requeue them (docs/coordinator.md).
        lines.append(f"job {job} ({note['ended']}): {note['outcome']}: {note['detail']}")
    rows = [
        (
            _ts(p["at"]),
            f"+{(_wall(p['at']) or 0.0) - t0:.3f}s" if t0 else "",
            p["name"],
            p.get("detail", ""),
        )
        for p in phases
    ]
    lines.append(table(("TIME", "OFFSET", "PHASE", "DETAIL"), rows))
    acts = doc.get("actions", [])
    if acts:
        lines.append("")
        lines.append(
            table(
                ("ACTION", "NODE", "STATUS", "ATTEMPTS", "DETAIL"),
                [
                    (
                        a["action"]["kind"],
                        a["action"]["node"],
                        a["status"],
                        a["attempts"],
                        a["detail"],
                    )
                    for a in acts
                ],
            )
        )
    return "\n".join(lines)


def render_breaker(doc: dict[str, Any]) -> str:
    """The breaker: one summary line, then held actions."""
    state = "TRIPPED" if doc.get("tripped") else "closed"
    first = (
        f"breaker {state}: {len(doc.get('taken_out', []))} node(s) taken out in the last "
        f"{doc.get('window_s', 0):g} s (limits: {doc.get('max_nodes')} nodes, "
        f"{100 * float(doc.get('max_fraction', 0)):g}% of a partition); "
        f"{len(doc.get('held', []))} action(s) held"
    )
    held = doc.get("held", [])
    if not held:
        return first
    return "\n".join(
        [
            first,
            table(
                ("ID", "INCIDENT", "ACTION", "NODE", "HELD SINCE"),
                [
                    (
                        h["id"],
                        h["incident"],
                        h["action"]["kind"],
                        h["action"]["node"],
                        _ts(h["held_since"]),
                    )
                    for h in held
                ],
            ),
        ]
    )
