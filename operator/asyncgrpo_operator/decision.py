"""The vocabulary of a decision: condition types and reasons, the actions, the events, and the
draft status a planning pass edits.

plan.py holds the rules; this module holds what they produce and the bookkeeping that keeps a
status honest (lastTransitionTime moves only when a condition's status flips, the phase is
derived from the conditions, one event per transition). Pure, like the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from asyncgrpo_api.v1alpha1 import AsyncGRPOJobStatus, Condition, Phase
from asyncgrpo_operator.manifests import Manifest
from asyncgrpo_operator.observed import ConfigMapView, PodView, ProgressMark

# --- condition types and reasons ------------------------------------------------------------------

SUSPENDED = "Suspended"
QUEUED = "Queued"
"""True while Kueue holds the attempt's RayCluster suspended (waiting for quota, or preempted)."""
PODS_SCHEDULED = "PodsScheduled"
PODS_READY = "PodsReady"
RUNNING = "Running"
STALLED = "Stalled"
LOGPROB_MISMATCH = "LogprobMismatch"
"""True while the driver's log-prob gate is tripped: genLogprobError stayed above
spec.trainer.logprobGate.threshold for logprobGate.steps measured steps in a row."""
RESTARTING = "Restarting"
COMPLETE = "Complete"
"""True once the driver exited 0; the phase is then Succeeded. Named like batch/v1 Job's and
Kubeflow TrainJob's condition, so `kubectl wait --for=condition=Complete` works the same way."""
FAILED = "Failed"
SPEC_VALID = "SpecValid"
"""Present (False) only while a started job's spec fails rules tightened since it was admitted."""
CONDITION_ORDER = (
    SUSPENDED,
    SPEC_VALID,
    QUEUED,
    PODS_SCHEDULED,
    PODS_READY,
    RUNNING,
    STALLED,
    LOGPROB_MISMATCH,
    RESTARTING,
    COMPLETE,
    FAILED,
)
LEGACY_SUCCEEDED = "Succeeded"
"""The Complete condition's type before 0.1.1; a stored status carrying it is read as Complete."""

DEADLINE_EXCEEDED = "DeadlineExceeded"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
TRAINING_ERROR = "TrainingError"
INVALID_SPEC = "InvalidSpec"
INVALID_MODEL = "InvalidModel"
INVALID_DATA = "InvalidData"
OBJECT_STORE_REFUSED = "ObjectStoreRefused"
DRIVER_SUCCEEDED = "DriverSucceeded"
DRIVER_KILLED = "DriverKilled"
RAY_HEAD_UNAVAILABLE = "RayHeadUnavailable"
RAY_WORKER_LOST = "RayWorkerLost"
HEAD_POD_LOST = "HeadPodLost"
CLUSTER_LOST = "RayClusterLost"
UNSCHEDULABLE = "Unschedulable"
CLUSTER_CREATE_FAILED = "ClusterCreateFailed"
KUBERAY_MISSING = "KubeRayMissing"
CLUSTER_NAME_TAKEN = "ClusterNameTaken"
CONFIGMAP_NAME_TAKEN = "ConfigMapNameTaken"
WAITING_FOR_PREVIOUS_CLUSTER = "WaitingForPreviousCluster"
ADMITTED_UNDER_OLDER_RULES = "AdmittedUnderOlderRules"
SPEC_CHANGE_NOT_ADMITTED = "SpecChangeNotAdmitted"
RUNTIME_FORBIDS = "RuntimeForbids"
"""The job's AsyncGRPORuntime refuses it now: changed or deleted since the job was admitted."""
GEN_LOGPROB_ERROR_HIGH = "GenLogprobErrorHigh"

BAD_WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)
"""Container waiting reasons that need a human (bad image, missing Secret, crashing process)."""

_WARNING_REASONS = frozenset(
    {
        UNSCHEDULABLE,
        CLUSTER_CREATE_FAILED,
        KUBERAY_MISSING,
        CLUSTER_NAME_TAKEN,
        CONFIGMAP_NAME_TAKEN,
        ADMITTED_UNDER_OLDER_RULES,
        SPEC_CHANGE_NOT_ADMITTED,
        RUNTIME_FORBIDS,
        "PodCreationFailed",
        "FlavorConflict",
        "PriorityClassNotFound",
        "KueueMissing",
        "PrebuiltWorkloadOutOfSync",
        "PrebuiltWorkloadTaken",
        DEADLINE_EXCEEDED,
        BACKOFF_LIMIT_EXCEEDED,
        TRAINING_ERROR,
        INVALID_SPEC,
        INVALID_MODEL,
        INVALID_DATA,
        OBJECT_STORE_REFUSED,
        DRIVER_KILLED,
        RAY_HEAD_UNAVAILABLE,
        RAY_WORKER_LOST,
        HEAD_POD_LOST,
        CLUSTER_LOST,
        "NoProgress",
        GEN_LOGPROB_ERROR_HIGH,
    }
    | BAD_WAITING_REASONS
)

