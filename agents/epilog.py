#!/usr/bin/env python3
"""slurmd's Epilog: fail while this node has an open fault, so Slurm requeues the job itself.

With Slurm 25.11's expedited requeue (``sbatch --requeue=expedite``,
``SlurmctldParameters=enable_expedited_requeue``), a batch job whose script exits non-zero is
requeued at once, at the top of the queue, *when an Epilog on its node failed*; otherwise it is
held. Training that died because its GPU fell off the bus ends its batch script non-zero; this
Epilog then finds the coordinator's open incident for the node and fails, so Slurm requeues
the job without waiting for anyone, and (the node being drained) never onto this node again.

What it does, in order:

1. The job exited 0 (``SLURM_JOB_EXIT_CODE``): pass at once; nothing needs requeueing.
2. Ask the coordinator for open incidents (``GET /v1/incidents?open=true`` with this node's
   agent token), again for up to ``--wait`` seconds (default 2): the agent's report may still
   be on its way when training's death ends the script. The wait ends as soon as an incident
   is open on any node of the job (``SLURM_JOB_NODELIST``): on a multi-node job the other
   nodes' Epilogs then pass at once instead of holding the requeue up for the whole wait.
3. An open incident on this node whose verdict takes the node out (any verdict but those
   in ``KEEPS_NODE``: an application restart keeps the node, and a failed Epilog would make
   Slurm drain it; the job then waits in Slurm's hold until the coordinator's own requeue
   releases it): drain the node with our reason (``scontrol update
   ... State=DRAIN Reason="recover: ..."``), unless it is out of service with our reason
   already (the coordinator's, which says more), and exit 1. Draining first matters: Slurm drains a
   node whose Epilog failed with reason "Epilog error", which would read as someone else's mark;
   it keeps a reason already there, so the node stays ours to return to service.
4. No open incident, or the coordinator cannot be reached, or anything else goes wrong:
   pass (exit 0). An Epilog that failed for its own reasons would drain healthy nodes.

Standard library only, run as a file (``python3 -I agents/epilog.py ...``): it must work on a
node where the toolkit's virtualenv is not installed. slurmd runs it as root with
``SLURMD_NODENAME``, ``SLURM_JOB_ID``, ``SLURM_JOB_EXIT_CODE`` and ``SLURM_CONF`` set and no
PATH (the local cluster's Epilog wrapper sets one). Its output goes to slurmd's log.

Where the coordinator is: ``--coordinator URL --token-file FILE`` (a tokens file with a ``node
NAME TOKEN`` line, or a file holding this node's token alone), or ``--coordinator-dir DIR``
(a coordinator's state dir: its ``coordinator.json`` and ``tokens``, as on the local cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

#: Every reason the toolkit writes starts with it (recovery.ports.slurm.OWNER_PREFIX).
OWNER_PREFIX = "recover:"
FAIL = 1
PASS = 0
#: Verdicts that keep the node in service (recovery.model.Verdict's values): no take-out.
KEEPS_NODE = frozenset({"restart-app", "observe", "ignore"})


def log(msg: str) -> None:
    """One line to slurmd's log."""
    print(f"recover-epilog: {msg}", file=sys.stderr, flush=True)


def read_token(path: Path, node: str) -> str:
    """This node's token from a tokens file (``node NAME TOKEN`` lines) or a one-token file.
    Raises ValueError when there is none."""
    lines = [
        ln.split() for ln in path.read_text().splitlines() if ln.strip() and ln.lstrip()[0] != "#"
    ]
    if len(lines) == 1 and len(lines[0]) == 1:
        return lines[0][0]
    for words in lines:
        if len(words) == 3 and words[0] == "node" and words[1] == node:
            return words[2]
    raise ValueError(f"{path} has no token for node {node}")


def locate(args: argparse.Namespace, node: str) -> tuple[str, str]:
    """(coordinator URL, this node's token) from the options. Raises OSError or ValueError
    when they cannot be had (no coordinator recorded, no token)."""
    if args.coordinator_dir is not None:
        d = Path(args.coordinator_dir)
        url = str(json.loads((d / "coordinator.json").read_text())["url"])
        return url, read_token(d / "tokens", node)
    if args.coordinator is None or args.token_file is None:
        raise ValueError("give --coordinator URL --token-file FILE, or --coordinator-dir DIR")
    return args.coordinator, read_token(Path(args.token_file), node)


