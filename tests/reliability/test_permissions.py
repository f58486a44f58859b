"""Permissions: least-privilege RBAC, no API tokens in trainer pods, TLS >= 1.2, non-root pods,
and namespaces that stay closed to users without rights on asyncgrpojobs.

The RBAC test is the convincing one: the operator runs as the chart's ServiceAccount behind a
recording proxy (conftest.py), goes through a job's whole life (create, suspend, resume, a retry,
success, TTL deletion, a spec ConfigMap of someone else's in the way, a spec edit its own ConfigMap
follows, a job under an AsyncGRPORuntime), and the set of (group, resource, verb)
it used must equal the chart's rules exactly: a missing rule would have shown up as a 403, an extra
one is privilege nobody uses. On the way it checks the job's Ray token Secret and NetworkPolicy
(issue 47, item 1): a Secret only created, never read, and a NetworkPolicy put back after a hand edit.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1.job import KUEUE_QUEUE_LABEL
from asyncgrpo_operator import raytoken
from asyncgrpo_operator.manifests import OperatorPods, Owner, network_policy, ray_cluster
from tests.chart.helm import NO_HELM, find_helm, template
from tests.cluster import faults
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, wait_until
from tests.e2e.test_operator import ProgressServer, end_driver, head_pod, job_manifest
from tests.reliability.apiproxy import Permission, permission
from tests.reliability.proxied import ProxiedInstallation, chart_rules, forbidden, used_permissions
from tests.webhook.cluster_harness import JOBS_PATH, METRICS_READER, RUNTIMES_PATH

KUEUE_INSTALLED_ONLY = {
    Permission("kueue.x-k8s.io", "workloads", "create"),
    Permission("kueue.x-k8s.io", "workloads", "watch"),  # the list answers 404 here: no watch follows
    Permission("kueue.x-k8s.io", "workloads", "patch"),
    Permission("kueue.x-k8s.io", "workloads", "delete"),
    Permission("kueue.x-k8s.io", "workloads/status", "patch"),
    Permission("kueue.x-k8s.io", "resourceflavors", "get"),
    Permission("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
    Permission("scheduling.k8s.io", "priorityclasses", "get"),
}
"""What the operator does only for a job Kueue manages once Kueue is installed (its Workload,
the flavors of an admission, the priority of a queued Workload), which this test cluster does not
run: the informer's list of Workloads answering 404 is as far as it gets. tests/e2e/test_kueue.py
and test_multikueue.py exercise these against the real Kueue; here they may go unused, and any
other rule may not."""


def _status(api: Api, ns: str, name: str) -> JSON:
    return api.get(f"{JOBS_PATH.format(ns=ns)}/{name}").get("status") or {}


def _wait_status(api: Api, ns: str, name: str, ok: Any, what: str) -> JSON:
    return wait_until(lambda: s if ok(s := _status(api, ns, name)) else None, what, timeout=90)


@pytest.mark.cluster
def test_the_operators_rbac_is_exactly_what_it_calls_over_a_jobs_whole_life(
    chart: ProxiedInstallation, progress: ProgressServer
) -> None:
    api, ns, name = chart.api, chart.jobs_ns, "rbac-probe"
    proxy = chart.proxy
    assert proxy is not None
    # A ConfigMap named like the job's spec ConfigMap that the job did not create: the job must
    # neither overwrite nor adopt it (issue 27: a job author could replace any ConfigMap and have
    # it garbage-collected with the job), and says so until it is gone.
    configmap_path = f"/api/v1/namespaces/{ns}/configmaps/{name}-spec"
    theirs = {"metadata": {"name": f"{name}-spec", "labels": {"asyncgrpo.dev/job-name": name}}}
    api.create(f"/api/v1/namespaces/{ns}/configmaps", {**theirs, "data": {"job.json": "{}"}})
    manifest = job_manifest(name, cleanupPolicy={"ttlSecondsAfterFinished": 2})
    api.create(JOBS_PATH.format(ns=ns), manifest)
    path = f"{JOBS_PATH.format(ns=ns)}/{name}"

    taken = _wait_status(
        api, ns, name, lambda s: s.get("reason") == "ConfigMapNameTaken", "ConfigMapNameTaken"
    )
    assert taken.get("phase") == "Pending" and not taken.get("rayClusterName")
    left = api.get(configmap_path)
    assert left["data"] == {"job.json": "{}"} and not left["metadata"].get("ownerReferences")
    api.delete(configmap_path)
    _wait_status(api, ns, name, lambda s: s.get("phase") == "Running", "Running")
    # The job's Ray token Secret, created and never read: its token is the one the operator derives
    # from the chart's key, and the one its /progress reads carry; the NetworkPolicy as rendered,
    # accepted by the API server (issue 47, item 1).
    uid = api.get(path)["metadata"]["uid"]
    token = raytoken.derive(chart.ray_token_key_file.read_bytes().strip(), ns, name, uid)
    secret = api.get(f"/api/v1/namespaces/{ns}/secrets/{name}-ray-token")
    assert base64.b64decode(secret["data"]["auth_token"]).decode() == token and secret["immutable"] is True
    wait_until(lambda: progress.authorization.get((ns, name)), "a /progress read", timeout=30)
    assert progress.authorization[(ns, name)] == f"Bearer {token}"
    policy_path = f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}-ray"
    rendered = network_policy(name, ns, Owner(name, uid), operator_pods(chart))
    assert api.get(policy_path)["spec"] == rendered["spec"]
    # Loosened by hand (an ingress rule from anywhere): put back when the cluster resumes.
    api.merge_patch(policy_path, {"spec": {"ingress": [{}]}})
    # A spec edit the running job allows: its own ConfigMap follows (the one write to a ConfigMap
    # that already exists, conditioned on the version at which it was seen to be the job's).
    api.merge_patch(path, {"spec": {"activeDeadlineSeconds": 86400}})
    wait_until(
        lambda: "86400" in api.get(configmap_path)["data"]["job.json"] or None,
        "the spec ConfigMap follows the edit",
        timeout=30,
    )
    api.merge_patch(path, {"spec": {"suspend": True}})
    _wait_status(api, ns, name, lambda s: s.get("phase") == "Suspended", "Suspended")
    api.merge_patch(path, {"spec": {"suspend": False}})
    _wait_status(api, ns, name, lambda s: s.get("phase") == "Running", "Running after resume")
    assert api.get(policy_path)["spec"] == rendered["spec"]
    head = head_pod(api, ns, f"{name}-0")
    assert not [v for v in head["spec"].get("volumes", []) if v["name"].startswith("kube-api-access")], (
        "a trainer pod without a named ServiceAccount got an API token volume"
    )
    assert head["spec"].get("automountServiceAccountToken") is False
    faults.fail_pod(api, ns, head["metadata"]["name"], exit_code=137)
    _wait_status(
        api,
        ns,
        name,
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
        "Running after a retry",
    )
    end_driver(api, ns, head_pod(api, ns, f"{name}-1"), 0)

    def deleted() -> bool | None:
        try:
            api.get(path)
        except ApiError as err:
            return True if err.status == 404 else None
        return None

    wait_until(deleted, "job deleted by its TTL", timeout=60)
    # A job Kueue manages: its RayCluster waits suspended and the operator reads Kueue's Workload for
    # the reason (here Kueue is not installed, which the job reports as well).
    queued = job_manifest("rbac-queued")
    queued["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: "gpu"}
    api.create(JOBS_PATH.format(ns=ns), queued)
    _wait_status(api, ns, "rbac-queued", lambda s: s.get("phase") == "Queued", "Queued")
    api.delete(f"{JOBS_PATH.format(ns=ns)}/rbac-queued")
    # A job under an AsyncGRPORuntime: the webhook reads the runtime, and so does every pass.
    runtime = {"apiVersion": "asyncgrpo.dev/v1alpha1", "kind": "AsyncGRPORuntime"}
    api.create(RUNTIMES_PATH, {**runtime, "metadata": {"name": "rbac-runtime"}, "spec": {"images": ["*"]}})
    api.create(JOBS_PATH.format(ns=ns), job_manifest("rbac-confined", runtimeRef={"name": "rbac-runtime"}))
    _wait_status(api, ns, "rbac-confined", lambda s: s.get("rayClusterName"), "its RayCluster")
    api.delete(f"{JOBS_PATH.format(ns=ns)}/rbac-confined")
    api.delete(f"{RUNTIMES_PATH}/rbac-runtime")
    # Prometheus scrapes /metrics (metrics.secure): the operator reviews its token, then whether
    # it may get /metrics; a token without the right is refused after the same two reviews.
    assert chart.read_metrics(chart.token(METRICS_READER))[0] == 200
    assert chart.read_metrics(chart.token("not-prometheus"))[0] == 403
    time.sleep(1)

    calls = list(proxy.calls)
    refused = forbidden(calls)
    assert not refused, refused
    used = used_permissions(calls)
    granted = chart_rules({"operator.watchNamespaces": [ns]})
    print("operator used:", sorted((p.group, p.resource, p.verb) for p in used))
    assert used - granted == set(), f"used but not granted: {used - granted}"
    unused = granted - used - KUEUE_INSTALLED_ONLY
    assert unused == set(), f"granted but never used: {unused}"
    assert granted >= KUEUE_INSTALLED_ONLY, KUEUE_INSTALLED_ONLY - granted
    leases = {p.name for c in calls if (p := permission(c)) is not None and p.resource == "leases" and p.name}
    assert leases <= {"asyncgrpo-operator"}, leases


def operator_pods(chart: ProxiedInstallation) -> OperatorPods:
    """The operator's pods as the installation names them to the operator (as the chart does)."""
    return OperatorPods(
        chart.namespace,
        {"app.kubernetes.io/instance": chart.release, "app.kubernetes.io/name": "asyncgrpo-operator"},
    )


