"""The operator's brain, as a pure function: (job, its status, what was observed) -> decision.

A decision is the job's next status (conditions first, the printed phase derived from them), the
actions that move the world towards the spec (create the ConfigMap and the attempt's RayCluster,
delete stale or finished clusters, delete the job when its TTL expires), the events to post, and
when to look again. Nothing here does I/O or reads a clock, so every transition is a unit test.

The rules, in the order they are applied:
1. A finished job (Succeeded or Failed) stays finished; only its cleanup policy and TTL act.
2. A suspended job's RayCluster is suspended in place (Suspended): KubeRay deletes its pods, the
   cluster, the attempt and the restart count stay. Resuming restarts the deadline clock, like a
   batch/v1 Job, writes the cluster's spec as rendered now, and the trainer resumes from its
   checkpoint.
3. An active job has exactly one RayCluster, named after its attempt and owned by the job (its
   controller ownerReference carries the job's UID: a cluster with the right name and labels but
   another owner is never adopted nor deleted); owned clusters of other attempts are deleted. A
   create the API server refuses is shown with its message (ClusterCreateFailed, KubeRayMissing)
   and retried with backoff. activeDeadlineSeconds (from status.startTime) and
   startupDeadlineSeconds (from the attempt's first create, until the driver runs) fail it with
   DeadlineExceeded, never retried.
4. The driver's exit decides an attempt: 0 succeeds; 3 and 4 are InvalidModel and InvalidData (the
   model files, or the data files or reward function, are unusable) and any other code 1-128 a
   training error, none of them retried;
   a signal (exit > 128) or a lost head pod or RayCluster is an infrastructure failure, retried
   with a fresh RayCluster while status.restarts < backoffLimit, then BackoffLimitExceeded. A retry
   sets status.progress.step back to the last checkpoint seen, where the next attempt resumes.
5. Otherwise the conditions say where the attempt is: PodsScheduled (Unschedulable with the
   scheduler's message), PodsReady (ImagePullBackOff, HeadNotReady, ...), Running (driver running
   on a provisioned cluster) and Stalled (the step stopped advancing for stallAfterSeconds).
6. A job whose spec the rules refuse is Failed (InvalidSpec), unless it was already started: an
   upgrade never kills a running job. A started job whose spec only fails rules tightened since it
   was admitted keeps running under the spec it has (SpecValid False says why). One whose spec no
   longer parses, changed without passing admission, or is refused by its AsyncGRPORuntime as the
   runtime is now (admitted.py), keeps its running attempt but gets no new one (no retry, no
   resume): when that attempt ends, it is the job's outcome.
7. A job Kueue manages (kueue.x-k8s.io/queue-name) is Kueue's workload (workload.py): it owns a
   Workload; until Kueue admits it the job is suspended (spec.suspend is Kueue's gate) and Queued
   with Kueue's reason; admission unsuspends it and starts the attempt on the assigned flavors,
   its startup deadline running from then; an eviction (preemption, PodsReady timeout) suspends
   the job and its RayCluster in place, spends no backoffLimit, and gives the quota back once the
   pods are gone; readmitted, the same RayCluster resumes from the latest checkpoint, and what the
   stopped run left behind (its deleting pods, its driver's exit) is not taken for the resumed
   run's. activeDeadlineSeconds counts admitted time only. PodsReady and Finished are reported on
   the Workload.
8. MultiKueue (docs/guides/scheduling.md#multikueue). On the manager cluster a job whose
   spec.managedBy is kueue.x-k8s.io/multikueue runs elsewhere (`plan_dispatched`): the operator
   keeps its Workload, so that Kueue queues it and MultiKueue dispatches it, and gives an evicted
   Workload's quota back once the copied status shows the job stopped on its worker, but creates
   no RayCluster and never writes the job's status: MultiKueue copies the worker's over it. On a
   worker cluster the copy MultiKueue created carries the label
   kueue.x-k8s.io/prebuilt-workload-name: the job adopts that
   Workload (MultiKueue created it before the job) instead of creating one, never writes its spec
   nor deletes it, and is Failed (PrebuiltWorkloadOutOfSync) when its pod sets are not the ones
   the Workload was built with.
9. A status that cannot be read at all (`reconciler._parse_status`: absent, or of another type than
   this version's) is rebuilt from the job's own RayCluster of its latest attempt (recovery.py),
   with a Warning: the running attempt and its cluster are kept, not restarted at attempt 0.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta

from asyncgrpo_api import exitcodes, outputs
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus, Progress
from asyncgrpo_api.v1alpha1.job import (
    PREBUILT_WORKLOAD_LABEL,
    TERMINAL_PHASES,
    DrainRequest,
    GenerationFleet,
    Outputs,
)
from asyncgrpo_api.v1alpha1.runtime import CleanupPolicy
from asyncgrpo_operator import elastic, manifests, naming, recovery, workload
from asyncgrpo_operator.decision import (
    ADMITTED_UNDER_OLDER_RULES,
    BACKOFF_LIMIT_EXCEEDED,
    BAD_WAITING_REASONS,
    CLUSTER_CREATE_FAILED,
    CLUSTER_LOST,
    CLUSTER_NAME_TAKEN,
    COMPLETE,
    CONFIGMAP_NAME_TAKEN,
    DEADLINE_EXCEEDED,
    DELETION_RECHECK_SECONDS,
    DRIVER_KILLED,
    DRIVER_SUCCEEDED,
    FAILED,
    GEN_LOGPROB_ERROR_HIGH,
    HEAD_POD_LOST,
    INVALID_DATA,
    INVALID_MODEL,
    INVALID_SPEC,
    KUBERAY_MISSING,
    LOGPROB_MISMATCH,
    OBJECT_STORE_REFUSED,
    PODS_READY,
    PODS_SCHEDULED,
    PROVISIONING_RECHECK_SECONDS,
    QUEUED,
    RAY_HEAD_UNAVAILABLE,
    RAY_WORKER_LOST,
    RESTARTING,
    RUNNING,
    SPEC_VALID,
    STALLED,
    SUSPENDED,
    TRAINING_ERROR,
    UNSCHEDULABLE,
    WAITING_FOR_PREVIOUS_CLUSTER,
    AdoptWorkload,
    ApplyConfigMap,
    CreateRayCluster,
    CreateWorkload,
    Decision,
    DeleteJob,
    DeleteRayCluster,
    DeleteWorkload,
    DeliverDrain,
    Draft,
    Event,
    PatchWorkloadStatus,
    ScaleGenerationWorkers,
    ScaleRayClusterWorkers,
    SetJobSuspend,
    SetRayClusterSpec,
    UpdateWorkload,
    waiting_on,
)
from asyncgrpo_operator.manifests import Manifest, Owner
from asyncgrpo_operator.observed import (
    ClusterView,
    DriverExit,
    Observation,
    PodView,
    ProgressMark,
    ProgressReading,
    WorkloadView,
    is_kuberay_head,
    parse_time,
)

__all__ = ["create_retry_seconds", "plan", "plan_dispatched", "plan_invalid"]

CREATE_RETRY_SECONDS = 5.0
CREATE_RETRY_MAX_SECONDS = 300.0
KUBERAY_RECHECK_SECONDS = 30.0
NAME_TAKEN_RECHECK_SECONDS = 10.0

# --- entry points ---------------------------------------------------------------------------------


def plan(
    job: AsyncGRPOJob,
    status: AsyncGRPOJobStatus | None,
    observed: Observation,
    *,
    generation: int,
    owner: Owner | None,
    spec_errors: tuple[str, ...] = (),
) -> Decision:
    """Decide the next status and actions of a job the operator runs.

    `spec_errors` are the rules a started job's spec fails now but did not when it was admitted
    (the operator was upgraded with tighter rules): the job keeps running, SpecValid says why.
    """
    draft = _draft(status, observed, owner, generation, observed.progress_mark)
    ctx = _Ctx(job, observed, owner)
    _spec_validity(draft, spec_errors)
    if not spec_errors:
        draft.set_field("admitted_generation", generation)
    if draft.finished:
        _cleanup(job.spec.cleanup_policy, draft, _owned(ctx))
    elif job.kueue_queue_name is not None:
        _kueue(ctx, draft)
        draft.set_field("outputs", _outputs(job, draft.attempt))
    elif job.spec.suspend:
        _suspend(ctx, draft)
    else:
        _run(ctx, draft)
        draft.set_field("outputs", _outputs(job, draft.attempt))  # the attempt this pass ends on
    if draft.finished and job.kueue_queue_name is not None:
        _workload_finished(ctx, draft)
    return draft.decision()


def plan_dispatched(
    job: AsyncGRPOJob,
    status: AsyncGRPOJobStatus | None,
    observed: Observation,
    *,
    generation: int,
    owner: Owner | None,
) -> Decision:
    """Decide the Workload actions for a job MultiKueue dispatches, on the manager cluster.

    Kueue's MultiKueue (v0.17.0, pkg/controller/admissionchecks/multikueue) runs the job on a worker
    cluster and copies the worker's job status over this one (externalframeworks/adapter.go,
    syncStatus); once the worker's Workload finishes it finishes this one (workload.go). So here
    the job only needs its Workload: created and kept in step with the spec while Kueue holds no
    quota for it, as for any job Kueue manages, and its quota given back when Kueue evicts it and
    the job has stopped on its worker (`_runs_on_worker`; MultiKueue then removes the worker's
    copy). The returned status is the stored one, unwritten (`writes_status` False).
    """
    stored = status or AsyncGRPOJobStatus()
    draft = Draft(stored, observed.now, generation, None)
    if draft.finished:  # the worker's outcome, copied by MultiKueue: nothing is left to queue
        return Decision(status=stored, writes_status=False)
    ctx = _Ctx(job, observed, owner)
    problem = (
        ("KueueMissing", f"Workloads cannot be listed; is Kueue installed? {observed.kueue_missing}")
        if observed.kueue_missing is not None
        else ("PriorityClassNotFound", observed.priority_error)
        if observed.priority_error is not None
        else None
    )
    if problem is not None:
        # Once per problem, not once a pass: the job has no status of its own to show it in.
        if problem != observed.reported_problem:
            draft.events.append(Event("Warning", *problem))
        if observed.priority_error is not None:  # Kueue's arrival queues every job (its informer)
            draft.requeue(PRIORITY_CLASS_RECHECK_SECONDS)
    else:
        current = observed.workload
        if owner is not None:
            # What runs is the worker's copy, which its own operator compares with the prebuilt
            # Workload on every pass (`_prebuilt_usable`): an admitted mismatch here costs nothing.
            _own_workload(ctx, draft, current)
        if current is not None and current.evicted and current.quota_reserved and not _runs_on_worker(stored):
            _release(
                draft,
                current,
                f"the dispatched job stopped on its worker after Kueue evicted it ({current.reason}): its "
                "quota is given back and MultiKueue removes the worker's copy",
            )
    return Decision(
        status=stored,
        actions=tuple(draft.actions),
        events=tuple(draft.events),
        requeue_after=min(draft.requeues, default=None),
        writes_status=False,
        reported_problem=problem,
    )


def _draft(
    status: AsyncGRPOJobStatus | None,
    observed: Observation,
    owner: Owner | None,
    generation: int,
    mark: ProgressMark | None,
) -> Draft:
    """The pass's draft of the stored status; of one rebuilt from the job's RayClusters when the
    stored one cannot be read but the job has a cluster (recovery.py), with a Warning that says so:
    an empty status would restart the job at attempt 0 and delete the running attempt's cluster."""
    rebuilt = recovery.rebuild(owner, observed.clusters) if status is None else None
    if rebuilt is None:
        return Draft(status or AsyncGRPOJobStatus(), observed.now, generation, mark)
    draft = Draft(rebuilt.status, observed.now, generation, mark)
    draft.events.append(rebuilt.event)
    return draft


