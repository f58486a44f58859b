"""The plan, one transition at a time: given a job, its status and what was observed, what next.

Each test feeds the decision's status back as the next pass's status, the way the reconciler
does, so sequences of tests read like a job's life.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import pytest

from asyncgrpo_api import exitcodes
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_api.v1alpha1.runtime import CleanupPolicy
from asyncgrpo_operator import manifests, plan
from asyncgrpo_operator.observed import DriverExit, Observation, ProgressMark
from tests.operator.builders import (
    BASE_JOB,
    OWNER,
    at,
    cluster,
    healthy_pods,
    job,
    observe,
    pod,
    terminated,
)


def step(
    the_job: AsyncGRPOJob, status: AsyncGRPOJobStatus | None, observed: Observation, generation: int = 1
) -> plan.Decision:
    return plan.plan(the_job, status, observed, generation=generation, owner=OWNER)


def actions_of(decision: plan.Decision, kind: type) -> list[object]:
    return [a for a in decision.actions if isinstance(a, kind)]


def running(the_job: AsyncGRPOJob | None = None, seconds: float = 30.0) -> plan.Decision:
    """A job whose attempt 0 is running (created at 0 s, running at `seconds`)."""
    the_job = the_job or job()
    first = step(the_job, None, observe(0, configmap=False))
    rc = cluster(0, provisioned=True)
    return step(the_job, first.status, observe(seconds, rc, pods=healthy_pods(rc)))


def reasons(events: Sequence[plan.Event]) -> list[str]:
    return [e.reason for e in events]


# --- creation ----------------------------------------------------------------------------------


def test_new_job_creates_configmap_and_first_raycluster_owned_by_the_job() -> None:
    decision = step(job(), None, observe(0, configmap=False))

    configmaps = actions_of(decision, plan.ApplyConfigMap)
    clusters = actions_of(decision, plan.CreateRayCluster)
    assert len(configmaps) == 1 and len(clusters) == 1
    manifest = clusters[0].manifest  # type: ignore[attr-defined]
    assert manifest["metadata"]["name"] == "demo-0"
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert decision.status.phase == "Pending"
    assert decision.status.reason == "ClusterCreating"
    assert decision.status.ray_cluster_name is None  # recorded once seen
    assert decision.status.start_time == at(0)
    assert "CreatedRayCluster" in reasons(decision.events)


def test_second_pass_with_the_cluster_present_creates_nothing() -> None:
    first = step(job(), None, observe(0, configmap=False))
    rc = cluster(0)
    second = step(job(), first.status, observe(1, rc))
    assert second.actions == ()


def test_a_created_cluster_is_recorded_when_first_seen() -> None:
    first = step(job(), None, observe(0, configmap=False))
    second = step(job(), first.status, observe(1, cluster(0)))
    assert second.status.ray_cluster_name == "demo-0"
    assert second.status.dashboard_url == "http://demo-0-head-svc.team.svc:8265"
    assert second.status.attempt_start_time == at(0)


def test_cluster_created_by_a_pass_that_died_before_recording_it_is_adopted_not_recreated() -> None:
    rc = cluster(0, created=0)
    decision = step(job(), None, observe(5, rc, configmap=False))
    assert actions_of(decision, plan.CreateRayCluster) == []
    assert decision.status.ray_cluster_name == "demo-0"
    assert decision.status.attempt_start_time == at(0)


def test_a_pass_that_died_after_recording_a_create_creates_the_cluster_again() -> None:
    first = step(job(), None, observe(0, configmap=False))  # status written, then the operator died
    again = step(job(), first.status, observe(5))
    assert [a.manifest["metadata"]["name"] for a in actions_of(again, plan.CreateRayCluster)] == ["demo-0"]  # type: ignore[attr-defined]
    assert again.status.restarts == 0


def test_clusters_of_other_attempts_are_deleted() -> None:
    first = step(job(), None, observe(0))
    stale = cluster(3, uid="old")
    decision = step(job(), first.status, observe(1, cluster(0), stale))
    deletes = actions_of(decision, plan.DeleteRayCluster)
    assert [d.name for d in deletes] == ["demo-3"]  # type: ignore[attr-defined]


def test_changed_spec_rewrites_the_configmap() -> None:
    first = step(job(), None, observe(0))
    changed = job(backoffLimit=5)
    decision = step(changed, first.status, observe(1, cluster(0), the_job=job()))
    assert len(actions_of(decision, plan.ApplyConfigMap)) == 1


# --- pending and provisioning carry the reason ----------------------------------------------------


def test_unschedulable_gpu_pods_make_the_job_pending_with_the_schedulers_message() -> None:
    first = step(job(), None, observe(0))
    rc = cluster(0)
    message = "0/5 nodes are available: 4 Insufficient nvidia.com/gpu, 1 node(s) didn't match selector."
    pods = (
        pod(rc, head=True, ready=False),
        pod(rc, group="policy", node=None, ready=False, unschedulable=message),
        pod(rc, group="generation"),
    )
    decision = step(job(), first.status, observe(3, rc, pods=pods))

    assert decision.status.phase == "Pending"
    assert decision.status.reason == "Unschedulable"
    assert message in (decision.status.message or "")
    assert decision.condition(plan.PODS_SCHEDULED).reason == "Unschedulable"  # type: ignore[union-attr]
    warnings = [e for e in decision.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["Unschedulable"]


def test_bound_pods_with_a_head_not_ready_are_provisioning_head_not_ready() -> None:
    first = step(job(), None, observe(0))
    rc = cluster(0)
    pods = (pod(rc, head=True, ready=False), pod(rc, group="policy"), pod(rc, group="generation"))
    decision = step(job(), first.status, observe(3, rc, pods=pods))
    assert (decision.status.phase, decision.status.reason) == ("Provisioning", "HeadNotReady")


def test_image_pull_backoff_is_the_provisioning_reason() -> None:
    first = step(job(), None, observe(0))
    rc = cluster(0)
    pods = (
        pod(rc, head=True, ready=False, waiting="ImagePullBackOff"),
        pod(rc, group="policy"),
        pod(rc, group="generation"),
    )
    decision = step(job(), first.status, observe(3, rc, pods=pods))
    assert (decision.status.phase, decision.status.reason) == ("Provisioning", "ImagePullBackOff")
    assert "trainer:1" in (decision.status.message or "")


def test_a_raycluster_held_by_its_queue_is_pending_waiting_for_admission() -> None:
    first = step(job(), None, observe(0))
    held = replace(cluster(0), suspended=True)
    decision = step(job(), first.status, observe(3, held))
    assert (decision.status.phase, decision.status.reason) == ("Pending", "WaitingForAdmission")


def test_missing_worker_pods_are_pending_creating_pods() -> None:
    first = step(job(), None, observe(0))
    rc = cluster(0)
    decision = step(job(), first.status, observe(3, rc, pods=(pod(rc, head=True),)))
    assert (decision.status.phase, decision.status.reason) == ("Pending", "CreatingPods")


# --- running, progress, stall ----------------------------------------------------------------------


def test_ready_pods_with_the_driver_running_are_running() -> None:
    decision = running()
    assert decision.status.phase == "Running"
    assert decision.condition(plan.RUNNING).status == "True"  # type: ignore[union-attr]
    assert decision.condition(plan.PODS_READY).status == "True"  # type: ignore[union-attr]
    assert decision.requeue_after == 5  # pollSeconds


def test_progress_is_copied_from_the_driver() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    doc = {
        "step": 7,
        "maxSteps": 100,
        "policyVersion": 7,
        "rewardMean": 0.5,
        "accuracy": 0.25,
        "validationAccuracy": 0.123456,
        "meanStaleness": 0.8,
        "meanOldestStaleness": 1.1,
        "behaviourKl": 0.012345678,
        "isOutOfBounds": 0.25,
        "state": "running",
    }
    decision = step(job(), before.status, observe(40, rc, pods=healthy_pods(rc), progress=doc))
    progress = decision.status.progress
    assert progress is not None
    # issue 46: how far off-policy a step trained, for `kubectl get agj -o wide`
    assert (progress.mean_oldest_staleness, progress.behaviour_kl, progress.is_out_of_bounds) == (
        1.1,
        0.01235,
        0.25,
    )
    assert (progress.step, progress.max_steps, progress.reward_mean, progress.mean_staleness) == (
        7,
        100,
        0.5,
        0.8,
    )
    assert (progress.accuracy, progress.validation_accuracy) == (0.25, 0.1235)
    assert progress.updated_at == at(40)
    assert decision.progress_mark == ProgressMark("rc-uid-0", 7, at(40))


def test_who_waits_for_whom_and_the_time_to_the_first_step_reach_the_status() -> None:
    """issue 48: the driver's measured shares of its last step window, and the attempt's time from
    its start to the first trained step (the driver's clock against the attempt's start)."""
    before = running()
    rc = cluster(0, provisioned=True)
    started = before.status.attempt_start_time
    assert started is not None
    doc = {
        "step": 3,
        "state": "running",
        "policyIdleShare": 0.61234,
        "generationIdleShare": 0.2,
        "generationGatedShare": 0.15,
        "bufferFill": 0.5,
        "refitSeconds": 0.012345,
        "samplesUntrained": 16.0,
        "firstStepAt": started.timestamp() + 42.04,
    }
    progress = step(
        job(), before.status, observe(40, rc, pods=healthy_pods(rc), progress=doc)
    ).status.progress
    assert progress is not None
    assert (progress.policy_idle_share, progress.generation_idle_share, progress.generation_gated_share) == (
        0.612,
        0.2,
        0.15,
    )
    assert (progress.buffer_fill, progress.refit_seconds, progress.samples_untrained) == (0.5, 0.0123, 16)
    assert progress.time_to_first_step_seconds == 42.0


def test_a_driver_still_starting_does_not_reset_the_step_shown_after_a_restart() -> None:
    """A resumed attempt's driver reports step 0 until it has loaded its checkpoint; kubectl get's
    STEP keeps the last step read instead of falling back to 0."""
    before = running()
    rc = cluster(0, provisioned=True)
    trained = step(
        job(),
        before.status,
        observe(40, rc, pods=healthy_pods(rc), progress={"step": 12, "state": "running"}),
    )
    starting = step(
        job(),
        trained.status,
        observe(45, rc, pods=healthy_pods(rc), progress={"step": 0, "state": "starting"}),
    )
    assert starting.status.progress is not None and starting.status.progress.step == 12
    resumed = step(
        job(),
        starting.status,
        observe(50, rc, pods=healthy_pods(rc), progress={"step": 9, "state": "running"}),
    )
    assert resumed.status.progress is not None and resumed.status.progress.step == 9


def test_a_step_that_stops_advancing_while_pods_look_healthy_is_stalled_with_step_and_time() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    doc = {"step": 7, "state": "running"}
    mark = ProgressMark("rc-uid-0", 7, at(40))
    fine = step(
        job(), before.status, observe(100, rc, pods=healthy_pods(rc), progress=doc, progress_mark=mark)
    )
    assert fine.condition(plan.STALLED).status == "False"  # type: ignore[union-attr]

    stalled = step(
        job(), fine.status, observe(170, rc, pods=healthy_pods(rc), progress=doc, progress_mark=mark)
    )
    cond = stalled.condition(plan.STALLED)
    assert cond is not None and cond.status == "True" and cond.reason == "NoProgress"
    assert "step 7" in cond.message and "2026-11-29T12:00:40Z" in cond.message
    assert stalled.status.phase == "Running" and stalled.status.reason == "NoProgress"
    assert "NoProgress" in reasons(stalled.events)

    moving = step(
        job(),
        stalled.status,
        observe(175, rc, pods=healthy_pods(rc), progress={"step": 8}, progress_mark=mark),
    )
    assert moving.condition(plan.STALLED).status == "False"  # type: ignore[union-attr]


def test_the_drivers_log_prob_mismatch_sets_a_condition_with_a_warning_event_until_it_clears() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    fine = step(job(), before.status, observe(40, rc, pods=healthy_pods(rc), progress={"step": 3}))
    assert fine.condition(plan.LOGPROB_MISMATCH) is None  # no news while the engine agrees
    why = "genLogprobError above logprobGate.threshold 1.1 for 5 measured steps in a row (steps 4-8; ...)"
    tripped = step(
        job(),
        fine.status,
        observe(50, rc, pods=healthy_pods(rc), progress={"step": 8, "logprobMismatch": why}),
    )
    cond = tripped.condition(plan.LOGPROB_MISMATCH)
    assert cond is not None and cond.status == "True" and cond.reason == "GenLogprobErrorHigh"
    assert cond.message == why
    warnings = [e for e in tripped.events if e.reason == "GenLogprobErrorHigh"]
    assert len(warnings) == 1 and warnings[0].type == "Warning" and why in warnings[0].message
    assert tripped.status.phase == "Running"
    again = step(
        job(),
        tripped.status,
        observe(55, rc, pods=healthy_pods(rc), progress={"step": 9, "logprobMismatch": why}),
    )
    assert "GenLogprobErrorHigh" not in reasons(again.events)  # one event per transition
    # With logprobGate.failJob the driver then exits 1: the job fails, and the condition says why.
    error = f"LogprobMismatchError: {why}; logprobGate.failJob is set"
    failed = step(job(), again.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(1, error))))
    assert failed.status.phase == "Failed" and failed.status.reason == "TrainingError"
    assert failed.condition(plan.LOGPROB_MISMATCH).status == "True"  # type: ignore[union-attr]
    cleared = step(job(), again.status, observe(60, rc, pods=healthy_pods(rc), progress={"step": 10}))
    cond = cleared.condition(plan.LOGPROB_MISMATCH)
    assert cond is not None and cond.status == "False"
    assert [e.type for e in cleared.events if e.reason == "GenLogprobErrorNormal"] == ["Normal"]


def test_an_unreachable_progress_endpoint_counts_as_no_progress() -> None:
    before = running()  # Running since 30 s
    rc = cluster(0, provisioned=True)
    decision = step(
        job(), before.status, observe(200, rc, pods=healthy_pods(rc), progress_error="connection refused")
    )
    cond = decision.condition(plan.STALLED)
    assert cond is not None and cond.status == "True"
    assert "connection refused" in cond.message


def test_a_pass_that_learns_nothing_new_leaves_the_status_as_it_was() -> None:
    """Each status write wakes the job's watch; a pass must not write just because time passed."""
    before = running()
    rc = cluster(0, provisioned=True)
    doc = {"step": 5, "state": "running"}
    first = step(
        job(), before.status, observe(40, rc, pods=healthy_pods(rc), progress=doc, progress_read_at=at(40))
    )
    again = step(
        job(),
        first.status,
        observe(
            41,
            rc,
            pods=healthy_pods(rc),
            progress=doc,
            progress_read_at=at(40),
            progress_mark=first.progress_mark,
        ),
    )
    assert again.status_patch() == first.status_patch()
    stalled = step(
        job(),
        first.status,
        observe(
            200,
            rc,
            pods=healthy_pods(rc),
            progress=doc,
            progress_read_at=at(40),
            progress_mark=first.progress_mark,
        ),
    )
    still = step(
        job(),
        stalled.status,
        observe(
            230,
            rc,
            pods=healthy_pods(rc),
            progress=doc,
            progress_read_at=at(40),
            progress_mark=first.progress_mark,
        ),
    )
    assert stalled.status.reason == "NoProgress"
    assert still.status_patch() == stalled.status_patch()


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    later = step(job(), before.status, observe(90, rc, pods=healthy_pods(rc), progress={"step": 1}))
    assert later.condition(plan.RUNNING).last_transition_time == at(30)  # type: ignore[union-attr]
    assert not [e for e in later.events if e.reason == "DriverRunning"]


