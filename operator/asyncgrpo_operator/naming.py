"""Every name the operator writes into the cluster: label and annotation keys, object names,
container names, pinned ports and kopf handler ids.

They live in one module so that the manifests, the plan, the watches and the tests agree by
construction, and so that a rename is a visible, reviewed change (a kopf handler id, for one, is
persisted by kopf: renaming it would re-run the handler).
"""

from __future__ import annotations

from typing import Final

from asyncgrpo_api import naming as api_naming
from asyncgrpo_api.v1alpha1 import DRIVER_PROGRESS_PORT, GROUP, podtemplate

# --- the KubeRay API we create objects of --------------------------------------------------------

RAY_GROUP: Final = "ray.io"
RAY_VERSION: Final = "v1"
RAY_API_VERSION: Final = f"{RAY_GROUP}/{RAY_VERSION}"
RAYCLUSTER_KIND: Final = "RayCluster"
RAYCLUSTER_PLURAL: Final = "rayclusters"
WORKLOAD_PLURAL: Final = "workloads"
"""Kueue's Workloads (kueue.x-k8s.io), watched like the job's children (informer.py)."""

RAY_CLUSTER_LABEL: Final = "ray.io/cluster"
RAY_NODE_TYPE_LABEL: Final = "ray.io/node-type"
RAY_GROUP_LABEL: Final = "ray.io/group"
RAY_OVERWRITE_CMD_ANNOTATION: Final = "ray.io/overwrite-container-cmd"
RAY_DISABLE_HEAD_RESTART_ANNOTATION: Final = "ray.io/disable-provisioned-head-restart"
SPEC_DIGEST_ANNOTATION: Final = f"{GROUP}/spec-digest"
"""On the spec ConfigMap: the SHA-256 of the data the operator wrote. The ConfigMap watch reads
metadata only, and this tells a pass whether the data is the spec's without reading the data."""
"""KubeRay recreates a lost head pod unless this is set; a recreated head would silently restart
the driver inside the same attempt, so the operator turns it off and retries with a new cluster."""

# --- labels and annotations ----------------------------------------------------------------------

APP_NAME: Final = "asyncgrpo"
MANAGER: Final = "asyncgrpo-operator"
"""app.kubernetes.io/managed-by, the event reporting component and the API field manager."""

JOB_NAME_LABEL: Final = f"{GROUP}/job-name"
ATTEMPT_LABEL: Final = f"{GROUP}/attempt"

KOPF_FINALIZER: Final = f"{GROUP}/kopf-finalizer"
"""kopf's finalizer name. No handler needs a finalizer, so kopf never adds it; the prefix is set
anyway so that a future handler cannot silently fall back to kopf.zalando.org."""

COMPONENT_SPEC: Final = "job-spec"
COMPONENT_CLUSTER: Final = "ray-cluster"
COMPONENT_HEAD: Final = "head"
COMPONENT_POLICY: Final = "policy-worker"
COMPONENT_GENERATION: Final = "generation-worker"
COMPONENT_RAY_TOKEN: Final = "ray-token"
COMPONENT_NETWORK_POLICY: Final = "network-policy"


def job_labels(job_name: str, component: str) -> dict[str, str]:
    """The labels on every object the operator creates for a job (and on the pods KubeRay makes).

    `asyncgrpo.dev/job-name` is what the operator selects children by; the app.kubernetes.io/* set
    is for users' tooling (kubectl -l, dashboards, NetworkPolicies).
    """
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": job_name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGER,
        JOB_NAME_LABEL: job_name,
    }


SPEC_CONFIGMAP_SELECTOR: Final = (
    f"{JOB_NAME_LABEL},app.kubernetes.io/managed-by={MANAGER},app.kubernetes.io/component={COMPONENT_SPEC}"
)
"""What the ConfigMap watch selects: the operator's spec ConfigMaps. Anyone may put the job-name
label on a ConfigMap of their own; a job's author cannot set these through the job (the operator's
labels win over spec.labels, and admission refuses the app.kubernetes.io/ and asyncgrpo.dev/
prefixes in a podTemplate). A user who may create ConfigMaps can still copy them: such a
ConfigMap costs the cache its metadata only, and is never written (plan.py checks its owner)."""


# --- object names ---------------------------------------------------------------------------------

raycluster_name = api_naming.raycluster_name
spec_configmap_name = api_naming.spec_configmap_name
ray_token_secret_name = api_naming.ray_token_secret_name
network_policy_name = api_naming.network_policy_name


def head_service_name(cluster_name: str) -> str:
    """The head Service KubeRay creates for a RayCluster (GenerateHeadServiceName)."""
    return f"{cluster_name}-head-svc"


# --- containers, files, groups --------------------------------------------------------------------

RAY_HEAD_CONTAINER: Final = podtemplate.RAY_HEAD_CONTAINER
"""Container 0 of the head pod: the Ray head (KubeRay requires the Ray container at index 0)."""
DRIVER_CONTAINER: Final = podtemplate.DRIVER_CONTAINER
"""The training driver, a second container of the head pod. Its exit decides the attempt."""
RAY_WORKER_CONTAINER: Final = podtemplate.RAY_WORKER_CONTAINER

POLICY_GROUP: Final = "policy"
GENERATION_GROUP: Final = "generation"

JOB_SPEC_DIR: Final = "/etc/asyncgrpo"
JOB_SPEC_KEY: Final = "job.json"
JOB_SPEC_PATH: Final = f"{JOB_SPEC_DIR}/{JOB_SPEC_KEY}"
DRIVER_MODULE: Final = "asyncgrpo_trainer"

# --- ports (pinned so NetworkPolicies can be written) --------------------------------------------

GCS_PORT: Final = 6379
DASHBOARD_PORT: Final = 8265
CLIENT_PORT: Final = 10001
METRICS_PORT: Final = 8080
NODE_MANAGER_PORT: Final = 6380
OBJECT_MANAGER_PORT: Final = 6381
DASHBOARD_AGENT_GRPC_PORT: Final = 6382
RUNTIME_ENV_AGENT_PORT: Final = 6383
DASHBOARD_AGENT_LISTEN_PORT: Final = 52365
MIN_WORKER_PORT: Final = 11000
MAX_WORKER_PORT: Final = 11999
PROGRESS_PORT: Final = DRIVER_PROGRESS_PORT

# --- kopf handler ids (persisted by kopf; never rename) -------------------------------------------

HANDLER_JOB_EVENT: Final = "enqueue-job"
HANDLER_STARTUP: Final = "configure-operator"
HANDLER_START_CONTROLLER: Final = "start-controller"
HANDLER_STOP_CONTROLLER: Final = "stop-controller"
HANDLER_PROBE: Final = "controller-alive"
HANDLER_DEFAULT_QUEUE: Final = "default-queue-asyncgrpojob"
HANDLER_ADMISSION_SERVER: Final = "serve-admission"
HANDLER_START_ADMISSION: Final = "start-admission"
HANDLER_STOP_ADMISSION: Final = "stop-admission"
"""The mutating webhook for jobs that name no Kueue queue (kueue_admission.py); also its URL path."""
