"""``recover checkpoint import-orbax``: checkpoints written here by Orbax itself (the version
the ``orbax`` extra installs) become verified checkpoints of ours that restore bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from recover import main
from recovery.api import CheckpointExistsError, CheckpointManager, UsageError, import_orbax
from tests.api.helpers import dtype_leaves, leaves_equal, make_train_state, train


def orbax_manager_dir(path: Path, states: dict[int, Any], **items: Any) -> Path:
    """An Orbax CheckpointManager directory with one save per step (plain, or with extra
    named items when ``items`` is given: ``args.Composite``)."""
    mgr = ocp.CheckpointManager(path)
    for step, state in states.items():
        if items:
            args = ocp.args.Composite(state=ocp.args.StandardSave(state), **items)
            mgr.save(step, args=args)
        else:
            mgr.save(step, args=ocp.args.StandardSave(state))
    mgr.wait_until_finished()
    mgr.close()
    return path


def orbax_single_save(path: Path, state: Any) -> Path:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    return path


@pytest.mark.slow
def test_manager_directory_imports_and_restores_bit_for_bit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    states = {3: train(make_train_state(), 0, 3), 6: train(make_train_state(), 0, 6)}
    src = orbax_manager_dir(tmp_path / "orbax", states)
    out = tmp_path / "run" / "checkpoints"
    assert main(["checkpoint", "import-orbax", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step 3: imported" in printed
    assert "step 6: imported" in printed
    assert main(["checkpoint", "verify", str(tmp_path / "run")]) == 0
    assert "step 6: intact" in capsys.readouterr().out

    template = jax.eval_shape(lambda: train(make_train_state(), 0, 1))
    with CheckpointManager(out) as mgr:
        assert mgr.steps() == [3, 6]
        restored = mgr.restore(template)
        assert restored.step == 6
        assert leaves_equal(restored.state, states[6])
        assert leaves_equal(mgr.restore(template, step=3).state, states[3])
        assert not leaves_equal(restored.state, states[3])
        assert restored.metadata["orbax_step"] == 6
        # and training goes on from it as from the original
        assert leaves_equal(train(restored.state, 6, 8), train(states[6], 6, 8))


def test_single_save_with_every_dtype(tmp_path: Path) -> None:
    state = dtype_leaves(seed=9)
    del state["empty"]  # Orbax refuses zero-size arrays
    src = orbax_single_save(tmp_path / "single", state)
    (done,) = import_orbax(src, tmp_path / "ours", step=40)
    assert done.step == 40
    assert done.leaves == len(state)
    mgr = CheckpointManager(tmp_path / "ours", read_only=True)
    assert mgr.verify(40).state_digest == done.state_digest
    restored = mgr.restore_arrays().state
    for name, leaf in state.items():
        want = np.asarray(leaf)
        got = restored[name]
        assert got.dtype == want.dtype, name
        assert got.tobytes() == want.tobytes(), name


def test_composite_items_and_json(tmp_path: Path) -> None:
    state = {"w": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(4)}
    src = orbax_manager_dir(
        tmp_path / "orbax",
        {5: state},
        opt=ocp.args.StandardSave({"mu": jnp.ones(3)}),
        meta=ocp.args.JsonSave({"dataset": "synthetic", "epoch": 2}),
    )
    import_orbax(src, tmp_path / "both")
    both = CheckpointManager(tmp_path / "both", read_only=True).restore_arrays()
    assert sorted(both.state) == ["opt/mu", "state/n", "state/w"]
    assert both.metadata["orbax_json"] == {"meta": {"dataset": "synthetic", "epoch": 2}}
    import_orbax(src, tmp_path / "one", item="state", run_config={"seed": 0})
    one = CheckpointManager(tmp_path / "one", read_only=True, run_config={"seed": 0})
    assert leaves_equal(one.restore({"w": jnp.zeros((2, 3)), "n": jnp.int32(0)}).state, state)


def test_bad_sources_are_refused_with_what_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = orbax_manager_dir(tmp_path / "orbax", {1: {"w": jnp.ones(2)}, 2: {"w": jnp.ones(2)}})
    with pytest.raises(UsageError, match=r"Unknown step 9 .*Known: 1, 2"):
        import_orbax(src, tmp_path / "a", step=9)
    with pytest.raises(UsageError, match=r"Unknown item 'x' .*Known: default"):
        import_orbax(src, tmp_path / "a", item="x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="is not an Orbax checkpoint"):
        import_orbax(tmp_path / "empty", tmp_path / "a")
    import_orbax(src, tmp_path / "b", step=2)
    with pytest.raises(CheckpointExistsError, match="already holds step"):
        import_orbax(src, tmp_path / "b")
    assert CheckpointManager(tmp_path / "b", read_only=True).steps() == [2]  # nothing lost
    rc = main(["checkpoint", "import-orbax", str(src), "--out", "x", "--run-config", "[1]"])
    assert rc == 2
    assert "must be a JSON object" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").glob("step_*"))
