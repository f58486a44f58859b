"""Every invariant of the knob table, accepted and rejected, with the field named in the error."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncgrpo_api.rules import generation_backend, locked_changes, refit_transport, validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob

from .conftest import BASE_JOB, job_with

ASYNC_RL = "spec.trainer.asyncRL"

# (id, manifest, field path that must be named, text the message must contain)
REJECTED: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "1-sync-mode-over-sampling",
        job_with(asyncRL={"maxStalenessVersions": 0, "overSampling": True, "forceInOrder": False}),
        f"{ASYNC_RL}.overSampling",
        "must be false when maxStalenessVersions is 0",
    ),
    (
        "2-in-order-with-over-sampling",
        job_with(asyncRL={"maxStalenessVersions": 1, "overSampling": True, "forceInOrder": True}),
        f"{ASYNC_RL}.forceInOrder",
        "cannot be true when overSampling is true",
    ),
    (
        "3-gated-capacity-not-exact",
        job_with(asyncRL={"maxStalenessVersions": 1, "overSampling": False, "maxBufferedRollouts": 12}),
        f"{ASYNC_RL}.maxBufferedRollouts",
        "must equal numPromptsPerStep x (maxStalenessVersions + 1) = 8 x 2 = 16 when overSampling is false; "
        "got 12",
    ),
    (
        "4-chunk-larger-than-step",
        job_with(asyncRL={"minGroupsForStreamingTrain": 9}),
        f"{ASYNC_RL}.minGroupsForStreamingTrain",
        "must be at most numPromptsPerStep (8)",
    ),
    (
        "5-global-batch-not-a-divisor-of-p-times-n",
        job_with(policy={"trainGlobalBatchSize": 64}),
        "spec.trainer.policy.trainGlobalBatchSize",
        "must divide numPromptsPerStep x numGenerationsPerPrompt = 8 x 4 = 32 (each RL step is 32 / "
        "trainGlobalBatchSize optimizer steps); got 64",
    ),
    (
        "6-over-sampled-capacity-too-small",
        job_with(asyncRL={"maxStalenessVersions": 2, "overSampling": True, "maxBufferedRollouts": 23}),
        f"{ASYNC_RL}.maxBufferedRollouts",
        "must be at least numPromptsPerStep x (maxStalenessVersions + 1) = 8 x 3 = 24",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "path", "text"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_each_knob_table_violation_is_rejected_naming_its_field(
    manifest: dict[str, Any], path: str, text: str
) -> None:
    report = validate_manifest(manifest)
    assert not report.ok
    assert report.job is None
    matching = [e for e in report.errors if e.path == path]
    assert matching, f"no error at {path}: {[str(e) for e in report.errors]}"
    assert text in matching[0].message


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("sync", job_with(asyncRL={"maxStalenessVersions": 0, "overSampling": False, "maxBufferedRollouts": 8})),
    (
        "async-exact",
        job_with(
            asyncRL={
                "maxStalenessVersions": 1,
                "overSampling": False,
                "forceInOrder": True,
                "maxBufferedRollouts": 16,
            }
        ),
    ),
    (
        "streaming-gated",
        job_with(
            asyncRL={
                "maxStalenessVersions": 3,
                "overSampling": False,
                "forceInOrder": False,
                "minGroupsForStreamingTrain": 8,
                "maxBufferedRollouts": 32,
            }
        ),
    ),
    (
        "streaming-over-sampled",
        job_with(
            asyncRL={
                "maxStalenessVersions": 1,
                "overSampling": True,
                "forceInOrder": False,
                "minGroupsForStreamingTrain": 1,
                "maxBufferedRollouts": 100,
            }
        ),
    ),
    ("over-sampled-forceInOrder-unset", job_with(asyncRL={"maxStalenessVersions": 1, "overSampling": True})),
    ("explicit-global-batch", job_with(policy={"trainGlobalBatchSize": 32})),
    ("ppo-mini-batches", job_with(policy={"trainGlobalBatchSize": 16})),
    ("top-p-and-top-k", job_with(generation={"topP": 0.9, "topK": 5})),
]


@pytest.mark.parametrize("manifest", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_each_mode_of_the_knob_table_is_accepted(manifest: dict[str, Any]) -> None:
    report = validate_manifest(manifest)
    assert report.ok, [str(e) for e in report.errors]
    assert report.job is not None


def test_defaults_derive_capacity_chunk_and_batch_from_p_n_and_s() -> None:
    job = validate_manifest(job_with(asyncRL={"maxStalenessVersions": 3})).job
    assert job is not None
    trainer = job.spec.trainer
    assert trainer.max_buffered_rollouts == 8 * 4
    assert trainer.min_groups_for_streaming_train == 8
    assert trainer.train_global_batch_size == 32
    assert trainer.max_inflight_prompts == 32
    assert trainer.force_in_order is True


def test_over_sampling_defaults_force_in_order_off() -> None:
    job = validate_manifest(job_with(asyncRL={"overSampling": True})).job
    assert job is not None and job.spec.trainer.force_in_order is False


@pytest.mark.parametrize(
    ("async_rl", "drains"),
    [
        ({}, True),  # async-in-order: the exact, reproducible schedule
        ({"drainBeforeRefit": False}, False),
        ({"forceInOrder": False}, False),  # streaming-gated
        ({"overSampling": True}, False),
        ({"maxStalenessVersions": 0}, False),  # sync: nothing is in flight at a refit
        ({"overSampling": True, "drainBeforeRefit": True}, True),
    ],
)
def test_the_drain_before_a_refit_is_on_by_default_in_async_in_order_mode_only(
    async_rl: dict[str, Any], drains: bool
) -> None:
    job = validate_manifest(job_with(asyncRL=async_rl)).job
    assert job is not None and job.spec.trainer.drain_before_refit is drains


@pytest.mark.parametrize(
    ("blocks", "weighted"),
    [
        (
            {"model": {"source": "pretrained", "path": "/models/qwen"}},
            False,
        ),  # issue 46: 0.92x sync, not 0.42x
        ({}, True),  # the tiny model from random weights learned faster with it
        (
            {
                "model": {"source": "pretrained", "path": "/models/qwen"},
                "loss": {"importanceSamplingOnStaleData": True},
            },
            True,
        ),
        ({"loss": {"importanceSamplingOnStaleData": False}}, False),
    ],
)
def test_stale_samples_are_weighted_by_default_for_the_tiny_model_only(
    blocks: dict[str, Any], weighted: bool
) -> None:
    job = validate_manifest(job_with(**blocks)).job
    assert job is not None and job.spec.trainer.importance_sampling_on_stale_data is weighted


def test_force_in_order_in_sync_mode_is_accepted_with_a_warning() -> None:
    report = validate_manifest(job_with(asyncRL={"maxStalenessVersions": 0, "forceInOrder": True}))
    assert report.ok
    assert any(
        w.path == f"{ASYNC_RL}.forceInOrder" and "ignored in sync mode" in w.message for w in report.warnings
    )


def test_sync_mode_without_force_in_order_has_no_sync_warning() -> None:
    report = validate_manifest(job_with(asyncRL={"maxStalenessVersions": 0}))
    assert not any(w.path == f"{ASYNC_RL}.forceInOrder" for w in report.warnings)


def test_every_violation_is_reported_not_only_the_first() -> None:
    manifest = job_with(
        asyncRL={
            "maxStalenessVersions": 0,
            "overSampling": True,
            "forceInOrder": True,
            "minGroupsForStreamingTrain": 99,
        },
        policy={"trainGlobalBatchSize": 5},
    )
    paths = {e.path for e in validate_manifest(manifest).errors}
    assert {
        f"{ASYNC_RL}.overSampling",
        f"{ASYNC_RL}.forceInOrder",
        f"{ASYNC_RL}.minGroupsForStreamingTrain",
        "spec.trainer.policy.trainGlobalBatchSize",
    } <= paths


@pytest.mark.parametrize(
    ("spec_patch", "path", "text"),
    [
        (
            {"trainer": {"policy": {"backend": "megatron"}}},
            "spec.cluster.policyWorkers.gpusPerReplica",
            "needs GPUs",
        ),
        (
            {"trainer": {"generation": {"backend": "vllm"}}},
            "spec.trainer.generation.backend",
            "vllm serves Hugging Face checkpoints",
        ),
        (
            {
                "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 6}},
                "trainer": {"policy": {"backend": "megatron", "megatron": {"tensorParallelSize": 4}}},
            },
            "spec.trainer.policy.megatron",
            "must divide the policy pool's 6 GPUs",
        ),
        (
            {
                "cluster": {"generationWorkers": {"replicas": 2, "gpusPerReplica": 2}},
                "trainer": {"generation": {"backend": "vllm", "tensorParallelSize": 4}},
            },
            "spec.trainer.generation.tensorParallelSize",
            "must divide spec.cluster.generationWorkers.gpusPerReplica (2)",
        ),
        (
            {"cluster": {"policyWorkers": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}},
            "spec.cluster.policyWorkers.resources.limits",
            "use gpusPerReplica",
        ),
        (
            {"trainer": {"generation": {"colocated": True}}},
            "spec.cluster.generationWorkers.replicas",
            "must be 0 when generation.colocated is true",
        ),
        (
            {
                "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 4}},
                "trainer": {"policy": {"backend": "megatron", "megatron": {"pipelineParallelSize": 2}}},
            },
            "spec.trainer.policy.megatron.pipelineParallelSize",
            "tensor and data parallelism only",
        ),
        (
            {
                "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 4}},
                "trainer": {"policy": {"backend": "megatron", "megatron": {"contextParallelSize": 2}}},
            },
            "spec.trainer.policy.megatron.contextParallelSize",
            "tensor and data parallelism only",
        ),
        (
            {
                "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 8}},
                "trainer": {
                    "model": {"tiny": {"hiddenSize": 48, "numHeads": 6, "numKvHeads": 3}},
                    "policy": {"backend": "megatron", "megatron": {"tensorParallelSize": 4}},
                },
            },
            "spec.trainer.policy.megatron.tensorParallelSize",
            "must divide model.tiny.numHeads (6)",
        ),
        (
            {
                "cluster": {
                    "policyWorkers": {"replicas": 1, "gpusPerReplica": 2},
                    "generationWorkers": {"replicas": 0},
                },
                "trainer": {
                    "generation": {"backend": "vllm", "colocated": True, "tensorParallelSize": 2},
                    "model": {"source": "pretrained", "path": "/models/qwen2.5-0.5b"},
                },
            },
            "spec.trainer.generation.tensorParallelSize",
            "must be 1 when generation.colocated is true",
        ),
    ],
    ids=[
        "megatron-without-gpus",
        "vllm-with-the-tiny-model",
        "tp-pp-not-dividing-pool",
        "vllm-tp-not-dividing-pod",
        "gpu-in-resources",
        "colocated-with-pool",
        "megatron-pipeline-parallel",
        "megatron-context-parallel",
        "megatron-tp-splitting-heads",
        "colocated-vllm-with-tp",
    ],
)
def test_gpu_layouts_that_cannot_be_placed_are_rejected(
    base_job: dict[str, Any], spec_patch: dict[str, Any], path: str, text: str
) -> None:
    _merge(base_job["spec"], spec_patch)
    errors = validate_manifest(base_job).errors
    assert any(e.path == path and text in e.message for e in errors), [str(e) for e in errors]


def test_a_valid_gpu_layout_is_accepted(base_job: dict[str, Any]) -> None:
    _merge(
        base_job["spec"],
        {
            "cluster": {
                "policyWorkers": {"replicas": 2, "gpusPerReplica": 4},
                "generationWorkers": {"replicas": 1, "gpusPerReplica": 4},
            },
            "trainer": {
                "policy": {
                    "backend": "megatron",
                    "trainMicroBatchSize": 4,
                    "megatron": {"tensorParallelSize": 2},
                },
                "generation": {"backend": "vllm", "tensorParallelSize": 2},
                "weightSync": {"transport": "nccl"},
                "model": {"source": "pretrained", "path": "/models/qwen2.5-0.5b"},
            },
        },
    )
    report = validate_manifest(base_job)
    assert report.ok, [str(e) for e in report.errors]


MEGATRON_ON_GPUS = {
    "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 1}},
    "trainer": {"policy": {"backend": "megatron"}},
}


@pytest.mark.parametrize(
    ("trainer", "path", "text"),
    [
        (
            {"policy": {"trainGlobalBatchSize": 16}},
            "spec.trainer.policy.trainGlobalBatchSize",
            "(PPO mini-batches) runs on the torch policy backend",
        ),
        ({"generation": {"topP": 0.9}}, "spec.trainer.generation.topP", "megatron backend does not"),
        ({"generation": {"topK": 4}}, "spec.trainer.generation.topK", "megatron backend does not"),
        (
            {"policy": {"sharding": {"strategy": "fsdp"}}},
            "spec.trainer.policy.sharding.strategy",
            "fsdp shards the torch policy backend's model",
        ),
        (
            {"policy": {"activationCheckpointing": True}},
            "spec.trainer.policy.activationCheckpointing",
            "torch policy backend only",
        ),
    ],
    ids=["mini-batches", "top-p", "top-k", "fsdp", "activation-checkpointing"],
)
def test_the_megatron_backend_refuses_what_it_would_ignore(
    base_job: dict[str, Any], trainer: dict[str, Any], path: str, text: str
) -> None:
    _merge(base_job["spec"], copy.deepcopy(MEGATRON_ON_GPUS))
    assert validate_manifest(base_job).ok
    _merge(base_job["spec"], {"trainer": trainer})
    errors = validate_manifest(base_job).errors
    assert any(e.path == path and text in e.message for e in errors), [str(e) for e in errors]


def test_a_name_too_long_for_the_last_retry_cluster_is_rejected_with_the_room_left(
    base_job: dict[str, Any],
) -> None:
    base_job["metadata"]["name"] = "a" * 51
    base_job["spec"]["backoffLimit"] = 10
    errors = [e for e in validate_manifest(base_job).errors if e.path == "metadata.name"]
    assert errors and "Use at most 50 characters" in errors[0].message


def test_a_name_that_fits_with_its_backoff_limit_is_accepted(base_job: dict[str, Any]) -> None:
    base_job["metadata"]["name"] = "a" * 51
    base_job["spec"]["backoffLimit"] = 2
    assert validate_manifest(base_job).ok


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"trainer": {"asyncRL": {"maxStalenessVersions": -1}}}, f"{ASYNC_RL}.maxStalenessVersions"),
        ({"trainer": {"grpo": {"numPromptsPerStep": 0}}}, "spec.trainer.grpo.numPromptsPerStep"),
        ({"trainer": {"policy": {"learningRate": 2}}}, "spec.trainer.policy.learningRate"),
        ({"cluster": {"policyWorkers": {"gpusPerReplica": 17}}}, "spec.cluster.policyWorkers.gpusPerReplica"),
        ({"backoffLimit": 100}, "spec.backoffLimit"),
        ({"secrets": [{"name": "UPPER"}]}, "spec.secrets[0].name"),
        ({"image": "has space"}, "spec.image"),
        # each running job costs the operator a read per interval (issue 27)
        ({"progress": {"pollSeconds": 1}}, "spec.progress.pollSeconds"),
    ],
)
def test_out_of_range_values_are_rejected_at_their_path(
    base_job: dict[str, Any], patch: dict[str, Any], path: str
) -> None:
    _merge(base_job["spec"], patch)
    errors = validate_manifest(base_job).errors
    assert any(e.path == path for e in errors), [str(e) for e in errors]


def test_a_misspelt_field_is_rejected_with_a_suggestion(base_job: dict[str, Any]) -> None:
    base_job["spec"]["trainer"]["asyncRL"] = {"maxStalenesVersions": 1}
    errors = validate_manifest(base_job).errors
    assert [str(e) for e in errors] == [
        "spec.trainer.asyncRL.maxStalenesVersions: unknown field; did you mean 'maxStalenessVersions'?"
    ]


@pytest.mark.parametrize(
    ("manifest", "path"),
    [
        ({"apiVersion": "v1", "kind": "AsyncGRPOJob", "spec": {"image": "x"}}, "apiVersion"),
        ({"apiVersion": "asyncgrpo.dev/v1alpha1", "kind": "RayJob", "spec": {"image": "x"}}, "kind"),
        ({"apiVersion": "asyncgrpo.dev/v1alpha1", "kind": "AsyncGRPOJob"}, "spec"),
    ],
)
def test_wrong_kind_api_version_or_missing_spec_is_named(manifest: dict[str, Any], path: str) -> None:
    assert [e.path for e in validate_manifest(manifest).errors] == [path]


def test_storage_needs_exactly_one_source(base_job: dict[str, Any]) -> None:
    base_job["spec"]["storage"] = {
        "checkpoints": {"pvc": {"claimName": "c"}, "emptyDir": {}, "mountPath": "/checkpoints"}
    }
    errors = validate_manifest(base_job).errors
    assert any(e.path == "spec.storage.checkpoints" and "exactly one" in e.message for e in errors)


def test_checkpoints_on_scratch_space_earn_a_warning(base_job: dict[str, Any]) -> None:
    base_job["spec"]["storage"] = {"checkpoints": {"emptyDir": {}, "mountPath": "/checkpoints"}}
    report = validate_manifest(base_job)
    assert report.ok
    assert any(w.path == "spec.storage.checkpoints" for w in report.warnings)


def test_locked_fields_cannot_change_on_a_running_job() -> None:
    old = {"suspend": False, "trainer": {"grpo": {"numPromptsPerStep": 8}}, "cluster": {"head": {}}}
    new = {
        "suspend": False,
        "trainer": {"grpo": {"numPromptsPerStep": 16}},
        "cluster": {"head": {"nodeSelector": {"a": "b"}}},
    }
    assert {f.path for f in locked_changes(old, new, suspended=False)} == {"spec.trainer", "spec.cluster"}


def test_suspend_and_deadlines_can_always_change_and_placement_while_suspended() -> None:
    old = {"suspend": False, "activeDeadlineSeconds": 10, "cluster": {"head": {}}}
    new = {"suspend": True, "activeDeadlineSeconds": 20, "cluster": {"head": {}}}
    assert locked_changes(old, new, suspended=False) == []
    moved = {**new, "cluster": {"head": {"nodeSelector": {"zone": "b"}}}}
    assert locked_changes(new, moved, suspended=True) == []


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def test_a_job_as_the_api_server_stores_it_earns_no_ignored_setting_warnings(
    base_job: dict[str, Any],
) -> None:
    """The API server fills in every default; defaults must not read as settings the user chose."""
    stored = AsyncGRPOJob.model_validate(base_job).to_manifest()
    paths = {w.path for w in validate_manifest(stored).warnings}
    assert paths <= {"spec.storage.checkpoints"}, paths


def test_an_empty_yaml_value_means_the_defaults_as_on_the_api_server(base_job: dict[str, Any]) -> None:
    base_job["spec"]["cluster"] = None
    base_job["spec"]["trainer"]["asyncRL"] = {"maxStalenessVersions": None}
    report = validate_manifest(base_job)
    assert report.ok, [str(e) for e in report.errors]
    assert report.job is not None and report.job.spec.trainer.async_rl.max_staleness_versions == 1


def test_null_on_a_nullable_field_means_unset_on_purpose(base_job: dict[str, Any]) -> None:
    base_job["spec"]["startupDeadlineSeconds"] = None
    job = validate_manifest(base_job).job
    assert job is not None and job.spec.startup_deadline_seconds is None


@pytest.mark.parametrize(
    ("metadata", "path", "text"),
    [
        ({}, "metadata.name", "is required"),
        ({"name": "名前"}, "metadata.name", "must be a DNS-1035 label"),
        ({"name": "9lives"}, "metadata.name", "must be a DNS-1035 label"),
        ({"name": "a.b"}, "metadata.name", "must be a DNS-1035 label"),
        ({"name": "ok", "lables": {}}, "metadata.lables", "did you mean 'labels'"),
        ({"name": "ok", "labels": {"a": "not ok!"}}, "metadata.labels.a", "string should match pattern"),
        ({"generateName": "x" * 50}, "metadata.generateName", "is too long"),
    ],
    ids=["missing", "unicode", "digit-first", "dots", "misspelt-key", "label-value", "generate-name-length"],
)
def test_metadata_is_checked_as_the_api_server_does(metadata: dict[str, Any], path: str, text: str) -> None:
    manifest = {**job_with(), "metadata": metadata}
    errors = validate_manifest(manifest).errors
    assert any(e.path == path and text in e.message for e in errors), [str(e) for e in errors]


def test_a_stored_object_with_server_fields_validates_again(base_job: dict[str, Any]) -> None:
    base_job["metadata"].update(
        {
            "uid": "1",
            "resourceVersion": "5",
            "generation": 2,
            "creationTimestamp": "2026-11-29T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            "finalizers": [],
            "namespace": "team",
        }
    )
    assert validate_manifest(base_job).ok


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"cluster": {"policyWorkers": {"replicas": False}}}, "spec.cluster.policyWorkers.replicas"),
        ({"trainer": {"grpo": {"maxNumSteps": "60"}}}, "spec.trainer.grpo.maxNumSteps"),
        ({"trainer": {"asyncRL": {"overSampling": "yes"}}}, "spec.trainer.asyncRL.overSampling"),
        ({"trainer": {"asyncRL": {"wqvq": None}}}, "spec.trainer.asyncRL.wqvq"),
    ],
    ids=["bool-for-int", "string-for-int", "string-for-bool", "unknown-null"],
)
def test_types_are_checked_strictly_as_the_api_server_does(
    base_job: dict[str, Any], patch: dict[str, Any], path: str
) -> None:
    _merge(base_job["spec"], patch)
    errors = validate_manifest(base_job).errors
    assert any(e.path == path for e in errors), [str(e) for e in errors]


def test_an_integer_is_accepted_for_a_number_field(base_job: dict[str, Any]) -> None:
    _merge(base_job["spec"], {"trainer": {"policy": {"learningRate": 1}, "generation": {"temperature": 1}}})
    assert validate_manifest(base_job).ok


@pytest.mark.parametrize(
    ("trainer", "path", "text"),
    [
        ({"env": {"name": "gsm8k"}}, "spec.trainer.data.trainPath", "is required with env.name gsm8k"),
        (
            {"data": {"promptKey": "text", "answerKey": "text"}},
            "spec.trainer.data.answerKey",
            "must differ from promptKey (both 'text')",
        ),
        (
            {"env": {"function": "my_rewards.score"}},
            "spec.trainer.env.function",
            'must be "package.module:function"',
        ),
        ({"env": {"function": "my rewards:score"}}, "spec.trainer.env.function", "got 'my rewards:score'"),
        ({"data": {"promptKey": ""}}, "spec.trainer.data.promptKey", "at least 1 character"),
    ],
    ids=["gsm8k-without-data", "same-keys", "function-without-colon", "function-not-a-path", "empty-key"],
)
def test_what_the_spec_shows_about_data_and_rewards_is_refused_at_admission(
    trainer: dict[str, Any], path: str, text: str
) -> None:
    errors = validate_manifest(job_with(**trainer)).errors
    assert any(e.path == path and text in e.message for e in errors), [str(e) for e in errors]


LOSS = "spec.trainer.loss"


@pytest.mark.parametrize(
    ("loss", "path", "text"),
    [
        (
            {"truncatedImportanceSamplingType": "icepop"},
            f"{LOSS}.truncatedImportanceSamplingType",
            "so both bounds are needed; set truncatedImportanceSamplingRatioMin",
        ),
        (
            {"truncatedImportanceSamplingType": "seq-mask-tis", "truncatedImportanceSamplingRatio": None},
            f"{LOSS}.truncatedImportanceSamplingType",
            "set truncatedImportanceSamplingRatioMin and truncatedImportanceSamplingRatio",
        ),
        (
            {"truncatedImportanceSamplingRatioMin": 3.0},
            f"{LOSS}.truncatedImportanceSamplingRatioMin",
            "must be at most truncatedImportanceSamplingRatio (2.0); got 3.0",
        ),
        (
            {
                "sequenceLevelImportanceRatios": True,
                "tokenLevelLoss": False,
                "truncatedImportanceSamplingType": "seq-mask-tis",
                "truncatedImportanceSamplingRatioMin": 0.5,
            },
            f"{LOSS}.sequenceLevelImportanceRatios",
            "cannot be combined with truncatedImportanceSamplingType seq-mask-tis",
        ),
        (
            {"sequenceLevelImportanceRatios": True},
            f"{LOSS}.sequenceLevelImportanceRatios",
            "needs tokenLevelLoss false",
        ),
        (
            {"constantNormalizer": True, "tokenLevelLoss": False},
            f"{LOSS}.constantNormalizer",
            "needs tokenLevelLoss true",
        ),
    ],
    ids=[
        "icepop-without-min",
        "seq-mask-uncapped",
        "min-above-max",
        "gspo-with-seq-mask",
        "gspo-token-mean",
        "dr-grpo-seq-mean",
    ],
)
def test_grpo_variants_that_have_no_meaning_are_refused_naming_the_field(
    loss: dict[str, Any], path: str, text: str
) -> None:
    errors = validate_manifest(job_with(loss=loss)).errors
    assert any(e.path == path and text in e.message for e in errors), [str(e) for e in errors]


@pytest.mark.parametrize(
    "loss",
    [
        {"constantNormalizer": True},
        {"sequenceLevelImportanceRatios": True, "tokenLevelLoss": False},
        {"truncatedImportanceSamplingType": "icepop", "truncatedImportanceSamplingRatioMin": 0.5},
        {
            "truncatedImportanceSamplingType": "seq-mask-tis",
            "truncatedImportanceSamplingRatioMin": 0.999,
            "truncatedImportanceSamplingRatio": 1.002,
        },
        {
            "sequenceLevelImportanceRatios": True,
            "tokenLevelLoss": False,
            "truncatedImportanceSamplingType": "icepop",
            "truncatedImportanceSamplingRatioMin": 0.5,
        },
    ],
    ids=["dr-grpo", "gspo", "icepop", "seq-mask-tis", "gspo-icepop"],
)
def test_each_grpo_variant_is_accepted_without_warnings(loss: dict[str, Any]) -> None:
    report = validate_manifest(job_with(loss=loss))
    assert report.ok, [str(e) for e in report.errors]
    assert not [w for w in report.warnings if w.path.startswith(LOSS)], report.warnings


GRPO = "spec.trainer.grpo"


@pytest.mark.parametrize(
    ("trainer", "path", "text"),
    [
        (
            {"grpo": {"overlongPenaltyTokens": 17}, "generation": {"maxNewTokens": 16}},
            f"{GRPO}.overlongPenaltyTokens",
            "must be at most generation.maxNewTokens (16): the penalty band is the last "
            "overlongPenaltyTokens tokens below the length limit; got 17. Set it to 16 or less, or raise "
            "generation.maxNewTokens",
        ),
        (
            {"grpo": {"overlongPenaltyTokens": 0}},
            f"{GRPO}.overlongPenaltyTokens",
            "input should be greater than or equal to 1; got 0",
        ),
        (
            {"grpo": {"dynamicSampling": True, "dynamicSamplingMaxExtraGroups": -1}},
            f"{GRPO}.dynamicSamplingMaxExtraGroups",
            "input should be greater than or equal to 1; got -1",
        ),
        (
            {"grpo": {"dynamicSampling": True, "numGenerationsPerPrompt": 1}},
            f"{GRPO}.dynamicSampling",
            "needs numGenerationsPerPrompt >= 2: a group of one sample always has equal rewards (zero "
            "advantage), so dynamic sampling would drop every group; raise numGenerationsPerPrompt or set "
            "dynamicSampling false",
        ),
    ],
    ids=["band-longer-than-max-new-tokens", "empty-band", "negative-cap", "one-sample-groups"],
)
def test_dapo_settings_that_have_no_meaning_are_refused_naming_the_field_and_the_fix(
    trainer: dict[str, Any], path: str, text: str
) -> None:
    errors = validate_manifest(job_with(**trainer)).errors
    assert [str(e) for e in errors] == [f"{path}: {text}"]


def test_dapo_settings_are_accepted_up_to_a_band_as_long_as_the_response_budget() -> None:
    report = validate_manifest(
        job_with(
            grpo={"dynamicSampling": True, "dynamicSamplingMaxExtraGroups": 1, "overlongPenaltyTokens": 16},
            generation={"maxNewTokens": 16},
        )
    )
    assert report.ok, [str(e) for e in report.errors]
    assert not [w for w in report.warnings if w.path.startswith(GRPO)], report.warnings
    assert report.job is not None and report.job.spec.trainer.dynamic_sampling_max_extra_groups == 1


def test_the_replacement_cap_defaults_to_one_step_of_groups() -> None:
    report = validate_manifest(job_with(grpo={"dynamicSampling": True}))
    assert report.job is not None and report.job.spec.trainer.dynamic_sampling_max_extra_groups == 8  # P


def test_a_replacement_cap_without_dynamic_sampling_is_accepted_with_a_warning() -> None:
    report = validate_manifest(job_with(grpo={"dynamicSamplingMaxExtraGroups": 4}))
    assert report.ok
    assert [str(w) for w in report.warnings if w.path.startswith(GRPO)] == [
        f"{GRPO}.dynamicSamplingMaxExtraGroups: is ignored while grpo.dynamicSampling is false (no group "
        "is dropped, so none is replaced); set dynamicSampling true or remove this"
    ]


SLEEP = "spec.trainer.generation.sleepWhileTraining"


def test_an_engine_cannot_sleep_while_training_in_an_async_mode_or_as_vllm_on_cpu() -> None:
    asynchronous = validate_manifest(job_with(generation={"sleepWhileTraining": True, "colocated": True}))
    assert [str(e) for e in asynchronous.errors if e.path == SLEEP] == [
        f"{SLEEP}: needs asyncRL sync mode (maxStalenessVersions 0): in the async modes the engine "
        "generates the next steps' samples while the policy trains; set maxStalenessVersions 0 or remove "
        "this"
    ]
    job = job_with(
        asyncRL={"maxStalenessVersions": 0},
        generation={"backend": "vllm", "sleepWhileTraining": True},
        model={"source": "pretrained", "path": "/models/qwen"},
    )
    assert [str(e) for e in validate_manifest(job).errors if e.path == SLEEP] == [
        f"{SLEEP}: needs GPUs with generation.backend vllm: vLLM's CPU build has no sleep mode; give the "
        "generation pool (or, colocated, the policy pool) GPUs, use generation.backend torch, or remove "
        "this"
    ]


def test_a_gsm8k_job_with_a_data_file_keys_and_a_reward_function_is_accepted() -> None:
    report = validate_manifest(
        job_with(
            data={"trainPath": "/data/gsm8k/train.parquet", "promptKey": "question", "answerKey": "answer"},
            env={"name": "gsm8k", "function": "my_team.rewards.v2:score"},
        )
    )
    assert report.ok, [str(e) for e in report.errors]


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (
            {"validationPath": "/data/val.jsonl", "numValidationPrompts": 0},
            "spec.trainer.data.validationPath",
        ),
        ({"promptKey": "question"}, "spec.trainer.data.promptKey"),
        ({"answerKey": "solution"}, "spec.trainer.data.answerKey"),
    ],
)
def test_data_settings_that_no_file_reads_are_accepted_with_a_warning(
    data: dict[str, Any], path: str
) -> None:
    report = validate_manifest(job_with(data=data))
    assert report.ok and [w.path for w in report.warnings if "data" in w.path] == [path]


@pytest.mark.parametrize(
    ("cluster", "colocated", "error"),
    [
        ({}, False, None),  # both pools on CPU: the broadcast over gloo
        ({"policyWorkers": {"gpusPerReplica": 1}, "generationWorkers": {"gpusPerReplica": 1}}, False, None),
        (
            {"policyWorkers": {"gpusPerReplica": 1}},
            False,
            "nccl broadcasts between the policy and the generation pool on one kind of device (NCCL on "
            "GPUs, gloo on CPU); one of them has GPUs and the other none: give both GPUs or neither, or "
            "use object-store",
        ),
        (
            {"policyWorkers": {"gpusPerReplica": 1}, "generationWorkers": {"replicas": 0}},
            True,
            "nccl cannot connect a colocated engine to the policy rank on its own GPU (generation.colocated "
            "true); use auto or cuda-ipc",
        ),
        ({"generationWorkers": {"replicas": 0}}, True, None),  # CPU processes: gloo
    ],
    ids=["cpu", "gpus", "gpus-on-one-pool", "colocated-on-gpus", "colocated-on-cpu"],
)
def test_nccl_is_the_broadcast_on_gpus_or_on_cpu_and_refused_where_it_cannot_connect(
    base_job: dict[str, Any], cluster: dict[str, Any], colocated: bool, error: str | None
) -> None:
    spec = base_job["spec"]
    spec["cluster"] = cluster
    spec["trainer"].update(generation={"colocated": colocated}, weightSync={"transport": "nccl"})
    report = validate_manifest(base_job)
    if error is None:
        assert report.ok, [str(e) for e in report.errors]
    else:
        assert [str(e) for e in report.errors] == [f"spec.trainer.weightSync.transport: {error}"]


GPU_POOLS = {"policyWorkers": {"gpusPerReplica": 1}, "generationWorkers": {"gpusPerReplica": 1}}
COLOCATED_ON_GPU = {"policyWorkers": {"gpusPerReplica": 1}, "generationWorkers": {"replicas": 0}}
VLLM = {"generation": {"backend": "vllm"}, "model": {"source": "pretrained", "path": "/models/qwen"}}
SYNC = {"asyncRL": {"maxStalenessVersions": 0}}
COLOCATED_ON_CPU = {"generationWorkers": {"replicas": 0}}

# (field under spec.trainer, a value other than its default, configurations where the field does
# nothing, configurations where it acts), a configuration being {"trainer": blocks, "cluster": pools}
INERT: list[tuple[str, Any, list[dict[str, Any]], list[dict[str, Any]]]] = [
    *(
        (
            f"loss.{field}",
            value,
            [{}, {"trainer": {"policy": {"trainGlobalBatchSize": 32}}}],  # P x N = 8 x 4
            [{"trainer": {"policy": {"trainGlobalBatchSize": 16}}}],
        )
        for field, value in (("ratioClipMin", 0.1), ("ratioClipMax", 0.4), ("ratioClipC", 3.0))
    ),
    ("loss.klType", "k1", [{}], [{"trainer": {"loss": {"referencePolicyKlPenalty": 0.01}}}]),
    *(
        (f"policy.{field}", 4, [{"trainer": {"policy": {"maxTokensPerMicroBatch": 4096}}}], [{}])
        for field in ("trainMicroBatchSize", "logprobBatchSize")
    ),
    *(
        (
            f"loss.{field}",
            value,
            [{"trainer": {"loss": {"useImportanceSamplingCorrection": False}}}],
            [{}],
        )
        for field, value in (
            ("truncatedImportanceSamplingRatio", 5.0),
            ("truncatedImportanceSamplingRatioMin", 0.5),
        )
    ),
    (
        "asyncRL.drainBeforeRefit",
        True,
        [{"trainer": SYNC}],
        [{}, {"trainer": {"asyncRL": {"overSampling": True}}}],
    ),
    (
        "loss.importanceSamplingOnStaleData",
        True,
        [{"trainer": {"loss": {"useImportanceSamplingCorrection": False}}}, {"trainer": SYNC}],
        [{}],
    ),
    (
        "loss.truncatedImportanceSamplingType",
        "icepop",
        [
            {
                "trainer": {
                    "loss": {
                        "useImportanceSamplingCorrection": False,
                        "truncatedImportanceSamplingRatioMin": 0.5,
                    }
                }
            }
        ],
        [{"trainer": {"loss": {"truncatedImportanceSamplingRatioMin": 0.5}}}],
    ),
    (
        "loss.sequenceLevelImportanceRatios",
        True,
        [{"trainer": {"loss": {"useImportanceSamplingCorrection": False, "tokenLevelLoss": False}}}],
        [
            {"trainer": {"loss": {"tokenLevelLoss": False}}},
            {
                "trainer": {
                    "loss": {"useImportanceSamplingCorrection": False, "tokenLevelLoss": False},
                    "policy": {"trainGlobalBatchSize": 16},
                }
            },
        ],
    ),
    (
        "generation.gpuMemoryUtilization",
        0.5,
        [{}, {"trainer": {"generation": {"backend": "torch"}}, "cluster": GPU_POOLS}, {"trainer": VLLM}],
        [{"trainer": VLLM, "cluster": GPU_POOLS}],
    ),
    (
        "weightSync.bucketSizeMB",
        64,
        [
            {},  # CPU: the object store
            {"trainer": {"weightSync": {"transport": "object-store"}}, "cluster": GPU_POOLS},
            {"trainer": {"generation": {"colocated": True}}, "cluster": COLOCATED_ON_GPU},  # CUDA IPC
        ],
        [{"cluster": GPU_POOLS}, {"trainer": {"weightSync": {"transport": "nccl"}}}],  # NCCL; gloo on CPU
    ),
    ("generation.torchDecode", "batched", [{"trainer": VLLM}], [{}]),
    (
        "generation.sleepWhileTraining",
        True,
        [{"trainer": SYNC}, {"trainer": SYNC, "cluster": GPU_POOLS}],
        [
            {"trainer": {**SYNC, "generation": {"colocated": True}}, "cluster": COLOCATED_ON_CPU},
            {
                "trainer": {**SYNC, **VLLM, "generation": {"backend": "vllm", "colocated": True}},
                "cluster": COLOCATED_ON_GPU,
            },
        ],
    ),
    (
        "env.scoreTruncated",
        True,
        [{}],
        [
            {"trainer": {"env": {"function": "my_team.rewards:score"}}},
            {"trainer": {"rewardModel": {"path": "/models/judge"}}},
        ],
    ),
    ("env.functionScope", "group", [{}], [{"trainer": {"env": {"function": "my_team.rewards:score"}}}]),
    ("logprobGate.steps", 3, [{"trainer": {"logprobGate": {"threshold": None}}}], [{}]),
    ("logprobGate.failJob", True, [{"trainer": {"logprobGate": {"threshold": None}}}], [{}]),
    ("policy.minLearningRateRatio", 0.1, [{}], [{"trainer": {"policy": {"learningRateSchedule": "cosine"}}}]),
]


def _configured(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    job = copy.deepcopy(BASE_JOB)
    spec = job["spec"]
    for pool, values in config.get("cluster", {}).items():
        spec.setdefault("cluster", {}).setdefault(pool, {}).update(values)
    for block, values in config.get("trainer", {}).items():
        spec["trainer"].setdefault(block, {}).update(copy.deepcopy(values))
    if value is not None:
        block, field = path.split(".")
        spec["trainer"].setdefault(block, {})[field] = value
    return job


@pytest.mark.parametrize(
    ("path", "value", "inert", "acting"), [pytest.param(*row, id=row[0]) for row in INERT]
)
def test_a_field_the_configuration_ignores_is_named_in_a_warning_and_only_then(
    path: str, value: Any, inert: list[dict[str, Any]], acting: list[dict[str, Any]]
) -> None:
    """kubectl prints these (the webhook returns them as admission warnings), `asyncgrpo validate`
    and the driver's log too."""
    full = f"spec.trainer.{path}"
    for config in inert:
        report = validate_manifest(_configured(config, path, value))
        assert report.ok, (config, [str(e) for e in report.errors])
        warned = [str(w) for w in report.warnings if w.path == full]
        assert len(warned) == 1, (config, report.warnings)
        assert len(warned[0]) <= 256, warned  # the API server may cut a longer admission warning
        defaults = validate_manifest(_configured(config, path, None))  # a default nobody chose
        assert not [w for w in defaults.warnings if w.path == full], config
    for config in acting:
        report = validate_manifest(_configured(config, path, value))
        assert report.ok, (config, [str(e) for e in report.errors])
        assert not [w for w in report.warnings if w.path == full], (config, report.warnings)


