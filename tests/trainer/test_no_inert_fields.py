"""No field of the AsyncGRPOJob spec is accepted and then ignored.

The test walks every leaf field of the spec model. For each one it takes a valid job, changes the
field to another value that admission accepts, and runs the driver's real `build` with the worker
starts, the data files and the checkpoint reading replaced by recorders (what `build` hands to them
is what this test is about; starting Ray actors is not). The field passes when what `build` hands
to the workers and the controller changes. Fields that only the operator reads (pod templates,
lifecycle, placement) are listed in OPERATOR_ONLY, each with the code that reads them; fields that
admission pins to one value are in PINNED with the rule that pins them. A new field that nothing
reads fails here with its path.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from asyncgrpo_api import rules
from asyncgrpo_api.v1alpha1.base import nested_model
from asyncgrpo_api.v1alpha1.job import AsyncGRPOJobSpec
from asyncgrpo_trainer import (
    cluster,
    data,
    driver,
    judge,
    megatron_workers,
    reward_function,
    weights,
    workers,
)
from asyncgrpo_trainer import rewards as reward_workers
from asyncgrpo_trainer.envs.base import Example
from asyncgrpo_trainer.models import recipe
from asyncgrpo_trainer.models.tokenizer import CharTokenizer

OPERATOR_ONLY = {
    # Pod templates (asyncgrpo_operator.manifests): image, pull settings, identity, labels.
    "image": "manifests: the head and worker containers' image",
    "imagePullPolicy": "manifests: containers' imagePullPolicy",
    "imagePullSecrets": "manifests: the pods' imagePullSecrets",
    "serviceAccountName": "manifests: the pods' serviceAccountName",
    "labels": "manifests: labels of the RayCluster and its pods",
    "secrets": "manifests: secretKeyRef environment of the trainer containers",
    "env": "manifests: environment of the trainer containers",
    "network": "manifests: NCCL/Gloo environment and hostNetwork of the pods",
    "storage": "manifests: volumes and mounts of the pods",
    "cluster.rayVersion": "manifests: RayCluster spec.rayVersion",
    "cluster.head": "manifests: the head group's resources and placement",
    "scheduler": "manifests: Kueue/KAI labels and priorityClassName",
    "runtimeRef": "webhook, reconciler: the AsyncGRPORuntime whose values pinned.py sets into the pods",
    # Lifecycle (asyncgrpo_operator.plan): the operator's decisions about the job.
    "suspend": "plan: suspends the RayCluster in place and keeps the job",
    "backoffLimit": "plan: retries of infrastructure failures",
    "activeDeadlineSeconds": "plan: DeadlineExceeded",
    "startupDeadlineSeconds": "plan: DeadlineExceeded before the driver runs",
    "progress": "plan: /progress polling period and Stalled",
    "cleanupPolicy": "plan: what is deleted after the job finishes",
    "managedBy": "plan: a MultiKueue manager keeps only the Workload of a job it dispatched",
    "terminationGracePeriodSeconds": "manifests: the pods' grace period and the Ray containers' preStop wait",
}
"""Subtrees read by the operator alone, with where."""
for pool in ("policyWorkers", "generationWorkers"):
    for leaf in ("resources", "nodeSelector", "tolerations", "affinity", "annotations"):
        OPERATOR_ONLY[f"cluster.{pool}.{leaf}"] = "manifests: the worker group's pod placement"
    OPERATOR_ONLY[f"cluster.{pool}.podTemplate"] = "overrides: merged into the worker group's pod template"

OPERATOR_ONLY["cluster.generationWorkers.autoscaling"] = "elastic: the rule that scales an elastic fleet"
for bound in ("minReplicas", "maxReplicas"):
    OPERATOR_ONLY[f"cluster.generationWorkers.{bound}"] = f"manifests: KubeRay's {bound} of the generation"

PINNED = {
    "trainer.policy.megatron.pipelineParallelSize": "rules._megatron_supported: must be 1",
    "trainer.policy.megatron.contextParallelSize": "rules._megatron_supported: must be 1",
}
"""Fields that admission accepts with one value only, so there is nothing to change."""

BASE: dict[str, Any] = {
    "apiVersion": "asyncgrpo.dev/v1alpha1",
    "kind": "AsyncGRPOJob",
    "metadata": {"name": "walk"},
    "spec": {"image": "asyncgrpo/trainer:test"},
}

PRETRAINED = {"trainer": {"model": {"source": "pretrained", "path": "/models/m"}}}
VLLM_ON_GPUS = {
    "cluster": {
        "policyWorkers": {"replicas": 1, "gpusPerReplica": 1},
        "generationWorkers": {"replicas": 1, "gpusPerReplica": 2},
    },
    "trainer": {"model": PRETRAINED["trainer"]["model"], "generation": {"backend": "vllm"}},
}
CONTEXTS: dict[str, dict[str, Any]] = {
    # Fields that only matter in some jobs are changed in such a job.
    "trainer.policy.megatron.": {
        "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 2}},
        "trainer": {"policy": {"backend": "megatron"}},
    },
    "trainer.model.path": PRETRAINED,
    "trainer.data.chatTemplate": PRETRAINED,
    "trainer.data.systemPrompt": PRETRAINED,
    "trainer.policy.minLearningRateRatio": {"trainer": {"policy": {"learningRateSchedule": "cosine"}}},
    "trainer.policy.sharding.cpuOffload": {
        "cluster": {"policyWorkers": {"replicas": 1, "gpusPerReplica": 1}},
        "trainer": {"policy": {"sharding": {"strategy": "fsdp"}}},
    },
    "trainer.generation.tensorParallelSize": VLLM_ON_GPUS,
    "trainer.generation.gpuMemoryUtilization": VLLM_ON_GPUS,
    "trainer.grpo.dynamicSamplingMaxExtraGroups": {"trainer": {"grpo": {"dynamicSampling": True}}},
    "trainer.env.maxTurns": {"trainer": {"env": {"name": "calculator"}}},
    "trainer.rewardModel.": {"trainer": {"rewardModel": {"path": "/models/judge"}}},
    "trainer.env.maxTokensPerTurn": {"trainer": {"env": {"name": "calculator"}}},
    # maxBufferedRollouts must be exactly P x (S+1) unless overSampling.
    "trainer.asyncRL.maxBufferedRollouts": {"trainer": {"asyncRL": {"overSampling": True}}},
    "trainer.weightSync.bucketSizeMB": {
        "cluster": {
            "policyWorkers": {"replicas": 1, "gpusPerReplica": 1},
            "generationWorkers": {"replicas": 1, "gpusPerReplica": 1},
        },
    },
}


ALONG_WITH: dict[str, dict[str, Any]] = {
    # What admission requires together with the field's new value.
    "trainer.loss.truncatedImportanceSamplingType": {
        "trainer": {"loss": {"truncatedImportanceSamplingRatioMin": 0.5}}
    },
    "trainer.loss.sequenceLevelImportanceRatios": {"trainer": {"loss": {"tokenLevelLoss": False}}},
    "trainer.model.source": PRETRAINED,
    "trainer.policy.backend": {"cluster": {"policyWorkers": {"gpusPerReplica": 1}}},
    "trainer.generation.backend": VLLM_ON_GPUS,
    "trainer.generation.colocated": {
        "cluster": {"policyWorkers": {"gpusPerReplica": 1}, "generationWorkers": {"replicas": 0}}
    },
    "trainer.generation.sleepWhileTraining": {"trainer": {"asyncRL": {"maxStalenessVersions": 0}}},
}


# --- the spec's leaves ----------------------------------------------------------------------------


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted alias path, annotation) of every leaf field; lists of models are walked into."""
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        inner = nested_model(info.annotation)
        if inner is not None:
            yield from leaves(inner, path + ".")
        else:
            yield path, info.annotation


