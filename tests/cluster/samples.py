"""Objects the control-plane tests and measurements create, and waits on them.

Shared by tests/e2e/test_control_plane.py and tests/cluster/measure.py so that the benchmark
measures exactly what the tests prove works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from tests.cluster.nodes import GPU_RESOURCE, GPU_TAINT, POOL_LABEL
from tests.cluster.rest import JSON, Api, condition

RAY_VERSION = "2.46.0"
RAY_IMAGE = f"rayproject/ray:{RAY_VERSION}"  # never pulled: kwok runs no containers
T = TypeVar("T")


def wait_until(fn: Callable[[], T | None], what: str, timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll `fn` until it returns something truthy and return that; TimeoutError names `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def gpu_worker_pod_spec(gpus: int, container: str = "ray-worker") -> JSON:
    """A pod spec for the GPU pool: nodeSelector, toleration for its taint, nvidia.com/gpu limits."""
    resources = {"cpu": "8", "memory": "32Gi", GPU_RESOURCE: str(gpus)}
    return {
        "nodeSelector": {POOL_LABEL: "gpu"},
        "tolerations": [{"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}],
        "containers": [
            {"name": container, "image": RAY_IMAGE, "resources": {"requests": resources, "limits": resources}}
        ],
    }


def raycluster(name: str, *, gpu_workers: int = 2, gpus_per_worker: int = 8) -> JSON:
    """A RayCluster: a CPU head on the cpu pool and one GPU worker group on the gpu pool."""
    head_res = {"cpu": "2", "memory": "8Gi"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "nodeSelector": {POOL_LABEL: "cpu"},
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": RAY_IMAGE,
                                "resources": {"requests": head_res, "limits": head_res},
                            }
                        ],
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": gpu_workers,
                    "minReplicas": 0,
                    "maxReplicas": gpu_workers,
                    "rayStartParams": {},
                    "template": {"spec": gpu_worker_pod_spec(gpus_per_worker)},
                }
            ],
        },
    }


def raycluster_path(namespace: str, name: str = "") -> str:
    base = f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters"
    return f"{base}/{name}" if name else base


def raycluster_ready(api: Api, namespace: str, name: str) -> JSON | None:
    """The RayCluster once KubeRay reports it ready (state and HeadPodReady/Provisioned conditions)."""
    rc = api.get(raycluster_path(namespace, name))
    status: dict[str, Any] = rc.get("status", {})
    head = condition(rc, "HeadPodReady")
    provisioned = condition(rc, "RayClusterProvisioned")
    ok = (
        status.get("state") == "ready"
        and head is not None
        and head["status"] == "True"
        and provisioned is not None
        and provisioned["status"] == "True"
    )
    return rc if ok else None


def pods(api: Api, namespace: str, selector: str = "") -> list[JSON]:
    query = {"labelSelector": selector} if selector else {}
    items: list[JSON] = api.get(f"/api/v1/namespaces/{namespace}/pods", **query).get("items", [])
    return items


def pod_ready(pod: JSON) -> bool:
    c = condition(pod, "Ready")
    return pod.get("status", {}).get("phase") == "Running" and c is not None and c["status"] == "True"