PROVISIONING_RECHECK_SECONDS = 15.0
"""Safety net while pods start: pod and RayCluster events normally trigger the next pass sooner."""
DELETION_RECHECK_SECONDS = 2.0
MESSAGE_LIMIT = 2048


# --- the decision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyConfigMap:
    """Create the job-spec ConfigMap, or replace the data of `existing` (this job's, as observed)
    when the spec changed."""

    manifest: Manifest
    existing: ConfigMapView | None = None


@dataclass(frozen=True)
class CreateRayCluster:
    """Create the RayCluster of the current attempt (a 409 means it already exists: fine)."""

    manifest: Manifest


@dataclass(frozen=True)
class DeleteRayCluster:
    """Delete a RayCluster (stale attempt, suspend, cleanup); its pods follow by GC."""

    name: str
    uid: str
    why: str


@dataclass(frozen=True)
class DeleteJob:
    """Delete the AsyncGRPOJob itself (ttlSecondsAfterFinished expired); GC takes its children."""

    why: str


@dataclass(frozen=True)
class SetRayClusterSpec:
    """Suspend a RayCluster in place (`spec` None: only spec.suspend is written; KubeRay deletes
    its pods, the cluster and its name stay), or resume it with the spec rendered now (`spec`
    replaces the whole spec: the pods come from it, e.g. with the flavors Kueue assigned this
    time). UID precondition."""

    name: str
    uid: str
    suspend: bool
    spec: Manifest | None
    why: str


@dataclass(frozen=True)
class ScaleRayClusterWorkers:
    """Set every worker group of a RayCluster to zero replicas (KubeRay deletes the worker pods; the
    head, its driver log and the cluster stay): a finished Kueue job's kept cluster gives its
    workers back before Kueue's quota is. UID precondition."""

    name: str
    uid: str
    groups: int
    why: str


@dataclass(frozen=True)
class ScaleGenerationWorkers:
    """Set the replicas of a RayCluster's generation worker group (index `group`): an elastic fleet
    grows, or shrinks by the pods in `remove` (KubeRay's scaleStrategy.workersToDelete), which the
    driver has drained. UID precondition."""

    name: str
    uid: str
    group: int
    replicas: int
    remove: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class DeliverDrain:
    """Ask the job's driver, in pod `head`, to drain generation worker `worker` (POST /drain, sent
    outside the pass by drain.py): planned on every pass until /progress lists it drained, and
    the sender stops when a pass no longer plans it."""

    head: PodView
    worker: str


@dataclass(frozen=True)
class SetJobSuspend:
    """Write the job's spec.suspend: for a job Kueue manages it is Kueue's gate (true until the
    Workload is admitted, true again when it is evicted), as for Kueue's built-in kinds."""

    suspend: bool
    why: str


@dataclass(frozen=True)
class CreateWorkload:
    """Create the job's Kueue Workload (409: it exists, fine)."""

    manifest: Manifest


@dataclass(frozen=True)
class UpdateWorkload:
    """Merge-patch the Workload's pod sets, queue and priority (only while Kueue holds no quota for
    it: the Workload, its creation time and so its place in the queue are kept)."""

    name: str
    resource_version: str
    patch: Manifest


@dataclass(frozen=True)
class AdoptWorkload:
    """On a worker cluster, become the controller of the prebuilt Workload MultiKueue created for
    the job (merge patch of its ownerReferences and job-uid label; its spec stays MultiKueue's)."""

    name: str
    resource_version: str
    patch: Manifest


@dataclass(frozen=True)
class DeleteWorkload:
    """Delete a Workload whose reserved quota no longer matches the job (a new one is created)."""

    name: str
    uid: str
    why: str


