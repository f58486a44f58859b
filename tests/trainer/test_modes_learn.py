"""Each of the four modes learns the shipped digit-reversal task from random weights, measured by
held-out greedy exact-match accuracy, which no constant answer or copy of the prompt reaches above
0.013 (tests/trainer/test_envs_and_data.py):

- before the first step the held-out accuracy is below 0.1, after STEPS steps it is at least BAR
  in every mode;
- async with maxStalenessVersions 1 (in order and both streaming modes) ends within 0.05 of sync
  at the same number of trained samples (every mode trains P x N samples a step). By then every
  mode has reached 1.0 (from step 80-110), so this catches an async mode that does not learn, not
  one that learns more slowly: how soon each mode learns, over seeds and before saturation, is
  bench/models/sample_efficiency.py's comparison (docs/benchmarks.md, "Sample efficiency over
  seeds"), too costly for a test;
- the reported validation accuracy is what the final checkpoint's weights score, recomputed here
  outside the trainer;
- each run's TensorBoard files hold the same curves (`asyncgrpo plot` reads them);
- each mode keeps its staleness contract in the per-step records.

One run per mode serves every assertion (module-scoped), so the suite trains 4 x STEPS steps: 13
tests in 16 min on the shared 2-core machine at a load average of 14-23 (2026-12-01).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_trainer import bench, checkpoint, driver, envs, floor, plot, specmap
from asyncgrpo_trainer.backends.policy import POLICY_FILE
from asyncgrpo_trainer.models.tokenizer import CharTokenizer
from tests.trainer import jobs

P, N = 32, 8
"""The issue's shape: 32 prompts x 8 samples a step."""
STEPS = 150
VAL_PERIOD = 30
NUM_VALIDATION = 200
LEARN = {
    # 2e-3 plateaued (sync at 0.685 held-out from step 110 to 150); 1e-3 climbs steadily.
    "policy": {"trainMicroBatchSize": P * N, "learningRate": 1e-3},
    # 0.5 doubles the logits of the tiny model's head (initialised at std 0.02): with temperature 1
    # the floor stayed below 0.45 held-out for 250 steps at every learning rate tried.
    "generation": {"maxNewTokens": 5, "temperature": 0.5},
    "data": {"numValidationPrompts": NUM_VALIDATION},
}
BAR = 0.9
"""Held-out greedy accuracy every mode must reach after STEPS steps: the issue asks 0.8; every mode
measured 1.0 from step 80-110 on with these settings (docs/benchmarks.md), 40+ steps before STEPS."""
SYNC_GAP = 0.05

pytestmark = pytest.mark.slow


@dataclass
class Run:
    summary: dict[str, Any]
    manifest: dict[str, Any]
    checkpoint_path: Path

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.summary["records"] if "reward_mean" in r]

    @property
    def validations(self) -> dict[int, float]:
        return {
            r["step"]: r["validation_accuracy"]
            for r in self.summary["records"]
            if r.get("event") == "validation"
        }


