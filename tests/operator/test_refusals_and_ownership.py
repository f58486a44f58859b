"""The plan when the world says no: a refused RayCluster create, KubeRay missing, a cluster or
spec ConfigMap name taken by someone else, a spec that tightened rules now refuse; and what the
status tells about a finished job (Complete, the head pod, the driver's log).

Like test_job_phase_transitions.py, each test feeds one decision's status into the next pass.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from asyncgrpo_api.v1alpha1 import AsyncGRPOJobStatus, Condition
from asyncgrpo_api.v1alpha1.runtime import CleanupPolicy
from asyncgrpo_operator import plan
from asyncgrpo_operator.observed import (
    ClusterView,
    CreateFailure,
    DriverExit,
    Observation,
    PodView,
    kuberay_head_exit,
)
from tests.operator.builders import (
    OWNER,
    at,
    cluster,
    healthy_pods,
    job,
    observe,
    pod,
    raw_pod,
    spec_configmap,
    terminated,
)
from tests.operator.test_job_phase_transitions import actions_of, running, step

REFUSED = "admission webhook denied the request: RayClusters here may not use hostNetwork"


def refused(seconds: float, count: int = 1, status: int = 422, generation: int = 1) -> CreateFailure:
    return CreateFailure("demo-0", status, REFUSED, at(seconds), count, generation)


def condition(decision: plan.Decision, type_: str) -> Condition:
    found = decision.condition(type_)
    assert found is not None, [c.type for c in decision.status.conditions]
    return found


# --- a refused create ----------------------------------------------------------------------------


def test_a_refused_create_shows_the_api_servers_message_and_waits_before_retrying() -> None:
    first = step(job(), None, observe(0, configmap=False))
    assert actions_of(first, plan.CreateRayCluster)
    # The reconciler plans again in the same pass with the API server's answer.
    shown = step(job(), first.status, observe(0, create_failure=refused(0)))

    scheduled = condition(shown, "PodsScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "ClusterCreateFailed")
    assert REFUSED in scheduled.message and "HTTP 422" in scheduled.message
    assert (shown.status.phase, shown.status.reason) == ("Pending", "ClusterCreateFailed")
    assert REFUSED in (shown.status.message or "")
    assert [(e.type, e.reason) for e in shown.events] == [("Warning", "ClusterCreateFailed")]
    assert actions_of(shown, plan.CreateRayCluster) == []
    assert shown.requeue_after == plan.create_retry_seconds(1) == 5.0

    too_soon = step(job(), shown.status, observe(3, create_failure=refused(0)))
    assert actions_of(too_soon, plan.CreateRayCluster) == []
    retry = step(job(), shown.status, observe(5, create_failure=refused(0)))
    assert len(actions_of(retry, plan.CreateRayCluster)) == 1
    assert condition(retry, "PodsScheduled").reason == "ClusterCreateFailed"  # until it succeeds
    assert not [e for e in retry.events if e.type == "Warning"]  # one Warning, not one per retry


def test_retries_back_off_to_five_minutes() -> None:
    assert [plan.create_retry_seconds(n) for n in (1, 2, 3, 4, 7, 20)] == [5, 10, 20, 40, 300, 300]
    waiting = step(job(), None, observe(100, create_failure=refused(100, count=3)))
    assert actions_of(waiting, plan.CreateRayCluster) == []
    assert waiting.requeue_after == 20.0


def test_a_changed_spec_is_tried_at_once() -> None:
    shown = step(job(), None, observe(0, create_failure=refused(0)))
    fixed = step(job(), shown.status, observe(1, create_failure=refused(0)), generation=2)
    assert len(actions_of(fixed, plan.CreateRayCluster)) == 1


def test_a_forbidden_create_is_reported_with_its_code() -> None:
    quota = (
        'rayclusters.ray.io "demo-0" is forbidden: exceeded quota: rc, requested: count/rayclusters.ray.io=1'
    )
    failure = CreateFailure("demo-0", 403, quota, at(0), 1, 1)
    shown = step(job(), None, observe(0, create_failure=failure))
    scheduled = condition(shown, "PodsScheduled")
    assert scheduled.reason == "ClusterCreateFailed" and "HTTP 403" in scheduled.message
    assert "exceeded quota" in scheduled.message


def test_kuberay_not_installed_is_reported_and_nothing_is_created() -> None:
    missing = step(
        job(), None, observe(0, kuberay_missing="the server could not find the requested resource")
    )
    assert (missing.status.phase, missing.status.reason) == ("Pending", "KubeRayMissing")
    assert "KubeRay" in (missing.status.message or "")
    assert actions_of(missing, plan.CreateRayCluster) == []
    assert [e.reason for e in missing.events if e.type == "Warning"] == ["KubeRayMissing"]
    installed = step(job(), missing.status, observe(30))
    assert len(actions_of(installed, plan.CreateRayCluster)) == 1


def test_a_create_answered_404_is_kuberay_missing() -> None:
    shown = step(job(), None, observe(0, create_failure=refused(0, status=404)))
    assert condition(shown, "PodsScheduled").reason == "KubeRayMissing"


# --- the startup deadline counts from the attempt's first try ------------------------------------


def test_a_job_that_never_gets_its_cluster_hits_its_startup_deadline() -> None:
    the_job = job(startupDeadlineSeconds=60)
    status: AsyncGRPOJobStatus | None = None
    decision = step(the_job, status, observe(0, configmap=False))
    assert decision.status.attempt_start_time == at(0)
    for seconds in (10, 25, 40, 55):  # refused and retried on every pass
        failure = refused(seconds - 5, count=seconds // 10)
        decision = step(the_job, decision.status, observe(seconds, create_failure=failure, the_job=the_job))
        assert decision.status.attempt_start_time == at(0), "the clock must not restart"
        assert decision.requeue_after is not None and decision.requeue_after <= 60 - seconds
    decision = step(the_job, decision.status, observe(60, create_failure=refused(55, 5), the_job=the_job))
    assert (decision.status.phase, decision.status.reason) == ("Failed", "DeadlineExceeded")
    assert "startupDeadlineSeconds (60 s)" in (decision.status.message or "")
    assert "ClusterCreateFailed" in (decision.status.message or "") and REFUSED in (
        decision.status.message or ""
    )


def test_kuberay_missing_also_runs_into_the_startup_deadline() -> None:
    the_job = job(startupDeadlineSeconds=60)
    first = step(the_job, None, observe(0, kuberay_missing="404", the_job=the_job))
    late = step(the_job, first.status, observe(61, kuberay_missing="404", the_job=the_job))
    assert (late.status.phase, late.status.reason) == ("Failed", "DeadlineExceeded")


def test_a_retry_gets_a_fresh_startup_deadline() -> None:
    the_job = job(startupDeadlineSeconds=600)
    before = running(the_job, seconds=30)
    rc = cluster(0, provisioned=True)
    lost = step(the_job, before.status, observe(700, rc, the_job=the_job))  # head pod gone
    assert lost.status.attempt == 1 and lost.status.attempt_start_time == at(700)
    assert lost.status.phase == "Restarting"


# --- ownership ----------------------------------------------------------------------------------


def test_a_cluster_with_the_jobs_name_but_another_owner_is_neither_adopted_nor_deleted() -> None:
    theirs = cluster(0, owner_uid="someone-else", uid="foreign")
    decision = step(job(), None, observe(0, theirs, configmap=False))
    assert decision.status.ray_cluster_name is None
    assert actions_of(decision, plan.CreateRayCluster) == []
    assert actions_of(decision, plan.DeleteRayCluster) == []
    scheduled = condition(decision, "PodsScheduled")
    assert scheduled.reason == "ClusterNameTaken" and "someone-else" in scheduled.message
    unowned = step(job(), None, observe(0, replace(theirs, owner_uid=None), configmap=False))
    assert "owner UID is none" in condition(unowned, "PodsScheduled").message


def test_a_spec_configmap_another_owner_controls_is_neither_overwritten_nor_mounted() -> None:
    theirs = spec_configmap(job(), owner_uid="someone-else")
    decision = step(job(), None, observe(0, configmap=theirs))
    assert actions_of(decision, plan.ApplyConfigMap) == []
    assert actions_of(decision, plan.CreateRayCluster) == []
    scheduled = condition(decision, "PodsScheduled")
    assert scheduled.reason == "ConfigMapNameTaken" and "someone-else" in scheduled.message
    assert decision.status.phase == "Pending" and decision.requeue_after == plan.NAME_TAKEN_RECHECK_SECONDS
    unowned = step(job(), None, observe(0, configmap=replace(theirs, owner_uid=None)))
    assert "owner UID is none" in condition(unowned, "PodsScheduled").message


def test_the_jobs_own_outdated_spec_configmap_is_rewritten_at_the_version_it_was_read() -> None:
    ours = replace(spec_configmap(job()), digest="outdated")
    decision = step(job(), None, observe(0, configmap=ours))
    [apply] = actions_of(decision, plan.ApplyConfigMap)
    assert apply.existing == ours
    assert actions_of(decision, plan.CreateRayCluster) != []


def test_a_namesake_jobs_cluster_being_garbage_collected_is_waited_for() -> None:
    leftover = cluster(0, owner_uid="deleted-job-uid", uid="old", deleting=True)
    decision = step(job(), None, observe(0, leftover, configmap=False))
    assert condition(decision, "PodsScheduled").reason == "WaitingForPreviousCluster"
    assert actions_of(decision, plan.CreateRayCluster) == []


def test_only_owned_clusters_of_other_attempts_are_deleted() -> None:
    before = running()
    foreign_stale = cluster(3, owner_uid="someone-else", uid="foreign")
    ours_stale = cluster(2, uid="ours-stale")
    rc = cluster(0, provisioned=True)
    decision = step(job(), before.status, observe(40, rc, foreign_stale, ours_stale, pods=healthy_pods(rc)))
    assert [a.uid for a in actions_of(decision, plan.DeleteRayCluster)] == ["ours-stale"]  # type: ignore[attr-defined]


def test_suspend_touches_only_owned_clusters() -> None:
    foreign = cluster(0, owner_uid="someone-else", uid="foreign")
    suspended = step(job(suspend=True), running().status, observe(40, cluster(0), foreign))
    assert [a.uid for a in actions_of(suspended, plan.SetRayClusterSpec)] == ["rc-uid-0"]  # type: ignore[attr-defined]
    assert actions_of(suspended, plan.DeleteRayCluster) == []


# --- a spec that tightened rules refuse ------------------------------------------------------


def test_a_started_job_keeps_running_when_its_spec_fails_newer_rules() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    errors = ("spec.cluster.head.resources.requests.cpu: 2 is more than the limit 1",)
    kept = plan.plan(
        job(),
        before.status,
        observe(40, rc, pods=healthy_pods(rc)),
        generation=1,
        owner=OWNER,
        spec_errors=errors,
    )
    assert kept.status.phase == "Running"
    assert actions_of(kept, plan.DeleteRayCluster) == []
    spec = condition(kept, "SpecValid")
    assert (spec.status, spec.reason) == ("False", "AdmittedUnderOlderRules")
    assert errors[0] in spec.message
    assert [e.reason for e in kept.events] == ["AdmittedUnderOlderRules"]
    fixed = step(job(), kept.status, observe(50, rc, pods=healthy_pods(rc)))
    assert fixed.condition("SpecValid") is None


NOT_STARTED = AsyncGRPOJobStatus(phase="Pending")
"""The status of a job the operator never started (no status at all would be rebuilt from the
job's RayCluster as a started one: recovery.py)."""


def test_a_job_the_operator_will_not_run_is_failed_and_cleaned_up_by_its_policy() -> None:
    rc = cluster(0, provisioned=True)
    foreign = cluster(1, owner_uid="someone-else", uid="foreign")
    policy = CleanupPolicy(on_failure="DeleteCluster", ttl_seconds_after_finished=60)
    failed = plan.plan_invalid(
        NOT_STARTED,
        observe(40, rc, foreign),
        generation=2,
        message="spec.x: bad",
        cleanup=policy,
        owner=OWNER,
    )
    assert (failed.status.phase, failed.status.reason) == ("Failed", "InvalidSpec")
    assert [a.uid for a in actions_of(failed, plan.DeleteRayCluster)] == ["rc-uid-0"]  # type: ignore[attr-defined]
    assert failed.requeue_after == 60
    expired = plan.plan_invalid(
        failed.status, observe(101), generation=2, message="spec.x: bad", cleanup=policy, owner=OWNER
    )
    assert len(actions_of(expired, plan.DeleteJob)) == 1


def test_a_job_refused_before_it_started_never_keeps_a_cluster_even_with_keep_cluster() -> None:
    """KeepCluster keeps a failed run's pods for debugging; a job that never ran has no run to
    debug, and must not hold GPUs."""
    rc = cluster(0, provisioned=True)
    failed = plan.plan_invalid(
        NOT_STARTED, observe(40, rc), generation=2, message="bad", cleanup=CleanupPolicy(), owner=OWNER
    )
    assert failed.status.phase == "Failed"
    assert [a.uid for a in actions_of(failed, plan.DeleteRayCluster)] == ["rc-uid-0"]  # type: ignore[attr-defined]
    again = plan.plan_invalid(
        failed.status, observe(45, rc), generation=2, message="bad", cleanup=CleanupPolicy(), owner=OWNER
    )
    assert len(actions_of(again, plan.DeleteRayCluster)) == 1, "until it is gone"


def unparseable(
    status: AsyncGRPOJobStatus, observed: Observation, cleanup: CleanupPolicy | None = None
) -> plan.Decision:
    """A pass over a started job whose spec no longer parses under an upgraded operator."""
    return plan.plan_invalid(
        status,
        observed,
        generation=1,
        message="spec.x: no longer accepted",
        cleanup=cleanup or CleanupPolicy(),
        owner=OWNER,
    )


def test_an_upgrade_that_makes_a_running_jobs_spec_unparseable_keeps_the_run_and_says_why() -> None:
    rc = cluster(0, provisioned=True)
    kept = unparseable(running().status, observe(40, rc, pods=healthy_pods(rc)))
    assert kept.status.phase == "Running"
    assert kept.actions == ()
    spec = condition(kept, "SpecValid")
    assert (spec.status, spec.reason) == ("False", "AdmittedUnderOlderRules")
    assert "spec.x: no longer accepted" in spec.message and "no new attempt" in spec.message
    assert [e.reason for e in kept.events] == ["AdmittedUnderOlderRules"]
    again = unparseable(kept.status, observe(50, rc, pods=healthy_pods(rc)))
    assert again.status == kept.status and again.events == ()


def test_a_kept_run_that_succeeds_completes_the_job() -> None:
    rc = cluster(0, provisioned=True)
    kept = unparseable(running().status, observe(40, rc, pods=healthy_pods(rc)))
    done = unparseable(kept.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0))))
    assert (done.status.phase, done.status.reason) == ("Succeeded", "DriverSucceeded")