def test_trainer_pods_get_no_api_token_unless_a_service_account_is_named() -> None:
    manifest = job_manifest("tokenless")
    for service_account, automount in ((None, False), ("trainer-sa", None)):
        spec = dict(manifest["spec"])
        if service_account:
            spec["serviceAccountName"] = service_account

        job = validate_manifest({**manifest, "spec": spec}).job
        assert job is not None
        cluster = ray_cluster(job, 0)
        templates = [cluster["spec"]["headGroupSpec"]["template"]] + [
            g["template"] for g in cluster["spec"].get("workerGroupSpecs", [])
        ]
        assert len(templates) == 3
        for pod in templates:
            assert pod["spec"].get("automountServiceAccountToken") is automount, pod["spec"]
            assert pod["spec"].get("serviceAccountName") == service_account


@pytest.mark.cluster
@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_the_webhook_refuses_tls_1_1_and_serves_1_2_and_1_3(chart: ProxiedInstallation) -> None:
    def handshake(version: ssl.TLSVersion, port: int, cafile: str | None = None) -> str | None:
        """The negotiated protocol, or None when the handshake fails."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the *client* offer old protocols
        ctx.minimum_version = ctx.maximum_version = version
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
                ctx.wrap_socket(sock) as tls,
            ):
                return tls.version()
        except (ssl.SSLError, OSError):
            return None

    # Control: this client can speak TLS 1.1 at all (else a refusal would prove nothing).
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(chart.tls_dir / "tls.crt"), str(chart.tls_dir / "tls.key"))
    server_ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1
    listener = socket.create_server(("127.0.0.1", 0))
    control_port = listener.getsockname()[1]

    def serve_once() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()
    control = handshake(ssl.TLSVersion.TLSv1_1, control_port)
    listener.close()
    if control != "TLSv1.1":
        pytest.skip(
            "this OpenSSL cannot speak TLS 1.1 even to a permissive server; the check would be vacuous"
        )

    assert handshake(ssl.TLSVersion.TLSv1, chart.port) is None
    assert handshake(ssl.TLSVersion.TLSv1_1, chart.port) is None
    assert handshake(ssl.TLSVersion.TLSv1_2, chart.port) == "TLSv1.2"
    assert handshake(ssl.TLSVersion.TLSv1_3, chart.port) == "TLSv1.3"


def test_the_operator_pods_run_non_root_with_a_read_only_root_filesystem() -> None:
    """Both of the chart's Deployments: the reconciler's and the webhook's."""
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    deployments = [o for o in template(helm_bin) if o.get("kind") == "Deployment"]
    assert len(deployments) == 2, [d["metadata"]["name"] for d in deployments]
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"] + pod.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, container["name"]
            assert sc["allowPrivilegeEscalation"] is False, container["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], container["name"]
            assert sc.get("runAsUser", pod["securityContext"]["runAsUser"]) != 0


def _as_user(api: Api, user: str, method: str, path: str, body: JSON | None = None) -> int:
    """The HTTP status of one request made as `user` (impersonated by the admin)."""
    request = urllib.request.Request(
        api.base_url + path, data=json.dumps(body).encode() if body else None, method=method
    )
    request.add_header("Impersonate-User", user)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, context=api.ctx, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.mark.cluster
def test_a_user_without_rights_on_jobs_can_neither_create_nor_read_them(
    chart: ProxiedInstallation, progress: ProgressServer
) -> None:
    """`mallory` may read ConfigMaps and pods in the namespace (a common `view`-like grant) but has
    no rule on asyncgrpojobs: she can create no job and read no job, its spec included."""
    api, ns = chart.api, chart.jobs_ns
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    api.create(
        f"{rbac}/roles",
        {
            "metadata": {"name": "pods-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    api.create(
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": "mallory-pods-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}],
        },
    )
    manifest = job_manifest("secretive")
    api.create(JOBS_PATH.format(ns=ns), manifest)
    jobs = JOBS_PATH.format(ns=ns)
    attempt = {**manifest, "metadata": {"name": "intruder"}}
    assert _as_user(api, "mallory", "POST", jobs, attempt) == 403
    assert _as_user(api, "mallory", "GET", f"{jobs}/secretive") == 403
    assert _as_user(api, "mallory", "GET", jobs) == 403
    assert _as_user(api, "mallory", "GET", "/apis/asyncgrpo.dev/v1alpha1/asyncgrpojobs") == 403
    assert _as_user(api, "mallory", "GET", f"/api/v1/namespaces/{ns}/configmaps/secretive-spec") == 403
    assert _as_user(api, "mallory", "GET", f"/apis/ray.io/v1/namespaces/{ns}/rayclusters") == 403
    assert _as_user(api, "mallory", "GET", f"/api/v1/namespaces/{ns}/pods") == 200  # the grant works
    assert pods(api, ns) is not None
