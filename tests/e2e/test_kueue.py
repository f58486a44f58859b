"""Jobs queued by real Kueue (v0.17, the AsyncGRPOJob as an external framework: each job owns its
Workload) with the real KubeRay operator.

Kueue is an optional component of the local control plane: the `kueue` fixture builds it once
(a few minutes cold; CI pays that here, the demo never does) and starts it on the running cluster.
Each test gets its own ClusterQueue whose GPU quota fits exactly one job (each job asks for two
1-GPU workers), and a LocalQueue in its namespace. The driver is played as in test_operator.py:
its /progress is served from the test process and its exit is written into the head pod's status.

Together these observe every row of "The lifecycle under Kueue" in docs/guides/scheduling.md
(the table names the test of each row): what the Workload, the job's spec.suspend, its RayCluster,
`kubectl get agj -o wide` (the API server's Table of the CRD's printer columns) and the job's
conditions show in each state. The preemption test runs the operator as the chart's
ServiceAccount behind a recording proxy, so a Kueue rule the chart lacks would be refused, and one
it grants but nothing needs would show; and it counts the operator's reads of Workloads (watched,
not polled).

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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_api import exitcodes
from asyncgrpo_operator import kueue_admission
from tests.cluster import faults, kueue
from tests.cluster.build import build_optional
from tests.cluster.cluster import LocalCluster
from tests.cluster.nodes import POOL_LABEL, gpu_node
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, raycluster_path, wait_until
from tests.e2e import test_operator
from tests.e2e.test_operator import (
    JOBS,
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    end_driver,
    events,
    get_job,
    head_pod,
    job_manifest,
    operator,  # noqa: F401 - the fixture, reused
    wait_phase,
)
from tests.reliability.apiproxy import Permission, permission
from tests.reliability.proxied import (
    ProxiedInstallation,
    chart_rules,
    forbidden,
    proxied_chart,
    used_permissions,
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


@contextmanager
def one_job_queue(api: Api, namespace: str) -> Iterator[str]:
    """A ClusterQueue that fits one job, and LocalQueue team-a in `namespace` pointing at it."""
    name = f"cq-{namespace[-20:]}-{secrets.token_hex(2)}"
    kueue.apply_cluster_queue(api, kueue.cluster_queue(name, gpus=GPUS_PER_JOB))
    wait_until(lambda: kueue.cluster_queue_active(api, name) or None, f"ClusterQueue {name} Active")
    kueue.create_local_queue(api, namespace, LOCAL_QUEUE, name)
    try:
        yield name
    finally:
        try:
            api.delete(f"{kueue.BASE}/clusterqueues/{name}")
        except ApiError as err:
            if err.status != 404:
                raise


@pytest.fixture
def queue(kueue_on: LocalCluster, kube_api: Api, namespace: str) -> Iterator[str]:
    """A ClusterQueue that fits one job, and LocalQueue team-a in the test's namespace."""
    with one_job_queue(kube_api, namespace) as name:
        yield name


MANAGED = {"kueue.manageJobsWithoutQueueName": True}
"""The chart values of a cluster whose Kueue manages every job (its manageJobsWithoutQueueName)."""


@pytest.fixture
def chart_operator(kueue_on: LocalCluster, driver_progress: ProgressServer) -> Iterator[ProxiedInstallation]:
    """The chart installed, its operator running as the chart's ServiceAccount behind a recording
    proxy (tests/reliability/proxied.py) and watching `jobs_ns` only, where its rights are the
    chart's Role: a Kueue call the chart does not allow is refused (403) and recorded. Installed
    as for a Kueue that manages jobs without a queue name, so jobs that name none meet the chart's
    mutating webhook."""
    env = {kueue_admission.MANAGE_ENV: "true"}  # what the chart's Deployment sets for MANAGED
    with proxied_chart(kueue_on, driver_progress.template, values=MANAGED, operator_env=env) as installation:
        yield installation


