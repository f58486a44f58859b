"""The plan for jobs Kueue manages, as Kueue's external-framework contract asks: the job owns its
Workload and is suspended until Kueue admits it; admission unsuspends it and puts the assigned
flavors into the pods; an eviction suspends the job and its RayCluster in place and gives the quota
back once the pods are gone; the clocks count admitted time only; a retry keeps its Workload."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_operator import plan, workload
from asyncgrpo_operator.observed import ClusterView, Observation, WorkloadView
from tests.operator.builders import (
    BASE_JOB,
    OWNER,
    at,
    cluster,
    healthy_pods,
    observe,
    pod,
    terminated,
)

QUEUE = "team-a"
GPU = workload.Flavor(
    "h200",
    {"cloud.example/gpu": "h200"},
    ({"key": "cloud.example/spot", "operator": "Exists", "effect": "NoSchedule"},),
)
CPU = workload.Flavor("cpu", {"cloud.example/pool": "cpu"})
ASSIGNED = {"head": ("cpu",), "policy": ("h200",), "generation": ("h200",)}


def kueue_job(suspend: bool = False, **spec: Any) -> AsyncGRPOJob:
    manifest: dict[str, Any] = {
        **BASE_JOB,
        "metadata": {**BASE_JOB["metadata"], "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {**BASE_JOB["spec"], "suspend": suspend, **spec},
    }
    return AsyncGRPOJob.model_validate(manifest)


def condition(
    type_: str, status: str, reason: str = "", message: str = "", since: float = 0
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason or type_,
        "message": message,
        "lastTransitionTime": at(since).isoformat(),
    }


def wl(
    *conditions: dict[str, Any],
    the_job: AsyncGRPOJob | None = None,
    admitted: bool = False,
    accumulated: int = 0,
    active: bool = True,
) -> WorkloadView:
    """The job's Workload as Kueue leaves it, with these conditions (and, if `admitted`, the
    assignment ASSIGNED; `active` is its spec.active)."""
    the_job = the_job or kueue_job()
    desired = workload.manifest(the_job, OWNER, plan.manifests.ray_cluster(the_job, 0, OWNER), None)
    status: dict[str, Any] = {
        "conditions": list(conditions),
        "accumulatedPastExecutionTimeSeconds": accumulated,
    }
    if admitted:
        status["admission"] = {
            "clusterQueue": "gpu-pool",
            "podSetAssignments": [{"name": n, "flavors": {"cpu": f[0]}} for n, f in ASSIGNED.items()],
        }
    return WorkloadView.from_dict(
        {
            **desired,
            "metadata": {**desired["metadata"], "uid": "wl-uid", "resourceVersion": "5"},
            "spec": {**desired["spec"], "active": active},
            "status": status,
        }
    )


PENDING = condition(
    "QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set policy: insufficient quota"
)


def admitted_at(since: float, accumulated: int = 0) -> WorkloadView:
    return wl(
        condition("QuotaReserved", "True", since=since),
        condition("Admitted", "True", "Admitted", "The workload is admitted", since=since),
        admitted=True,
        accumulated=accumulated,
    )


def step(
    status: AsyncGRPOJobStatus | None, observed: Observation, the_job: AsyncGRPOJob | None = None
) -> plan.Decision:
    return plan.plan(the_job or kueue_job(), status, observed, generation=1, owner=OWNER)


def seen(
    seconds: float, *clusters: ClusterView, the_job: AsyncGRPOJob | None = None, **kwargs: Any
) -> Observation:
    kwargs.setdefault("flavors", {"h200": GPU, "cpu": CPU})
    return observe(seconds, *clusters, the_job=the_job or kueue_job(), **kwargs)


def actions(decision: plan.Decision, kind: type) -> list[Any]:
    return [a for a in decision.actions if isinstance(a, kind)]


def admitted_and_running(since: float = 10) -> tuple[plan.Decision, ClusterView]:
    first = step(None, seen(0, workload=wl(PENDING)), kueue_job())
    start = step(first.status, seen(since, workload=admitted_at(since)), kueue_job(suspend=True))
    live = replace(cluster(0), provisioned=True)
    running = step(start.status, seen(since + 5, live, pods=healthy_pods(live), workload=admitted_at(since)))
    assert running.status.phase == "Running", running.status.message
    return running, live


def test_a_new_job_creates_its_workload_suspends_itself_and_runs_no_pod() -> None:
    decision = step(None, seen(0))
    (create,) = actions(decision, plan.CreateWorkload)
    spec = create.manifest["spec"]
    assert spec["queueName"] == QUEUE
    assert [(s["name"], s["count"]) for s in spec["podSets"]] == [
        ("head", 1),
        ("policy", 1),
        ("generation", 1),
    ]
    assert (
        spec["podSets"][1]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
        == "8"
    )
    assert create.manifest["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert [a.suspend for a in actions(decision, plan.SetJobSuspend)] == [True]
    assert not actions(decision, plan.CreateRayCluster)
    assert decision.status.phase == "Queued"


def test_a_pending_workload_shows_kueues_reason_and_no_deadline_runs() -> None:
    first = step(None, seen(0))
    later = step(
        first.status, seen(5000, workload=wl(PENDING)), kueue_job(suspend=True)
    )  # past the 600 s deadline
    assert (later.status.phase, later.status.reason) == ("Queued", "Pending")
    assert later.status.workload_name == workload.workload_name("demo", OWNER.uid)
    assert "insufficient quota" in (later.status.message or "")
    assert later.status.attempt_start_time is None
    assert not actions(later, plan.CreateRayCluster) and not actions(later, plan.SetJobSuspend)


def test_admission_unsuspends_the_job_and_creates_the_cluster_on_the_assigned_flavors() -> None:
    first = step(None, seen(0, workload=wl(PENDING)))
    start = step(first.status, seen(30, workload=admitted_at(30)), kueue_job(suspend=True))
    assert [a.suspend for a in actions(start, plan.SetJobSuspend)] == [False]
    (create,) = actions(start, plan.CreateRayCluster)
    spec = create.manifest["spec"]
    head = spec["headGroupSpec"]["template"]
    assert head["spec"]["nodeSelector"] == {"cloud.example/pool": "cpu"}
    assert head["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "head"
    policy = spec["workerGroupSpecs"][0]["template"]["spec"]
    assert policy["nodeSelector"] == {"asyncgrpo.dev/pool": "gpu", "cloud.example/gpu": "h200"}
    assert {"key": "cloud.example/spot", "operator": "Exists", "effect": "NoSchedule"} in policy[
        "tolerations"
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in policy["tolerations"]
    assert "suspend" not in spec
    queued = start.condition(plan.QUEUED)
    assert queued is not None and (queued.status, queued.reason) == ("False", "Admitted")
    assert start.status.attempt_start_time == at(30)  # the startup deadline runs from admission


def test_a_flavor_that_contradicts_the_pods_node_selector_fails_the_job_naming_both() -> None:
    clash = workload.Flavor("h200", {"asyncgrpo.dev/pool": "other"})
    first = step(None, seen(0, workload=wl(PENDING)))
    start = step(first.status, seen(30, workload=admitted_at(30), flavors={"h200": clash, "cpu": CPU}))
    assert (start.status.phase, start.status.reason) == ("Failed", "FlavorConflict")
    assert "asyncgrpo.dev/pool=other" in (start.status.message or "") and "asyncgrpo.dev/pool=gpu" in (
        start.status.message or ""
    )


def test_an_eviction_suspends_in_place_and_gives_the_quota_back_once_the_pods_are_gone() -> None:
    running, live = admitted_and_running(since=10)
    evicted = wl(
        condition("QuotaReserved", "True", since=10),
        condition("Admitted", "True", since=10),
        condition("PodsReady", "True", "Started", since=15),
        condition(
            "Evicted", "True", "Preempted", "Preempted to accommodate a higher priority workload", since=100
        ),
        admitted=True,
    )
    stopping = step(running.status, seen(100, live, pods=healthy_pods(live), workload=evicted))
    assert (stopping.status.phase, stopping.status.reason) == ("Queued", "Preempted")
    assert [a.suspend for a in actions(stopping, plan.SetJobSuspend)] == [True]
    assert [(a.name, a.suspend, a.spec) for a in actions(stopping, plan.SetRayClusterSpec)] == [
        (live.name, True, None)
    ]
    assert not actions(stopping, plan.PatchWorkloadStatus)  # the pods still run: the quota stays taken
    assert not actions(stopping, plan.DeleteRayCluster)
    assert stopping.status.restarts == 0 and stopping.status.attempt == 0
    assert stopping.status.ray_cluster_name == live.name
    running_cond = stopping.condition(plan.RUNNING)
    assert running_cond is not None and "resumes from the latest checkpoint" in running_cond.message

    held = replace(live, suspended=True, suspend_complete=True, provisioned=False)
    gone = step(stopping.status, seen(110, held, workload=evicted), kueue_job(suspend=True))
    # the next passes keep saying why it stopped and that it resumes (no flip to "starts once admitted")
    assert gone.condition(plan.RUNNING) == running_cond
    (release,) = actions(gone, plan.PatchWorkloadStatus)
    status = release.status
    assert status["admission"] is None
    by_type = {c["type"]: c for c in status["conditions"]}
    assert (by_type["QuotaReserved"]["status"], by_type["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert by_type["Admitted"]["status"] == "False"
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == ("True", "Preempted")
    assert (by_type["PodsReady"]["status"], by_type["PodsReady"]["reason"]) == ("False", "WaitForStart")
    assert status["accumulatedPastExecutionTimeSeconds"] == 100  # admitted from 10 s to 110 s
    assert release.resource_version == "5"


def test_readmission_resumes_the_same_cluster_from_its_checkpoint_without_a_retry() -> None:
    running, live = admitted_and_running(since=10)
    held = replace(live, suspended=True, suspend_complete=True, provisioned=False)
    requeued = wl(
        condition("QuotaReserved", "False", "Pending", "waiting", since=110),
        condition("Evicted", "True", "Preempted", "Preempted", since=100),
        condition("Requeued", "True", "Preempted", "Preempted", since=110),
        accumulated=100,
    )
    queued = step(running.status, seen(120, held, workload=requeued), kueue_job(suspend=True))
    assert (queued.status.phase, queued.status.reason) == ("Queued", "Requeued")
    running_cond = queued.condition(plan.RUNNING)
    assert running_cond is not None and "resumes from the latest checkpoint" in running_cond.message
    back = step(
        queued.status, seen(300, held, workload=admitted_at(300, accumulated=100)), kueue_job(suspend=True)
    )
    (resume,) = actions(back, plan.SetRayClusterSpec)
    assert (resume.name, resume.suspend) == (live.name, False)
    assert (
        resume.spec["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]["cloud.example/gpu"] == "h200"
    )
    assert not actions(back, plan.CreateRayCluster) and not actions(back, plan.CreateWorkload)
    assert back.status.restarts == 0 and back.status.attempt == 0
    # The head pod KubeRay deleted when the job was preempted shows the stopped driver's SIGTERM.
    stopped = pod(
        live,
        head=True,
        driver={"terminated": {**terminated(143)["terminated"], "finishedAt": at(105).isoformat()}},
        deleting=True,
    )
    starting = replace(live, provisioned=False)
    after = step(
        back.status, seen(305, starting, pods=(stopped,), workload=admitted_at(300, accumulated=100))
    )
    assert after.status.phase not in ("Restarting", "Failed"), after.status.message
    assert after.status.restarts == 0


def test_active_deadline_counts_only_the_time_admitted() -> None:
    the_job = kueue_job(activeDeadlineSeconds=100)
    first = step(None, seen(0, workload=wl(PENDING)), the_job)
    queued = step(
        first.status, seen(5000, workload=wl(PENDING)), kueue_job(suspend=True, activeDeadlineSeconds=100)
    )
    assert queued.status.phase == "Queued"  # 5000 s queued count for nothing
    live = replace(cluster(0), provisioned=True)
    # Admitted 60 s in earlier admissions, and again since 6000 s: 40 s left then.
    ok = step(
        queued.status,
        seen(6030, live, pods=healthy_pods(live), workload=admitted_at(6000, accumulated=60)),
        the_job,
    )
    assert ok.status.phase == "Running", ok.status.message
    assert ok.requeue_after is not None and ok.requeue_after <= 10
    late = step(
        ok.status,
        seen(6041, live, pods=healthy_pods(live), workload=admitted_at(6000, accumulated=60)),
        the_job,
    )
    assert (late.status.phase, late.status.reason) == ("Failed", "DeadlineExceeded")
    assert "time queued does not count" in (late.status.message or "")


def test_a_retry_keeps_the_workload_and_its_place_in_the_queue() -> None:
    running, live = admitted_and_running(since=10)
    lost = pod(live, head=True, phase="Failed", driver=terminated(137))
    retry = step(running.status, seen(60, live, pods=(lost,), workload=admitted_at(10)))
    assert retry.status.phase == "Restarting" and retry.status.attempt == 1
    (create,) = actions(retry, plan.CreateRayCluster)
    assert create.manifest["metadata"]["name"] == "demo-1"
    assert not actions(retry, plan.CreateWorkload) and not actions(retry, plan.DeleteWorkload)
    assert not actions(retry, plan.UpdateWorkload) and not actions(retry, plan.SetJobSuspend)


def test_pods_ready_is_reported_to_kueue_for_wait_for_pods_ready() -> None:
    running, _ = admitted_and_running(since=10)
    (report,) = [a for a in running.actions if isinstance(a, plan.PatchWorkloadStatus)]
    ready = {c["type"]: c for c in report.status["conditions"]}["PodsReady"]
    assert (ready["status"], ready["reason"]) == ("True", "Started")


@pytest.mark.parametrize(
    ("exit_code", "phase", "cleanup"),
    [(0, "Succeeded", plan.DeleteRayCluster), (1, "Failed", plan.ScaleRayClusterWorkers)],
)
def test_a_finished_job_gives_its_workers_back_before_kueue_gives_its_quota_back(
    exit_code: int, phase: str, cleanup: type
) -> None:
    """Issue 47: a finished job's Workload was marked Finished (Kueue frees its quota) while the
    cluster that cleanupPolicy keeps after a failure still ran its GPU workers. Now the kept
    cluster's workers are scaled to zero (its head and driver log stay), a deleted cluster is
    waited for, and only then is the Workload Finished."""
    running, live = admitted_and_running(since=10)
    live = replace(live, worker_groups=2, worker_replicas=2)
    done = step(
        running.status,
        seen(60, live, pods=healthy_pods(live, driver=terminated(exit_code)), workload=admitted_at(10)),
    )
    assert done.status.phase == phase
    (act,) = actions(done, cleanup)
    assert act.name == live.name and (cleanup is plan.DeleteRayCluster or act.groups == 2)
    assert len(actions(done, plan.DeleteRayCluster) + actions(done, plan.ScaleRayClusterWorkers)) == 1
    assert not actions(done, plan.PatchWorkloadStatus)  # the workers still run: the quota stays taken
    head_only = (pod(live, head=True, driver=terminated(exit_code)),)
    left = (replace(live, worker_replicas=0),) if cleanup is plan.ScaleRayClusterWorkers else ()
    after = step(done.status, seen(70, *left, pods=head_only if left else (), workload=admitted_at(10)))
    (finish,) = actions(after, plan.PatchWorkloadStatus)
    finished = {c["type"]: c for c in finish.status["conditions"]}["Finished"]
    assert (finished["status"], finished["reason"]) == ("True", phase)
    assert not actions(after, plan.ScaleRayClusterWorkers) and not actions(after, plan.DeleteRayCluster)


def test_a_spec_changed_while_queued_updates_the_same_workload() -> None:
    first = step(None, seen(0, workload=wl(PENDING)))
    bigger = kueue_job(
        suspend=True,
        cluster={
            **BASE_JOB["spec"]["cluster"],
            "policyWorkers": {**BASE_JOB["spec"]["cluster"]["policyWorkers"], "replicas": 2},
        },
    )
    changed = step(first.status, seen(20, workload=wl(PENDING), the_job=bigger), bigger)
    (update,) = actions(changed, plan.UpdateWorkload)
    assert [s["count"] for s in update.patch["spec"]["podSets"]] == [1, 2, 1]
    assert update.resource_version == "5"
    assert not actions(changed, plan.CreateWorkload) and not actions(changed, plan.DeleteWorkload)


def released_conditions(decision: plan.Decision) -> dict[str, tuple[str, str]]:
    """(status, reason) by type of the Workload conditions the decision's one status write sets."""
    (write,) = actions(decision, plan.PatchWorkloadStatus)
    return {c["type"]: (c["status"], c["reason"]) for c in write.status["conditions"]}