def test_a_kept_run_that_fails_is_not_retried_and_is_cleaned_up_by_its_policy() -> None:
    rc = cluster(0, provisioned=True)
    kept = unparseable(running().status, observe(40, rc, pods=healthy_pods(rc)))
    killed = healthy_pods(rc, driver=terminated(137))  # an infrastructure failure: retried if valid
    failed = unparseable(kept.status, observe(60, rc, pods=killed), CleanupPolicy(on_failure="DeleteCluster"))
    assert (failed.status.phase, failed.status.reason) == ("Failed", "InvalidSpec")
    assert "code 137" in (failed.status.message or "") and "no new attempt" in (failed.status.message or "")
    assert failed.status.attempt == 0 and actions_of(failed, plan.CreateRayCluster) == []
    assert [a.uid for a in actions_of(failed, plan.DeleteRayCluster)] == ["rc-uid-0"]  # type: ignore[attr-defined]
    keep = CleanupPolicy(on_failure="KeepCluster")
    kept_cluster = unparseable(kept.status, observe(60, rc, pods=killed), keep)
    assert kept_cluster.status.phase == "Failed" and kept_cluster.actions == ()


def test_a_kept_run_whose_head_pod_is_lost_fails_once_the_loss_is_confirmed() -> None:
    rc = cluster(0, provisioned=True)
    kept = unparseable(running().status, observe(40, rc, pods=healthy_pods(rc)))
    cached = unparseable(kept.status, replace(observe(60, rc), from_cache=True))
    assert cached.confirm is not None and cached.status.phase == "Running"
    confirmed = unparseable(kept.status, observe(61, rc))
    assert (confirmed.status.phase, confirmed.status.reason) == ("Failed", "InvalidSpec")
    assert "head pod" in (confirmed.status.message or "")