# --- the driver's exit decides the attempt --------------------------------------------------------


def test_driver_exit_zero_succeeds_and_deletes_the_cluster_by_default() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    decision = step(job(), before.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0))))

    assert decision.status.phase == "Succeeded"
    assert decision.status.reason == "DriverSucceeded"
    assert decision.status.completion_time == at(60)
    assert [a.name for a in actions_of(decision, plan.DeleteRayCluster)] == ["demo-0"]  # type: ignore[attr-defined]
    assert decision.condition(plan.RUNNING).status == "False"  # type: ignore[union-attr]
    assert decision.condition(plan.PODS_READY) is None  # a finished job has no live sub-status


def test_a_succeeded_job_states_its_final_held_out_accuracy() -> None:
    rc = cluster(0, provisioned=True)
    doc = {"step": 60, "maxSteps": 60, "validationAccuracy": 0.975, "state": "succeeded"}
    last = step(job(), running().status, observe(50, rc, pods=healthy_pods(rc), progress=doc))
    done = step(job(), last.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(0))))
    assert done.status.phase == "Succeeded"
    assert done.status.progress is not None and done.status.progress.validation_accuracy == 0.975
    assert (done.status.message or "").endswith("; held-out accuracy 0.975")


def test_driver_training_error_fails_without_retry_and_keeps_the_cluster() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    pods = healthy_pods(rc, driver=terminated(1, "ValueError: loss is nan"))
    decision = step(job(), before.status, observe(60, rc, pods=pods))

    assert (decision.status.phase, decision.status.reason) == ("Failed", "TrainingError")
    assert "loss is nan" in (decision.status.message or "")
    assert decision.status.restarts == 0
    assert decision.actions == ()  # onFailure: KeepCluster, no new attempt


