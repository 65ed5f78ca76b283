"""A real local Slurm cluster: munged, slurmctld and one slurmd per node, on one machine.

Everything lives under one state dir (conf, spool, logs, pids, munge's files unless user munge
cannot reach it - see ``slurm.munge``). ``LocalCluster`` is the one way to run it: the local
bring-up (``service.bringup``: ``recover cluster up/down`` and the scenario runner), ``recover
cluster status``, the pytest fixtures and the benchmarks use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from recovery import fsutil, proc
from recovery.contract.memplace import forget_node, memory_root, node_key
from recovery.errors import (
    ClusterError,
    RecoverError,
    SlurmNotInstalledError,
    UsageError,
    unknown_choice,
)
from recovery.ports.slurm import NodeInfo, describe_state
from slurm import install, munge, procs, restd
from slurm.cli_slurm import CliSlurm
from slurm.clusterinfo import (
    REQUIRED_PROGRAMS,
    STATE_FILE,
    ClusterInfo,
    ClusterStatus,
    check_installed,
    check_socket_paths,
    default_state_dir,
    node_names,
    resolve_conf,
)
from slurm.conf import ClusterLayout, render_epilog, render_slurm_conf
from slurm.install import SlurmInstall
from slurm.restd import RestEndpoint

__all__ = [
    "REQUIRED_PROGRAMS",
    "ClusterInfo",
    "ClusterStatus",
    "LocalCluster",
    "check_installed",
    "conf_status",
    "default_state_dir",
    "node_names",
    "resolve_conf",
]


class LocalCluster:
    """Start, inspect and stop one local cluster rooted at ``state_dir``.

    ``slurmd_timeout_s`` (seconds) is how soon a crashed slurmd's node goes DOWN;
    ``cred_expire_s`` bounds the wait before a requeued job restarts. ``jwt`` makes slurmctld
    also accept JWTs (``auth/jwt``), which :meth:`start_rest`'s slurmrestd needs for requests
    acting as a chosen user. ``install`` is the Slurm it runs on (default: Debian's 22.05;
    see :mod:`slurm.install`). ``expedite`` allows ``--requeue=expedite`` (25.11 only; None:
    whenever the install has it). ``epilog`` is the command slurmd runs as the Epilog after
    each job (ours is ``agents/epilog.py``, which fails while the node has an open fault);
    None: no Epilog. ``env`` is the environment the cluster's daemons start with (and so its
    job steps; None: this process's), which also names the memory tier's root
    (``RECOVER_MEMORY_DIR``) that a crashed node loses.
    ``clock``/``sleep`` are injected so waiting logic can be driven by tests.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        slurmd_timeout_s: int = 10,
        cred_expire_s: int = 10,
        jwt: bool = False,
        install: SlurmInstall | None = None,
        expedite: bool | None = None,
        epilog: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.state_dir = Path(state_dir).absolute() if state_dir else default_state_dir(env)
        self.slurmd_timeout_s = slurmd_timeout_s
        self.cred_expire_s = cred_expire_s
        self.jwt = jwt
        self.install = install if install is not None else self._recorded_install()
        if expedite is None:
            expedite = self.install.series >= (25, 11)
        if expedite and self.install.series < (25, 11):
            raise UsageError(
                f"expedited requeue needs Slurm 25.11; this cluster runs {self.install.describe()}"
            )
        self.expedite = expedite
        self.epilog = tuple(epilog) if epilog else None
        self._env = os.environ if env is None else env
        self._clock = clock
        self._sleep = sleep

    @property
    def conf_path(self) -> Path:
        """Path of the generated slurm.conf (whether or not the cluster runs)."""
        return self.state_dir / "slurm.conf"

    def control(self) -> CliSlurm:
        """The SlurmControl adapter pointed at this cluster (its install's commands)."""
        return CliSlurm(self.conf_path, env=self._env)

    def _recorded_install(self) -> SlurmInstall:
        # A cluster already running here keeps its install (`down`, `status`, `start_rest`
        # need no --slurm); a fresh one defaults to Debian's.
        return install.of_conf(self.conf_path) or install.SYSTEM

    # --- state file ---------------------------------------------------------------------

    def info(self) -> ClusterInfo | None:
        """The recorded cluster, or None when none was started here (or it was stopped)."""
        return fsutil.read_json(self.state_dir / STATE_FILE, self._info, error=ClusterError)

    def _info(self, raw: Any) -> ClusterInfo:
        return ClusterInfo(
            state_dir=self.state_dir,
            conf_path=Path(raw["conf_path"]),
            nodes=tuple(raw["nodes"]),
            spares=tuple(raw["spares"]),
            pids={k: int(v) for k, v in raw["pids"].items()},
            munge_home=Path(raw["munge_home"]),
            started=False,
        )

    def _record(self, info: ClusterInfo) -> None:
        # Atomic and durable, so `down` never reads half a file after a crash during `up`.
        data = (json.dumps(info.to_json(), indent=2) + "\n").encode()
        fsutil.atomic_write(self.state_dir / STATE_FILE, data)

    # --- up -----------------------------------------------------------------------------

    def up(self, nodes: int = 4, spares: int = 1, *, timeout_s: float = 30.0) -> ClusterInfo:
        """Start the cluster and return once every node is IDLE (spares IDLE+DRAIN).

        A no-op (``started=False``) when the same layout already runs healthy here; a cluster
        left half-running is stopped and started afresh. Raises SlurmNotInstalledError when a
        program is missing, UsageError when a different layout already runs, ClusterError
        (with the log's tail) when a daemon fails or nodes are not ready within ``timeout_s``
        seconds.
        """
        check_installed(self.install)
        if self.jwt and not restd.jwt_plugin_installed(self.install):
            raise SlurmNotInstalledError(
                f"Slurm's auth/jwt plugin is missing; {restd.JWT_INSTALL_HINT}"
            )
        if os.geteuid() != 0:
            raise ClusterError(
                "the local cluster must be started as root: munged runs as user munge and "
                "slurmd launches jobs as their owner"
            )
        names, spare_names = node_names(nodes, spares)
        check_socket_paths(self.state_dir, names + spare_names)
        current = self.info()
        if current is not None and all(procs.alive(p) for p in current.pids.values()):
            if (current.nodes, current.spares) != (names, spare_names):
                raise UsageError(
                    f"a cluster with nodes {', '.join(current.nodes + current.spares)} already "
                    f"runs in {self.state_dir}; run `recover cluster down` first"
                )
            running = install.of_conf(self.conf_path) or install.SYSTEM
            if running != self.install:
                raise UsageError(
                    f"the cluster in {self.state_dir} runs {running.describe()}, not "
                    f"{self.install.describe()}; run `recover cluster down` first"
                )
            if self.jwt and not self._jwt_enabled():
                raise UsageError(
                    f"the cluster in {self.state_dir} runs without JWT (needed by slurmrestd); "
                    "run `recover cluster down` first"
                )
            return current
        if current is not None:
            self.down()
        try:
            return self._start(names, spare_names, timeout_s)
        except BaseException:
            self.down()
            raise

    def _start(
        self, names: tuple[str, ...], spare_names: tuple[str, ...], timeout_s: float
    ) -> ClusterInfo:
        d = self.state_dir
        for sub in ("", "run", "log", "spool", "ctld-state"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for name in names + spare_names:
            (d / "spool" / f"slurmd.{name}").mkdir(exist_ok=True)
        # Readable by user munge and by job processes of other users; nothing secret here.
        os.chmod(d, 0o755)  # noqa: S103
        mpaths = munge.choose_home(d)
        munge.prepare(mpaths)
        env = self._daemon_env()
        ports = proc.free_ports(1 + len(names) + len(spare_names))
        layout = ClusterLayout(
            state_dir=d,
            hostname=socket.gethostname(),
            nodes=names,
            spares=spare_names,
            ctld_port=ports[0],
            node_ports=tuple(ports[1:]),
            munge_socket=mpaths.socket,
            slurmd_timeout_s=self.slurmd_timeout_s,
            cred_expire_s=self.cred_expire_s,
            jwt_key=restd.make_jwt_key(d) if self.jwt else None,
            install=self.install,
            expedite=self.expedite,
            epilog=self._write_epilog(),
        )
        self.conf_path.write_text(render_slurm_conf(layout))
        pids: dict[str, int] = {}
        info = ClusterInfo(d, self.conf_path, names, spare_names, pids, mpaths.home)
        # Record before each start, so a failure half-way still lets `down` find everything.
        self._record(info)
        pids["munged"] = munge.start(mpaths, env)
        self._record(info)
        # -c: clean start (no jobs or node states from an earlier run); -i: ignore old state.
        pids["slurmctld"] = procs.spawn(
            [self.install.program("slurmctld"), "-D", "-c", "-i"], env, d / "log" / "slurmctld.out"
        )
        self._record(info)
        for name in layout.all_nodes:
            pids[f"slurmd:{name}"] = self._spawn_slurmd(name, env)
        self._record(info)
        self._wait_ready(info, timeout_s)
        return info

    def _spawn_slurmd(self, name: str, env: dict[str, str]) -> int:
        return procs.spawn(
            [self.install.program("slurmd"), "-D", "-N", name],
            {**env, procs.NODE_ENV: name},
            self.state_dir / "log" / f"slurmd.{name}.out",
        )

    # --- slurmrestd ---------------------------------------------------------------------

    def _jwt_enabled(self) -> bool:
        try:
            return "AuthAltTypes=auth/jwt" in self.conf_path.read_text().splitlines()
        except FileNotFoundError:
            return False

    def start_rest(self, *, timeout_s: float = 15.0) -> RestEndpoint:
        """Start slurmrestd for the running cluster (see :mod:`slurm.restd`) and a JWT for
        root; a no-op returning the endpoint when it runs. It is stopped by :meth:`down`.

        Raises ClusterError when no cluster runs here, when it was started without ``jwt``,
        or (with the log's tail) when slurmrestd fails; SlurmNotInstalledError when
        slurmrestd is not installed.
        """
        info = self._running_info()
        current = self.rest_endpoint()
        if current is not None and all(procs.alive(info.pids.get(k, 0)) for k in restd.DAEMONS):
            return current
        if not self._jwt_enabled():
            raise ClusterError(
                f"the cluster in {self.state_dir} was started without JWT; slurmrestd needs it "
                "(`recover cluster down`, then `recover cluster up --rest`)"
            )
        pids = dict(info.pids)

        def record(key: str, pid: int) -> None:
            # At once, so that a failure of the second daemon still lets `down` stop the first.
            pids[key] = pid
            self._record(replace(info, pids=pids))

        endpoint = restd.launch(
            self.state_dir, info.conf_path, proc.free_ports(1)[0], record, self.install,
            env=self._env, timeout_s=timeout_s, clock=self._clock, sleep=self._sleep,
        )  # fmt: skip
        restd.save_endpoint(self.state_dir, endpoint)
        return endpoint

    def rest_endpoint(self) -> RestEndpoint | None:
        """The slurmrestd recorded by :meth:`start_rest`, or None."""
        return restd.load_endpoint(self.state_dir)

    # --- node faults (tests, demo) ------------------------------------------------------

    def crash_node(self, name: str, also: Iterable[int] = ()) -> list[int]:
        """SIGKILL ``name``'s slurmd and its job steps and job processes (and the processes in
        ``also``), and empty its node-local memory (the training's copies under the cluster
        environment's ``RECOVER_MEMORY_DIR`` or the default root), as a node losing power
        would; slurmctld
        notices after SlurmdTimeout. Returns the pids killed.

        Raises UsageError naming the cluster's nodes for an unknown one, ClusterError when no
        cluster runs here.
        """
        info = self._running_info()
        key = self._node_key(info, name)
        roots = [info.pids[key], *also]
        targets = procs.cluster_processes(str(self.state_dir), roots, node=name)
        # All of them stop first, then die: killed one by one, a slurmstepd that outlived its
        # job's processes by a moment reported their death to slurmctld (the job ended
        # FAILED, where a node losing power leaves it for Slurm to requeue once the node is
        # DOWN), as seen in a CI run.
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        procs.stop((), kill_now=targets, sleep=self._sleep, clock=self._clock)
        # A node that loses power loses its tmpfs: the memory tier's copies there are gone.
        forget_node(memory_root(self._env), node_key(name, str(self.conf_path)))
        return sorted(targets)

    def freeze_node(self, name: str, also: Iterable[int] = ()) -> list[int]:
        """SIGSTOP ``name``'s slurmd, its job steps and job processes, and the processes in
        ``also`` (its agent), as a node that hangs: nothing there runs, answers or exits,
        and its sockets stay open. slurmctld notices after SlurmdTimeout. The processes stay
        stopped until killed (:meth:`crash_node` with ``also``, as a power cycle does).
        Returns the pids stopped.

        Raises UsageError naming the cluster's nodes for an unknown one, ClusterError when no
        cluster runs here.
        """
        info = self._running_info()
        key = self._node_key(info, name)
        targets = procs.cluster_processes(str(self.state_dir), [info.pids[key], *also], node=name)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return sorted(targets)

    def restart_node(self, name: str) -> int:
        """Start ``name``'s slurmd again (after :meth:`crash_node`); a no-op returning the
        current pid when it runs. With ReturnToService=1 the node returns to service once its
        slurmd registers, unless someone set it DOWN or DRAIN on purpose."""
        info = self._running_info()
        key = self._node_key(info, name)
        if procs.alive(info.pids[key]):
            return info.pids[key]
        env = self._daemon_env()
        pids = dict(info.pids)
        pids[key] = self._spawn_slurmd(name, env)
        self._record(replace(info, pids=pids))
        return pids[key]

    def _write_epilog(self) -> Path | None:
        if self.epilog is None:
            return None
        path = self.state_dir / "epilog"
        path.write_text(render_epilog(self.install, self.epilog))
        os.chmod(path, 0o755)  # noqa: S103 - slurmd runs it
        return path

    def _daemon_env(self) -> dict[str, str]:
        # The install's programs first on PATH (slurmd runs its slurmstepd, jobs' srun), the
        # conf, and the marker `down` finds the cluster's processes by.
        env = {
            **self._env,
            "SLURM_CONF": str(self.conf_path),
            procs.MARKER_ENV: str(self.state_dir),
        }
        return install.command_env(self.install, env)

    def _running_info(self) -> ClusterInfo:
        info = self.info()
        if info is None:
            raise ClusterError(f"no cluster runs in {self.state_dir}; run `recover cluster up`")
        return info

    @staticmethod
    def _node_key(info: ClusterInfo, name: str) -> str:
        if name not in info.nodes + info.spares:
            raise unknown_choice("node", name, info.nodes + info.spares)
        return f"slurmd:{name}"

    def _wait_ready(self, info: ClusterInfo, timeout_s: float) -> None:
        ctl = CliSlurm(info.conf_path, timeout_s=5.0, env=self._env)
        deadline = self._clock() + timeout_s
        last = "slurmctld did not answer"
        while True:
            dead = [k for k, p in info.pids.items() if not procs.alive(p)]
            if dead:
                raise ClusterError(f"{', '.join(dead)} exited during start;\n{self._logs()}")
            try:
                nodes = {n.name: n for n in ctl.nodes()}
                pending = [
                    n
                    for n in info.nodes + info.spares
                    if n not in nodes or not _ready(nodes[n], spare=n in info.spares)
                ]
                if not pending:
                    return
                states = (f"{n}={describe_state(nodes.get(n))}" for n in pending)
                last = "not ready: " + ", ".join(states)
            except RecoverError as e:
                last = str(e)
            if self._clock() > deadline:
                raise ClusterError(
                    f"cluster not ready within {timeout_s:g} s ({last});\n{self._logs()}"
                )
            self._sleep(0.2)

    def _logs(self) -> str:
        out = []
        for log in sorted((self.state_dir / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-5:]
            out.append(f"--- {log}\n" + "\n".join(lines))
        return "\n".join(out)

    # --- down ---------------------------------------------------------------------------

    def down(self, *, grace_s: float = 6.0) -> list[str]:
        """Stop every process this cluster started (daemons, job steps, job processes), all
        at once; SIGKILL what is still there after ``grace_s`` seconds, and empty its nodes'
        memory-tier copies. Returns the names of recorded daemons that were running. A no-op
        on a cluster that is not running.
        """
        info = self.info()
        recorded = info.pids if info else {}
        was_running = sorted(k for k, p in recorded.items() if procs.alive(p))
        # Twice: a slurmd dying may leave a slurmstepd that forked after the first sweep.
        for _ in range(2):
            targets = procs.cluster_processes(str(self.state_dir), recorded.values())
            if not targets:
                break
            # Daemons and their helpers (slurmctld's slurmscriptd: killing it first makes
            # slurmctld hang on exit) get SIGTERM so they close sockets and save state; job
            # steps and job processes are killed outright, as a node losing power would.
            started = set(recorded.values())
            daemons = {p for p in targets if p in started or procs.parent_of(p) in started}
            procs.stop(
                daemons,
                kill_now=targets - daemons,
                grace_s=grace_s,
                sleep=self._sleep,
                clock=self._clock,
            )
        rest = self.rest_endpoint()
        if rest is not None:
            restd.remove(restd.RestPaths(rest.socket.parent.parent), self.state_dir)
            (self.state_dir / restd.REST_FILE).unlink()
        if info is not None:
            munge.remove(munge.MungePaths(info.munge_home), self.state_dir)
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
            # The simulated nodes' tmpfs goes with them: the memory tier's copies of this
            # cluster's jobs (only this cluster's: the key names its slurm.conf).
            root = memory_root(self._env)
            for node in (*info.nodes, *info.spares):
                forget_node(root, node_key(node, str(info.conf_path)))
        return was_running

    # --- status -------------------------------------------------------------------------

    def status(self) -> ClusterStatus:
        """Processes (recorded pid, alive or not) and, when slurmctld answers, its nodes."""
        info = self.info()
        if info is None:
            return ClusterStatus(self.state_dir, running=False)
        processes = {k: {"pid": p, "alive": procs.alive(p)} for k, p in info.pids.items()}
        running = all(v["alive"] for v in processes.values())
        nodes: tuple[NodeInfo, ...] = ()
        error = ""
        try:
            nodes = tuple(CliSlurm(info.conf_path, timeout_s=5.0, env=self._env).nodes())
        except RecoverError as e:
            error = str(e)
        return ClusterStatus(self.state_dir, running, info.conf_path, processes, nodes, error)


def conf_status(
    conf_path: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 5.0
) -> ClusterStatus:
    """Status of a cluster known only by its slurm.conf (one we did not start): its nodes
    and no processes; ``running`` is whether slurmctld answered within ``timeout_s`` s."""
    try:
        nodes = tuple(CliSlurm(conf_path, timeout_s=timeout_s, env=env).nodes())
    except RecoverError as e:
        return ClusterStatus(conf_path.parent, False, conf_path, error=str(e))
    return ClusterStatus(conf_path.parent, True, conf_path, nodes=nodes)


def _ready(node: NodeInfo, *, spare: bool) -> bool:
    if node.state != "IDLE" or "NOT_RESPONDING" in node.flags:
        return False
    return node.drained if spare else not node.flags
