"""The mission's whole path: helm install, kubectl apply, the driver trains, kubectl get, Succeeded.

Everything is real except the container runtime: the chart installed by helm (URL-mode webhook on
127.0.0.1), the operator as a local process authenticated as the chart's ServiceAccount, the API
server, KubeRay creating the head pod, kwok binding it, and the trainer: the head pod's driver
container, read back from the pod and its ConfigMap and run here as a process with an embedded
Ray (tests/e2e/whole_path.py lists every translation). The operator polls the driver's real
/progress, and the driver's real exit code is written into the pod's status as a kubelet would.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_api import exitcodes
from tests.chart.helm import NO_HELM, find_helm
from tests.cluster.cluster import LocalCluster
from tests.cluster.samples import wait_until
from tests.e2e.test_operator import live_rayclusters
from tests.e2e.whole_path import (
    AgjWatch,
    DriverKubelet,
    LocalDriver,
    drive,
    tiny_job,
    wait_terminal,
    wait_with_watch,
)
from tests.webhook.cluster_harness import Installation, running_chart

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.trainer]

SCENARIO_TIMEOUT = 600.0  # generous: the driver's Ray start-up alone takes 20-70 s on 2 busy cores
STEPS = 120  # long enough that a 1 s progress poll sees several steps even on an idle machine


@pytest.fixture(scope="module")
def chart(local_cluster: LocalCluster) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    with running_chart(local_cluster, helm_bin) as installation:
        yield installation


@pytest.fixture
def kubelet(chart: Installation, tmp_path: Path) -> DriverKubelet:
    return DriverKubelet(chart.api, chart.kubectl, tmp_path)


def apply(chart: Installation, manifest: dict[str, object]) -> None:
    outcome = chart.kubectl.apply(chart.jobs_ns, manifest)
    assert outcome.returncode == 0, outcome.stderr
    assert "created" in outcome.stdout, outcome.stdout


def driver_progress(driver: LocalDriver) -> dict[str, Any]:
    """The driver's own /progress ({} until it serves)."""
    try:
        with urllib.request.urlopen(driver.progress_url, timeout=2) as response:
            doc: dict[str, Any] = json.loads(response.read())
            return doc
    except OSError:
        return {}


def show(driver: LocalDriver) -> None:
    """Shown only when the test fails (captured output)."""
    sys.stdout.write(f"\n--- {driver.pod} driver log ({driver.log}) ---\n{driver.log_tail(15)}\n")


def run_job(
    chart: Installation,
    kubelet: DriverKubelet,
    manifest: dict[str, Any],
    on_start: Callable[[LocalDriver, AgjWatch], None] | None = None,
) -> tuple[AgjWatch, list[tuple[LocalDriver, int]]]:
    """kubectl apply the job, run every attempt's driver until the job is terminal while watching
    `kubectl get agj` (`on_start` sees each driver as it starts); returns the watch and (driver,
    exit code) per attempt (their logs are shown when the test fails)."""
    apply(chart, manifest)
    watch = AgjWatch(chart.kubectl, chart.jobs_ns, manifest["metadata"]["name"], every=0.5)
    started = None if on_start is None else (lambda driver: on_start(driver, watch))
    runs = list(drive(kubelet, watch, timeout=SCENARIO_TIMEOUT, on_start=started))
    for driver, _ in runs:
        show(driver)
    return watch, runs


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


def test_a_killed_driver_is_retried_and_the_next_attempt_resumes_from_the_checkpoint(
    chart: Installation, kubelet: DriverKubelet
) -> None:
    ns, name = chart.jobs_ns, "whole-path-retry"
    started = time.monotonic()

    def kill_after_a_checkpoint(driver: LocalDriver, watch: AgjWatch) -> None:
        """SIGKILL the first attempt's container once its /progress reports the step-8 checkpoint
        (read from the driver itself: the steps are faster than the operator's 1 s poll)."""
        if driver.cluster != f"{name}-0":
            return
        wait_with_watch(
            watch,
            lambda: (driver_progress(driver).get("lastCheckpointStep") or 0) >= 8,
            "a checkpoint at step 8",
            timeout=SCENARIO_TIMEOUT,
            interval=0.1,
        )
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
    # After the restart, kubectl get's STEP never fell back to 0 while the new driver started: it
    # kept the last step read from the first attempt (if any), then went on from the checkpoint.
    after = [r.step for r in watch.rows if r.restarts == 1 and r.step is not None]
    # It may step back once, to where the second attempt resumed (steps past the checkpoint are
    # trained again), and only forward after that.
    assert after and 0 not in after, [r.line for r in watch.rows]
    drops = [(a, b) for a, b in itertools.pairwise(after) if b < a]
    assert len(drops) <= 1 and all(b >= resumed[0] for _, b in drops), [r.line for r in watch.rows]

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
