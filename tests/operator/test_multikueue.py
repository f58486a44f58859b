"""The plan for MultiKueue (Kueue v0.17.0's generic external-framework adapter): on the manager
cluster a job with spec.managedBy kueue.x-k8s.io/multikueue keeps its Workload but runs nothing and
never writes its status (MultiKueue copies the worker's over it); on a worker cluster the copy
MultiKueue created uses the prebuilt Workload named by its label, and never makes one of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_operator import plan, progress, workload
from asyncgrpo_operator.cache import ADDED
from asyncgrpo_operator.decision import (
    AdoptWorkload,
    CreateRayCluster,
    CreateWorkload,
    DeleteWorkload,
    PatchWorkloadStatus,
    SetJobSuspend,
    UpdateWorkload,
)
from asyncgrpo_operator.manifests import Owner
from asyncgrpo_operator.observed import WorkloadView
from asyncgrpo_operator.reconciler import Reconciler
from tests.operator.builders import BASE_JOB, OWNER
from tests.operator.test_queueing import (
    PENDING,
    actions,
    admitted_at,
    condition,
    kueue_job,
    seen,
    wl,
)
from tests.operator.test_reconcile_round_trips import TimedApi, cached, new_job

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
MANAGER_OWNER = Owner(name=OWNER.name, uid="manager-job-uid")


def dispatched_job(**spec: Any) -> AsyncGRPOJob:
    return kueue_job(managedBy=MULTIKUEUE, **spec)


def dispatch(status: AsyncGRPOJobStatus | None, seconds: float, **observed: Any) -> plan.Decision:
    the_job = dispatched_job()
    return plan.plan_dispatched(
        the_job, status, seen(seconds, the_job=the_job, **observed), generation=1, owner=OWNER
    )


def worker_copy(**spec: Any) -> AsyncGRPOJob:
    """The job as MultiKueue creates it on a worker (adapter.go, createRemoteObject): managedBy
    removed, the prebuilt-workload and origin labels added."""
    manifest: dict[str, Any] = {
        **BASE_JOB,
        "metadata": {
            **BASE_JOB["metadata"],
            "labels": {
                "kueue.x-k8s.io/queue-name": "team-a",
                "kueue.x-k8s.io/prebuilt-workload-name": prebuilt_name(),
                "kueue.x-k8s.io/multikueue-origin": "manager",
            },
        },
        "spec": {**BASE_JOB["spec"], **spec},
    }
    return AsyncGRPOJob.model_validate(manifest)


def prebuilt_name() -> str:
    return workload.workload_name(OWNER.name, MANAGER_OWNER.uid)


def prebuilt(*conditions: dict[str, Any], controller: str = "", admitted: bool = False) -> WorkloadView:
    """The Workload MultiKueue cloned from the manager's (cloneForCreate: name, labels, annotations
    and spec; no ownerReferences), as the worker's Kueue left it."""
    manager = workload.manifest(
        dispatched_job(), MANAGER_OWNER, plan.manifests.ray_cluster(dispatched_job(), 0, MANAGER_OWNER), None
    )
    base = wl(*conditions, admitted=admitted)
    meta = manager["metadata"]
    return WorkloadView.from_dict(
        {
            "metadata": {
                "name": meta["name"],
                "labels": meta["labels"],
                "annotations": meta["annotations"],
                "uid": "prebuilt-uid",
                "resourceVersion": "9",
                "ownerReferences": (
                    [{"apiVersion": "x/v1", "kind": "X", "name": "x", "uid": controller, "controller": True}]
                    if controller
                    else []
                ),
            },
            "spec": manager["spec"],
            "status": {
                "conditions": list(base.conditions),
                **(
                    {"admission": {"podSetAssignments": [{"name": "head", "flavors": {"cpu": "cpu"}}]}}
                    if admitted
                    else {}
                ),
            },
        }
    )


def on_worker(
    status: AsyncGRPOJobStatus | None, seconds: float, the_job: AsyncGRPOJob | None = None, **kw: Any
) -> plan.Decision:
    the_job = the_job or worker_copy()
    return plan.plan(the_job, status, seen(seconds, the_job=the_job, **kw), generation=1, owner=OWNER)


