"""Kubernetes mode's options: bad ones are refused with what is valid, before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recovery.errors import UsageError
from service.wiring import KubeOptions, LeaseOptions, check_lease, node_control


def test_either_a_kubeconfig_or_in_cluster() -> None:
    with pytest.raises(UsageError, match="either --kubeconfig PATH or --in-cluster"):
        KubeOptions(kubeconfig=Path("k"), in_cluster=True)
    with pytest.raises(UsageError, match="needs --kubeconfig PATH or --in-cluster"):
        KubeOptions()


def test_unknown_choices_name_the_valid_ones(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    with pytest.raises(UsageError, match=r"taint effect 'NoWay'\. Known: NoExecute, NoSchedule"):
        node_control(KubeOptions(kubeconfig=kc, taint_effect="NoWay"))
    with pytest.raises(UsageError, match=r"Unknown pod removal 'drop'\. Known: delete, evict"):
        node_control(KubeOptions(kubeconfig=kc, pod_removal="drop"))
    with pytest.raises(UsageError, match="cannot configure the Kubernetes client from"):
        node_control(KubeOptions(kubeconfig=kc))  # no such file


@pytest.mark.slow
def test_serve_refuses_a_bad_kubernetes_setting_before_touching_slurm(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "recover", "coordinator", "serve", "--state-dir",
         str(tmp_path / "state"), "--slurm-conf", str(tmp_path / "no-slurm.conf"),
         "--kubeconfig", str(tmp_path / "kc"), "--k8s-taint-effect", "Sometimes"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Unknown taint effect 'Sometimes'. Known: NoExecute, NoSchedule" in done.stderr


def test_a_lease_is_one_of_the_known_kinds_and_kube_needs_kubernetes() -> None:
    with pytest.raises(UsageError, match=r"Unknown lease 'etcd'\. Known: journal, kube"):
        LeaseOptions(kind="etcd", identity="a")
    with pytest.raises(UsageError, match="--lease kube needs Kubernetes"):
        check_lease(LeaseOptions(kind="kube", identity="a"), None)
    check_lease(LeaseOptions(kind="journal", identity="a"), None)


@pytest.mark.slow
def test_serve_refuses_a_kube_lease_without_kubernetes_before_touching_slurm(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "recover", "coordinator", "serve", "--state-dir",
         str(tmp_path / "state"), "--slurm-conf", str(tmp_path / "no-slurm.conf"),
         "--lease", "kube"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--lease kube needs Kubernetes: --kubeconfig PATH or --in-cluster" in done.stderr
