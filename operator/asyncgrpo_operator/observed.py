"""What the operator observed about a job's children, as small immutable views.

The reconciler reads RayClusters, pods and the driver's /progress document; this module turns
those raw dicts into the few facts the plan needs (is the head pod bound, why is a container
waiting, how did the driver exit). Pure and tolerant: a missing field is an unknown fact, never an
exception, because the objects are written by other controllers (KubeRay, the kubelet, kwok).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_api.v1alpha1.job import MAX_PROGRESS_INT
from asyncgrpo_api.v1alpha1.placement import MAX_AUTOSCALING_WINDOW_STEPS
from asyncgrpo_operator import naming
from asyncgrpo_operator.workload import Flavor, PodSetShape, Priority, quota_shapes

ContainerPhase = Literal["waiting", "running", "terminated", "unknown"]

MAX_TEXT = 1024
"""The longest reason or message a view keeps (a status is read by people, not archived): what
the kubelet, the scheduler or a container's termination log say can be several KiB, and the
watches keep a view of every pod anyone labels with a job's name."""
MAX_CONTAINERS = 16
"""The most container statuses a pod's view keeps: the driver's and the Ray head's first, then
the others in the pod's order (the plan reads those two, and any other's waiting reason)."""


@dataclass(frozen=True)
class ContainerView:
    """One container status: its state and, once terminated, how it ended."""

    name: str
    state: ContainerPhase
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> ContainerView:
        state = status.get("state") or {}
        name = str(status.get("name", ""))
        if "terminated" in state:
            term = state["terminated"] or {}
            return cls(
                name=name,
                state="terminated",
                reason=_text(term.get("reason")),
                message=_text(term.get("message")),
                exit_code=_int_or_none(term.get("exitCode")),
                signal=_int_or_none(term.get("signal")),
                finished_at=parse_time(term.get("finishedAt")),
            )
        if "running" in state:
            return cls(name=name, state="running")
        if "waiting" in state:
            wait = state["waiting"] or {}
            return cls(
                name=name,
                state="waiting",
                reason=_text(wait.get("reason")),
                message=_text(wait.get("message")),
            )
        return cls(name=name, state="unknown")