@dataclass(frozen=True)
class PatchWorkloadStatus:
    """Write the Workload's status as a job's controller does (quota given back after an eviction,
    PodsReady, Finished); resourceVersion precondition, so Kueue's newer writes win."""

    name: str
    resource_version: str
    status: Manifest
    why: str


Action = (
    ApplyConfigMap
    | CreateRayCluster
    | DeleteRayCluster
    | DeleteJob
    | SetRayClusterSpec
    | ScaleRayClusterWorkers
    | ScaleGenerationWorkers
    | DeliverDrain
    | SetJobSuspend
    | CreateWorkload
    | UpdateWorkload
    | AdoptWorkload
    | DeleteWorkload
    | PatchWorkloadStatus
)


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """The outcome of one reconcile pass."""

    status: AsyncGRPOJobStatus
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    progress_mark: ProgressMark | None = None
    confirm: str | None = None
    """Set when the plan would conclude from a child's absence in a possibly lagging cache: the
    reconciler reads the job's children from the API server and plans again; this decision is
    not applied."""
    writes_status: bool = True
    """False for a job MultiKueue dispatched, on the manager cluster: its status is the worker's,
    which MultiKueue copies over it, so the operator never writes it there."""
    reported_problem: tuple[str, str] | None = None
    """For such a job: the Kueue problem (reason, message) it is held by, if any. It cannot go into
    a status, so the reconciler remembers it (`Observation.reported_problem`) and the plan posts
    its Warning once, not on every pass."""

    def status_patch(self) -> dict[str, Any]:
        """The full status as a JSON merge patch body: cleared fields are null, so they go."""
        return self.status.model_dump(mode="json", by_alias=True)

    def condition(self, type_: str) -> Condition | None:
        """A condition of the new status by type (for tests and logs)."""
        return next((c for c in self.status.conditions if c.type == type_), None)


def derive_phase(conditions: list[Condition]) -> tuple[Phase, str, str]:
    """The printed phase, its reason and message, from the conditions (the truth)."""
    by_type = {c.type: c for c in conditions}

    def true(type_: str) -> Condition | None:
        cond = by_type.get(type_)
        return cond if cond is not None and cond.status == "True" else None

    terminal: tuple[tuple[str, Phase], ...] = (
        (FAILED, "Failed"),
        (COMPLETE, "Succeeded"),
        (SUSPENDED, "Suspended"),
    )
    for type_, phase in terminal:
        if (cond := true(type_)) is not None:
            return phase, cond.reason, cond.message
    if (queued := true(QUEUED)) is not None:
        return "Queued", queued.reason, queued.message
    if (running := true(RUNNING)) is not None:
        stalled = true(STALLED)
        shown = stalled or running
        return "Running", shown.reason, shown.message
    waiting = waiting_on(by_type)
    if (restarting := true(RESTARTING)) is not None:
        now_doing = f" Now: {waiting.reason}: {waiting.message}" if waiting is not None else ""
        return "Restarting", restarting.reason, restarting.message + now_doing
    scheduled = by_type.get(PODS_SCHEDULED)
    if scheduled is not None and scheduled.status == "True":
        if waiting is not None:
            return "Provisioning", waiting.reason, waiting.message
        return "Provisioning", "Provisioning", ""
    if scheduled is not None:
        return "Pending", scheduled.reason, scheduled.message
    return "Pending", "Created", "the operator has not acted on the job yet"


def waiting_on(by_type: dict[str, Condition]) -> Condition | None:
    for type_ in (PODS_SCHEDULED, PODS_READY, RUNNING):
        cond = by_type.get(type_)
        if cond is not None and cond.status != "True":
            return cond
    return None


# --- the draft status -------------------------------------------------------------------------


