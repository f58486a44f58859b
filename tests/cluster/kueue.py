"""Kueue on the local control plane: its configuration, webhooks and the GPU queue it admits to.

Kueue is an optional component: `python -m tests.cluster up --kueue`, `kueue on` on a live cluster,
or the `kueue` pytest fixture build it (once, into its own cache folder) and start it on the running
control plane. The demo and the other tests never wait for it.

What it takes, and why:
- Its CRDs (kueue.x-k8s.io, from the pinned module), server-side applied and Established first.
- Its webhooks, over TLS on 127.0.0.1: the RayCluster defaulter is what suspends a queued cluster
  and the validators guard its own objects. The serving certificate is issued by the cluster CA
  (pki.issue, as for the operator's webhook) and the webhook configurations are the module's own,
  pointed at https://127.0.0.1:<port> instead of a Service (the API server would resolve a Service
  to a fake kwok pod IP). Only the webhooks of Kueue's own kinds and of RayClusters are registered:
  the others (pods, Jobs, Deployments, ...) belong to integrations that are off here, and would put
  a webhook call, and a dependency on Kueue being up, in front of every pod creation.
- Its metrics certificate: with internal certificate management off, Kueue's main.go loads one from
  the fixed path /etc/kueue/metrics/certs at start and exits without it, even with its metrics server
  off. A throwaway pair is written there if none exists (it is never served: metrics are off).
- A ResourceFlavor and a ClusterQueue (`gpu-pool`) whose quota is the fake nodes' capacity: the CPU
  node's and the GPU pool's cpu and memory, and the GPU pool's 32 nvidia.com/gpu. Pods keep the
  nodeSelectors and tolerations the operator renders, so the flavor carries no node labels. Jobs
  reach it through a LocalQueue in their namespace (`local_queue`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import components as comp
from tests.cluster import pki as pki_mod
from tests.cluster.build import OptionalLayout
from tests.cluster.config import HOST, PORTS
from tests.cluster.nodes import GPU_NODE_COUNT, GPU_RESOURCE, GPUS_PER_NODE, default_nodes
from tests.cluster.rest import JSON, Api, ApiError, condition

API = "kueue.x-k8s.io/v1beta2"
BASE = f"/apis/{API}"
NAMESPACE = "kueue-system"
FLAVOR = "default-flavor"
CLUSTER_QUEUE = "gpu-pool"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""A job's WorkloadPriorityClass."""
FRAMEWORKS = ("ray.io/raycluster",)
EXTERNAL_FRAMEWORKS = ("AsyncGRPOJob.v1alpha1.asyncgrpo.dev",)
"""The operator manages these jobs' Workloads itself (Kueue's externalFrameworks)."""
PODS_READY_TIMEOUT_SECONDS = 40
"""waitForPodsReady: an admitted job whose pods are not all ready this long is evicted and requeued
(kwok's pods are ready within seconds, but a loaded 2-core machine has taken 20 s; the e2e test of
the timeout waits this long once)."""
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
"""Hard-coded in Kueue's cmd/kueue/main.go (v0.17.0) for internalCertManagement.enable false."""
_KEPT_GROUPS = {"kueue.x-k8s.io", "ray.io"}


def config(state: Path) -> dict[str, Any]:
    """Kueue's Configuration: our ports on 127.0.0.1, no leader election, our certificates, the
    AsyncGRPOJob as an external framework (the operator owns each job's Workload), the RayCluster
    integration on as in Kueue's default configuration (it must leave the operator's RayClusters,
    children of a job Kueue manages, alone), waitForPodsReady with a short timeout, and the
    AsyncGRPOJob for MultiKueue's generic adapter (used only where a ClusterQueue has a MultiKueue
    admission check: the manager of tests/cluster/multikueue.py)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{HOST}:{PORTS['kueue-probe']}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": HOST, "port": PORTS["kueue-webhook"], "certDir": str(state / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": list(FRAMEWORKS), "externalFrameworks": list(EXTERNAL_FRAMEWORKS)},
        "multiKueue": {"externalFrameworks": [{"name": name} for name in EXTERNAL_FRAMEWORKS]},
        "waitForPodsReady": {
            "timeout": f"{PODS_READY_TIMEOUT_SECONDS}s",
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 1, "backoffMaxSeconds": 10},
        },
    }


def webhook_configurations(docs: list[JSON], ca_bundle: bytes) -> list[JSON]:
    """The module's webhook configurations, renamed `kueue-*`, addressed at 127.0.0.1 and cut to
    the webhooks of Kueue's kinds and RayClusters (see the module docstring)."""
    out: list[JSON] = []
    ca = base64.b64encode(ca_bundle).decode()
    for doc in docs:
        hooks = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            resources = {r for rule in hook.get("rules") or [] for r in rule.get("resources") or []}
            if not groups <= _KEPT_GROUPS or ("ray.io" in groups and resources != {"rayclusters"}):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hooks.append(
                {
                    **hook,
                    "clientConfig": {"url": f"https://{HOST}:{PORTS['kueue-webhook']}{path}", "caBundle": ca},
                }
            )
        meta = {"name": f"kueue-{doc['metadata']['name']}"}
        out.append(
            {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta, "webhooks": hooks}
        )
    return out


def _capacity() -> dict[str, int]:
    """cpu (cores), memory (GiB) and GPUs of the default fake nodes: the queue's quota."""
    cpu = memory = 0
    for node in default_nodes():
        cap = node["status"]["capacity"]
        cpu += int(cap["cpu"])
        memory += int(str(cap["memory"]).removesuffix("Gi"))
    return {"cpu": cpu, "memory": memory, GPU_RESOURCE: GPU_NODE_COUNT * GPUS_PER_NODE}