def test_a_deactivated_workload_stops_the_job_in_place_until_it_is_active_again() -> None:
    """A user stops a job Kueue manages with its Workload's spec.active false (Kueue evicts it with
    reason Deactivated); the job is suspended in place, gives its quota back without asking to be
    requeued (Requeued False, as Kueue's jobframework), and stays Queued/Deactivated; active again,
    Kueue requeues it (Requeued True, Reactivated) and the readmitted job resumes the same cluster."""
    running, live = admitted_and_running(since=10)
    evicted = wl(
        condition("QuotaReserved", "True", since=10),
        condition("Admitted", "True", since=10),
        condition("Evicted", "True", "Deactivated", "The workload is deactivated", since=100),
        admitted=True,
        active=False,
    )
    stopping = step(running.status, seen(100, live, pods=healthy_pods(live), workload=evicted))
    assert (stopping.status.phase, stopping.status.reason) == ("Queued", "Deactivated")
    assert "The workload is deactivated" in (stopping.status.message or "")
    assert [a.suspend for a in actions(stopping, plan.SetJobSuspend)] == [True]
    assert [(a.name, a.suspend) for a in actions(stopping, plan.SetRayClusterSpec)] == [(live.name, True)]
    assert not actions(stopping, plan.PatchWorkloadStatus)  # the pods still run: the quota stays taken
    running_cond = stopping.condition(plan.RUNNING)
    assert running_cond is not None and (running_cond.status, running_cond.reason) == ("False", "Deactivated")

    held = replace(live, suspended=True, suspend_complete=True, provisioned=False)
    gone = step(stopping.status, seen(110, held, workload=evicted), kueue_job(suspend=True))
    conditions = released_conditions(gone)
    assert conditions["QuotaReserved"] == ("False", "Pending")
    assert conditions["Admitted"][0] == "False"
    assert conditions["Requeued"] == ("False", "Deactivated")

    released = wl(
        condition("QuotaReserved", "False", "Pending", "The workload is deactivated", since=110),
        condition("Admitted", "False", "NoReservation", since=110),
        condition("Evicted", "True", "Deactivated", "The workload is deactivated", since=100),
        condition("Requeued", "False", "Deactivated", "The workload is deactivated", since=110),
        accumulated=100,
        active=False,
    )
    still = step(gone.status, seen(5000, held, workload=released), kueue_job(suspend=True))
    assert (still.status.phase, still.status.reason) == ("Queued", "Deactivated")
    assert still.condition(plan.RUNNING) == running_cond
    assert still.status.restarts == 0 and still.status.ray_cluster_name == live.name
    assert not [a for a in still.actions if not isinstance(a, plan.Event)]  # nothing to do but wait

    reactivated = wl(
        condition("QuotaReserved", "False", "Pending", "The workload is deactivated", since=110),
        condition("Evicted", "True", "Deactivated", "The workload is deactivated", since=100),
        condition("Requeued", "True", "Reactivated", "The workload was reactivated", since=5010),
        accumulated=100,
    )
    queued = step(still.status, seen(5010, held, workload=reactivated), kueue_job(suspend=True))
    assert (queued.status.phase, queued.status.reason) == ("Queued", "Requeued")
    back = step(
        queued.status, seen(5020, held, workload=admitted_at(5020, accumulated=100)), kueue_job(suspend=True)
    )
    (resume,) = actions(back, plan.SetRayClusterSpec)
    assert (resume.name, resume.suspend) == (live.name, False)
    assert back.status.restarts == 0 and back.status.attempt == 0


