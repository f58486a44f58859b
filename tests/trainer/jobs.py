"""Job manifests for the trainer tests: the shipped digit-reversal task in each of the four modes."""

from __future__ import annotations

import copy
from typing import Any

from asyncgrpo_trainer.bench import MODES as BENCH_MODES
from asyncgrpo_trainer.bench import N, P

MODES: dict[str, dict[str, Any]] = {
    name: BENCH_MODES[name] for name in ("sync", "async-in-order", "streaming-gated", "streaming-oversampled")
}
"""The four modes of the knob table, exactly as the CPU benchmark runs them."""


def manifest(
    mode: str, *, steps: int, checkpoint_dir: str, name: str = "t", **trainer: Any
) -> dict[str, Any]:
    """A CPU job of the arithmetic task in `mode`; `trainer` entries override trainer blocks."""
    job: dict[str, Any] = {
        "apiVersion": "asyncgrpo.dev/v1alpha1",
        "kind": "AsyncGRPOJob",
        "metadata": {"name": name},
        "spec": {
            "image": "asyncgrpo/trainer:test",
            "checkpoint": {"path": checkpoint_dir, "everySteps": 1000, "keepLast": 2},
            "cluster": {
                "policyWorkers": {"replicas": 1, "gpusPerReplica": 0},
                "generationWorkers": {"replicas": 1, "gpusPerReplica": 0},
            },
            "trainer": {
                "model": {
                    "tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "numKvHeads": 2},
                    "maxSequenceLength": 32,
                },
                "grpo": {
                    "numPromptsPerStep": P,
                    "numGenerationsPerPrompt": N,
                    "maxNumSteps": steps,
                    "seed": 1,
                    "valAtEnd": False,
                },
                "asyncRL": copy.deepcopy(MODES[mode]),
                "policy": {"trainMicroBatchSize": 64, "learningRate": 2e-3},
                "generation": {"maxNewTokens": 5},
                "data": {"maxPromptLength": 8, "numValidationPrompts": 10},
            },
        },
    }
    for block, values in trainer.items():
        job["spec"]["trainer"].setdefault(block, {}).update(values)
    return job