SHARDING = "spec.trainer.policy.sharding"
TWO_GPUS = {"policyWorkers": {"gpusPerReplica": 2}, "generationWorkers": {"gpusPerReplica": 1}}


@pytest.mark.parametrize(
    ("sharding", "cluster", "warned"),
    [
        ({"strategy": "fsdp"}, {"policyWorkers": {"replicas": 2}}, []),
        ({"strategy": "fsdp"}, TWO_GPUS, []),
        ({"strategy": "fsdp", "cpuOffload": True}, TWO_GPUS, []),
        ({"strategy": "fsdp", "cpuOffload": True}, GPU_POOLS, []),  # one GPU, its AdamW state on the host
        ({"strategy": "fsdp"}, {}, [("strategy", "fsdp over one policy rank shards nothing")]),
        ({"strategy": "fsdp"}, GPU_POOLS, [("strategy", "fsdp over one policy rank shards nothing")]),
        ({"cpuOffload": True}, TWO_GPUS, [("cpuOffload", "is ignored unless sharding.strategy is fsdp")]),
        (
            {"strategy": "fsdp", "cpuOffload": True},
            {"policyWorkers": {"replicas": 2}},
            [("cpuOffload", "changes nothing on CPU policy workers")],
        ),
    ],
    ids=[
        "two-cpu-ranks",
        "two-gpus",
        "two-gpus-offloaded",
        "one-gpu-offloaded",
        "one-cpu-rank",
        "one-gpu",
        "offload-unsharded",
        "offload-on-cpu",
    ],
)
def test_sharding_is_accepted_with_a_warning_where_it_does_nothing(
    sharding: dict[str, Any], cluster: dict[str, Any], warned: list[tuple[str, str]]
) -> None:
    report = validate_manifest(_configured({"cluster": cluster}, "policy.sharding", sharding))
    assert report.ok, [str(e) for e in report.errors]
    found = [
        (w.path.removeprefix(f"{SHARDING}."), w.message)
        for w in report.warnings
        if w.path.startswith(SHARDING)
    ]
    assert [field for field, _ in found] == [field for field, _ in warned], found
    for (_, message), (_, text) in zip(found, warned, strict=True):
        assert text in message and len(message) <= 256, message