# --- the manager cluster ---------------------------------------------------------------------------


def test_a_dispatched_job_gets_its_workload_on_the_manager_but_no_raycluster_and_no_status() -> None:
    first = dispatch(None, 0)
    assert [type(a) for a in first.actions] == [CreateWorkload]
    assert first.writes_status is False
    assert first.status == AsyncGRPOJobStatus()  # what was stored, unchanged


def test_the_manager_never_unsuspends_nor_runs_a_dispatched_job_kueue_admitted() -> None:
    decision = dispatch(None, 20, workload=admitted_at(10))
    assert not actions(decision, CreateRayCluster)
    assert not actions(decision, SetJobSuspend)
    assert not decision.writes_status


def test_the_worker_status_copied_to_the_manager_is_left_as_it_is() -> None:
    copied = AsyncGRPOJobStatus.model_validate(
        {"phase": "Running", "rayClusterName": "job-0", "workloadName": prebuilt_name()}
    )
    decision = dispatch(copied, 30, workload=admitted_at(10))
    assert decision.status == copied and not decision.writes_status
    assert not decision.actions


def test_a_finished_dispatched_job_leaves_its_workload_to_multikueue() -> None:
    done = AsyncGRPOJobStatus.model_validate(
        {
            "phase": "Succeeded",
            "conditions": [condition("Complete", "True", "DriverSucceeded")],
        }
    )
    decision = dispatch(done, 30, workload=admitted_at(10))
    assert not decision.actions and not decision.writes_status


def evicted_dispatched() -> WorkloadView:
    return wl(
        condition("QuotaReserved", "True"),
        condition("Admitted", "True", since=10),
        condition("Evicted", "True", "Preempted", "preempted by a higher priority job"),
        the_job=dispatched_job(),
        admitted=True,
    )


def copied(phase: str) -> AsyncGRPOJobStatus:
    """The worker's status as MultiKueue copies it to the manager."""
    return AsyncGRPOJobStatus.model_validate({"phase": phase, "rayClusterName": "job-0"})


def test_an_evicted_dispatched_workload_keeps_its_quota_while_the_job_runs_on_the_worker() -> None:
    decision = dispatch(copied("Running"), 30, workload=evicted_dispatched())
    assert not actions(decision, PatchWorkloadStatus)


def test_an_evicted_dispatched_workload_gives_its_quota_back_once_the_worker_stopped_the_job() -> None:
    for stopped in (None, copied("Queued"), copied("Suspended")):
        decision = dispatch(stopped, 30, workload=evicted_dispatched())
        [patch] = actions(decision, PatchWorkloadStatus)
        types = {c["type"]: c["status"] for c in patch.status["conditions"]}
        assert types["QuotaReserved"] == "False" and types["Requeued"] == "True"
        assert not decision.writes_status


def test_a_changed_spec_rewrites_the_manager_workload_while_it_waits() -> None:
    stale = wl(PENDING)  # written for the job without managedBy's digest inputs changed: same pods
    assert not actions(dispatch(None, 5, workload=stale), UpdateWorkload)
    changed = plan.plan_dispatched(
        dispatched_job(backoffLimit=1, cluster={"head": {"resources": {"requests": {"cpu": "3"}}}}),
        None,
        seen(5, workload=stale),
        generation=2,
        owner=OWNER,
    )
    assert actions(changed, UpdateWorkload)


def test_a_missing_priority_class_is_reported_as_an_event_not_a_status() -> None:
    decision = dispatch(
        None, 5, priority_error="PriorityClass p (spec.scheduler.priorityClassName) does not exist"
    )
    assert not decision.actions and not decision.writes_status
    assert [e.reason for e in decision.events] == ["PriorityClassNotFound"]