def test_a_workload_deactivated_while_it_waits_holds_the_job_queued_deactivated() -> None:
    first = step(None, seen(0, workload=wl(PENDING)))
    inactive = step(first.status, seen(10, workload=wl(PENDING, active=False)), kueue_job(suspend=True))
    assert (inactive.status.phase, inactive.status.reason) == ("Queued", "Deactivated")
    assert "spec.active" in (inactive.status.message or "")
    assert not actions(inactive, plan.CreateRayCluster) and not actions(inactive, plan.PatchWorkloadStatus)


def test_a_pods_ready_timeout_suspends_in_place_and_leaves_the_requeue_to_kueues_backoff() -> None:
    """Kueue's waitForPodsReady evicts a job whose pods are not ready in time: suspended in place,
    never Failed, no retry spent; its quota is given back with Requeued False (Kueue sets it True
    once its backoff ran out, BackoffFinished), and the job shows Requeued from then on."""
    first = step(None, seen(0, workload=wl(PENDING)))
    start = step(first.status, seen(10, workload=admitted_at(10)), kueue_job(suspend=True))
    assert actions(start, plan.CreateRayCluster)
    waiting = cluster(0)
    pending = step(start.status, seen(20, waiting, workload=admitted_at(10)))
    assert pending.status.phase not in ("Failed", "Restarting"), pending.status.message
    evicted = wl(
        condition("QuotaReserved", "True", since=10),
        condition("Admitted", "True", since=10),
        condition("PodsReady", "False", "WaitForStart", since=10),
        condition("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ns/wl", since=50),
        admitted=True,
    )
    stopping = step(pending.status, seen(50, waiting, workload=evicted))
    assert (stopping.status.phase, stopping.status.reason) == ("Queued", "PodsReadyTimeout")
    queued_cond = stopping.condition(plan.QUEUED)
    assert queued_cond is not None and (queued_cond.status, queued_cond.reason) == (
        "True",
        "PodsReadyTimeout",
    )
    assert [a.suspend for a in actions(stopping, plan.SetJobSuspend)] == [True]
    assert [(a.name, a.suspend) for a in actions(stopping, plan.SetRayClusterSpec)] == [(waiting.name, True)]

    held = replace(waiting, suspended=True, suspend_complete=True)
    gone = step(stopping.status, seen(55, held, workload=evicted), kueue_job(suspend=True))
    conditions = released_conditions(gone)
    assert conditions["QuotaReserved"] == ("False", "Pending")
    assert conditions["Requeued"] == ("False", "PodsReadyTimeout")  # Kueue's backoff decides when
    assert conditions["PodsReady"] == ("False", "WaitForStart")

    backed_off = wl(
        condition("QuotaReserved", "False", "Pending", since=55),
        condition("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ns/wl", since=50),
        condition("Requeued", "True", "BackoffFinished", "The workload backoff was finished", since=57),
        accumulated=45,
    )
    requeued = step(gone.status, seen(57, held, workload=backed_off), kueue_job(suspend=True))
    assert (requeued.status.phase, requeued.status.reason) == ("Queued", "Requeued")
    assert requeued.status.restarts == 0 and requeued.status.attempt == 0


