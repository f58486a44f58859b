"""The local control plane behaves like a real cluster in the ways the operator relies on.

Each test talks to the real processes (etcd, kube-apiserver, KCM, kube-scheduler, kwok, KubeRay)
started by the `local_cluster` fixture; nothing here is mocked.
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import faults
from tests.cluster.cluster import ClusterError, LocalCluster
from tests.cluster.config import kubernetes_version
from tests.cluster.nodes import GPU_NODE_COUNT, GPU_RESOURCE, GPU_TAINT, spare_node
from tests.cluster.pki import issue
from tests.cluster.rest import JSON, Api, ApiError, condition
from tests.cluster.samples import (
    gpu_worker_pod_spec,
    pod_ready,
    pods,
    raycluster,
    raycluster_path,
    raycluster_ready,
    wait_until,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "asyncgrpo.dev_asyncgrpojobs.yaml"
EXAMPLE_JOB = REPO / "docs" / "examples" / "sync.yaml"


def _pod(name: str, spec: JSON, labels: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def _cpu_pod_spec() -> JSON:
    return {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}


def test_apiserver_reports_stamped_version(kube_api: Api) -> None:
    version = kube_api.get("/version")
    assert version["gitVersion"] == kubernetes_version()
    assert version["gitTreeState"] == "clean"


def test_fake_gpu_pool_is_ready(kube_api: Api) -> None:
    nodes = kube_api.get("/api/v1/nodes", labelSelector="asyncgrpo.dev/pool=gpu")["items"]
    shared = [n for n in nodes if n["metadata"]["name"].startswith("kwok-gpu-")]  # not test-made ones
    assert len(shared) == GPU_NODE_COUNT
    for n in shared:
        assert n["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert GPU_TAINT in [{k: t[k] for k in ("key", "value", "effect")} for t in n["spec"]["taints"]]
        ready = condition(n, "Ready")
        assert ready is not None
        assert ready["status"] == "True"


def test_raycluster_on_gpu_pool_becomes_ready(kube_api: Api, namespace: str) -> None:
    """Real KubeRay creates the pods, kube-scheduler places them, kwok runs them, KubeRay reports ready."""
    kube_api.create(raycluster_path(namespace), raycluster("rc", gpu_workers=2, gpus_per_worker=8))
    rc = wait_until(lambda: raycluster_ready(kube_api, namespace, "rc"), "RayCluster ready", timeout=90)
    assert rc["status"]["readyWorkerReplicas"] == 2

    head = pods(kube_api, namespace, "ray.io/node-type=head")
    workers = pods(kube_api, namespace, "ray.io/node-type=worker")
    assert len(head) == 1
    assert len(workers) == 2
    assert head[0]["spec"]["nodeName"].startswith("kwok-cpu-")
    assert all(p["spec"]["nodeName"].startswith("kwok-gpu-") for p in workers)
    assert all(pod_ready(p) for p in head + workers)
    # 8 GPUs each on 8-GPU nodes: the scheduler counted nvidia.com/gpu, so they landed on different nodes.
    assert len({p["spec"]["nodeName"] for p in workers}) == 2

    # Deleting the RayCluster cascades to its pods (GC + kwok's pod-delete stage).
    kube_api.delete(raycluster_path(namespace, "rc"))
    wait_until(lambda: not pods(kube_api, namespace, "ray.io/cluster=rc") or None, "RayCluster pods deleted")


def test_too_many_gpus_stays_pending_unschedulable(kube_api: Api, namespace: str) -> None:
    kube_api.create(f"/api/v1/namespaces/{namespace}/pods", _pod("greedy", gpu_worker_pod_spec(gpus=16)))

    def unschedulable() -> JSON | None:
        pod = kube_api.get(f"/api/v1/namespaces/{namespace}/pods/greedy")
        c = condition(pod, "PodScheduled")
        return c if c is not None and c["status"] == "False" else None

    scheduled = wait_until(unschedulable, "PodScheduled=False")
    assert scheduled["reason"] == "Unschedulable"
    assert GPU_RESOURCE in scheduled["message"]
    time.sleep(2)
    pod = kube_api.get(f"/api/v1/namespaces/{namespace}/pods/greedy")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_deleting_owner_cascades_to_children(kube_api: Api, namespace: str) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    owner = kube_api.create(cms, {"metadata": {"name": "owner"}, "data": {"k": "v"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    for i in range(3):
        kube_api.create(cms, {"metadata": {"name": f"child-{i}", "ownerReferences": [ref]}})
    kube_api.delete(f"{cms}/owner", propagation="Background")

    def children_gone() -> bool:
        names = {c["metadata"]["name"] for c in kube_api.get(cms)["items"]}
        return not any(n.startswith("child-") for n in names)

    wait_until(children_gone, "garbage collector to delete the children", timeout=60)


def test_fail_pod_helper_fails_a_running_pod(kube_api: Api, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    kube_api.create(path, _pod("victim", _cpu_pod_spec()))
    wait_until(lambda: pod_ready(kube_api.get(f"{path}/victim")), "pod Ready")

    faults.fail_pod(kube_api, namespace, "victim", exit_code=137, reason="OOMKilled")

    def failed() -> JSON | None:
        pod = kube_api.get(f"{path}/victim")
        return pod if pod["status"]["phase"] == "Failed" else None

    pod = wait_until(failed, "pod Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 137
    assert terminated["reason"] == "OOMKilled"


def test_stuck_label_keeps_a_bound_pod_from_becoming_ready(kube_api: Api, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    kube_api.create(path, _pod("stuck", _cpu_pod_spec(), labels={faults.FAULT_LABEL: faults.POD_STUCK}))
    wait_until(lambda: kube_api.get(f"{path}/stuck")["spec"].get("nodeName"), "pod bound to a node")
    time.sleep(2)
    pod = kube_api.get(f"{path}/stuck")
    assert pod["status"]["phase"] == "Pending"
    assert not pod_ready(pod)


def test_job_pods_complete(kube_api: Api, namespace: str) -> None:
    """KCM's Job controller plus kwok's pod-complete stage: a Job runs to completion."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"template": {"spec": {**_cpu_pod_spec(), "restartPolicy": "Never"}}},
    }
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    kube_api.create(path, job)

    def complete() -> JSON | None:
        c = condition(kube_api.get(f"{path}/once"), "Complete")
        return c if c is not None and c["status"] == "True" else None

    wait_until(complete, "Job Complete", timeout=60)


