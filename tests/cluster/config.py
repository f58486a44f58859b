"""Pinned versions, fixed ports and folder locations of the local control plane.

Everything the builder, the launcher and the tests need to agree on lives here, so that a port or a
folder is never spelled twice. Versions come from versions.toml (the single pin) and are checked
against the wrapper go.mod files by the builder.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOMOD_DIR = HERE / "gomod"
VERSIONS_FILE = HERE / "versions.toml"

# Fixed loopback ports. They sit away from the upstream defaults (2379, 6443, 10257, ...) so that
# a developer's own cluster on this machine does not collide; `up` fails with the port's name if
# one is taken. A second, independent cluster on the same machine needs its own state folder AND
# ASYNCGRPO_CLUSTER_PORT_OFFSET (e.g. 100), set the same way for every command that uses it.
PORT_OFFSET = int(os.environ.get("ASYNCGRPO_CLUSTER_PORT_OFFSET", "0"))
_BASE_PORTS: dict[str, int] = {
    "etcd-client": 16379,
    "etcd-peer": 16380,
    "kube-apiserver": 16443,
    "kube-controller-manager": 16257,
    "kube-scheduler": 16259,
    "kwok": 16247,
    "ray-operator-probe": 16082,
    "kueue-webhook": 16093,
    "kueue-probe": 16081,
    "kubelet": 16250,  # on NODE_IP (the API server dials it for logs and exec); the rest on HOST
    "kubelet-healthz": 16248,
    "kube-proxy-healthz": 16256,
    "kube-proxy-metrics": 16249,
    "coredns-health": 16054,
    "coredns-ready": 16181,
}
PORTS: dict[str, int] = {name: port + PORT_OFFSET for name, port in _BASE_PORTS.items()}

# How long a kwok node may go without renewing its lease before the node lifecycle controller
# marks it NotReady (and its pods not ready): short, so node-failure tests see NotReady in
# seconds. A cluster whose API server is restarted on purpose sets it longer
# (ASYNCGRPO_NODE_GRACE_SECONDS): the lease cannot be renewed while the server is down, and on a
# loaded machine down time plus restart can pass 20 s.
NODE_GRACE_SECONDS = int(os.environ.get("ASYNCGRPO_NODE_GRACE_SECONDS", "20"))

HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"  # kwok's fake pod IPs; kept apart from the service range
NODE_IP = "10.250.0.1"

# The real node (tests/cluster/node.py). Its network is machine-wide (a bridge, iptables rules), so
# one machine runs at most one real node, whatever the port offset. Its pods get addresses from
# REAL_POD_CIDR on the bridge, whose own address (the first of the range) is the node's IP: the
# kubelet serves there and CoreDNS listens there, behind the kube-dns Service at CLUSTER_DNS_IP.
REAL_NODE_NAME = "real-node-0"
REAL_POD_CIDR = "10.245.0.0/24"
REAL_NODE_IP = "10.245.0.1"
BRIDGE = "agrpo0"
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class Component:
    """One upstream Go module we build binaries from."""

    name: str
    version: str
    module: str
    gomod: str
    optional: bool = False
    """Built and started only on request (`up --kueue`, a test's fixture), never for the demo."""

    @property
    def gomod_dir(self) -> Path:
        return GOMOD_DIR / self.gomod


@cache
def components() -> dict[str, Component]:
    """Read versions.toml once; keys are kubernetes, etcd, kwok, kuberay, helm and kueue."""
    data = tomllib.loads(VERSIONS_FILE.read_text())
    return {
        name: Component(
            name=name,
            version=str(v["version"]),
            module=str(v["module"]),
            gomod=str(v["gomod"]),
            optional=bool(v.get("optional", False)),
        )
        for name, v in data.items()
    }


def kubernetes_version() -> str:
    """The gitVersion the API server must report on /version, e.g. v1.36.3."""
    return components()["kubernetes"].version


def cache_root() -> Path:
    """~/.cache/asyncgrpo/ctrlplane unless ASYNCGRPO_CACHE says otherwise (then <it>/ctrlplane)."""
    base = os.environ.get("ASYNCGRPO_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "asyncgrpo"
    return root / "ctrlplane"


def state_dir() -> Path:
    """Where `up` keeps PKI, etcd data, logs, PIDs and the kubeconfig (ASYNCGRPO_CLUSTER_STATE)."""
    env = os.environ.get("ASYNCGRPO_CLUSTER_STATE")
    return Path(env).expanduser().resolve() if env else cache_root() / "state"