def resized(suspend: bool, generation_replicas: int = 4) -> AsyncGRPOJob:
    """The job with generationWorkers.replicas changed (Kueue admitted one replica)."""
    pools = BASE_JOB["spec"]["cluster"]
    return kueue_job(
        suspend=suspend,
        cluster={
            **pools,
            "generationWorkers": {**pools["generationWorkers"], "replicas": generation_replicas},
        },
    )


def test_a_job_resized_right_after_admission_stays_suspended_and_gets_a_new_workload() -> None:
    """Kueue admitted one generation replica; before the operator unsuspended the job (the webhook
    lets spec.cluster change while it is suspended) its replicas became 4. The admitted Workload no
    longer counts what the job would run: the job stays suspended, creates no cluster, and, no pod
    of it running, its Workload is deleted; the next pass asks Kueue for the new shape."""
    first = step(None, seen(0, workload=wl(PENDING)))
    bigger = resized(suspend=True)
    held = step(first.status, seen(10, workload=admitted_at(10), the_job=bigger), bigger)
    assert (held.status.phase, held.status.reason) == ("Queued", "NoMatchingWorkload")
    assert "generation" in (held.status.message or "")
    assert not actions(held, plan.CreateRayCluster)
    assert not [a for a in actions(held, plan.SetJobSuspend) if not a.suspend]
    (delete,) = actions(held, plan.DeleteWorkload)
    assert (delete.name, delete.uid) == (admitted_at(10).name, "wl-uid")

    anew = step(held.status, seen(12, workload=None, the_job=bigger), bigger)
    (create,) = actions(anew, plan.CreateWorkload)
    assert [s["count"] for s in create.manifest["spec"]["podSets"]] == [1, 1, 4]
    assert anew.status.phase == "Queued"


