"""The shipped reversal task learned through the real-model path, by each generation engine.

A tiny Qwen2 checkpoint (RoPE, a BPE tokenizer, the chat template) warm-started by supervised
fine-tuning on reversing 3- and 5-digit strings (`make-tiny-checkpoint --warm-start`: real RL
starts from a pretrained model, and a random RoPE model this small barely moves on the task under
GRPO) answers 4-digit prompts wrong: held-out exact-match accuracy 0.0 before the first step. The
async job of `learning_job.yaml` through `asyncgrpo run` must then take it to >= 0.8 by step 80,
with LoRA on the torch engine and with vLLM's CPU build (whose first, on-policy step must also pass
the log-prob gate: mean exp|logp_vllm - logp_policy| <= 1.05). The torch engine's full-weight case
is `test_async_keeps_pace.py`, whose seeded async runs carry the same assertions.

Why the recipe is what it is (issue 25; docs/guides/models.md has the sweeps). The vLLM case
stayed at 0.0 in two clean-clone CI runs. Not a vLLM fault: the engine's log-probs equal the
policy's after each of 15 refits, and the torch engine fails the same way on other seeds (at the
old recipe, 16 prompts a step without warm-up, 4 of seeds 13-28 ended below 0.8, one at 0.0). The
torch case never failed in CI because its seed is fixed; vLLM's CPU build samples from an unseeded
generator (`vllm_engine`), so every CI run was a fresh draw. Two ways to fail: the policy sharpens
onto a 5-character answer worth 0.8 before it samples the stop after 4 (then every sample scores
0.8, every advantage is 0, nothing trains), or large noisy steps throw a learned policy away. With
32 prompts a step (twice the groups that carry a signal) and a 10-step warm-up, 1 of 48 seeds
(13-60) ended below 0.8 (0.22), and one more fell from 1.00 to 0.36 on the way; a cosine decay of
the rate to a tenth (policy.learningRateSchedule) took both of those seeds to 1.00. Over 70 steps
it left 1 of seeds 13-44 at 0.70 (slow, still rising); over 80 steps, none below 0.94. A
failure prints the run's story per step: the reward, its spread within groups, the fraction of
groups with zero advantage and the log-prob gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.trainer.learning_runs import held_out, run_job, why

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
JOB = Path(__file__).with_name("learning_job.yaml")


LORA_RECIPE = {"lora": {"rank": 16, "alpha": 16}, "learningRate": 3.0e-3}
"""The LoRA variant's policy settings: the plain job's otherwise (docs/guides/trainer.md, LoRA, says
what they were measured to do). Run with the torch engine only: its sampling is seeded, so the case
is the same run every time; vLLM's CPU build samples unseeded, and a LoRA recipe has no seed sweep
yet to show that every draw learns (test_vllm_lora.py covers vLLM serving the adapters)."""


def _job(backend: str, *, lora: bool = False) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["metadata"]["name"] = f"reverse-{backend}" + ("-lora" if lora else "")
    job["spec"]["trainer"]["generation"]["backend"] = backend
    if lora:
        job["spec"]["trainer"]["policy"].update(LORA_RECIPE)
    return job


@pytest.mark.parametrize(
    ("backend", "lora"),
    [
        ("torch", True),
        pytest.param("vllm", False, marks=pytest.mark.vllm),
    ],
    ids=["torch-lora", "vllm"],
)
@pytest.mark.budget(600, "80 steps of the learning job: the real-model path learns, per engine")
def test_a_warm_started_checkpoint_learns_reversal_in_an_async_job(
    warm_qwen2: Path, tmp_path: Path, backend: str, lora: bool
) -> None:
    records = run_job(tmp_path, _job(backend, lora=lora), warm_qwen2.parent, timeout=1800)
    accuracy = held_out(records)
    assert accuracy[0][0] == 0 and accuracy[0][1] < 0.1, why(records)  # before the first step
    assert accuracy[-1][0] == 80 and accuracy[-1][1] >= 0.8, why(records)
    steps = [r for r in records if r.get("event") == "step"]
    first = steps[0]
    assert first["mean_staleness"] == 0 and first["gen_logprob_error"] <= 1.05, why(records)