@pytest.mark.parametrize(
    ("transport", "cluster", "trainer", "expected"),
    [
        ("auto", GPU_POOLS, {}, "broadcast"),
        ("auto", COLOCATED_ON_GPU, {"generation": {"colocated": True}}, "cuda-ipc"),
        (
            "auto",
            COLOCATED_ON_GPU,
            {"generation": {"colocated": True}, "policy": {"backend": "megatron"}},
            "object-store",
        ),
        ("auto", {}, {}, "object-store"),
        ("nccl", GPU_POOLS, {}, "broadcast"),
        ("nccl", {}, {}, "broadcast"),  # over gloo
        ("cuda-ipc", COLOCATED_ON_GPU, {"generation": {"colocated": True}}, "cuda-ipc"),
        ("object-store", GPU_POOLS, {}, "object-store"),
        ("auto", GPU_POOLS, {"policy": {"lora": {"rank": 8}}}, "object-store"),
        (
            "auto",
            COLOCATED_ON_GPU,
            {"generation": {"colocated": True}, "policy": {"lora": {}}},
            "object-store",
        ),
    ],
)
def test_the_refit_transport_a_job_runs(
    transport: str, cluster: dict[str, Any], trainer: dict[str, Any], expected: str
) -> None:
    config = {"cluster": cluster, "trainer": {**trainer, "weightSync": {"transport": transport}}}
    manifest = _configured(config, "", None)
    assert refit_transport(AsyncGRPOJob.model_validate(manifest)) == expected


