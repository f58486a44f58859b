"""Issue 32's whole path: a job whose checkpoints and logs go to a real S3 server (SeaweedFS) is
killed, its next attempt resumes from the bucket (its checkpoint volume is an emptyDir, so nothing
local survives the attempt), and once the job has Succeeded and its RayCluster is deleted,
`asyncgrpo logs` reads both attempts' logs from the bucket as a user would.

The harness is tests/e2e/test_whole_path.py's (tests/e2e/whole_path_fixtures.py): the chart
installed by helm, the operator as the chart's ServiceAccount, KubeRay creating the head pod, and the
head pod's driver container run on this machine with its env resolved from the pod (the S3 key pair
from the job's Secret, as a kubelet resolves secretKeyRef). The fault runs of docs/reliability.md
§9 repeat each scenario with ASYNCGRPO_RELIABILITY_OBJECT_STORE_RUNS.
"""

from __future__ import annotations

import base64
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_trainer import durable_checkpoints
from asyncgrpo_trainer.object_store import Store
from tests.cluster.samples import wait_until
from tests.e2e.test_kueue import run_asyncgrpo_logs
from tests.e2e.test_operator import live_rayclusters
from tests.e2e.whole_path import (
    AgjWatch,
    DriverKubelet,
    LocalDriver,
    logged_steps,
    tiny_job,
    wait_terminal,
)
from tests.e2e.whole_path_fixtures import STEPS, run_job, wait_for_progress
from tests.objectstore.helpers import store_config, with_object_store
from tests.objectstore.s3server import ACCESS_KEY, SECRET_KEY, S3Server
from tests.reliability.conftest import count
from tests.webhook.cluster_harness import Installation

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.trainer]

RUNS = count("object_store_runs", 1)
"""How many times each fault scenario runs (docs/reliability.md §9 records the counts)."""
DURABLE_FIELD = "durableCheckpointStep"
"""`kubectl get agj -o wide`'s Durable-Ckpt: the newest checkpoint complete in the bucket."""
DURABLE = re.compile(r"checkpoint of step (\d+) is durable in the object store")
RESTORED = re.compile(r"restored the durable checkpoint of step (\d+) \(attempt (\d+)\)")


def create_key_secret(chart: Installation) -> None:
    """The Secret the job names in spec.storage.objectStore.credentials (its default keys)."""
    data = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3", "namespace": chart.jobs_ns},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    chart.api.apply(f"/api/v1/namespaces/{chart.jobs_ns}/secrets/s3", secret)


def object_store_job(chart: Installation, name: str, server: S3Server, bucket: str) -> dict[str, Any]:
    """The tiny e2e job with its checkpoints on an emptyDir (gone with each attempt's pod) and
    spec.storage.objectStore naming the test server, its logs uploaded every 5 s."""
    job = tiny_job(name, max_steps=STEPS)
    job["metadata"]["namespace"] = chart.jobs_ns
    job["spec"]["storage"]["checkpoints"] = {"emptyDir": {}, "mountPath": "/checkpoints"}
    return with_object_store(job, server, bucket, prefix="runs", logUploadIntervalSeconds=5)


