"""Training faults through the operator: each infrastructure fault is retried once (a new
RayCluster, restarts+1), and the same fault again, with backoffLimit 1 spent, fails the job with
BackoffLimitExceeded and a message that names the cause.

Faults are injected the way a kubelet or node would report them (tests/cluster/faults.py): the
head pod Failed with exit 137; the driver container OOM-killed (exit 137, reason OOMKilled) while
the Ray head keeps running; the head's node turned NotReady, after which the node-lifecycle
controller taints it and the taint manager evicts the head (the job tolerates `not-ready` for
NOT_READY_TOLERATION_SECONDS instead of the default 300 s, so the test takes seconds). A lost
worker pod is replaced by KubeRay inside the same attempt; the operator must not fail the job for
it, and when the driver then exits with RAY_WORKER_LOST (201, the trainer's answer to a dead Ray
actor) the attempt is retried.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asyncgrpo_api.exitcodes import RAY_WORKER_LOST
from tests.cluster import faults
from tests.cluster.nodes import spare_node
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, wait_until
from tests.e2e.test_operator import (
    OperatorProcess,
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    end_driver,
    get_job,
    head_pod,
    job_manifest,
    live_rayclusters,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NOT_READY_TOLERATION_SECONDS = 10
"""Longer than the node-lifecycle controller takes to lift the NoExecute taint once the restored node
is Ready (its monitor period, 5 s): the retry's head lands on that node as soon as the NoSchedule
taint is gone, and with 2 s it was evicted too (a CI run of 2026-12-05: restarts 1, then
HeadPodLost again, where the test waits for the retry Running)."""


@pytest.fixture
def operator(
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
    progress: ProgressServer,
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log", progress=progress)
    op.start()
    yield op
    op.stop()
    print(op.tail(30))


@pytest.fixture
def spare(kube_api: Api) -> Iterator[str]:
    """A throw-away kwok node only this test's head pods can land on."""
    name = f"spare-{secrets.token_hex(3)}"
    kube_api.create("/api/v1/nodes", spare_node(name))

    def ready() -> bool | None:
        node = kube_api.get(f"/api/v1/nodes/{name}")
        cond = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        return (bool(cond) and cond[0]["status"] == "True") or None

    wait_until(ready, f"node {name} Ready")
    yield name
    try:
        kube_api.delete(f"/api/v1/nodes/{name}")
    except ApiError as err:
        if err.status != 404:
            raise


def _status(api: Api, ns: str, name: str) -> JSON:
    return get_job(api, ns, name).get("status") or {}


def _until(
    api: Api, ns: str, name: str, what: str, ok: Callable[[JSON], bool], *, timeout: float = 120
) -> JSON:
    return wait_until(lambda: s if ok(s := _status(api, ns, name)) else None, f"{name}: {what}", timeout)


def _fail_head(api: Api, ns: str, cluster: str, _: str | None) -> None:
    faults.fail_pod(api, ns, head_pod(api, ns, cluster)["metadata"]["name"], exit_code=137, reason="Error")


def _oom_driver(api: Api, ns: str, cluster: str, _: str | None) -> None:
    end_driver(api, ns, head_pod(api, ns, cluster), 137, "OOMKilled")


def _worker_lost(api: Api, ns: str, cluster: str, _: str | None) -> None:
    """What the driver does when a Ray worker dies under it (exitcodes.RAY_WORKER_LOST): the
    worker pod is failed too, and the driver exits 201."""
    worker = pods(api, ns, f"ray.io/cluster={cluster},ray.io/group=policy")[0]["metadata"]["name"]
    faults.fail_pod(api, ns, worker, exit_code=137, reason="OOMKilled")
    end_driver(api, ns, head_pod(api, ns, cluster), RAY_WORKER_LOST, "ActorDiedError: policy worker 0 died")


def _node_not_ready(api: Api, ns: str, cluster: str, node: str | None) -> None:
    assert node is not None
    assert head_pod(api, ns, cluster)["spec"]["nodeName"] == node
    faults.make_node_not_ready(api, node)


FAULTS: dict[str, tuple[Callable[[Api, str, str, str | None], None], str]] = {
    "head-pod-lost": (_fail_head, "HeadPodLost"),
    "driver-oom-killed": (_oom_driver, "DriverKilled"),
    "node-not-ready": (_node_not_ready, "HeadPodLost"),
    "worker-lost-driver-exits-201": (_worker_lost, "RayWorkerLost"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_infrastructure_fault_is_retried_once_then_fails_with_the_cause(
    *,
    request: pytest.FixtureRequest,
    kube_api: Api,
    namespace: str,
    operator: OperatorProcess,
    progress: ProgressServer,
    fault: str,
) -> None:
    api, ns, name = kube_api, namespace, "victim"
    inject, cause = FAULTS[fault]
    node: str | None = None
    extra: dict[str, object] = {"backoffLimit": 1}
    if fault == "node-not-ready":
        node = request.getfixturevalue("spare")
        extra["cluster"] = {
            "head": {
                "nodeSelector": {"asyncgrpo.dev/pool": "spare", "kubernetes.io/hostname": node},
                "tolerations": [
                    {"key": "asyncgrpo.dev/spare", "operator": "Exists", "effect": "NoSchedule"},
                    {
                        "key": "node.kubernetes.io/not-ready",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": NOT_READY_TOLERATION_SECONDS,
                    },
                    {
                        "key": "node.kubernetes.io/unreachable",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": NOT_READY_TOLERATION_SECONDS,
                    },
                ],
            }
        }
    create_job(api, ns, job_manifest(name, **extra))
    _until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")

    inject(api, ns, f"{name}-0", node)
    if node is not None:
        _until(api, ns, name, "one restart", lambda s: s.get("restarts") == 1, timeout=150)
        faults.restore_node(api, node)
    retried = _until(
        api,
        ns,
        name,
        "Running after a retry",
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
    )
    assert retried["rayClusterName"] == f"{name}-1", retried
    wait_until(lambda: live_rayclusters(api, ns, name) == [f"{name}-1"] or None, "only the new cluster")

    inject(api, ns, f"{name}-1", node)
    failed = _until(api, ns, name, "Failed", lambda s: s.get("phase") == "Failed", timeout=150)
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert cause in failed["message"] and "backoffLimit" in failed["message"], failed["message"]
    assert failed["restarts"] == 1
    if node is not None:
        faults.restore_node(api, node)
    print(f"{fault}: {failed['message']}")


def test_a_lost_worker_pod_is_replaced_without_failing_the_job(
    kube_api: Api, namespace: str, operator: OperatorProcess, progress: ProgressServer
) -> None:
    api, ns, name = kube_api, namespace, "workers"
    create_job(api, ns, job_manifest(name))
    _until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")
    for group in ("policy", "generation"):
        selector = f"ray.io/cluster={name}-0,ray.io/group={group}"
        (before,) = [p["metadata"]["name"] for p in pods(api, ns, selector)]
        faults.fail_pod(api, ns, before, exit_code=137, reason="Error")

        def replaced(sel: str = selector, old: str = before) -> list[JSON] | None:
            live = [
                p
                for p in pods(api, ns, sel)
                if p["metadata"]["name"] != old and p.get("status", {}).get("phase") == "Running"
            ]
            return live or None

        wait_until(replaced, f"{group} worker replaced by KubeRay", timeout=90)
    status = _until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")
    assert (status["restarts"], status["rayClusterName"]) == (0, f"{name}-0"), status
