"""Job manifests shared by the webhook unit tests and the webhook e2e tests.

The knob table of docs/guides/async-modes.md, as data: one valid job per mode and one invalid
combination per numbered rule, each with the field path the rejection must name. Keeping it here
means the unit tests (kopf in-process) and the e2e tests (kubectl through a real API server) check
the same cases.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

API_VERSION = "asyncgrpo.dev/v1alpha1"
KIND = "AsyncGRPOJob"
ASYNC_RL = "spec.trainer.asyncRL"

P, N = 8, 4  # numPromptsPerStep, numGenerationsPerPrompt of every job below


def job(
    name: str = "job",
    *,
    async_rl: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A small CPU job (P=8, N=4) with the asyncRL, policy and other trainer blocks and top-level
    spec fields given."""
    manifest: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "image": "trainer:test",
            "trainer": {
                "grpo": {"numPromptsPerStep": P, "numGenerationsPerPrompt": N},
                "asyncRL": dict(async_rl or {}),
                "policy": dict(policy or {}),
            },
        },
    }
    manifest["spec"]["trainer"].update(copy.deepcopy(trainer or {}))
    manifest["spec"].update(copy.deepcopy(spec))
    return manifest


@dataclass(frozen=True)
class Case:
    """One row of the knob table: a job and, for invalid ones, the field the rejection names."""

    id: str
    manifest: dict[str, Any]
    path: str | None = None


VALID_MODES: tuple[Case, ...] = (
    Case("sync", job("sync", async_rl={"maxStalenessVersions": 0, "overSampling": False})),
    Case("async-exact", job("async-exact", async_rl={"maxStalenessVersions": 1, "forceInOrder": True})),
    Case(
        "streaming-gated", job("streaming-gated", async_rl={"maxStalenessVersions": 2, "forceInOrder": False})
    ),
    Case(
        "streaming-oversampled",
        job(
            "streaming-oversampled",
            async_rl={"maxStalenessVersions": 1, "overSampling": True, "maxBufferedRollouts": 3 * P},
        ),
    ),
)

INVALID_COMBINATIONS: tuple[Case, ...] = (
    Case(
        "rule1-sync-with-oversampling",
        job("bad-sync-oversampling", async_rl={"maxStalenessVersions": 0, "overSampling": True}),
        f"{ASYNC_RL}.overSampling",
    ),
    Case(
        "rule2-in-order-with-oversampling",
        job(
            "bad-in-order-oversampling",
            async_rl={"maxStalenessVersions": 1, "overSampling": True, "forceInOrder": True},
        ),
        f"{ASYNC_RL}.forceInOrder",
    ),
    Case(
        "rule3-buffer-not-exact",
        job("bad-buffer-exact", async_rl={"maxStalenessVersions": 1, "maxBufferedRollouts": 2 * P + 1}),
        f"{ASYNC_RL}.maxBufferedRollouts",
    ),
    Case(
        "rule4-chunk-above-p",
        job("bad-chunk", async_rl={"maxStalenessVersions": 1, "minGroupsForStreamingTrain": P + 1}),
        f"{ASYNC_RL}.minGroupsForStreamingTrain",
    ),
    Case(
        "rule5-global-batch",
        job("bad-global-batch", policy={"trainGlobalBatchSize": P * N + 8}),
        "spec.trainer.policy.trainGlobalBatchSize",
    ),
    Case(
        "rule6-oversampled-buffer-too-small",
        job(
            "bad-oversampled-buffer",
            async_rl={"maxStalenessVersions": 1, "overSampling": True, "maxBufferedRollouts": 2 * P - 1},
        ),
        f"{ASYNC_RL}.maxBufferedRollouts",
    ),
)

WEBHOOK_ONLY: tuple[Case, ...] = (
    Case(
        "micro-batch-does-not-divide",
        job("bad-micro-batch", policy={"trainMicroBatchSize": 5}),
        "spec.trainer.policy.trainMicroBatchSize",
    ),
    Case(
        "icepop-without-its-lower-bound",
        job("bad-icepop", trainer={"loss": {"truncatedImportanceSamplingType": "icepop"}}),
        "spec.trainer.loss.truncatedImportanceSamplingType",
    ),
)
"""Rules the chart's ValidatingAdmissionPolicy does not hold (arithmetic over the policy pool; a
nullable field): only the webhook catches them. The knob table above is the policy's too."""

SYNC_WITH_FORCE_IN_ORDER = job(
    "sync-in-order", async_rl={"maxStalenessVersions": 0, "overSampling": False, "forceInOrder": True}
)
"""Accepted with a warning: forceInOrder is ignored in sync mode."""