def test_a_missing_priority_class_is_reported_once_not_on_every_pass() -> None:
    """The job has no status of its own to hold the problem: the Warning went out every 30 s."""
    missing = "PriorityClass p (spec.scheduler.priorityClassName) does not exist"
    first = dispatch(None, 5, priority_error=missing)
    again = dispatch(None, 35, priority_error=missing, reported_problem=first.reported_problem)
    assert [e.type for e in first.events] == ["Warning"] and not again.events
    other = dispatch(
        None, 65, priority_error=missing.replace(" p ", " q "), reported_problem=again.reported_problem
    )
    assert [e.reason for e in other.events] == ["PriorityClassNotFound"]  # another problem: news
    fixed = dispatch(None, 95, reported_problem=other.reported_problem)
    assert fixed.reported_problem is None


# --- a worker cluster ------------------------------------------------------------------------------


def test_the_worker_copy_waits_for_its_prebuilt_workload_and_creates_none() -> None:
    decision = on_worker(None, 0)
    assert not actions(decision, CreateWorkload) and not actions(decision, CreateRayCluster)
    queued = decision.condition("Queued")
    assert queued is not None and queued.reason == "WaitingForPrebuiltWorkload"
    assert prebuilt_name() in queued.message
    assert decision.status.phase == "Queued"


def test_the_worker_copy_adopts_the_prebuilt_workload_and_runs_once_admitted() -> None:
    admitted = prebuilt(
        condition("QuotaReserved", "True", since=5), condition("Admitted", "True", since=5), admitted=True
    )
    decision = on_worker(None, 10, the_job=worker_copy(suspend=True), workload=admitted)
    [adopt] = actions(decision, AdoptWorkload)
    assert adopt.name == prebuilt_name()
    assert adopt.patch["metadata"]["labels"] == {"kueue.x-k8s.io/job-uid": OWNER.uid}
    [ref] = adopt.patch["metadata"]["ownerReferences"]
    assert ref["uid"] == OWNER.uid and ref["controller"] is True
    assert [a.suspend for a in actions(decision, SetJobSuspend)] == [False]
    assert actions(decision, CreateRayCluster)
    assert not actions(decision, CreateWorkload) and not actions(decision, UpdateWorkload)
    assert decision.status.workload_name == prebuilt_name()


def test_an_adopted_prebuilt_workload_is_not_adopted_again() -> None:
    mine = prebuilt(
        condition("QuotaReserved", "True"), condition("Admitted", "True"), controller=OWNER.uid, admitted=True
    )
    assert not actions(on_worker(None, 10, workload=mine), AdoptWorkload)


def test_a_prebuilt_workload_another_object_controls_is_not_used() -> None:
    theirs = prebuilt(
        condition("QuotaReserved", "True"), condition("Admitted", "True"), controller="other", admitted=True
    )
    decision = on_worker(None, 10, workload=theirs)
    assert not actions(decision, AdoptWorkload) and not actions(decision, CreateRayCluster)
    queued = decision.condition("Queued")
    assert queued is not None and queued.reason == "PrebuiltWorkloadTaken"


def test_the_worker_never_rewrites_nor_deletes_multikueues_workload_when_the_pods_differ() -> None:
    reserved = prebuilt(condition("QuotaReserved", "True"), condition("Admitted", "False", "Pending"))
    changed = worker_copy(cluster={"head": {"resources": {"requests": {"cpu": "3"}}}})
    decision = on_worker(None, 10, the_job=changed, workload=reserved)
    assert not actions(decision, UpdateWorkload) and not actions(decision, DeleteWorkload)
    assert not actions(decision, CreateRayCluster)
    failed = decision.condition("Failed")
    assert failed is not None and failed.reason == "PrebuiltWorkloadOutOfSync"
    [finish] = actions(decision, PatchWorkloadStatus)  # the manager learns it through MultiKueue
    assert {"type": "Finished", "status": "True"}.items() <= finish.status["conditions"][-1].items()


def test_the_manager_and_worker_render_the_same_pod_sets() -> None:
    """MultiKueue deletes a worker's Workload whose spec differs from the manager's, and the worker
    fails a job whose pods differ from its prebuilt Workload: the labels MultiKueue adds and the
    other job UID must not change what the Workload asks for."""
    manager = workload.manifest(
        dispatched_job(), MANAGER_OWNER, plan.manifests.ray_cluster(dispatched_job(), 0, MANAGER_OWNER), None
    )
    worker = workload.manifest(
        worker_copy(), OWNER, plan.manifests.ray_cluster(worker_copy(), 0, OWNER), None
    )
    assert manager["spec"] == worker["spec"]
    assert manager["metadata"]["annotations"] == worker["metadata"]["annotations"]