def test_a_driver_that_found_the_data_unusable_fails_with_invalid_data_and_is_not_retried() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    message = (
        "asyncgrpo: training failed: InvalidDataError: data.trainPath /data/train.jsonl: no usable row of 3: "
        "the first bad row is line 1: has no 'prompt'"
    )
    pods = healthy_pods(rc, driver=terminated(exitcodes.INVALID_DATA, message))
    decision = step(job(), before.status, observe(60, rc, pods=pods))

    assert (decision.status.phase, decision.status.reason) == ("Failed", "InvalidData")
    assert "data.trainPath /data/train.jsonl: no usable row of 3" in (decision.status.message or "")
    assert "not retried" in (decision.status.message or "")
    assert (decision.status.restarts, decision.status.attempt) == (0, 0)
    assert actions_of(decision, plan.CreateRayCluster) == []
    assert [e.type for e in decision.events if e.reason == "InvalidData"] == ["Warning"]


def test_a_driver_refused_by_the_object_store_fails_with_a_clear_reason_and_is_not_retried() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    message = (
        "asyncgrpo: training failed: ObjectStoreRefusedError: the object store https://s3 refused bucket "
        "'ckpts' (InvalidAccessKeyId): check the Secret named in spec.storage.objectStore.credentials"
    )
    pods = healthy_pods(rc, driver=terminated(exitcodes.OBJECT_STORE_REFUSED, message))
    decision = step(job(), before.status, observe(60, rc, pods=pods))

    assert (decision.status.phase, decision.status.reason) == ("Failed", "ObjectStoreRefused")
    assert "spec.storage.objectStore.credentials" in (decision.status.message or "")
    assert (decision.status.restarts, decision.status.attempt) == (0, 0)
    assert actions_of(decision, plan.CreateRayCluster) == []