def expand_hostlist(text: str) -> set[str]:
    """Node names of a Slurm hostlist such as ``node[1-3,5],spare1`` (zero padding kept);
    what cannot be read is taken as one name."""
    names: set[str] = set()
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if m is None:
            names.add(item)
            continue
        head, body, tail = m.groups()
        for part in body.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                names.add(item)
                break
            width = len(lo) if lo.startswith("0") else 0
            names.update(f"{head}{i:0{width}d}{tail}" for i in range(int(lo), int(hi or lo) + 1))
    return names


def open_incidents(url: str, token: str, timeout_s: float) -> list[dict[str, Any]]:
    """The coordinator's open incidents. Raises OSError (urllib's errors are OSErrors) when it
    cannot be reached or refuses."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    req = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
        url.rstrip("/") + "/v1/incidents?open=true",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as reply:  # noqa: S310
        doc = json.loads(reply.read())
    return [i for i in doc if isinstance(i, dict)]


def held_by_us(node: str, timeout_s: float) -> bool:
    """Whether ``node`` is already out of service (DOWN or DRAIN) with our reason: the
    coordinator usually took it out first, and its reason says more than ours would."""
    argv = ["scontrol", "--oneliner", "show", "node", node]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    state = re.search(r"\bState=(\S+)", done.stdout)
    out = state is not None and bool(re.search(r"DOWN|DRAIN", state.group(1)))
    return out and f"Reason={OWNER_PREFIX}" in done.stdout


def drain(node: str, reason: str, timeout_s: float) -> bool:
    """Drain ``node`` with ``reason`` (ours); False when scontrol failed (logged)."""
    argv = ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"could not drain {node}: {e}")
        return False
    if done.returncode != 0:
        log(f"could not drain {node}: {done.stderr.strip()}")
        return False
    return True


def job_failed(env: dict[str, str]) -> bool:
    """Whether the job's batch script ended badly (``SLURM_JOB_EXIT_CODE``, a wait status; an
    absent one counts as failed, so the coordinator is asked)."""
    code = env.get("SLURM_JOB_EXIT_CODE", "").strip()
    return not (code.isdigit() and int(code) == 0)


def decide(args: argparse.Namespace, env: dict[str, str]) -> int:
    """The Epilog's exit status (see the module docstring)."""
    node = env.get("SLURMD_NODENAME", "")
    job = env.get("SLURM_JOB_ID", "?")
    if not node:
        log("SLURMD_NODENAME is not set; passing")
        return PASS
    if not job_failed(env):
        return PASS
    try:
        url, token = locate(args, node)
    except (OSError, ValueError, KeyError) as e:
        log(f"job {job}: no coordinator to ask ({e}); passing")
        return PASS
    job_nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) | {node}
    deadline = time.monotonic() + args.wait
    while True:
        try:
            incidents = open_incidents(url, token, args.timeout)
        except (OSError, ValueError) as e:
            log(f"job {job}: coordinator at {url} not reached ({e}); passing")
            return PASS
        found = [i for i in incidents if i.get("node") == node]
        if found or time.monotonic() >= deadline:
            break
        if any(i.get("node") in job_nodes for i in incidents):
            return PASS  # the job's faulted node is another one; its Epilog fails
        time.sleep(0.1)
    if not found:
        return PASS
    inc = found[0]
    if inc.get("verdict") in KEEPS_NODE:
        log(f"job {job}: node {node}'s incident {inc.get('id')} keeps the node "
            f"({inc.get('verdict')}); passing")  # fmt: skip
        return PASS
    reason = f"{OWNER_PREFIX} {inc.get('fault', 'fault')} (incident {inc.get('id', '?')}, epilog)"
    if not held_by_us(node, args.timeout):
        drain(node, reason, args.timeout)
    log(f"job {job}: node {node} has open incident {inc.get('id')} ({inc.get('fault')}); failing")
    return FAIL


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="slurmd Epilog: fail while the node has an open fault")
    p.add_argument("--coordinator", help="coordinator URL, e.g. http://coord:8470")
    p.add_argument("--token-file", help="tokens file, or a file with this node's token")
    p.add_argument("--coordinator-dir", help="a coordinator's state dir (local cluster)")
    p.add_argument("--wait", type=float, default=2.0, help="seconds to wait for an incident")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds per request")
    args = p.parse_args(argv)
    try:
        return decide(args, dict(os.environ))
    except Exception as e:  # an Epilog that crashes would drain the node
        log(f"unexpected error, passing: {type(e).__name__}: {e}")
        return PASS


if __name__ == "__main__":
    sys.exit(main())
