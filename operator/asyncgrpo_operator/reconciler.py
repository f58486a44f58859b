"""One reconcile pass of one job: read the world, plan, act, write the status, post the events.

Level-triggered: every pass starts from the whole current view of the job and its children, read
from the watch caches (cache.py), so a missed watch event, a crash between two writes or an
operator restart is repaired by the next pass; a pass makes no API request to read.
Idempotent: names are deterministic (a second create answers 409, which is success), deletes
carry UID preconditions, and the status is written first, with the resourceVersion that was read:
a decision made on stale data is rejected (409) before it acted, and re-planned instead of
overwriting a newer one. Events are posted last, so a re-planned pass does not repeat them.
The status is written only when something `kubectl get` or `describe` shows changes: a poll of
/progress that finds the same figures writes nothing (status.progress.updatedAt is when the
figures last changed).

Besides the cache, the only state kept between passes is what the API cannot give back: the exit
of a head pod that KubeRay has deleted since, when the step last advanced (for Stalled), and the
last refused RayCluster create (for its backoff). /progress is read by the poller (progress.py),
never by a pass: a pass takes its latest reading, so a head that hangs holds up no pass.
Every RayCluster create or resume is preceded by the job's Ray token Secret and NetworkPolicy
(`_protect`): its pods need the one to start and should never run without the other.
Every write is preceded by a check that this replica still leads (`may_act`). A refused create is
planned again in the same pass, so the job shows the API server's message at once instead of
after a retry. A conclusion the plan would draw from a
child's absence (a lost head pod or RayCluster, which costs a restart) is made only on the job's
children read afresh from the API server: the caches of pods and RayClusters may lag each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from asyncgrpo_api import runtime_rules
from asyncgrpo_api.rules import Finding, validate_manifest
from asyncgrpo_api.v1alpha1 import TERMINAL_PHASES, AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_api.v1alpha1.base import known_fields
from asyncgrpo_api.v1alpha1.runtime import CleanupPolicy
from asyncgrpo_operator import (
    admitted,
    cache,
    decision,
    drain,
    elastic,
    k8s,
    manifests,
    naming,
    plan,
    progress,
    raytoken,
    recovery,
)
from asyncgrpo_operator import workload as workload_mod
from asyncgrpo_operator.cache import Cache
from asyncgrpo_operator.manifests import OperatorPods, Owner
from asyncgrpo_operator.observed import (
    ClusterView,
    ConfigMapView,
    CreateFailure,
    DriverExit,
    Observation,
    PodView,
    ProgressMark,
    WorkloadView,
    is_kuberay_head,
)

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name) of a job."""


NO_AUTH_OPTIONS = (
    "the API server stored it without its spec.authOptions: the RayCluster CRD is from a KubeRay older "
    "than 1.6, and without Ray's token authentication the job's Ray would take work from anyone who "
    "reaches it; the RayCluster was deleted. Upgrade KubeRay (docs/operations/helm.md)"
)
CONFLICT_RECHECK_SECONDS = 1.0
"""How soon a job whose status write met a newer job looks again (the job watch normally brings
the newer version, and queues it, sooner)."""


class ConflictError(Exception):
    """The job changed between read and status write; the pass must be re-planned."""


class NotLeadingError(Exception):
    """This replica lost its lease during the pass: the pass stops before its next write, since
    the replica that leads now may already act on the same job."""


@dataclass
class Memory:
    """Facts a pass cannot re-read from the API (see the module docstring)."""

    exits: dict[Key, DriverExit] = field(default_factory=dict)
    marks: dict[Key, ProgressMark] = field(default_factory=dict)
    written: dict[Key, str] = field(default_factory=dict)
    """The resourceVersion of the job as this operator's last status write left it."""
    create_failures: dict[Key, CreateFailure] = field(default_factory=dict)
    conflicts: dict[Key, str] = field(default_factory=dict)
    """The job's resourceVersion that a status write found outdated (409): until the cache holds a
    newer one, a pass would only decide on the same outdated job again."""
    phases: dict[Key, str] = field(default_factory=dict)
    """Each job's phase as the last pass left it (the jobs-by-phase metric)."""
    problems: dict[Key, tuple[str, str]] = field(default_factory=dict)
    """The Kueue problem a dispatched job's last pass posted a Warning for (it has no status to
    hold it): posted again only when it changes, or after an operator restart."""

    def forget(self, key: Key) -> None:
        self.phases.pop(key, None)
        self.exits.pop(key, None)
        self.marks.pop(key, None)
        self.written.pop(key, None)
        self.create_failures.pop(key, None)
        self.conflicts.pop(key, None)
        self.problems.pop(key, None)


