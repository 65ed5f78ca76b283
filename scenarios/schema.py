"""The scenario file: what a YAML fault scenario may say, as pydantic models.

A scenario is one training job on a test cluster, a list of things done to it in order (faults
and operator actions), and what must be true at the end. Every key is optional unless marked
*required*; an unknown key is an error that names it and lists the valid ones, and an error
names the file, the line and the field path (``faults[1].via``). Example::

    description: XID 79 on a job node; a spare replaces it
    cluster: {nodes: 4, spares: 1}
    job: {model: mlp-tiny, steps: 24, save_every: 4, step_sleep: 0.25}
    faults:
      - fault: xid79
        node: job-node
        via: kmsg
        when: {checkpoint: 8}
    expect:
      max_steps_recomputed: 4
      verdicts: [replace]
      phases: {detection: 5, replacement: 30}

Top level
    ``name``: text (letters, digits, ``-``), default the file's name without ``.yaml``.
    ``description``: one line (``recover scenario list`` shows it).
    ``timeout_s``: seconds the run may take from the job's first step before it fails (default
    300); before the first step the run has 300 s, or ``timeout_s`` if longer.

``cluster`` - where it runs
    ``nodes`` (default 4, 1-16) compute nodes ``node1..``; ``spares`` (default 1, 0-8) spares
    ``spare1..`` held drained in the pool; ``slurmd_timeout_s`` (default 6): seconds before a
    silent slurmd's node goes DOWN; ``cred_expire_s`` (default 10, at least 5: Slurm ignores
    less): a requeued job waits this long + 1 s before it may start again; ``policy``: the
    coordinator's policy file as a mapping (see :mod:`recovery.policy.config`; checked here).
    The runner starts this local cluster, its coordinator and one agent per node, and stops
    them afterwards. ``existing: {slurm_conf, coordinator, token_file, partition}`` runs on a
    cluster that is already up instead (each default from ``$SLURM_CONF``,
    ``$RECOVER_COORDINATOR``, ``$RECOVER_TOKEN_FILE``; partition: every partition); its agents
    must run the ``inject`` source. ``slurmd-crash``, ``node-hang``, ``coordinator-kill``,
    ``main-thread-hang``, ``process-freeze``, ``cpu-throttle`` and ``crash_training`` need the
    local cluster.

``job`` - the training job, *required*
    ``steps`` *required* (final step), ``save_every`` *required* (checkpoint interval in
    steps), ``model`` (default ``mlp-tiny``; a ``recover train --model`` preset), ``seed``
    (default 0), ``step_sleep`` (seconds after each step, default 0.2), ``nodes``: how many
    nodes the job asks for, default ``all`` = every in-service node of the partition, so once
    a node is lost the job can only run again when a spare is promoted. ``processes``: how
    many training processes, one per node on the job's first nodes (``recover sbatch -N K``,
    joined by ``jax.distributed``); default ``per-node``, one on every node of the job; ``1``
    runs a single process on the first node. More than the job's nodes is refused, naming
    what fits, and so is a model whose batch does not divide over the processes.
    ``command``: a list
    of arguments run instead of ``recover train`` (a training script of your own using
    ``recovery.api``), with ``{python}``, ``{run_dir}``, ``{steps}``, ``{save_every}``,
    ``{seed}``, ``{step_sleep}`` and ``{scenario_dir}`` (the scenario file's folder) filled
    in; its control run is the same command run once without interruption. ``mode``: how
    the job comes back from a lost node: ``requeue`` (default: the job fails, the
    coordinator requeues it, a pool spare replaces the node) or ``in-allocation`` (the job
    holds ``spares`` more nodes, default 1, and its supervisor relaunches the training on
    one of them at once, restoring from the survivors' memory; ``recover sbatch --spares``,
    docs/in-allocation.md). ``recover scenario run --mode`` runs any scenario in either mode.
    ``long_phases``: phases the training legitimately spends long in, made to happen (the
    ``recover train`` options of the same names; not with ``command``): ``save_delay``
    (seconds process 0 adds to each periodic save, inside its ``save`` phase, as slow storage
    does, while the other processes wait at the next step), ``eval_every`` and
    ``eval_seconds`` (process 0 evaluates the held-out loss after every N steps in an
    ``evaluation`` phase lasting that long, the others waiting), ``pause_at`` and
    ``pause_seconds`` (every process ``paused`` after that step), ``first_step_delay``
    (each process's first step takes that much longer, unannounced: a lazy compile). The
    control run goes without them (they change no digest, nor the control's cache key). With
    ``faults: []`` and ``expect: {incidents: 0}`` a scenario is a *guard*: the hang watcher
    must sit through the long phase without an incident.

``faults`` - *required*, carried out in order; each entry is a fault or an operator action;
    ``[]``: nothing is done to the job (a guard scenario, above)
    ``fault``: a fault code of the catalogue (``xid79``, ``gpu-lost``, ``tpu-runtime-error``,
    ...; ``recovery/policy/catalogue.yaml`` lists them, and an unknown one is answered with
    the list) or a special kind:

    - ``slurmd-crash``: SIGKILL the node's slurmd and its job processes (a node losing power);
      no agent reports anything, Slurm marks the node DOWN after ``slurmd_timeout_s``;
    - ``node-hang``: SIGSTOP the node's slurmd, its job processes and its agent (a node that
      hangs: nothing exits, no socket closes, the job's other processes block); Slurm marks
      it DOWN after ``slurmd_timeout_s``; 8 s after it is out of service it is power-cycled
      (its processes killed), until then its training process holds the run lock;
    - ``agent-kill``: SIGKILL the node's agent (OOM-killed, crashed): the node runs on,
      idle or serving, and nothing reports its next fault; the coordinator's silence rule
      and a node check see it;
    - ``checkpoint-corrupt``: flip one byte of the largest data file of the job's newest
      checkpoint; ``checkpoint-truncate``: cut that file to half its size;
    - ``coordinator-kill``: SIGKILL the coordinator and (``restart``, default true) start it
      again on the same address;
    - ``main-thread-hang``: the training process on the node has its main thread blocked in
      a system call (``gdb -p PID -batch -ex "call (int)sleep(600)"``: a stuck filesystem, a
      data loader), its other threads, sockets and heartbeats alive; nothing exits;
    - ``process-freeze``: SIGSTOP the training process on the node (frozen whole, as by the
      freezer cgroup or a stuck driver call); nothing exits, no socket closes;
    - ``cpu-throttle``: hold the training process on the node, every thread of it, to
      ``cpu_percent`` % of a CPU (*required*, 1-99) with a cgroup v1 CPU quota (a slow node:
      a throttled chip, a noisy neighbour); nothing fails, every step waits for it. The
      group is removed when the run ends.

    ``operator``: ``repaired`` (``recover node repaired NODE``), ``breaker-reset``
    (``recover breaker reset``) or ``check`` (``recover node check NODE``: accepted when it
    passes); ``expect: accepted|refused`` says how it must be answered.

    ``node`` (where): ``job-node`` (default for faults: the node running the job's batch step,
    so its training process), ``fault-node`` (the node of the previous fault; default for
    ``repaired`` and ``check``) or a node's name. ``burst: N``: the same fault on N distinct job
    nodes at once (job-node first). ``via``: ``agent`` (default: the agent's event pipeline) or
    ``kmsg`` (an ``NVRM: Xid`` line in the node's kernel log, parsed by the agent; XIDs and
    ``gpu-lost`` only); both go through ``POST /v1/inject``, the path of ``recover inject``.
    ``gpu`` (0-7). ``repeat: {count, every_s, across_gpus}``: inject it ``count`` times,
    ``every_s`` seconds apart, on GPU 0, 1, ... when ``across_gpus`` (else the agent folds the
    repeats). ``crash_training``: just before the fault, SIGABRT the training process on the
    faulted node, as the driver kills CUDA work when a GPU falls off the bus: it exits
    abnormally (134) without saving, while slurmd, the batch shell and the job's other processes
    are left alone (they stop by themselves when their peer is lost, and the job ends FAILED for
    the coordinator to requeue); default true for faults the catalogue says kill the work they
    hit (``kills_work``: ``xid79``, ``gpu-lost``, ``xid94``, ``xid95``, ...), false otherwise
    (the job saves on its way out). On each node of a ``burst``.
    Only ``slurmd-crash`` and ``node-hang`` stop a whole node.

    ``when`` (default ``{after_s: 0}``), exactly one of: ``step: N`` (the job finished step
    N), ``checkpoint: N`` (a checkpoint of step N or later is durable), ``after_s: S`` (S
    seconds after the previous entry; the first entry counts from the job's first step),
    ``job: requeued`` (the job was requeued and its next run's training has not started:
    back in the queue, or on 25.11 given nodes again within a second) or
    ``job: restarted`` (training started again), ``incidents: opened|acted|closed|held`` (an
    incident opened since the previous entry; one of those took its first Slurm action; one
    opened after the latest fault and all are closed; one is held by the breaker).
    ``delay_s`` waits that much longer.

``expect`` - checked at the end; a failed one names itself and by how much
    ``completes`` (default true): the job completed; ``digest_matches_control`` (default
    true): its final state digest equals an uninterrupted run's (computed once per training
    configuration and cached); ``max_steps_recomputed: K``; ``min_fallbacks: N`` (damaged
    checkpoints skipped on restore); ``incidents: N`` (opened); ``verdicts: [...]`` (of the
    incidents, in order opened); ``incident_phases: [...]`` (journal phases some incident
    reached, e.g. ``no-spare``, ``jobs-saved``); ``held: N`` (incidents the breaker held);
    ``out_of_service: [nodes]`` (out of service at the end, not back in the pool);
    ``in_service: [nodes]`` (in service at the end: kept, or returned and promoted);
    ``max_requeues: N`` (times Slurm requeued the job); ``phases: {name: seconds}``: budgets
    for the report's phases of every incident
    (``detection``, ``diagnose``, ``stall``, ``take_out``, ``requeue_wait``, ``replacement``,
    ``job_restart``, ``restore``, ``warmup``, ``recompute``, ``no_progress``).

``expect_in_allocation`` - the expectations that differ when the job runs in-allocation
    (the keys of ``expect``; those given replace ``expect``'s, the rest are kept).
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from recovery.errors import UsageError, unknown_choice
from recovery.model import Verdict
from recovery.ports.journal import PhaseName
from recovery.report.phases import ReportPhase
from recovery.train.options import LongPhases, flag

#: Things a scenario can do besides injecting a catalogue fault through an agent.
SPECIAL_FAULTS: dict[str, str] = {
    "slurmd-crash": "SIGKILL the node's slurmd and its job processes; no agent event",
    "node-hang": "SIGSTOP the node's slurmd, job processes and agent; power-cycled once out",
    "agent-kill": "SIGKILL the node's agent; the node runs on, nothing reports it",
    "checkpoint-corrupt": "flip one byte in the newest checkpoint's largest data file",
    "checkpoint-truncate": "cut the newest checkpoint's largest data file to half",
    "coordinator-kill": "SIGKILL the coordinator, then start it again on the same address",
    "main-thread-hang": "block the training process's main thread in sleep(600) with gdb; "
    "its other threads run on",
    "process-freeze": "SIGSTOP the training process on the node (frozen whole)",
    "cpu-throttle": "hold the training process on the node to cpu_percent % of a CPU "
    "(cgroup v1 CPU quota): a slow node",
}
JOB_NODE = "job-node"
FAULT_NODE = "fault-node"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@functools.cache
def catalogue_faults() -> tuple[str, ...]:
    """The fault codes the coordinator accepts for injection (the packaged catalogue's)."""
    from recovery.policy import load_catalogue

    return tuple(load_catalogue().known())


@functools.cache
def kills_work(fault: str) -> bool:
    """True for a catalogue fault that kills the accelerator work it hits (xid79, xid95)."""
    from recovery.policy import load_catalogue

    spec = load_catalogue().lookup(fault)
    return spec is not None and spec.kills_work


def _one_line(value: object) -> object:
    if isinstance(value, str) and ("\n" in value.strip()):
        raise ValueError("expected one line of text")
    return value.strip() if isinstance(value, str) else value


def _nodes_wanted(value: object) -> object:
    if value == "all" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"expected 'all' or a whole number >= 1, got {value!r}")