def stored_logs(chart: Installation, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`asyncgrpo logs NAME [args]` with the reader's own key pair in the environment (never read
    from the cluster)."""
    keys = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    return run_asyncgrpo_logs(chart.cluster.kubeconfig, chart.jobs_ns, name, *args, env=keys)


def newest_complete(store: Store) -> int:
    """The step of the newest complete (manifest written) checkpoint in the bucket; 0 when none."""
    return max((c.step for c in durable_checkpoints.complete_checkpoints(store)), default=0)


def local_driver_log(kubelet: DriverKubelet, driver: LocalDriver, attempt: int) -> Path:
    """The driver's own copy of its log on the checkpoint volume (the pod's emptyDir, kept here)."""
    found = list(
        (kubelet.root / "pods" / driver.pod / "volumes").glob(f"*/logs/driver-attempt-{attempt}.log")
    )
    assert len(found) == 1, found
    return found[0]


@pytest.mark.budget(300, "two attempts through SeaweedFS: resuming from the bucket with the volume gone")
@pytest.mark.parametrize("run", range(RUNS))
def test_a_killed_job_resumes_from_the_bucket_and_its_logs_are_read_after_the_cluster_is_gone(
    chart: Installation, kubelet: DriverKubelet, s3_server: S3Server, bucket: str, run: int
) -> None:
    name = f"s3-resume-{run}"
    create_key_secret(chart)
    store = Store(store_config(s3_server, bucket, root=f"runs/{chart.jobs_ns}/{name}"))
    at_kill: list[int] = []
    started = time.monotonic()

    def kill_once_durable(driver: LocalDriver, watch: AgjWatch) -> None:
        """SIGKILL the first attempt once the job's status shows a durable checkpoint at step 8 or
        later: from then on the bucket is all a new attempt can resume from."""
        if driver.cluster != f"{name}-0":
            return
        wait_for_progress(chart, watch, driver, DURABLE_FIELD, 8)
        driver.kill(signal.SIGKILL)
        driver.wait(timeout=30)
        at_kill.append(newest_complete(store))

    watch, runs = run_job(chart, kubelet, object_store_job(chart, name, s3_server, bucket), kill_once_durable)
    assert [(d.cluster, code) for d, code in runs] == [(f"{name}-0", 137), (f"{name}-1", 0)]
    first, second = runs[0][0], runs[1][0]
    assert second.env_changes["AWS_ACCESS_KEY_ID"] == ACCESS_KEY  # from the Secret, through the pod

    # The second attempt's checkpoint folder was a fresh emptyDir: it restored from the bucket.
    second_log = second.log.read_text()
    restored = RESTORED.search(second_log)
    assert restored is not None, second.log_tail(40)
    restored_step = int(restored.group(1))
    # Nothing durable was lost: the newest complete checkpoint in the bucket when the first attempt
    # died is the one resumed (an upload the kill cut off left no manifest, so it was not resumed).
    assert restored_step >= 8 and restored.group(2) == "0", restored.group(0)
    assert at_kill == [restored_step], (restored_step, at_kill)
    assert f"resuming from the checkpoint of step {restored_step}" in second_log
    assert second.steps()[0] == restored_step + 1 and second.steps()[-1] == STEPS

    status = wait_terminal(chart.api, chart.jobs_ns, name)
    assert (status["phase"], status["restarts"], status["attempt"]) == ("Succeeded", 1, 1)
    assert status["progress"]["durableCheckpointStep"] == STEPS
    wait_until(lambda: not live_rayclusters(chart.api, chart.jobs_ns, name), "RayCluster deleted (onSuccess)")

    # The pods are gone: `asyncgrpo logs` reads the newest attempt's whole log from the bucket, to
    # its last line (the run's summary is written after the checkpoint mirror's last upload). The
    # summary is the last JSON line; a stderr line may land after it, stdout and stderr being two
    # pipes copied into the log by two threads.
    newest = stored_logs(chart, name)
    assert newest.returncode == 0, newest.stderr
    assert "is Succeeded: DriverSucceeded" in newest.stderr and "(attempt 1)" in newest.stderr, newest.stderr
    assert newest.stdout == local_driver_log(kubelet, second, 1).read_text(), newest.stdout[-2000:]
    assert f"resuming from the checkpoint of step {restored_step}" in newest.stdout
    json_lines = [line for line in newest.stdout.splitlines() if line.startswith("{")]
    assert json_lines[-1].startswith('{"event": "summary"'), newest.stdout[-2000:]

    # The killed attempt's log too: what it wrote up to its last durable checkpoint is there, the
    # log being uploaded before each checkpoint's manifest, however long the log interval.
    killed = stored_logs(chart, name, "--attempt", "0")
    assert killed.returncode == 0, killed.stderr
    assert "(attempt 0)" in killed.stderr, killed.stderr
    local = local_driver_log(kubelet, first, 0).read_text()
    assert local.startswith(killed.stdout), "the stored log is not the start of the attempt's own log"
    durable_before_resumed = [int(s) for s in DURABLE.findall(local) if int(s) < restored_step]
    assert set(durable_before_resumed) <= {int(s) for s in DURABLE.findall(killed.stdout)}
    assert logged_steps(killed.stdout) and '"event": "summary"' not in killed.stdout

    missing = stored_logs(chart, name, "--attempt", "2")
    assert missing.returncode == 1 and "has no attempt 2: its attempts so far are 0 to 1" in missing.stderr
    print(
        f"run {run}: {time.monotonic() - started:.0f} s; resumed from {restored_step}; steps {watch.steps()}"
    )


@pytest.mark.parametrize("run", range(RUNS))
def test_an_operator_restarted_while_the_driver_uploads_loses_nothing_and_shows_the_durable_step(
    chart: Installation, kubelet: DriverKubelet, s3_server: S3Server, bucket: str, run: int
) -> None:
    """The uploads are the driver's; the operator only reports them. Stopped while checkpoints keep
    becoming durable and started again, it reads the driver's durable step afresh and the job ends
    with every step durable, nothing lost in the bucket."""
    name = f"s3-operator-{run}"
    create_key_secret(chart)
    store = Store(store_config(s3_server, bucket, root=f"runs/{chart.jobs_ns}/{name}"))
    seen_while_down: list[int] = []

    def restart_operator_mid_upload(driver: LocalDriver, watch: AgjWatch) -> None:
        before = wait_for_progress(chart, watch, driver, DURABLE_FIELD, 4)
        chart.stop_operator()
        try:
            # The driver goes on uploading while no operator watches: a newer complete checkpoint.
            def newer() -> int | None:
                if not driver.running():
                    return -1
                step = newest_complete(store)
                return step if step > before else None

            reached = wait_until(newer, "a newer durable checkpoint while the operator is down", timeout=120)
            assert reached > 0, "the driver exited before a newer checkpoint became durable"
            seen_while_down.append(reached)
        finally:
            chart.start_operator()
        wait_for_progress(chart, watch, driver, DURABLE_FIELD, seen_while_down[-1])

    watch, runs = run_job(
        chart, kubelet, object_store_job(chart, name, s3_server, bucket), restart_operator_mid_upload
    )
    assert [code for _, code in runs] == [0]
    status = wait_terminal(chart.api, chart.jobs_ns, name)
    assert (status["phase"], status["restarts"]) == ("Succeeded", 0)
    assert status["progress"]["durableCheckpointStep"] == STEPS
    complete = sorted(c.step for c in durable_checkpoints.complete_checkpoints(store))
    assert complete[-1] == STEPS and len(complete) <= 2, complete  # keepLast: 2
    assert seen_while_down and seen_while_down[0] < STEPS
    durable_column = [r.line for r in watch.rows]
    print(
        f"run {run}: durable while the operator was down {seen_while_down}; last rows {durable_column[-3:]}"
    )