def _runs_on_worker(status: AsyncGRPOJobStatus) -> bool:
    """Whether a dispatched job's worker copy may still run pods, by the status MultiKueue last
    copied here. Kueue's jobframework gives an evicted Workload's quota back only once its job is
    not active (reconciler.go, "handle eviction", v0.17.0), which for a job dispatched elsewhere it
    can only read from the copied status: meanwhile MultiKueue has the worker's Workload evicted
    too (workload.go, SetDeactivationTarget), so the worker's operator suspends the job there and
    its driver checkpoints before the copy is deleted."""
    return status.ray_cluster_name is not None and status.phase not in (
        "Queued",
        "Suspended",
        *TERMINAL_PHASES,
    )


NEVER_RUN = "the job is invalid and is never run"
"""How a job refused without a run to keep is failed: its RayClusters are deleted whatever its
cleanup policy says (a run that was kept and then ended is cleaned up by its policy instead)."""


def plan_invalid(
    status: AsyncGRPOJobStatus | None,
    observed: Observation,
    *,
    generation: int,
    message: str,
    cleanup: CleanupPolicy,
    owner: Owner | None,
    reason: str = ADMITTED_UNDER_OLDER_RULES,
) -> Decision:
    """A job the rules reject and the operator will not run by its spec (admitted.py says when).

    - Not started (no webhook installed, or the rules were tightened before it ran): Failed with
      InvalidSpec, its RayClusters deleted whatever its cleanup policy says: such a job never
      holds GPUs.
    - Started, with its attempt's RayCluster running: the attempt is kept (an upgrade never kills
      a running job; SpecValid False with `reason` says which rules the spec breaks), but no new
      attempt is started. Its driver's exit is the job's outcome: 0 Complete, anything else (a lost
      head too) Failed with InvalidSpec, as no retry can be made by a refused spec.
    - Finished: it keeps its outcome.
    `cleanup` is the job's cleanupPolicy as far as it can be read (else the defaults); it applies
    once the job is finished by a kept attempt, and its TTL applies either way."""
    draft = _draft(status, observed, owner, generation, None)
    clusters = tuple(c for c in observed.clusters if owner is None or c.owner_uid == owner.uid)
    if not draft.finished:
        running = _running_attempt(draft, clusters)
        if running is not None:
            if _kept_attempt(draft, observed, running, message, reason):
                return draft.decision()
        else:
            _finish(draft, FAILED, INVALID_SPEC, f"{NEVER_RUN}: {message}")
    failed = draft.conditions.get(FAILED)
    if failed is not None and failed.status == "True" and failed.message.startswith(NEVER_RUN):
        for cluster in clusters:
            if not cluster.deleting:
                why = "the job is invalid: nothing can manage its RayCluster any more"
                draft.act(
                    DeleteRayCluster(cluster.name, cluster.uid, why),
                    Event("Normal", "DeletedRayCluster", f"deleting RayCluster {cluster.name}: {why}"),
                )
        draft.set_field("driver_logs", None)
        clusters = ()
    _cleanup(cleanup, draft, clusters)
    return draft.decision()


def _running_attempt(draft: Draft, clusters: tuple[ClusterView, ...]) -> ClusterView | None:
    """The started job's current RayCluster while its attempt may still be running (not being
    deleted, not suspended): the one thing an invalid spec must not take away."""
    if draft.get("start_time") is None:
        return None
    name = draft.get("ray_cluster_name")
    return next(
        (c for c in clusters if c.name == name and not c.deleting and not c.suspended),
        None,
    )


def _kept_attempt(
    draft: Draft, observed: Observation, cluster: ClusterView, message: str, reason: str
) -> bool:
    """Keep a started attempt whose job's spec is refused; True while it runs. Once its driver has
    exited (or its head is lost) the job is finished by that."""
    pods = [p for p in observed.pods if p.owner_uid == cluster.uid]
    head, exit_ = _head_and_exit(observed, pods, cluster, admitted_at=None)
    if exit_ is not None:
        detail = f": {exit_.message.strip()}" if exit_.message.strip() else ""
        if exit_.exit_code == 0:
            _finish(draft, COMPLETE, DRIVER_SUCCEEDED, f"the driver exited 0 (pod {exit_.pod_name})")
        else:
            _finish(
                draft,
                FAILED,
                INVALID_SPEC,
                f"the driver exited with code {exit_.exit_code} in pod {exit_.pod_name}{detail}; no new "
                f"attempt is started for a refused spec: {message}",
            )
        return False
    lost = _head_lost(draft, cluster, head)
    if lost is not None:
        if head is None and _unconfirmed(observed, draft, lost):
            return True
        refused = f"{lost}; no new attempt is started for a refused spec: {message}"
        _finish(draft, FAILED, INVALID_SPEC, refused)
        return False
    draft.set(
        SPEC_VALID,
        False,
        reason,
        f"{message}. The running attempt ({cluster.name}) goes on as it was admitted, but no new attempt "
        "(a retry, a resume) is started for this spec: fix the spec, or create a new job",
    )
    return True


def create_retry_seconds(failures: int) -> float:
    """The wait before creating a refused RayCluster again: 5 s, doubling, at most 5 minutes."""
    return min(CREATE_RETRY_SECONDS * 2.0 ** max(failures - 1, 0), CREATE_RETRY_MAX_SECONDS)


@dataclass(frozen=True)
class _Ctx:
    """The inputs of one pass that every rule reads."""

    job: AsyncGRPOJob
    observed: Observation
    owner: Owner | None

    def cluster_manifest(self, attempt: int) -> Manifest:
        """The attempt's RayCluster; for a job Kueue admitted, with the flavors it assigned."""
        rendered = manifests.ray_cluster(self.job, attempt, self.owner, self.observed.runtime)
        admission = self.observed.workload
        if self.job.kueue_queue_name is not None and admission is not None and admission.admitted:
            rendered = workload.inject_flavors(rendered, admission.assignments, self.observed.flavors)
        return rendered


def _owned(ctx: _Ctx) -> tuple[ClusterView, ...]:
    """The observed clusters this job controls. A cluster selected by the job-name label but owned
    by something else (a user's, or a deleted namesake job's awaiting garbage collection) is not."""
    if ctx.owner is None:
        return ctx.observed.clusters
    return tuple(c for c in ctx.observed.clusters if c.owner_uid == ctx.owner.uid)


def _configmap_taken(ctx: _Ctx) -> str | None:
    """Why the job's spec ConfigMap cannot be used, or None. A ConfigMap of that name that another
    owner controls (or none) is never written: overwriting it and making the job its owner would
    let anyone who may create jobs replace a ConfigMap they cannot edit, and have the garbage
    collector delete it with the job. Nor may the job's pods mount it as their spec."""
    found = ctx.observed.configmap
    if found is None or ctx.owner is None or found.owner_uid == ctx.owner.uid:
        return None
    return (
        f"ConfigMap {found.name} exists but is not this job's (its controller owner UID is "
        f"{found.owner_uid or 'none'}); it is neither overwritten nor adopted. Delete it or rename the job"
    )


