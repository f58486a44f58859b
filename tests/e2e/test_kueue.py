"""Jobs queued by real Kueue (v0.17, ray.io/raycluster integration) with the real KubeRay operator.

Kueue is an optional component of the local control plane: the `kueue` fixture builds it once
(a few minutes cold; CI pays that here, the demo never does) and starts it on the running cluster.
Each test gets its own ClusterQueue whose GPU quota fits exactly one job (each job asks for two
1-GPU workers), and a LocalQueue in its namespace. The driver is played as in test_operator.py:
its /progress is served from the test process and its exit is written into the head pod's status.

These are slow (Kueue admission, preemption and KubeRay's pod churn, twice per test), so they
are marked `slow` as well as `cluster`; CI runs them.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import kueue
from tests.cluster.build import build_optional
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, raycluster_path, wait_until
from tests.e2e import test_operator
from tests.e2e.test_operator import (
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    end_driver,
    get_job,
    head_pod,
    job_manifest,
    operator,  # noqa: F401 - the fixture, reused
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

driver_progress = test_operator.driver_progress  # the fixture the operator fixture reads, reused

LOCAL_QUEUE = "team-a"
GPUS_PER_JOB = 2


@pytest.fixture(scope="session")
def kueue_on(local_cluster: LocalCluster) -> LocalCluster:
    """Kueue running on the session's control plane (built on first use)."""
    local_cluster.start_kueue(build_optional("kueue"))
    return local_cluster


@pytest.fixture
def queue(kueue_on: LocalCluster, kube_api: Api, namespace: str) -> Iterator[str]:
    """A ClusterQueue that fits one job, and LocalQueue team-a in the test's namespace."""
    name = f"cq-{namespace[-20:]}-{secrets.token_hex(2)}"
    kueue.apply_cluster_queue(kube_api, kueue.cluster_queue(name, gpus=GPUS_PER_JOB))
    wait_until(lambda: kueue.cluster_queue_active(kube_api, name) or None, f"ClusterQueue {name} Active")
    kueue.create_local_queue(kube_api, namespace, LOCAL_QUEUE, name)
    yield name
    try:
        kube_api.delete(f"{kueue.BASE}/clusterqueues/{name}")
    except ApiError as err:
        if err.status != 404:
            raise


@pytest.fixture
def priorities(kube_api: Api, namespace: str, queue: str) -> Iterator[tuple[str, str]]:
    """Two PriorityClasses (low, high) for this test; Kueue preempts by the pods' priority."""
    names = (f"{namespace[-30:]}-low", f"{namespace[-30:]}-high")
    for name, value in zip(names, (100, 1000), strict=True):
        kube_api.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    yield names
    for name in names:
        kube_api.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def queued_job(name: str, **spec: Any) -> JSON:
    manifest = job_manifest(name, **spec)
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: LOCAL_QUEUE}
    return manifest


def cluster_of(api: Api, ns: str, job: str) -> JSON:
    name = get_job(api, ns, job)["status"]["rayClusterName"]
    return api.get(f"{raycluster_path(ns)}/{name}")


def running(api: Api, ns: str, job: str, progress: ProgressServer) -> JSON:
    progress.doc = {"step": 3, "maxSteps": 20, "policyVersion": 3, "rewardMean": 0.25, "state": "running"}
    return wait_phase(api, ns, job, "Running", timeout=120)


