"""MultiKueue with real Kueue v0.17 on two control planes: a job applied to the manager runs on
the worker, and its status comes back to the manager.

The session's control plane is the manager; the worker is a second control plane on this machine
(tests/cluster/multikueue.py), started for the test (`python -m tests.cluster up`, then `kueue`) in its own
state folder and ports (tests/cluster/private.py), and purged afterwards. Each cluster runs its own
operator; the manager's only keeps the job's Workload, the worker's runs the job. The driver is
played as in test_operator.py: /progress from the test process, the exit written into the head
pod's status, on the worker.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster import kueue, multikueue
from tests.cluster.cluster import LocalCluster
from tests.cluster.private import PrivateCluster, private_control_plane
from tests.cluster.rest import JSON, Api, ApiError, condition
from tests.cluster.samples import wait_until
from tests.e2e import test_operator
from tests.e2e.test_kueue import (  # noqa: F401 - kueue_on: the fixture, reused
    GPUS_PER_JOB,
    LOCAL_QUEUE,
    kueue_on,
    queued_job,
    shown,
    state,
)
from tests.e2e.test_operator import (
    CRD_FILE,
    OperatorProcess,
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    end_driver,
    get_job,
    head_pod,
    live_rayclusters,
    operator,  # noqa: F401 - the fixture, reused
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

driver_progress = test_operator.driver_progress  # the fixture the operators read, reused
WORKER_KUEUE_SECONDS = 300
"""Kueue on the worker: its CRDs, certificates, process and ClusterQueue (the binary is cached)."""


@pytest.fixture
def worker(kueue_on: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:  # noqa: F811
    """The worker: a control plane of this test's own, with Kueue, KubeRay and the AsyncGRPOJob CRD
    (purged afterwards)."""
    with private_control_plane(tmp_path_factory.mktemp("multikueue-worker")) as cluster:
        cluster.cli("kueue", timeout=WORKER_KUEUE_SECONDS)
        crd = yaml.safe_load(CRD_FILE.read_text())
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
        cluster.api.apply(path, json.dumps(crd))
        wait_until(
            lambda: _true(cluster.api.get(path), "Established"), "AsyncGRPOJob CRD Established on the worker"
        )
        yield cluster


def _true(obj: JSON, type_: str) -> bool | None:
    c = condition(obj, type_)
    return True if c is not None and c["status"] == "True" else None


@pytest.fixture
def dispatching_queue(kube_api: Api, worker: PrivateCluster, namespace: str) -> Iterator[str]:
    """LocalQueue team-a on both clusters: on the worker a plain ClusterQueue, on the manager one
    with the MultiKueue admission check that sends its Workloads to the worker."""
    name = f"mk-{namespace[-20:]}"
    worker.api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    kueue.apply_cluster_queue(worker.api, kueue.cluster_queue(name, gpus=GPUS_PER_JOB))
    wait_until(
        lambda: kueue.cluster_queue_active(worker.api, name) or None, f"worker ClusterQueue {name} Active"
    )
    kueue.create_local_queue(worker.api, namespace, LOCAL_QUEUE, name)

    objects = multikueue.paths()
    secret = multikueue.kubeconfig_secret(multikueue.inline_kubeconfig(worker.api.base_url, worker.api.pki))
    kube_api.apply(objects["secret"], json.dumps(secret))
    kube_api.apply(objects["cluster"], json.dumps(multikueue.multikueue_cluster()))
    wait_until(
        lambda: _true(kube_api.get(objects["cluster"]), "Active"), "MultiKueueCluster Active", timeout=60
    )
    kube_api.apply(objects["config"], json.dumps(multikueue.multikueue_config()))
    kube_api.apply(objects["check"], json.dumps(multikueue.admission_check()))
    wait_until(lambda: _true(kube_api.get(objects["check"]), "Active"), "AdmissionCheck Active", timeout=60)
    kueue.apply_cluster_queue(kube_api, multikueue.manager_cluster_queue(name, gpus=GPUS_PER_JOB))
    wait_until(
        lambda: kueue.cluster_queue_active(kube_api, name) or None, f"manager ClusterQueue {name} Active"
    )
    kueue.create_local_queue(kube_api, namespace, LOCAL_QUEUE, name)
    yield name
    try:  # the worker's go with its control plane
        kube_api.delete(f"{kueue.BASE}/clusterqueues/{name}")
    except ApiError as err:
        if err.status != 404:
            raise


@pytest.fixture
def worker_operator(
    worker: PrivateCluster,
    namespace: str,
    dispatching_queue: str,
    tmp_path: Path,
    driver_progress: ProgressServer,
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        worker.kubeconfig, namespace, tmp_path / "worker-operator.log", progress=driver_progress
    )
    op.start()
    yield op
    op.stop()
    sys.stderr.write(f"\n--- worker operator log ({op.log}) ---\n{op.tail()}\n")


def test_a_job_applied_to_the_manager_runs_on_the_worker_and_its_status_comes_back(
    kube_api: Api,
    worker: PrivateCluster,
    namespace: str,
    *,
    operator: OperatorProcess,  # noqa: F811 - the manager's
    worker_operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    manifest = queued_job("dispatched")
    manifest["spec"]["managedBy"] = multikueue.CONTROLLER
    create_job(kube_api, namespace, manifest)

    # MultiKueue copies the job to the worker, with the Workload it prebuilt there.
    copy = wait_until(
        lambda: _get_or_none(worker.api, f"{test_operator.JOBS.format(ns=namespace)}/dispatched"),
        "the job's copy on the worker",
        timeout=180,
    )
    labels = copy["metadata"]["labels"]
    prebuilt = labels["kueue.x-k8s.io/prebuilt-workload-name"]
    assert "managedBy" not in copy["spec"]

    # It runs on the worker, in a RayCluster there; the manager never gets one.
    driver_progress.doc = {
        "step": 3,
        "maxSteps": 20,
        "policyVersion": 3,
        "rewardMean": 0.25,
        "state": "running",
    }
    on_worker = wait_phase(worker.api, namespace, "dispatched", "Running", timeout=180)
    assert on_worker["workloadName"] == prebuilt
    workload = worker.api.get(f"{kueue.BASE}/namespaces/{namespace}/workloads/{prebuilt}")
    [owner] = workload["metadata"]["ownerReferences"]
    assert owner["uid"] == copy["metadata"]["uid"] and owner["controller"]
    assert live_rayclusters(worker.api, namespace, "dispatched") == [on_worker["rayClusterName"]]
    assert live_rayclusters(kube_api, namespace, "dispatched") == []

    # Its status comes back: MultiKueue copies the worker's over the manager's (on each change of
    # the worker's job, which MultiKueue watches).
    on_manager = wait_until(
        lambda: _with_step(get_job(kube_api, namespace, "dispatched").get("status") or {}, 3),
        "the worker's Running status, step 3, on the manager",
        timeout=90,
    )
    assert on_manager["phase"] == "Running"
    assert on_manager["rayClusterName"] == on_worker["rayClusterName"]
    assert shown(kube_api, namespace, "dispatched") == shown(worker.api, namespace, "dispatched")

    def conditions(api: Api) -> dict[str, tuple[str, str]]:
        status = get_job(api, namespace, "dispatched").get("status") or {}
        return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}

    wait_until(
        lambda: conditions(kube_api) == conditions(worker.api) or None,
        "the worker's conditions on the manager",
        timeout=30,
    )
    # The manager's Workload is queued and admitted as any other, through the MultiKueue check.
    [dispatched_wl] = kube_api.get(f"{kueue.BASE}/namespaces/{namespace}/workloads")["items"]
    assert (
        state(dispatched_wl, "QuotaReserved")[0] == "True" and state(dispatched_wl, "Admitted")[0] == "True"
    )
    checks = {c["name"]: c["state"] for c in dispatched_wl["status"].get("admissionChecks") or []}
    assert checks == {multikueue.CHECK: "Ready"}, checks

    # Once the worker's job finished, MultiKueue copies its status, finishes the manager's Workload
    # and deletes the worker's copy.
    end_driver(worker.api, namespace, head_pod(worker.api, namespace, on_worker["rayClusterName"]), 0)
    done = wait_phase(kube_api, namespace, "dispatched", "Succeeded", timeout=180)
    assert done["reason"] == "DriverSucceeded"
    [local] = kube_api.get(f"{kueue.BASE}/namespaces/{namespace}/workloads")["items"]
    wait_until(
        lambda: _true(
            kube_api.get(f"{kueue.BASE}/namespaces/{namespace}/workloads/{local['metadata']['name']}"),
            "Finished",
        ),
        "the manager's Workload Finished",
        timeout=60,
    )
    assert live_rayclusters(kube_api, namespace, "dispatched") == []
    manager_job = get_job(kube_api, namespace, "dispatched")
    assert manager_job["spec"]["managedBy"] == multikueue.CONTROLLER
    assert manager_job["spec"]["suspend"] is False  # as the user wrote it (the CRD's default): never written
    assert manager_job["metadata"]["generation"] == 1
    assert shown(kube_api, namespace, "dispatched") == ("Succeeded", "DriverSucceeded", 0)
    status_writers = {
        f["manager"]
        for f in manager_job["metadata"].get("managedFields") or []
        if f.get("subresource") == "status"
    }
    assert "asyncgrpo-operator" not in status_writers, status_writers
    worker_copy = f"{test_operator.JOBS.format(ns=namespace)}/dispatched"
    wait_until(
        lambda: True if _get_or_none(worker.api, worker_copy) is None else None,
        "MultiKueue deletes the worker's copy of the finished job",
        timeout=60,
    )


def _with_step(status: JSON, step: int) -> JSON | None:
    return status if (status.get("progress") or {}).get("step") == step else None


def _get_or_none(api: Api, path: str) -> JSON | None:
    try:
        return api.get(path)
    except ApiError as err:
        if err.status == 404:
            return None
        raise
