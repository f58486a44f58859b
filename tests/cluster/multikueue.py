"""MultiKueue on two local control planes: a manager that queues jobs and a worker that runs them.

The worker is a second control plane on this machine, with its own state folder, ports and
kubeconfig (tests/cluster/private.py: `python -m tests.cluster up`, then `kueue`, under
ASYNCGRPO_CLUSTER_STATE and ASYNCGRPO_CLUSTER_PORT_OFFSET). Each runs Kueue and KubeRay; Kueue's
configuration lists the AsyncGRPOJob for MultiKueue's generic adapter (kueue.config:
`multiKueue.externalFrameworks`; the feature gate MultiKueueAdaptersForCustomJobs is beta and on
by default in v0.17), which acts only on the manager, where a ClusterQueue has the check.

What the manager needs, from Kueue's own MultiKueue setup (v0.17.0, site/content/en/docs/tasks/
manage/setup_multikueue.md and apis/kueue/v1beta2/multikueue_types.go):
- a Secret in Kueue's namespace holding the worker's kubeconfig under the key `kubeconfig`, with
  the CA inlined (multikueuecluster.go, validateKubeconfig, refuses certificate-authority paths);
  the client certificate and key are inlined too, so it does not depend on this machine's files;
- a MultiKueueCluster pointing at that Secret, a MultiKueueConfig listing it, an AdmissionCheck
  with controllerName kueue.x-k8s.io/multikueue and that config as its parameters;
- a ClusterQueue whose admissionChecksStrategy names that check. The worker's ClusterQueue has no
  check: there the prebuilt Workload is admitted like any other.
Pure builders: manifests in, manifests out.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from tests.cluster.kueue import API, BASE, NAMESPACE, cluster_queue
from tests.cluster.pki import Pki
from tests.cluster.rest import JSON

CONTROLLER = "kueue.x-k8s.io/multikueue"
WORKER = "worker"
"""The MultiKueueCluster (and the Secret's) name of the worker cluster."""
CHECK = "multikueue"
CONFIG = "multikueue"


def inline_kubeconfig(server: str, pki: Pki) -> str:
    """An admin kubeconfig of a control plane with its CA, client certificate and key inlined."""

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": WORKER, "cluster": {"server": server, "certificate-authority-data": data(pki.ca_crt)}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": data(pki.admin_crt),
                    "client-key-data": data(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": WORKER, "context": {"cluster": WORKER, "user": "admin"}}],
        "current-context": WORKER,
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def kubeconfig_secret(kubeconfig: str, name: str = WORKER) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "Opaque",
        "stringData": {"kubeconfig": kubeconfig},
    }


def multikueue_cluster(name: str = WORKER, secret: str = WORKER) -> JSON:
    return {
        "apiVersion": API,
        "kind": "MultiKueueCluster",
        "metadata": {"name": name},
        "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}},
    }


def multikueue_config(clusters: tuple[str, ...] = (WORKER,), name: str = CONFIG) -> JSON:
    return {
        "apiVersion": API,
        "kind": "MultiKueueConfig",
        "metadata": {"name": name},
        "spec": {"clusters": list(clusters)},
    }


def admission_check(name: str = CHECK, config: str = CONFIG) -> JSON:
    return {
        "apiVersion": API,
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": {
            "controllerName": CONTROLLER,
            "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": config},
        },
    }


def manager_cluster_queue(name: str, *, gpus: int, check: str = CHECK) -> JSON:
    """The manager's ClusterQueue: quota as the worker's, and the MultiKueue admission check."""
    queue = cluster_queue(name, gpus=gpus)
    queue["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    return queue


def paths() -> dict[str, str]:
    """Where each object is server-side applied on the manager."""
    return {
        "secret": f"/api/v1/namespaces/{NAMESPACE}/secrets/{WORKER}",
        "cluster": f"{BASE}/multikueueclusters/{WORKER}",
        "config": f"{BASE}/multikueueconfigs/{CONFIG}",
        "check": f"{BASE}/admissionchecks/{CHECK}",
    }
