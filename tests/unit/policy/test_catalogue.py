"""The packaged catalogue: every fault NVIDIA's table and REFERENCE.md name, its verdict and the
actions decide plans for it on a healthy node; and the loader's errors on malformed files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from recovery.errors import UsageError
from recovery.model import Drain, PromoteSpare, RequeueJobs, SaveThenRequeue, TakeDown, Verdict
from recovery.policy import Catalogue, PolicyConfig, PolicyFileError, Severity, load_catalogue

from .helpers import Run

IG, OB, R, D, X = (
    Verdict.ignore, Verdict.observe, Verdict.restart_app, Verdict.drain_reset, Verdict.replace_node
)  # fmt: skip

# The expected table, written out independently of catalogue.yaml (NVIDIA's immediate actions).
EXPECTED: dict[str, Verdict] = {
    "xid13": R, "xid31": R, "xid32": R, "xid43": IG, "xid45": IG, "xid48": D, "xid62": D,
    "xid63": IG, "xid64": D, "xid68": R, "xid69": R, "xid74": D, "xid79": X, "xid92": IG,
    "xid94": R, "xid95": D, "xid109": D, "xid119": D, "xid120": D, "xid121": IG, "xid140": D,
    "xid143": D, "xid144": IG, "xid145": IG, "xid146": IG, "xid147": IG, "xid148": IG, "xid149": IG,
    "xid150": IG, "xid154": IG, "gpu-lost": X, "ecc-uncorrected": D, "row-remap-failure": X,
    "tpu-runtime-error": R, "tpu-runtime-gone": R, "node-unreachable": X, "heartbeat-lost": IG,
    "gpu-reset-required": D, "rank-hang": R, "rank-frozen": R, "job-hang": R, "node-slow": OB,
    "gpu-slowdown": OB, "node-slow-swap": D,
}  # fmt: skip
# NVSwitch SXids the Fabric Manager guide calls potentially fatal (reset GPUs and switches)
# and always fatal (restart the host); both as reported Fatal.
SXID_RESET = [
    11001, 11009, 11013, 11018, 11019, 11020, 12001, 12002, 12022, 12024, 12025, 12026, 12027,
    12030, 12031, 12032, 14017, 15001, 15006, 15009, 15010, 15012, 15013, 19047, 19048, 19054,
    19056, 19058, 19060, 19061, 19063, 19064, 19066, 19067, 19069, 19070, 20034, 22012, 24004,
    24005, 24006, 24007,
]  # fmt: skip
SXID_HOST = [12020, 22003, 22011, *range(23001, 23018)]
EXPECTED |= {f"sxid{n}": D for n in SXID_RESET} | {f"sxid{n}": X for n in SXID_HOST}
JOB_FAULTS = {"xid13", "xid31", "xid43", "xid45", "job-hang"}
#: Observed, and still an incident: tracked and shown, with no action.
REPORTED = {"node-slow", "gpu-slowdown"}

# Action kinds per fault class on a healthy node, in order.
PLANS = {
    IG: [],
    OB: [],
    R: [RequeueJobs],
    D: [Drain, SaveThenRequeue, PromoteSpare],
    X: [TakeDown, PromoteSpare],
}
#: A hung job cannot save on the way out, but nothing killed it: the requeue does.
HANGS = {"rank-hang", "rank-frozen", "job-hang"}
NO_SAVE = {"xid79", "gpu-lost", "node-unreachable", "gpu-reset-required"} | {
    f for f in EXPECTED if f.startswith("sxid")
}


def test_catalogue_lists_exactly_the_expected_faults(catalogue: Catalogue) -> None:
    assert sorted(catalogue.known()) == sorted(EXPECTED)
    assert catalogue.version == "2026.12.5"
    assert {c for c in catalogue.known() if catalogue.spec(c).job_fault} == JOB_FAULTS


@pytest.mark.parametrize(("fault", "verdict"), sorted(EXPECTED.items()))
def test_every_entry_has_its_verdict_and_plan(
    fault: str, verdict: Verdict, catalogue: Catalogue, run: Run
) -> None:
    spec = catalogue.spec(fault)
    assert spec.verdict is verdict
    assert spec.severity in set(Severity)
    assert spec.says
    assert "\n" not in spec.says
    assert spec.can_save is (fault not in NO_SAVE | HANGS)
    # DESIGN.md: XID 94 kills its one context, XID 95 every context on the GPU.
    assert spec.kills_work is (fault in NO_SAVE or fault in ("xid94", "xid95"))
    d = run.send(fault)
    assert d.verdict is verdict
    plan = [TakeDown, PromoteSpare] if verdict is D and not spec.can_save else PLANS[verdict]
    assert [type(a) for a in d.actions] == plan
    assert all(a.node == "n1" for a in d.actions)
    # Observed faults open nothing, except those tracked as report-only incidents.
    assert d.opens is (verdict not in (IG, OB) or fault in REPORTED)
    if d.opens:  # a job's crash is no failure of its nodes, nor a report
        assert d.node_failure is (fault not in JOB_FAULTS | REPORTED)
    assert d.policy_version.startswith(catalogue.version)
    for a in d.actions:
        if isinstance(a, TakeDown | Drain):
            assert a.reason.startswith(fault + " ")
            assert '"' not in a.reason
            assert "incident" not in a.reason  # shared by nodes failing alike: one Slurm call


def test_save_timeout_comes_from_the_settings(run: Run) -> None:
    d = run.send("xid95")
    save = next(a for a in d.actions if isinstance(a, SaveThenRequeue))
    assert save.timeout_s == run.config.save_timeout_s == 60.0


def test_dcgm_failure_classes_are_critical(catalogue: Catalogue) -> None:
    for fault in ("xid48", "xid74", "xid79", "xid95", "xid119", "xid120", "xid140"):
        assert catalogue.spec(fault).severity is Severity.critical, fault
    assert catalogue.spec("xid94").severity is Severity.warning


def test_unlisted_xid_gets_the_default_entry_under_its_own_code(catalogue: Catalogue) -> None:
    spec = catalogue.spec("xid14")
    assert spec.code == "xid14"
    assert spec.verdict is Verdict.observe  # reported for a person, never dropped
    assert spec.title == catalogue.default_xid.title
    assert "xid14" not in catalogue.known()


def test_sxids_are_their_own_family_never_xids(catalogue: Catalogue) -> None:
    unlisted = catalogue.spec("sxid12028")  # non-fatal in the guide: not listed
    assert (unlisted.code, unlisted.verdict) == ("sxid12028", Verdict.observe)
    assert unlisted.title == catalogue.default_sxid.title
    assert catalogue.spec("sxid79").title != catalogue.spec("xid79").title
    assert catalogue.spec("xid24007").verdict is Verdict.observe  # an XID of that number
    known = catalogue.known()
    assert known.index("xid154") < known.index("sxid11001") < known.index("sxid23017")
    assert known.index("sxid23017") < known.index("ecc-uncorrected")


def test_unknown_named_fault_lists_the_known_ones(catalogue: Catalogue) -> None:
    with pytest.raises(UsageError, match=r"Unknown fault 'gpu-melted'\. Known: .*xid79"):
        catalogue.spec("gpu-melted")
    assert catalogue.lookup("gpu-melted") is None


def test_known_orders_xids_by_number_then_names(catalogue: Catalogue) -> None:
    known = catalogue.known()
    assert known[:3] == ["xid13", "xid31", "xid32"]
    assert known.index("xid95") < known.index("xid109")
    assert known[-1] == "tpu-runtime-gone"


GOOD_ENTRY = {"title": "T", "severity": "info", "verdict": "ignore", "says": "s"}


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _cat(**faults: object) -> dict[str, object]:
    return {"version": "t1", "default_xid": GOOD_ENTRY, "faults": faults}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("version: [1\n", "not valid YAML"),
        ("- a\n", "expected a mapping"),
        ({"default_xid": GOOD_ENTRY, "faults": {}}, "missing key 'version'"),
        (
            {**_cat(), "extra": 1},
            "unknown key 'extra'. Valid keys: default_sxid, default_xid, faults, version",
        ),
        (_cat(xid1={**GOOD_ENTRY, "verdict": "reboot"}),
         "fault 'xid1': field 'verdict': Unknown verdict 'reboot'. Known: drain-reset, ignore"),
        (_cat(xid1={**GOOD_ENTRY, "severity": "fatal"}),
         "fault 'xid1': field 'severity': Unknown severity 'fatal'"),
        (_cat(xid1={k: v for k, v in GOOD_ENTRY.items() if k != "says"}),
         "fault 'xid1': missing field 'says'"),
        (_cat(xid1={**GOOD_ENTRY, "colour": "red"}), "fault 'xid1': unknown key 'colour'"),
        (_cat(xid1={**GOOD_ENTRY, "title": 'say "hi"'}),
         "fault 'xid1': field 'title': must be one line without double quotes"),
        (_cat(xid1={**GOOD_ENTRY, "can_save": "no"}),
         "fault 'xid1': field 'can_save': expected true or false"),
        (_cat(xid1={**GOOD_ENTRY, "companions": ["xid2"]}),
         "fault 'xid1': field 'companions': Unknown fault 'xid2'. Known: xid1"),
        (_cat(XID1=GOOD_ENTRY), "fault 'XID1': codes are lower-case"),
        ({**_cat(), "default_xid": "ignore"}, "default_xid: expected a mapping"),
    ],
)  # fmt: skip
def test_malformed_catalogue_names_entry_and_field(
    tmp_path: Path, data: object, message: str
) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(PolicyFileError) as info:
        load_catalogue(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_catalogue_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot be read"):
        load_catalogue(tmp_path / "nope.yaml")


def test_a_custom_catalogue_loads(tmp_path: Path) -> None:
    cat = load_catalogue(
        _write(tmp_path, _cat(xid1=GOOD_ENTRY, xid2={**GOOD_ENTRY, "companions": ["xid1"]}))
    )
    assert cat.version == "t1"
    assert cat.known() == ["xid1", "xid2"]
    assert cat.spec("xid2").companions == {"xid1"}


def test_a_slow_node_is_reported_never_escalated_and_a_policy_verdict_acts(
    catalogue: Catalogue, run: Run
) -> None:
    first = run.send("node-slow")
    assert (first.opens, first.actions, first.node_failure) == (True, (), False)
    again = run.send("xid94", at=10.0)  # a failure of the node within the escalation window
    assert (again.verdict, again.escalated_from) == (Verdict.restart_app, None)  # none before
    config = replace(PolicyConfig.default(), verdicts={"node-slow": Verdict.drain_reset})
    acted = Run(catalogue, config).send("node-slow")
    assert [type(a) for a in acted.actions] == [Drain, SaveThenRequeue, PromoteSpare]


def test_a_slow_node_a_job_asked_to_be_moved_off_is_drained_with_a_save(run: Run) -> None:
    """The agent reports node-slow-swap only when the job asked for it and it pays: the node
    is drained, the job saves and is requeued, a spare comes in."""
    moved = run.send("node-slow-swap")
    assert moved.verdict == Verdict.drain_reset
    assert [type(a) for a in moved.actions] == [Drain, SaveThenRequeue, PromoteSpare]


@pytest.mark.parametrize("later_s", [10.0, 120.0])
def test_a_move_that_pays_later_acts_on_the_slow_nodes_open_incident(
    catalogue: Catalogue, later_s: float
) -> None:
    """The agent reports node-slow, then, once the slowdown has grown, node-slow-swap: the
    move is acted on, within the correlation window or after it."""
    run = Run(catalogue, PolicyConfig.default())
    first = run.send("node-slow")
    moved = run.send("node-slow-swap", at=later_s)
    assert first.actions == ()
    assert moved.verdict == Verdict.drain_reset
    assert [type(a) for a in moved.actions] == [Drain, SaveThenRequeue, PromoteSpare]


def test_a_gpus_slowdown_and_the_slow_node_it_causes_are_one_incident(run: Run) -> None:
    first = run.send("gpu-slowdown")
    second = run.send("node-slow", at=20.0)
    assert (first.opens, second.opens) == (True, False)
    assert second.incident == first.incident
    assert second.actions == ()