@pytest.fixture(scope="module")
def runs(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    out = {}
    for mode in jobs.MODES:
        path = tmp_path_factory.mktemp(mode)
        manifest = jobs.manifest(
            mode,
            steps=STEPS,
            checkpoint_dir=str(path),
            name=mode,
            grpo={
                "numPromptsPerStep": P,
                "numGenerationsPerPrompt": N,
                "valPeriod": VAL_PERIOD,
                "valAtEnd": True,
            },
            asyncRL=bench.modes(P)[mode],
            **LEARN,
        )
        out[mode] = Run(driver.execute(manifest), manifest, path)
    return out


@pytest.mark.trainer
@pytest.mark.budget(1200, "its first mode trains all four modes STEPS steps (the module's one run per mode)")
@pytest.mark.parametrize("mode", list(jobs.MODES))
def test_every_mode_raises_held_out_accuracy_from_near_zero_to_the_bar(
    mode: str, runs: dict[str, Run]
) -> None:
    run = runs[mode]
    curve = run.validations
    assert sorted(curve) == list(range(0, STEPS + 1, VAL_PERIOD))  # step 0: the untrained model
    assert curve[0] < 0.1, curve
    assert curve[STEPS] >= BAR, curve
    assert run.summary["validation_accuracy"] == curve[STEPS]
    assert [r["step"] for r in run.steps] == list(range(1, STEPS + 1))  # one record per step, in order
    assert run.summary["counters"]["samples_trained"] == STEPS * P * N


@pytest.mark.trainer
@pytest.mark.parametrize("mode", [m for m in jobs.MODES if m != "sync"])
def test_async_with_staleness_one_reaches_syncs_accuracy_at_equal_samples(
    mode: str, runs: dict[str, Run]
) -> None:
    sync, other = runs["sync"], runs[mode]
    assert other.summary["samples"] == sync.summary["samples"]
    assert other.validations[STEPS] >= sync.validations[STEPS] - SYNC_GAP, (
        other.validations,
        sync.validations,
    )


@pytest.mark.trainer
def test_the_reported_validation_accuracy_is_what_the_final_weights_score(runs: dict[str, Run]) -> None:
    """Recomputed outside the trainer: the final checkpoint's master weights, greedy, batched."""
    run = runs["async-in-order"]
    job = AsyncGRPOJob.model_validate(run.manifest)
    t = job.spec.trainer
    env = envs.build(t.env.name)
    tok = CharTokenizer(env.alphabet)
    model = specmap.tiny_recipe(t, tok).instantiate()
    state = torch.load(checkpoint.step_dir(run.checkpoint_path, STEPS) / POLICY_FILE, weights_only=True)
    model.load_state_dict(state["model"])
    held_out = driver.load_prompts(job, env, tok).validation
    assert len(held_out) == NUM_VALIDATION
    recomputed = floor.validate(model.eval(), env, tok, held_out, t.generation.max_new_tokens)
    # Batched and one-by-one greedy decoding may break a near-tie differently: one answer at most.
    assert run.summary["validation_accuracy"] == pytest.approx(recomputed, abs=1.01 / NUM_VALIDATION)


@pytest.mark.trainer
def test_each_run_leaves_tensorboard_curves_that_asyncgrpo_plot_reads(
    runs: dict[str, Run], tmp_path: Path
) -> None:
    for mode, run in runs.items():
        curves = plot.load(run.checkpoint_path)
        per_step = P * N
        assert curves.validation_accuracy == [
            (step * per_step, pytest.approx(acc)) for step, acc in sorted(run.validations.items())
        ], mode
        assert [x for x, _ in curves.accuracy] == [r["samples_trained"] for r in run.steps]
    plot.draw([plot.load(r.checkpoint_path) for r in runs.values()], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 10_000


@pytest.mark.trainer
@pytest.mark.parametrize("mode", list(jobs.MODES))
def test_each_mode_keeps_its_staleness_contract(mode: str, runs: dict[str, Run]) -> None:
    steps = runs[mode].steps
    staleness = [r["max_staleness"] for r in steps]  # by the version a group was dispatched with
    oldest = [r["max_oldest_staleness"] for r in steps]  # by its stamp: the oldest weights that shaped it
    if mode == "sync":
        assert max(staleness) == max(oldest) == 0
    elif mode.startswith("streaming"):  # the window bounds the stamp (docs/guides/async-modes.md)
        assert max(oldest) <= 1, oldest
    else:  # in order: the dispatch version is bounded; a prompt's cached KV may add up to S more
        assert max(staleness) <= 1 and max(oldest) <= 2, (staleness, oldest)
    if mode.startswith("streaming"):
        assert max(r["chunks"] for r in steps) > 1  # steps were streamed in chunks of >= P/2 groups
    if mode != "sync":  # data one version old: the importance weights average about 1
        is_weights = [r["is_weight_mean"] for r in steps]
        assert 0.8 < sum(is_weights) / len(is_weights) < 1.2