def _spec_validity(draft: Draft, spec_errors: tuple[str, ...]) -> None:
    if not spec_errors:
        draft.drop(SPEC_VALID)
        return
    draft.set(
        SPEC_VALID,
        False,
        ADMITTED_UNDER_OLDER_RULES,
        "the spec fails rules added since the job was admitted; it keeps running as admitted, and a new "
        "job with this spec would be refused: " + "; ".join(spec_errors),
    )


# --- finished jobs: cleanup and TTL -----------------------------------------------------------


def _finish(draft: Draft, outcome: str, reason: str, message: str) -> None:
    """Make the job terminal: the outcome condition True and no sub-status left non-terminal."""
    draft.set(outcome, True, reason, message)
    for type_ in (RUNNING, STALLED, RESTARTING):
        if draft.has(type_) or type_ == RUNNING:
            draft.set(type_, False, reason, "the job has finished")
    draft.drop(PODS_SCHEDULED)
    draft.drop(PODS_READY)
    draft.set_field("completion_time", draft.now)


def _cleanup(policy: CleanupPolicy, draft: Draft, clusters: tuple[ClusterView, ...]) -> None:
    succeeded = draft.is_true(COMPLETE)
    rule = policy.on_success if succeeded else policy.on_failure
    if rule == "DeleteCluster":
        for cluster in clusters:
            if not cluster.deleting:
                why = f"cleanupPolicy.{'onSuccess' if succeeded else 'onFailure'} is DeleteCluster"
                draft.act(
                    DeleteRayCluster(cluster.name, cluster.uid, why),
                    Event("Normal", "DeletedRayCluster", f"deleting RayCluster {cluster.name}: {why}"),
                )
        if draft.get("driver_logs") is not None:
            draft.set_field("driver_logs", None)  # the log went with the head pod
    ttl = policy.ttl_seconds_after_finished
    if ttl is None:
        return
    finished_at: datetime = draft.get("completion_time") or draft.now
    expiry = finished_at + timedelta(seconds=ttl)
    if draft.now >= expiry:
        why = f"ttlSecondsAfterFinished ({ttl} s) expired"
        draft.act(DeleteJob(why), Event("Normal", "TTLExpired", f"deleting the job: {why}"))
    else:
        draft.requeue((expiry - draft.now).total_seconds())


def _fail(ctx: _Ctx, draft: Draft, reason: str, message: str) -> None:
    _finish(draft, FAILED, reason, message)
    _cleanup(ctx.job.spec.cleanup_policy, draft, _owned(ctx))


# --- suspend --------------------------------------------------------------------------------------


def _suspend(ctx: _Ctx, draft: Draft) -> None:
    """spec.suspend true: the attempt's RayCluster is suspended in place (KubeRay deletes its pods,
    whose processes get SIGTERM); the job keeps its attempt, restarts and RayCluster, and resumes
    from the latest checkpoint."""
    owned = _owned(ctx)
    current = naming.raycluster_name(ctx.job.metadata.name, draft.attempt)
    _suspend_clusters(draft, owned, current, "spec.suspend is true")
    uids = {c.uid for c in owned}
    pending = sorted({p.name for p in ctx.observed.pods if p.owner_uid in uids})
    message = "spec.suspend is true: the RayCluster is suspended (its pods are deleted) and the job is kept"
    if pending:
        message += f" ({len(pending)} pods still terminating)"
        draft.requeue(DELETION_RECHECK_SECONDS)
    draft.set(
        SUSPENDED, True, "Suspended", message + "; set it to false to resume from the latest checkpoint"
    )
    for type_ in (RUNNING, STALLED, RESTARTING):
        if draft.has(type_):
            draft.set(type_, False, "Suspended", "the job is suspended")
    draft.drop(PODS_SCHEDULED)
    draft.drop(PODS_READY)
    draft.set_field("attempt_start_time", None)
    draft.set_field("head_pod", None)
    draft.set_field("driver_logs", None)


# --- Kueue: the job is the Workload ---------------------------------------------------------------

PRIORITY_CLASS_RECHECK_SECONDS = 30.0
"""How often a job whose priority class does not exist looks for it again: priority classes are
read by a pass, not watched. Workloads are watched: Kueue's decisions (admission, eviction, its
reason) queue the job's pass themselves, as does Kueue's API becoming served."""


def _kueue(ctx: _Ctx, draft: Draft) -> None:
    """A job Kueue manages, as Kueue's jobframework manages its own kinds (workload.py): the job
    owns one Workload; while it is not admitted the job is suspended and runs no pod; admission
    unsuspends it and starts the pods with the assigned flavors; an eviction suspends the job in
    place and gives the quota back once the pods are gone. The attempt, its RayCluster and the
    Workload (and so its place in the queue) survive all of it."""
    job, observed, owner = ctx.job, ctx.observed, ctx.owner
    queue = job.kueue_queue_name
    assert queue is not None
    if observed.kueue_missing is not None:
        _hold(
            ctx,
            draft,
            None,
            "KueueMissing",
            f"Workloads cannot be listed; is Kueue installed? {observed.kueue_missing}",
        )
        return
    if observed.priority_error is not None:
        _hold(ctx, draft, None, "PriorityClassNotFound", observed.priority_error)
        draft.requeue(PRIORITY_CLASS_RECHECK_SECONDS)
        return
    current = observed.workload
    outgrown: list[str] = []
    if job.prebuilt_workload_name is not None:
        if not _prebuilt_usable(ctx, draft, current):
            return
    elif owner is not None:
        outgrown = _own_workload(ctx, draft, current)
        if current is None:
            name = workload.workload_name(job.metadata.name, owner.uid)
            _hold(
                ctx,
                draft,
                None,
                "WaitingForKueue",
                f"Workload {name} created in LocalQueue {queue}; waiting for Kueue",
            )
            return
    if current is not None:
        draft.set_field("workload_name", current.name)
    if current is None or not current.admitted:
        _hold(ctx, draft, current, *_kueue_reason(current, queue))
        return
    if outgrown:
        _no_matching_workload(ctx, draft, current, "; ".join(outgrown))
        return
    _admitted(ctx, draft, current)


def _own_workload(ctx: _Ctx, draft: Draft, current: WorkloadView | None) -> list[str]:
    """Keep the job's own Workload in step with the spec: create it when there is none, rewrite it
    while Kueue holds no quota for it, delete it (and so make it anew) when Kueue reserved quota
    for an older shape that has not started. Returns how an admitted Workload's pod sets differ
    from those the job would run now (empty while they match): compared on every pass, admitted
    or not, since the webhook lets spec.cluster change while the job is suspended, which it still
    is right after admission, and a bypassed webhook lets it change at any time."""
    job, observed, owner = ctx.job, ctx.observed, ctx.owner
    assert owner is not None
    queue = job.kueue_queue_name
    desired = workload.manifest(
        job, owner, manifests.ray_cluster(job, draft.attempt, owner, observed.runtime), observed.priority
    )
    if current is None:
        draft.act(
            CreateWorkload(desired),
            Event(
                "Normal",
                "CreatedWorkload",
                f"creating Workload {desired['metadata']['name']} in LocalQueue {queue}",
            ),
        )
        return []
    if current.admitted:
        return workload.shape_changes(workload.quota_shapes(desired["spec"]["podSets"]), current.shapes)
    wanted = desired["metadata"]["annotations"][workload.DIGEST_ANNOTATION]
    if current.digest != wanted:
        if not current.quota_reserved:
            draft.act(UpdateWorkload(current.name, current.resource_version, workload.spec_update(desired)))
        elif not current.evicted:  # reserved for the old shape, not started: ask for the new one
            why = "the job changed after Kueue reserved quota for it"
            draft.act(
                DeleteWorkload(current.name, current.uid, why),
                Event("Normal", "DeletedWorkload", f"deleting Workload {current.name}: {why}"),
            )
    return []


NO_MATCHING_WORKLOAD = "NoMatchingWorkload"
"""Kueue's jobframework's stop reason for a job its admitted Workload no longer stands for."""


def _no_matching_workload(ctx: _Ctx, draft: Draft, current: WorkloadView, changes: str) -> None:
    """The job asks for other pods than Kueue admitted (its pools resized after admission): as
    Kueue's jobframework does (StopReasonNoMatchingWorkload), the job stops, suspended in place like
    an eviction, and its Workload is deleted once no pod of it is left (until then the running pods
    hold the quota Kueue counted); the next pass creates the Workload for what the job asks now,
    which Kueue queues and counts anew. Running on the old admission would use quota nobody
    granted: 4x the GPUs Kueue counted after a generationWorkers.replicas patch."""
    message = (
        f"the job no longer matches Workload {current.name}, which Kueue admitted ({changes}); "
        "it is stopped and queued again with a new Workload"
    )
    _hold(ctx, draft, current, NO_MATCHING_WORKLOAD, message)
    if _stopped(ctx):
        why = "the job no longer matches what Kueue admitted"
        draft.act(
            DeleteWorkload(current.name, current.uid, why),
            Event("Normal", "DeletedWorkload", f"deleting Workload {current.name}: {why} ({changes})"),
        )


