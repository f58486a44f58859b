"""Helpers for building job manifests in API tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest

BASE_JOB: dict[str, Any] = {
    "apiVersion": "asyncgrpo.dev/v1alpha1",
    "kind": "AsyncGRPOJob",
    "metadata": {"name": "job"},
    "spec": {
        "image": "trainer:latest",
        "trainer": {"grpo": {"numPromptsPerStep": 8, "numGenerationsPerPrompt": 4}},
    },
}


def job_with(**trainer_blocks: dict[str, Any]) -> dict[str, Any]:
    """BASE_JOB with the given spec.trainer blocks merged in (P=8, N=4 unless overridden)."""
    job = copy.deepcopy(BASE_JOB)
    trainer = job["spec"]["trainer"]
    for block, values in trainer_blocks.items():
        trainer.setdefault(block, {}).update(values)
    return job


@pytest.fixture
def base_job() -> dict[str, Any]:
    return copy.deepcopy(BASE_JOB)
