"""Builders for the objects the operator observes: jobs, RayClusters and pods as the API returns them.

Plan tests compose an Observation from these, so each test reads as the state of the world it
describes ("head pod ready, driver running, workers unschedulable") rather than as nested dicts.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_operator import manifests, naming
from asyncgrpo_operator.manifests import Owner
from asyncgrpo_operator.observed import (
    ClusterView,
    ConfigMapView,
    DriverExit,
    Observation,
    PodView,
    ProgressReading,
)

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
JOB_UID = "job-uid-1"
OWNER = Owner(name="demo", uid=JOB_UID)

BASE_JOB: dict[str, Any] = {
    "apiVersion": "asyncgrpo.dev/v1alpha1",
    "kind": "AsyncGRPOJob",
    "metadata": {"name": "demo", "namespace": "team", "uid": JOB_UID},
    "spec": {
        "image": "trainer:1",
        "backoffLimit": 2,
        "startupDeadlineSeconds": 600,
        "progress": {"stallAfterSeconds": 120, "pollSeconds": 5},
        "cluster": {
            "policyWorkers": {
                "replicas": 1,
                "gpusPerReplica": 8,
                "nodeSelector": {"asyncgrpo.dev/pool": "gpu"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            "generationWorkers": {
                "replicas": 1,
                "gpusPerReplica": 8,
                "nodeSelector": {"asyncgrpo.dev/pool": "gpu"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
        "trainer": {"grpo": {"numPromptsPerStep": 8, "numGenerationsPerPrompt": 4}},
    },
}


def job(**spec: Any) -> AsyncGRPOJob:
    """The base job with top-level spec fields replaced."""
    manifest = copy.deepcopy(BASE_JOB)
    manifest["spec"].update(spec)
    return AsyncGRPOJob.model_validate(manifest)


def at(seconds: float) -> datetime:
    """A moment `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def cluster(
    attempt: int = 0,
    *,
    provisioned: bool = False,
    deleting: bool = False,
    created: float = 0.0,
    uid: str = "",
    owner_uid: str | None = JOB_UID,
) -> ClusterView:
    """A RayCluster of the job's attempt; owned by the job unless `owner_uid` says otherwise. Its
    status names the head pod KubeRay created for it (`pod(..., head=True)`)."""
    name = naming.raycluster_name("demo", attempt)
    return ClusterView(
        name=name,
        uid=uid or f"rc-uid-{attempt}",
        attempt=attempt,
        owner_uid=owner_uid,
        deleting=deleting,
        created_at=at(created),
        provisioned=provisioned,
        head_pod=head_pod_name(name),
    )


def head_pod_name(cluster_name: str) -> str:
    return f"{cluster_name}-head"


def pod(owner: ClusterView, **fields: Any) -> PodView:
    """A pod as the API returns it (`raw_pod`'s fields), parsed the way the reconciler parses it."""
    return PodView.from_dict(raw_pod(owner, **fields))


def raw_cluster(view: ClusterView) -> dict[str, Any]:
    """The job's RayCluster `view` (namespace team), provisioned, as the API returns it."""
    return {
        "metadata": {
            "name": view.name,
            "namespace": "team",
            "uid": view.uid,
            "resourceVersion": "20",
            "labels": {naming.JOB_NAME_LABEL: "demo", naming.ATTEMPT_LABEL: "0"},
            "ownerReferences": [{"uid": OWNER.uid, "controller": True}],
        },
        "status": {
            "conditions": [{"type": "RayClusterProvisioned", "status": "True"}],
            "head": {"podName": view.head_pod},
        },
    }


def raw_pod(
    owner: ClusterView,
    *,
    head: bool = False,
    group: str = "policy",
    index: int = 0,
    node: str | None = "node-1",
    ready: bool = True,
    unschedulable: str | None = None,
    driver: dict[str, Any] | None = None,
    waiting: str | None = None,
    phase: str = "Running",
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod of the job (namespace team) as the API returns it."""
    name = head_pod_name(owner.name) if head else f"{owner.name}-{group}-worker-{index}"
    containers = []
    ray_container = naming.RAY_HEAD_CONTAINER if head else naming.RAY_WORKER_CONTAINER
    ray_state: dict[str, Any] = (
        {"running": {}} if ready and node else {"waiting": {"reason": "ContainerCreating"}}
    )
    if waiting:
        ray_state = {"waiting": {"reason": waiting, "message": f"{waiting} for trainer:1"}}
    containers.append({"name": ray_container, "state": ray_state})
    if head:
        containers.append({"name": naming.DRIVER_CONTAINER, "state": driver or {"running": {}}})
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    raw = {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"{name}-uid",
            "labels": {
                naming.RAY_NODE_TYPE_LABEL: "head" if head else "worker",
                naming.RAY_GROUP_LABEL: "headgroup" if head else group,
                naming.RAY_CLUSTER_LABEL: owner.name,
                naming.JOB_NAME_LABEL: "demo",
            },
            "ownerReferences": [
                {"kind": "RayCluster", "name": owner.name, "uid": owner.uid, "controller": True}
            ],
            **({"deletionTimestamp": at(0).isoformat()} if deleting else {}),
        },
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": containers,
            "podIP": "10.0.0.9",
        },
    }
    return raw


def healthy_pods(owner: ClusterView, *, driver: dict[str, Any] | None = None) -> tuple[PodView, ...]:
    """Head (driver running unless given) and one ready worker per group."""
    return (
        pod(owner, head=True, driver=driver),
        pod(owner, group="policy"),
        pod(owner, group="generation"),
    )


def terminated(exit_code: int, message: str = "") -> dict[str, Any]:
    """A container state: terminated with this exit code."""
    reason = "Completed" if exit_code == 0 else "Error"
    return {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}}


def spec_configmap(the_job: AsyncGRPOJob, owner_uid: str | None = OWNER.uid) -> ConfigMapView:
    """The job's spec ConfigMap as the cache shows it: up to date, controlled by `owner_uid`."""
    manifest = manifests.spec_configmap(the_job, OWNER)
    digest = manifest["metadata"]["annotations"][naming.SPEC_DIGEST_ANNOTATION]
    return ConfigMapView(manifest["metadata"]["name"], owner_uid, digest, resource_version="7")


def observe(
    seconds: float,
    *clusters: ClusterView,
    pods: tuple[PodView, ...] = (),
    configmap: bool | ConfigMapView = True,
    progress: dict[str, Any] | None = None,
    progress_error: str | None = None,
    remembered_exit: DriverExit | None = None,
    the_job: AsyncGRPOJob | None = None,
    **kwargs: Any,
) -> Observation:
    """An observation at T0 + seconds. `configmap` True means the job's ConfigMap is up to date;
    a ConfigMapView is the one observed."""
    return Observation(
        now=at(seconds),
        clusters=clusters,
        pods=pods,
        configmap=configmap
        if isinstance(configmap, ConfigMapView)
        else spec_configmap(the_job or job())
        if configmap
        else None,
        progress=ProgressReading.from_json(progress) if progress is not None else None,
        progress_error=progress_error,
        remembered_exit=remembered_exit,
        **kwargs,
    )