@pytest.fixture
def priorities(kube_api: Api) -> Iterator[tuple[str, str]]:
    """Two priority classes, one of each kind a job may name: a PriorityClass (value 100, from
    spec.scheduler.priorityClassName) and a WorkloadPriorityClass (value 1000, from the job's
    kueue.x-k8s.io/priority-class label). Kueue preempts by the Workload's priority."""
    token = secrets.token_hex(3)
    low, high = f"low-{token}", f"high-{token}"
    pc = "/apis/scheduling.k8s.io/v1/priorityclasses"
    wpc = f"{kueue.BASE}/workloadpriorityclasses"
    kube_api.create(
        pc,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": low},
            "value": 100,
        },
    )
    kube_api.create(
        wpc,
        {"apiVersion": kueue.API, "kind": "WorkloadPriorityClass", "metadata": {"name": high}, "value": 1000},
    )
    yield low, high
    kube_api.delete(f"{pc}/{low}")
    kube_api.delete(f"{wpc}/{high}")


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


def state(obj: JSON, type_: str) -> tuple[str, str]:
    """(status, reason) of the condition `type_` of a Workload or a job (("", "") if it has none)."""
    cond = wl_condition(obj, type_) or {}
    return str(cond.get("status", "")), str(cond.get("reason", ""))


def shown(api: Api, ns: str, job: str) -> tuple[str, str, int]:
    """PHASE, REASON and RESTARTS of the job as `kubectl get agj -o wide` prints them: the API
    server's Table of the CRD's printer columns, as kubectl asks for it."""
    [row] = api.table(f"{JOBS.format(ns=ns)}/{job}")
    return str(row["Phase"]), str(row["Reason"]), int(row["Restarts"])


def clusters_of(api: Api, ns: str, job: str) -> list[JSON]:
    items: list[JSON] = api.get(raycluster_path(ns), labelSelector=f"asyncgrpo.dev/job-name={job}")["items"]
    return items


def suspended_in_place(api: Api, ns: str, job: str, cluster: str) -> None:
    """Wait until the job (spec.suspend) and its RayCluster `cluster` are suspended and the
    cluster's pods are gone; the cluster is the job's only one."""
    wait_until(lambda: get_job(api, ns, job)["spec"].get("suspend") or None, f"{job} suspended")
    wait_until(
        lambda: api.get(f"{raycluster_path(ns)}/{cluster}")["spec"].get("suspend") or None,
        f"RayCluster {cluster} suspended in place",
    )
    wait_until(lambda: not pods(api, ns, f"ray.io/cluster={cluster}") or None, f"the pods of {cluster} gone")
    assert [c["metadata"]["name"] for c in clusters_of(api, ns, job)] == [cluster]


def quota_given_back_after_the_pods_are_gone(api: Api, ns: str, job: str, cluster: str) -> JSON:
    """Wait until the evicted Workload's quota is given back (QuotaReserved False); on every look,
    a Workload without quota while a pod of the cluster (terminating ones included) still exists
    fails the test. The Workload is read before the pods: pods never come back while the job is
    suspended, so a pod seen after a released Workload was there when it was released."""

    def released() -> JSON | None:
        wl = workload_of(api, ns, job)
        if state(wl, "QuotaReserved")[0] == "True":
            return None
        left = [p["metadata"]["name"] for p in pods(api, ns, f"ray.io/cluster={cluster}")]
        assert not left, f"the quota was given back while pods of {cluster} exist: {left}"
        return wl

    wl: JSON = wait_until(released, f"{job}'s quota given back", timeout=90)
    return wl


