"""`asyncgrpo logs`: what it shows for a job in each state (the API calls are in tests/e2e/test_kueue.py,
against a real API server; kwok's fake nodes serve no container logs, so streaming itself is not
exercised there)."""

from __future__ import annotations

from typing import Any

from asyncgrpo_operator.driverlog import Files, Stored, Stream, decide

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
