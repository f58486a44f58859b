"""`asyncgrpo run` helpers: where checkpoints go on a laptop, and how many CPUs Ray is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncgrpo_trainer import local_run


def test_a_checkpoint_mount_path_missing_here_is_redirected_to_a_local_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = {"metadata": {"name": "demo"}, "spec": {"checkpoint": {"path": "/checkpoints/demo"}}}
    out = local_run.localize(job, None, None)
    assert out["spec"]["checkpoint"]["path"] == str(tmp_path / ".asyncgrpo" / "demo" / "checkpoints")


def test_explicit_checkpoint_dir_and_step_cap_override_the_job(tmp_path: Path) -> None:
    job = {"metadata": {"name": "demo"}, "spec": {"checkpoint": {"path": str(tmp_path)}}}
    out = local_run.localize(job, str(tmp_path / "mine"), 7)
    assert out["spec"]["checkpoint"]["path"] == str(tmp_path / "mine")
    assert out["spec"]["trainer"]["grpo"]["maxNumSteps"] == 7


def test_an_existing_writable_checkpoint_directory_is_kept(tmp_path: Path) -> None:
    job = {"spec": {"checkpoint": {"path": str(tmp_path)}}}
    assert local_run.localize(job, None, None)["spec"]["checkpoint"]["path"] == str(tmp_path)


def test_required_cpus_counts_one_per_rank_plus_the_controller() -> None:
    job = {"spec": {"cluster": {"policyWorkers": {"replicas": 2}, "generationWorkers": {"replicas": 1}}}}
    assert local_run.required_cpus(job) == 4
    assert local_run.required_cpus({"spec": {}}) == 3