#: ``job.processes``: one training process on every node of the job.
PER_NODE = "per-node"


def _processes_wanted(value: object) -> object:
    if value == PER_NODE or (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 16
    ):
        return value
    raise ValueError(f"expected '{PER_NODE}' or a whole number 1-16, got {value!r}")


OneLine = Annotated[str, BeforeValidator(_one_line)]
NodesWanted = Annotated[int | str, BeforeValidator(_nodes_wanted)]
ProcessesWanted = Annotated[int | str, BeforeValidator(_processes_wanted)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExistingCluster(_Strict):
    """A cluster that is already up: its slurm.conf, its coordinator and the admin token."""

    slurm_conf: str | None = None
    """Path of slurm.conf; default ``$SLURM_CONF``."""
    coordinator: str | None = None
    """The coordinator's URL; default ``$RECOVER_COORDINATOR``."""
    token_file: str | None = None
    """Tokens file with the admin token; default ``$RECOVER_TOKEN_FILE``."""
    partition: str | None = None
    """Partition whose in-service nodes the job asks for; default every partition."""


class ClusterSpec(_Strict):
    """The local cluster to start (or ``existing``: one that runs already)."""

    nodes: Annotated[int, Field(ge=1, le=16)] = 4
    spares: Annotated[int, Field(ge=0, le=8)] = 1
    slurmd_timeout_s: Annotated[int, Field(ge=2, le=300)] = 6
    cred_expire_s: Annotated[int, Field(ge=5, le=300)] = 10
    policy: dict[str, Any] | None = None
    existing: ExistingCluster | None = None

    @field_validator("policy")
    @classmethod
    def _policy_loads(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_policy(value)
        return value


def check_policy(policy: dict[str, Any]) -> None:
    """Raise ValueError with the policy loader's message when ``policy`` is not a valid
    policy file (it is read exactly as the coordinator will read it)."""
    from recovery.policy import load_policy_config

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        try:
            load_policy_config(path)
        except UsageError as e:
            raise ValueError(str(e).replace(f"{path}: ", "").replace(str(path), "policy")) from e


#: How the job comes back from a lost node (``job.mode``, ``recover scenario run --mode``).
MODES = ("requeue", "in-allocation")
RecoveryMode = Literal["requeue", "in-allocation"]


def _in_job(name: str) -> str:
    """A field of ``job.long_phases`` (or ``steps``) as the file names it."""
    return name if name == "steps" else f"long_phases.{name}"


class LongPhasesSpec(_Strict):
    """``job.long_phases``: phases the job's training legitimately spends long in, made to
    happen (the ``recover train`` options of the same names, :class:`LongPhases`). The
    control run goes without them: they do not change the digest."""

    save_delay: Annotated[float, Field(ge=0, le=600)] = 0.0
    """Seconds process 0 adds to each periodic save, in its ``save`` phase (slow storage)."""
    eval_every: Annotated[int, Field(ge=0)] = 0
    """Process 0 evaluates after every this many steps, in an ``evaluation`` phase."""
    eval_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """Seconds each evaluation lasts."""
    pause_at: Annotated[int, Field(ge=0)] = 0
    """Every process is ``paused`` after this step ..."""
    pause_seconds: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """... for this many seconds."""
    first_step_delay: Annotated[float, Field(ge=0, le=600)] = 0.0
    """Seconds each process's first step takes longer, unannounced (a lazy compile)."""

    def options(self) -> LongPhases:
        """As the trainer's options."""
        return LongPhases(**self.model_dump())

    def train_args(self) -> list[str]:
        """As ``recover train`` options: the ones given."""
        return [f"{flag(name)}={value:g}" for name, value in self.model_dump().items() if value]


class JobSpec(_Strict):
    """The training job (``recover train`` under ``recover sbatch``)."""

    steps: Annotated[int, Field(ge=1, le=100_000)]
    save_every: Annotated[int, Field(ge=1)]
    model: str = "mlp-tiny"
    command: list[str] | None = None
    """Your own training command instead of ``recover train`` (``model`` is then unused);
    placeholders such as ``{run_dir}`` are filled in (:mod:`scenarios.command_job`)."""
    seed: Annotated[int, Field(ge=0)] = 0
    step_sleep: Annotated[float, Field(ge=0, le=10)] = 0.2
    nodes: NodesWanted = "all"
    """Nodes the training runs on (``all``: every node in service, less the job's spares)."""
    processes: ProcessesWanted = PER_NODE
    mode: RecoveryMode = "requeue"
    """``requeue``: a lost node fails the job, the coordinator requeues it. ``in-allocation``:
    the job holds ``spares`` more nodes (``recover sbatch --spares``) and its supervisor
    relaunches the training on one of them, restoring from the survivors' memory."""
    spares: Annotated[int, Field(ge=0, le=8)] | None = None
    """Spare nodes inside the job (in-allocation only; default 1)."""
    long_phases: LongPhasesSpec | None = None
    """Long phases the training goes through on purpose (guard scenarios)."""

    @model_validator(mode="after")
    def _long_phases_fit(self) -> JobSpec:
        if self.long_phases is None:
            return self
        if self.command is not None:
            raise ValueError(
                "long_phases are recover train options; a command job makes its own phases"
            )
        try:
            self.long_phases.options().check(self.steps, named=_in_job)
        except UsageError as e:
            raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _spares_for_mode(self) -> JobSpec:
        if self.mode == "requeue" and self.spares:
            raise ValueError(
                f"spares {self.spares} needs mode in-allocation (a requeued job holds no spares)"
            )
        if self.mode == "in-allocation" and self.spares == 0:
            raise ValueError("mode in-allocation needs spares >= 1 (spares 0 is the requeue mode)")
        return self

    @property
    def job_spares(self) -> int:
        """Spare nodes the job holds: 0 in requeue mode, ``spares`` (1) in-allocation."""
        return 0 if self.mode == "requeue" else (self.spares or 1)

    def process_count(self, job_nodes: int) -> int:
        """How many training processes run for a job of ``job_nodes`` nodes."""
        return job_nodes if self.processes == PER_NODE else int(self.processes)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        from recovery.train.model import MODELS  # imports jax: only when a file is loaded

        if value not in MODELS:
            raise ValueError(str(unknown_choice("model", value, MODELS)))
        return value

    @field_validator("command")
    @classmethod
    def _placeholders(cls, value: list[str] | None) -> list[str] | None:
        from scenarios.placeholders import check

        return None if value is None else check(value)


TRIGGERS = ("step", "checkpoint", "after_s", "job", "incidents")


class When(_Strict):
    """When an entry is carried out: exactly one trigger, then ``delay_s`` more seconds."""

    step: Annotated[int, Field(ge=1)] | None = None
    checkpoint: Annotated[int, Field(ge=1)] | None = None
    after_s: Annotated[float, Field(ge=0)] | None = None
    job: Literal["requeued", "restarted"] | None = None
    incidents: Literal["opened", "acted", "closed", "held"] | None = None
    delay_s: Annotated[float, Field(ge=0, le=600)] = 0.0

    @model_validator(mode="after")
    def _one_trigger(self) -> When:
        given = [t for t in TRIGGERS if getattr(self, t) is not None]
        if len(given) != 1:
            got = ", ".join(given) or "none"
            raise ValueError(f"give exactly one of {', '.join(TRIGGERS)} (got {got})")
        return self

    @property
    def trigger(self) -> tuple[str, object]:
        """``(name, value)`` of the one trigger given."""
        name = next(t for t in TRIGGERS if getattr(self, t) is not None)
        return name, getattr(self, name)

    def describe(self) -> str:
        name, value = self.trigger
        text = f"{name} {value}" if name != "after_s" else f"{value:g} s later"
        return text + (f" + {self.delay_s:g} s" if self.delay_s else "")


class Repeat(_Strict):
    """Inject the same fault ``count`` times, ``every_s`` seconds apart."""

    count: Annotated[int, Field(ge=2, le=1000)]
    every_s: Annotated[float, Field(ge=0, le=60)] = 0.2
    across_gpus: bool = False


class Entry(_Strict):
    """One thing the scenario does: a fault (``fault``) or an operator action (``operator``)."""

    fault: str | None = None
    operator: Literal["repaired", "breaker-reset", "check"] | None = None
    node: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")] | None = None
    burst: Annotated[int, Field(ge=2, le=16)] | None = None
    via: Literal["agent", "kmsg"] | None = None
    gpu: Annotated[int, Field(ge=0, le=7)] | None = None
    repeat: Repeat | None = None
    crash_training: bool | None = None
    restart: bool | None = None
    cpu_percent: Annotated[int, Field(ge=1, le=99)] | None = None
    expect: Literal["accepted", "refused"] | None = None
    when: When = When(after_s=0)

    @field_validator("fault")
    @classmethod
    def _known_fault(cls, value: str | None) -> str | None:
        if value is not None and value not in SPECIAL_FAULTS and value not in catalogue_faults():
            known = [*catalogue_faults(), *SPECIAL_FAULTS]
            raise ValueError(str(unknown_choice("fault", value, known)))
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Entry:
        if (self.fault is None) == (self.operator is None):
            raise ValueError("give exactly one of fault (what to break) or operator (what to do)")
        injected = self.fault is not None and self.fault not in SPECIAL_FAULTS
        only = {
            "burst": injected,
            "via": injected,
            "gpu": injected,
            "repeat": injected,
            "crash_training": injected,
            "restart": self.fault == "coordinator-kill",
            "cpu_percent": self.fault == "cpu-throttle",
            "expect": self.operator is not None,
        }
        for key, allowed in only.items():
            if getattr(self, key) is not None and not allowed:
                raise ValueError(f"{key} does not apply to {self.label}")
        if self.node is not None and self.where_default is None:
            raise ValueError(f"node does not apply to {self.label}")
        if self.via == "kmsg" and self.fault is not None:
            from agents.follow import format_fault_line

            try:
                format_fault_line(self.fault, "00000000:00:00.0")
            except ValueError as e:
                raise ValueError(f"{e} (via kmsg writes kernel XID lines only)") from e
        if self.burst is not None and self.node not in (None, JOB_NODE):
            raise ValueError("burst picks job nodes itself; leave node out (or job-node)")
        if self.fault == "cpu-throttle" and self.cpu_percent is None:
            raise ValueError("cpu-throttle needs cpu_percent (1-99: the share of a CPU left)")
        return self

    @property
    def label(self) -> str:
        """What the entry does, in a word or two: ``xid79``, ``operator repaired``."""
        return self.fault if self.fault is not None else f"operator {self.operator}"

    @property
    def where_default(self) -> str | None:
        """Where the entry acts when ``node`` is not given; None when no node applies."""
        if self.fault in ("checkpoint-corrupt", "checkpoint-truncate", "coordinator-kill"):
            return None
        if self.operator == "breaker-reset":
            return None
        return FAULT_NODE if self.operator in ("repaired", "check") else JOB_NODE

    @property
    def where(self) -> str | None:
        """The node spec in effect (defaults applied); None when no node applies."""
        return self.node if self.node is not None else self.where_default

    @property
    def path(self) -> str:
        """How the fault travels: ``agent``, ``kmsg``, ``slurmd-kill``, ``file``, ``sigkill``."""
        if self.fault == "slurmd-crash":
            return "slurmd-kill"
        if self.fault == "node-hang":
            return "sigstop"
        if self.fault in ("checkpoint-corrupt", "checkpoint-truncate"):
            return "file"
        if self.fault in ("coordinator-kill", "agent-kill"):
            return "sigkill"
        if self.operator is not None:
            return "api"
        return self.via or "agent"

    @property
    def kills_training(self) -> bool:
        """Whether the faulted node's training process is SIGABRTed with the fault (see the module
        docstring: default from the catalogue's ``kills_work``)."""
        if self.fault is None or self.fault in SPECIAL_FAULTS:
            return False
        return kills_work(self.fault) if self.crash_training is None else self.crash_training


def _journal_phase(name: str) -> str:
    """``name`` if it is one of the journal's phases (:class:`PhaseName`)."""
    known = [p.value for p in PhaseName]
    if name not in known:
        raise ValueError(str(unknown_choice("journal phase", name, known)))
    return name


class Expectations(_Strict):
    """What must hold at the end of the run."""

    completes: bool = True
    digest_matches_control: bool = True
    max_steps_recomputed: Annotated[int, Field(ge=0)] | None = None
    min_fallbacks: Annotated[int, Field(ge=0)] | None = None
    incidents: Annotated[int, Field(ge=0)] | None = None
    verdicts: list[Verdict] | None = None
    incident_faults: list[str] | None = None
    """The fault of each incident, oldest first (``rank-hang``, ``xid79``, ...)."""
    incident_nodes: list[str] | None = None
    """The node of each incident, oldest first: the culprit named."""
    incident_phases: list[Annotated[str, AfterValidator(_journal_phase)]] | None = None
    held: Annotated[int, Field(ge=0)] | None = None
    max_requeues: Annotated[int, Field(ge=0)] | None = None
    out_of_service: list[str] | None = None
    in_service: list[str] | None = None
    phases: dict[ReportPhase, Annotated[float, Field(gt=0)]] | None = None


class Scenario(_Strict):
    """One scenario file."""

    name: str
    description: OneLine = ""
    cluster: ClusterSpec = ClusterSpec()
    job: JobSpec
    faults: list[Entry]
    """In order; ``[]``: nothing is done to the job (a guard scenario)."""
    expect: Expectations = Expectations()
    expect_in_allocation: Expectations | None = None
    """What changes in ``expect`` when the job runs in-allocation (only the fields given)."""
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 300.0

    def expectations(self) -> Expectations:
        """``expect``, with ``expect_in_allocation``'s fields over it in that mode."""
        over = self.expect_in_allocation
        if self.job.mode != "in-allocation" or over is None:
            return self.expect
        return self.expect.model_copy(update={k: getattr(over, k) for k in over.model_fields_set})

    def in_mode(self, mode: str) -> Scenario:
        """This scenario with its job in ``mode`` (``recover scenario run --mode``). The job
        trains on as many nodes either way: moved to in-allocation, a local cluster gets one
        more node per spare the job holds (moved back, one fewer), so the modes compare on
        the same K, in-allocation holding its spares idle."""
        if mode not in MODES:
            raise UsageError(str(unknown_choice("mode", mode, MODES)))
        doc = self.model_dump(exclude_unset=True)
        job = doc["job"] | {"mode": mode}
        if mode == "requeue":
            job.pop("spares", None)
        before, after = self.job.job_spares, JobSpec.model_validate(job).job_spares
        if self.local and self.job.nodes == "all" and after != before:
            doc["cluster"] = doc.get("cluster", {}) | {"nodes": self.cluster.nodes - before + after}
        return self.model_validate(doc | {"job": job})

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"expected lower-case letters, digits and '-', got {value!r}")
        return value

    @property
    def local(self) -> bool:
        """True when the runner starts (and stops) a local cluster for it."""
        return self.cluster.existing is None

    def training_args(self) -> list[str]:
        """The ``recover train`` options the job's configuration gives (no run dir), its
        long phases with them (the control run builds its own, without)."""
        j = self.job
        return [
            "--steps", str(j.steps), "--save-every", str(j.save_every), "--model", j.model,
            "--seed", str(j.seed), *(j.long_phases.train_args() if j.long_phases else []),
        ]  # fmt: skip