class Reconciler:
    """Runs passes; owns the API client and the memory, and tells the /progress poller which
    drivers to read."""

    def __init__(
        self,
        api: k8s.Api,
        poller: progress.Poller,
        cache: Cache,
        memory: Memory | None = None,
        *,
        progress_url_template: str = progress.DEFAULT_URL_TEMPLATE,
        may_act: Callable[[], bool] = lambda: True,
        ray_key: bytes | None = None,
        operator_pods: OperatorPods | None = None,
        drainer: drain.Drainer | None = None,
    ) -> None:
        self.api = api
        self.may_act = may_act
        """Whether this replica leads (leader.py), asked before every write."""
        self.poller = poller
        self.drainer = drainer if drainer is not None else drain.Drainer(poller.session)
        """Sends the elastic fleets' drain requests to their drivers, outside the passes."""
        self.cache = cache
        self.memory = memory or Memory()
        self.progress_url_template = progress.check_url_template(progress_url_template)
        self.drain_url_template = progress.drain_url_template(progress_url_template)
        self.ray_key = ray_key if ray_key is not None else raytoken.new_key()
        """What each job's Ray token is derived from (raytoken.py)."""
        self.operator_pods = operator_pods
        """The operator's own pods, which the jobs' NetworkPolicies admit to /progress."""

    def ray_token(self, namespace: str, name: str, uid: str) -> str:
        """The job's Ray token: in its Secret, and sent with every /progress read."""
        return raytoken.derive(self.ray_key, namespace, name, uid)

    def is_own_write(self, key: Key, resource_version: str | None) -> bool:
        """Whether a watch event shows the job exactly as this operator's last status write left
        it: the echo of that write, which holds nothing a pass has not already acted on."""
        return resource_version is not None and self.memory.written.get(key) == resource_version

    def remember_exit(self, key: Key, exit_: DriverExit) -> None:
        """Record a driver exit seen on a watch event (the pod may be deleted right after)."""
        self.memory.exits[key] = exit_

    async def reconcile(self, key: Key) -> float | None:
        """One pass; returns when to look again (seconds), or None to wait for events/resync."""
        name = key[1]
        body = self.cache.jobs.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.memory.forget(key)
            self.poller.forget(key)
            self.drainer.forget(key)
            return None
        if self.memory.conflicts.get(key) == str(body["metadata"].get("resourceVersion")):
            return CONFLICT_RECHECK_SECONDS  # the cache has not caught up with the job yet
        self.memory.conflicts.pop(key, None)
        now = datetime.now(UTC).replace(microsecond=0)
        generation = int(body["metadata"].get("generation") or 0)
        status = _parse_status(body.get("status"))
        owner = Owner(name=name, uid=str(body["metadata"]["uid"]))
        verdict = admitted.judge(validate_manifest(_manifest(body)), status, generation)
        runtime, refusals = await self._runtime(verdict.job, status)
        verdict = admitted.under_runtime(verdict, refusals)
        job, spec_errors = verdict.job, verdict.spec_errors
        observed = replace(await self._observe(key, body, job, status, now), runtime=runtime)
        if job is None:
            cleanup = _cleanup_policy(body)

            def invalid(seen: Observation) -> decision.Decision:
                return plan.plan_invalid(
                    status,
                    seen,
                    generation=generation,
                    message=verdict.refusal,
                    cleanup=cleanup,
                    owner=owner,
                    reason=verdict.reason,
                )

            outcome = invalid(observed)
            if outcome.confirm is not None:
                outcome = invalid(await self._confirm(key, observed, outcome.confirm))
            await self._apply(key, body, outcome, now, generation)
            return outcome.requeue_after
        if job.dispatched_by_multikueue:  # on the manager cluster: MultiKueue runs it elsewhere
            observed = replace(observed, reported_problem=self.memory.problems.get(key))
            dispatched = plan.plan_dispatched(job, status, observed, generation=generation, owner=owner)
            await self._apply(key, body, dispatched, now, generation)
            if dispatched.reported_problem is None:
                self.memory.problems.pop(key, None)
            else:
                self.memory.problems[key] = dispatched.reported_problem
            return dispatched.requeue_after
        outcome = plan.plan(
            job, status, observed, generation=generation, owner=owner, spec_errors=spec_errors
        )
        if outcome.confirm is not None:
            observed = await self._confirm(key, observed, outcome.confirm)
            outcome = plan.plan(
                job, status, observed, generation=generation, owner=owner, spec_errors=spec_errors
            )
        written, refusal = await self._apply(key, body, outcome, now, generation)
        if refusal is None:
            return outcome.requeue_after
        # The API server refused the RayCluster, or the spec ConfigMap's name is taken: plan again
        # on the world as this pass left it (its status written, its ConfigMap applied) with what
        # it found, so the pass already shows the refusal (condition and Event) and its retry.
        if isinstance(refusal, ConfigMapView):
            after = replace(observed, configmap=refusal)
        else:
            after = replace(
                observed,
                create_failure=refusal,
                configmap=self.cache.configmap(key, naming.spec_configmap_name(name)),
            )
        replanned = plan.plan(
            job, outcome.status, after, generation=generation, owner=owner, spec_errors=spec_errors
        )
        await self._apply(key, _as_written(body, written, outcome), replanned, now, generation)
        return replanned.requeue_after

    # --- read --------------------------------------------------------------------------------

    async def _observe(
        self,
        key: Key,
        body: Mapping[str, Any],
        job: AsyncGRPOJob | None,
        status: AsyncGRPOJobStatus | None,
        now: datetime,
    ) -> Observation:
        """The job's world: its RayClusters, pods, spec ConfigMap and Kueue Workload (from the
        cache), and (while the driver runs) its /progress. `job` is None for a job that is not run;
        its /progress is not read."""
        name = key[1]
        kuberay_missing = self.cache.kuberay_missing()
        clusters = () if kuberay_missing is not None else self.cache.clusters.of(key)
        pods = self.cache.pods.of(key)
        configmap = self.cache.configmap(key, naming.spec_configmap_name(name))
        failure = self.memory.create_failures.get(key)
        if failure is not None and any(c.name == failure.cluster for c in clusters):
            del self.memory.create_failures[key]  # created since
            failure = None
        uid = str(body["metadata"].get("uid", ""))
        if status is None:  # unreadable or new: the plan rebuilds it from the latest cluster, if any
            current = recovery.latest_cluster(Owner(name, uid), clusters)
        else:
            current_name = naming.raycluster_name(name, status.attempt)
            current = next((c for c in clusters if c.name == current_name and c.owner_uid == uid), None)
        head = None
        if current is not None:
            head = next((p for p in pods if is_kuberay_head(p, current) and not p.deleting), None)
        poll = self._poll(key, job, head, self.ray_token(key[0], name, uid), now) if job is not None else None
        kueue_view = await self._observe_kueue(key, uid, job) if job is not None else _KueueView()
        return Observation(
            now=now,
            clusters=clusters,
            pods=pods,
            configmap=configmap,
            remembered_exit=self.memory.exits.get(key),
            progress=poll.reading if poll is not None else None,
            progress_read_at=poll.read_at if poll is not None else None,
            progress_error=poll.error if poll is not None else None,
            progress_mark=self.memory.marks.get(key),
            create_failure=failure,
            kuberay_missing=kuberay_missing,
            workload=kueue_view.workload,
            kueue_missing=kueue_view.missing,
            flavors=kueue_view.flavors,
            priority=kueue_view.priority,
            priority_error=kueue_view.priority_error,
            from_cache=True,
        )

    async def _runtime(
        self, job: AsyncGRPOJob | None, status: AsyncGRPOJobStatus | None
    ) -> tuple[AsyncGRPORuntime | None, list[Finding]]:
        """The AsyncGRPORuntime the job names, read from the API server (one GET per pass of such an
        unfinished job: a runtime is rarely written, and no pass may run by one the administrator
        has changed since), and what it refuses in the job now."""
        finished = status is not None and status.phase in TERMINAL_PHASES
        if job is None or job.spec.runtime_ref is None or finished:
            return None, []
        return runtime_rules.check(job, await self.api.get_runtime(job.spec.runtime_ref.name))

    async def _observe_kueue(self, key: Key, uid: str, job: AsyncGRPOJob) -> _KueueView:
        """For a job Kueue manages: its Workload (from the watch cache: Kueue's decisions queue the
        job's pass as they are written), the ResourceFlavors its admission assigned, and (while it
        is not admitted) the priority its Workload should carry."""
        if job.kueue_queue_name is None:
            return _KueueView()
        missing = self.cache.kueue_missing()
        if missing is not None:
            return _KueueView(missing=missing)
        prebuilt = job.prebuilt_workload_name
        labelled = self.cache.workloads.of(key)
        if prebuilt is not None:  # a worker cluster's copy of a dispatched job: MultiKueue's Workload
            owned = [w for w in labelled if w.name == prebuilt]
        else:
            owned = sorted((w for w in labelled if w.controller_uid == uid), key=lambda w: w.name)
        view = owned[0] if owned else None
        out = _KueueView(workload=view)
        if view is not None and view.admitted:
            names = sorted({f for flavors in view.assignments.values() for f in flavors})
            found_flavors = await asyncio.gather(*(self.api.get_resource_flavor(n) for n in names))
            out.flavors = {
                n: workload_mod.Flavor.from_dict(f) for n, f in zip(names, found_flavors, strict=True) if f
            }
            return out
        if prebuilt is not None:  # its priority is the one the manager cluster wrote into it
            return out
        label = job.metadata.labels.get(workload_mod.PRIORITY_LABEL)
        if label:
            wpc = await self.api.get_workload_priority_class(label)
            if wpc is None:
                out.priority_error = (
                    f"WorkloadPriorityClass {label} (label {workload_mod.PRIORITY_LABEL}) does not exist; "
                    "create it or remove the label"
                )
            else:
                out.priority = workload_mod.Priority(
                    "kueue.x-k8s.io", "WorkloadPriorityClass", label, int(wpc.get("value") or 0)
                )
        elif job.spec.scheduler.priority_class_name:
            name = job.spec.scheduler.priority_class_name
            pc = await self.api.get_priority_class(name)
            if pc is None:
                out.priority_error = (
                    f"PriorityClass {name} (spec.scheduler.priorityClassName) does not exist; create it or "
                    "change the field"
                )
            else:
                out.priority = workload_mod.Priority(
                    "scheduling.k8s.io", "PriorityClass", name, int(pc.get("value") or 0)
                )
        return out

    async def _confirm(self, key: Key, observed: Observation, why: str) -> Observation:
        """The job's RayClusters and pods read from the API server, for a decision that a missing
        one would make (a restart): the caches may only lag. What is read goes into the cache."""
        namespace, name = key
        log.info("confirming from the API server", extra=_fields(key, why=why))
        raw_clusters, raw_pods = await asyncio.gather(
            self.api.list_rayclusters(namespace, name), self.api.list_pods(namespace, name)
        )
        for obj in raw_clusters:
            self.cache.clusters.apply(cache.MODIFIED, obj)
        for obj in raw_pods:
            self.cache.pods.apply(cache.MODIFIED, obj)
        return replace(
            observed,
            clusters=tuple(ClusterView.from_dict(c) for c in raw_clusters),
            pods=tuple(PodView.from_dict(p) for p in raw_pods),
            from_cache=False,
        )

    def _poll(
        self, key: Key, job: AsyncGRPOJob, head: PodView | None, token: str, now: datetime
    ) -> progress.Poll | None:
        """The latest /progress read while the driver runs (the poller reads it, with the job's
        Ray `token`; a pass never waits on the head pod), after telling the poller what to read."""
        driver = head.container(naming.DRIVER_CONTAINER) if head is not None else None
        if driver is None or driver.state != "running":
            self.poller.forget(key)
            return None
        url = progress.progress_url(self.progress_url_template, key[0], key[1], head)
        if url is None:
            self.poller.forget(key)
            return progress.Poll(now, None, "the head pod has no IP yet")
        self.poller.track(key, url, job.spec.progress.poll_seconds, token)
        return self.poller.latest(key)

    # --- write -------------------------------------------------------------------------------

    async def _apply(
        self, key: Key, body: Mapping[str, Any], outcome: decision.Decision, now: datetime, generation: int
    ) -> tuple[str, Refusal | None]:
        """Write the status, act, post the events. Returns the job's resourceVersion afterwards and
        what stopped an action, if anything did: the API server's refusal of a RayCluster create,
        or the ConfigMap found in the way of the job's (the actions after it are not taken: the
        RayCluster's pods would mount that ConfigMap as their spec)."""
        namespace, name = key
        meta = body["metadata"]
        resource_version = str(meta["resourceVersion"])
        # The status first, then the actions: a decision made on stale data fails here (409)
        # before it changed anything, and a crash after this point leaves a status that the
        # next pass completes (it records a cluster only once it has seen it).
        wrote = False
        deletes_job = any(isinstance(a, decision.DeleteJob) for a in outcome.actions)
        new_status = outcome.status_patch()
        if (
            outcome.writes_status
            and not deletes_job
            and _shown(new_status) != _shown(body.get("status") or {})
        ):
            self._check_leading(key)
            wrote = True
            try:
                written = await self.api.patch_job_status(
                    namespace, name, str(meta["resourceVersion"]), new_status
                )
                version = (written.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.memory.written[key] = resource_version = str(version)
                    self.cache.jobs.apply(cache.MODIFIED, written)
            except k8s.ApiError as err:
                if err.status == 409:
                    self.memory.conflicts[key] = resource_version
                    raise ConflictError(f"{namespace}/{name} changed while it was reconciled") from err
                if err.status == 404:  # deleted meanwhile: nothing left to do
                    self.memory.forget(key)
                    return resource_version, None
                raise
        refusal: Refusal | None = None
        try:
            for action in outcome.actions:
                self._check_leading(key)
                stopped = await self._act(key, meta, action, now, generation)
                refusal = refusal or stopped
                if isinstance(stopped, ConfigMapView):
                    break
        finally:
            # The status is written: its transition's events go out even when an action fails
            # (the retried pass sees the new phase and would not post them again).
            # Events are independent of each other: posted together (one round trip, not one each).
            if outcome.events:
                self._check_leading(key)
                await asyncio.gather(*(self._post_event(key, body, event) for event in outcome.events))
        if not any(isinstance(a, decision.DeliverDrain) for a in outcome.actions):
            self.drainer.forget(key)  # drained, cleared, or no driver to ask: stop sending
        log.debug("pass", extra=_fields(key, wrote_status=wrote, requeue_after=outcome.requeue_after))
        self.memory.phases[key] = outcome.status.phase
        if outcome.progress_mark is not None:
            self.memory.marks[key] = outcome.progress_mark
        if outcome.status.phase in ("Succeeded", "Failed"):
            self.memory.exits.pop(key, None)
            self.poller.forget(key)
        old_phase = (body.get("status") or {}).get("phase")
        if old_phase != outcome.status.phase or outcome.events:
            log.info(
                "reconciled",
                extra=_fields(
                    key,
                    phase=outcome.status.phase,
                    reason=outcome.status.reason,
                    previous_phase=old_phase,
                    actions=[type(a).__name__ for a in outcome.actions],
                ),
            )
        return resource_version, refusal

    def _check_leading(self, key: Key) -> None:
        if not self.may_act():
            raise NotLeadingError(f"{key[0]}/{key[1]}: this replica no longer leads")

    async def _act(
        self, key: Key, meta: Mapping[str, Any], action: decision.Action, now: datetime, generation: int
    ) -> Refusal | None:
        namespace, name = key
        if _starts_pods(action):
            await self._protect(key, str(meta["uid"]))
        if isinstance(action, decision.DeliverDrain):
            await self._deliver_drain(key, meta, action)
            return None
        if isinstance(action, decision.ApplyConfigMap):
            return await self._apply_configmap(str(meta["uid"]), action)
        if isinstance(action, decision.CreateRayCluster):
            return await self._create_raycluster(key, action.manifest, now, generation)
        if isinstance(action, decision.DeleteRayCluster):
            await self.api.delete_raycluster(namespace, action.name, action.uid)
            self.cache.mark_deleting(action.uid)
            log.info("deleted RayCluster", extra=_fields(key, cluster=action.name, why=action.why))
        elif isinstance(action, decision.DeleteJob):
            await self.api.delete_job(namespace, name, str(meta["uid"]))
            log.info("deleted job", extra=_fields(key, why=action.why))
        else:
            await self._act_on_kueue_and_suspend(key, meta, action)
        return None

    async def _deliver_drain(self, key: Key, meta: Mapping[str, Any], action: decision.DeliverDrain) -> None:
        """Hand the drain request to the sender (it POSTs outside the pass); a refusal of it by
        the driver that was not reported yet becomes a Warning event naming the worker."""
        namespace, name = key
        url = progress.progress_url(self.drain_url_template, namespace, name, action.head)
        if url is None:
            return  # the head pod has no IP yet: a later pass delivers it
        token = self.ray_token(namespace, name, str(meta["uid"]))
        refusal = self.drainer.deliver(key, drain.Request(url, token, action.worker))
        if refusal is not None:
            message = f"the driver refused to drain generation worker {action.worker}: {refusal}"
            log.warning("drain request refused", extra=_fields(key, worker=action.worker, answer=refusal))
            event = decision.Event("Warning", elastic.DRAIN_REFUSED, message)
            await self._post_event(key, {"metadata": meta}, event)

    async def _act_on_kueue_and_suspend(
        self, key: Key, meta: Mapping[str, Any], action: decision.Action
    ) -> None:
        """Suspending and resuming in place, and the job's Workload. A Workload write that meets a
        newer Workload (409: Kueue decided meanwhile) is dropped: the next pass plans on Kueue's."""
        namespace, name = key
        try:
            if isinstance(action, decision.SetRayClusterSpec):
                written = await self.api.set_raycluster_spec(
                    namespace, action.name, action.uid, action.suspend, action.spec
                )
                self.cache.clusters.apply(cache.MODIFIED, written)
            elif isinstance(action, decision.ScaleRayClusterWorkers):
                written = await self.api.scale_raycluster_workers(
                    namespace, action.name, action.uid, action.groups
                )
                self.cache.clusters.apply(cache.MODIFIED, written)
            elif isinstance(action, decision.ScaleGenerationWorkers):
                written = await self.api.scale_generation_workers(
                    namespace,
                    action.name,
                    action.uid,
                    group=action.group,
                    replicas=action.replicas,
                    remove=action.remove,
                )
                self.cache.clusters.apply(cache.MODIFIED, written)
            elif isinstance(action, decision.SetJobSuspend):
                job = await self.api.set_job_suspend(namespace, name, str(meta["uid"]), action.suspend)
                self.cache.jobs.apply(cache.MODIFIED, job)
            elif isinstance(action, decision.CreateWorkload):
                created = await self.api.create_workload(dict(action.manifest))
                if created is not None:
                    self.cache.workloads.apply(cache.ADDED, created)
            elif isinstance(action, decision.UpdateWorkload | decision.AdoptWorkload):
                written = await self.api.patch_workload(
                    namespace, action.name, action.resource_version, action.patch
                )
                self.cache.workloads.apply(cache.MODIFIED, written)
            elif isinstance(action, decision.DeleteWorkload):
                await self.api.delete_workload(namespace, action.name, action.uid)
            elif isinstance(action, decision.PatchWorkloadStatus):
                written = await self.api.patch_workload(
                    namespace, action.name, action.resource_version, {"status": action.status}, status=True
                )
                self.cache.workloads.apply(cache.MODIFIED, written)
        except k8s.ApiError as err:
            if err.status not in (404, 409):
                raise
            log.info(
                "stale write dropped", extra=_fields(key, action=type(action).__name__, status=err.status)
            )
            return
        log.info("acted", extra=_fields(key, action=type(action).__name__, why=getattr(action, "why", "")))

    async def _apply_configmap(self, job_uid: str, action: decision.ApplyConfigMap) -> ConfigMapView | None:
        """Create the spec ConfigMap, or replace the data of the job's own; returns the ConfigMap of
        that name, untouched, when the job does not control it. The plan already leaves a foreign
        one alone; this also covers one the cache does not hold (it holds only the operator's)."""
        existing = action.existing
        if existing is None:
            created = await self.api.create_configmap(action.manifest)
            if created is not None:
                self.cache.configmaps.apply(cache.ADDED, created)
                return None
            meta = action.manifest["metadata"]
            found = await self.api.find_configmap(meta["namespace"], meta["name"])
            if found is None:  # deleted between the two calls: the pass is retried, and creates it
                raise k8s.ApiError(409, f"ConfigMap {meta['name']} exists, then did not")
            existing = ConfigMapView.from_dict(found)
        if existing.owner_uid != job_uid:
            return existing
        written = await self.api.replace_configmap_data(action.manifest, existing.resource_version)
        self.cache.configmaps.apply(cache.MODIFIED, written)
        return None

    async def _protect(self, key: Key, uid: str) -> None:
        """The job's Ray token Secret and NetworkPolicy, written before pods of its RayCluster can
        exist (its create, or its resume: a cluster an older operator created gets them too).

        The Secret is created, never read: one of its name that exists is the job's, written by an
        earlier pass with the same derived token. (Or a namesake's, deleted moments ago: the garbage
        collector deletes it along with that job's spec ConfigMap, whose deletion the plan waited
        for; the job's /progress reads being refused would show the rare miss.) The NetworkPolicy
        is put back as rendered when the job controls it; one of its name that is someone else's is
        left alone (whoever may create NetworkPolicies in the namespace may as well add one that
        admits everything: the name gives them nothing more), and the token still guards Ray."""
        namespace, name = key
        owner = Owner(name, uid)
        secret = manifests.ray_token_secret(name, namespace, owner, self.ray_token(namespace, name, uid))
        policy = manifests.network_policy(name, namespace, owner, self.operator_pods)
        await asyncio.gather(self.api.create_secret(secret), self._apply_network_policy(key, uid, policy))

    async def _apply_network_policy(self, key: Key, uid: str, policy: Mapping[str, Any]) -> None:
        if await self.api.create_network_policy(dict(policy)) is not None:
            return
        current = await self.api.get_network_policy(key[0], policy["metadata"]["name"])
        if current is None:  # deleted between the two calls: the pass is retried, and creates it
            raise k8s.ApiError(409, f"NetworkPolicy {policy['metadata']['name']} exists, then did not")
        if _controller_uid(current) != uid:
            log.warning(
                "NetworkPolicy is not the job's; left alone",
                extra=_fields(key, policy=policy["metadata"]["name"]),
            )
            return
        labels = (current.get("metadata") or {}).get("labels") or {}
        if current.get("spec") == policy["spec"] and labels == policy["metadata"]["labels"]:
            return
        await self.api.replace_network_policy(dict(policy), str(current["metadata"]["resourceVersion"]))
        log.info("NetworkPolicy put back as rendered", extra=_fields(key, policy=policy["metadata"]["name"]))

    async def _create_raycluster(
        self, key: Key, manifest: Mapping[str, Any], now: datetime, generation: int
    ) -> CreateFailure | None:
        """Create the attempt's RayCluster; a refusal (any HTTP error but 409, which means it
        exists) is remembered for the plan, with how many times in a row it happened. So is a
        cluster created without its `authOptions` (a KubeRay CRD too old to know them drops the
        field): it would run Ray open to the cluster, and is deleted at once."""
        cluster = str(manifest["metadata"]["name"])
        try:
            created = await self.api.create_raycluster(dict(manifest))
        except k8s.ApiError as err:
            if err.status == 0:  # no answer at all: the pass fails and is retried with backoff
                raise
            return self._create_failed(key, cluster, err.status, err.message, now=now, generation=generation)
        if created is not None and not _keeps_auth_options(created, manifest):
            await self.api.delete_raycluster(key[0], cluster, str(created["metadata"]["uid"]))
            return self._create_failed(key, cluster, 201, NO_AUTH_OPTIONS, now=now, generation=generation)
        self.memory.create_failures.pop(key, None)
        if created is not None:
            self.cache.clusters.apply(cache.ADDED, created)
        log.info("created RayCluster", extra=_fields(key, cluster=cluster, new=created is not None))
        return None

    def _create_failed(
        self, key: Key, cluster: str, status: int, message: str, *, now: datetime, generation: int
    ) -> CreateFailure:
        last = self.memory.create_failures.get(key)
        count = last.count + 1 if last is not None and last.cluster == cluster else 1
        failure = CreateFailure(cluster, status, message, now, count, generation)
        self.memory.create_failures[key] = failure
        log.warning(
            "RayCluster create refused",
            extra=_fields(key, cluster=cluster, status=status, error=message, count=count),
        )
        return failure

    async def _post_event(self, key: Key, body: Mapping[str, Any], event: decision.Event) -> None:
        try:
            await self.api.post_event(body, event.type, event.reason, event.message)
        except k8s.ApiError as err:  # events are best effort; the status is the record
            log.warning("could not post event", extra=_fields(key, reason=event.reason, error=str(err)))


@dataclass
class _KueueView:
    """What a pass read from Kueue for one job (see Reconciler._observe_kueue)."""

    workload: WorkloadView | None = None
    missing: str | None = None
    flavors: dict[str, workload_mod.Flavor] = field(default_factory=dict)
    priority: workload_mod.Priority | None = None
    priority_error: str | None = None


def _keeps_auth_options(stored: Mapping[str, Any], sent: Mapping[str, Any]) -> bool:
    """Whether the API server stored the RayCluster with the authOptions it was sent (defaults a
    newer KubeRay may add beside them do not matter)."""
    wanted: Mapping[str, Any] = sent["spec"]["authOptions"]
    kept = (stored.get("spec") or {}).get("authOptions") or {}
    return all(kept.get(field) == value for field, value in wanted.items())


def _starts_pods(action: decision.Action) -> bool:
    """A RayCluster create or resume: KubeRay makes its pods right after."""
    if isinstance(action, decision.SetRayClusterSpec):
        return not action.suspend
    return isinstance(action, decision.CreateRayCluster)


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("uid", ""))
    return None