PREBUILT_OUT_OF_SYNC = "PrebuiltWorkloadOutOfSync"


def _prebuilt_usable(ctx: _Ctx, draft: Draft, current: WorkloadView | None) -> bool:
    """On a worker cluster: whether the prebuilt Workload MultiKueue created for this copy of a
    dispatched job can stand for it, as Kueue's jobframework decides (reconciler.go,
    ensureOneWorkload, v0.17.0): missing, the job waits suspended and creates none; controlled by
    another object, it is not the job's; controlled by none, the job adopts it. Its pod sets must
    be the ones this job asks for, or the job fails (Kueue finishes such a Workload as OutOfSync)."""
    job, owner = ctx.job, ctx.owner
    name = job.prebuilt_workload_name
    if current is None:
        _hold(
            ctx,
            draft,
            None,
            "WaitingForPrebuiltWorkload",
            f"waiting for Workload {name}, which MultiKueue creates for this copy of a dispatched job",
        )
        return False
    if owner is None:
        return True
    if current.controller_uid not in ("", owner.uid):
        _hold(
            ctx,
            draft,
            None,
            "PrebuiltWorkloadTaken",
            f"Workload {name} (label {PREBUILT_WORKLOAD_LABEL}) is controlled by another object; "
            "it is not this job's",
        )
        return False
    if current.controller_uid == "":
        draft.act(
            AdoptWorkload(current.name, current.resource_version, workload.adoption(owner)),
            Event("Normal", "AdoptedWorkload", f"using Workload {current.name}, prebuilt by MultiKueue"),
        )
    desired = workload.manifest(
        job, owner, manifests.ray_cluster(job, draft.attempt, owner, ctx.observed.runtime), current.priority
    )
    wanted = desired["metadata"]["annotations"][workload.DIGEST_ANNOTATION]
    if current.digest != wanted:
        draft.set_field("workload_name", current.name)
        _fail(
            ctx,
            draft,
            PREBUILT_OUT_OF_SYNC,
            f"Workload {current.name}, built by the manager cluster, asks for other pods than this job "
            f"(pod-set digest {current.digest or 'none'}, here {wanted}): the two clusters render the job "
            "differently (operator version, AsyncGRPORuntime); run the same on both",
        )
        return False
    return True


def _kueue_reason(current: WorkloadView | None, queue: str) -> tuple[str, str]:
    if current is None:
        return "WaitingForKueue", f"waiting for the job's Workload in LocalQueue {queue}"
    if not current.active and not current.evicted:
        return (
            "Deactivated",
            f"Workload {current.name} is deactivated (spec.active false); set it true to queue the job",
        )
    message = (
        f"Kueue ({current.name}): {current.message}"
        if current.message
        else f"Kueue ({current.name}): {current.reason}"
    )
    return current.reason, message


EVICTED_WHILE_RUNNING = (
    "Kueue evicted the job; the driver resumes from the latest checkpoint when it is admitted again "
    "(no backoffLimit is spent)"
)
"""The Running condition's message from the eviction of a running job until its readmission."""


def _hold(ctx: _Ctx, draft: Draft, current: WorkloadView | None, reason: str, message: str) -> None:
    """The job is not admitted (not yet, or evicted): suspended, its RayCluster suspended in place
    (KubeRay deletes the pods), Queued with Kueue's reason; an evicted Workload's quota is given back
    once no pod of the job is left (Kueue's contract: quota is freed only when the job stopped)."""
    job = ctx.job
    owned = _owned(ctx)
    # The cluster first: its suspend is what frees the GPUs a preemptor waits for, and the job's
    # own write may fail (a conflict, an object the API server refuses) and end the pass.
    _suspend_clusters(draft, owned, naming.raycluster_name(job.metadata.name, draft.attempt), reason)
    if not job.spec.suspend:
        draft.act(SetJobSuspend(True, f"held for Kueue ({reason}): {message}"))
    uids = {c.uid for c in owned}
    live = any(p.owner_uid in uids for p in ctx.observed.pods)
    if current is not None and current.evicted and current.quota_reserved and _stopped(ctx):
        _release(
            draft,
            current,
            f"the job stopped after Kueue evicted it ({current.reason}): its quota is given back",
        )
    was_running = draft.is_true(RUNNING)
    draft.set(QUEUED, True, reason, message)
    cluster = next((c for c in owned if c.name == draft.get("ray_cluster_name")), None)
    where = f"RayCluster {cluster.name} is suspended" if cluster is not None else "no pod runs"
    draft.set(PODS_SCHEDULED, False, "WaitingForAdmission", f"{where} until Kueue admits the job")
    draft.drop(PODS_READY)
    running = draft.conditions.get(RUNNING)
    if was_running:
        draft.set(RUNNING, False, reason, EVICTED_WHILE_RUNNING)
    elif running is not None and running.message != EVICTED_WHILE_RUNNING:
        draft.set(RUNNING, False, "Queued", "the driver starts once Kueue admits the job")
    # else: evicted while its driver ran, it says so (with the eviction's reason) until readmitted
    if draft.has(STALLED):
        draft.set(STALLED, False, reason, "the job is queued")
    draft.set_field("attempt_start_time", None)
    if live:  # safety net while KubeRay deletes them: their watch events normally come first
        draft.requeue(DELETION_RECHECK_SECONDS)


def _stopped(ctx: _Ctx) -> bool:
    """Whether no pod of the job is left and each of its RayClusters is suspended: Kueue's
    condition for the quota a job held to be given back."""
    owned = _owned(ctx)
    uids = {c.uid for c in owned}
    return all(c.suspended for c in owned) and not any(p.owner_uid in uids for p in ctx.observed.pods)


def _release(draft: Draft, current: WorkloadView, why: str) -> None:
    """Give an evicted Workload's quota back (QuotaReserved and Admitted False, Requeued)."""
    _workload_status(
        draft,
        current,
        workload.released(
            current.conditions,
            current.accumulated_seconds,
            _last_admitted(current),
            reason=current.reason,
            message=current.message,
            now=draft.now,
        ),
        why,
    )


def _suspend_clusters(draft: Draft, clusters: tuple[ClusterView, ...], current: str, why: str) -> None:
    """Suspend the current attempt's RayCluster in place (KubeRay deletes its pods; the cluster,
    its name and the attempt stay); delete those of earlier attempts."""
    for cluster in clusters:
        if cluster.deleting:
            continue
        if cluster.name != current:
            draft.act(
                DeleteRayCluster(cluster.name, cluster.uid, f"stale: the current attempt is {draft.attempt}"),
                Event(
                    "Normal", "DeletedRayCluster", f"deleting RayCluster {cluster.name} of an earlier attempt"
                ),
            )
        elif not cluster.suspended:
            draft.act(
                SetRayClusterSpec(cluster.name, cluster.uid, True, None, why),
                Event("Normal", "SuspendedRayCluster", f"suspending RayCluster {cluster.name}: {why}"),
            )


def _last_admitted(current: WorkloadView) -> datetime | None:
    """When the admission an eviction ends began (Admitted's lastTransitionTime while still True)."""
    for cond in current.conditions:
        if cond.get("type") == "Admitted" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _admitted(ctx: _Ctx, draft: Draft, current: WorkloadView) -> None:
    """Kueue admitted the Workload: unsuspend the job, start its startup clock, run the attempt with
    the assigned flavors, and report PodsReady to Kueue (for waitForPodsReady)."""
    try:
        ctx.cluster_manifest(draft.attempt)
    except workload.FlavorConflictError as err:
        _fail(ctx, draft, "FlavorConflict", str(err))
        return
    if ctx.job.spec.suspend:
        draft.act(SetJobSuspend(False, f"Kueue admitted Workload {current.name}"))
    queue = ctx.job.kueue_queue_name
    if not draft.has(QUEUED) or draft.is_true(QUEUED):
        draft.set_field("attempt_start_time", draft.now)  # the startup deadline runs from admission
    draft.set(
        QUEUED,
        False,
        "Admitted",
        f"Kueue admitted Workload {current.name} from LocalQueue {queue}: {current.message}",
    )
    _run(ctx, draft)
    if draft.finished:
        return
    ready = draft.is_true(PODS_READY)
    if current.pods_ready is not ready:
        reason, message = (
            ("Started", "All pods reached readiness and the workload is running")
            if ready
            else (
                "WaitForStart",
                "Not all pods are ready or succeeded",
            )
        )
        _workload_status(
            draft,
            current,
            workload.with_condition(current.conditions, "PodsReady", ready, reason, message, now=draft.now),
            f"PodsReady {ready}",
        )


def _workload_finished(ctx: _Ctx, draft: Draft) -> None:
    """A finished job finishes its Workload, which gives its quota back (Kueue's Finished), once no
    worker of its clusters is left: a cluster that cleanupPolicy keeps has its worker groups scaled
    to zero first (the head, its driver log and the cluster stay for inspection), and a deleted one
    is waited for, so that Kueue never hands out GPUs that the job's pods still hold."""
    current = ctx.observed.workload
    if current is None or current.finished:
        return
    if _workers_left(ctx, draft):
        draft.requeue(DELETION_RECHECK_SECONDS)
        return
    succeeded = draft.is_true(COMPLETE)
    reason = "Succeeded" if succeeded else "Failed"
    outcome = draft.conditions.get(COMPLETE if succeeded else FAILED)
    message = outcome.message if outcome is not None else f"the job {reason.lower()}"
    _workload_status(
        draft,
        current,
        workload.with_condition(current.conditions, "Finished", True, reason, message, now=draft.now),
        f"the job {reason.lower()}",
    )


