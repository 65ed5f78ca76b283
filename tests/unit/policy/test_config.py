"""The policy file: defaults, a full file, and errors that name the key and what is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.errors import UsageError
from recovery.model import Verdict
from recovery.policy import PolicyConfig, PolicyFileError, load_policy_config

FULL = """\
verdicts: {xid13: ignore, xid14: drain-reset}
correlation_window_s: 10
flood_window_s: 120
escalation_window_s: 600.5
flapping: {threshold: 5, window_s: 3600}
breaker: {window_s: 60, max_fraction: 0.25, max_nodes: 3, hold_max_age_s: 120}
save_timeout_s: 30
spares: {groups: {n1: rack-a, n2: rack-b}, feature_prefix: "nvl-"}
progress: {floor_s: 30, phases_s: {evaluation: 7200}, straggler: {factor: 2.0}}
dry_run: true
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    c = load_policy_config(None)
    assert c == PolicyConfig.default()
    assert (c.breaker.window_s, c.breaker.max_fraction) == (300.0, 0.5)
    assert (c.breaker.max_nodes, c.breaker.hold_max_age_s) == (10, 900.0)
    assert c.save_timeout_s == 60.0
    assert c.dry_run is False
    assert dict(c.verdicts) == {}


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_policy_config(_write(tmp_path, "")) == PolicyConfig.default()


def test_full_file(tmp_path: Path) -> None:
    c = load_policy_config(_write(tmp_path, FULL))
    assert dict(c.verdicts) == {"xid13": Verdict.ignore, "xid14": Verdict.drain_reset}
    assert (c.correlation_window_s, c.flood_window_s, c.escalation_window_s) == (10, 120, 600.5)
    assert (c.flapping.threshold, c.flapping.window_s) == (5, 3600)
    assert (c.breaker.window_s, c.breaker.max_fraction) == (60, 0.25)
    assert (c.breaker.max_nodes, c.breaker.hold_max_age_s) == (3, 120)
    assert c.save_timeout_s == 30
    assert dict(c.spares.groups) == {"n1": "rack-a", "n2": "rack-b"}
    assert c.spares.feature_prefix == "nvl-"
    assert dict(c.progress) == {
        "floor_s": 30,
        "phases_s": {"evaluation": 7200},
        "straggler": {"factor": 2.0},
    }
    assert c.dry_run is True


def test_fingerprint_follows_every_setting(tmp_path: Path) -> None:
    default = PolicyConfig.default().fingerprint()
    assert default == PolicyConfig().fingerprint()
    assert load_policy_config(_write(tmp_path, FULL)).fingerprint() != default
    changed = load_policy_config(_write(tmp_path, "verdicts: {xid13: ignore}\n"))
    assert changed.fingerprint() != default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("verdicts: {xid99x: ignore}\n", "Unknown fault 'xid99x'. Known: "),
        ("verdicts: {gpu-melted: ignore}\n", "gpu-lost"),
        ("verdicts: {xid13: reboot}\n", "verdicts: xid13: Unknown verdict 'reboot'. Known: "),
        ("flood_windw_s: 3\n", "unknown key 'flood_windw_s'. Valid keys: breaker, "),
        ("breaker: {max_nodez: 3}\n", "breaker: unknown key 'max_nodez'. Valid keys: hold_max"),
        ("breaker: {max_fraction: 1.5}\n", "max_fraction: expected a fraction 0-1"),
        ("breaker: {max_nodes: 0}\n", "max_nodes: expected a whole number >= 1"),
        ("breaker: {max_nodes: 2.5}\n", "max_nodes: expected a whole number"),
        ("flapping: {threshold: 0}\n", "flapping: threshold: expected a whole number >= 1"),
        ("save_timeout_s: -1\n", "save_timeout_s: expected a number >= 0"),
        ("save_timeout_s: soon\n", "save_timeout_s: expected a number"),
        ("dry_run: yes please\n", "dry_run: expected true or false"),
        ("spares: {groups: [n1]}\n", "spares: groups: expected a mapping"),
        ("spares: {colour: red}\n", "spares: unknown key 'colour'"),
        ("progress: {flor_s: 3}\n", "progress: key 'flor_s'. Known: factor, floor_s"),
        ("progress: {straggler: {factor: 1}}\n", "straggler factor must be > 1"),
        ("progress: 5\n", "progress: expected a mapping"),
        ("- 1\n", "expected a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_policy_file_names_key_and_valid_choices(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(PolicyFileError) as info:
        load_policy_config(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert isinstance(info.value, UsageError)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot be read"):
        load_policy_config(tmp_path / "missing.yaml")


def test_a_repair_check_is_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("repair_check: {command: [/usr/bin/gpu-check, '{node}'], interval_s: 30}\n")
    check = load_policy_config(good).repair_check
    assert check is not None
    assert (check.command, check.interval_s, check.timeout_s) == (
        ("/usr/bin/gpu-check", "{node}"), 30.0, 30.0,
    )  # fmt: skip
    bad = tmp_path / "bad.yaml"
    bad.write_text("repair_check: {command: /usr/bin/gpu-check}\n")
    with pytest.raises(PolicyFileError, match="expected a list of strings"):
        load_policy_config(bad)
