"""Bit-exact resume on a real accelerator (skipped, with the reason, where there is none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.train.loop import ResumeMode, TrainOptions, run_training


def _resume_matches_control(tmp_path: Path) -> None:
    def opts(run: str, steps: int, resume: ResumeMode = ResumeMode.never) -> TrainOptions:
        return TrainOptions(
            run_dir=tmp_path / run, steps=steps, save_every=2, model="mlp-small", resume=resume
        )

    control = run_training(opts("control", 6), handle_signals=False)
    run_training(opts("run", 3), handle_signals=False)
    resumed = run_training(opts("run", 6, ResumeMode.required), handle_signals=False)
    assert resumed.updates == 3
    assert resumed.state_digest == control.state_digest


@pytest.mark.gpu
def test_resume_is_bit_exact_on_gpu(tmp_path: Path) -> None:
    import jax

    assert jax.default_backend() == "gpu"
    _resume_matches_control(tmp_path)


@pytest.mark.tpu
def test_resume_is_bit_exact_on_tpu(tmp_path: Path) -> None:
    import jax

    assert jax.default_backend() == "tpu"
    _resume_matches_control(tmp_path)