Refusal = CreateFailure | ConfigMapView
"""What stops a pass's actions: see `Reconciler._apply`."""


def _as_written(body: Mapping[str, Any], resource_version: str, outcome: decision.Decision) -> dict[str, Any]:
    """The job as the pass's status write left it, to plan and write on top of it."""
    return {
        **body,
        "metadata": {**body["metadata"], "resourceVersion": resource_version},
        "status": outcome.status_patch(),
    }


def _cleanup_policy(body: Mapping[str, Any]) -> CleanupPolicy:
    """A job's cleanupPolicy as far as it can be read when the rest of its spec cannot (else the
    defaults), so that a job the operator will not run is still cleaned up and its TTL applies."""
    try:
        return CleanupPolicy.model_validate((body.get("spec") or {}).get("cleanupPolicy") or {})
    except (ValidationError, AttributeError):
        return CleanupPolicy()


def _manifest(body: Mapping[str, Any]) -> dict[str, Any]:
    """The job as the rules read it: envelope, metadata and spec (the status is the operator's)."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "uid") if k in meta},
        "spec": body.get("spec") or {},
    }


def _parse_status(raw: Any) -> AsyncGRPOJobStatus | None:
    """The stored status, or None when there is none or it cannot be read (the plan then rebuilds
    it from the job's RayClusters: recovery.py).

    Fields this version does not know, at any depth, are dropped rather than failing the whole
    status: after a rollback the newer version's fields stay in the stored status, and a rebuilt
    status knows less than the stored one (no conditions, no progress; issue 47 item 8)."""
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return AsyncGRPOJobStatus.model_validate(raw)
    except ValidationError:
        try:
            return AsyncGRPOJobStatus.model_validate(known_fields(AsyncGRPOJobStatus, raw))
        except ValidationError:
            log.warning("unreadable status; rebuilding it")
            return None


def _shown(status: Mapping[str, Any]) -> Any:
    """The status as compared to decide whether to write it: all of it but when the progress
    figures were read (a poll that reads the same figures is not news; the Stalled clock runs in
    memory, `Memory.marks`)."""
    pruned = _prune(status)
    progress_ = pruned.get("progress")
    if isinstance(progress_, dict):
        pruned["progress"] = {k: v for k, v in progress_.items() if k != "updatedAt"}
    return pruned


def _prune(value: Any) -> Any:
    """Drop nulls recursively: the API stores a merge patch's nulls as absent fields."""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _fields(key: Key, **values: Any) -> dict[str, Any]:
    return {"job_namespace": key[0], "job_name": key[1], **values}
