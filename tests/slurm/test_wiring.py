"""Which cluster a command talks to: resolved once, in service.wiring, for every command.

Pure resolution first; then the CLI: promote, retire, status and sbatch all follow
``$SLURM_CONF`` (checked without daemons through the parse error Slurm gives for a conf only
the test wrote, and against the real cluster with an empty state dir, so only ``$SLURM_CONF``
can lead them there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recover import main
from recovery.errors import UsageError
from service import wiring
from slurm.cli_slurm import CliSlurm
from slurm.rest_slurm import RestSlurm
from slurm.restd import RestEndpoint, save_endpoint
from tests.slurm.helpers import wait_for


def local_cluster_in(state: Path) -> Path:
    """Make ``state`` look like a recorded local cluster; return its conf."""
    state.mkdir(parents=True)
    (state / "cluster.json").write_text("{}")
    conf = state / "slurm.conf"
    conf.write_text("")
    return conf


def test_explicit_conf_wins_over_the_environment_and_the_local_cluster(tmp_path: Path) -> None:
    local_cluster_in(tmp_path / "state")
    env = {"SLURM_CONF": "/env/slurm.conf"}
    got = wiring.slurm_conf("/opt/slurm.conf", tmp_path / "state", env)
    assert got == Path("/opt/slurm.conf")


def test_environment_wins_over_the_local_cluster(tmp_path: Path) -> None:
    local_cluster_in(tmp_path / "state")
    env = {"SLURM_CONF": "/env/slurm.conf"}
    assert wiring.slurm_conf(None, tmp_path / "state", env) == Path("/env/slurm.conf")


@pytest.mark.parametrize("env_conf", [None, ""])
def test_the_local_cluster_is_the_fallback(tmp_path: Path, env_conf: str | None) -> None:
    conf = local_cluster_in(tmp_path / "state")
    env = {} if env_conf is None else {"SLURM_CONF": env_conf}
    assert wiring.slurm_conf(None, tmp_path / "state", env) == conf
    # ... also when found through $RECOVER_STATE_DIR.
    conf2 = local_cluster_in(tmp_path / "base" / "slurm")
    assert wiring.slurm_conf(None, None, {"RECOVER_STATE_DIR": str(tmp_path / "base")}) == conf2


def test_no_cluster_anywhere_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"set SLURM_CONF \(or --slurm-conf\)"):
        wiring.slurm_conf(None, tmp_path, {})


def test_slurm_control_points_every_command_at_the_resolved_conf(tmp_path: Path) -> None:
    ctl = wiring.slurm_control(None, tmp_path, {"SLURM_CONF": "/env/slurm.conf", "X": "1"})
    assert isinstance(ctl, CliSlurm)
    assert ctl.conf_path == Path("/env/slurm.conf")


COMMANDS = [
    ["cluster", "promote"],
    ["cluster", "retire", "node1"],
    ["cluster", "status"],
    ["sbatch", "--", "true"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0] if a[0] == "sbatch" else a[1])
def test_every_cluster_command_follows_slurm_conf(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = ["--state-dir", str(tmp_path / "empty")]
    cut = argv.index("--") if "--" in argv else len(argv)  # our options go before "--"
    args = [*argv[:cut], *empty, *argv[cut:]]
    monkeypatch.delenv("SLURM_CONF", raising=False)
    if argv[1] != "status":  # status of no cluster is not an error of configuration
        assert main(args) == 2
        assert "No Slurm configuration" in capsys.readouterr().err
    # A conf only this test writes: Slurm's parser names its odd key, proving it was read.
    conf = tmp_path / "picked.conf"
    conf.write_text("PickedBySlurmConfTest=1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert main(args) != 0
    out = capsys.readouterr()
    assert "unrecognized key: PickedBySlurmConfTest" in out.err + out.out


@pytest.mark.slurm
def test_promote_retire_status_and_sbatch_reach_the_cluster_named_by_slurm_conf(
    slurm_ctl: CliSlurm,
    job_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_ctl.conf_path))
    empty = ["--state-dir", str(tmp_path / "empty")]  # no local cluster to fall back on
    assert main(["cluster", "promote", *empty]) == 0
    assert capsys.readouterr().out == "spare1\n"
    wait_for(lambda: slurm_ctl.node("spare1").in_service, 10, "spare1 in service")
    assert main(["cluster", "retire", "spare1", *empty]) == 0
    assert capsys.readouterr().out == "spare1: retired into the pool\n"
    assert main(["cluster", "status", *empty]) == 0
    status = capsys.readouterr().out
    assert f"SLURM_CONF={slurm_ctl.conf_path}" in status
    assert "spare1" in status
    assert "recover: spare" in status
    sbatch = ["sbatch", *empty, f"--chdir={job_dir}", f"--output={job_dir}/%j.out"]
    assert main([*sbatch, "--", "sleep", "30"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert slurm_ctl.job(job_id).state in ("PENDING", "RUNNING")


# --- which backend ---------------------------------------------------------------------------


def test_an_unknown_backend_names_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        UsageError, match=r"Unknown Slurm backend 'grpc'\. Known: cli, pyslurm, rest"
    ):
        wiring.slurm_control(None, tmp_path, {}, wiring.SlurmAccess(backend="grpc"))
    with pytest.raises(UsageError, match=r"Unknown Slurm backend 'REST'"):
        wiring.slurm_control(None, tmp_path, {"RECOVER_SLURM_BACKEND": "REST"})


def test_the_cli_backend_sends_a_jwt_when_given_one(tmp_path: Path) -> None:
    env = {"SLURM_CONF": "/env/slurm.conf", "RECOVER_SLURM_JWT_FILE": "/run/secrets/jwt"}
    ctl = wiring.slurm_control(None, tmp_path, env)
    assert isinstance(ctl, CliSlurm)
    assert ctl.jwt_file == Path("/run/secrets/jwt")
    plain = wiring.slurm_control(None, tmp_path, {"SLURM_CONF": "/c"})
    assert isinstance(plain, CliSlurm)
    assert plain.jwt_file is None


def test_rest_needs_to_know_where_slurmrestd_is(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"No slurmrestd configured: pass --slurmrestd"):
        wiring.slurm_control(None, tmp_path, {"RECOVER_SLURM_BACKEND": "rest"})
    with pytest.raises(UsageError, match="authenticates by JWT"):
        wiring.slurm_control(None, tmp_path, {}, wiring.SlurmAccess("rest", "http://h:6820"))
    with pytest.raises(UsageError, match="expected http"):
        wiring.slurm_control(None, tmp_path, {}, wiring.SlurmAccess("rest", "h:6820", "/t", "u"))
    with pytest.raises(UsageError, match="a Slurm JWT and its user go together"):
        wiring.slurm_control(None, tmp_path, {}, wiring.SlurmAccess("rest", "http://h:1", "/t"))


def test_rest_options_come_from_flags_then_the_environment(tmp_path: Path) -> None:
    env = {
        "RECOVER_SLURM_BACKEND": "rest",
        "RECOVER_SLURMRESTD": "http://slurmrestd:6820",
        "RECOVER_SLURM_JWT_FILE": "/run/secrets/jwt",
        "RECOVER_SLURM_USER": "slurm",
    }
    ctl = wiring.slurm_control(None, tmp_path, env)
    assert isinstance(ctl, RestSlurm)
    assert (ctl.where, ctl.token_file, ctl.user) == (
        "http://slurmrestd:6820", Path("/run/secrets/jwt"), "slurm")  # fmt: skip
    local = wiring.slurm_control(None, tmp_path, env, wiring.SlurmAccess(restd="unix:/run/r.sock"))
    assert isinstance(local, RestSlurm)
    assert local.where == "unix:/run/r.sock"
    bare = wiring.slurm_control(None, tmp_path, {}, wiring.SlurmAccess("rest", "unix:/run/r.sock"))
    assert isinstance(bare, RestSlurm)
    assert bare.token_file is None  # rest_auth/local: acts as slurmrestd's own user


def test_rest_falls_back_to_the_local_clusters_slurmrestd(tmp_path: Path) -> None:
    save_endpoint(tmp_path, RestEndpoint(tmp_path / "s.sock", "http://127.0.0.1:4", tmp_path / "t"))
    ctl = wiring.slurm_control(None, tmp_path, {"RECOVER_SLURM_BACKEND": "rest"})
    assert isinstance(ctl, RestSlurm)
    assert (ctl.where, ctl.token_file, ctl.user) == ("http://127.0.0.1:4", tmp_path / "t", "root")


def test_the_coordinator_refuses_an_unknown_backend_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["coordinator", "serve", "--state-dir", str(tmp_path), "--slurm-backend", "grpc"]
    assert main([*argv, "--slurm-conf", "/nonexistent.conf"]) == 2
    assert "Unknown Slurm backend 'grpc'. Known: cli, pyslurm, rest" in capsys.readouterr().err