PRETRAINED = {"model": {"source": "pretrained", "path": "/models/qwen"}}


@pytest.mark.parametrize(
    ("cluster", "trainer", "expected"),
    [
        (GPU_POOLS, PRETRAINED, "vllm"),  # RL-shaped responses on GPUs: vLLM refills ended slots
        (COLOCATED_ON_GPU, {**PRETRAINED, "generation": {"colocated": True}}, "vllm"),
        ({}, PRETRAINED, "torch"),  # CPU
        (GPU_POOLS, {}, "torch"),  # the tiny model: vLLM serves only Hugging Face checkpoints
        (GPU_POOLS, {**PRETRAINED, "generation": {"ignoreEos": True}}, "torch"),  # fixed-length rows
        (GPU_POOLS, {**PRETRAINED, "generation": {"backend": "torch"}}, "torch"),
        ({}, {**PRETRAINED, "generation": {"backend": "vllm"}}, "vllm"),  # vLLM's CPU build, asked for
    ],
    ids=["gpus", "colocated", "cpu", "tiny", "ignore-eos", "torch-asked", "vllm-asked"],
)
def test_the_generation_engine_a_job_runs(
    cluster: dict[str, Any], trainer: dict[str, Any], expected: str
) -> None:
    manifest = _configured({"cluster": cluster, "trainer": trainer}, "", None)
    assert validate_manifest(manifest).ok
    assert generation_backend(AsyncGRPOJob.model_validate(manifest)) == expected


