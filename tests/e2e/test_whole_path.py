"""The mission's whole path: helm install, kubectl apply, the driver trains, kubectl get, Succeeded.

Everything is real except the container runtime: the chart installed by helm (URL-mode webhook on
127.0.0.1), the operator as a local process authenticated as the chart's ServiceAccount, the API
server, KubeRay creating the head pod, kwok binding it, and the trainer: the head pod's driver
container, read back from the pod and its ConfigMap and run here as a process with an embedded
Ray (tests/e2e/whole_path.py lists every translation). The operator polls the driver's real
/progress, and the driver's real exit code is written into the pod's status as a kubelet would.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from asyncgrpo_api import exitcodes
from tests.cluster import kueue
from tests.cluster.build import build_optional
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import ApiError
from tests.cluster.samples import wait_until
from tests.e2e.test_operator import end_driver, live_rayclusters
from tests.e2e.whole_path import (
    AgjWatch,
    DriverKubelet,
    LocalDriver,
    job_status,
    tiny_job,
    wait_terminal,
    wait_with_watch,
)
from tests.e2e.whole_path_fixtures import SCENARIO_TIMEOUT, STEPS, apply, run_job, show, wait_for_progress
from tests.webhook.cluster_harness import Installation

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.trainer]


def test_a_job_trains_to_succeeded_with_step_and_reward_in_kubectl_get(
    chart: Installation, kubelet: DriverKubelet
) -> None:
    ns, name = chart.jobs_ns, "whole-path"
    started = time.monotonic()
    watch, runs = run_job(chart, kubelet, tiny_job(name, max_steps=STEPS))
    assert [code for _, code in runs] == [0]
    driver = runs[0][0]
    # What the driver ran is the pod's command, with only the documented translations.
    assert driver.argv[:2] == ["/bin/bash", "-c"]
    assert driver.argv[2].startswith("exec python -m asyncgrpo_trainer --job-spec ")
    assert driver.env_changes["ASYNCGRPO_JOB_NAME"] == name
    assert driver.env_changes["ASYNCGRPO_ATTEMPT"] == "0"

    status = wait_terminal(chart.api, ns, name)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Succeeded", "DriverSucceeded", 0)
    assert status["progress"]["step"] == STEPS and status["progress"]["lastCheckpointStep"] == STEPS
    # kubectl get showed the job running with its step and reward advancing.
    steps = watch.steps()
    assert len(set(steps)) >= 3 and steps == sorted(steps), [r.line for r in watch.rows]
    assert any(r.phase == "Running" and r.reward is not None for r in watch.rows)
    assert watch.rows[-1].phase == "Succeeded" and watch.rows[-1].step == STEPS
    # cleanupPolicy.onSuccess: DeleteCluster
    wait_until(lambda: not live_rayclusters(chart.api, ns, name), "RayCluster deleted (onSuccess)")
    print(f"scenario 1: {time.monotonic() - started:.0f} s; rewards {watch.rewards()}")


@pytest.mark.budget(360, "two attempts of a training driver, the second from the first's checkpoint")
def test_a_killed_driver_is_retried_and_the_next_attempt_resumes_from_the_checkpoint(
    chart: Installation, kubelet: DriverKubelet
) -> None:
    ns, name = chart.jobs_ns, "whole-path-retry"
    started = time.monotonic()

    def kill_after_a_checkpoint(driver: LocalDriver, watch: AgjWatch) -> None:
        """SIGKILL the first attempt's container once the job's status shows a checkpoint at step 8
        or later (the operator has read it from /progress, as a user would see it)."""
        if driver.cluster != f"{name}-0":
            return
        wait_for_progress(chart, watch, driver, "lastCheckpointStep", 8)
        driver.kill(signal.SIGKILL)

    watch, runs = run_job(chart, kubelet, tiny_job(name, max_steps=STEPS), kill_after_a_checkpoint)
    assert [(d.cluster, code) for d, code in runs] == [(f"{name}-0", 137), (f"{name}-1", 0)]
    first, second = runs[0][0], runs[1][0]
    assert second.env_changes["ASYNCGRPO_ATTEMPT"] == "1"
    resumed = second.steps()
    # The second attempt continued from a checkpoint the first one wrote (step 8 or later), not from
    # step 1. (The first attempt's log cannot bound it from above: the driver logs the steps it
    # polls from the controller actor, which may have trained and checkpointed a few more before
    # the SIGKILL.)
    assert resumed and resumed[0] > 8, (first.steps(), resumed)
    assert resumed[0] % 4 == 1 and resumed[-1] == STEPS
    assert f"resuming from the checkpoint of step {resumed[0] - 1}" in second.log.read_text()
    # kubectl get's STEP (docs/guides/job-lifecycle.md, "Retries"): the restart shows the newest
    # checkpoint the operator saw (8 or later, never 0, never a step trained after it), and from
    # then on STEP never steps back: the second attempt resumes from that checkpoint or a later one.
    after = [r.step for r in watch.rows if r.restarts == 1 and r.step is not None]
    lines = [r.line for r in watch.rows]
    assert after and 8 <= after[0] <= resumed[0] - 1 and after[0] % 4 == 0, lines
    assert after == sorted(after), lines

    status = wait_terminal(chart.api, ns, name)
    assert (status["phase"], status["restarts"], status["attempt"]) == ("Succeeded", 1, 1)
    assert any(r.phase == "Restarting" or r.restarts == 1 for r in watch.rows)
    assert watch.rows[-1].restarts == 1
    wait_until(lambda: not live_rayclusters(chart.api, ns, name), "RayCluster deleted (onSuccess)")
    print(f"scenario 2: {time.monotonic() - started:.0f} s; steps {watch.steps()}")


def test_a_job_whose_data_file_is_missing_fails_with_invalid_data_naming_it_and_is_not_retried(
    chart: Installation, kubelet: DriverKubelet
) -> None:
    ns, name = chart.jobs_ns, "whole-path-error"
    started = time.monotonic()
    manifest = tiny_job(name, data={"trainPath": "/checkpoints/prompts/missing.jsonl"})
    _, runs = run_job(chart, kubelet, manifest)
    assert [code for _, code in runs] == [exitcodes.INVALID_DATA]
    status = wait_terminal(chart.api, ns, name)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Failed", "InvalidData", 0)
    # (the harness mounts the pod's /checkpoints volume from a host directory: whole_path.py)
    assert "InvalidDataError: data.trainPath: " in status["message"], status["message"]
    assert "prompts/missing.jsonl does not exist" in status["message"], status["message"]
    time.sleep(3)
    assert live_rayclusters(chart.api, ns, name) == [f"{name}-0"]  # onFailure: KeepCluster, no retry
    print(f"scenario 3: {time.monotonic() - started:.0f} s; message {status['message'][:200]!r}")


@pytest.fixture
def kueue_queue(local_cluster: LocalCluster, chart: Installation) -> Iterator[tuple[str, str]]:
    """Kueue on the control plane, a ClusterQueue with CPU for exactly one tiny job (3 pods of 1
    CPU), LocalQueue team-a in the jobs' namespace, and two PriorityClasses (low, high)."""
    local_cluster.start_kueue(build_optional("kueue"))
    api, name = chart.api, f"cq-whole-path-{secrets.token_hex(2)}"
    kueue.apply_resource_flavor(api, kueue.resource_flavor())
    queue = {
        "apiVersion": kueue.API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": kueue.FLAVOR, "resources": [{"name": "cpu", "nominalQuota": "3"}]}],
                }
            ],
        },
    }
    kueue.apply_cluster_queue(api, queue)
    wait_until(lambda: kueue.cluster_queue_active(api, name) or None, f"ClusterQueue {name} Active")
    kueue.create_local_queue(api, chart.jobs_ns, "team-a", name)
    classes = (f"whole-path-low-{secrets.token_hex(2)}", f"whole-path-high-{secrets.token_hex(2)}")
    for cls, value in zip(classes, (100, 1000), strict=True):
        api.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": cls},
                "value": value,
            },
        )
    yield classes
    for cls in classes:
        api.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{cls}")
    api.delete(f"{kueue.BASE}/clusterqueues/{name}")


