"""status.outputs: where the driver's log, step records and curves are, for every attempt."""

from __future__ import annotations

from asyncgrpo_operator import plan
from tests.operator.builders import OWNER, cluster, job, observe, pod, terminated


def test_the_status_says_where_the_files_are_and_on_which_volume() -> None:
    the_job = job(
        storage={"checkpoints": {"pvc": {"claimName": "ckpt"}, "mountPath": "/ck"}},
        checkpoint={"path": "/ck/run-1"},
    )
    first = plan.plan(the_job, None, observe(0, configmap=False, the_job=the_job), generation=1, owner=OWNER)
    out = first.status.outputs
    assert out is not None
    assert out.driver_log == "/ck/run-1/logs/driver-attempt-0.log"
    assert out.steps == "/ck/run-1/logs/steps.jsonl"
    assert out.tensorboard == "/ck/run-1/tensorboard"
    assert "PersistentVolumeClaim ckpt" in out.volume


def test_a_retry_points_at_its_own_log_and_an_emptydir_is_called_out() -> None:
    the_job = job()
    first = plan.plan(the_job, None, observe(0, configmap=False), generation=1, owner=OWNER)
    assert first.status.outputs is not None and "deleted with it" in first.status.outputs.volume
    rc = cluster(0, provisioned=True)
    killed = (pod(rc, head=True, driver=terminated(137)),)
    retried = plan.plan(the_job, first.status, observe(30, rc, pods=killed), generation=1, owner=OWNER)
    assert retried.status.attempt == 1
    assert retried.status.outputs is not None
    assert retried.status.outputs.driver_log.endswith("/logs/driver-attempt-1.log")
