"""Cluster DNS for the real node: CoreDNS as a process, behind the kube-dns Service.

Why a process and not a pod: it needs no image (no registry serves one here) and answers before
the node's first pod starts. So it runs on this machine, listening on the node's IP (the bridge's
address, which pods reach directly), and the kube-dns Service at CLUSTER_DNS_IP, the nameserver
the kubelet writes into every pod's resolv.conf, has no selector but an EndpointSlice naming that
address: kube-proxy forwards pods' queries there as it would to CoreDNS pods. It answers for
cluster.local (and reverse lookups of it) only, with no `forward`: a name outside the cluster is
not resolved, and no query ever leaves this machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cluster.components import Spec
from tests.cluster.config import CLUSTER_DNS_IP, CLUSTER_DOMAIN, HOST, PORTS, REAL_NODE_IP

SERVICE = "kube-dns"
NAMESPACE = "kube-system"
PORT = 53


def corefile(kubeconfig: Path) -> str:
    return f"""\
.:{PORT} {{
    bind {REAL_NODE_IP}
    errors
    health {HOST}:{PORTS["coredns-health"]}
    ready {HOST}:{PORTS["coredns-ready"]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loadbalance
}}
"""


def coredns(binary: Path, config: Path) -> Spec:
    """CoreDNS, ready once its kubernetes plugin has synced (the ready plugin's /ready)."""
    return Spec("coredns", [str(binary), f"-conf={config}"], f"http://{HOST}:{PORTS['coredns-ready']}/ready")


def _ports() -> list[dict[str, Any]]:
    udp = {"name": "dns", "port": PORT, "protocol": "UDP"}
    return [udp, {"name": "dns-tcp", "port": PORT, "protocol": "TCP"}]


def service() -> dict[str, Any]:
    """kube-dns at CLUSTER_DNS_IP, without a selector (its endpoints are `endpoint_slice`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {"k8s-app": SERVICE}},
        "spec": {"clusterIP": CLUSTER_DNS_IP, "ports": _ports()},
    }


def endpoint_slice() -> dict[str, Any]:
    """kube-dns's one endpoint: CoreDNS on the node's IP (managed by us, not by a controller)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-coredns",
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": SERVICE,
                "endpointslice.kubernetes.io/managed-by": "asyncgrpo-local-cluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [REAL_NODE_IP], "conditions": {"ready": True}}],
        "ports": _ports(),
    }
