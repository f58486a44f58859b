"""The job as Kueue's workload: the Workload the operator owns for a job Kueue queues, what Kueue's
admission puts into the pods, and the Workload status writes that Kueue leaves to a job's controller.

Kueue's `integrations.externalFrameworks` (Kind.version.group, here
`AsyncGRPOJob.v1alpha1.asyncgrpo.dev`) lets a controller other than Kueue's own job framework
manage a kind's Workloads. The contract is the one Kueue's jobframework keeps for its built-in
kinds (pkg/controller/jobframework/reconciler.go, Kueue v0.17.0), with this operator in the job
reconciler's seat:

- The job owns one Workload (controller ownerReference, label `kueue.x-k8s.io/job-uid`), with one
  pod set per Ray group: `head` (1), `policy` and `generation` (their replicas), each with the pod
  template the RayCluster will carry, so Kueue counts exactly the requests the pods will make.
- While the Workload is not admitted the job is suspended (`spec.suspend` true); admission sets it
  false and starts the pods with the assigned ResourceFlavors' node labels and tolerations
  (`podset.FromAssignment`): `inject_flavors`.
- An evicted Workload (preempted, PodsReady timeout, deactivated) suspends the job; once its pods
  are gone the controller gives the quota back (`released`: QuotaReserved False, Admitted False,
  Requeued True for a preemption, as `UnsetQuotaReservationWithCondition` and
  `SetRequeuedCondition` do) and Kueue queues it again, the same Workload in the same place.
- The controller reports PodsReady (for `waitForPodsReady`) and Finished.

No finalizer on the Workload: the job carries none either (deleting a job never waits for the
operator), and the garbage collector deletes the Workload with the job.
Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from asyncgrpo_api import quantity
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.job import KUEUE_QUEUE_LABEL
from asyncgrpo_operator import naming
from asyncgrpo_operator.manifests import Manifest, Owner, owner_reference

API_VERSION = "kueue.x-k8s.io/v1beta2"
FRAMEWORK = "AsyncGRPOJob.v1alpha1.asyncgrpo.dev"
"""What Kueue's `integrations.externalFrameworks` must list for it to manage these jobs' Workloads."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PODSET_LABEL = "kueue.x-k8s.io/podset"
"""Kueue labels every admitted pod with its pod set's name (constants.PodSetLabel)."""
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""A job's WorkloadPriorityClass (Kueue's label); it wins over spec.scheduler.priorityClassName."""
DIGEST_ANNOTATION = "asyncgrpo.dev/podsets-digest"
"""The digest of the pod sets a Workload was written with: a changed spec updates the Workload."""
HEAD_PODSET = "head"
REQUEUED_REASONS = frozenset({"Preempted", "NodeFailures"})
"""Eviction reasons after which Kueue's jobframework sets Requeued True (others leave it False)."""


@dataclass(frozen=True)
class Priority:
    """The Workload's priority: the class it came from (Kueue's PriorityClassRef) and its value."""

    group: str
    kind: str
    name: str
    value: int


def workload_name(job_name: str, job_uid: str) -> str:
    """Deterministic, as Kueue's GetWorkloadNameForOwnerWithGVK: a second create answers 409."""
    digest = hashlib.sha256(f"{job_name}/{job_uid}".encode()).hexdigest()[:5]
    return f"asyncgrpojob-{job_name[:40]}-{digest}"


def pod_sets(cluster: Manifest) -> list[Manifest]:
    """One pod set per Ray group of the RayCluster manifest, with its template and count."""
    spec = cluster["spec"]
    sets = [{"name": HEAD_PODSET, "count": 1, "template": copy.deepcopy(spec["headGroupSpec"]["template"])}]
    for group in spec.get("workerGroupSpecs") or []:
        sets.append(
            {
                "name": group["groupName"],
                "count": int(group["replicas"]),
                "template": copy.deepcopy(group["template"]),
            }
        )
    return sets


