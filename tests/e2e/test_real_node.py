"""Real containers on the real node (tests/cluster/node.py), beside the kwok nodes.

The `real_node` fixture builds the node once (kubelet, containerd, CNI plugins, crictl, CoreDNS;
minutes cold) and starts it on the session's control plane. The pods run Debian's static busybox,
imported into containerd as an image (no registry, no pull). What a user's cluster does and kwok
cannot: a container runs and logs, gets an address from the bridge, finds another pod through a
Service by its DNS name (kube-proxy and CoreDNS), reaches the API server through the `kubernetes`
Service, is OOMKilled over its memory limit, and writes to a hostPath volume; and an image archive
imported while the node runs starts without a pull. Needs root (as the node does) and
`apt-get install busybox-static runc`.
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import node, oci
from tests.cluster.build import build_node
from tests.cluster.cluster import LocalCluster
from tests.cluster.config import (
    CLUSTER_DOMAIN,
    REAL_NODE_IP,
    REAL_NODE_NAME,
    REAL_POD_CIDR,
    kubernetes_version,
)
from tests.cluster.nodes import KWOK_SELECTOR_LABEL
from tests.cluster.rest import JSON, Api
from tests.cluster.samples import wait_until

pytestmark = pytest.mark.cluster

POD_START_TIMEOUT = 120.0  # the first pod on a loaded 2-core machine: sandbox, CNI, container


@pytest.fixture(scope="session")
def real_node(local_cluster: LocalCluster) -> LocalCluster:
    """The real node running on the session's control plane (built and started on first use)."""
    missing = node.missing_prerequisites()
    if missing:
        pytest.fail(f"the real node needs {missing}: run as root; apt-get install busybox-static runc")
    local_cluster.start_real_node(build_node())
    return local_cluster