def test_a_running_job_that_outgrows_its_admitted_workload_stops_before_the_workload_goes() -> None:
    """A running job's pools grew (the webhook bypassed or raced): it is stopped in place like an
    eviction, and its Workload, whose quota Kueue still counts for the running pods, is deleted only
    once they are gone (Kueue's NoMatchingWorkload), never while they still hold the GPUs."""
    running, live = admitted_and_running(since=10)
    bigger = resized(suspend=False)
    stopping = step(running.status, seen(60, live, pods=healthy_pods(live), workload=admitted_at(10)), bigger)
    assert (stopping.status.phase, stopping.status.reason) == ("Queued", "NoMatchingWorkload")
    assert [a.suspend for a in actions(stopping, plan.SetJobSuspend)] == [True]
    assert [(a.name, a.suspend) for a in actions(stopping, plan.SetRayClusterSpec)] == [(live.name, True)]
    assert not actions(stopping, plan.DeleteWorkload)  # the pods still run on the admitted quota

    stopped = replace(live, suspended=True, suspend_complete=True, provisioned=False)
    gone = step(stopping.status, seen(70, stopped, workload=admitted_at(10)), resized(suspend=True))
    assert [a.name for a in actions(gone, plan.DeleteWorkload)] == [admitted_at(10).name]
    assert not actions(gone, plan.SetRayClusterSpec) and gone.status.restarts == 0