def resource_flavor(
    name: str = FLAVOR, node_labels: dict[str, str] | None = None, tolerations: list[JSON] | None = None
) -> JSON:
    """A ResourceFlavor; `node_labels` and `tolerations` are what admission puts into the pods."""
    spec: JSON = {}
    if node_labels:
        spec["nodeLabels"] = node_labels
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def apply_resource_flavor(api: Api, flavor: JSON) -> JSON:
    api.apply(f"{BASE}/resourceflavors/{flavor['metadata']['name']}", json.dumps(flavor))
    return flavor


def cluster_queue(
    name: str = CLUSTER_QUEUE, *, gpus: int | None = None, flavor: str = FLAVOR, gpu_flavor: str | None = None
) -> JSON:
    """A ClusterQueue for every namespace; `gpus` caps nvidia.com/gpu (default: the whole GPU pool).
    With `gpu_flavor`, GPUs come from that flavor in a resource group of their own (cpu and memory
    from `flavor`): a pod set that asks for GPUs is admitted on both flavors.

    Preemption within the queue by priority is on, so a higher-priority job can take the GPUs of a
    running lower-priority one (Kueue suspends its RayCluster; the operator shows Queued/Preempted).
    """
    cap = _capacity()
    quota = [
        {"name": "cpu", "nominalQuota": str(cap["cpu"])},
        {"name": "memory", "nominalQuota": f"{cap['memory']}Gi"},
        {"name": GPU_RESOURCE, "nominalQuota": str(cap[GPU_RESOURCE] if gpus is None else gpus)},
    ]
    groups: list[JSON] = [
        {
            "coveredResources": ["cpu", "memory", GPU_RESOURCE],
            "flavors": [{"name": flavor, "resources": quota}],
        }
    ]
    if gpu_flavor is not None:
        groups = [
            {"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": quota[:2]}]},
            {"coveredResources": [GPU_RESOURCE], "flavors": [{"name": gpu_flavor, "resources": quota[2:]}]},
        ]
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": groups,
        },
    }


def local_queue(namespace: str, name: str, cluster_queue_name: str = CLUSTER_QUEUE) -> JSON:
    """The namespaced queue a job names in its kueue.x-k8s.io/queue-name label."""
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def create_local_queue(api: Api, namespace: str, name: str, cluster_queue_name: str = CLUSTER_QUEUE) -> JSON:
    return api.create(
        f"{BASE}/namespaces/{namespace}/localqueues", local_queue(namespace, name, cluster_queue_name)
    )


def apply_cluster_queue(api: Api, queue: JSON) -> JSON:
    """Server-side apply a ClusterQueue and return it once Kueue reports it Active."""
    path = f"{BASE}/clusterqueues/{queue['metadata']['name']}"
    api.apply(path, json.dumps(queue))
    return queue


def cluster_queue_active(api: Api, name: str) -> bool:
    try:
        cq = api.get(f"{BASE}/clusterqueues/{name}")
    except ApiError:
        return False
    c = condition(cq, "Active")
    return c is not None and c["status"] == "True"


def ensure_metrics_cert(pki: pki_mod.Pki) -> None:
    """Put a certificate where Kueue insists on loading one (see METRICS_CERT_DIR), if none is there."""
    if (METRICS_CERT_DIR / "tls.crt").is_file() and (METRICS_CERT_DIR / "tls.key").is_file():
        return
    crt, key = pki_mod.issue(pki, "kueue-metrics", cn="kueue-metrics", sans=(HOST,))
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for src, name in ((crt, "tls.crt"), (key, "tls.key")):
            tmp = METRICS_CERT_DIR / f".{name}.{os.getpid()}"
            shutil.copyfile(src, tmp)
            tmp.replace(METRICS_CERT_DIR / name)  # atomic: a concurrent start reads a whole file
    except OSError as err:
        raise PermissionError(
            f"Kueue v0.17 loads a metrics certificate from {METRICS_CERT_DIR} at start and this user cannot "
            f"write it ({err}); create tls.crt and tls.key there once (any pair, e.g. "
            f"cp {crt} {METRICS_CERT_DIR}/tls.crt && cp {key} {METRICS_CERT_DIR}/tls.key)"
        ) from err


def configured(state: Path) -> bool:
    """Whether the Kueue that runs was started with the configuration this checkout writes (the
    external framework and waitForPodsReady came later: a Kueue started before lacks them)."""
    path = state / "config.yaml"
    try:
        return bool(yaml.safe_load(path.read_text()) == config(state))
    except (OSError, yaml.YAMLError):
        return False


def prepare(state: Path, pki: pki_mod.Pki) -> Path:
    """Write Kueue's serving certificate and config under `state`; return the config file."""
    certs = state / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    crt, key = pki_mod.issue(pki, "kueue-webhook", cn="kueue-webhook", sans=(HOST, "localhost"))
    shutil.copyfile(crt, certs / "tls.crt")
    shutil.copyfile(key, certs / "tls.key")
    (certs / "tls.key").chmod(0o600)
    ensure_metrics_cert(pki)
    path = state / "config.yaml"
    path.write_text(yaml.safe_dump(config(state), sort_keys=False))
    return path


def spec(build: OptionalLayout, config_file: Path) -> comp.Spec:
    return comp.kueue(build.binary("kueue"), config_file)