def busybox_pod(name: str, script: str, **spec: Any) -> JSON:
    """A pod on the real node running `sh -c script` in the imported busybox image, never pulled."""
    container: JSON = {
        "name": "main",
        "image": node.BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            **node.pod_placement(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def create_pod(api: Api, namespace: str, pod: JSON) -> None:
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def wait_pod(api: Api, namespace: str, name: str, phases: set[str]) -> JSON:
    """The pod once its phase is one of `phases`; fails at once if it ends in another one."""

    def reached() -> JSON | None:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        phase = pod.get("status", {}).get("phase")
        if phase in {"Succeeded", "Failed"} - phases:
            raise AssertionError(f"pod {name} ended {phase}: {pod['status']}")
        return pod if phase in phases else None

    return wait_until(reached, f"pod {name} {'/'.join(sorted(phases))}", timeout=POD_START_TIMEOUT)


def test_the_real_node_is_ready_beside_the_kwok_nodes_and_kwok_leaves_it_alone(
    real_node: LocalCluster, kube_api: Api
) -> None:
    real = kube_api.get(f"/api/v1/nodes/{REAL_NODE_NAME}")
    info = real["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kubernetes_version()
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    assert KWOK_SELECTOR_LABEL[0] not in real["metadata"]["labels"]  # kwok selects type=kwok only
    assert node.TAINT in real["spec"]["taints"]
    kwok = kube_api.get("/api/v1/nodes", labelSelector="=".join(KWOK_SELECTOR_LABEL))["items"]
    assert kwok and all(n["status"]["nodeInfo"]["kubeletVersion"] == "fake" for n in kwok)


def test_a_pod_on_a_kwok_node_still_runs_beside_the_real_node(
    real_node: LocalCluster, kube_api: Api, namespace: str
) -> None:
    pod = busybox_pod("fake", "true")
    pod["spec"] = {"nodeSelector": {"asyncgrpo.dev/pool": "cpu"}, "containers": pod["spec"]["containers"]}
    create_pod(kube_api, namespace, pod)
    running = wait_pod(kube_api, namespace, "fake", {"Running"})
    assert running["spec"]["nodeName"].startswith("kwok-cpu-")


def test_a_busybox_pod_runs_on_the_real_node_with_a_bridge_address_and_logs(
    real_node: LocalCluster, kube_api: Api, namespace: str
) -> None:
    create_pod(kube_api, namespace, busybox_pod("hello", "echo hello from $(hostname); sleep 3600"))
    pod = wait_pod(kube_api, namespace, "hello", {"Running"})
    assert pod["spec"]["nodeName"] == REAL_NODE_NAME
    assert pod["status"]["hostIP"] == REAL_NODE_IP
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(REAL_POD_CIDR)
    logs = wait_until(
        lambda: real_node.kubectl("logs", "-n", namespace, "hello").strip() or None, "the pod's log line"
    )
    assert logs == "hello from hello"


def test_a_pod_reaches_another_through_a_cluster_ip_service_by_its_dns_name(
    real_node: LocalCluster, kube_api: Api, namespace: str
) -> None:
    token = secrets.token_hex(8)
    serve = f"mkdir /www && echo {token} > /www/index.html && exec httpd -f -p 8080 -h /www"
    server = busybox_pod("web", serve)
    server["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    create_pod(kube_api, namespace, server)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    kube_api.create(f"/api/v1/namespaces/{namespace}/services", service)
    wait_pod(kube_api, namespace, "web", {"Running"})
    fqdn = f"web.{namespace}.svc.{CLUSTER_DOMAIN}"
    # Retried: kube-proxy programs the Service's endpoint once the server is ready.
    script = f"for i in $(seq 30); do wget -qO- http://{fqdn}/index.html && exit 0; sleep 1; done; exit 1"
    create_pod(kube_api, namespace, busybox_pod("client", script))
    wait_pod(kube_api, namespace, "client", {"Succeeded"})
    assert real_node.kubectl("logs", "-n", namespace, "client").strip() == token


def test_a_container_over_its_memory_limit_is_oomkilled(
    real_node: LocalCluster, kube_api: Api, namespace: str
) -> None:
    limits = {"resources": {"limits": {"memory": "32Mi", "cpu": "200m"}}}
    hog = busybox_pod("hog", "dd if=/dev/zero of=/dev/null bs=256M count=1", container=limits)
    create_pod(kube_api, namespace, hog)
    pod = wait_pod(kube_api, namespace, "hog", {"Failed"})
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "OOMKilled"
    assert status["state"]["terminated"]["exitCode"] == 137


def test_a_hostpath_volume_is_writable(
    real_node: LocalCluster, kube_api: Api, namespace: str, tmp_path: Path
) -> None:
    host_dir = tmp_path / "hostpath"
    volume = {"name": "data", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}}
    mount = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    pod = busybox_pod("writer", "echo written-by-the-pod > /data/out.txt", container=mount, volumes=[volume])
    create_pod(kube_api, namespace, pod)
    wait_pod(kube_api, namespace, "writer", {"Succeeded"})
    assert (host_dir / "out.txt").read_text() == "written-by-the-pod\n"


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    real_node: LocalCluster, kube_api: Api, namespace: str
) -> None:
    # busybox's TLS client fails the handshake with Go's TLS server, so this speaks plain HTTP to
    # the HTTPS port: the answer is the API server's own (Go's net/http) "HTTPS server" reply.
    host = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
    script = f"printf 'GET /version HTTP/1.0\\r\\n\\r\\n' | nc {host} 443"
    create_pod(kube_api, namespace, busybox_pod("in-cluster", script))
    wait_pod(kube_api, namespace, "in-cluster", {"Succeeded"})
    reply = real_node.kubectl("logs", "-n", namespace, "in-cluster")
    assert "Client sent an HTTP request to an HTTPS server" in reply


def test_an_image_archive_imported_while_the_node_runs_starts_without_a_pull(
    real_node: LocalCluster, kube_api: Api, namespace: str, tmp_path: Path
) -> None:
    image = f"{oci.LOCAL_REGISTRY}/imported:{secrets.token_hex(4)}"
    archive = tmp_path / "imported.tar"
    oci.write_image(archive, image, {"bin/busybox": node.BUSYBOX}, entrypoint=["/bin/busybox"])
    real_node.import_image(archive)  # what `python -m tests.cluster import-image` does
    pod = busybox_pod("imported", "unused")
    pod["spec"]["containers"][0].update(image=image, command=["/bin/busybox", "echo", "imported"])
    create_pod(kube_api, namespace, pod)
    wait_pod(kube_api, namespace, "imported", {"Succeeded"})
    assert real_node.kubectl("logs", "-n", namespace, "imported").strip() == "imported"
