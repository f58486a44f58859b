"""The fake nodes kwok manages: one CPU node for Ray heads and a tainted GPU pool.

The GPU nodes look like a cloud GPU pool (a pool label, nvidia.com/gpu capacity and the
nvidia.com/gpu=present:NoSchedule taint that GPU node pools carry), so manifests that work here
need the same tolerations and nodeSelectors as on a real cluster. Node status is accepted on
create; kwok's node-initialize stage keeps the capacity and marks the node Ready.
"""

from __future__ import annotations

from typing import Any

KWOK_SELECTOR_LABEL = ("type", "kwok")  # kwok manages only nodes with this label
POOL_LABEL = "asyncgrpo.dev/pool"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
GPUS_PER_NODE = 8
GPU_NODE_COUNT = 4
CPU_NODE_COUNT = 1


def _node(
    name: str, labels: dict[str, str], capacity: dict[str, str], taints: list[dict[str, str]]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {
                KWOK_SELECTOR_LABEL[0]: KWOK_SELECTOR_LABEL[1],
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
        "spec": {"taints": taints},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "containerRuntimeVersion": "fake",
                "kernelVersion": "fake",
                "osImage": "fake",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
            "phase": "Running",
        },
    }


def cpu_node(name: str) -> dict[str, Any]:
    """A big untainted CPU node: Ray heads, drivers and the operator's own pods land here."""
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return _node(name, {POOL_LABEL: "cpu", "node.kubernetes.io/instance-type": "fake-cpu-64"}, capacity, [])


def gpu_node(name: str, gpus: int = GPUS_PER_NODE) -> dict[str, Any]:
    """An 8-GPU node of the `gpu` pool, tainted like a cloud GPU pool."""
    capacity = {
        "cpu": "96",
        "memory": "1360Gi",
        "pods": "110",
        "ephemeral-storage": "2Ti",
        GPU_RESOURCE: str(gpus),
    }
    labels = {
        POOL_LABEL: "gpu",
        "node.kubernetes.io/instance-type": "fake-a100-8g",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": str(gpus),
    }
    return _node(name, labels, capacity, [dict(GPU_TAINT)])


def spare_node(name: str) -> dict[str, Any]:
    """A throw-away node for fault tests: its own pool and a NoSchedule taint, so no other test's
    pods land on it and pool-wide checks never see it."""
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    taint = {"key": "asyncgrpo.dev/spare", "value": "true", "effect": "NoSchedule"}
    return _node(name, {POOL_LABEL: "spare"}, capacity, [taint])


def default_nodes() -> list[dict[str, Any]]:
    """kwok-cpu-0 and kwok-gpu-0..3 (8 GPUs each)."""
    cpus = [cpu_node(f"kwok-cpu-{i}") for i in range(CPU_NODE_COUNT)]
    return cpus + [gpu_node(f"kwok-gpu-{i}") for i in range(GPU_NODE_COUNT)]


def bench_nodes(
    cpu_nodes: int, gpu_nodes: int, *, gpus_per_node: int = 64, pods: int = 256
) -> list[dict[str, Any]]:
    """Extra, larger nodes of the same `cpu` and `gpu` pools (same labels and taint), for load tests
    of hundreds of jobs (bench/operator): each holds `pods` pods and the GPU ones `gpus_per_node` GPUs,
    so 500 small jobs fit on a couple of dozen fake nodes instead of 125 real-sized ones."""
    out: list[dict[str, Any]] = []
    for i in range(cpu_nodes):
        node = cpu_node(f"kwok-bench-cpu-{i}")
        node["status"]["capacity"].update(cpu="1024", memory="4Ti", pods=str(pods))
        out.append(node)
    for i in range(gpu_nodes):
        node = gpu_node(f"kwok-bench-gpu-{i}", gpus_per_node)
        node["status"]["capacity"].update(cpu="1024", memory="8Ti", pods=str(pods))
        out.append(node)
    for node in out:
        node["status"]["allocatable"] = node["status"]["capacity"]
    return out
