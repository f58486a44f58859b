"""Async keeps most of sync's pace per sample on the real-model path: issue 46's check that can fail.

The product's promise is that async reaches an accuracy sooner than sync; it can only do so if one
step of staleness costs little per sample. Until 2026-12-07 it cost most of it: on this case
(`learning_job.yaml`, the warm-started tiny Qwen2 learning 4-digit reversal) every async mode's
area under held-out accuracy was 0.24-0.26 against sync's 0.57 over 5 seeds and 30 steps, because
stale samples were importance-weighted by pi_old / pi_generation, which put each step's signal on
the few tokens the last update moved most (docs/guides/async-modes.md). Unweighted (the default
for a checkpoint: `loss.importanceSamplingOnStaleData` unset), async-in-order's area was 0.52.

Here each of SEEDS runs the job STEPS steps in sync and in async-in-order, before the curves
saturate. Both modes repeat a seeded run on the torch engine whatever the machine's load (sync
trivially; async-in-order because it drains before each refit, so batch k always comes from
weights k - 1: `asyncRL.drainBeforeRefit`), so the verdict is the code's, not the machine's: the
sync curves below came out the same to the last digit at load 2.5 and at 7. Measured on the 2-core
machine, seeds 1-3, 15 steps (docs/benchmarks.md, "Issue 46: the check that can fail"):

| | async-in-order's area / sync's | sync's mean end - async-in-order's |
|---|---|---|
| today's default (stale samples unweighted) | 0.73 | 0.15 |
| stale samples weighted (the default before) | 0.05 | 0.48 |

AREA_RATIO and END_GAP sit between the two. The issue's goal, an area within 10% of sync's, is
not met here (0.73): see docs/guides/async-modes.md.

The async runs also carry what `test_pretrained_learning.py`'s torch case proved before it was
merged here: the torch engine's real-model path learns (the best seed past 0.8) and its first,
on-policy step passes the log-prob gate.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import pytest
import yaml

from asyncgrpo_trainer import bench, driver
from asyncgrpo_trainer.learning_curves import area_under

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

JOB = Path(__file__).with_name("learning_job.yaml")
SEEDS = (1, 2, 3)
STEPS = 15
VALIDATE_EVERY = 5
AREA_RATIO = 0.4
END_GAP = 0.35
MODES = ("sync", "async-in-order")


@dataclass(frozen=True)
class Run:
    held_out: dict[int, float]
    first_step: dict[str, Any]


def job_for(mode: str, seed: int, model: Path, checkpoints: Path, **loss: Any) -> dict[str, Any]:
    """The learning job in `mode` with `seed`, over STEPS steps; `loss` sets loss fields."""
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["metadata"]["name"] = f"pace-{mode}-{seed}"
    job["spec"]["checkpoint"] = {"path": str(checkpoints), "everySteps": 1000}
    t = job["spec"]["trainer"]
    t["model"]["path"] = str(model)
    t["grpo"].update(seed=seed, maxNumSteps=STEPS, valPeriod=VALIDATE_EVERY)
    t["asyncRL"] = bench.modes(t["grpo"]["numPromptsPerStep"])[mode]
    t.setdefault("loss", {}).update(loss)
    return job


def run(job: dict[str, Any]) -> Run:
    records = driver.execute(copy.deepcopy(job))["records"]
    held_out = {r["step"]: r["validation_accuracy"] for r in records if r.get("event") == "validation"}
    return Run(held_out, next(r for r in records if "reward_mean" in r))


def runs_of(model: Path, where: Path, modes: tuple[str, ...] = MODES, **loss: Any) -> dict[str, list[Run]]:
    """Each mode's run per seed."""
    return {
        mode: [run(job_for(mode, seed, model, where / f"{mode}-{seed}", **loss)) for seed in SEEDS]
        for mode in modes
    }


def verdict(runs: dict[str, list[Run]]) -> tuple[float, float, str]:
    """(async's mean area / sync's, sync's mean end minus async's, the curves for a failure)."""
    # Every mode trains the same P x N samples a step, so steps stand for samples trained.
    area = {m: mean(area_under(sorted(r.held_out.items())) for r in runs[m]) for m in MODES}
    end = {m: mean(r.held_out[STEPS] for r in runs[m]) for m in MODES}
    shown = "\n".join(f"{m} seed {s}: {runs[m][i].held_out}" for m in MODES for i, s in enumerate(SEEDS))
    return area["async-in-order"] / area["sync"], end["sync"] - end["async-in-order"], shown


@pytest.mark.budget(
    900, "6 seeded runs of 15 steps (290 s alone, 778 s at load 9-16): the one check of async's pace"
)
def test_async_in_order_keeps_most_of_syncs_pace_per_sample_before_either_saturates(
    ray_address: str, warm_qwen2: Path, tmp_path: Path
) -> None:
    runs = runs_of(warm_qwen2, tmp_path)
    ratio, gap, shown = verdict(runs)
    assert all(r.held_out[0] < 0.1 for m in MODES for r in runs[m]), shown  # every run starts low
    assert ratio >= AREA_RATIO, f"async's area is {ratio:.2f} of sync's\n{shown}"
    assert gap <= END_GAP, f"async ends {gap:.2f} below sync\n{shown}"
    assert max(r.held_out[STEPS] for r in runs["async-in-order"]) >= 0.8, shown
    for first in (r.first_step for r in runs["async-in-order"]):
        assert first["mean_staleness"] == 0 and first["gen_logprob_error"] <= 1.05, first
