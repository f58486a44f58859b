"""generation.torchDecode picks the torch engine's decode path in a job (real Ray, CPU).

auto on CPU decodes each prompt group on its own from its own seed, so a sync run repeats its
samples exactly; batched decodes the groups in flight together (the GPU path, several times the
tokens/s on CPU) and trains on what it generated: the engine's log-probs are the policy's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_trainer import driver
from tests.trainer import jobs

STEPS = 3

pytestmark = pytest.mark.trainer


def _run(tmp_path: Path, name: str, decode: str | None) -> dict[str, Any]:
    job = jobs.manifest("sync", steps=STEPS, checkpoint_dir=str(tmp_path / name), name=name)
    if decode is not None:
        job["spec"]["trainer"]["generation"]["torchDecode"] = decode
    return driver.execute(job)


def _steps(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in summary["records"] if "reward_mean" in r]


def test_cpu_decodes_per_group_by_default_and_a_sync_run_repeats_its_samples(
    ray_address: str, tmp_path: Path
) -> None:
    first, second = _run(tmp_path, "first", None), _run(tmp_path, "second", None)
    assert first["generation_batches"] == 0 == second["generation_batches"]
    rewards = [[r["reward_mean"] for r in _steps(s)] for s in (first, second)]
    assert len(rewards[0]) == STEPS and rewards[0] == rewards[1]
    assert first["counters"]["tokens_generated"] == second["counters"]["tokens_generated"]


def test_torch_decode_batched_decodes_every_step_in_shared_batches_and_trains_on_them(
    ray_address: str, tmp_path: Path
) -> None:
    summary = _run(tmp_path, "batched", "batched")
    steps = _steps(summary)
    assert len(steps) == STEPS
    # Each step's groups (P of them, N rows each) share batches: fewer batches than groups.
    assert STEPS <= summary["generation_batches"] < summary["counters"]["groups_dispatched"]
    assert steps[0]["gen_logprob_error"] == pytest.approx(1.0, abs=1e-4)  # exp|engine - policy|