def test_a_job_that_had_succeeded_keeps_its_outcome_and_its_policy_when_its_spec_stops_parsing() -> None:
    the_job = job(cleanupPolicy={"onSuccess": "KeepCluster"})
    rc = cluster(0, provisioned=True)
    done = step(
        the_job, running(the_job).status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0)))
    )
    later = plan.plan_invalid(
        done.status,
        observe(90, rc),
        generation=3,
        message="bad",
        cleanup=CleanupPolicy(on_success="KeepCluster"),
        owner=OWNER,
    )
    assert later.status.phase == "Succeeded" and actions_of(later, plan.DeleteRayCluster) == []


# --- what a finished job's status says ----------------------------------------------------------


def test_success_sets_complete_for_kubectl_wait_and_keeps_phase_succeeded() -> None:
    the_job = job(cleanupPolicy={"onSuccess": "KeepCluster"})
    before = running(the_job)
    rc = cluster(0, provisioned=True)
    done = step(
        the_job, before.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0)), the_job=the_job)
    )
    assert done.status.phase == "Succeeded"
    complete = condition(done, "Complete")
    assert (complete.status, complete.reason) == ("True", "DriverSucceeded")
    assert done.condition("Succeeded") is None
    assert done.status.head_pod == "demo-0-head"
    assert done.status.driver_logs == "kubectl logs -n team demo-0-head -c driver"