def candidates(annotation: Any, current: Any) -> list[Any]:
    """Other values of the field's type, most ordinary first."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return [a for a in typing.get_args(annotation) if a != current]
    if origin is list and args and typing.get_origin(args[0]) is typing.Literal:  # one choice each
        return [[v] for v in typing.get_args(args[0]) if [v] != current]
    if origin in (typing.Union, types.UnionType) or origin is typing.Annotated:
        return [c for a in args for c in candidates(a, current)]
    if annotation is bool:
        return [True, False] if current is None else [not current]
    if annotation is int:
        base = [1, 2, 4, 8, 16, 64, 100] if current is None else [current + 1, current * 2, current + 8, 1, 2]
        return [v for v in base if v != current]
    if annotation is float:
        base = [0.5, 0.9, 1.5, 2.0, 5.0, 30.0]
        if current is not None:
            base = [current * 2, current / 2, current + 0.5, *base]
        return [v for v in base if v != current]
    if annotation is str:
        return [
            "/data/walk.jsonl",
            "walk",
            "tests.trainer.custom_envs:EchoEnvironment",
            "walk_rewards:score",
            "Is {response} right?",  # a judge's template (rewardModel.template must name the response)
        ]
    return []


def _get(tree: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[last] = value


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


# --- what build hands over ------------------------------------------------------------------------


class Recorder:
    """Stands in for what starts processes or reads files; records every call's arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def stub(self, name: str, result: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, plain((args, kwargs))))
            return result

        return call


