"""Async-in-order learns about as fast per sample as sync, before either saturates (issue 46's check).

The learning tests that end at a bar every mode reaches cannot see an async mode that learns more
slowly; this compares the two modes part way, where the curves are still rising. The real-model
case of `bench/models/sample_efficiency.py`: the warm-started tiny Qwen2 and the job of
`learning_job.yaml`, each mode over seeds 1-3, held-out greedy accuracy after 20 steps (every mode
trains the same 32 x 8 samples a step). The torch engine's sampling is seeded, and in-order
dispatch with one step of staleness trains step k on the samples of weights k-1 whatever the
machine's load, so each run is the same on every run of the suite (measured: the same curves on
this 2-core machine at load 4 and on a 16-core machine at load 20-25).

Measured on this machine (docs/benchmarks.md, "Issue 46: the cause"), held-out at step 20, seeds
1-3: sync 0.86 / 0.99 / 0.88 (mean 0.91); async-in-order with stale samples weighted by
pi_old / pi_gen, the trainer before the fix, 0.06 / 0.48 / 0.30 (mean 0.28, 0.31 of sync's); with
them unweighted, 0.99 / 0.58 / 0.90 (mean 0.82, 0.90 of sync's). The bar, 0.75 of sync's mean,
sits between the two.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_trainer import bench
from tests.trainer.learning_runs import held_out, run_job, why

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
JOB = Path(__file__).with_name("learning_job.yaml")
SEEDS = (1, 2, 3)
STEPS = 20
SHARE_OF_SYNC = 0.75
"""Async-in-order's mean held-out accuracy at STEPS must be at least this share of sync's."""


def _job(mode: str, seed: int) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["metadata"]["name"] = f"speed-{mode}-{seed}"
    trainer = job["spec"]["trainer"]
    trainer["grpo"].update(seed=seed, maxNumSteps=STEPS, valPeriod=STEPS)
    trainer["asyncRL"] = bench.modes(trainer["grpo"]["numPromptsPerStep"])[mode]
    return job


@pytest.mark.budget(720, "6 runs of 20 steps: the one check that async does not learn slower than sync")
def test_async_in_order_learns_about_as_fast_as_sync_before_either_saturates(
    warm_qwen2: Path, tmp_path: Path
) -> None:
    reached: dict[str, list[float]] = {}
    stories: list[str] = []
    for mode in ("sync", "async-in-order"):
        for seed in SEEDS:
            where = tmp_path / f"{mode}-{seed}"
            where.mkdir()
            records = run_job(where, _job(mode, seed), warm_qwen2.parent, timeout=900)
            (start, before), *_, (last, after) = held_out(records)
            assert start == 0 and before < 0.1 and last == STEPS, why(records)  # from below, to the end
            reached.setdefault(mode, []).append(after)
            stories.append(f"{mode}, seed {seed}:\n{why(records)}")
    sync, in_order = (statistics.fmean(reached[m]) for m in ("sync", "async-in-order"))
    assert sync >= 0.5, (reached, *stories)  # pre-saturation, yet learning: the comparison means something
    assert in_order >= SHARE_OF_SYNC * sync, (reached, *stories)