def asyncgrpo_logs(kubeconfig: Path, ns: str, job: str) -> str:
    """`asyncgrpo logs JOB -n NS`, as a user runs it (never while a head pod exists: kwok's fake
    nodes serve no container logs, and the API server would dial their made-up addresses)."""
    cli = Path(sys.executable).with_name("asyncgrpo")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.run(
        [str(cli), "logs", job, "-n", ns], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def finish(api: Api, ns: str, job: str) -> JSON:
    """End the job's driver with exit code 0 and wait for Succeeded."""
    cluster = get_job(api, ns, job)["status"]["rayClusterName"]
    end_driver(api, ns, head_pod(api, ns, cluster), 0)
    return wait_phase(api, ns, job, "Succeeded", timeout=90)


@pytest.mark.usefixtures("operator")
def test_two_jobs_for_one_jobs_quota_run_one_after_the_other_and_neither_fails(
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    queue: str,
    driver_progress: ProgressServer,
) -> None:
    create_job(kube_api, namespace, queued_job("first"))
    running(kube_api, namespace, "first", driver_progress)
    create_job(kube_api, namespace, queued_job("second"))

    wait_phase(kube_api, namespace, "second", "Queued", "Pending", timeout=60)

    def kueues_reason() -> JSON | None:  # Kueue writes its reason into the Workload a moment later
        status: JSON = get_job(kube_api, namespace, "second")["status"]
        return status if "insufficient" in status.get("message", "") else None

    waiting = wait_until(kueues_reason, "Kueue's reason in the Queued job's message", timeout=60)
    assert waiting["phase"] == "Queued" and "nvidia.com/gpu" in waiting["message"], waiting
    assert waiting.get("attemptStartTime") is None  # no startup deadline while queued
    second = cluster_of(kube_api, namespace, "second")
    assert second["spec"]["suspend"] is True
    assert second["metadata"]["labels"][kueue.QUEUE_LABEL] == LOCAL_QUEUE
    assert not pods(kube_api, namespace, f"ray.io/cluster={second['metadata']['name']}")
    assert "second is Queued: Pending; its driver has not started yet" in asyncgrpo_logs(
        kubeconfig, namespace, "second"
    )

    done = finish(kube_api, namespace, "first")
    assert done["restarts"] == 0
    first_cluster = done["rayClusterName"]
    wait_until(
        lambda: not pods(kube_api, namespace, f"ray.io/cluster={first_cluster}") or None, "first's pods gone"
    )
    shown = asyncgrpo_logs(kubeconfig, namespace, "first")
    assert "/checkpoints/logs/driver-attempt-0.log" in shown and "emptyDir" in shown, shown
    status = running(kube_api, namespace, "second", driver_progress)
    queued = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert queued["status"] == "False" and queued["reason"] == "Admitted"
    assert status["attemptStartTime"] >= queued["lastTransitionTime"]  # the deadline runs from admission
    done = finish(kube_api, namespace, "second")
    assert done["restarts"] == 0 and done["attempt"] == 0


@pytest.mark.usefixtures("operator")
def test_a_higher_priority_job_preempts_and_the_preempted_job_resumes_without_a_retry(
    kube_api: Api,
    namespace: str,
    priorities: tuple[str, str],
    driver_progress: ProgressServer,
) -> None:
    low, high = priorities
    create_job(kube_api, namespace, queued_job("low", scheduler={"priorityClassName": low}))
    running(kube_api, namespace, "low", driver_progress)
    cluster = get_job(kube_api, namespace, "low")["status"]["rayClusterName"]
    first_head = head_pod(kube_api, namespace, cluster)["metadata"]["name"]

    create_job(kube_api, namespace, queued_job("high", scheduler={"priorityClassName": high}))
    preempted = wait_phase(kube_api, namespace, "low", "Queued", "Preempted", timeout=90)
    assert preempted["restarts"] == 0 and preempted["attempt"] == 0
    assert preempted["rayClusterName"] == cluster  # the same RayCluster waits; nothing was deleted
    running(kube_api, namespace, "high", driver_progress)

    finish(kube_api, namespace, "high")
    resumed = running(kube_api, namespace, "low", driver_progress)
    assert resumed["restarts"] == 0 and resumed["attempt"] == 0 and resumed["rayClusterName"] == cluster
    assert head_pod(kube_api, namespace, cluster)["metadata"]["name"] != first_head  # a new driver started
    done = finish(kube_api, namespace, "low")
    assert done["restarts"] == 0
    assert get_job(kube_api, namespace, "high")["status"]["phase"] == "Succeeded"
