"""The plan for jobs Kueue manages: Queued with Kueue's reason, the startup deadline from admission,
and a preemption that is not a failure (no backoffLimit spent, the same RayCluster resumes)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_operator import plan
from asyncgrpo_operator.observed import ClusterView, DriverExit, Observation, WorkloadView
from tests.operator.builders import BASE_JOB, OWNER, at, cluster, healthy_pods, observe, pod, terminated

QUEUE = "team-a"


def kueue_job() -> AsyncGRPOJob:
    manifest: dict[str, Any] = {
        **BASE_JOB,
        "metadata": {**BASE_JOB["metadata"], "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
    }
    return AsyncGRPOJob.model_validate(manifest)


def workload(
    rc: ClusterView, *conditions: tuple[str, str, str, str], admitted: float | None = None
) -> WorkloadView:
    """A Workload of `rc` with (type, status, reason, message) conditions."""
    conds = [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    for cond in conds:
        if cond["type"] == "Admitted" and admitted is not None:
            cond["lastTransitionTime"] = at(admitted).isoformat()
    raw = {
        "metadata": {"name": f"raycluster-{rc.name}-abcde", "labels": {"kueue.x-k8s.io/job-uid": rc.uid}},
        "status": {"conditions": conds},
    }
    return WorkloadView.from_dict(raw)


PENDING = (
    "QuotaReserved",
    "False",
    "Pending",
    "couldn't assign flavors to pod set head: insufficient quota for nvidia.com/gpu",
)
ADMITTED = ("Admitted", "True", "Admitted", "The workload is admitted")
PREEMPTED = ("Evicted", "True", "Preempted", "Preempted to accommodate a workload due to prioritization")


def step(status: AsyncGRPOJobStatus | None, observed: Observation) -> plan.Decision:
    return plan.plan(kueue_job(), status, observed, generation=1, owner=OWNER)


def seen(seconds: float, rc: ClusterView, **kwargs: Any) -> Observation:
    return observe(seconds, rc, the_job=kueue_job(), **kwargs)


def queued_then_admitted(admitted: float) -> tuple[plan.Decision, ClusterView]:
    first = step(None, observe(0, configmap=False, the_job=kueue_job()))
    rc = replace(cluster(0), suspended=True)
    waiting = step(first.status, seen(1, rc, workload=workload(rc, PENDING)))
    live = replace(rc, suspended=False, provisioned=True)
    running = step(
        waiting.status,
        seen(admitted, live, pods=healthy_pods(live), workload=workload(live, ADMITTED, admitted=admitted)),
    )
    return running, live


def test_a_queued_job_waits_as_queued_with_kueues_reason_and_no_deadline() -> None:
    first = step(None, observe(0, configmap=False, the_job=kueue_job()))
    (create,) = [a for a in first.actions if isinstance(a, plan.CreateRayCluster)]
    assert create.manifest["spec"]["suspend"] is True
    rc = replace(cluster(0), suspended=True)
    later = step(first.status, seen(5000, rc, workload=workload(rc, PENDING)))  # long past the 600 s deadline
    assert later.status.phase == "Queued"
    assert later.status.reason == "Pending"
    assert "insufficient quota for nvidia.com/gpu" in (later.status.message or "")
    assert later.status.attempt_start_time is None
    assert later.requeue_after is not None  # Kueue's reason is looked at again


def test_without_a_workload_the_job_says_what_kueue_needs() -> None:
    first = step(None, observe(0, configmap=False, the_job=kueue_job()))
    rc = replace(cluster(0), suspended=True)
    later = step(first.status, seen(3, rc))
    assert later.status.phase == "Queued" and later.status.reason == "WaitingForKueue"
    assert f"LocalQueue {QUEUE}" in (later.status.message or "")


def test_the_startup_deadline_runs_from_admission() -> None:
    running, _ = queued_then_admitted(admitted=4000)
    assert running.status.phase == "Running"
    assert running.status.attempt_start_time == at(4000)
    # Admitted at 4000 s, pods never ready: the 600 s deadline counts from admission, not creation.
    first = step(None, observe(0, configmap=False, the_job=kueue_job()))
    rc = replace(cluster(0), suspended=True)
    waiting = step(first.status, seen(1, rc, workload=workload(rc, PENDING)))
    stuck = replace(rc, suspended=False)
    not_ready = (pod(stuck, head=True, ready=False, driver={"waiting": {"reason": "ContainerCreating"}}),)
    admitted = step(waiting.status, seen(4000, stuck, pods=not_ready, workload=workload(stuck, ADMITTED)))
    still = step(admitted.status, seen(4599, stuck, pods=not_ready))
    assert still.status.phase != "Failed"
    late = step(still.status, seen(4601, stuck, pods=not_ready))
    assert late.status.phase == "Failed" and late.status.reason == "DeadlineExceeded"


def test_a_preemption_is_queued_preempted_spends_no_retry_and_resumes_the_same_cluster() -> None:
    running, live = queued_then_admitted(admitted=10)
    assert running.status.phase == "Running"
    preempted_rc = replace(live, suspended=True)
    # Kueue suspended the cluster; KubeRay is deleting its pods, the driver was killed (SIGTERM).
    dying = (pod(live, head=True, deleting=True, driver=terminated(143)),)
    killed = DriverExit(cluster_uid=live.uid, pod_name=dying[0].name, exit_code=143, finished_at=at(100))
    preempted = step(
        running.status,
        seen(101, preempted_rc, pods=dying, remembered_exit=killed, workload=workload(live, PREEMPTED)),
    )
    assert preempted.status.phase == "Queued"
    assert preempted.status.reason == "Preempted"
    assert preempted.status.restarts == 0 and preempted.status.attempt == 0
    assert not [a for a in preempted.actions if isinstance(a, plan.DeleteRayCluster | plan.CreateRayCluster)]
    running_cond = next(c for c in preempted.status.conditions if c.type == "Running")
    assert running_cond.status == "False" and "resumes from the latest checkpoint" in running_cond.message
    # Admitted again; the old head is still terminating and its driver's exit is remembered.
    readmitted_rc = replace(live, suspended=False, provisioned=False)
    back = step(
        preempted.status,
        seen(
            200,
            readmitted_rc,
            pods=dying,
            remembered_exit=killed,
            workload=workload(live, ADMITTED, admitted=200),
        ),
    )
    assert back.status.phase not in ("Failed", "Restarting"), back.status.message
    assert back.status.restarts == 0 and back.status.attempt == 0
    assert back.status.attempt_start_time == at(200)
    # KubeRay recreated the pods in the same RayCluster: the driver runs again, from its checkpoint.
    resumed = replace(readmitted_rc, provisioned=True)
    again = step(
        back.status,
        seen(
            230,
            resumed,
            pods=healthy_pods(resumed),
            remembered_exit=killed,
            workload=workload(live, ADMITTED, admitted=200),
        ),
    )
    assert again.status.phase == "Running"
    assert again.status.restarts == 0 and again.status.ray_cluster_name == live.name


def test_an_exit_of_the_resumed_driver_still_decides_the_attempt() -> None:
    running, live = queued_then_admitted(admitted=10)
    done = DriverExit(cluster_uid=live.uid, pod_name=f"{live.name}-head", exit_code=0, finished_at=at(50))
    finished = step(
        running.status, seen(51, live, pods=healthy_pods(live, driver=terminated(0)), remembered_exit=done)
    )
    assert finished.status.phase == "Succeeded"