@dataclass(frozen=True)
class ConfigMapView:
    """A job's spec ConfigMap from its metadata alone: who controls it, and the digest of the data
    the operator wrote (never the data: anyone who may create ConfigMaps could make each 1 MiB)."""

    name: str
    owner_uid: str | None
    """The controller owner's UID: only a ConfigMap whose owner is the job may be written."""
    digest: str
    """Its `naming.SPEC_DIGEST_ANNOTATION` ("" when it has none: it is written again)."""
    resource_version: str
    """What a write of its data is conditioned on, so that it cannot overwrite an object that
    changed hands since it was read."""

    @classmethod
    def from_dict(cls, configmap: Mapping[str, Any]) -> ConfigMapView:
        meta = configmap.get("metadata") or {}
        return cls(
            name=str(meta.get("name", "")),
            owner_uid=_controller_uid(meta),
            digest=str((meta.get("annotations") or {}).get(naming.SPEC_DIGEST_ANNOTATION) or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
        )


@dataclass(frozen=True)
class PodView:
    """A pod of a job's RayCluster (head or worker)."""

    name: str
    uid: str
    node_type: str
    group: str
    owner_uid: str | None
    phase: str = "Pending"
    cluster: str = ""
    """KubeRay's ray.io/cluster label: the RayCluster name the pod belongs to by KubeRay's count
    (KubeRay selects pods by this label, not by owner)."""
    reason: str = ""
    message: str = ""
    ip: str | None = None
    node_name: str | None = None
    deleting: bool = False
    ready: bool = False
    unschedulable: str | None = None
    """The scheduler's message when PodScheduled is False with reason Unschedulable."""
    gated: str | None = None
    """Set when the pod waits on scheduling gates (Kueue, KAI)."""
    disrupted: str | None = None
    """The DisruptionTarget condition's message (eviction, preemption, node loss)."""
    containers: tuple[ContainerView, ...] = ()

    @property
    def is_head(self) -> bool:
        return self.node_type == "head"

    @property
    def scheduled(self) -> bool:
        return bool(self.node_name)

    def container(self, name: str) -> ContainerView | None:
        """The status of a container by name (status order is not spec order)."""
        for view in self.containers:
            if view.name == name:
                return view
        return None

    @classmethod
    def from_dict(cls, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
        scheduled = conditions.get("PodScheduled") or {}
        unschedulable = gated = None
        if scheduled.get("status") == "False":
            if scheduled.get("reason") == "Unschedulable":
                unschedulable = _text(scheduled.get("message")) or "no node fits the pod"
            elif scheduled.get("reason") == "SchedulingGated":
                gated = _text(scheduled.get("message")) or "the pod has scheduling gates"
        disruption = conditions.get("DisruptionTarget") or {}
        statuses = list(status.get("initContainerStatuses") or []) + list(
            status.get("containerStatuses") or []
        )
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            node_type=str(labels.get(naming.RAY_NODE_TYPE_LABEL, "")),
            group=str(labels.get(naming.RAY_GROUP_LABEL, "")),
            owner_uid=_controller_uid(meta),
            phase=str(status.get("phase") or "Pending"),
            cluster=str(labels.get(naming.RAY_CLUSTER_LABEL, "")),
            reason=_text(status.get("reason")),
            message=_text(status.get("message")),
            ip=status.get("podIP") or None,
            node_name=spec.get("nodeName") or None,
            deleting=bool(meta.get("deletionTimestamp")),
            ready=(conditions.get("Ready") or {}).get("status") == "True",
            unschedulable=unschedulable,
            gated=gated,
            disrupted=(
                _text(disruption.get("message") or disruption.get("reason")) or "disrupted"
                if disruption.get("status") == "True"
                else None
            ),
            containers=_kept(ContainerView.from_status(s) for s in statuses if isinstance(s, Mapping)),
        )


@dataclass(frozen=True)
class ClusterView:
    """A RayCluster of the job (any attempt)."""

    name: str
    uid: str
    attempt: int | None = None
    owner_uid: str | None = None
    """The UID of its controller ownerReference: only a cluster owned by the job is the job's."""
    deleting: bool = False
    created_at: datetime | None = None
    provisioned: bool = False
    """KubeRay's RayClusterProvisioned: all pods were ready once (never flips back)."""
    replica_failure: str | None = None
    """KubeRay's ReplicaFailure message (e.g. pods rejected by a quota)."""
    suspended: bool = False
    """spec.suspend of the RayCluster: set while the job is suspended or not admitted by Kueue."""
    suspend_complete: bool = False
    """KubeRay's RayClusterSuspended: every pod is gone and RayClusterProvisioned was reset."""
    head_pod: str = ""
    """KubeRay's status.head.podName: the head pod KubeRay created for it ("" while it reports
    none). Written through the status subresource, which a job's author cannot write, unlike a
    pod's labels and ownerReferences (`is_kuberay_head`)."""
    worker_groups: int = 0
    """How many worker groups its spec has (each one's replicas are what KubeRay keeps running)."""
    worker_replicas: int = 0
    """The sum of its worker groups' spec replicas: 0 once the workers are scaled away."""
    generation_group: int | None = None
    """The index of its generation worker group in spec.workerGroupSpecs (None: it has none)."""
    generation_replicas: int = 0
    """That group's spec replicas: the generation fleet's size, which an elastic job's operator sets."""

    @classmethod
    def from_dict(cls, cluster: Mapping[str, Any]) -> ClusterView:
        meta = cluster.get("metadata") or {}
        status = cluster.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
        failure = conditions.get("ReplicaFailure") or {}
        groups = [
            g for g in (cluster.get("spec") or {}).get("workerGroupSpecs") or [] if isinstance(g, Mapping)
        ]
        named = [i for i, g in enumerate(groups) if g.get("groupName") == naming.GENERATION_GROUP]
        generation = named[0] if named else None
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            attempt=_int_or_none((meta.get("labels") or {}).get(naming.ATTEMPT_LABEL)),
            owner_uid=_controller_uid(meta),
            deleting=bool(meta.get("deletionTimestamp")),
            created_at=parse_time(meta.get("creationTimestamp")),
            provisioned=(conditions.get("RayClusterProvisioned") or {}).get("status") == "True",
            replica_failure=(
                _text(failure.get("message") or failure.get("reason")) or "replica failure"
                if failure.get("status") == "True"
                else None
            ),
            suspended=bool((cluster.get("spec") or {}).get("suspend")),
            suspend_complete=(conditions.get("RayClusterSuspended") or {}).get("status") == "True",
            head_pod=str((status.get("head") or {}).get("podName") or ""),
            worker_groups=len(groups),
            worker_replicas=sum(_int_or_none(g.get("replicas")) or 0 for g in groups),
            generation_group=generation,
            generation_replicas=(
                _int_or_none(groups[generation].get("replicas")) or 0 if generation is not None else 0
            ),
        )


