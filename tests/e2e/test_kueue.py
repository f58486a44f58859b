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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import faults, kueue
from tests.cluster.build import build_optional
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, raycluster_path, wait_until
from tests.e2e import test_operator
from tests.e2e.test_operator import (
    JOBS,
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
QUEUED_LONGER_THAN = 20
"""Seconds: the second job's deadlines, shorter than it waits in the queue."""
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


def workload_of(api: Api, ns: str, job: str) -> JSON:
    """The job's own Workload (its controller ownerReference is the job)."""
    uid = get_job(api, ns, job)["metadata"]["uid"]

    def found() -> JSON | None:
        items = api.get(
            f"{kueue.BASE}/namespaces/{ns}/workloads", labelSelector=f"kueue.x-k8s.io/job-uid={uid}"
        )
        return items["items"][0] if items["items"] else None

    wl: JSON = wait_until(found, f"the Workload of {job}", timeout=30)
    assert (
        wl["metadata"]["ownerReferences"][0]["uid"] == uid
        and wl["metadata"]["ownerReferences"][0]["controller"]
    )
    return wl


def wl_condition(wl: JSON, type_: str) -> JSON | None:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def clusters_of(api: Api, ns: str, job: str) -> list[JSON]:
    items: list[JSON] = api.get(raycluster_path(ns), labelSelector=f"asyncgrpo.dev/job-name={job}")["items"]
    return items


def running(api: Api, ns: str, job: str, progress: ProgressServer, step: int = 3) -> JSON:
    progress.doc = {
        "step": step,
        "maxSteps": 20,
        "policyVersion": step,
        "rewardMean": 0.25,
        "state": "running",
    }
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
    first_wl = workload_of(kube_api, namespace, "first")
    assert get_job(kube_api, namespace, "first")["status"]["workloadName"] == first_wl["metadata"]["name"]
    assert [(s["name"], s["count"]) for s in first_wl["spec"]["podSets"]] == [
        ("head", 1),
        ("policy", 1),
        ("generation", 1),
    ]
    assert get_job(kube_api, namespace, "first")["spec"]["suspend"] is False  # admission unsuspended it
    # Both of second's clocks are shorter than its wait in the queue: neither may run while it waits.
    clocks = {"activeDeadlineSeconds": QUEUED_LONGER_THAN, "startupDeadlineSeconds": QUEUED_LONGER_THAN}
    create_job(kube_api, namespace, queued_job("second", **clocks))
    queued_since = time.monotonic()

    wait_phase(kube_api, namespace, "second", "Queued", timeout=60)

    def kueues_reason() -> JSON | None:  # Kueue writes its reason into the Workload a moment later
        status: JSON = get_job(kube_api, namespace, "second")["status"]
        return status if "insufficient" in status.get("message", "") else None

    waiting = wait_until(kueues_reason, "Kueue's reason in the Queued job's message", timeout=60)
    assert (
        waiting["phase"] == "Queued"
        and waiting["reason"] == "Pending"
        and "nvidia.com/gpu" in waiting["message"]
    )
    assert waiting.get("attemptStartTime") is None  # no startup deadline while queued
    second = get_job(kube_api, namespace, "second")
    assert second["spec"]["suspend"] is True  # the operator holds a job Kueue has not admitted
    assert not clusters_of(kube_api, namespace, "second")  # no RayCluster, no pod before admission
    assert "second is Queued: Pending; its driver has not started yet" in asyncgrpo_logs(
        kubeconfig, namespace, "second"
    )

    time.sleep(max(QUEUED_LONGER_THAN + 2 - (time.monotonic() - queued_since), 0))
    assert get_job(kube_api, namespace, "second")["status"]["phase"] == "Queued"  # not DeadlineExceeded
    # Both clocks start at admission; give the run after it room on a loaded machine (deadlines may
    # change at any time).
    kube_api.merge_patch(
        f"{JOBS.format(ns=namespace)}/second",
        {"spec": {"activeDeadlineSeconds": 3600, "startupDeadlineSeconds": 3600}},
    )
    done = finish(kube_api, namespace, "first")
    assert done["restarts"] == 0
    finished = wait_until(
        lambda: wl_condition(workload_of(kube_api, namespace, "first"), "Finished"),
        "first's Workload Finished",
    )
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
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
    ready = wait_until(
        lambda: wl_condition(workload_of(kube_api, namespace, "second"), "PodsReady"), "PodsReady reported"
    )
    assert ready["status"] == "True"
    done = finish(kube_api, namespace, "second")
    assert done["restarts"] == 0 and done["attempt"] == 0


@pytest.mark.usefixtures("operator")
def test_admission_puts_the_flavors_into_the_pods_and_a_retry_keeps_the_admission(
    kube_api: Api, namespace: str, kueue_on: LocalCluster, driver_progress: ProgressServer
) -> None:
    """The GPU pools ask for no node and tolerate no taint: only the flavor Kueue assigns them
    (nodeLabels nvidia.com/gpu.present, the GPU taint's toleration) gets them onto the GPU nodes."""
    gpu_flavor = "asyncgrpo-e2e-gpu"
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    kueue.apply_resource_flavor(
        kube_api, kueue.resource_flavor(gpu_flavor, {"nvidia.com/gpu.present": "true"}, [toleration])
    )
    kueue.apply_resource_flavor(kube_api, kueue.resource_flavor())
    name = f"cq-{namespace[-20:]}-{secrets.token_hex(2)}"
    kueue.apply_cluster_queue(kube_api, kueue.cluster_queue(name, gpus=GPUS_PER_JOB, gpu_flavor=gpu_flavor))
    wait_until(lambda: kueue.cluster_queue_active(kube_api, name) or None, f"ClusterQueue {name} Active")
    kueue.create_local_queue(kube_api, namespace, LOCAL_QUEUE, name)
    try:
        bare = {"replicas": 1, "gpusPerReplica": 1, "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
        manifest = queued_job("flavored")
        for pool in ("policyWorkers", "generationWorkers"):
            manifest["spec"]["cluster"][pool] = dict(bare)
        create_job(kube_api, namespace, manifest)
        running(kube_api, namespace, "flavored", driver_progress)
        cluster = get_job(kube_api, namespace, "flavored")["status"]["rayClusterName"]
        workers = [
            p
            for p in pods(kube_api, namespace, f"ray.io/cluster={cluster}")
            if p["metadata"]["labels"].get("ray.io/node-type") == "worker"
        ]
        assert len(workers) == 2
        for worker in workers:
            assert worker["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "true"
            assert toleration in worker["spec"]["tolerations"]
            assert worker["spec"]["nodeName"].startswith("kwok-gpu-")
            assert worker["metadata"]["labels"]["kueue.x-k8s.io/podset"] in ("policy", "generation")

        # A retry keeps the Workload, its admission and so its place: attempt 1 starts at once.
        admitted = workload_of(kube_api, namespace, "flavored")
        faults.fail_pod(
            kube_api, namespace, head_pod(kube_api, namespace, cluster)["metadata"]["name"], exit_code=137
        )

        def retried() -> JSON | None:
            status: JSON = get_job(kube_api, namespace, "flavored")["status"]
            return status if status.get("restarts") == 1 and status.get("phase") == "Running" else None

        status = wait_until(retried, "flavored running its attempt 1", timeout=90)
        assert (status["attempt"], status["rayClusterName"]) == (1, "flavored-1")
        again = workload_of(kube_api, namespace, "flavored")
        assert again["metadata"]["uid"] == admitted["metadata"]["uid"]
        assert (wl_condition(again, "Admitted") or {}).get("lastTransitionTime") == (
            wl_condition(admitted, "Admitted") or {}
        ).get("lastTransitionTime")  # never requeued
        workers = [
            p
            for p in pods(kube_api, namespace, "ray.io/cluster=flavored-1")
            if p["metadata"]["labels"].get("ray.io/node-type") == "worker"
        ]
        assert workers and all(toleration in w["spec"]["tolerations"] for w in workers)
        finish(kube_api, namespace, "flavored")
    finally:
        kube_api.delete(f"{kueue.BASE}/clusterqueues/{name}")


@pytest.mark.usefixtures("operator")
def test_a_higher_priority_job_preempts_and_the_preempted_job_resumes_in_place_without_a_retry(
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
    low_wl = workload_of(kube_api, namespace, "low")
    assert low_wl["spec"]["priority"] == 100

    create_job(kube_api, namespace, queued_job("high", scheduler={"priorityClassName": high}))
    preempted = wait_phase(kube_api, namespace, "low", "Queued", "Preempted", timeout=90)
    assert preempted["restarts"] == 0 and preempted["attempt"] == 0
    assert preempted["rayClusterName"] == cluster  # the same RayCluster waits, suspended in place
    # The status is written first, then the RayCluster and the job are suspended (same pass).
    wait_until(
        lambda: kube_api.get(f"{raycluster_path(namespace)}/{cluster}")["spec"].get("suspend") or None,
        "the RayCluster suspended in place",
    )
    wait_until(lambda: get_job(kube_api, namespace, "low")["spec"].get("suspend") or None, "low suspended")
    requeued = wait_phase(kube_api, namespace, "low", "Queued", "Requeued", timeout=90)
    assert requeued["restarts"] == 0
    again = workload_of(kube_api, namespace, "low")
    assert again["metadata"]["uid"] == low_wl["metadata"]["uid"]  # the same Workload, its queue place kept
    assert (wl_condition(again, "Requeued") or {}).get("status") == "True"
    running(kube_api, namespace, "high", driver_progress)

    finish(kube_api, namespace, "high")
    resumed = running(kube_api, namespace, "low", driver_progress)
    assert resumed["restarts"] == 0 and resumed["attempt"] == 0 and resumed["rayClusterName"] == cluster
    assert head_pod(kube_api, namespace, cluster)["metadata"]["name"] != first_head  # a new driver started
    done = finish(kube_api, namespace, "low")
    assert done["restarts"] == 0
    assert get_job(kube_api, namespace, "high")["status"]["phase"] == "Succeeded"


@pytest.mark.usefixtures("operator")
def test_pods_that_do_not_become_ready_in_time_are_evicted_and_requeued_not_failed(
    kube_api: Api, namespace: str, queue: str
) -> None:
    """Kueue's waitForPodsReady (timeout tests.cluster.kueue.PODS_READY_TIMEOUT_SECONDS): the
    generation worker asks for a node pool that does not exist, so it never becomes ready."""
    create_job(
        kube_api,
        namespace,
        queued_job(
            "never-ready", cluster={"generationWorkers": {"nodeSelector": {"asyncgrpo.dev/pool": "nowhere"}}}
        ),
    )
    wait_phase(kube_api, namespace, "never-ready", "Pending", "Unschedulable", timeout=60)
    evicted = wait_until(
        lambda: (
            (
                get_job(kube_api, namespace, "never-ready")["status"].get("reason")
                in ("PodsReadyTimeout", "Requeued")
            )
            or None
        ),
        "evicted for PodsReadyTimeout",
        timeout=kueue.PODS_READY_TIMEOUT_SECONDS + 60,
    )
    assert evicted
    status = get_job(kube_api, namespace, "never-ready")["status"]
    assert status["phase"] == "Queued" and status["restarts"] == 0, status
    wl = workload_of(kube_api, namespace, "never-ready")
    assert (wl_condition(wl, "Evicted") or {}).get("reason") == "PodsReadyTimeout"
    assert status["phase"] != "Failed"
