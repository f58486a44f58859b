"""The calculator environment learned through the real-model path, by each generation engine
(issue 31 item 2): a tiny Qwen2 checkpoint warm-started on calculator conversations of other shapes
(`tool_warm_start`) cannot multiply two 2-digit numbers, and answers such held-out prompts wrong
before the first step (< 0.1); the async job of `tool_learning_job.yaml` through `asyncgrpo run`
must take it to >= 0.8 by step 80, with the torch engine and with vLLM's CPU build (whose first,
on-policy step must also pass the log-prob gate across the turns of its conversations).

UNVERIFIED: this recipe has not been run to the end on this branch (see tool_warm_start.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.trainer import tool_warm_start

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


def _run(tmp_path: Path, job: dict[str, Any], models: Path) -> list[dict[str, Any]]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    steps = tmp_path / "steps.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncgrpo_cli.main",
            "run",
            str(path),
            "--mount",
            f"/models={models}",
            "--checkpoint-dir",
            str(tmp_path / "checkpoints"),
            "--jsonl",
            str(steps),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads(line) for line in steps.read_text().splitlines()]


def _held_out(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(r["step"], r["validation_accuracy"]) for r in records if r.get("event") == "validation"]


def _why(records: list[dict[str, Any]]) -> str:
    lines = ["step reward spread zero-adv gate"]
    lines += [
        f"{r['step']:>4} {r['reward_mean']:.3f} {r['reward_spread']:.3f} {r['zero_advantage_groups']:.3f} "
        f"{r.get('gen_logprob_error')}"
        for r in records
        if r.get("event") == "step"
    ]
    return "\n".join([*lines, f"held-out: {_held_out(records)}"])


@pytest.mark.parametrize("backend", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_a_warm_started_checkpoint_learns_to_call_the_calculator(
    tool_qwen2: Path, tmp_path: Path, backend: str
) -> None:
    records = _run(tmp_path, _job(backend), tool_qwen2.parent)
    held_out = _held_out(records)
    assert held_out[0][0] == 0 and held_out[0][1] < 0.1, _why(records)  # before the first step
    assert held_out[-1][0] == 80 and held_out[-1][1] >= 0.8, _why(records)
    first = next(r for r in records if r.get("event") == "step")
    assert first["gen_logprob_error"] is None or first["gen_logprob_error"] <= 1.05, _why(records)
