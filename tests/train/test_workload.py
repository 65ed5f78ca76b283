"""TPU workloads register on their node while they run; the agent reads the registration."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.contract.workload import any_registered, registered, workload_dir


def test_a_tpu_run_keeps_a_marker_while_it_runs_and_removes_it_after(tmp_path: Path) -> None:
    d = tmp_path / "workloads"
    assert not any_registered(d)  # the folder does not even exist yet
    with registered("tpu", d, pid=4242) as marker:
        assert marker == d / "4242"
        assert any_registered(d)
    assert not any_registered(d)


def test_an_exception_still_removes_the_marker(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), registered("tpu", tmp_path, pid=1):
        raise RuntimeError("training failed")
    assert not any_registered(tmp_path)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_other_backends_register_nothing(tmp_path: Path, backend: str) -> None:
    with registered(backend, tmp_path) as marker:
        assert marker is None
        assert not any_registered(tmp_path)


def test_the_folder_comes_from_the_environment(tmp_path: Path) -> None:
    assert workload_dir({"RECOVER_TPU_WORKLOAD_DIR": str(tmp_path)}) == tmp_path
    assert workload_dir({}) == Path("/run/recover/tpu-workloads")
