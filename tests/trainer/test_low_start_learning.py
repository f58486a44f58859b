"""The real-model path learns from a lower start than the warm start's: more than the stop.

The warm start of the other real-model tests (`warm_qwen2`: 600 supervised steps on 3- and 5-digit
reversal) answers a 4-digit prompt with all four digits reversed and a fifth too many, so GRPO
mostly teaches it to stop. The checkpoint here is the same warm start stopped after WARM_STEPS
steps: its answers have the first three digits right but the fourth on only about two prompts in
three (measured on this machine: 0.64 of 100 held-out prompts), so held-out exact-match accuracy is
below 0.1 before the first step and GRPO has to teach it the fourth digit as well as the stop. The
learning job (learning_job.yaml, async in order, its seed) must take it to BAR within STEPS steps.
As run here (its seed, 42) it went 0.00 / 0.14 / 0.58 / 0.41 / 0.87 / 0.97 / 0.98 at steps 0-60, in
50-120 s after an 18 s warm start (2-core machine at load 5-9, 2026-12-02). Over seeds 1-5 and 42
the same job over 80 steps ended at 0.52-1.00, and at step 40 all were at 0.38 or more, hence a
bar well below what the test's seed reaches; bench/models/sample_efficiency.py (the low-start
case) measures every mode over seeds. The curve repeats because CPU decodes per group by default
(generation.torchDecode auto): batched, the same job ended at step 60 anywhere from 0.0 to 1.0 over
7 runs (docs/benchmarks.md, "The batched decode on CPU").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_trainer import driver

JOB = Path(__file__).with_name("learning_job.yaml")
WARM_STEPS = 80
"""Of the 600 supervised steps `--warm-start` takes by default."""
STEPS = 60
BAR = 0.3
"""Held-out greedy exact accuracy at step STEPS, from below 0.1 at step 0."""

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.fixture(scope="module")
def low_start_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made in a fresh interpreter, as the full warm start is (tests/trainer/conftest.py says why)."""
    path = tmp_path_factory.mktemp("low-start") / "tiny-qwen2"
    made = subprocess.run(
        [sys.executable, "-m", "asyncgrpo_cli.main", "make-tiny-checkpoint", str(path),
         "--hidden-size", "128", "--heads", "4", "--intermediate-size", "512",
         "--warm-start", "--warm-start-steps", str(WARM_STEPS)],
        capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    accuracy = json.loads(made.stdout.strip().splitlines()[-1])["warm_start"]["accuracy_by_digits"]
    assert accuracy["4"] < 0.1, accuracy
    return path


def _manifest(model: Path, checkpoints: Path) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["metadata"]["name"] = "low-start"
    job["spec"]["checkpoint"] = {"path": str(checkpoints), "everySteps": 1000}
    job["spec"]["trainer"]["model"]["path"] = str(model)
    job["spec"]["trainer"]["grpo"]["maxNumSteps"] = STEPS
    return job


@pytest.mark.budget(400, "a warm start and STEPS steps: the real-model path learning more than the stop")
def test_a_checkpoint_that_gets_the_fourth_digit_wrong_learns_it_and_the_stop(
    ray_address: str, low_start_checkpoint: Path, tmp_path: Path
) -> None:
    summary = driver.execute(_manifest(low_start_checkpoint, tmp_path))
    held_out = {
        r["step"]: r["validation_accuracy"] for r in summary["records"] if r.get("event") == "validation"
    }
    assert held_out[0] < 0.1, held_out
    assert held_out[STEPS] >= BAR, held_out