def test_the_driver_log_is_gone_once_cleanup_deletes_the_cluster() -> None:
    before = running()
    assert before.status.driver_logs == "kubectl logs -n team demo-0-head -c driver"
    rc = cluster(0, provisioned=True)
    done = step(job(), before.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0))))
    assert actions_of(done, plan.DeleteRayCluster)  # onSuccess: DeleteCluster
    assert done.status.head_pod == "demo-0-head" and done.status.driver_logs is None


def test_a_status_written_with_the_old_succeeded_condition_reads_as_complete() -> None:
    rc = cluster(0, provisioned=True)
    done = step(job(), running().status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0))))
    legacy = done.status.model_copy(
        update={
            "conditions": [
                c.model_copy(update={"type": "Succeeded"}) if c.type == "Complete" else c
                for c in done.status.conditions
            ]
        }
    )
    again = step(job(), legacy, observe(90))
    assert again.status.phase == "Succeeded"
    assert condition(again, "Complete").status == "True" and again.condition("Succeeded") is None
    assert again.events == ()


# --- a look-alike head pod ------------------------------------------------------------------------


def forged_head(rc: ClusterView, driver: dict[str, Any]) -> PodView:
    """A pod anyone who may create pods in the namespace can make: KubeRay's head labels for the
    cluster and a controller ownerReference to it (the API server checks neither), but a name of
    its own, which KubeRay's status does not report."""
    raw = raw_pod(rc, head=True, driver=driver)
    raw["metadata"]["name"] = f"{rc.name}-head-forged"
    return PodView.from_dict(raw)