def _workers_left(ctx: _Ctx, draft: Draft) -> bool:
    """Whether a worker pod of the finished job's clusters may still hold resources; scales a kept
    cluster's workers to zero on the way (a cluster being deleted, or deleted in this pass by
    cleanupPolicy, takes its workers with it)."""
    owned = _owned(ctx)
    deleted = {a.uid for a in draft.actions if isinstance(a, DeleteRayCluster)}
    scaling = [c for c in owned if c.worker_replicas and not c.deleting and c.uid not in deleted]
    for cluster in scaling:
        why = "the job finished under Kueue: its workers go before its quota is given back"
        draft.act(
            ScaleRayClusterWorkers(cluster.name, cluster.uid, cluster.worker_groups, why),
            Event("Normal", "ScaledDownWorkers", f"scaling RayCluster {cluster.name}'s workers to 0: {why}"),
        )
    names = {c.name for c in owned}
    return bool(scaling) or any(not p.is_head and p.cluster in names for p in ctx.observed.pods)


def _workload_status(draft: Draft, current: WorkloadView, status: Manifest, why: str) -> None:
    """One Workload status write per pass (each carries the resourceVersion it was planned on)."""
    if any(isinstance(a, PatchWorkloadStatus) for a in draft.actions):
        return
    draft.act(PatchWorkloadStatus(current.name, current.resource_version, status, why))


# --- active jobs ------------------------------------------------------------------------------


def _run(ctx: _Ctx, draft: Draft) -> None:
    job, observed, owner = ctx.job, ctx.observed, ctx.owner
    now = draft.now
    if draft.is_true(SUSPENDED):
        draft.set(
            SUSPENDED, False, "Resumed", "spec.suspend is false: the job resumes from the latest checkpoint"
        )
        draft.set_field("start_time", now)  # like batch/v1 Job: the active deadline restarts on resume
    if draft.get("start_time") is None:
        draft.set_field("start_time", now)

    desired_configmap = manifests.spec_configmap(job, owner)
    configmap_taken = _configmap_taken(ctx)
    existing = observed.configmap
    if configmap_taken is None and (
        existing is None
        or existing.digest != desired_configmap["metadata"]["annotations"][naming.SPEC_DIGEST_ANNOTATION]
    ):
        draft.act(ApplyConfigMap(desired_configmap, existing))

    name = naming.raycluster_name(job.metadata.name, draft.attempt)
    owned = _owned(ctx)
    for cluster in owned:
        if cluster.name != name and not cluster.deleting:
            draft.act(
                DeleteRayCluster(cluster.name, cluster.uid, f"stale: the current attempt is {draft.attempt}"),
                Event(
                    "Normal", "DeletedRayCluster", f"deleting RayCluster {cluster.name} of an earlier attempt"
                ),
            )

    deadline = job.spec.active_deadline_seconds
    if deadline is not None:
        since, what = _active_since(ctx, draft)
        expiry = since + timedelta(seconds=deadline)
        if now >= expiry:
            _fail(ctx, draft, DEADLINE_EXCEEDED, f"activeDeadlineSeconds ({deadline} s) passed {what}")
            return
        draft.requeue((expiry - now).total_seconds())

    if observed.kuberay_missing is not None:
        _waiting_to_create(
            ctx,
            draft,
            KUBERAY_MISSING,
            f"RayClusters cannot be listed or created: the ray.io/v1 API is not served (is the KubeRay "
            f"operator installed?): {observed.kuberay_missing}",
            KUBERAY_RECHECK_SECONDS,
        )
        return
    current = next((c for c in owned if c.name == name), None)
    ours = draft.get("ray_cluster_name") == name
    if current is None or current.deleting:
        foreign = next((c for c in observed.clusters if c.name == name and c not in owned), None)
        if ours:
            if _unconfirmed(ctx.observed, draft, f"RayCluster {name} is not among the job's children"):
                return
            _infra_failure(ctx, draft, current, CLUSTER_LOST, f"RayCluster {name} was deleted")
        elif current is not None or (foreign is not None and foreign.deleting):
            message = f"waiting for RayCluster {name} of the previous run to be deleted"
            _waiting_to_create(ctx, draft, WAITING_FOR_PREVIOUS_CLUSTER, message, DELETION_RECHECK_SECONDS)
        elif foreign is not None:
            owner_uid = foreign.owner_uid or "none"
            message = (
                f"RayCluster {name} exists but is not this job's (its controller owner UID is {owner_uid}); "
                "it is neither adopted nor deleted. Delete it or rename the job"
            )
            _waiting_to_create(ctx, draft, CLUSTER_NAME_TAKEN, message, NAME_TAKEN_RECHECK_SECONDS)
        elif current is None and any(p.cluster == name and not p.deleting for p in observed.pods):
            # The garbage collector has not deleted the pods of the deleted namesake yet, and
            # KubeRay, which selects pods by name label, would take them for the new cluster's.
            message = f"waiting for the pods of RayCluster {name} of the previous run to be deleted"
            _waiting_to_create(ctx, draft, WAITING_FOR_PREVIOUS_CLUSTER, message, DELETION_RECHECK_SECONDS)
        elif configmap_taken is not None:
            _waiting_to_create(ctx, draft, CONFIGMAP_NAME_TAKEN, configmap_taken, NAME_TAKEN_RECHECK_SECONDS)
        else:
            _create_cluster(ctx, draft)
        return
    if not ours or draft.get("dashboard_url") is None:  # first seen since created, or status rebuilt
        draft.set_field("ray_cluster_name", name)
        draft.set_field("dashboard_url", _dashboard_url(job, name))
        if draft.get("attempt_start_time") is None:
            draft.set_field("attempt_start_time", current.created_at or now)
    if current.suspended and (job.kueue_queue_name is not None or draft.has(SUSPENDED)):
        _resume_cluster(ctx, draft, current)  # suspended in place by this operator: resume it
        return
    _attempt(ctx, draft, current)  # (one suspended by something else waits: WaitingForAdmission)


def _active_since(ctx: _Ctx, draft: Draft) -> tuple[datetime, str]:
    """When activeDeadlineSeconds' clock would have started had the job run without a break, and
    how to say it. Like batch/v1 Job, a resumed job's clock starts again at status.startTime; under
    Kueue it counts the time the Workload was admitted, in all admissions together (Kueue's own
    accumulatedPastExecutionTimeSeconds plus the current admission), never the time queued."""
    started: datetime = draft.get("start_time")
    admission = ctx.observed.workload
    if ctx.job.kueue_queue_name is None or admission is None or admission.admitted_at is None:
        return started, f"since the job started at {_iso(started)}"
    since = admission.admitted_at - timedelta(seconds=admission.accumulated_seconds)
    return since, (
        f"admitted by Kueue ({admission.accumulated_seconds} s in earlier admissions, and since "
        f"{_iso(admission.admitted_at)}); time queued does not count"
    )


def _resume_cluster(ctx: _Ctx, draft: Draft, cluster: ClusterView) -> None:
    """Start the pods of a RayCluster suspended in place again: its spec is rendered now (the spec
    may have changed while the job was suspended; Kueue may have assigned other flavors) and the
    driver resumes from the latest checkpoint."""
    why = "Kueue admitted the job" if ctx.job.kueue_queue_name is not None else "spec.suspend is false"
    if not cluster.suspend_complete:
        # KubeRay is still deleting the stopped run's pods; resuming now would let it take their
        # state (RayClusterProvisioned, a dying head) for the new run's.
        message = f"waiting for KubeRay to finish suspending RayCluster {cluster.name} before resuming it"
        draft.set(PODS_SCHEDULED, False, WAITING_FOR_PREVIOUS_CLUSTER, message)
        draft.requeue(DELETION_RECHECK_SECONDS)
        _startup_deadline(ctx, draft)
        return
    spec = dict(ctx.cluster_manifest(draft.attempt)["spec"])
    spec["suspend"] = False
    draft.act(
        SetRayClusterSpec(cluster.name, cluster.uid, False, spec, why),
        Event("Normal", "ResumedRayCluster", f"resuming RayCluster {cluster.name}: {why}"),
    )
    draft.set(PODS_SCHEDULED, False, "Resuming", f"RayCluster {cluster.name} is resuming: {why}")
    draft.set(PODS_READY, False, "Resuming", f"RayCluster {cluster.name} is creating its pods")
    draft.set(
        RUNNING, False, "Resuming", "the driver resumes from the latest checkpoint once the pods are ready"
    )
    draft.requeue(DELETION_RECHECK_SECONDS)
    _startup_deadline(ctx, draft)


def _unconfirmed(observed: Observation, draft: Draft, why: str) -> bool:
    """Whether a conclusion drawn from something's absence needs a fresh read first. Children read
    from the watch caches may lag behind each other (a RayCluster's list can be newer than its pods'
    list): a missing head pod or RayCluster must be confirmed before it costs the job a restart."""
    if not observed.from_cache:
        return False
    draft.confirm = why
    return True


