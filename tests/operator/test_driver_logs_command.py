"""`asyncgrpo logs`: what it shows for a job in each state (the API calls are in tests/e2e/test_kueue.py,
against a real API server; kwok's fake nodes serve no container logs, so streaming itself is not
exercised there)."""

from __future__ import annotations

from typing import Any

from asyncgrpo_operator.driverlog import Files, NoSuchAttempt, Stored, Stream, decide

OUTPUTS = {
    "volume": "PersistentVolumeClaim ckpt at /ck",
    "driverLog": "/ck/logs/driver-attempt-1.log",
    "steps": "/ck/logs/steps.jsonl",
    "tensorboard": "/ck/tensorboard",
}


def the_job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "demo"}, "status": status}


def head(name: str, driver_state: dict[str, Any], *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [{"name": "driver", "state": driver_state}]}}


def test_a_running_driver_is_streamed_and_followed_on_request() -> None:
    job = the_job(phase="Running", rayClusterName="demo-1", outputs=OUTPUTS)
    assert decide(job, [head("demo-1-head-x", {"running": {}})], follow=True) == Stream("demo-1-head-x", True)
    assert decide(job, [head("demo-1-head-x", {"running": {}})], follow=False) == Stream(
        "demo-1-head-x", False
    )


def test_a_finished_driver_whose_pod_is_kept_is_printed_once() -> None:
    job = the_job(phase="Failed", rayClusterName="demo-1", outputs=OUTPUTS)
    assert decide(job, [head("p", {"terminated": {"exitCode": 1}})], follow=True) == Stream("p", False)


def test_once_the_pod_is_gone_it_says_where_the_files_are_and_on_which_volume() -> None:
    job = the_job(phase="Succeeded", reason="DriverSucceeded", outputs=OUTPUTS)
    outcome = decide(job, [head("old", {"running": {}}, deleting=True)], follow=True)
    assert isinstance(outcome, Files)
    assert "Succeeded: DriverSucceeded" in outcome.text and "RayCluster is gone" in outcome.text
    for value in OUTPUTS.values():
        assert value in outcome.text


def test_a_queued_job_has_no_driver_yet() -> None:
    outcome = decide(
        the_job(phase="Queued", reason="Pending", rayClusterName="demo-0", outputs=OUTPUTS), [], follow=True
    )
    assert isinstance(outcome, Files) and "is Queued: Pending; its driver has not started yet" in outcome.text


def test_once_the_pods_are_gone_a_job_with_an_object_store_reads_the_log_from_it() -> None:
    store = {"endpoint": "https://s3.example.com", "bucket": "ckpts", "credentials": {"secretName": "s3"}}
    job = the_job(phase="Failed", reason="BackoffLimitExceeded", outputs=OUTPUTS)
    job["metadata"]["namespace"] = "rl"
    job["spec"] = {"storage": {"objectStore": store}}

    outcome = decide(job, [], follow=True)

    assert isinstance(outcome, Stored)
    assert (outcome.store.bucket, outcome.namespace) == ("ckpts", "rl")
    assert "its RayCluster is gone" in outcome.why


def test_an_earlier_attempt_is_read_from_the_object_store_even_while_a_newer_one_runs() -> None:
    store = {"endpoint": "https://s3.example.com", "bucket": "ckpts", "credentials": {"secretName": "s3"}}
    job = the_job(phase="Running", attempt=2, rayClusterName="demo-2", outputs=OUTPUTS)
    job["spec"] = {"storage": {"objectStore": store}}
    running = [head("demo-2-head-x", {"running": {}})]

    outcome = decide(job, running, follow=True, attempt=0)

    assert isinstance(outcome, Stored) and outcome.attempt == 0
    assert "attempt 0 of job demo ended (the job is at attempt 2)" in outcome.why
    assert decide(job, running, follow=True, attempt=2) == Stream("demo-2-head-x", True)  # the current one


def test_an_earlier_attempt_without_an_object_store_is_named_on_the_volume() -> None:
    job = the_job(phase="Succeeded", attempt=1, outputs=OUTPUTS)
    job["spec"] = {"checkpoint": {"path": "/ck"}}

    outcome = decide(job, [], follow=False, attempt=0)

    assert isinstance(outcome, Files)
    assert "/ck/logs/driver-attempt-0.log on the PersistentVolumeClaim ckpt at /ck" in outcome.text


def test_an_attempt_the_job_has_not_reached_is_refused_with_the_attempts_it_has() -> None:
    outcome = decide(the_job(phase="Running", attempt=1), [], follow=False, attempt=3)
    assert outcome == NoSuchAttempt("job demo has no attempt 3: its attempts so far are 0 to 1")