@dataclasses.dataclass(frozen=True)
class Stub:
    name: str


class StubRewards(Stub):
    def ready(self) -> list[Any]:
        return []


def plain(value: Any) -> Any:
    """A comparable value: dataclasses, models and objects by their fields."""
    if isinstance(value, Stub):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple((f.name, plain(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    if isinstance(value, BaseModel):
        return plain(value.model_dump())
    if isinstance(value, dict):
        return tuple(sorted((str(k), plain(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, int | float | str | bool | type(None)):
        return value
    if hasattr(value, "__dict__"):
        return (type(value).__name__, plain({k: v for k, v in vars(value).items() if not k.startswith("__")}))
    return repr(value)


def derived(manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Everything `driver.build` hands to the workers and the controller for this job."""
    job = driver.parse_job(manifest)
    rec = Recorder()
    tiny = recipe.tiny_build(
        CharTokenizer("0123456789="),
        hidden_size=8,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        intermediate_size=None,
        max_sequence_length=8,
        position_embedding="learned",
        dtype="float32",
        seed=0,
    )
    with monkeypatch.context() as m:
        m.setattr(cluster, "build_pools", rec.stub("pools", (Stub("policy-pool"), Stub("generation-pool"))))
        m.setattr(workers, "start_policy_group", rec.stub("policy", (Stub("policy"), [])))
        m.setattr(megatron_workers, "start_megatron_policy_group", rec.stub("megatron", (Stub("policy"), [])))
        m.setattr(workers, "start_generation_group", rec.stub("generation", (Stub("generation"), [])))
        m.setattr(reward_workers, "RewardPool", rec.stub("rewards", StubRewards("rewards")))
        m.setattr(reward_function, "check", rec.stub("function", None))
        m.setattr(judge, "read", rec.stub("judge", Stub("judge")))
        m.setattr(judge, "start", rec.stub("judge-engine", (Stub("reward-model"), Stub("judge-ready"))))
        m.setattr(data, "load_prompts", rec.stub("data", data.Prompts([Example("1234=", "4321")], [], [])))
        m.setattr(driver, "RolloutManager", rec.stub("rollout", Stub("rollout")))
        m.setattr(weights, "build", rec.stub("weights", Stub("weights")))
        m.setattr(recipe, "pretrained_build", rec.stub("pretrained", (tiny, CharTokenizer("0123456789="))))
        m.setattr(driver.vllm_engine, "check_available", lambda **_: None)
        built = driver.build(job)
    return plain((rec.calls, built.args))


# --- the walk -------------------------------------------------------------------------------------


def _context(path: str) -> dict[str, Any]:
    for prefix, patch in CONTEXTS.items():
        if path == prefix or (prefix.endswith(".") and path.startswith(prefix)):
            return patch
    return {}


def _listed(path: str, table: dict[str, str]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in table)


@pytest.mark.parametrize(
    ("path", "annotation"),
    [
        pytest.param(p, a, id=p)
        for p, a in leaves(AsyncGRPOJobSpec)
        if not _listed(p, OPERATOR_ONLY) and not _listed(p, PINNED)
    ],
)
def test_changing_the_field_changes_what_the_driver_builds(
    path: str, annotation: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = copy.deepcopy(BASE)
    base["spec"]["checkpoint"] = {"path": str(tmp_path / "ckpt")}
    _merge(base["spec"], _context(path))
    report = rules.validate_manifest(base)
    assert report.ok, [str(e) for e in report.errors]
    before = derived(base, monkeypatch)
    current = _get(report.job.model_dump(mode="json", by_alias=True)["spec"], path)  # type: ignore[union-attr]
    tried = []
    for value in candidates(annotation, current):
        changed = copy.deepcopy(base)
        _merge(changed["spec"], ALONG_WITH.get(path, {}))
        _set(changed["spec"], path, value)
        if not rules.validate_manifest(changed).ok:
            tried.append(f"{value!r} (refused by admission)")
            continue
        if derived(changed, monkeypatch) != before:
            return
        tried.append(f"{value!r} (no effect)")
    pytest.fail(
        f"spec.{path}: no value changed what the driver builds; tried {', '.join(tried) or 'nothing'}. "
        "Wire it into the trainer, remove it, or list it in OPERATOR_ONLY/PINNED with its reader"
    )


def test_the_allow_lists_name_fields_that_exist() -> None:
    paths = [p for p, _ in leaves(AsyncGRPOJobSpec)]
    for listed in [*OPERATOR_ONLY, *PINNED, *(c.rstrip(".") for c in CONTEXTS), *ALONG_WITH]:
        assert any(p == listed or p.startswith(listed + ".") for p in paths), listed