def _waiting_to_create(ctx: _Ctx, draft: Draft, reason: str, message: str, recheck: float) -> None:
    """The attempt's RayCluster cannot be created yet: say why, look again, keep the deadline."""
    _attempt_started(ctx, draft)
    draft.set(PODS_SCHEDULED, False, reason, message)
    draft.requeue(recheck)
    _startup_deadline(ctx, draft)


def _attempt_started(ctx: _Ctx, draft: Draft) -> None:
    """The startup deadline counts from the attempt's first try to get its cluster, once; for a
    job Kueue manages, from Kueue's admission (`_kueue` sets it): time in the queue is not startup."""
    if draft.get("attempt_start_time") is None:
        draft.set_field("attempt_start_time", draft.now)


def _create_cluster(ctx: _Ctx, draft: Draft) -> None:
    """Create the attempt's RayCluster, or, after the API server refused it, wait and retry."""
    job = ctx.job
    name = naming.raycluster_name(job.metadata.name, draft.attempt)
    failure = ctx.observed.create_failure
    if failure is not None and (failure.cluster != name or failure.generation != draft.generation):
        failure = None  # another attempt's, or the spec changed since: try the new one at once
    _attempt_started(ctx, draft)
    if failure is not None:
        retry_at = failure.at + timedelta(seconds=create_retry_seconds(failure.count))
        reason = KUBERAY_MISSING if failure.status == 404 else CLUSTER_CREATE_FAILED
        what = f"creating RayCluster {name} failed {failure.count} time(s), last at {_iso(failure.at)}"
        if draft.now < retry_at:
            when = f"retrying at {_iso(retry_at)}"
        else:
            when = "retrying now"
            _request_create(ctx, draft, name)
        message = f"{what} (HTTP {failure.status}): {failure.message}; {when}"
        draft.set(PODS_SCHEDULED, False, reason, message)  # the one condition that carries it
        draft.set(PODS_READY, False, "ClusterCreating", f"RayCluster {name} does not exist yet")
        draft.set(RUNNING, False, "ClusterCreating", "the driver starts once the pods are ready")
        draft.requeue(max((retry_at - draft.now).total_seconds(), CREATE_RETRY_SECONDS))
        _startup_deadline(ctx, draft)
        return
    _request_create(ctx, draft, name)
    draft.set(PODS_SCHEDULED, False, "ClusterCreating", f"creating RayCluster {name}")
    draft.set(PODS_READY, False, "ClusterCreating", f"creating RayCluster {name}")
    draft.set(RUNNING, False, "ClusterCreating", "the driver starts once the pods are ready")
    _startup_deadline(ctx, draft)


def _admitted_at(ctx: _Ctx, draft: Draft) -> datetime | None:
    """When the current run of the attempt's cluster began: Kueue's last admission, or the last
    resume after spec.suspend (None when neither happened). Pods being deleted and driver exits
    from before then belong to the run that was suspended or preempted, not to this one."""
    if ctx.job.kueue_queue_name is not None:
        admission = ctx.observed.workload
        if admission is not None and admission.admitted_at is not None:
            return admission.admitted_at
        queued = draft.conditions.get(QUEUED)
        return queued.last_transition_time if queued is not None and queued.status == "False" else None
    resumed = draft.conditions.get(SUSPENDED)
    return resumed.last_transition_time if resumed is not None and resumed.status == "False" else None


def _request_create(ctx: _Ctx, draft: Draft, name: str) -> None:
    # status.rayClusterName is recorded once the cluster is seen (adoption in _run): the status is
    # written before the create, so a name in the status always means "this cluster existed".
    draft.act(
        CreateRayCluster(ctx.cluster_manifest(draft.attempt)),
        Event("Normal", "CreatedRayCluster", f"creating RayCluster {name} (attempt {draft.attempt})"),
    )


def _outputs(job: AsyncGRPOJob, attempt: int) -> Outputs:
    """Where the attempt's driver writes its log, step records and curves (asyncgrpo_api.outputs)."""
    path = job.spec.checkpoint.path
    volume = job.spec.storage.checkpoints
    if volume is not None and volume.pvc is not None:
        where = f"PersistentVolumeClaim {volume.pvc.claim_name} at {volume.mount_path}"
    elif volume is not None and volume.host_path is not None:
        where = f"hostPath {volume.host_path.path} at {volume.mount_path} on the head pod's node"
    else:
        where = "emptyDir of the head pod: deleted with it (mount a PVC at checkpoint.path to keep them)"
    return Outputs(
        volume=where,
        driver_log=outputs.driver_log(path, attempt),
        steps=outputs.steps_file(path),
        tensorboard=outputs.tensorboard_dir(path),
    )


def _dashboard_url(job: AsyncGRPOJob, cluster: str) -> str:
    host = naming.head_service_name(cluster)
    if job.metadata.namespace:
        host += f".{job.metadata.namespace}.svc"
    return f"http://{host}:{naming.DASHBOARD_PORT}"


def _attempt(ctx: _Ctx, draft: Draft, cluster: ClusterView) -> None:
    pods = [p for p in ctx.observed.pods if p.owner_uid == cluster.uid]
    admitted_at = _admitted_at(ctx, draft)
    if admitted_at is not None and not draft.is_true(RUNNING):
        pods = [p for p in pods if not p.deleting]  # KubeRay deleting a preempted run's pods
    head, exit_ = _head_and_exit(ctx.observed, pods, cluster, admitted_at)
    head_name = head.name if head is not None else exit_.pod_name if exit_ is not None else None
    if head_name is not None:
        _record_head(ctx, draft, head_name)
    if exit_ is not None:
        _driver_exited(ctx, draft, cluster, exit_)
        return
    lost = _head_lost(draft, cluster, head)
    if lost is not None:
        if head is None and _unconfirmed(ctx.observed, draft, lost):
            return
        _infra_failure(ctx, draft, cluster, HEAD_POD_LOST, lost)
        return
    _progressing(ctx, draft, cluster, pods, head)


def _head_and_exit(
    observed: Observation, pods: list[PodView], cluster: ClusterView, admitted_at: datetime | None
) -> tuple[PodView | None, DriverExit | None]:
    """The attempt's head pod (a live one first; only the one KubeRay created, `is_kuberay_head`)
    and how its driver ended, if it has: read from the pod, or remembered from a head pod that is
    gone. An exit from before Kueue's latest admission is the preempted run's, not this one's."""
    heads = sorted((p for p in pods if is_kuberay_head(p, cluster)), key=lambda p: p.deleting)
    head = heads[0] if heads else None
    exit_ = DriverExit.from_pod(head) if head is not None else None
    remembered = observed.remembered_exit
    if (
        exit_ is None
        and remembered is not None
        and remembered.cluster_uid == cluster.uid
        and (head is None or head.name == remembered.pod_name)
    ):
        exit_ = remembered
    if exit_ is not None and _before(exit_.finished_at, admitted_at):
        exit_ = None  # the driver of the run Kueue preempted; the resumed one is still to come
    return head, exit_


def _record_head(ctx: _Ctx, draft: Draft, pod: str) -> None:
    """Name the head pod in the status, and how to read the driver's log there."""
    namespace = f"-n {ctx.job.metadata.namespace} " if ctx.job.metadata.namespace else ""
    draft.set_field("head_pod", pod)
    draft.set_field("driver_logs", f"kubectl logs {namespace}{pod} -c {naming.DRIVER_CONTAINER}")


_INPUT_ERRORS = {
    exitcodes.INVALID_MODEL: (INVALID_MODEL, "the model files cannot be used"),
    exitcodes.INVALID_DATA: (INVALID_DATA, "the data files or the reward function cannot be used"),
    exitcodes.OBJECT_STORE_REFUSED: (
        OBJECT_STORE_REFUSED,
        "the object store refused spec.storage.objectStore's credentials or bucket",
    ),
}
"""Driver exit codes for inputs only the files could show to be wrong: failed, never retried."""


def _driver_exited(ctx: _Ctx, draft: Draft, cluster: ClusterView, exit_: DriverExit) -> None:
    code = exit_.exit_code
    detail = f": {exit_.message.strip()}" if exit_.message.strip() else ""
    if code == 0:
        progress = draft.get("progress")
        at = f" at step {progress.step}" if progress is not None else ""
        accuracy = progress.validation_accuracy if progress is not None else None
        held_out = f"; held-out accuracy {accuracy:.3f}" if accuracy is not None else ""
        _finish(
            draft, COMPLETE, DRIVER_SUCCEEDED, f"the driver exited 0{at} (pod {exit_.pod_name}){held_out}"
        )
        _cleanup(ctx.job.spec.cleanup_policy, draft, _owned(ctx))
    elif exit_.whole_pod:
        cause = f" ({exit_.reason})" if exit_.reason else ""
        _infra_failure(
            ctx,
            draft,
            cluster,
            HEAD_POD_LOST,
            f"head pod {exit_.pod_name} failed as a whole{cause}; the driver's exit code was {code}{detail}",
        )
    elif code in _INPUT_ERRORS:
        reason, what = _INPUT_ERRORS[code]
        _fail(ctx, draft, reason, f"{what}{detail}; not retried: fix the files or the spec")
    elif code == exitcodes.RAY_HEAD_UNAVAILABLE:
        _infra_failure(ctx, draft, cluster, RAY_HEAD_UNAVAILABLE, f"the Ray head never came up{detail}")
    elif code == exitcodes.RAY_WORKER_LOST:
        _infra_failure(ctx, draft, cluster, RAY_WORKER_LOST, f"a Ray worker or node was lost{detail}")
    elif exit_.reason == "OOMKilled":
        _infra_failure(ctx, draft, cluster, DRIVER_KILLED, f"{_oom_killed(ctx.job)}{detail}")
    elif code > exitcodes.SIGNAL_BASE:
        _infra_failure(
            ctx,
            draft,
            cluster,
            DRIVER_KILLED,
            f"the driver was killed by {_signal_name(code)}{detail}",
        )
    else:
        reason = f" ({exit_.reason})" if exit_.reason and exit_.reason != "Error" else ""
        _fail(
            ctx,
            draft,
            TRAINING_ERROR,
            f"the driver exited with code {code}{reason} in pod {exit_.pod_name}{detail}; "
            "training errors are not retried",
        )


