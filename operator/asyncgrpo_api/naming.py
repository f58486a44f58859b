"""Names derived from a job that users see and that Kubernetes and KubeRay limit.

They belong to the API contract: the admission rules must know how long a derived name can get,
and status.rayClusterName reports it.
"""

from __future__ import annotations

MAX_RAYCLUSTER_NAME_LENGTH = 53
"""KubeRay rejects longer RayCluster names (its head Service and pod names derive from them)."""


def raycluster_name(job_name: str, attempt: int) -> str:
    """The RayCluster of one attempt: a fresh one per retry, so names never collide across attempts."""
    return f"{job_name}-{attempt}"


def spec_configmap_name(job_name: str) -> str:
    """The ConfigMap holding the validated job spec the driver reads."""
    return f"{job_name}-spec"


def ray_token_secret_name(job_name: str) -> str:
    """The Secret with the job's Ray token (`ray_auth`), which every attempt's RayCluster names.
    The same for every attempt, and free of the job's UID: a MultiKueue worker renders the same
    pods as the manager cluster did."""
    return f"{job_name}-ray-token"


def network_policy_name(job_name: str) -> str:
    """The NetworkPolicy that admits to the job's pods only its own pods and the operator."""
    return f"{job_name}-ray"
