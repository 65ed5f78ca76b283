"""The manifests in k8s/deploy: rendered by the built kubectl's kustomize, accepted by a real
API server (server-side dry-run of everything rendered), and shaped as the design needs
(one coordinator at a time on a persistent journal; agents everywhere, tainted nodes too)."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.plugins.kube_api import KubeApi

pytestmark = pytest.mark.kube

DEPLOY = Path(__file__).resolve().parents[2] / "k8s" / "deploy"
TAINT = "recover.io/unhealthy"
NAMESPACE = "recover"


def render(api: KubeApi, path: Path = DEPLOY) -> list[dict[str, Any]]:
    out = api.kubectl("kustomize", str(path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def docs(kube_api: KubeApi) -> list[dict[str, Any]]:
    return render(kube_api)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def slurmd_namespace(docs: list[dict[str, Any]]) -> str:
    """The slurmd pods' namespace the coordinator is configured for."""
    (c,) = one(docs, "Deployment", "recover-coordinator")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    return str(env["RECOVER_K8S_NAMESPACE"])


def dry_run(api: KubeApi, docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    """``kubectl apply --dry-run=server`` of ``docs``. What must exist first is created for
    real: our namespace (a dry-run create of it would not make it exist for the objects in
    it) and the slurmd pods' namespace (the Slurm operator's, a precondition)."""
    api.ensure_namespace(one(docs, "Namespace")["metadata"]["name"])
    api.ensure_namespace(slurmd_namespace(docs))
    f = tmp_path / "rendered.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    return api.kubectl("apply", "--dry-run=server", "-f", str(f), check=False)


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert "rbac.yaml" in listed
    on_disk = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


@pytest.mark.slow
def test_everything_rendered_passes_server_side_dry_run(
    kube_api: KubeApi, docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ServiceAccount", "Secret", "ConfigMap", "PersistentVolumeClaim",
            "Deployment", "Service", "DaemonSet"} <= kinds  # fmt: skip
    done = dry_run(kube_api, docs, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(docs), done.stdout
    assert all("(server dry run)" in line for line in lines), done.stdout
    # A dry run creates nothing.
    missing = kube_api.kubectl(
        "get", "-n", NAMESPACE, "deployment/recover-coordinator", check=False
    )
    assert "NotFound" in missing.stderr


def test_namespaces_are_ours_except_the_slurmd_role(docs: list[dict[str, Any]]) -> None:
    # Ours all live in `recover`; rbac.yaml's slurmd Role and RoleBinding stay in the
    # namespace the coordinator is told the slurmd pods are in, the leader election's in
    # `recover` (its Lease), and all bind the coordinator's ServiceAccount.
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    slurmd = slurmd_namespace(docs)
    for d in docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] in cluster_scoped:
            assert ns is None, d["metadata"]["name"]
        elif d["kind"] in ("Role", "RoleBinding"):
            leader = d["metadata"]["name"] == "recover-coordinator-leader"
            assert ns == (NAMESPACE if leader else slurmd), d["metadata"]["name"]
        else:
            assert ns == NAMESPACE, f"{d['kind']} {d['metadata']['name']}"
    sa = one(docs, "ServiceAccount", "recover-coordinator")["metadata"]
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert {d["kind"] for d in bindings} == {"RoleBinding", "ClusterRoleBinding"}
    for b in bindings:
        subjects = [(s["kind"], s["name"], s.get("namespace")) for s in b["subjects"]]
        assert subjects == [("ServiceAccount", sa["name"], sa["namespace"])], b["metadata"]


def test_coordinator_is_one_replica_on_a_persistent_journal(docs: list[dict[str, Any]]) -> None:
    dep = one(docs, "Deployment", "recover-coordinator")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount", "recover-coordinator")[
        "metadata"]["name"]  # fmt: skip
    (c,) = pod["containers"]
    assert c["command"] == ["recover", "coordinator", "serve"]
    state_dir = _flag(c["args"], "--state-dir")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    journal = volumes[mounts[state_dir]["name"]]
    claim = one(docs, "PersistentVolumeClaim")
    assert journal["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # The tokens file sits where the coordinator reads it (STATE_DIR/tokens), from a Secret.
    tokens = mounts[f"{state_dir}/tokens"]
    secret = volumes[tokens["name"]]["secret"]["secretName"]
    assert one(docs, "Secret", secret)["data"]["tokens"]
    # No munge in a pod: Slurm is reached with a JWT from a Secret, at the path the env names.
    env = {e["name"]: e.get("value") for e in c["env"]}
    jwt_dir = str(env["RECOVER_SLURM_JWT_FILE"]).rsplit("/", 1)[0]
    jwt = volumes[mounts[jwt_dir]["name"]]["secret"]["secretName"]
    assert one(docs, "Secret", jwt)["data"]["token"]
    assert env["RECOVER_SLURM_BACKEND"] in ("cli", "rest")
    # The Service reaches it on the port it listens on, and is the URL the agents use.
    svc = one(docs, "Service", "recover-coordinator")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    port = int(_flag(c["args"], "--listen").rsplit(":", 1)[1])
    assert [p["port"] for p in svc["spec"]["ports"]] == [port]
    agent = one(docs, "DaemonSet", "recover-agent")["spec"]["template"]["spec"]["containers"][0]
    assert (
        _flag(agent["args"], "--coordinator")
        == f"http://recover-coordinator.{NAMESPACE}.svc:{port}"
    )


def test_agent_runs_on_tainted_nodes_with_its_node_name_and_token(
    docs: list[dict[str, Any]],
) -> None:
    pod = one(docs, "DaemonSet", "recover-agent")["spec"]["template"]["spec"]
    for effect in ("NoSchedule", "NoExecute"):
        assert any(_tolerates(t, TAINT, effect) for t in pod["tolerations"]), effect
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["command"] == ["recover", "agent", "run"]
    assert _flag(c["args"], "--node") == "$(NODE_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    token_file = Path(_flag(c["args"], "--token-file"))
    (tokens,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == token_file.parent]
    secret = volumes[tokens["name"]]["secret"]["secretName"]
    assert token_file.name in one(docs, "Secret", secret)["data"]
    # Kernel log and GPUs of the host.
    assert c["securityContext"]["privileged"] is True
    kmsg = mounts[
        next(n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/dev/kmsg")
    ]
    assert kmsg["mountPath"] == _flag(c["args"], "--kmsg-file") == "/dev/kmsg"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


def test_images_are_the_containerfile_targets_and_overridable(
    kube_api: KubeApi, docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    def images(rendered: list[dict[str, Any]]) -> dict[str, str]:
        return {
            d["kind"]: c["image"]
            for d in rendered
            if d["kind"] in ("Deployment", "DaemonSet")
            for c in d["spec"]["template"]["spec"]["containers"]
        }

    # Each workload runs the image of its own Containerfile target (its own extra).
    assert images(docs) == {
        "DaemonSet": "slurm-k8s-recover-agent:0.1.0",
        "Deployment": "slurm-k8s-recover-coordinator:0.1.0",
    }
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copytree(DEPLOY, overlay / "base")
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "bases": ["base"],  # kustomize v2.0 (kubectl 1.20); later ones take "resources"
        "images": [
            {"name": "slurm-k8s-recover-agent", "newName": "registry.example/agent",
             "newTag": "v9"},
            {"name": "slurm-k8s-recover-coordinator", "newName": "registry.example/coord",
             "newTag": "v9"},
        ],
    }))  # fmt: skip
    assert images(render(kube_api, overlay)) == {
        "DaemonSet": "registry.example/agent:v9",
        "Deployment": "registry.example/coord:v9",
    }