def queued_tiny_job(name: str, priority_class: str, max_steps: int) -> dict[str, Any]:
    manifest = tiny_job(name, max_steps=max_steps)
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    manifest["spec"]["scheduler"] = {"priorityClassName": priority_class}
    manifest["spec"]["checkpoint"]["everySteps"] = 1000  # only the preemption's checkpoint can save the run
    for pool in ("head", "policyWorkers", "generationWorkers"):
        manifest["spec"]["cluster"][pool]["resources"] = {"requests": {"cpu": "1"}}
    return manifest


@pytest.mark.budget(600, "a driver held until KubeRay deletes its pod, then resumed: preemption end to end")
def test_a_preempted_job_checkpoints_on_sigterm_and_resumes_without_a_lost_or_repeated_step(
    chart: Installation, kubelet: DriverKubelet, kueue_queue: tuple[str, str]
) -> None:
    """Real Kueue preempts the running low-priority job for a high-priority one: KubeRay deletes the
    head pod, the kubelet (played here) sends its driver container SIGTERM, the driver checkpoints the
    step it reached and exits 143; readmitted, the same RayCluster's new driver resumes right after it."""
    low, high = kueue_queue
    ns, steps = chart.jobs_ns, 800  # about 12 steps/s here: long enough to be preempted mid-run
    started = time.monotonic()
    apply(chart, queued_tiny_job("preemptible", low, steps))
    watch = AgjWatch(chart.kubectl, ns, "preemptible", every=0.5)
    pod = kubelet.head_pod(ns, "preemptible-0", timeout=120)
    first = kubelet.start(pod, job="preemptible")
    drivers = [first]
    try:
        wait_for_progress(chart, watch, first, "step", 3)
        # Held still until KubeRay deletes its pod, so that the preemption, at any load, comes
        # before the job's last step: in a clean-clone run at load 17-50 the driver was gone by
        # the time Kueue had preempted it, and the SIGTERM found no process.
        assert first.running(), first.log_tail()
        os.kill(first.process.pid, signal.SIGSTOP)
        apply(chart, queued_tiny_job("urgent", high, steps))

        def head_deleted() -> bool:
            try:
                found = chart.api.get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
            except ApiError as err:
                return err.status == 404
            return bool(found["metadata"].get("deletionTimestamp"))

        wait_with_watch(watch, head_deleted, "KubeRay deleting the preempted head pod", timeout=120)
        # The driver container only: the Ray containers wait (preStop).
        os.kill(first.process.pid, signal.SIGTERM)
        os.kill(first.process.pid, signal.SIGCONT)  # the SIGTERM is delivered as it wakes
        code = first.wait(timeout=SCENARIO_TIMEOUT)
        show(first)
        assert code == 128 + signal.SIGTERM, first.log_tail()
        reached = first.steps()[-1]
        preempted = job_status(chart.api, ns, "preemptible")
        assert preempted["phase"] == "Queued" and preempted["restarts"] == 0, preempted

        urgent_head = kubelet.head_pod(ns, "urgent-0", timeout=120)  # kwok "runs" it; its driver is played
        end_driver(chart.api, ns, urgent_head, 0)
        wait_terminal(chart.api, ns, "urgent", timeout=120)

        again = kubelet.head_pod(ns, "preemptible-0", timeout=180)  # readmitted: the same RayCluster
        assert again["metadata"]["name"] != pod["metadata"]["name"]
        second = kubelet.start(again, job="preemptible")
        drivers.append(second)
        wait_with_watch(watch, lambda: not second.running(), "the resumed driver", timeout=SCENARIO_TIMEOUT)
        code = second.wait(timeout=10)
        show(second)
        assert code == 0
        kubelet.report_exit(second, code)
        status = wait_terminal(chart.api, ns, "preemptible", timeout=120)
        assert (status["phase"], status["restarts"], status["attempt"]) == ("Succeeded", 0, 0)
        resumed = second.steps()
        assert resumed[0] == reached + 1 and resumed[-1] == steps, (first.steps(), resumed)
        assert f"resuming from the checkpoint of step {reached}" in second.log.read_text()
        volume = kubelet.root / "node" / "var" / "lib" / "asyncgrpo" / "preemptible"
        records = [json.loads(line) for line in (volume / "logs" / "steps.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["event"] == "step"] == list(range(1, steps + 1))
    finally:
        for driver in drivers:  # a failed assertion must not leave a driver and its Ray running
            driver.kill(signal.SIGKILL)
            driver.wait(timeout=30)
    print(f"scenario preemption: {time.monotonic() - started:.0f} s; preempted after step {reached}")