def test_reward_failures_and_skipped_data_rows_reach_the_status() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    warning = (
        "data.trainPath /data/t.jsonl: 2 bad row(s) skipped (first: line 7: 'answer' is null); "
        "98 of 100 rows used"
    )
    doc = {"step": 3, "state": "running", "rewardFailures": 2, "dataWarning": warning}
    decision = step(job(), before.status, observe(40, rc, pods=healthy_pods(rc), progress=doc))
    assert decision.status.progress is not None and decision.status.progress.reward_failures == 2
    assert decision.status.phase == "Running"
    assert (decision.status.message or "").endswith(f"; data: {warning}")


def test_driver_killed_by_a_signal_restarts_with_a_fresh_cluster() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    decision = step(job(), before.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(137))))

    assert decision.status.phase == "Restarting"
    assert decision.status.reason == "DriverKilled"
    assert "SIGKILL" in (decision.status.message or "")
    assert (decision.status.restarts, decision.status.attempt) == (1, 1)
    assert [a.name for a in actions_of(decision, plan.DeleteRayCluster)] == ["demo-0"]  # type: ignore[attr-defined]
    created = actions_of(decision, plan.CreateRayCluster)
    assert [c.manifest["metadata"]["name"] for c in created] == ["demo-1"]  # type: ignore[attr-defined]
    assert decision.status.ray_cluster_name is None  # until demo-1 is seen


