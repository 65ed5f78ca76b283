"""Which Slurm install a cluster runs on: Debian's packages (22.05) or our 25.11 build.

Debian 12 ships Slurm 22.05; ``scripts/build-slurm.sh`` builds 25.11 into a cache folder
(``$SLURM_CACHE/25.11.7``, default ``/var/cache/slurm-k8s-recover/slurm``). The local cluster
runs on one of them (``recover cluster up --slurm auto|25.11|22.05``, ``$RECOVER_SLURM``), and
every Slurm program the toolkit then runs against that cluster must be the same install's:
mixing versions fails in ways that look like faults (22.05's slurmctld drops a 25.11 client's
requests; a 22.05 ``sbatch`` cannot ask for ``--requeue=expedite``).

So the generated ``slurm.conf`` names its install in a comment line (:data:`CONF_MARK`), and
whoever is pointed at that conf (the CLI backend, ``recover sbatch``, the coordinator,
slurmrestd, ``scontrol token``) reads it back with :func:`of_conf` and runs that install's
programs: :func:`command_env` puts its ``bin`` first on ``PATH``, which a batch job inherits too
(sbatch exports the submitter's environment), so a job's own ``srun`` and ``scontrol requeue``
are the same install's. A conf without the line (a real cluster's) runs whatever is on
``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from recovery.errors import SlurmNotInstalledError, UsageError, unknown_choice

#: The 25.11 release ``scripts/build-slurm.sh`` builds.
BUILD_VERSION = "25.11.7"
#: ``--slurm`` / ``$RECOVER_SLURM`` values: ``auto`` is 25.11 when it is built, else 22.05.
CHOICES = ("auto", "25.11", "22.05")
#: Comment line the generated slurm.conf carries: ``# recover-slurm: 25.11 /prefix`` or
#: ``# recover-slurm: 22.05 system``.
CONF_MARK = "# recover-slurm:"
_MARK_RE = re.compile(r"^# recover-slurm: (\S+) (\S+)\s*$")
BUILD_HINT = (
    "build it with `./scripts/build-slurm.sh` (needs its release source: SLURM_SOURCE=PATH or "
    "internet), or use Debian's with --slurm 22.05"
)
#: Where Debian puts the daemons; not always on a user's PATH.
_SYSTEM_SBIN = ("/usr/sbin", "/sbin")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where ``scripts/build-slurm.sh`` keeps its builds (``$SLURM_CACHE``)."""
    env = os.environ if env is None else env
    return Path(env.get("SLURM_CACHE") or "/var/cache/slurm-k8s-recover/slurm")


@dataclass(frozen=True)
class SlurmInstall:
    """One Slurm install: ``version`` (``22.05`` or ``25.11``, the series) and ``prefix`` (the
    build's install folder; None for the system's packages, found on ``PATH``)."""

    version: str
    prefix: Path | None = None

    @property
    def series(self) -> tuple[int, int]:
        """``(25, 11)`` for ``25.11``: for comparisons such as "at least 23.02"."""
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def bin_dirs(self) -> tuple[Path, ...]:
        """Folders holding its programs (empty for the system's: they are on PATH)."""
        if self.prefix is None:
            return ()
        return (self.prefix / "bin", self.prefix / "sbin")

    def program(self, name: str) -> str:
        """The absolute path of program ``name`` (``slurmctld``, ``sbatch``, ...). Raises
        SlurmNotInstalledError naming how to get it when it is missing."""
        if self.prefix is not None:
            for d in self.bin_dirs:
                if (d / name).is_file():
                    return str(d / name)
            raise SlurmNotInstalledError(
                f"{name} is not in the Slurm {self.version} build at {self.prefix}; {BUILD_HINT}"
            )
        path = os.pathsep.join([os.environ.get("PATH", ""), *_SYSTEM_SBIN])
        found = shutil.which(name, path=path)
        if found is None:
            raise SlurmNotInstalledError(
                f"{name} not found; install Debian's Slurm with `apt-get install -y slurm-wlm "
                "munge` (or `./scripts/setup.sh`)"
            )
        return found

    def missing(self, names: tuple[str, ...]) -> list[str]:
        """Which of ``names`` this install lacks."""
        out = []
        for n in names:
            try:
                self.program(n)
            except SlurmNotInstalledError:
                out.append(n)
        return out

    @property
    def plugin_dir(self) -> Path | None:
        """Where the build keeps its plugins (None for the system's)."""
        return None if self.prefix is None else self.prefix / "lib" / "slurm"

    def conf_line(self) -> str:
        """The :data:`CONF_MARK` line naming this install in a generated slurm.conf."""
        return f"{CONF_MARK} {self.version} {self.prefix or 'system'}"

    def describe(self) -> str:
        """One phrase for messages: ``Slurm 25.11 (build in /...)`` or ``Slurm 22.05 (system)``."""
        where = f"build in {self.prefix}" if self.prefix else "Debian's packages"
        return f"Slurm {self.version} ({where})"


