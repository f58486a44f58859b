"""A learning test's job run through `asyncgrpo run`, and what its step records say: one definition
for every test that proves a recipe learns (reversal, the calculator tool)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def run_job(tmp_path: Path, job: dict[str, Any], models: Path, *, timeout: float) -> list[dict[str, Any]]:
    """Runs `job` with /models mounted from `models`; returns the driver's JSON line records."""
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
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads(line) for line in steps.read_text().splitlines()]


def held_out(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of each validation, the one before the first step included."""
    return [(r["step"], r["validation_accuracy"]) for r in records if r.get("event") == "validation"]


def why(records: list[dict[str, Any]]) -> str:
    """The run's story for a failure message: per step, what it was rewarded, whether its groups
    could train at all (reward spread, groups with zero advantage) and whether the engine sampled
    the policy's distribution (the log-prob gate on fresh samples, the KL on all of them)."""

    def num(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = ["step reward spread zero-adv gate gen-kl"]
    lines += [
        f"{r['step']:>4} {num(r['reward_mean'])} {num(r['reward_spread'])} {num(r['zero_advantage_groups'])} "
        f"{num(r.get('gen_logprob_error'))} {num(r.get('gen_kl_error'))}"
        for r in records
        if r.get("event") == "step"
    ]
    return "\n".join([*lines, f"held-out: {held_out(records)}"])
