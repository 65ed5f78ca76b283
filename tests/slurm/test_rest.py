"""What only the REST backend has, against the real slurmrestd of the session cluster: its two
ways in (JWT over TCP, local auth on a unix socket), expired tokens, what 22.05 cannot do
(said clearly, nothing changed), and the CLI's JWT path, which is how 22.05 takes nodes out
without munge. The shared contract is in test_adapter.py and its siblings."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.errors import SlurmRefusedError, SlurmUnavailableError, SlurmUnsupportedError
from recovery.ports.slurm import BatchJob
from slurm.cli_slurm import CliSlurm
from slurm.rest_parse import token_expiry
from slurm.rest_slurm import RestSlurm
from slurm.restd import RestEndpoint, make_token
from tests.plugins.slurm_cluster import rest_backend
from tests.slurm.helpers import running, submit_loop, wait_for

pytestmark = pytest.mark.slurm

SLEEP = "#!/bin/bash\nsleep 300\n"


@pytest.fixture
def rest(rest_endpoint: RestEndpoint, slurm_ctl: CliSlurm) -> Iterator[RestSlurm]:
    """The REST backend (JWT for root) on a cluster ``slurm_ctl`` resets around the test."""
    ctl = rest_backend(rest_endpoint)
    yield ctl
    ctl.close()


def test_local_auth_on_the_socket_reads_but_acts_as_nobody(
    rest_endpoint: RestEndpoint, rest: RestSlurm, job_dir: Path
) -> None:
    local = RestSlurm(socket=rest_endpoint.socket)
    try:
        assert [n.name for n in local.nodes()] == ["node1", "node2", "node3", "spare1"]
        job_id = rest.submit(BatchJob(script=SLEEP, options={"job-name": "root"}, workdir="/"))
        assert local.job(job_id).state in ("PENDING", "RUNNING")
        # slurmrestd runs as nobody, so does every request over the socket: root's job is
        # not nobody's to cancel. A verdict, and the job is untouched.
        with pytest.raises(SlurmRefusedError, match="Access/permission denied"):
            local.cancel(job_id)
        assert not rest.job(job_id).finished
    finally:
        local.close()


def test_what_22_05_cannot_do_is_said_and_nothing_changes(
    rest: RestSlurm, slurm_ctl: CliSlurm, job_dir: Path
) -> None:
    with pytest.raises(SlurmUnsupportedError, match="--slurm-backend cli --slurm-jwt-file"):
        rest.drain("node1", "xid79")
    assert slurm_ctl.node("node1").in_service
    assert rest.drain("spare1", "spare") is False  # already holds: a no-op still answers
    job_id = submit_loop(rest, job_dir)
    wait_for(lambda: running(rest, job_id), 15, "job running")
    with pytest.raises(SlurmUnsupportedError, match="no request that requeues a job"):
        rest.requeue(job_id)
    assert slurm_ctl.job(job_id).restart_count == 0


def test_a_held_submission_has_an_id_despite_the_warning(rest: RestSlurm) -> None:
    # slurmrestd lists "Job is in held state, pending scheduler release" among the errors of
    # a successful submission: the job id decides.
    job_id = rest.submit(BatchJob(script=SLEEP, options={"hold": None}, workdir="/"))
    job = rest.job(job_id)
    assert job.state == "PENDING"
    assert job.reason.startswith("JobHeld")
    assert rest.cancel(job_id) is True


def test_an_expired_token_is_a_verdict(
    rest_endpoint: RestEndpoint, slurm_ctl: CliSlurm, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token = make_token(slurm_ctl.conf_path, token_file, lifespan_s=1)
    exp = token_expiry(token)
    assert exp is not None
    wait_for(lambda: time.time() > exp + 1, 5, "the token's expiry")
    ctl = RestSlurm(url=rest_endpoint.url, token_file=token_file, user="root")
    try:
        with pytest.raises(SlurmRefusedError, match="the JWT has expired"):
            ctl.nodes()
    finally:
        ctl.close()


def test_a_plugin_version_the_daemon_lacks_names_those_it_has(
    rest: RestSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    rest.negotiate()
    monkeypatch.setattr(rest, "_version", "v0.0.99")
    with pytest.raises(SlurmUnsupportedError, match=r"it offers v0\.0\.38 \(from /openapi/v3\)"):
        rest.nodes()


def test_the_cli_takes_nodes_out_with_a_jwt_and_no_munge(
    rest_endpoint: RestEndpoint, slurm_ctl: CliSlurm, tmp_path: Path
) -> None:
    # A pod's view: slurm.conf, a token, and no munge socket at all.
    conf = tmp_path / "slurm.conf"
    text = slurm_ctl.conf_path.read_text()
    conf.write_text(re.sub(r"AuthInfo=socket=[^,\n]*", "AuthInfo=socket=/nonexistent", text))
    pod = CliSlurm(conf, jwt_file=rest_endpoint.token_file, env={"PATH": "/usr/bin:/bin"})
    assert pod.drain("node2", "xid79 from a pod") is True
    node = slurm_ctl.node("node2")
    assert (node.reason, node.reason_set_by) == ("recover: xid79 from a pod", "root")
    assert pod.resume("node2") is True
    without = CliSlurm(conf, env={"PATH": "/usr/bin:/bin"})
    with pytest.raises(SlurmUnavailableError, match="unreachable"):
        without.nodes()  # no munge, no token: nothing gets through