#: Debian's packages, found on PATH.
SYSTEM = SlurmInstall("22.05")


def build(env: Mapping[str, str] | None = None) -> SlurmInstall | None:
    """The 25.11 build when ``scripts/build-slurm.sh`` completed it (its STAMP written last),
    else None."""
    prefix = cache_dir(env) / BUILD_VERSION
    stamp = prefix / "STAMP"
    try:
        if stamp.read_text().strip() != BUILD_VERSION:
            return None
    except OSError:
        return None
    return SlurmInstall("25.11", prefix)


def choose(choice: str | None, env: Mapping[str, str] | None = None) -> SlurmInstall:
    """The install ``choice`` names (``--slurm``; None: ``$RECOVER_SLURM``, else ``auto``).

    ``auto`` is the 25.11 build when it exists, else Debian's 22.05 (see docs/slurm.md for
    why). Raises UsageError naming the valid choices for anything else, SlurmNotInstalledError
    saying how to build it when ``25.11`` is asked for and not built.
    """
    env = os.environ if env is None else env
    value = choice or env.get("RECOVER_SLURM") or "auto"
    if value not in CHOICES:
        raise unknown_choice("Slurm version (--slurm, RECOVER_SLURM)", value, CHOICES)
    built = build(env)
    if value == "22.05" or (value == "auto" and built is None):
        return SYSTEM
    if built is None:
        raise SlurmNotInstalledError(
            f"Slurm 25.11 is not built (looked in {cache_dir(env) / BUILD_VERSION}); {BUILD_HINT}"
        )
    return built


def of_conf(conf_path: str | Path) -> SlurmInstall | None:
    """The install a generated slurm.conf names (:data:`CONF_MARK`), or None for a conf
    without the line (a real cluster's) or one that cannot be read. Only the first lines are
    read. A named build that has since been removed raises UsageError saying so."""
    try:
        with open(conf_path, encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(5)]
    except OSError:
        return None
    for line in head:
        m = _MARK_RE.match(line.rstrip("\n"))
        if m is None:
            continue
        version, where = m.groups()
        if where == "system":
            return SlurmInstall(version)
        prefix = Path(where)
        if not prefix.is_dir():
            raise UsageError(
                f"{conf_path} was made for the Slurm {version} build in {prefix}, which is gone; "
                f"rebuild it (`./scripts/build-slurm.sh`) or restart the cluster"
            )
        return SlurmInstall(version, prefix)
    return None


def command_env(install: SlurmInstall | None, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``install``'s program folders first on ``PATH`` (unchanged for the
    system's or None). Slurm's commands run with it, and a batch job submitted with it runs
    the same install's ``srun``/``scontrol``."""
    out = dict(env)
    if install is None or install.prefix is None:
        return out
    dirs = [str(d) for d in install.bin_dirs]
    rest = [p for p in out.get("PATH", os.defpath).split(os.pathsep) if p and p not in dirs]
    out["PATH"] = os.pathsep.join(dirs + rest)
    return out