@pytest.mark.parametrize(
    ("config", "path", "text"),
    [
        (
            {"cluster": GPU_POOLS, "trainer": {"policy": {"backend": "megatron"}}},
            "spec.trainer.policy.lora",
            "torch policy backend only",
        ),
        (
            {"trainer": {"policy": {"sharding": {"strategy": "fsdp"}}}},
            "spec.trainer.policy.lora",
            "set policy.sharding.strategy none",
        ),
        (
            {"trainer": {"weightSync": {"transport": "nccl"}}},
            "spec.trainer.weightSync.transport",
            "object-store",
        ),
        (
            {
                "cluster": COLOCATED_ON_GPU,
                "trainer": {"generation": {"colocated": True}, "weightSync": {"transport": "cuda-ipc"}},
            },
            "spec.trainer.weightSync.transport",
            "only the adapters",
        ),
    ],
    ids=["megatron", "fsdp", "nccl", "cuda-ipc"],
)
def test_lora_is_refused_where_it_cannot_run_naming_the_field(
    config: dict[str, Any], path: str, text: str
) -> None:
    without = _configured(config, "", None)
    assert validate_manifest(without).ok, [str(e) for e in validate_manifest(without).errors]
    errors = validate_manifest(_configured(config, "policy.lora", {"rank": 8, "alpha": 16})).errors
    assert any(e.path == path and text in e.message for e in errors), [str(e) for e in errors]


def test_lora_fields_default_to_rank_16_alpha_16_on_every_projection() -> None:
    job = AsyncGRPOJob.model_validate(_configured({}, "policy.lora", {}))
    lora = job.spec.trainer.policy.lora
    assert lora is not None and (lora.rank, lora.alpha) == (16, 16.0)
    assert lora.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    assert AsyncGRPOJob.model_validate(BASE_JOB).spec.trainer.policy.lora is None
    report = validate_manifest(_configured({}, "policy.lora", {"targetModules": ["lm_head"]}))
    assert any(e.path == "spec.trainer.policy.lora.targetModules[0]" for e in report.errors), report.errors