def _oom_killed(job: AsyncGRPOJob) -> str:
    """What an OOMKilled driver container means and the knob that changes it: with a limit of its
    own the driver outgrew it; without one, the kernel killed it for the pod's or node's memory."""
    limit = job.spec.cluster.head.driver_resources.limits.get("memory")
    if limit is not None:
        return (
            f"the driver container was OOMKilled: it went over its memory limit {limit}; raise "
            "spec.cluster.head.driverResources.limits.memory"
        )
    return (
        "the driver container was OOMKilled without a memory limit of its own (the head pod or its "
        "node ran out of memory); set spec.cluster.head.driverResources.limits.memory to bound it"
    )


def _signal_name(code: int) -> str:
    number = code - 128
    try:
        return f"{signal.Signals(number).name} (exit code {code})"
    except ValueError:
        return f"signal {number} (exit code {code})"


def _head_lost(draft: Draft, cluster: ClusterView, head: PodView | None) -> str | None:
    """Why the attempt's head pod is gone for good, or None while it is alive or still coming."""
    if head is None:
        # Before provisioning, KubeRay recreates a missing head; after it, it does not (annotation).
        if cluster.provisioned or draft.is_true(RUNNING):
            return f"the head pod of RayCluster {cluster.name} is gone"
        return None
    cause = head.disrupted or head.reason or head.message
    suffix = f" ({cause})" if cause else ""
    # The node is named so a user can look at it (NotReady, drained, preempted) without digging.
    pod = f"head pod {head.name}" + (f" on node {head.node_name}" if head.node_name else "")
    if head.deleting:
        return f"{pod} is being deleted{suffix}"
    if head.phase in ("Failed", "Succeeded"):
        return f"{pod} is {head.phase}{suffix}"
    ray = head.container(naming.RAY_HEAD_CONTAINER)
    if ray is not None and ray.state == "terminated":
        return f"the Ray head container of {pod} exited with code {ray.exit_code}{suffix}"
    if head.disrupted:
        return f"{pod} is being disrupted: {head.disrupted}"
    return None


def _infra_failure(ctx: _Ctx, draft: Draft, cluster: ClusterView | None, reason: str, message: str) -> None:
    """Retry an attempt lost to the infrastructure with a fresh RayCluster, or give up."""
    limit = ctx.job.spec.backoff_limit
    attempt = draft.attempt
    if draft.restarts >= limit:
        _fail(
            ctx,
            draft,
            BACKOFF_LIMIT_EXCEEDED,
            f"attempt {attempt} failed ({reason}: {message}) after {draft.restarts} restarts; "
            f"backoffLimit is {limit}",
        )
        return
    draft.set_field("restarts", draft.restarts + 1)
    draft.set_field("attempt", attempt + 1)
    _rewind_to_checkpoint(draft)
    draft.set(
        RESTARTING,
        True,
        reason,
        f"attempt {attempt} failed: {message}; starting attempt {attempt + 1} (restart {draft.restarts} of "
        f"backoffLimit {limit}), resuming from the latest checkpoint",
    )
    if draft.has(STALLED):
        draft.set(STALLED, False, reason, "a new attempt is starting")
    for name in ("ray_cluster_name", "dashboard_url", "attempt_start_time", "head_pod", "driver_logs"):
        draft.set_field(name, None)  # the new attempt's are recorded as it gets them
    if cluster is not None and not cluster.deleting:
        draft.act(
            DeleteRayCluster(cluster.name, cluster.uid, f"attempt {attempt} failed"),
            Event(
                "Normal",
                "DeletedRayCluster",
                f"deleting RayCluster {cluster.name} of failed attempt {attempt}",
            ),
        )
    _create_cluster(ctx, draft)
    draft.set(RUNNING, False, reason, "restarting with a fresh RayCluster")


def _rewind_to_checkpoint(draft: Draft) -> None:
    """A retry resumes from the newest checkpoint: STEP (and the version) fall back to it now, in
    the same status write that counts the restart, so `kubectl get` steps back once, at the restart,
    and only rises after it (the steps trained after that checkpoint are lost and trained again).

    The checkpoint is the newest the operator saw; one written after its last poll makes the new
    attempt report a higher step, which STEP then rises to. No checkpoint seen: step 0."""
    progress: Progress | None = draft.get("progress")
    if progress is None:
        return
    resumed = progress.last_checkpoint_step or 0
    draft.set_field(
        "progress",
        progress.model_copy(update={"step": resumed, "policy_version": resumed, "updated_at": draft.now}),
    )


# --- an attempt on its way: scheduling, readiness, the driver, progress ----------------------------


def _progressing(
    ctx: _Ctx, draft: Draft, cluster: ClusterView, pods: list[PodView], head: PodView | None
) -> None:
    job, observed = ctx.job, ctx.observed
    live = [p for p in pods if not p.deleting]
    generation = (
        cluster.generation_replicas
        if job.spec.cluster.generation_workers.elastic and cluster.generation_group is not None
        else job.spec.cluster.generation_workers.replicas
    )
    expected = 1 + job.spec.cluster.policy_workers.replicas + generation
    _set_scheduled(draft, cluster, live, expected)
    ready = _set_ready(draft, live, head, expected)
    driver = head.container(naming.DRIVER_CONTAINER) if head is not None else None
    if driver is not None and driver.state == "running" and (ready or cluster.provisioned):
        assert head is not None
        state = observed.progress.state if observed.progress is not None else ""
        note = ""
        if state == "failed" and observed.progress is not None:
            note = f"; it reports a failure and should exit soon: {observed.progress.error or 'no detail'}"
        elif observed.progress is not None and observed.progress.data_warning:
            note = f"; data: {observed.progress.data_warning}"
        draft.set(RUNNING, True, "DriverRunning", f"the driver is running in pod {head.name}{note}")
        if draft.is_true(RESTARTING):
            draft.set(RESTARTING, False, "Restarted", f"attempt {draft.attempt} is running")
        _track_progress(job, draft, observed, cluster)
        _elastic_fleet(ctx, draft, cluster, live, head)
        draft.requeue(job.spec.progress.poll_seconds)
        return
    if driver is not None and driver.state == "waiting" and driver.reason not in ("", "ContainerCreating"):
        why = f"driver container waiting: {driver.reason}"
    elif draft.is_true(PODS_READY):
        why = "waiting for the driver container to start"
    else:
        why = "the driver starts once the pods are ready"
    draft.set(RUNNING, False, "DriverNotRunning", why)
    draft.requeue(PROVISIONING_RECHECK_SECONDS)
    _startup_deadline(ctx, draft)


def _set_scheduled(draft: Draft, cluster: ClusterView, live: list[PodView], expected: int) -> None:
    unschedulable = [p for p in live if p.unschedulable]
    gated = [p for p in live if p.gated]
    if cluster.suspended:
        draft.set(
            PODS_SCHEDULED,
            False,
            "WaitingForAdmission",
            f"RayCluster {cluster.name} is suspended (spec.suspend) until its queue admits it",
        )
    elif unschedulable:
        first = unschedulable[0]
        more = f" (and {len(unschedulable) - 1} more pods)" if len(unschedulable) > 1 else ""
        draft.set(PODS_SCHEDULED, False, UNSCHEDULABLE, f"pod {first.name}{more}: {first.unschedulable}")
    elif gated:
        draft.set(PODS_SCHEDULED, False, "SchedulingGated", f"pod {gated[0].name}: {gated[0].gated}")
    elif len(live) < expected:
        if cluster.replica_failure:
            draft.set(PODS_SCHEDULED, False, "PodCreationFailed", cluster.replica_failure)
        else:
            draft.set(PODS_SCHEDULED, False, "CreatingPods", f"{len(live)} of {expected} pods created")
    elif not all(p.scheduled for p in live):
        bound = sum(p.scheduled for p in live)
        draft.set(PODS_SCHEDULED, False, "Scheduling", f"{bound} of {expected} pods bound to nodes")
    else:
        draft.set(PODS_SCHEDULED, True, "AllPodsScheduled", f"all {expected} pods are bound to nodes")


