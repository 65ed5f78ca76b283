"""The fault catalogue: a versioned table (``catalogue.yaml``, shipped with the package) of what
each fault means and which verdict it gets.

Two numbered families: GPU XIDs (``xid<N>``) and NVSwitch SXids (``sxid<N>``, never taken for
an XID). A number not listed gets its family's default entry (``default_xid``,
``default_sxid``: observe) under its own code, so it is reported, never dropped; any other
unknown fault name is an error that lists the known ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from recovery.errors import unknown_choice
from recovery.model import Verdict
from recovery.policy._files import (
    PolicyFileError,
    boolean,
    check_keys,
    load_yaml_mapping,
    one_line,
    require_mapping,
)

#: Fault codes of NVIDIA XIDs: ``xid`` and the number, without leading zeros.
XID_RE = re.compile(r"^xid(0|[1-9][0-9]{0,5})$")
#: Fault codes of NVSwitch SXids: ``sxid`` and the number, without leading zeros.
SXID_RE = re.compile(r"^sxid(0|[1-9][0-9]{0,5})$")

_E = TypeVar("_E", bound=StrEnum)

_REQUIRED = ("title", "severity", "verdict", "says")
_OPTIONAL = (
    "can_save",
    "kills_work",
    "companions",
    "with_companion",
    "follows",
    "job_fault",
    "incident",
)


class Severity(StrEnum):
    """How bad a fault is, for people and dashboards (the verdict decides what happens)."""

    info = "info"
    warning = "warning"
    critical = "critical"


@dataclass(frozen=True)
class FaultSpec:
    """One catalogue entry.

    ``says`` is one line of what NVIDIA (or the operators' runbook) says to do. ``can_save``
    is False when the jobs cannot checkpoint on the way out (the GPU or node is gone).
    ``kills_work`` is True when the fault kills the accelerator work it hits (the process
    using that GPU dies at once, as DESIGN.md's failure model says); it defaults to
    ``not can_save``. XID 95 kills the work on one GPU while the node's other processes may
    still save, so it kills work and can save. Scenarios stage a fault that kills work by
    killing the training process (``crash_training``).
    ``companions`` are faults that join this one's incident within the correlation window, and
    ``with_companion`` the verdict when one was seen within it (None: ``verdict``);
    ``follows`` marks a fault that is only ever a consequence of another one; ``job_fault``
    one that is usually the job's own doing (its crash): it never takes the node out on its
    own account (no escalation) and never counts as a failure of the node. ``incident``: an
    ``observe`` verdict that still opens an incident (a slow node: tracked and shown with what
    it costs, no action, not counted as a failure); a policy file's verdict for it acts.
    """

    code: str
    title: str
    severity: Severity
    verdict: Verdict
    says: str
    can_save: bool = True
    kills_work: bool = False
    companions: frozenset[str] = frozenset()
    with_companion: Verdict | None = None
    follows: bool = False
    job_fault: bool = False
    incident: bool = False


#: The SXid default of a catalogue file that has no ``default_sxid`` (older files).
DEFAULT_SXID = FaultSpec(
    code="sxid",
    title="NVSwitch SXid not in this catalogue",
    severity=Severity.warning,
    verdict=Verdict.observe,
    says="not in the catalogue shipped here; look it up in the Fabric Manager guide",
)


@dataclass(frozen=True)
class Catalogue:
    """The loaded table. ``version`` is the file's ``version`` key, recorded in decisions."""

    version: str
    entries: Mapping[str, FaultSpec]
    default_xid: FaultSpec
    default_sxid: FaultSpec

    def spec(self, fault: str) -> FaultSpec:
        """The entry for ``fault``; an unlisted ``xidN`` gets the default entry under its own
        code. Raises :class:`recovery.errors.UsageError` listing the known faults otherwise."""
        found = self.lookup(fault)
        if found is None:
            raise unknown_choice("fault", fault, self.known())
        return found

    def lookup(self, fault: str) -> FaultSpec | None:
        """Like :meth:`spec`, but None for an unknown fault outside the numbered families."""
        if fault in self.entries:
            return self.entries[fault]
        if XID_RE.fullmatch(fault):
            return replace(self.default_xid, code=fault)
        if SXID_RE.fullmatch(fault):
            return replace(self.default_sxid, code=fault)
        return None

    def known(self) -> list[str]:
        """The listed fault codes: XIDs by number, SXids by number, then the named faults
        alphabetically."""
        return sorted(self.entries, key=_order)


def _order(code: str) -> tuple[int, int, str]:
    m = XID_RE.fullmatch(code)
    if m:
        return (0, int(m.group(1)), "")
    m = SXID_RE.fullmatch(code)
    return (1, int(m.group(1)), "") if m else (2, 0, code)


def default_catalogue_path() -> Path:
    """Where the packaged ``catalogue.yaml`` lies."""
    return Path(str(resources.files("recovery.policy").joinpath("catalogue.yaml")))


def load_catalogue(path: Path | None = None) -> Catalogue:
    """Load the catalogue at ``path`` (the packaged one when None).

    Raises :class:`recovery.policy.PolicyFileError` (a UsageError) naming the file, the entry
    and the field for an unreadable file, a missing or unknown key, an unknown severity or
    verdict, or a companion that is not in the catalogue.
    """
    path = path or default_catalogue_path()
    data = load_yaml_mapping(path)
    where = str(path)
    check_keys(data, where, ("version", "default_xid", "default_sxid", "faults"))
    for key in ("version", "default_xid", "faults"):
        if key not in data:
            raise PolicyFileError(f"{where}: missing key {key!r}")
    version = data["version"]
    if not isinstance(version, str | int | float) or isinstance(version, bool) or version == "":
        raise PolicyFileError(f"{where}: 'version' must be text such as \"2026.12.1\"")
    faults = require_mapping(data["faults"], f"{where}: faults")
    entries: dict[str, FaultSpec] = {}
    for code, raw in faults.items():
        if code.startswith("default_") or not re.fullmatch(r"[a-z][a-z0-9-]{0,47}", code):
            raise PolicyFileError(
                f"{where}: fault {code!r}: codes are lower-case letters, digits and '-'"
            )
        entries[code] = _entry(code, raw, f"{where}: fault {code!r}")
    default = _entry("xid", data["default_xid"], f"{where}: default_xid")
    default_sxid = (
        _entry("sxid", data["default_sxid"], f"{where}: default_sxid")
        if "default_sxid" in data
        else DEFAULT_SXID
    )
    for spec in (*entries.values(), default, default_sxid):
        for other in sorted(spec.companions):
            if other not in entries:
                raise PolicyFileError(
                    f"{where}: fault {spec.code!r}: field 'companions': "
                    f"{unknown_choice('fault', other, entries)}"
                )
    return Catalogue(str(version), MappingProxyType(entries), default, default_sxid)


def _entry(code: str, raw: Any, where: str) -> FaultSpec:
    data = require_mapping(raw, where)
    check_keys(data, where, _REQUIRED + _OPTIONAL)
    for key in _REQUIRED:
        if key not in data:
            raise PolicyFileError(f"{where}: missing field {key!r}")
    companions = data.get("companions", [])
    if not isinstance(companions, list) or not all(isinstance(c, str) for c in companions):
        raise PolicyFileError(f"{where}: field 'companions' must be a list of fault codes")
    return FaultSpec(
        code=code,
        title=one_line(data["title"], f"{where}: field 'title'"),
        severity=_choice(Severity, data["severity"], f"{where}: field 'severity'"),
        verdict=_choice(Verdict, data["verdict"], f"{where}: field 'verdict'"),
        says=one_line(data["says"], f"{where}: field 'says'"),
        can_save=(can_save := boolean(data.get("can_save", True), f"{where}: field 'can_save'")),
        kills_work=boolean(data.get("kills_work", not can_save), f"{where}: field 'kills_work'"),
        companions=frozenset(companions),
        with_companion=(
            None
            if data.get("with_companion") is None
            else _choice(Verdict, data["with_companion"], f"{where}: field 'with_companion'")
        ),
        follows=boolean(data.get("follows", False), f"{where}: field 'follows'"),
        job_fault=boolean(data.get("job_fault", False), f"{where}: field 'job_fault'"),
        incident=boolean(data.get("incident", False), f"{where}: field 'incident'"),
    )


def _choice(enum: type[_E], value: object, where: str) -> _E:
    if isinstance(value, str) and value in enum.__members__.values():
        return enum(value)
    known = [e.value for e in enum]
    raise PolicyFileError(f"{where}: {unknown_choice(enum.__name__.lower(), value, known)}")


def parse_verdict(value: object, where: str) -> Verdict:
    """``value`` as a :class:`Verdict`, else :class:`PolicyFileError` listing the verdicts."""
    return _choice(Verdict, value, where)