@pytest.mark.parametrize(
    ("driver_limit", "says"),
    [
        ("512Mi", "over its memory limit 512Mi; raise spec.cluster.head.driverResources.limits.memory"),
        (None, "without a memory limit of its own"),
    ],
)
def test_an_oom_killed_driver_is_named_as_such_with_the_field_that_bounds_it(
    driver_limit: str | None, says: str
) -> None:
    cluster_spec = copy.deepcopy(BASE_JOB["spec"]["cluster"])
    if driver_limit is not None:
        cluster_spec["head"] = {"driverResources": {"limits": {"memory": driver_limit}}}
    the_job = job(cluster=cluster_spec)
    before = running(the_job)
    rc = cluster(0, provisioned=True)
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": ""}}
    decision = step(the_job, before.status, observe(60, rc, pods=healthy_pods(rc, driver=oom)))

    assert (decision.status.phase, decision.status.reason) == ("Restarting", "DriverKilled")
    assert "the driver container was OOMKilled" in (decision.status.message or "")
    assert says in (decision.status.message or "")


def test_driver_that_lost_a_ray_worker_restarts_from_the_checkpoint() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    lost = terminated(exitcodes.RAY_WORKER_LOST)
    decision = step(job(), before.status, observe(60, rc, pods=healthy_pods(rc, driver=lost)))

    assert (decision.status.phase, decision.status.reason) == ("Restarting", "RayWorkerLost")
    assert (decision.status.restarts, decision.status.attempt) == (1, 1)
    assert [c.manifest["metadata"]["name"] for c in actions_of(decision, plan.CreateRayCluster)] == ["demo-1"]  # type: ignore[attr-defined]


def test_restarting_ends_when_the_new_attempt_runs() -> None:
    before = running()
    rc0 = cluster(0, provisioned=True)
    restarting = step(job(), before.status, observe(60, rc0, pods=healthy_pods(rc0, driver=terminated(143))))
    rc1 = cluster(1, provisioned=True, created=60)
    again = step(job(), restarting.status, observe(90, rc1, pods=healthy_pods(rc1)))
    assert again.status.phase == "Running"
    assert again.condition(plan.RESTARTING).status == "False"  # type: ignore[union-attr]
    assert again.status.restarts == 1


def test_the_durable_checkpoint_step_the_driver_reports_stays_in_the_status_through_a_retry() -> None:
    """`kubectl get agj -o wide` shows Durable-Ckpt: the newest checkpoint in the object store."""
    before = running()
    rc0 = cluster(0, provisioned=True)
    doc = {"step": 9, "lastCheckpointStep": 8, "durableCheckpointStep": 6, "state": "running"}
    trained = step(job(), before.status, observe(40, rc0, pods=healthy_pods(rc0), progress=doc))
    killed = step(job(), trained.status, observe(45, rc0, pods=healthy_pods(rc0, driver=terminated(137))))

    assert trained.status.progress is not None and trained.status.progress.durable_checkpoint_step == 6
    assert killed.status.progress is not None and killed.status.progress.durable_checkpoint_step == 6


