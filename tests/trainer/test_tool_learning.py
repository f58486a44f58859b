"""The calculator environment learned through the real-model path, by each generation engine
(issue 31 item 2): a tiny Qwen2 checkpoint warm-started on calculator conversations of other shapes
(`tool_warm_start`) cannot multiply two 2-digit numbers, and answers such held-out prompts wrong
before the first step (< 0.1); the async job of `tool_learning_job.yaml` through `asyncgrpo run`
must take it to >= 0.8 by step 80, with the torch engine and with vLLM's CPU build (whose first,
on-policy step must also pass the log-prob gate across the turns of its conversations).

UNVERIFIED: this recipe has not been run to the end on this branch (see tool_warm_start.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.trainer import tool_warm_start
from tests.trainer.learning_runs import held_out, run_job, why

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
JOB = Path(__file__).with_name("tool_learning_job.yaml")
WARM_START_STEPS = 600


@pytest.fixture(scope="module")
def tool_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warm-started checkpoint, made once for both engines (minutes on 2 cores)."""
    return tool_warm_start.make(
        tmp_path_factory.mktemp("models") / "tool-qwen2", steps=WARM_START_STEPS, seed=0
    )


def _job(backend: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(JOB.read_text())
    job["metadata"]["name"] = f"calculator-{backend}"
    job["spec"]["trainer"]["generation"]["backend"] = backend
    return job


@pytest.mark.parametrize("backend", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_a_warm_started_checkpoint_learns_to_call_the_calculator(
    tool_qwen2: Path, tmp_path: Path, backend: str
) -> None:
    records = run_job(tmp_path, _job(backend), tool_qwen2.parent, timeout=3600)
    accuracy = held_out(records)
    assert accuracy[0][0] == 0 and accuracy[0][1] < 0.1, why(records)  # before the first step
    assert accuracy[-1][0] == 80 and accuracy[-1][1] >= 0.8, why(records)
    first = next(r for r in records if r.get("event") == "step")
    assert first["gen_logprob_error"] is None or first["gen_logprob_error"] <= 1.05, why(records)