def _set_ready(draft: Draft, live: list[PodView], head: PodView | None, expected: int) -> bool:
    for pod in live:
        for container in pod.containers:
            if container.state == "waiting" and container.reason in BAD_WAITING_REASONS:
                detail = f": {container.message}" if container.message else ""
                draft.set(
                    PODS_READY, False, container.reason, f"pod {pod.name}, container {container.name}{detail}"
                )
                return False
    if head is None or head.deleting or not head.ready:
        name = head.name if head is not None else "(not created yet)"
        state = f" ({head.phase})" if head is not None else ""
        draft.set(PODS_READY, False, "HeadNotReady", f"head pod {name}{state} is not ready")
        return False
    workers = [p for p in live if not p.is_head]
    ready_workers = sum(p.ready for p in workers)
    if len(workers) < expected - 1 or ready_workers < len(workers):
        draft.set(
            PODS_READY, False, "WorkersNotReady", f"{ready_workers} of {expected - 1} worker pods are ready"
        )
        return False
    draft.set(PODS_READY, True, "AllPodsReady", f"all {expected} pods are ready")
    return True


def _startup_deadline(ctx: _Ctx, draft: Draft) -> None:
    """Fail the attempt once its driver has not run for startupDeadlineSeconds since the attempt
    first tried to get its RayCluster (however many creates it took, or none succeeded)."""
    deadline = ctx.job.spec.startup_deadline_seconds
    if deadline is None:
        return
    started: datetime = draft.get("attempt_start_time") or draft.now
    expiry = started + timedelta(seconds=deadline)
    if draft.now < expiry:
        draft.requeue((expiry - draft.now).total_seconds())
        return
    waiting = waiting_on(draft.conditions)
    last = f"; last state: {waiting.reason}: {waiting.message}" if waiting is not None else ""
    name = naming.raycluster_name(ctx.job.metadata.name, draft.attempt)
    _fail(
        ctx,
        draft,
        DEADLINE_EXCEEDED,
        f"startupDeadlineSeconds ({deadline} s): the driver was not running {deadline} s after attempt "
        f"{draft.attempt} (RayCluster {name}) started at {_iso(started)}{last}",
    )


def _track_progress(job: AsyncGRPOJob, draft: Draft, observed: Observation, cluster: ClusterView) -> None:
    """Copy the driver's /progress into status.progress and decide Stalled.

    A driver still starting (Ray, the workers, loading its checkpoint) reports step 0; after a
    restart that would make `kubectl get`'s STEP fall back to 0 until the resumed attempt trains,
    so a "starting" document at step 0 leaves status.progress as it was and counts as no reading.
    """
    now = draft.now
    reading = observed.progress
    if reading is not None and reading.state == "starting" and reading.step == 0:
        reading = None
    read_at = observed.progress_read_at or now
    mark = draft.mark if draft.mark is not None and draft.mark.cluster_uid == cluster.uid else None
    stored: Progress | None = draft.get("progress")
    if reading is not None:
        draft.set_field(
            "progress",
            Progress(
                step=reading.step,
                max_steps=reading.max_steps,
                policy_version=reading.policy_version,
                reward_mean=reading.reward_mean,
                accuracy=reading.accuracy,
                mean_staleness=reading.mean_staleness,
                mean_oldest_staleness=reading.mean_oldest_staleness,
                behaviour_kl=reading.behaviour_kl,
                is_out_of_bounds=reading.is_out_of_bounds,
                tokens_per_second=reading.tokens_per_second,
                validation_reward=reading.validation_reward,
                reward_failures=reading.reward_failures,
                validation_accuracy=reading.validation_accuracy,
                last_checkpoint_step=reading.last_checkpoint_step,
                durable_checkpoint_step=reading.durable_checkpoint_step,
                policy_idle_share=reading.policy_idle_share,
                generation_idle_share=reading.generation_idle_share,
                generation_gated_share=reading.generation_gated_share,
                buffer_fill=reading.buffer_fill,
                refit_seconds=reading.refit_seconds,
                samples_untrained=reading.samples_untrained,
                time_to_first_step_seconds=_time_to_first_step(reading, draft.get("attempt_start_time")),
                updated_at=read_at,
            ),
        )
        _set_logprob_mismatch(draft, reading)
        if mark is None or reading.step != mark.step:
            since = read_at
            if mark is None and stored is not None and stored.step == reading.step and stored.updated_at:
                # No mark in memory (the operator restarted): the step has not moved since the
                # status last recorded it (written only when a figure changes, so no later).
                since = min(stored.updated_at, read_at)
            mark = ProgressMark(cluster.uid, reading.step, since)
    elif mark is None:
        progress = draft.get("progress")
        running = draft.conditions[RUNNING]
        since = running.last_transition_time if running.last_transition_time <= now else now
        mark = ProgressMark(cluster.uid, progress.step if progress is not None else 0, since)
    draft.mark = mark
    limit = job.spec.progress.stall_after_seconds
    quiet = (now - mark.since).total_seconds()
    if quiet >= limit:
        error = f"; reading /progress failed: {observed.progress_error}" if observed.progress_error else ""
        draft.set(
            STALLED,
            True,
            "NoProgress",
            f"step {mark.step} has not advanced since {_iso(mark.since)} (stallAfterSeconds {limit}) while "
            f"the pods look healthy{error}",
        )
    else:
        draft.set(STALLED, False, "Progressing", "the step advances")
        draft.requeue(limit - quiet)


def _elastic_fleet(ctx: _Ctx, draft: Draft, cluster: ClusterView, live: list[PodView], head: PodView) -> None:
    """Grow or shrink an elastic generation fleet as `elastic.decide` says, from the driver's step
    windows; status.generationFleet remembers the last change (the cooldown and the windows that
    count survive an operator restart). Growing patches the generation group's replicas; shrinking
    first asks the driver to drain a named worker (status.generationFleet.drainRequest, delivered
    to the driver in `head` on every pass until it reports the worker drained) and removes that
    pod only then."""
    pool = ctx.job.spec.cluster.generation_workers
    if not pool.elastic or cluster.generation_group is None:
        return
    fleet: GenerationFleet | None = draft.get("generation_fleet")
    if fleet is None or fleet.ray_cluster_name != cluster.name:
        fleet = GenerationFleet(ray_cluster_name=cluster.name, replicas=cluster.generation_replicas)
    reading, now = ctx.observed.progress, draft.now
    step = reading.step if reading is not None else 0
    request = fleet.drain_request
    if request is not None:
        if reading is not None and request.pod in reading.drained_workers:
            why = f"the driver drained {request.pod}; {request.message}"
            draft.act(
                ScaleGenerationWorkers(
                    cluster.name, cluster.uid, cluster.generation_group, request.replicas, (request.pod,), why
                ),
                Event("Normal", elastic.SCALED_DOWN, f"removing generation worker {request.pod}: {why}"),
            )
            fleet = fleet.model_copy(
                update={
                    "replicas": request.replicas,
                    "last_change_time": now,
                    "last_change_step": step,
                    "drain_request": None,
                }
            )
        else:
            draft.act(DeliverDrain(head, request.pod))
        draft.set_field("generation_fleet", fleet)
        return
    last = (
        elastic.LastChange(fleet.last_change_time, fleet.last_change_step or 0)
        if fleet.last_change_time is not None
        else None
    )
    windows = reading.windows if reading is not None else ()
    change = elastic.decide(pool, windows, cluster.generation_replicas, last, now)
    if change is not None and change.direction == "up":
        draft.act(
            ScaleGenerationWorkers(
                cluster.name, cluster.uid, cluster.generation_group, change.replicas, (), change.message
            ),
            Event("Normal", elastic.SCALED_UP, change.message),
        )
        fleet = fleet.model_copy(
            update={"replicas": change.replicas, "last_change_time": now, "last_change_step": step}
        )
    elif change is not None:
        workers = sorted(p.name for p in live if p.group == naming.GENERATION_GROUP)
        if workers:
            request = DrainRequest(
                pod=workers[-1], replicas=change.replicas, requested_at=now, message=change.message
            )
            draft.act(
                DeliverDrain(head, request.pod),
                Event(
                    "Normal",
                    elastic.DRAIN_REQUESTED,
                    f"asking the driver to drain generation worker {request.pod} before removing it: "
                    f"{change.message}",
                ),
            )
            fleet = fleet.model_copy(update={"drain_request": request})
    draft.set_field("generation_fleet", fleet)


def _time_to_first_step(reading: ProgressReading, attempt_start: datetime | None) -> float | None:
    """From the attempt's start to its driver's first trained step (None before it, or when the
    two clocks disagree so far that the step would come first)."""
    if reading.first_step_at is None or attempt_start is None or reading.first_step_at < attempt_start:
        return None
    return round((reading.first_step_at - attempt_start).total_seconds(), 1)


def _set_logprob_mismatch(draft: Draft, reading: ProgressReading) -> None:
    """LogprobMismatch follows the driver's log-prob gate: True (a Warning event) while it reports
    a mismatch, False once it stops; absent on a job whose driver never reported one."""
    if reading.logprob_mismatch is not None:
        draft.set(LOGPROB_MISMATCH, True, GEN_LOGPROB_ERROR_HIGH, reading.logprob_mismatch)
    elif draft.has(LOGPROB_MISMATCH):
        draft.set(
            LOGPROB_MISMATCH,
            False,
            "GenLogprobErrorNormal",
            "genLogprobError came back to logprobGate.threshold or below",
        )


def _before(when: datetime | None, admitted_at: datetime | None) -> bool:
    return when is not None and admitted_at is not None and when < admitted_at


def _iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")
