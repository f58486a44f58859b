"""The real-model path in each of the four modes, not only async in order.

The learning job (learning_job.yaml: a Hugging Face Qwen2 checkpoint, its BPE tokenizer and chat
template, the warm start of the session's `warm_qwen2`) runs a few steps in each mode at P = 8
prompts a step (the modes' buffer and streaming sizes of tests/trainer/jobs.py are for 8): every
step trains P x N samples with a gradient, the held-out accuracy is recorded before the first step
and every VAL_PERIOD steps with the weight version that answered it (the step's own), and the mode
keeps its staleness contract. bench/models/sample_efficiency.py measures what each mode learns.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_trainer import driver
from tests.trainer import jobs

JOB = Path(__file__).with_name("learning_job.yaml")
P, N = 8, 8
STEPS = 4
VAL_PERIOD = 2

pytestmark = pytest.mark.trainer


def _manifest(mode: str, model: Path, checkpoints: Path) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["metadata"]["name"] = f"pretrained-{mode}"
    job["spec"]["checkpoint"] = {"path": str(checkpoints), "everySteps": 1000}
    t = job["spec"]["trainer"]
    t["model"]["path"] = str(model)
    t["data"]["numValidationPrompts"] = 16
    t["policy"]["trainMicroBatchSize"] = P * N
    t["grpo"].update(numPromptsPerStep=P, numGenerationsPerPrompt=N, maxNumSteps=STEPS, valPeriod=VAL_PERIOD)
    t["asyncRL"] = jobs.MODES[mode]
    return job


@pytest.mark.parametrize("mode", list(jobs.MODES))
def test_the_real_model_path_trains_and_validates_with_pinned_weights_in_every_mode(
    mode: str, ray_address: str, warm_qwen2: Path, tmp_path: Path
) -> None:
    summary = driver.execute(_manifest(mode, warm_qwen2, tmp_path))
    records = summary["records"]
    steps = [r for r in records if "reward_mean" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["samples_trained"] for r in steps] == [k * P * N for k in range(1, STEPS + 1)]
    assert all(r["grad_norm"] > 0 and math.isfinite(r["loss"]) for r in steps), steps
    validations = [r for r in records if r.get("event") == "validation"]
    assert [(r["step"], r["weight_version"]) for r in validations] == [
        (k, k) for k in range(0, STEPS + 1, VAL_PERIOD)
    ]
    assert all(0.0 <= r["validation_accuracy"] <= 1.0 for r in validations)
    assert summary["validation_accuracy"] == validations[-1]["validation_accuracy"]
    staleness = max(r["max_staleness"] for r in steps)
    assert staleness == 0 if mode == "sync" else staleness <= 1