def kuberay_head_exit(pod: PodView, clusters: Iterable[ClusterView]) -> DriverExit | None:
    """The driver exit a watch event shows, worth remembering only when `pod` is the head pod
    KubeRay created for one of the job's `clusters` (`is_kuberay_head`)."""
    exit_ = DriverExit.from_pod(pod)
    if exit_ is None or not any(is_kuberay_head(pod, c) for c in clusters):
        return None
    return exit_


def is_kuberay_head(pod: PodView, cluster: ClusterView) -> bool:
    """`pod` is the head pod KubeRay created for `cluster`, the only pod whose driver's exit
    decides the attempt and whose /progress is read. Anyone who may create pods in the namespace
    can give one the head's labels and a controller ownerReference to the RayCluster (the API
    server checks neither), and its driver container could "exit 0" to finish the job and get
    the real cluster deleted; so the pod must also be the one KubeRay names in the cluster's
    status, besides carrying KubeRay's labels for that cluster and its owner UID."""
    return (
        pod.is_head
        and pod.owner_uid == cluster.uid
        and pod.cluster == cluster.name
        and bool(cluster.head_pod)
        and pod.name == cluster.head_pod
    )


@dataclass(frozen=True)
class DriverExit:
    """How the driver container of one head pod ended; remembered across the pod's deletion."""

    cluster_uid: str
    pod_name: str
    exit_code: int
    signal: int | None = None
    reason: str = ""
    message: str = ""
    whole_pod: bool = False
    """The whole head pod ended (Failed phase, or the Ray head container ended too): the pod was
    killed, evicted or lost its node, so a non-zero code is the infrastructure's, not training's."""
    finished_at: datetime | None = None
    """When the container ended (the kubelet's finishedAt): an exit from before Kueue admitted the
    cluster again belongs to the run that Kueue's preemption stopped, not to the resumed one."""

    @classmethod
    def from_pod(cls, pod: PodView) -> DriverExit | None:
        """The exit of the pod's driver container, or None while it has not terminated."""
        driver = pod.container(naming.DRIVER_CONTAINER)
        if driver is None or driver.state != "terminated" or pod.owner_uid is None:
            return None
        code = driver.exit_code
        if code is None:
            code = 128 + driver.signal if driver.signal else 1
        ray = pod.container(naming.RAY_HEAD_CONTAINER)
        return cls(
            cluster_uid=pod.owner_uid,
            pod_name=pod.name,
            exit_code=code,
            signal=driver.signal,
            reason=driver.reason,
            message=driver.message,
            whole_pod=pod.phase in ("Failed", "Succeeded") or (ray is not None and ray.state == "terminated"),
            finished_at=driver.finished_at,
        )