def digest(sets: Sequence[Mapping[str, Any]], queue: str, priority: Priority | None) -> str:
    payload = {"podSets": sets, "queue": queue, "priority": _priority_spec(priority)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


Amounts = tuple[tuple[str, "Decimal | str"], ...]
PodSetShape = tuple[str, int, tuple[tuple[str, Amounts, Amounts], ...], Amounts]
"""What Kueue counts of one pod set: its name, its pod count, each container's (init containers
first) requests and limits, and the pod's overhead; quantities as values."""


def quota_shapes(sets: Sequence[Mapping[str, Any]]) -> tuple[PodSetShape, ...]:
    """The pod sets as Kueue counts them, to tell whether an admitted Workload still covers a job.

    Only what quota is computed from, as Kueue's jobframework compares an admitted Workload with its
    job (equality.ComparePodSetSlices): a retry's new attempt label or env, or a flavor's node
    labels, change no quota and must not requeue a running job. Quantities compare by value: the API
    server stores the Workload's in canonical form ("2048Mi" reads back as "2Gi")."""
    shapes: list[PodSetShape] = []
    for pod_set in sets:
        spec = (pod_set.get("template") or {}).get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        shapes.append(
            (
                str(pod_set.get("name", "")),
                int(pod_set.get("count", 1)),  # Kueue's default; its CRD makes it an integer
                tuple(
                    (
                        str(c.get("name", "")),
                        _amounts((c.get("resources") or {}).get("requests")),
                        _amounts((c.get("resources") or {}).get("limits")),
                    )
                    for c in containers
                    if isinstance(c, Mapping)
                ),
                _amounts(spec.get("overhead")),
            )
        )
    return tuple(shapes)


def shape_changes(wanted: Sequence[PodSetShape], counted: Sequence[PodSetShape]) -> list[str]:
    """How the pod sets a job would run differ from those Kueue counted, one phrase per pod set."""
    have = {shape[0]: shape for shape in counted}
    changes = []
    for shape in wanted:
        old = have.pop(shape[0], None)
        if old is None:
            changes.append(f"pod set {shape[0]} is new")
        elif old[1] != shape[1]:
            changes.append(f"pod set {shape[0]} has {shape[1]} pods, Kueue admitted {old[1]}")
        elif old != shape:
            changes.append(f"pod set {shape[0]} asks for other resources than Kueue admitted")
    changes.extend(f"pod set {name} is gone" for name in have)
    return changes


def _amounts(values: Any) -> Amounts:
    if not isinstance(values, Mapping):
        return ()
    return tuple(sorted((str(k), _value(v)) for k, v in values.items()))


def _value(raw: Any) -> Decimal | str:
    """A quantity's value; its text when it is none (it then compares as written)."""
    try:
        return quantity.parse(str(raw))
    except ValueError:
        return str(raw)


def manifest(
    job: AsyncGRPOJob, owner: Owner | None, cluster: Manifest, priority: Priority | None
) -> Manifest:
    """The job's Workload: its pod sets from the RayCluster the job would run (`cluster`). Without
    an owner (`asyncgrpo render`, before the job exists) the name, the job-uid label and the
    ownerReference, which all need the job's UID, are left out."""
    queue = job.kueue_queue_name
    assert queue is not None, "only a job Kueue manages has a Workload"
    sets = pod_sets(cluster)
    labels = {naming.JOB_NAME_LABEL: job.metadata.name}
    metadata: Manifest = {
        "labels": labels,
        "annotations": {DIGEST_ANNOTATION: digest(sets, queue, priority)},
    }
    if owner is not None:
        metadata["name"] = workload_name(job.metadata.name, owner.uid)
        labels[JOB_UID_LABEL] = owner.uid
        metadata["ownerReferences"] = [owner_reference(owner)]
    if job.metadata.namespace:
        metadata["namespace"] = job.metadata.namespace
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": metadata,
        "spec": {"queueName": queue, "podSets": sets, "active": True, **_priority_spec(priority)},
    }


def spec_update(desired: Manifest) -> Manifest:
    """The merge patch that brings a Workload Kueue has not reserved quota for to `desired`."""
    return {
        "metadata": {"annotations": desired["metadata"]["annotations"]},
        "spec": {k: desired["spec"].get(k) for k in ("queueName", "podSets", "priorityClassRef", "priority")},
    }


def adoption(owner: Owner) -> Manifest:
    """The merge patch that makes a job the controller of the prebuilt Workload MultiKueue created
    for it on a worker cluster (Kueue's EnsurePrebuiltWorkloadOwnership: the controller
    ownerReference and the job-uid label; the spec is MultiKueue's and is never written)."""
    return {"metadata": {"ownerReferences": [owner_reference(owner)], "labels": {JOB_UID_LABEL: owner.uid}}}


def _priority_spec(priority: Priority | None) -> Manifest:
    if priority is None:
        return {}
    ref = {"group": priority.group, "kind": priority.kind, "name": priority.name}
    return {"priorityClassRef": ref, "priority": priority.value}