# --- the passes, against a fake API server ---------------------------------------------------------


class KueueApi(TimedApi):
    """Kueue's API besides the job's: the writes to Workloads (the operator reads them from its
    watch cache, which `run_pass` fills with `workloads`)."""

    def __init__(self, job: dict[str, Any], workloads: list[dict[str, Any]]) -> None:
        super().__init__(job)
        self.workloads = workloads
        self.patches: list[dict[str, Any]] = []

    async def create_workload(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create_workload", manifest)  # type: ignore[no-any-return]

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> dict[str, Any]:
        return await self._call(
            "set_job_suspend", {**self.job, "spec": {**self.job["spec"], "suspend": suspend}}
        )  # type: ignore[no-any-return]

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        return await self._call("get_priority_class", None)  # type: ignore[no-any-return]

    async def patch_workload(self, namespace: str, name: str, version: str, patch: Any, **_: Any) -> Any:
        self.patches.append(patch)
        return await self._call("patch_workload", {})


def stored(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    body = new_job()
    body["metadata"]["labels"] = labels
    body["spec"].update(spec)
    return body


def run_pass(api: KueueApi) -> list[str]:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            cache = cached(api.job)
            for found in api.workloads:
                cache.workloads.apply(ADDED, found)
            reconciler = Reconciler(api, progress.Poller(session), cache)  # type: ignore[arg-type]
            await reconciler.reconcile(("team", "demo"))

    asyncio.run(scenario())
    return [name for name, _, _ in api.calls]


def test_a_manager_pass_creates_the_workload_and_writes_nothing_else() -> None:
    api = KueueApi(stored({"kueue.x-k8s.io/queue-name": "team-a"}, managedBy=MULTIKUEUE), [])
    calls = run_pass(api)
    assert "create_workload" in calls
    assert not {"patch_job_status", "create_configmap", "create_raycluster", "set_job_suspend"} & set(calls)


def test_passes_of_a_dispatched_job_without_its_priority_class_post_one_warning() -> None:
    """Through the reconciler: its memory carries what the last pass reported to the next."""
    body = stored({"kueue.x-k8s.io/queue-name": "team-a"}, managedBy=MULTIKUEUE)
    body["spec"]["scheduler"] = {"priorityClassName": "missing"}
    api = KueueApi(body, [])

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cached(api.job))  # type: ignore[arg-type]
            for _ in range(3):
                await reconciler.reconcile(("team", "demo"))

    asyncio.run(scenario())
    assert [name for name, _, _ in api.calls].count("post_event") == 1


def test_a_worker_pass_adopts_the_prebuilt_workload_it_finds_by_name_in_the_watch_cache() -> None:
    """MultiKueue's clone carries the manager's labels (cloneForCreate), the job-name label among
    them: the worker's informer has it, and the pass reads nothing from the API server."""
    labels = {
        "kueue.x-k8s.io/queue-name": "team-a",
        "kueue.x-k8s.io/prebuilt-workload-name": "wl-from-manager",
    }
    body = stored(labels)
    manager_job = AsyncGRPOJob.model_validate({**body, "metadata": {**body["metadata"], "labels": {}}})
    cluster = plan.manifests.ray_cluster(manager_job, 0, MANAGER_OWNER)
    built = workload.manifest(kueue_job(), MANAGER_OWNER, cluster, None)
    del built["metadata"]["ownerReferences"]  # MultiKueue's clone carries none (cloneForCreate)
    built["metadata"].update(name="wl-from-manager", namespace="team", uid="w", resourceVersion="3")
    api = KueueApi(body, [built])
    calls = run_pass(api)
    assert "create_workload" not in calls  # and no read: KueueApi has none to call
    [adoption] = api.patches
    assert adoption["metadata"]["labels"] == {"kueue.x-k8s.io/job-uid": body["metadata"]["uid"]}