@dataclass(frozen=True)
class FleetWindow:
    """One step's window of who waited for whom, as the driver measured it (`fleet_window` of the
    trainer's progress): what the elastic fleet's rule reads (asyncgrpo_operator.elastic)."""

    step: int
    seconds: float
    policy_idle_share: float
    """The share the policy waited for rollouts."""
    generation_idle_share: float
    """The engines' mean share with no request."""
    generation_gated_share: float
    """The engines' mean share idle while the staleness gate held groups back."""
    generation_engines: int

    @classmethod
    def from_json(cls, doc: Any) -> FleetWindow | None:
        """None for a window that is not one (the driver runs the job author's code)."""
        if not isinstance(doc, Mapping):
            return None
        step, engines = _count(doc.get("step")), _count(doc.get("generationEngines"))
        seconds = _float_or_none(doc.get("seconds"))
        shares = [
            _share(doc.get(k)) for k in ("policyIdleShare", "generationIdleShare", "generationGatedShare")
        ]
        if step is None or engines is None or seconds is None or None in shares:
            return None
        policy, idle, gated = (float(x) for x in shares if x is not None)
        return cls(step, seconds, policy, idle, gated, engines)


@dataclass(frozen=True)
class ProgressReading:
    """One /progress document from the driver (field names as on the wire, camelCase)."""

    step: int = 0
    max_steps: int = 0
    policy_version: int = 0
    reward_mean: float | None = None
    accuracy: float | None = None
    mean_staleness: float | None = None
    mean_oldest_staleness: float | None = None
    behaviour_kl: float | None = None
    is_out_of_bounds: float | None = None
    tokens_per_second: float | None = None
    last_checkpoint_step: int | None = None
    durable_checkpoint_step: int | None = None
    validation_reward: float | None = None
    reward_failures: int = 0
    data_warning: str | None = None
    validation_accuracy: float | None = None
    logprob_mismatch: str | None = None
    """Set while the driver's log-prob gate is tripped (trainer logprob_gate): why, in one line."""
    policy_idle_share: float | None = None
    generation_idle_share: float | None = None
    generation_gated_share: float | None = None
    buffer_fill: float | None = None
    refit_seconds: float | None = None
    samples_untrained: int | None = None
    first_step_at: datetime | None = None
    """When the attempt's driver trained its first step."""
    windows: tuple[FleetWindow, ...] = ()
    """The latest step windows, oldest first (at most MAX_AUTOSCALING_WINDOW_STEPS)."""
    drained_workers: tuple[str, ...] = ()
    """Generation worker pods the driver has drained (no group in flight, none to come) and lets
    the operator remove. The trainer does not drain yet, so it reports none."""
    state: str = "starting"
    error: str | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ProgressReading:
        """Parse leniently: unknown keys are ignored, wrong types become unknown values."""
        return cls(
            step=_count(doc.get("step")) or 0,
            max_steps=_count(doc.get("maxSteps")) or 0,
            policy_version=_count(doc.get("policyVersion")) or 0,
            reward_mean=_rounded(_float_or_none(doc.get("rewardMean")), 4),
            accuracy=_rounded(_float_or_none(doc.get("accuracy")), 4),
            mean_staleness=_rounded(_float_or_none(doc.get("meanStaleness")), 3),
            mean_oldest_staleness=_rounded(_float_or_none(doc.get("meanOldestStaleness")), 3),
            behaviour_kl=_rounded(_float_or_none(doc.get("behaviourKl")), 5),
            is_out_of_bounds=_rounded(_float_or_none(doc.get("isOutOfBounds")), 4),
            tokens_per_second=_rounded(_float_or_none(doc.get("tokensPerSecond")), 1),
            last_checkpoint_step=_count(doc.get("lastCheckpointStep")),
            durable_checkpoint_step=_count(doc.get("durableCheckpointStep")),
            validation_reward=_rounded(_float_or_none(doc.get("validationReward")), 4),
            reward_failures=_count(doc.get("rewardFailures")) or 0,
            data_warning=str(doc["dataWarning"]) if doc.get("dataWarning") else None,
            validation_accuracy=_rounded(_float_or_none(doc.get("validationAccuracy")), 4),
            logprob_mismatch=str(doc["logprobMismatch"]) if doc.get("logprobMismatch") else None,
            policy_idle_share=_rounded(_share(doc.get("policyIdleShare")), 3),
            generation_idle_share=_rounded(_share(doc.get("generationIdleShare")), 3),
            generation_gated_share=_rounded(_share(doc.get("generationGatedShare")), 3),
            buffer_fill=_rounded(_share(doc.get("bufferFill")), 3),
            refit_seconds=_rounded(_float_or_none(doc.get("refitSeconds")), 4),
            samples_untrained=_count(doc.get("samplesUntrained")),
            first_step_at=_epoch(doc.get("firstStepAt")),
            windows=_windows(doc.get("windows")),
            drained_workers=tuple(
                str(p) for p in (doc.get("drainedWorkers") or [])[:MAX_DRAINED] if isinstance(p, str)
            ),
            state=str(doc.get("state") or "starting"),
            error=str(doc["error"]) if doc.get("error") else None,
        )