def test_a_forged_head_pod_whose_driver_exits_0_neither_completes_the_job_nor_deletes_its_cluster() -> None:
    rc = cluster(0, provisioned=True)
    forged = forged_head(rc, terminated(0))
    assert (forged.node_type, forged.cluster, forged.owner_uid) == ("head", rc.name, rc.uid)
    before = running()

    # Listed first (the cache's order is the API server's, which the forger may win).
    beside = step(job(), before.status, observe(60, rc, pods=(forged, *healthy_pods(rc))))
    assert (beside.status.phase, beside.status.head_pod) == ("Running", "demo-0-head")
    assert actions_of(beside, plan.DeleteRayCluster) == []

    # Alone (the real head gone), it is no head at all: the attempt's head is lost, not finished.
    alone = step(job(), before.status, observe(60, rc, pods=(forged, *healthy_pods(rc)[1:])))
    assert alone.status.phase != "Succeeded" and alone.status.reason == "HeadPodLost"
    assert alone.status.head_pod != forged.name

    # Its exit is not remembered from the watch either; the real head's is.
    assert kuberay_head_exit(forged, [rc]) is None
    real = pod(rc, head=True, driver=terminated(0))
    assert kuberay_head_exit(real, [rc]) == DriverExit.from_pod(real)
    assert kuberay_head_exit(real, [replace(rc, head_pod="")]) is None  # before KubeRay names it