def reasons_until(
    api: Api, ns: str, job: str, last: tuple[str, str], timeout: float
) -> tuple[list[tuple[str, str]], JSON]:
    """Every (phase, reason) the job shows, in order, until it shows `last` (polled every 0.2 s),
    and the job as it was then (a state a pass may leave soon after)."""
    seen: list[tuple[str, str]] = []

    def reached() -> JSON | None:
        obj = get_job(api, ns, job)
        status = obj.get("status") or {}
        now = (str(status.get("phase", "")), str(status.get("reason", "")))
        if not seen or seen[-1] != now:
            seen.append(now)
        return obj if now == last else None

    try:
        obj = wait_until(reached, f"{job} {last[0]}/{last[1]}", timeout=timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; it showed {seen}") from exc
    return seen, obj


def set_progress(progress: ProgressServer, step: int = 3) -> None:
    """Every driver's /progress in mid-run."""
    progress.doc = {
        "step": step,
        "maxSteps": 20,
        "policyVersion": step,
        "rewardMean": 0.25,
        "state": "running",
    }


def running(api: Api, ns: str, job: str, progress: ProgressServer, step: int = 3) -> JSON:
    set_progress(progress, step)
    return wait_phase(api, ns, job, "Running", timeout=120)


def run_asyncgrpo_logs(
    kubeconfig: Path, ns: str, job: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`asyncgrpo logs JOB -n NS [args]`, as a user runs it, with `env` added to this process's
    (never while a head pod exists: kwok's fake nodes serve no container logs, and the API server
    would dial their made-up addresses)."""
    cli = Path(sys.executable).with_name("asyncgrpo")
    return subprocess.run(
        [str(cli), "logs", job, "-n", ns, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})},
        timeout=120,
        check=False,
    )


def asyncgrpo_logs(kubeconfig: Path, ns: str, job: str) -> str:
    proc = run_asyncgrpo_logs(kubeconfig, ns, job)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def finish(api: Api, ns: str, job: str, exit_code: int = exitcodes.SUCCEEDED) -> JSON:
    """End the job's driver with `exit_code` and wait for Succeeded (0) or Failed (any other)."""
    cluster = get_job(api, ns, job)["status"]["rayClusterName"]
    end_driver(api, ns, head_pod(api, ns, cluster), exit_code)
    return wait_phase(api, ns, job, "Succeeded" if exit_code == 0 else "Failed", timeout=90)


# --- the lifecycle table of docs/guides/scheduling.md, row by row -----------------------------


@pytest.mark.usefixtures("operator")
def test_two_jobs_for_one_jobs_quota_run_one_after_the_other_and_neither_fails(
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    queue: str,
    driver_progress: ProgressServer,
) -> None:
    """The table's queued, admitted and finished (Succeeded) rows."""
    create_job(kube_api, namespace, queued_job("first"))
    running(kube_api, namespace, "first", driver_progress)
    first_wl = workload_of(kube_api, namespace, "first")
    assert get_job(kube_api, namespace, "first")["status"]["workloadName"] == first_wl["metadata"]["name"]
    assert [(s["name"], s["count"]) for s in first_wl["spec"]["podSets"]] == [
        ("head", 1),
        ("policy", 1),
        ("generation", 1),
    ]
    # admitted: Admitted True with the flavors in status.admission, PodsReady True once all pods are
    assert state(first_wl, "Admitted")[0] == "True"
    assigned = {
        a["name"]: set(a["flavors"].values()) for a in first_wl["status"]["admission"]["podSetAssignments"]
    }
    assert assigned == {"head": {kueue.FLAVOR}, "policy": {kueue.FLAVOR}, "generation": {kueue.FLAVOR}}
    wait_until(
        lambda: state(workload_of(kube_api, namespace, "first"), "PodsReady") == ("True", "Started") or None,
        "first's PodsReady True",
    )
    assert get_job(kube_api, namespace, "first")["spec"]["suspend"] is False  # admission unsuspended it
    assert shown(kube_api, namespace, "first") == ("Running", "DriverRunning", 0)
    assert state(get_job(kube_api, namespace, "first"), "Queued") == ("False", "Admitted")
    # Both of second's clocks are shorter than its wait in the queue: neither may run while it waits.
    clocks = {"activeDeadlineSeconds": QUEUED_LONGER_THAN, "startupDeadlineSeconds": QUEUED_LONGER_THAN}
    create_job(kube_api, namespace, queued_job("second", **clocks))
    queued_since = time.monotonic()

    wait_phase(kube_api, namespace, "second", "Queued", timeout=60)

    def kueues_reason() -> tuple[JSON, JSON] | None:
        # Kueue writes its reason into the Workload a moment later, the operator copies it on its next pass
        status: JSON = get_job(kube_api, namespace, "second")["status"]
        wl = workload_of(kube_api, namespace, "second")
        reserved = wl_condition(wl, "QuotaReserved") or {}
        copied = status.get("message") == f"Kueue ({wl['metadata']['name']}): {reserved.get('message')}"
        return (status, wl) if "insufficient" in status.get("message", "") and copied else None

    waiting, second_wl = wait_until(kueues_reason, "Kueue's reason in the Queued job's message", timeout=60)
    # queued: the Workload QuotaReserved False (Pending, Kueue's message), the job Queued/Pending
    # with that message, suspended, no RayCluster, no deadline running
    reserved = wl_condition(second_wl, "QuotaReserved") or {}
    assert (reserved["status"], reserved["reason"]) == ("False", "Pending")
    assert "insufficient unused quota for nvidia.com/gpu" in reserved["message"], reserved
    assert (
        waiting["phase"] == "Queued"
        and waiting["reason"] == "Pending"
        and "nvidia.com/gpu" in waiting["message"]
    )
    assert state(get_job(kube_api, namespace, "second"), "Queued") == ("True", "Pending")
    assert shown(kube_api, namespace, "second") == ("Queued", "Pending", 0)
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
    # finished (Succeeded): the Workload Finished True Succeeded, its quota freed (second is
    # admitted next); the job keeps spec.suspend false; the RayCluster is deleted (cleanupPolicy
    # onSuccess: DeleteCluster, the default)
    finished = wait_until(
        lambda: wl_condition(workload_of(kube_api, namespace, "first"), "Finished"),
        "first's Workload Finished",
    )
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
    ended = get_job(kube_api, namespace, "first")
    assert ended["spec"]["suspend"] is False
    assert state(ended, "Complete")[0] == "True"
    assert shown(kube_api, namespace, "first") == ("Succeeded", "DriverSucceeded", 0)
    first_cluster = done["rayClusterName"]
    wait_until(
        lambda: not pods(kube_api, namespace, f"ray.io/cluster={first_cluster}") or None, "first's pods gone"
    )
    wait_until(lambda: not clusters_of(kube_api, namespace, "first") or None, "first's RayCluster deleted")
    shown_logs = asyncgrpo_logs(kubeconfig, namespace, "first")
    assert "/checkpoints/logs/driver-attempt-0.log" in shown_logs and "emptyDir" in shown_logs, shown_logs
    status = running(kube_api, namespace, "second", driver_progress)
    queued = next(c for c in status["conditions"] if c["type"] == "Queued")
    assert queued["status"] == "False" and queued["reason"] == "Admitted"
    assert status["attemptStartTime"] >= queued["lastTransitionTime"]  # the deadline runs from admission
    wait_until(
        lambda: state(workload_of(kube_api, namespace, "second"), "PodsReady") == ("True", "Started") or None,
        "second's PodsReady True",
    )
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


READS = ("get", "list", "watch")

KUEUE_RULES_USED_ELSEWHERE = {
    Permission("kueue.x-k8s.io", "workloads", "delete"): "a job whose pods changed after Kueue reserved "
    "quota but before it admitted (admission checks pending) asks anew (tests/operator/test_queueing.py)",
}
"""The chart's Kueue rules that the preemption path does not call, and where they are needed."""


def test_a_higher_priority_job_preempts_and_the_preempted_job_resumes_in_place_under_the_charts_rbac(
    kube_api: Api,
    chart_operator: ProxiedInstallation,
    priorities: tuple[str, str],
    driver_progress: ProgressServer,
) -> None:
    """The table's preempted and requeued rows, and readmission; the operator runs as the chart's
    ServiceAccount, so every Kueue call it makes goes through the chart's rules: none is refused,
    and every Kueue rule the chart grants is called here or needed elsewhere (named). Last, with
    Kueue managing every job (kueue.manageJobsWithoutQueueName), a job that names no queue is
    refused, then queued in the LocalQueue default once the namespace has one."""
    namespace, proxy = chart_operator.jobs_ns, chart_operator.proxy
    assert proxy is not None
    low, high = priorities
    with one_job_queue(kube_api, namespace) as cluster_queue:
        create_job(kube_api, namespace, queued_job("low", scheduler={"priorityClassName": low}))
        running(kube_api, namespace, "low", driver_progress)
        cluster = get_job(kube_api, namespace, "low")["status"]["rayClusterName"]
        first_head = head_pod(kube_api, namespace, cluster)["metadata"]["name"]
        low_wl = workload_of(kube_api, namespace, "low")
        assert low_wl["spec"]["priority"] == 100

        urgent = queued_job("high")
        urgent["metadata"]["labels"][kueue.PRIORITY_LABEL] = high
        create_job(kube_api, namespace, urgent)
        # preempted: the Workload Evicted True Preempted; the job Queued/Preempted, its RESTARTS
        # unchanged, Queued True Preempted and Running False (it resumes from its checkpoint)
        job = reasons_until(kube_api, namespace, "low", ("Queued", "Preempted"), timeout=90)[1]
        preempted = job["status"]
        assert preempted["restarts"] == 0 and preempted["attempt"] == 0
        assert preempted["rayClusterName"] == cluster  # the same RayCluster waits, suspended in place
        assert state(workload_of(kube_api, namespace, "low"), "Evicted") == ("True", "Preempted")
        assert state(job, "Queued") == ("True", "Preempted")
        assert state(job, "Running") == ("False", "Preempted")
        assert "resumes from the latest checkpoint" in (wl_condition(job, "Running") or {})["message"]
        assert shown(kube_api, namespace, "low")[2] == 0
        # the quota stays taken until the pods are gone; the job and its RayCluster are suspended
        released = quota_given_back_after_the_pods_are_gone(kube_api, namespace, "low", cluster)
        suspended_in_place(kube_api, namespace, "low", cluster)
        # requeued: QuotaReserved False, Requeued True, the same Workload; the job Queued/Requeued
        requeued = wait_phase(kube_api, namespace, "low", "Queued", "Requeued", timeout=90)
        assert requeued["restarts"] == 0
        again = workload_of(kube_api, namespace, "low")
        assert again["metadata"]["uid"] == low_wl["metadata"]["uid"]  # its queue place kept
        assert state(again, "QuotaReserved") == ("False", "Pending")
        assert state(again, "Requeued") == ("True", "Preempted")
        assert state(again, "Evicted") == ("True", "Preempted")
        assert state(released, "Admitted")[0] == "False"
        assert state(get_job(kube_api, namespace, "low"), "Queued") == ("True", "Requeued")
        assert shown(kube_api, namespace, "low") == ("Queued", "Requeued", 0)
        running(kube_api, namespace, "high", driver_progress)
        assert workload_of(kube_api, namespace, "high")["spec"]["priority"] == 1000

        # A spec change while it waits in its queue updates the same Workload (its place is kept);
        # the resumed RayCluster carries it.
        kube_api.merge_patch(f"{JOBS.format(ns=namespace)}/low", {"spec": {"labels": {"team": "rl"}}})

        def relabelled() -> JSON | None:
            wl = workload_of(kube_api, namespace, "low")
            head_labels = wl["spec"]["podSets"][0]["template"]["metadata"]["labels"]
            return wl if head_labels.get("team") == "rl" else None

        updated = wait_until(relabelled, "low's Workload updated with the new pod labels", timeout=30)
        assert updated["metadata"]["uid"] == low_wl["metadata"]["uid"]

        finish(kube_api, namespace, "high")
        resumed = running(kube_api, namespace, "low", driver_progress)
        assert resumed["restarts"] == 0 and resumed["attempt"] == 0 and resumed["rayClusterName"] == cluster
        head = head_pod(kube_api, namespace, cluster)
        assert head["metadata"]["name"] != first_head  # a new driver started
        assert head["metadata"]["labels"]["team"] == "rl"
        readmitted = workload_of(kube_api, namespace, "low")
        assert state(readmitted, "Admitted")[0] == "True"
        assert state(readmitted, "Evicted") == ("False", "QuotaReserved")  # Kueue's, on readmission
        done = finish(kube_api, namespace, "low")
        assert done["restarts"] == 0
        assert get_job(kube_api, namespace, "high")["status"]["phase"] == "Succeeded"

        # Kueue manages every job here (MANAGED): a job that names no queue is refused at
        # admission while the namespace has no LocalQueue default, then queued in it.
        with pytest.raises(ApiError) as no_queue:
            create_job(kube_api, namespace, job_manifest("unqueued"))
        said = str(no_queue.value.body.get("message"))
        assert "metadata.labels.kueue.x-k8s.io/queue-name: is required" in said, said
        assert "LocalQueue named default" in said
        kueue.create_local_queue(kube_api, namespace, "default", cluster_queue)
        create_job(kube_api, namespace, job_manifest("unqueued"))
        assert get_job(kube_api, namespace, "unqueued")["metadata"]["labels"][kueue.QUEUE_LABEL] == "default"
        assert workload_of(kube_api, namespace, "unqueued")["spec"]["queueName"] == "default"

    calls = list(proxy.calls)
    refused = forbidden(calls)
    assert not refused, refused
    used = used_permissions(calls)
    granted = chart_rules({"operator.watchNamespaces": [namespace], **MANAGED})
    assert used - granted == set(), f"used but not granted: {used - granted}"
    kueue_rules = {p for p in granted if p.group in ("kueue.x-k8s.io", "scheduling.k8s.io")}
    assert kueue_rules - used == set(KUEUE_RULES_USED_ELSEWHERE), kueue_rules - used
    # Workloads are watched: two jobs' whole lives read them only through the informer (a streamed
    # list, or pages where a server refuses streaming, then watches resumed every few minutes),
    # where every pass used to list them.
    seen = [(c, permission(c)) for c in calls]
    reads = [(p.verb, c) for c, p in seen if p and p.resource == "workloads" and p.verb in READS]
    assert {verb for verb, _ in reads} <= {"list", "watch"} and "watch" in {verb for verb, _ in reads}, reads
    lists = [c for verb, c in reads if verb == "list" or "sendInitialEvents=true" in c.query]
    assert len(lists) <= 3, reads


@pytest.mark.usefixtures("operator")
def test_pods_that_do_not_become_ready_in_time_are_evicted_requeued_after_a_backoff_and_readmitted(
    kube_api: Api, namespace: str, queue: str, driver_progress: ProgressServer
) -> None:
    """The table's pods-not-ready row. Kueue's waitForPodsReady (timeout
    tests.cluster.kueue.PODS_READY_TIMEOUT_SECONDS, backoff from 1 s): the generation worker asks
    for a node pool that has no node yet, so it never becomes ready. Evicted, the job is suspended
    in place; once its pods are gone it gives the quota back, Kueue requeues the same Workload
    after the backoff and, the quota being free, readmits it at once. The pool gets a node
    meanwhile, and the same RayCluster runs: never Failed, no retry spent."""
    pool = f"late-{secrets.token_hex(3)}"
    create_job(
        kube_api,
        namespace,
        queued_job("late", cluster={"generationWorkers": {"nodeSelector": {POOL_LABEL: pool}}}),
    )
    # admitted, a pod finding no node: Pending/Unschedulable, PodsReady False on the Workload
    pending = wait_phase(kube_api, namespace, "late", "Pending", "Unschedulable", timeout=60)
    cluster = pending["rayClusterName"]
    cluster_uid = kube_api.get(f"{raycluster_path(namespace)}/{cluster}")["metadata"]["uid"]
    generation = get_job(kube_api, namespace, "late")["metadata"]["generation"]
    assert state(workload_of(kube_api, namespace, "late"), "PodsReady") == ("False", "WaitForStart")

    # Kueue evicts it (Evicted True until it is readmitted), then the job shows it: both for a few
    # seconds only (the quota is free again once the pods are gone, and the backoff is short)
    wait_until(
        lambda: (
            state(workload_of(kube_api, namespace, "late"), "Evicted") == ("True", "PodsReadyTimeout") or None
        ),
        "late's Workload Evicted for PodsReadyTimeout",
        timeout=kueue.PODS_READY_TIMEOUT_SECONDS + 60,
    )
    shows, job = reasons_until(kube_api, namespace, "late", ("Queued", "PodsReadyTimeout"), timeout=60)
    assert state(job, "Queued") == ("True", "PodsReadyTimeout") and job["status"]["restarts"] == 0
    node = gpu_node(f"kwok-{pool}")
    node["metadata"]["labels"] = {
        k: v for k, v in node["metadata"]["labels"].items() if not k.startswith("nvidia.com/")
    } | {POOL_LABEL: pool}
    kube_api.create("/api/v1/nodes", node)
    try:
        set_progress(driver_progress)
        shows += reasons_until(kube_api, namespace, "late", ("Running", "DriverRunning"), timeout=120)[0]
        assert all(phase != "Failed" for phase, _ in shows), shows
        resumed = get_job(kube_api, namespace, "late")
        assert (resumed["status"]["restarts"], resumed["status"]["attempt"]) == (0, 0)
        # suspended in place: spec.suspend true at the eviction and false at readmission (the job's
        # only spec writes since), the same RayCluster suspended and resumed
        assert resumed["metadata"]["generation"] == generation + 2 and resumed["spec"]["suspend"] is False
        assert kube_api.get(f"{raycluster_path(namespace)}/{cluster}")["metadata"]["uid"] == cluster_uid
        assert f"suspending RayCluster {cluster}: PodsReadyTimeout" in {
            e["message"] for e in events(kube_api, namespace, "late") if e["reason"] == "SuspendedRayCluster"
        }
        # requeued after Kueue's backoff, the same Workload readmitted
        readmitted = workload_of(kube_api, namespace, "late")
        assert state(readmitted, "Admitted")[0] == "True"
        assert state(readmitted, "Requeued") == (
            "True",
            "BackoffFinished",
        )  # Kueue's, once the backoff ran out
        assert readmitted["status"]["requeueState"]["count"] == 1
        evicted = wl_condition(readmitted, "Evicted") or {}
        assert (evicted["status"], evicted["reason"]) == ("False", "QuotaReserved")  # reset on readmission
        assert evicted["message"].startswith("Previously: Exceeded the PodsReady timeout"), evicted
        wait_until(
            lambda: (
                state(workload_of(kube_api, namespace, "late"), "PodsReady") == ("True", "Started") or None
            ),
            "late's PodsReady True",
        )
        finish(kube_api, namespace, "late")
    finally:
        kube_api.delete(f"/api/v1/nodes/{node['metadata']['name']}")


@pytest.mark.usefixtures("operator")
def test_deactivating_the_workload_stops_the_job_in_place_until_it_is_active_again(
    kube_api: Api, namespace: str, queue: str, driver_progress: ProgressServer
) -> None:
    """docs/guides/scheduling.md's way to stop a job Kueue manages: its Workload's spec.active
    false. Kueue evicts it, the job is suspended in place and stays Queued/Deactivated; active
    again, the same Workload is requeued and readmitted and the same RayCluster resumes. It then
    fails (a training error): the table's finished row for Failed."""
    create_job(kube_api, namespace, queued_job("stoppable"))
    running(kube_api, namespace, "stoppable", driver_progress)
    cluster = get_job(kube_api, namespace, "stoppable")["status"]["rayClusterName"]
    first_head = head_pod(kube_api, namespace, cluster)["metadata"]["name"]
    wl = workload_of(kube_api, namespace, "stoppable")
    path = f"{kueue.BASE}/namespaces/{namespace}/workloads/{wl['metadata']['name']}"

    kube_api.merge_patch(path, {"spec": {"active": False}})
    stopped = wait_phase(kube_api, namespace, "stoppable", "Queued", "Deactivated", timeout=90)
    assert stopped["restarts"] == 0 and stopped["attempt"] == 0 and stopped["rayClusterName"] == cluster
    assert state(workload_of(kube_api, namespace, "stoppable"), "Evicted") == ("True", "Deactivated")
    job = get_job(kube_api, namespace, "stoppable")
    assert state(job, "Queued") == ("True", "Deactivated")
    assert state(job, "Running") == ("False", "Deactivated")
    released = quota_given_back_after_the_pods_are_gone(kube_api, namespace, "stoppable", cluster)
    assert state(released, "Admitted")[0] == "False"
    assert state(released, "Requeued") == ("False", "Deactivated")  # as Kueue's jobframework: not requeued
    suspended_in_place(kube_api, namespace, "stoppable", cluster)
    # It stays stopped: Kueue does not admit an inactive Workload, however free the quota is.
    time.sleep(10)
    assert shown(kube_api, namespace, "stoppable") == ("Queued", "Deactivated", 0)
    assert not pods(kube_api, namespace, f"ray.io/cluster={cluster}")
    assert state(workload_of(kube_api, namespace, "stoppable"), "QuotaReserved")[0] == "False"

    kube_api.merge_patch(path, {"spec": {"active": True}})
    resumed = running(kube_api, namespace, "stoppable", driver_progress)
    assert resumed["restarts"] == 0 and resumed["attempt"] == 0 and resumed["rayClusterName"] == cluster
    assert head_pod(kube_api, namespace, cluster)["metadata"]["name"] != first_head
    again = workload_of(kube_api, namespace, "stoppable")
    assert again["metadata"]["uid"] == wl["metadata"]["uid"]
    assert state(again, "Admitted")[0] == "True"
    assert state(again, "Requeued") == ("True", "Reactivated")  # Kueue's, when it became active

    # finished (Failed): the Workload Finished True Failed, once the kept RayCluster's workers are
    # gone (issue 47: Kueue must not hand out GPUs its workers still hold); the RayCluster and its
    # head stay (cleanupPolicy onFailure: KeepCluster, the default); spec.suspend stays false
    failed = finish(kube_api, namespace, "stoppable", exit_code=exitcodes.TRAINING_ERROR)
    assert failed["restarts"] == 0
    finished = wait_until(
        lambda: wl_condition(workload_of(kube_api, namespace, "stoppable"), "Finished"),
        "stoppable's Workload Finished",
    )
    assert (finished["status"], finished["reason"]) == ("True", "Failed")
    ended = get_job(kube_api, namespace, "stoppable")
    assert ended["spec"]["suspend"] is False
    assert state(ended, "Failed")[0] == "True"
    assert shown(kube_api, namespace, "stoppable")[0] == "Failed"
    (kept,) = clusters_of(kube_api, namespace, "stoppable")
    assert kept["metadata"]["name"] == cluster
    assert [g["replicas"] for g in kept["spec"]["workerGroupSpecs"]] == [0] * len(
        kept["spec"]["workerGroupSpecs"]
    )
    left = pods(kube_api, namespace, f"ray.io/cluster={cluster}")
    assert [p["metadata"]["labels"].get("ray.io/node-type") for p in left] == ["head"], left