@dataclass
class Draft:
    """A mutable copy of the status that one pass edits, plus the actions and events it emits."""

    old: AsyncGRPOJobStatus
    now: datetime
    generation: int
    mark: ProgressMark | None
    conditions: dict[str, Condition] = field(default_factory=dict)
    before: dict[str, Condition] = field(default_factory=dict)
    """The stored conditions by type (a legacy Succeeded read as Complete), to tell what changed."""
    fields: dict[str, Any] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeues: list[float] = field(default_factory=list)
    confirm: str | None = None

    def __post_init__(self) -> None:
        self.conditions = {c.type: c for c in self.old.conditions}
        legacy = self.conditions.pop(LEGACY_SUCCEEDED, None)
        if legacy is not None:
            self.conditions.setdefault(COMPLETE, legacy.model_copy(update={"type": COMPLETE}))
        self.before = dict(self.conditions)
        self.fields = {
            name: getattr(self.old, name)
            for name in (
                "admitted_generation",
                "attempt",
                "restarts",
                "start_time",
                "attempt_start_time",
                "completion_time",
                "ray_cluster_name",
                "dashboard_url",
                "head_pod",
                "driver_logs",
                "progress",
                "generation_fleet",
                "outputs",
            )
        }

    # status fields, typed
    @property
    def attempt(self) -> int:
        return int(self.fields["attempt"])

    @property
    def restarts(self) -> int:
        return int(self.fields["restarts"])

    @property
    def finished(self) -> bool:
        return self.is_true(COMPLETE) or self.is_true(FAILED)

    def get(self, name: str) -> Any:
        return self.fields[name]

    def set_field(self, name: str, value: Any) -> None:
        self.fields[name] = value

    def is_true(self, type_: str) -> bool:
        cond = self.conditions.get(type_)
        return cond is not None and cond.status == "True"

    def has(self, type_: str) -> bool:
        return type_ in self.conditions

    def set(self, type_: str, status: bool, reason: str, message: str) -> None:
        """Set a condition; lastTransitionTime moves only when its status flips."""
        value: Literal["True", "False"] = "True" if status else "False"
        old = self.conditions.get(type_)
        since = old.last_transition_time if old is not None and old.status == value else self.now
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 3] + "..."
        self.conditions[type_] = Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message,
            last_transition_time=since,
            observed_generation=self.generation,
        )

    def drop(self, type_: str) -> None:
        self.conditions.pop(type_, None)

    def act(self, action: Action, event: Event | None = None) -> None:
        self.actions.append(action)
        if event is not None:
            self.events.append(event)

    def requeue(self, seconds: float) -> None:
        self.requeues.append(max(seconds, 0.0))

    def decision(self) -> Decision:
        conditions = [
            _with_generation(self.conditions[t], self.generation)
            for t in CONDITION_ORDER
            if t in self.conditions
        ]
        conditions += [c for t, c in sorted(self.conditions.items()) if t not in CONDITION_ORDER]
        phase, reason, message = derive_phase(conditions)
        status = AsyncGRPOJobStatus(
            phase=phase,
            conditions=conditions,
            observed_generation=self.generation,
            reason=reason,
            message=message or None,
            **self.fields,
        )
        return Decision(
            status=status,
            actions=tuple(self.actions),
            events=tuple(self._transition_events(conditions, phase, reason, message)) + tuple(self.events),
            requeue_after=min(self.requeues) if self.requeues else None,
            progress_mark=self.mark,
            confirm=self.confirm,
        )

    def _transition_events(
        self, conditions: list[Condition], phase: str, reason: str, message: str
    ) -> list[Event]:
        """Events for what changed: the phase (with its reason), and each condition that flipped
        or turned to a warning reason. A condition appearing as "not yet" is not news, and a
        condition event that repeats the phase event's reason is dropped."""
        events: list[Event] = []
        old_phase = self.old.phase if self.old.conditions else None
        if phase != old_phase:
            text = f"{old_phase or 'New'} -> {phase}" + (f": {message}" if message else "")
            events.append(Event(_kind(reason, "True"), reason, text))
        for cond in conditions:
            prior = self.before.get(cond.type)
            if prior is None:
                news = cond.status == "True" or cond.reason in _WARNING_REASONS
            elif prior.status != cond.status:
                news = True
            else:
                news = prior.reason != cond.reason and cond.reason in _WARNING_REASONS
            if not news or (phase != old_phase and cond.reason == reason):
                continue
            text = f"{cond.type} is {cond.status}" + (f": {cond.message}" if cond.message else "")
            events.append(Event(_kind(cond.reason, cond.status, cond.type), cond.reason, text))
        return events


def _kind(reason: str, status: str, type_: str = "") -> Literal["Normal", "Warning"]:
    """Warning for reasons that need attention, unless they describe something ending (False)."""
    warn = reason in _WARNING_REASONS and (
        status == "True" or type_ not in (FAILED, STALLED, RESTARTING, LOGPROB_MISMATCH)
    )
    return "Warning" if warn else "Normal"


def _with_generation(cond: Condition, generation: int) -> Condition:
    if cond.observed_generation == generation:
        return cond
    return cond.model_copy(update={"observed_generation": generation})