def test_node_not_ready_helper(kube_api: Api) -> None:
    """A dedicated throw-away node, so the shared pools are never disturbed."""
    name = f"kwok-spare-{int(time.time() * 1000) % 100000}"
    kube_api.create("/api/v1/nodes", spare_node(name))
    node_path = f"/api/v1/nodes/{name}"
    try:

        def ready_is(status: str) -> JSON | None:
            node = kube_api.get(node_path)
            c = condition(node, "Ready")
            return node if c is not None and c["status"] == status else None

        wait_until(lambda: ready_is("True"), "node Ready")
        faults.make_node_not_ready(kube_api, name)
        wait_until(lambda: ready_is("False"), "node NotReady")

        def tainted() -> bool:
            taints = kube_api.get(node_path)["spec"].get("taints") or []
            return any(t["key"] == "node.kubernetes.io/not-ready" for t in taints)

        wait_until(tainted, "KCM's node.kubernetes.io/not-ready taint", timeout=60)
        faults.restore_node(kube_api, name)
        wait_until(lambda: ready_is("True"), "node Ready again")
    finally:
        kube_api.delete(node_path)


class _DenyHandler(BaseHTTPRequestHandler):
    """A validating webhook that denies ConfigMaps whose name starts with `deny-`."""

    def do_POST(self) -> None:
        review: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        req = review["request"]
        allowed = not req["name"].startswith("deny-")
        response: JSON = {"uid": req["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "message": "denied by the test webhook"}
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def deny_webhook(local_cluster: LocalCluster, kube_api: Api, namespace: str) -> Iterator[str]:
    """A webhook server on 127.0.0.1 registered for CREATE configmaps in `namespace` only."""
    pki = local_cluster.paths.pki
    crt, key = issue(pki, f"webhook-{namespace}", cn="webhook", sans=("127.0.0.1",))
    server = HTTPServer(("127.0.0.1", 0), _DenyHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(crt), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    name = f"deny-{namespace}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "deny.asyncgrpo.dev",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate",
                    "caBundle": base64.b64encode(pki.ca_crt.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    kube_api.create(path, config)
    try:
        yield namespace
    finally:
        kube_api.delete(f"{path}/{name}")
        server.shutdown()


def test_admission_webhooks_are_called(kube_api: Api, deny_webhook: str) -> None:
    cms = f"/api/v1/namespaces/{deny_webhook}/configmaps"

    def denied() -> ApiError | None:  # the webhook configuration takes a moment to be picked up
        try:
            kube_api.create(cms, {"metadata": {"name": f"deny-{time.monotonic_ns()}"}})
        except ApiError as err:
            return err
        return None

    err = wait_until(denied, "webhook to deny", timeout=30, interval=0.5)
    assert err.status == 403
    assert "denied by the test webhook" in str(err)
    kube_api.create(cms, {"metadata": {"name": "allowed"}})


@pytest.fixture(scope="module")
def asyncgrpo_crd(local_cluster: LocalCluster) -> JSON:
    """The project's generated CRD, server-side applied and Established."""
    if not CRD_FILE.exists():
        pytest.skip(f"{CRD_FILE.relative_to(REPO)} is not generated yet")
    return local_cluster.install_crds([CRD_FILE])[0]


def test_asyncgrpojob_crd_explain_shows_descriptions(
    local_cluster: LocalCluster, asyncgrpo_crd: JSON
) -> None:
    schema = asyncgrpo_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    described = {k: v["description"] for k, v in schema["properties"].items() if v.get("description")}
    assert described, "the CRD's spec fields carry no descriptions"

    def explained() -> str | None:  # the OpenAPI for kubectl explain is published asynchronously
        try:
            return local_cluster.kubectl("explain", "asyncgrpojob.spec")
        except ClusterError:
            return None

    out = wait_until(explained, "kubectl explain asyncgrpojob.spec", timeout=60, interval=1)
    squashed = " ".join(out.split())
    for field, text in described.items():
        assert field in out
        assert " ".join(text.split())[:40] in squashed, f"description of spec.{field} missing from explain"


def test_asyncgrpojob_cel_rule_rejects_a_name_without_room_for_its_retries(
    kube_api: Api, namespace: str, asyncgrpo_crd: JSON
) -> None:
    """The CRD's own CEL (the cross-field invariants are the chart's ValidatingAdmissionPolicy's,
    tests/e2e/test_admission_policy.py): the last retry's RayCluster `<name>-<backoffLimit>` must
    fit KubeRay's 53 characters."""
    if not EXAMPLE_JOB.exists():
        pytest.skip(f"{EXAMPLE_JOB.relative_to(REPO)} does not exist yet")
    group = asyncgrpo_crd["spec"]["group"]
    version = asyncgrpo_crd["spec"]["versions"][0]["name"]
    path = f"/apis/{group}/{version}/namespaces/{namespace}/{asyncgrpo_crd['spec']['names']['plural']}"
    valid: JSON = yaml.safe_load(EXAMPLE_JOB.read_text())
    kube_api.request("POST", path, valid, query={"dryRun": "All"})  # the example itself is accepted

    invalid = copy.deepcopy(valid)
    invalid["metadata"]["name"] = "x" * 52  # 52 + len("-2") > 53
    invalid["spec"]["backoffLimit"] = 2
    with pytest.raises(ApiError) as exc:
        kube_api.create(path, invalid)
    assert exc.value.status == 422
    assert "metadata.name is too long" in str(exc.value)
