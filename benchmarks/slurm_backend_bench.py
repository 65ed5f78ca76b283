"""Calls per second of each SlurmControl backend on a real local Slurm 25.11 cluster: Slurm's
commands (cli), slurmrestd v0.0.44 (rest) and pyslurm (libslurm in this process).

    .venv/bin/python -m benchmarks.slurm_backend_bench [--nodes 8] [--seconds 3] [--json F]

Starts a 25.11 cluster (``scripts/build-slurm.sh`` must have built it; pyslurm installed by
``scripts/setup.sh``) with slurmrestd, then for each backend, for ``--seconds`` each:

* ``read nodes``: ``nodes()``, the whole node table (what every decision starts from);
* ``read jobs``: ``jobs()`` with one job running;
* ``node update``: the raw request alone, DRAIN then RESUME of one node, alternating
  (``_request_update``/``_request_resume``: what a storm of take-outs costs on the wire);
* ``drain+resume``: the port's ``drain`` then ``resume`` of one node, with the reads each does
  first (what the coordinator pays per node).

Printed: calls per second per backend and each backend's ratio to the CLI (the reference).
Needs root (the local cluster runs as root). Every backend acts as root.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.ports.slurm import BatchJob, SlurmControl
from slurm import install
from slurm.cluster import LocalCluster
from slurm.control import SlurmBase
from slurm.rest_slurm import connect

MEASURES = ("read nodes", "read jobs", "node update", "drain+resume")


def rate(call: Callable[[], Any], seconds: float) -> float:
    """Calls per second of ``call`` over about ``seconds`` (at least 3 calls)."""
    n = 0
    t0 = time.perf_counter()
    while True:
        call()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds and n >= 3:
            return n / elapsed


def measure(ctl: SlurmBase, node: str, seconds: float) -> dict[str, float]:
    flip = [False]

    def update() -> None:
        flip[0] = not flip[0]
        if flip[0]:
            ctl._request_update([node], "DRAIN", "recover: bench")
        else:
            ctl._request_resume(node)

    def drain_resume() -> None:
        ctl.drain(node, "bench")
        ctl.resume(node)

    out = {
        "read nodes": rate(ctl.nodes, seconds),
        "read jobs": rate(ctl.jobs, seconds),
        "node update": rate(update, seconds),
    }
    if flip[0]:
        ctl._request_resume(node)
    out["drain+resume"] = rate(drain_resume, seconds)
    return out


def backends(cluster: LocalCluster) -> dict[str, Callable[[], SlurmControl]]:
    from slurm.pyslurm_slurm import PySlurm, unavailable

    rest = cluster.start_rest()
    made: dict[str, Callable[[], SlurmControl]] = {
        "cli": cluster.control,
        "rest": lambda: connect(url=rest.url, token_file=rest.token_file, user=rest.user),
    }
    why = unavailable()
    if why is None:
        made["pyslurm"] = lambda: PySlurm(cluster.conf_path)
    else:
        print(f"pyslurm: not measured ({why})")
    return made


def render(results: dict[str, dict[str, float]]) -> str:
    names = list(results)
    head = f"{'measure':<16}" + "".join(f"{n:>12}" for n in names)
    head += "".join(f"{n + '/cli':>14}" for n in names if n != "cli")
    rows = [head, "-" * len(head)]
    for m in MEASURES:
        row = f"{m:<16}" + "".join(f"{results[n][m]:>10.1f}/s" for n in names)
        row += "".join(f"{results[n][m] / results['cli'][m]:>13.1f}x" for n in names if n != "cli")
        rows.append(row)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    built = install.build()
    if built is None:
        print(f"Slurm 25.11 is not built; {install.BUILD_HINT}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="backend-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "slurm", jwt=True, install=built)
        try:
            cluster.up(nodes=args.nodes, spares=0)
            cli = cluster.control()
            job = cli.submit(BatchJob("#!/bin/sh\nsleep 600\n", {"job-name": "bench"}, workdir=tmp))
            results: dict[str, dict[str, float]] = {}
            for name, make in backends(cluster).items():
                ctl = make()
                assert isinstance(ctl, SlurmBase)
                print(f"measuring {name} ...", flush=True)
                results[name] = measure(ctl, "node1", args.seconds)
            cli.cancel(job)
        finally:
            cluster.down()
    print(f"\nSlurm 25.11, {args.nodes} nodes, {args.seconds:g} s per measure (calls per second)")
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