# --- admission: what Kueue's assignment puts into the pods ------------------------------------------


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor's scheduling constraints (spec.nodeLabels, spec.tolerations)."""

    name: str
    node_labels: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, flavor: Mapping[str, Any]) -> Flavor:
        spec = flavor.get("spec") or {}
        return cls(
            name=str((flavor.get("metadata") or {}).get("name", "")),
            node_labels={str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()},
            tolerations=tuple(t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)),
        )


class FlavorConflictError(ValueError):
    """A flavor's node label contradicts the pod's own nodeSelector (Kueue: a permanent error)."""


def inject_flavors(
    cluster: Manifest, assignments: Mapping[str, Sequence[str]], flavors: Mapping[str, Flavor]
) -> Manifest:
    """The RayCluster with each group's pods constrained to the flavors Kueue assigned its pod set:
    their node labels join the nodeSelector, their tolerations the tolerations, and the pods get
    Kueue's pod-set label. Raises FlavorConflictError (naming the group, label and both values)."""
    out = copy.deepcopy(cluster)
    spec = out["spec"]
    groups = [(HEAD_PODSET, spec["headGroupSpec"])] + [
        (g["groupName"], g) for g in spec.get("workerGroupSpecs") or []
    ]
    for name, group in groups:
        template = group["template"]
        pod = template.setdefault("spec", {})
        template.setdefault("metadata", {}).setdefault("labels", {})[PODSET_LABEL] = name
        for flavor_name in assignments.get(name, ()):
            flavor = flavors.get(flavor_name)
            if flavor is None:
                continue
            selector = pod.setdefault("nodeSelector", {})
            for key, value in flavor.node_labels.items():
                if selector.get(key, value) != value:
                    raise FlavorConflictError(
                        f"pod set {name}: ResourceFlavor {flavor.name} needs node label {key}={value} but "
                        f"the pods' nodeSelector has {key}={selector[key]}; drop it from the job's "
                        "placement or queue the job where the flavor agrees"
                    )
                selector[key] = value
            tolerations = pod.setdefault("tolerations", [])
            for toleration in flavor.tolerations:
                if dict(toleration) not in tolerations:
                    tolerations.append(dict(toleration))
            if not selector:
                del pod["nodeSelector"]
            if not tolerations:
                del pod["tolerations"]
    return out


# --- the Workload's status as the job's controller writes it -----------------------------------


def _set(
    conditions: list[Manifest], type_: str, status: bool, reason: str, message: str, *, now: str
) -> None:
    """metav1.Condition semantics: lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    for cond in conditions:
        if cond.get("type") == type_:
            if cond.get("status") != value:
                cond["lastTransitionTime"] = now
            cond.update(status=value, reason=reason, message=message[:32768])
            return
    conditions.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": now,
        }
    )


def released(
    conditions: Sequence[Mapping[str, Any]],
    accumulated_seconds: int,
    admitted_at: datetime | None,
    *,
    reason: str,
    message: str,
    now: datetime,
) -> Manifest:
    """The status patch that gives an evicted Workload's quota back once its pods are gone."""
    stamp = _iso(now)
    out = [dict(c) for c in conditions]
    _set(out, "QuotaReserved", False, "Pending", message, now=stamp)
    _set(out, "Admitted", False, "NoReservation", "The workload has no reservation", now=stamp)
    _set(out, "Requeued", reason in REQUEUED_REASONS, reason, message, now=stamp)
    if any(c.get("type") == "PodsReady" for c in out):  # as Kueue's job reconciler: not admitted, not started
        _set(out, "PodsReady", False, "WaitForStart", "Not all pods are ready or succeeded", now=stamp)
    status: Manifest = {"conditions": out, "admission": None}
    if admitted_at is not None:  # as Kueue's SyncAdmittedCondition: the admitted time adds up
        status["accumulatedPastExecutionTimeSeconds"] = accumulated_seconds + max(
            int((now - admitted_at).total_seconds()), 0
        )
    return status


def with_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: datetime,
) -> Manifest:
    """The status patch that sets one condition (PodsReady, Finished), keeping the others."""
    out = [dict(c) for c in conditions]
    _set(out, type_, status, reason, message, now=_iso(now))
    return {"conditions": out}


def _iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "API_VERSION",
    "FRAMEWORK",
    "KUEUE_QUEUE_LABEL",
    "Flavor",
    "FlavorConflictError",
    "Priority",
    "adoption",
    "inject_flavors",
    "manifest",
    "pod_sets",
    "quota_shapes",
    "released",
    "shape_changes",
    "spec_update",
    "with_condition",
    "workload_name",
]
