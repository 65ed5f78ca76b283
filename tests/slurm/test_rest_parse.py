"""slurmrestd's replies, on literal captures from the real 22.05 daemon (samples/rest-22.05/,
statuses in its README): parsing, error classification, versions, tokens. No daemons."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from recovery.errors import (
    SlurmRefusedError,
    SlurmUnavailableError,
    SlurmUnsupportedError,
)
from slurm.parse import parse_jobs, parse_nodes
from slurm.rest_parse import (
    RestError,
    classify,
    has_operation,
    load_reply,
    offered_versions,
    reply_errors,
    submitted_job_id,
    token_expiry,
)

SAMPLES = Path(__file__).parent / "samples" / "rest-22.05"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_nodes_reply_parses_like_sinfo() -> None:
    nodes = {n.name: n for n in parse_nodes(sample("nodes.json"), what="GET nodes")}
    assert list(nodes) == ["node1", "node2", "node3", "spare1"]
    assert all(nodes[f"node{i}"].in_service for i in (1, 2, 3))
    spare = nodes["spare1"]
    assert (spare.state, spare.reason) == ("IDLE", "recover: spare")
    assert spare.flags == {"DRAIN"}
    assert spare.reason_set_by == "root"
    assert spare.partitions == ("main",)


def test_job_replies_parse_like_squeue() -> None:
    (running,) = parse_jobs(sample("job-running.json"), what="GET job")
    assert (running.job_id, running.name, running.state) == ("2", "traps", "RUNNING")
    assert running.nodes == ("node1",)
    assert running.restart_count == 0
    (done,) = parse_jobs(sample("jobs.json"), what="GET jobs")
    assert done.finished
    assert done.state == "COMPLETED"


def test_errors_of_every_shape_are_normalised() -> None:
    assert reply_errors(load_reply(sample("nodes.json"))) == []
    assert reply_errors(load_reply(sample("job-unknown.json"))) == [
        RestError(2017, "Invalid job id specified: Unable to find JobId=999999")
    ]
    # submission errors say "error_code", node errors "errno": the same field.
    assert reply_errors(load_reply(sample("submit-refused.json"))) == [
        RestError(2000, "Invalid partition name specified")
    ]
    assert reply_errors(load_reply(sample("bad-token.json"))) == [
        RestError(-1, "Unspecified error")
    ]
    assert reply_errors(load_reply(sample("unknown-version.json"))) == []  # plain text


@pytest.mark.parametrize(
    ("name", "status"),
    [("ctld-down-nodes.json", 500), ("ctld-down-jobs.json", 500), ("ctld-down-cancel.json", 500)],
)
def test_an_unreachable_slurmctld_is_transient(name: str, status: int) -> None:
    error = classify("GET nodes", status, sample(name))
    assert isinstance(error, SlurmUnavailableError)
    assert "unreachable" in str(error)


def test_errno_minus_one_is_transient_unless_the_token_expired() -> None:
    # 22.05 answers a rejected JWT exactly as an unreachable slurmctld (bad-token.json).
    assert sample("bad-token.json") == sample("ctld-down-nodes.json")
    error = classify("GET nodes", 500, sample("bad-token.json"))
    assert isinstance(error, SlurmUnavailableError)
    assert "rejected the JWT" in str(error)
    expired = classify("GET nodes", 500, sample("bad-token.json"), token_expired=True)
    assert isinstance(expired, SlurmRefusedError)
    assert "the JWT has expired" in str(expired)


@pytest.mark.parametrize(
    ("name", "status", "text"),
    [
        ("job-unknown.json", 500, "Unable to find JobId=999999 (errno 2017)"),
        ("cancel-unknown.json", 500, "unable to kill JobId=999999"),
        ("submit-refused.json", 500, "Invalid partition name specified"),
        ("submit-noenv.json", 400, "environment must be set"),
        # errno -1 among its entries, yet a malformed request is a verdict, not a transient.
        ("submit-batch-signal.json", 400, "Invalid SIGNAL specification"),
        ("signal-bogus.json", 400, "invalid signal: 0"),
    ],
)
def test_refusals_are_verdicts(name: str, status: int, text: str) -> None:
    error = classify("request", status, sample(name))
    assert type(error) is SlurmRefusedError
    assert text in str(error)


def test_a_missing_credential_and_an_unknown_path() -> None:
    refused = classify("GET nodes", 401, "Authentication failure")
    assert isinstance(refused, SlurmRefusedError)
    assert "X-SLURM-USER-TOKEN" in str(refused)
    missing = classify("GET nodes", 404, sample("unknown-version.json"))
    assert isinstance(missing, SlurmUnsupportedError)
    assert "v0.0.38" in str(missing)


def test_successes_and_gateways() -> None:
    assert classify("GET nodes", 200, sample("nodes.json")) is None
    assert classify("DELETE job", 200, sample("signal.json")) is None
    assert isinstance(classify("GET nodes", 503, "<html>busy</html>"), SlurmUnavailableError)
    assert type(classify("GET nodes", 500, "<html>oops</html>")) is SlurmRefusedError


def test_submitted_job_id() -> None:
    assert submitted_job_id(sample("submit.json")) == 2
    assert submitted_job_id(sample("submit-refused.json")) is None
    assert submitted_job_id("not json") is None


def test_versions_and_operations_the_daemon_offers() -> None:
    doc = sample("openapi-v3.json")
    assert offered_versions(doc) == ["v0.0.36", "v0.0.37", "v0.0.38"]
    assert has_operation(doc, "/slurm/v0.0.38/job/{job_id}", "delete")
    assert has_operation(doc, "/slurm/v0.0.38/job/submit", "post")
    # What the REST backend cannot do on 22.05, read from the daemon's own document:
    assert not has_operation(doc, "/slurm/v0.0.38/node/{node_name}", "post")
    assert not any("requeue" in p for p in json.loads(doc)["paths"])
    assert offered_versions("Unable find requested URL.") == []


def jwt(claims: dict[str, object]) -> str:
    def part(d: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


def test_token_expiry_is_read_without_the_key() -> None:
    assert token_expiry(jwt({"exp": 1796125199, "iat": 1796121599, "sun": "root"})) == 1796125199
    assert token_expiry(jwt({"sun": "root"})) is None
    assert token_expiry("bad") is None
    assert token_expiry("a.!!!.c") is None


# --- Slurm 25.11's slurmrestd (v0.0.44): real captures in samples/rest-25.11/ ---------------

SAMPLES_2511 = Path(__file__).parent / "samples" / "rest-25.11"


def test_v0_0_44_replies_parse_like_the_cli() -> None:
    nodes = {n.name: n for n in parse_nodes((SAMPLES_2511 / "nodes.json").read_text())}
    assert nodes["node1"].down
    assert nodes["node3"].reason == ""  # resumed: the old reason is not reported
    jobs = {j.job_id: j for j in parse_jobs((SAMPLES_2511 / "jobs.json").read_text())}
    assert jobs["2"].state == "REQUEUE_HOLD"


def test_v0_0_44_is_offered_with_node_updates_and_no_requeue() -> None:
    doc = (SAMPLES_2511 / "openapi-paths.json").read_text()
    assert offered_versions(doc)[-1] == "v0.0.44"
    assert has_operation(doc, "/slurm/v0.0.44/nodes/", "post")
    assert has_operation(doc, "/slurm/v0.0.44/node/{node_name}", "post")
    assert not [p for p in load_reply(doc)["paths"] if "requeue" in p]  # type: ignore[index]


def test_a_refused_v0_0_44_node_update_is_a_verdict() -> None:
    text = (SAMPLES_2511 / "update-unknown-node.json").read_text()
    error = classify("POST nodes", 500, text, version="v0.0.44")
    assert isinstance(error, SlurmRefusedError)
    assert "Invalid node name specified: Failure to update node nodeX (errno 2018)" in str(error)