def test_an_admitted_workload_in_the_api_servers_canonical_quantities_still_matches() -> None:
    """The API server stores the Workload's quantities in canonical form ("2048Mi" reads back as
    "2Gi", "1000m" as "1"): the comparison is by value, so an unchanged job is never taken for a
    resized one."""
    head = {"resources": {"requests": {"cpu": "1000m", "memory": "2048Mi"}}}
    the_job = kueue_job(cluster={**BASE_JOB["spec"]["cluster"], "head": head})
    raw = workload.manifest(the_job, OWNER, plan.manifests.ray_cluster(the_job, 0, OWNER), None)
    requests = raw["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "1000m", "memory": "2048Mi"}
    requests.update(cpu="1", memory="2Gi")
    stored = WorkloadView.from_dict(
        {
            **raw,
            "metadata": {**raw["metadata"], "uid": "wl-uid"},
            "status": {"conditions": list(admitted_at(10).conditions)},
        }
    )
    first = step(None, seen(0, workload=wl(PENDING, the_job=the_job), the_job=the_job), the_job)
    suspended = kueue_job(suspend=True, cluster={**BASE_JOB["spec"]["cluster"], "head": head})
    start = step(first.status, seen(10, workload=stored, the_job=suspended), suspended)
    assert actions(start, plan.CreateRayCluster) and not actions(start, plan.DeleteWorkload)


def test_an_eviction_suspends_the_cluster_before_the_job() -> None:
    """The RayCluster's suspend is what frees the preemptor's GPUs; the job's own write can fail
    (a job too big for the webhook, a conflict) and must not keep the cluster running."""
    running, live = admitted_and_running(since=10)
    evicted = wl(
        condition("QuotaReserved", "True", since=10),
        condition("Admitted", "True", since=10),
        condition("Evicted", "True", "Preempted", "Preempted", since=100),
        admitted=True,
    )
    stopping = step(running.status, seen(100, live, pods=healthy_pods(live), workload=evicted))
    writes = [type(a) for a in stopping.actions if isinstance(a, plan.SetRayClusterSpec | plan.SetJobSuspend)]
    assert writes == [plan.SetRayClusterSpec, plan.SetJobSuspend]