MAX_DRAINED = 1024
"""The most drained workers a reading keeps (a generation pool's largest maxReplicas)."""


def _share(value: Any) -> float | None:
    """A share in [0, 1], else None."""
    number = _float_or_none(value)
    return number if number is not None and 0 <= number <= 1 else None


def _epoch(value: Any) -> datetime | None:
    """Epoch seconds as a time, else None."""
    number = _float_or_none(value)
    if number is None:
        return None
    try:
        return datetime.fromtimestamp(number, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _windows(value: Any) -> tuple[FleetWindow, ...]:
    if not isinstance(value, list):
        return ()
    parsed = (FleetWindow.from_json(w) for w in value[-MAX_AUTOSCALING_WINDOW_STEPS:])
    return tuple(w for w in parsed if w is not None)


def _rounded(value: float | None, digits: int) -> float | None:
    """Status is read by people in `kubectl get agj`: 0.4125, not 0.4124999977648258. Rounding
    also keeps a float's last bits from changing the status (and waking watchers) for nothing."""
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class ProgressMark:
    """When the driver's step last advanced, per RayCluster: the memory behind Stalled."""

    cluster_uid: str
    step: int
    since: datetime


@dataclass(frozen=True)
class CreateFailure:
    """The API server refused to create an attempt's RayCluster (remembered between passes)."""

    cluster: str
    status: int
    """The HTTP status: 422 invalid, 403 forbidden (RBAC, quota, a policy), 404 no such resource
    (KubeRay's CRD is not installed), 5xx (e.g. a failing admission webhook)."""
    message: str
    """The API server's message, as it gave it."""
    at: datetime
    count: int = 1
    """Failures in a row for this cluster name: the retry backs off with it."""
    generation: int = 0
    """metadata.generation of the job when it failed: a changed spec is retried at once."""


@dataclass(frozen=True)
class WorkloadView:
    """The job's Kueue Workload (workload.py): whether Kueue admitted it and, if not, Kueue's reason;
    what it assigned; and what the operator needs to write its status back."""

    name: str
    job_uid: str
    admitted: bool
    reason: str
    """Kueue's reason: Evicted's (Preempted, PodsReadyTimeout, ...) while evicted, QuotaReserved's
    (Pending, Inadmissible) while waiting for quota, Admitted's while admission checks run, else
    Admitted."""
    message: str
    uid: str = ""
    resource_version: str = ""
    preempted: bool = False
    """Evicted with reason Preempted and not admitted again yet."""
    admitted_at: datetime | None = None
    evicted: bool = False
    """Evicted True: the job must stop (and, once stopped, give its quota back)."""
    quota_reserved: bool = False
    active: bool = True
    finished: bool = False
    pods_ready: bool | None = None
    digest: str = ""
    """The pod-set digest annotation it was written with (workload.DIGEST_ANNOTATION)."""
    shapes: tuple[PodSetShape, ...] = ()
    """Its pod sets as Kueue counts them (workload.quota_shapes of spec.podSets): what an admitted
    job may run."""
    assignments: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Pod set name -> the ResourceFlavors Kueue assigned it (status.admission)."""
    conditions: tuple[Mapping[str, Any], ...] = ()
    accumulated_seconds: int = 0
    """status.accumulatedPastExecutionTimeSeconds: time admitted before the current admission."""
    requeue_count: int = 0
    controller_uid: str = ""
    """The UID of the object that controls it ("" while none does: a prebuilt Workload that
    MultiKueue created on a worker cluster before the job it stands for)."""
    priority: Priority | None = None
    """spec.priorityClassRef and spec.priority, as written (by this operator or, for a prebuilt
    Workload, by the manager cluster's)."""

    @classmethod
    def from_dict(cls, workload: Mapping[str, Any]) -> WorkloadView:
        meta = workload.get("metadata") or {}
        status = workload.get("status") or {}
        raw = tuple(c for c in status.get("conditions") or [] if isinstance(c, Mapping))
        conditions = {c.get("type"): c for c in raw}

        def true(type_: str) -> Mapping[str, Any] | None:
            cond = conditions.get(type_)
            return cond if cond is not None and cond.get("status") == "True" else None

        admitted = true("Admitted")
        evicted = true("Evicted")
        reserved = conditions.get("QuotaReserved") or {}
        requeued = true("Requeued")
        if evicted is not None and reserved.get("status") != "True" and requeued is not None:
            # evicted, stopped, its quota given back and queued again (until Kueue reserves anew)
            reason = "Requeued"
            message = (
                f"requeued after {evicted.get('reason') or 'an eviction'}: {evicted.get('message') or ''}"
            )
        elif evicted is not None:
            reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "")
        elif admitted is not None:
            reason, message = "Admitted", str(admitted.get("message") or "admitted by Kueue")
        elif reserved.get("status") != "True":
            reason = str(reserved.get("reason") or "Pending")
            message = str(reserved.get("message") or "waiting for quota in its ClusterQueue")
        else:
            pending = conditions.get("Admitted") or {}
            reason = str(pending.get("reason") or "WaitingForAdmissionChecks")
            message = str(pending.get("message") or "quota reserved; waiting for admission checks")
        admission = status.get("admission") or {}
        assignments = {
            str(a.get("name", "")): tuple(sorted({str(f) for f in (a.get("flavors") or {}).values()}))
            for a in admission.get("podSetAssignments") or []
            if isinstance(a, Mapping)
        }
        ready = conditions.get("PodsReady")
        return cls(
            name=str(meta.get("name", "")),
            job_uid=str((meta.get("labels") or {}).get(KUEUE_JOB_UID_LABEL, "")),
            admitted=admitted is not None and evicted is None,
            reason=reason,
            message=message,
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            preempted=evicted is not None and evicted.get("reason") == "Preempted",
            admitted_at=parse_time(admitted.get("lastTransitionTime")) if admitted is not None else None,
            evicted=evicted is not None,
            quota_reserved=reserved.get("status") == "True",
            active=(workload.get("spec") or {}).get("active", True) is not False,
            finished=true("Finished") is not None,
            pods_ready=None if ready is None else ready.get("status") == "True",
            digest=str((meta.get("annotations") or {}).get(WORKLOAD_DIGEST_ANNOTATION, "")),
            shapes=quota_shapes(
                [p for p in (workload.get("spec") or {}).get("podSets") or [] if isinstance(p, Mapping)]
            ),
            assignments=assignments,
            conditions=raw,
            accumulated_seconds=_count(status.get("accumulatedPastExecutionTimeSeconds")) or 0,
            requeue_count=_count((status.get("requeueState") or {}).get("count")) or 0,
            controller_uid=next(
                (
                    str(ref.get("uid", ""))
                    for ref in meta.get("ownerReferences") or []
                    if isinstance(ref, Mapping) and ref.get("controller")
                ),
                "",
            ),
            priority=_priority(workload.get("spec") or {}),
        )


def _priority(spec: Mapping[str, Any]) -> Priority | None:
    ref = spec.get("priorityClassRef")
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return Priority(
        str(ref.get("group", "")),
        str(ref.get("kind", "")),
        str(ref["name"]),
        _int_or_none(spec.get("priority")) or 0,
    )


KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""Kueue labels a Workload with the UID of the job it stands for (here: the AsyncGRPOJob)."""
WORKLOAD_DIGEST_ANNOTATION = "asyncgrpo.dev/podsets-digest"


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile pass knows about a job's world, read at `now`."""

    now: datetime
    clusters: tuple[ClusterView, ...] = ()
    pods: tuple[PodView, ...] = ()
    configmap: ConfigMapView | None = None
    """The ConfigMap named like the job's spec ConfigMap, or None when it does not exist. It may be
    someone else's (another owner, or none): the plan then writes nothing to it."""
    remembered_exit: DriverExit | None = None
    """A driver exit seen on a head pod that may be gone by now (KubeRay deletes dead heads)."""
    progress: ProgressReading | None = None
    progress_read_at: datetime | None = None
    """When `progress` was read (passes between two reads reuse it and must not look newer)."""
    progress_error: str | None = None
    progress_mark: ProgressMark | None = None
    create_failure: CreateFailure | None = None
    """The last refused create of a RayCluster of this job, if any."""
    kuberay_missing: str | None = None
    """Set (to the API server's message) when RayClusters cannot even be listed: 404, the ray.io
    API is not served, i.e. KubeRay's CRDs are not installed. `clusters` is then empty."""
    workload: WorkloadView | None = None
    """The job's Kueue Workload, for a job Kueue manages (None: none yet)."""
    kueue_missing: str | None = None
    """Set (to the API server's message) when Workloads cannot be listed: Kueue is not installed."""
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    """The ResourceFlavors the admitted Workload was assigned, by name."""
    priority: Priority | None = None
    """The Workload's priority, resolved from the job's priority class (None: none, or unknown)."""
    priority_error: str | None = None
    """Why the job's priority class could not be resolved (it does not exist)."""
    reported_problem: tuple[str, str] | None = None
    """A dispatched job's Kueue problem (reason, message) whose Warning this operator has posted
    (`Decision.reported_problem`): the same problem is not posted again."""
    runtime: AsyncGRPORuntime | None = None
    """The AsyncGRPORuntime the job names, as read this pass (None: it names none); what it fixes
    goes into the RayCluster."""
    from_cache: bool = False
    """The children were read from watch caches, which may lag behind each other: what is missing
    may only be not seen yet, so a conclusion from a missing child asks for a fresh read first."""


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _text(value: Any) -> str:
    """A reason or message as a view keeps it: at most MAX_TEXT characters."""
    text = str(value or "")
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _kept(containers: Iterable[ContainerView]) -> tuple[ContainerView, ...]:
    """The container statuses a pod's view keeps (MAX_CONTAINERS)."""
    read = (naming.DRIVER_CONTAINER, naming.RAY_HEAD_CONTAINER)
    ordered = sorted(containers, key=lambda view: view.name not in read)
    return tuple(ordered[:MAX_CONTAINERS])


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("uid", "")) or None
    return None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _count(value: Any) -> int | None:
    """A count the driver reported, within what status.progress holds; None when it is none."""
    number = _int_or_none(value)
    return None if number is None else min(max(number, 0), MAX_PROGRESS_INT)


def _float_or_none(value: Any) -> float | None:
    """A finite number, else None (JSON has no infinity or NaN: the status could not be written)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None