def test_a_retry_steps_back_to_the_checkpoint_at_the_restart_and_only_forward_after_it() -> None:
    """Attempt 0 trained step 9 after its step-8 checkpoint and was killed: from the restart on,
    STEP shows 8 (what attempt 1 resumes from), then follows attempt 1 up."""
    before = running()
    rc0 = cluster(0, provisioned=True)
    doc = {"step": 9, "policyVersion": 9, "lastCheckpointStep": 8, "rewardMean": 0.3, "state": "running"}
    trained = step(job(), before.status, observe(40, rc0, pods=healthy_pods(rc0), progress=doc))
    killed = step(job(), trained.status, observe(45, rc0, pods=healthy_pods(rc0, driver=terminated(137))))
    progress = killed.status.progress
    assert (killed.status.phase, killed.status.restarts) == ("Restarting", 1)
    assert progress is not None
    assert (progress.step, progress.policy_version, progress.last_checkpoint_step) == (8, 8, 8)
    assert progress.reward_mean == 0.3  # the last reward measured stays until attempt 1 reports one

    rc1 = cluster(1, provisioned=True, created=45)
    shown = []
    status = killed.status
    for t, attempt_doc in [
        (60, {"step": 0, "state": "starting"}),  # the driver before it looked for a checkpoint
        (61, {"step": 8, "lastCheckpointStep": 8, "state": "starting"}),
        (70, {"step": 8, "lastCheckpointStep": 8, "state": "running"}),
        (71, {"step": 9, "lastCheckpointStep": 8, "state": "running"}),
    ]:
        status = step(job(), status, observe(t, rc1, pods=healthy_pods(rc1), progress=attempt_doc)).status
        assert status.progress is not None
        shown.append(status.progress.step)
    assert shown == [8, 8, 8, 9]


def test_a_retry_without_a_checkpoint_shows_step_0_and_a_later_checkpoint_raises_it() -> None:
    """The operator rewinds to the newest checkpoint it has seen; a checkpoint written after its
    last poll is where attempt 1 really resumes, and STEP rises to it."""
    before = running()
    rc0 = cluster(0, provisioned=True)
    doc = {"step": 3, "state": "running"}
    trained = step(job(), before.status, observe(40, rc0, pods=healthy_pods(rc0), progress=doc))
    killed = step(job(), trained.status, observe(45, rc0, pods=healthy_pods(rc0, driver=terminated(137))))
    assert killed.status.progress is not None and killed.status.progress.step == 0
    rc1 = cluster(1, provisioned=True, created=45)
    later = {"step": 4, "lastCheckpointStep": 4, "state": "starting"}
    resumed = step(job(), killed.status, observe(60, rc1, pods=healthy_pods(rc1), progress=later))
    assert resumed.status.progress is not None and resumed.status.progress.step == 4


def test_a_lost_head_pod_after_provisioning_is_an_infrastructure_failure() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    workers = healthy_pods(rc)[1:]
    decision = step(job(), before.status, observe(60, rc, pods=workers))
    assert (decision.status.phase, decision.status.reason) == ("Restarting", "HeadPodLost")
    assert decision.status.restarts == 1


def test_a_failed_head_pod_is_an_infrastructure_failure() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    head = pod(rc, head=True, phase="Failed", ready=False)
    decision = step(job(), before.status, observe(60, rc, pods=(head, *healthy_pods(rc)[1:])))
    assert decision.status.reason == "HeadPodLost"
    assert "on node node-1" in (decision.status.message or "")  # where to look


def test_a_head_pod_that_fails_as_a_whole_is_retried_whatever_the_exit_code() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    head = pod(rc, head=True, phase="Failed", ready=False, driver=terminated(1, "node shutdown"))
    decision = step(job(), before.status, observe(60, rc, pods=(head, *healthy_pods(rc)[1:])))
    assert (decision.status.phase, decision.status.reason) == ("Restarting", "HeadPodLost")
    assert "exit code was 1" in (decision.status.message or "")


def test_an_exit_seen_before_kuberay_deleted_the_head_pod_still_decides_the_attempt() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    remembered = DriverExit(cluster_uid=rc.uid, pod_name="demo-0-head", exit_code=0)
    decision = step(
        job(), before.status, observe(60, rc, pods=healthy_pods(rc)[1:], remembered_exit=remembered)
    )
    assert decision.status.phase == "Succeeded"


def test_an_exit_remembered_from_an_older_cluster_is_ignored() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    remembered = DriverExit(cluster_uid="another", pod_name="x", exit_code=1)
    decision = step(job(), before.status, observe(60, rc, pods=healthy_pods(rc), remembered_exit=remembered))
    assert decision.status.phase == "Running"


def test_a_deleted_raycluster_is_an_infrastructure_failure() -> None:
    before = running()
    decision = step(job(), before.status, observe(60))
    assert (decision.status.phase, decision.status.reason) == ("Restarting", "RayClusterLost")