def _recreate_with_rolling_params(docs: list[dict[str, Any]]) -> str:
    dep = one(docs, "Deployment")
    dep["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1}
    return "may not be specified when strategy `type` is 'Recreate'"


def _toleration_value_with_exists(docs: list[dict[str, Any]]) -> str:
    ds = one(docs, "DaemonSet")
    ds["spec"]["template"]["spec"]["tolerations"][0]["value"] = "true"
    return "value must be empty when `operator` is 'Exists'"


@pytest.mark.slow
@pytest.mark.parametrize("breakage", [_recreate_with_rolling_params, _toleration_value_with_exists])
def test_a_broken_manifest_is_rejected(
    kube_api: KubeApi,
    docs: list[dict[str, Any]],
    tmp_path: Path,
    breakage: Callable[[list[dict[str, Any]]], str],
) -> None:
    broken = copy.deepcopy(docs)
    expected = breakage(broken)
    done = dry_run(kube_api, broken, tmp_path)
    assert done.returncode != 0
    assert expected in done.stderr


def _flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name} given {len(values)} times in {args}"
    return values[0]


def _tolerates(t: dict[str, Any], key: str, effect: str) -> bool:
    if t.get("effect") not in (None, "", effect):
        return False
    if t.get("operator") == "Exists":
        return t.get("key") in (None, "", key)
    return bool(t.get("key") == key)
