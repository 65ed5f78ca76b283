"""Carrying out one scenario entry: a fault through its real path, or an operator action.

Catalogue faults go through ``POST /v1/inject`` with :func:`service.httpapi.client.inject`, the
function ``recover inject`` calls, so the node's agent reports them through its own pipeline
or its kernel-log parser. The special kinds act on the machine itself: a slurmd killed, a
checkpoint file damaged, the coordinator killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recovery.checkpoint.scan import committed_steps, step_path
from recovery.errors import RecoverError, UsageError
from scenarios.rig import Rig
from scenarios.schema import FAULT_NODE, JOB_NODE, Entry
from scenarios.watch import Watcher
from service.daemons import agents as agents_proc
from service.httpapi.client import inject

#: How long an operator's node check may take (its burn-in's budget is the policy's).
CHECK_TIMEOUT_S = 600.0

Say = Callable[[str], None]


@dataclass
class Done:
    """What an entry did: fault records for ``run.json``, notes, the node it hit, and for an
    operator action how it was answered."""

    faults: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    node: str | None = None
    answer: str | None = None
    """``accepted`` or ``refused`` for an operator action."""
    detail: str = ""


@dataclass(frozen=True)
class Crash:
    """The training process a fault killed before it was reported (see :func:`crash_first`)."""

    nodes: list[str]
    """Where the fault is injected and the training was killed (each node of a burst).
    Chosen before the kill: once the process died the job may have ended and run on no node."""
    at: float
    """Wall seconds of the SIGABRT."""
    note: str


def crash_first(
    entry: Entry, rig: Rig, watch: Watcher, fault_node: str | None, say: Say
) -> Crash | None:
    """For a fault that kills the training (``entry.kills_training``), SIGABRT the process on
    the fault's node (on each node of a ``burst``) now, the moment the trigger fired: the
    process dies first and the agent reports later, as on real hardware. None for any other
    entry. Raises as :func:`carry_out`.
    """
    if not entry.kills_training:
        return None
    if rig.local is None and entry.crash_training is None:
        return None  # an existing cluster: the report alone (carry_out says so)
    rig.need_local("crash_training")
    # job-node is where process 0 runs (the batch step's node); its own events say where,
    # without the Slurm query that takes seconds on a loaded machine.
    last = watch.last("step") if entry.where == JOB_NODE and entry.burst is None else None
    here = last.get("node") if last else None
    nodes = [here] if isinstance(here, str) else _targets(entry, watch, fault_node)
    at = time.time()
    # A burst: the fault hits every one of its nodes, and kills the training on each.
    notes = [_crash_training(watch, n, say) for n in nodes]
    return Crash(nodes, at, "; ".join(notes))


def carry_out(
    entry: Entry,
    rig: Rig,
    watch: Watcher,
    fault_node: str | None,
    say: Say,
    crash: Crash | None = None,
) -> Done:
    """Do ``entry`` now. ``fault_node`` is the node of the previous fault (for ``fault-node``);
    ``crash``: what :func:`crash_first` did for it (else a fault that kills the training
    kills it here).

    Raises UsageError when the entry cannot be done here (no node runs the job, a local-only
    fault on an existing cluster), RecoverError from the coordinator or Slurm.
    """
    if entry.operator is not None:
        return _operator(entry, rig, fault_node, say)
    if entry.fault == "coordinator-kill":
        return _kill_coordinator(entry, rig, say)
    if entry.fault in ("checkpoint-corrupt", "checkpoint-truncate"):
        return _damage_checkpoint(entry, watch.run_dir, say)
    if entry.fault == "slurmd-crash":
        return _crash_slurmd(rig, _targets(entry, watch, fault_node)[0], say)
    if entry.fault == "node-hang":
        return _hang_node(rig, _targets(entry, watch, fault_node)[0], say)
    if entry.fault == "agent-kill":
        return _kill_agent(rig, _targets(entry, watch, fault_node)[0], say)
    if entry.fault in ("main-thread-hang", "process-freeze"):
        return _hang_training(entry, rig, watch, _targets(entry, watch, fault_node)[0], say)
    if entry.fault == "cpu-throttle":
        return _throttle_training(entry, rig, watch, _targets(entry, watch, fault_node)[0], say)
    if crash is None:
        crash = crash_first(entry, rig, watch, fault_node, say)
    nodes = crash.nodes if crash is not None else _targets(entry, watch, fault_node)
    done = _inject(entry, str(entry.fault), rig, nodes, crash, say)
    if crash is None and entry.kills_training:  # an existing cluster: see crash_first
        say(f"{entry.fault} kills the training where it strikes; on an existing cluster the "
            "runner cannot, so only the report was injected")  # fmt: skip
        done.notes.append(f"{entry.fault}: the training was not killed (existing cluster); "
                          "the real fault would kill it")  # fmt: skip
    return done


def _targets(entry: Entry, watch: Watcher, fault_node: str | None) -> list[str]:
    where = entry.where
    if where == FAULT_NODE:
        if fault_node is None:
            raise UsageError(f"{entry.label}: fault-node, but no fault hit a node before it")
        return [fault_node]
    if where != JOB_NODE:
        return [str(where)]
    running = watch.running_nodes()
    if not running:
        state = watch.job.state if watch.job else "unknown"
        raise UsageError(f"{entry.label} on job-node: the job runs on no node now ({state})")
    count = entry.burst or 1
    if count > len(running):
        raise UsageError(f"burst of {count}: the job runs on {len(running)} node(s) only")
    return list(running[:count])


def _inject(
    entry: Entry, fault: str, rig: Rig, nodes: list[str], crash: Crash | None, say: Say
) -> Done:
    done = Done(node=nodes[0])
    killed_at = crash.at if crash is not None and crash.nodes == nodes else None
    if crash is not None:
        done.notes.append(f"{fault}: {crash.note}")
    count = entry.repeat.count if entry.repeat else 1
    every = entry.repeat.every_s if entry.repeat else 0.0
    for i in range(count):
        gpu = entry.gpu
        if entry.repeat and entry.repeat.across_gpus:
            gpu = ((entry.gpu or 0) + i) % 8
        replies = _inject_on(rig, nodes, fault, gpu, entry.path)
        for node, at, reply in replies:
            record = {"fault": fault, "node": node, "via": entry.path, "at": at,
                      "gpu": gpu, "event_id": reply.get("event_id")}  # fmt: skip
            if killed_at is not None and i == 0:
                # The fault happened when the process died; the report measures from there.
                record.update(at=killed_at, injected_at=at, killed="training process")
            done.faults.append(record)
        if i == 0 or i == count - 1:
            more = f" ({i + 1} of {count})" if count > 1 else ""
            say(f"injected {fault} on {', '.join(nodes)} via {entry.path}{more}")
        if i < count - 1:
            time.sleep(every)  # the scenario's own pacing of repeats, not a wait on anything
    return done


def _crash_training(watch: Watcher, node: str, say: Say) -> str:
    """What a GPU falling off the bus does to the job (DESIGN.md's failure model): the driver
    kills the CUDA work on that node, so the training process there dies at once with
    SIGABRT (abnormal exit, nothing saved). slurmd, the batch shell and the job's processes on
    the other nodes are left alone: those stop by themselves when their peer is lost, srun's
    step ends with the dead process's status and the job ends FAILED; the coordinator's
    requeue of a job a fault ended (or Slurm's own, for a node it lost) brings it back."""
    pid = watch.training_pid_on(node)
    if pid is None:
        return f"no training process was running on {node} to crash"
    os.kill(pid, signal.SIGABRT)
    say(f"training process {pid} on {node} SIGABRTed: its GPU is gone")
    return f"training process {pid} on {node} SIGABRTed with the fault (no save)"


def _inject_on(
    rig: Rig, nodes: list[str], fault: str, gpu: int | None, via: str
) -> list[tuple[str, float, dict[str, Any]]]:
    """Inject on every node at once (one thread each); ``(node, wall time, reply)`` each."""
    results: dict[str, tuple[float, dict[str, Any]]] = {}
    errors: list[BaseException] = []

    def one(node: str) -> None:
        at = time.time()
        try:
            results[node] = (at, inject(rig.client, fault=fault, node=node, gpu=gpu, via=via))
        except RecoverError as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [(n, *results[n]) for n in nodes]


def _crash_slurmd(rig: Rig, node: str, say: Say) -> Done:
    local = rig.need_local("slurmd-crash")
    at = time.time()
    killed = local.cluster.crash_node(node)
    say(f"slurmd of {node} and its job processes SIGKILLed ({len(killed)} process(es))")
    return Done(
        faults=[{"fault": "slurmd-crash", "node": node, "via": "slurmd-kill", "at": at}],
        node=node,
    )


#: How long a hung node stays hung once it is out of service, before it is power-cycled (its
#: processes die). Slurm finishes the requeued job's end only once its requests to the node
#: time out or the node is gone, so this bounds the scenario's requeue too.
POWER_CYCLE_AFTER_S = 8.0
#: A hung node is power-cycled at the latest this long after it hung, out or not.
HANG_AT_MOST_S = 300.0


def _hang_node(rig: Rig, node: str, say: Say) -> Done:
    """A node that hangs (a kernel hang, a wedged PCIe switch): everything on it stops at
    once, slurmd, the job's processes there and its agent, without exiting or closing a
    socket. The job's processes elsewhere block until something ends them; Slurm marks the
    node DOWN after SlurmdTimeout and requeues the job. The hung training process still holds
    the run lock, as it would on shared storage until the node is power-cycled: here it is,
    :data:`POWER_CYCLE_AFTER_S` after the node went out of service (a thread of the runner)."""
    local = rig.need_local("node-hang")
    agent = agents_proc.running(local.coordinator_dir).get(node)
    also = [agent] if agent is not None else []
    at = time.time()
    frozen = local.cluster.freeze_node(node, also)
    say(f"{node} hangs: {len(frozen)} process(es) stopped (slurmd, the job's processes, its agent)")
    cycle = threading.Thread(
        target=_power_cycle_when_out, args=(rig, node, also, say), daemon=True,
        name=f"power-cycle-{node}",
    )  # fmt: skip
    cycle.start()
    return Done(
        faults=[{"fault": "node-hang", "node": node, "via": "sigstop", "at": at}],
        node=node,
        notes=[f"node-hang: {len(frozen)} process(es) of {node} stopped"],
    )


def _kill_agent(rig: Rig, node: str, say: Say) -> Done:
    """A node whose agent died (killed by the OOM killer, a crash, an upgrade gone wrong):
    the node itself goes on, idle or serving, and nothing reports it; its next fault would go
    unseen. Only the coordinator's silence rule and a node check notice."""
    local = rig.need_local("agent-kill")
    pid = agents_proc.running(local.coordinator_dir).get(node)
    if pid is None:
        raise UsageError(f"agent-kill: no agent runs for {node}")
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    say(f"{node}'s agent (pid {pid}) killed; the node itself runs on")
    return Done(
        faults=[{"fault": "agent-kill", "node": node, "via": "sigkill", "at": at}],
        node=node,
        notes=[f"agent-kill: {node}'s agent (pid {pid}) killed"],
    )


def _power_cycle_when_out(rig: Rig, node: str, also: list[int], say: Say) -> None:
    local = rig.need_local("node-hang")
    start = time.monotonic()
    out_at: float | None = None
    while time.monotonic() - start < HANG_AT_MOST_S:
        now = time.monotonic()
        if out_at is not None and now - out_at >= POWER_CYCLE_AFTER_S:
            break
        try:
            if out_at is None and rig.slurm.node(node).out_of_service:
                out_at = now
        except RecoverError:
            pass  # slurmctld busy or restarting: ask again
        time.sleep(0.5)
    try:
        killed = local.cluster.crash_node(node, also)
    except RecoverError as e:  # the cluster is going down already
        say(f"power cycle of {node} not done: {e}")
        return
    say(f"{node} power-cycled: its {len(killed)} hung process(es) are gone")


#: Seconds gdb may take to attach and start the call that blocks the main thread.
GDB_ATTACH_S = 30.0


def _hang_training(entry: Entry, rig: Rig, watch: Watcher, node: str, say: Say) -> Done:
    """A training process that stops making progress without exiting (DESIGN.md): its main
    thread blocked in a system call while its other threads live (``main-thread-hang``), or
    the whole process stopped (``process-freeze``). Nothing exits and no socket closes: the
    job's other processes wait in their collective; only the job's own progress tells."""
    rig.need_local(str(entry.fault))
    pid = watch.training_pid_on(node)
    if pid is None:
        raise UsageError(f"{entry.label}: no training process runs on {node}")
    at = time.time()
    if entry.fault == "process-freeze":
        os.kill(pid, signal.SIGSTOP)
        say(f"training process {pid} on {node} frozen (SIGSTOP)")
        via = "sigstop"
    else:
        _block_main_thread(pid)
        say(f"training process {pid} on {node}: main thread blocked in sleep(600) by gdb")
        via = "gdb"
    return Done(
        faults=[{"fault": entry.fault, "node": node, "via": via, "at": at, "pid": pid}],
        node=node,
        notes=[f"{entry.fault}: training process {pid} on {node} ({via})"],
    )


def _block_main_thread(pid: int) -> None:
    """``gdb -p PID -batch -ex "call (int)sleep(600)"``, left running until the main thread
    is in the call, then ended: the call goes on without it (REFERENCE.md). The process is
    stopped only while gdb attaches (a fraction of a second: only libc's symbols are read)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        raise UsageError("main-thread-hang needs gdb (apt-get install -y gdb)")
    # Only libc's symbols (sleep's): a full attach reads every library's (JAX's are large) with
    # the whole process stopped, for seconds under load - a freeze, not the hang wanted here.
    quick = ["-nx", "-iex", "set auto-load off", "-iex", "set auto-solib-add off",
             "-ex", "sharedlibrary libc"]  # fmt: skip
    # A blocking system call (a read on a stuck filesystem) runs with the GIL released, so
    # the process's other threads, its liveness thread among them, run on. Interrupted in
    # Python code instead, the injected call would hold the GIL and stop every thread: a
    # freeze, not this hang (seen under load: the agents then saw rank-frozen). So attach
    # while the main thread waits in Python's own sleep, which released the GIL.
    _wait_for_released_gil(pid)
    proc = subprocess.Popen(
        [gdb, "-p", str(pid), "-batch", *quick, "-ex", "call (int)sleep(600)"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + GDB_ATTACH_S
    try:
        while not _sleeping(pid):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RecoverError(f"gdb could not block process {pid}: {err.strip()[-500:]}")
            if time.monotonic() > deadline:
                raise RecoverError(f"gdb did not block process {pid} within {GDB_ATTACH_S:g} s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


#: The cgroup v1 CPU controller (REFERENCE.md: writable as root on these machines).
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
#: CFS period (microseconds) of a throttle; the quota is a share of it.
CFS_PERIOD_US = 100_000
#: Throttles made by this process, removed by :func:`release_throttles`.
_THROTTLES: list[Path] = []


def _throttle_training(entry: Entry, rig: Rig, watch: Watcher, node: str, say: Say) -> Done:
    """A node slowed for real (fail-slow): its training process, every thread of it, moved
    into a cgroup v1 CPU group with a quota of ``entry.cpu_percent`` of one CPU (a thermally
    throttled chip, a noisy neighbour). Nothing fails; the process does its share of each step
    slower, and every step of the job waits for it."""
    rig.need_local(str(entry.fault))
    percent = entry.cpu_percent
    assert percent is not None  # the schema requires it for cpu-throttle
    pid = watch.training_pid_on(node)
    if pid is None:
        raise UsageError(f"{entry.label}: no training process runs on {node}")
    if not (CPU_CGROUP / "cgroup.procs").exists():
        raise UsageError(f"{entry.fault} needs the cgroup v1 CPU controller at {CPU_CGROUP}")
    group = CPU_CGROUP / f"recover-throttle-{os.getpid()}-{pid}"
    group.mkdir(exist_ok=True)
    _THROTTLES.append(group)
    (group / "cpu.cfs_period_us").write_text(f"{CFS_PERIOD_US}\n")
    (group / "cpu.cfs_quota_us").write_text(f"{CFS_PERIOD_US * percent // 100}\n")
    at = time.time()
    (group / "cgroup.procs").write_text(f"{pid}\n")  # every thread of the process
    share = f"{percent} % of a CPU"
    say(f"training process {pid} on {node} throttled to {share} ({group})")
    fault = {"fault": entry.fault, "node": node, "via": "cgroup-cpu-quota", "at": at, "pid": pid}
    return Done(
        faults=[{**fault, "cpu_percent": percent}],
        node=node,
        notes=[f"{entry.fault}: training process {pid} on {node} held to {share}"],
    )


def release_throttles() -> list[str]:
    """Remove the CPU groups this process made (their processes moved back first, if any
    still run); what could not be removed, with why."""
    left = []
    while _THROTTLES:
        group = _THROTTLES.pop()
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                (CPU_CGROUP / "cgroup.procs").write_text(f"{pid}\n")
            group.rmdir()
        except FileNotFoundError:
            continue
        except OSError as e:
            left.append(f"{group}: {e}")
    return left


#: Seconds to wait for the main thread to be in a call that released the GIL.
GIL_FREE_WAIT_S = 10.0


def _wait_for_released_gil(pid: int) -> None:
    """Until the main thread of ``pid`` is in Python's ``time.sleep`` (clock_nanosleep on
    CLOCK_MONOTONIC, absolute: x86-64 syscall 230 with 1, 1), at most
    :data:`GIL_FREE_WAIT_S`; a loop with no sleep between its steps is attached as it is."""
    deadline = time.monotonic() + GIL_FREE_WAIT_S
    while time.monotonic() < deadline:
        try:
            call = Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()
        except OSError:
            return
        if call[:3] == ["230", "0x1", "0x1"]:
            return
        time.sleep(0.002)


def _sleeping(pid: int) -> bool:
    """The main thread waits in libc's sleep(): clock_nanosleep (x86-64 syscall 230) on
    CLOCK_REALTIME, relative (Python's own time.sleep uses CLOCK_MONOTONIC, absolute)."""
    try:
        call = Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return call[:3] == ["230", "0x0", "0x0"] or call[:1] == ["35"]


def _damage_checkpoint(entry: Entry, run_dir: Path, say: Say) -> Done:
    root = run_dir / "checkpoints"
    steps = committed_steps(root)
    if not steps:
        raise UsageError(f"{entry.fault}: the job has no checkpoint yet in {root}")
    step = steps[-1]
    files = sorted(step_path(root, step).glob("D*.bin"), key=lambda p: (-p.stat().st_size, p))
    if not files:
        raise UsageError(f"{entry.fault}: checkpoint step {step} has no data file")
    target = files[0]
    size = target.stat().st_size
    at = time.time()
    if entry.fault == "checkpoint-corrupt":
        with target.open("r+b") as f:  # one flipped byte: a bad disk, a torn copy
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        what = f"flipped byte {size // 2} of {target.name}"
    else:
        os.truncate(target, size // 2)
        what = f"truncated {target.name} from {size} to {size // 2} bytes"
    say(f"checkpoint step {step}: {what}")
    record = {"fault": entry.fault, "node": "", "via": "file", "at": at, "step": step}
    return Done(faults=[record], notes=[f"{entry.fault}: step {step}, {what}"])


def _kill_coordinator(entry: Entry, rig: Rig, say: Say) -> Done:
    local = rig.need_local("coordinator-kill")
    at = time.time()
    pid = local.kill_coordinator()
    say(f"coordinator {pid} SIGKILLed")
    done = Done(faults=[{"fault": "coordinator-kill", "node": "", "via": "sigkill", "at": at}])
    if entry.restart is not False:
        # The same address, so agents (and this runner) find it again without being told.
        listen = rig.client.url.removeprefix("http://")
        ep = local.start_coordinator(listen=listen)
        say(f"coordinator restarted at {ep.url} ({time.time() - at:.1f} s after the kill)")
        done.notes.append(f"coordinator killed, restarted {time.time() - at:.1f} s later")
    return done


def _operator(entry: Entry, rig: Rig, fault_node: str | None, say: Say) -> Done:
    at = time.time()
    if entry.operator == "breaker-reset":
        doc = rig.client.post("/v1/breaker/reset")
        detail = f"released {len(doc['released'])} held action(s), expired {len(doc['expired'])}"
        say(f"operator: breaker reset: {detail}")
        return Done(notes=[f"operator breaker-reset at {at:.3f}: {detail}"], answer="accepted",
                    detail=detail)  # fmt: skip
    node = fault_node if entry.where == FAULT_NODE else str(entry.where)
    if node is None:
        raise UsageError(f"{entry.label}: fault-node, but no fault hit a node before it")
    if entry.operator == "check":
        return _check_node(rig, node, at, say)
    try:
        doc = rig.client.post(f"/v1/nodes/{node}/repaired")
    except UsageError as e:
        say(f"operator: {node} repaired -> refused: {e}")
        return Done(notes=[f"operator repaired {node} at {at:.3f}: refused: {e}"], node=node,
                    answer="refused", detail=str(e))  # fmt: skip
    say(f"operator: {node} repaired -> {doc['result']}")
    return Done(notes=[f"operator repaired {node} at {at:.3f}: {doc['result']}"], node=node,
                answer="accepted", detail=str(doc["result"]))  # fmt: skip


def _check_node(rig: Rig, node: str, at: float, say: Say) -> Done:
    """``recover node check NODE``: accepted when the node passes."""
    client = replace(rig.client, timeout_s=CHECK_TIMEOUT_S)
    doc = client.post(f"/v1/nodes/{node}/check", {})
    answer = "accepted" if doc.get("passed") else "refused"
    detail = f"{doc['verdict']} in {doc['took_s']:.1f} s"
    say(f"operator: {node} checked -> {detail}")
    return Done(notes=[f"operator check {node} at {at:.3f}: {detail}"], node=node,
                answer=answer, detail=detail)  # fmt: skip