def test_exhausted_backoff_limit_fails_with_backoff_limit_exceeded() -> None:
    the_job = job(backoffLimit=1)
    status = running(the_job).status
    rc = cluster(0, provisioned=True)
    first = step(the_job, status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(137))))
    assert first.status.restarts == 1
    rc1 = cluster(1, provisioned=True, created=60)
    ran = step(the_job, first.status, observe(90, rc1, pods=healthy_pods(rc1)))
    lost = step(the_job, ran.status, observe(120, rc1, pods=healthy_pods(rc1, driver=terminated(137))))

    assert (lost.status.phase, lost.status.reason) == ("Failed", "BackoffLimitExceeded")
    assert "DriverKilled" in (lost.status.message or "")
    assert lost.status.restarts == 1
    assert actions_of(lost, plan.CreateRayCluster) == []
    assert lost.condition(plan.RESTARTING).status == "False"  # type: ignore[union-attr]


# --- deadlines -----------------------------------------------------------------------------------


def test_startup_deadline_fails_a_job_stuck_pending_with_the_last_reason() -> None:
    first = step(job(), None, observe(0))
    rc = cluster(0)
    message = "0/5 nodes are available: 4 Insufficient nvidia.com/gpu."
    pods = (
        pod(rc, head=True),
        pod(rc, node=None, ready=False, unschedulable=message),
        pod(rc, group="generation"),
    )
    pending = step(job(), first.status, observe(10, rc, pods=pods))
    assert pending.requeue_after is not None and pending.requeue_after <= 15

    expired = step(job(), pending.status, observe(601, rc, pods=pods))
    assert (expired.status.phase, expired.status.reason) == ("Failed", "DeadlineExceeded")
    assert "Insufficient nvidia.com/gpu" in (expired.status.message or "")
    assert "DeadlineExceeded" in reasons(expired.events)


def test_startup_deadline_requeues_at_expiry() -> None:
    the_job = job(startupDeadlineSeconds=30)
    first = step(the_job, None, observe(0, the_job=the_job))
    rc = cluster(0)
    pods = (pod(rc, head=True, ready=False),)
    decision = step(the_job, first.status, observe(20, rc, pods=pods, the_job=the_job))
    assert decision.requeue_after == 10


def test_active_deadline_fails_a_running_job_and_is_not_retried() -> None:
    the_job = job(activeDeadlineSeconds=100)
    before = running(the_job)
    rc = cluster(0, provisioned=True)
    decision = step(the_job, before.status, observe(100, rc, pods=healthy_pods(rc), the_job=the_job))
    assert (decision.status.phase, decision.status.reason) == ("Failed", "DeadlineExceeded")
    assert decision.status.restarts == 0
    assert actions_of(decision, plan.CreateRayCluster) == []


# --- suspend and resume -------------------------------------------------------------------------


def test_suspend_stops_the_pods_in_place_and_keeps_the_cluster_and_the_attempt() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    decision = step(job(suspend=True), before.status, observe(60, rc, pods=healthy_pods(rc)))
    assert decision.status.phase == "Suspended"
    assert actions_of(decision, plan.DeleteRayCluster) == []
    (suspend,) = actions_of(decision, plan.SetRayClusterSpec)
    assert (suspend.name, suspend.suspend, suspend.spec) == ("demo-0", True, None)  # type: ignore[attr-defined]
    assert decision.status.ray_cluster_name == "demo-0" and decision.status.attempt == 0
    assert decision.condition(plan.RUNNING).status == "False"  # type: ignore[union-attr]
    stays = step(job(suspend=True), decision.status, observe(61, replace(rc, suspended=True)))
    assert stays.status.phase == "Suspended" and stays.actions == ()


def test_a_job_created_suspended_creates_no_cluster() -> None:
    decision = step(job(suspend=True), None, observe(0, configmap=False))
    assert decision.status.phase == "Suspended"
    assert actions_of(decision, plan.CreateRayCluster) == []


def test_resume_restarts_the_same_cluster_and_its_stopped_driver_is_not_taken_for_the_new_one() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    suspended = step(job(suspend=True), before.status, observe(60, rc, pods=healthy_pods(rc)))
    suspending = replace(rc, suspended=True)
    waits = step(job(), suspended.status, observe(68, suspending))  # KubeRay still deleting the pods
    assert waits.status.reason == "WaitingForPreviousCluster" and not waits.actions
    held = replace(rc, suspended=True, suspend_complete=True, provisioned=False)
    resumed = step(job(), suspended.status, observe(70, held))
    (resume,) = actions_of(resumed, plan.SetRayClusterSpec)
    assert (resume.name, resume.suspend) == ("demo-0", False)  # type: ignore[attr-defined]
    assert resume.spec["headGroupSpec"] == manifests.ray_cluster(job(), 0)["spec"]["headGroupSpec"]  # type: ignore[attr-defined]
    assert actions_of(resumed, plan.CreateRayCluster) == []
    assert resumed.status.restarts == 0 and resumed.status.attempt == 0
    assert resumed.status.start_time == at(70)  # the active deadline restarts on resume, as batch/v1's
    assert resumed.condition(plan.SUSPENDED).reason == "Resumed"  # type: ignore[union-attr]
    # The head pod KubeRay is deleting still shows the driver the suspension stopped (SIGTERM).
    sigterm = {"terminated": {**terminated(143)["terminated"], "finishedAt": at(65).isoformat()}}
    stopped = pod(rc, head=True, driver=sigterm, deleting=True)
    restarting = replace(rc, provisioned=False)
    after = step(job(), resumed.status, observe(72, restarting, pods=(stopped,)))
    assert after.status.phase not in ("Restarting", "Failed"), after.status.message
    assert after.status.restarts == 0


# --- finished jobs: cleanup, TTL -----------------------------------------------------------------


def test_ttl_requeues_at_expiry_then_deletes_the_job() -> None:
    the_job = job(cleanupPolicy={"ttlSecondsAfterFinished": 300, "onSuccess": "KeepCluster"})
    before = running(the_job)
    rc = cluster(0, provisioned=True)
    pods = healthy_pods(rc, driver=terminated(0))
    done = step(the_job, before.status, observe(60, rc, pods=pods, the_job=the_job))
    assert done.status.phase == "Succeeded"
    assert done.requeue_after == 300
    assert actions_of(done, plan.DeleteRayCluster) == []  # onSuccess: KeepCluster

    later = step(the_job, done.status, observe(200, rc, pods=pods, the_job=the_job))
    assert later.requeue_after == 160
    expired = step(the_job, done.status, observe(360, rc, pods=pods, the_job=the_job))
    assert len(actions_of(expired, plan.DeleteJob)) == 1


def test_a_finished_job_stays_finished_whatever_happens_to_its_pods() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    done = step(job(), before.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(1))))
    after = step(job(), done.status, observe(90))
    assert after.status.phase == "Failed"
    assert after.status == done.status
    assert after.events == ()


def test_cleanup_on_failure_delete_cluster_deletes_it() -> None:
    the_job = job(cleanupPolicy={"onFailure": "DeleteCluster"})
    before = running(the_job)
    rc = cluster(0, provisioned=True)
    done = step(
        the_job, before.status, observe(60, rc, pods=healthy_pods(rc, driver=terminated(1)), the_job=the_job)
    )
    assert [a.name for a in actions_of(done, plan.DeleteRayCluster)] == ["demo-0"]  # type: ignore[attr-defined]


def test_an_invalid_job_fails_with_invalid_spec() -> None:
    decision = plan.plan_invalid(
        None, observe(0), generation=1, message="spec.x: bad", cleanup=CleanupPolicy(), owner=OWNER
    )
    assert (decision.status.phase, decision.status.reason) == ("Failed", "InvalidSpec")
    assert decision.actions == ()


# --- events ----------------------------------------------------------------------------------


def test_events_tell_the_story_once_per_transition() -> None:
    created = step(job(), None, observe(0, configmap=False))
    assert [(e.type, e.reason) for e in created.events] == [
        ("Normal", "ClusterCreating"),
        ("Normal", "CreatedRayCluster"),
    ]
    rc = cluster(0)
    message = "0/5 nodes are available: 4 Insufficient nvidia.com/gpu."
    pods = (
        pod(rc, head=True),
        pod(rc, node=None, ready=False, unschedulable=message),
        pod(rc, group="generation"),
    )
    pending = step(job(), created.status, observe(2, rc, pods=pods))
    assert [(e.type, e.reason) for e in pending.events] == [("Warning", "Unschedulable")]
    again = step(job(), pending.status, observe(4, rc, pods=pods))
    assert again.events == ()
    ready = replace(rc, provisioned=True)
    run = step(job(), again.status, observe(6, ready, pods=healthy_pods(ready)))
    assert [e.reason for e in run.events] == ["DriverRunning", "AllPodsScheduled", "AllPodsReady"]
    assert "Pending -> Running" in run.events[0].message
    done = step(job(), run.status, observe(8, ready, pods=healthy_pods(ready, driver=terminated(0))))
    assert [e.reason for e in done.events] == ["DriverSucceeded", "DeletedRayCluster"]


# --- status shape --------------------------------------------------------------------------------


def test_status_patch_clears_fields_with_null_and_uses_camel_case() -> None:
    patch = running().status_patch()
    assert patch["phase"] == "Running"
    assert patch["completionTime"] is None
    assert patch["rayClusterName"] == "demo-0"
    assert {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"} <= set(
        patch["conditions"][0]
    )


def test_conditions_record_the_generation_they_were_computed_from() -> None:
    before = running()
    rc = cluster(0, provisioned=True)
    decision = step(job(), before.status, observe(40, rc, pods=healthy_pods(rc)), generation=4)
    assert decision.status.observed_generation == 4
    assert {c.observed_generation for c in decision.status.conditions} == {4}
