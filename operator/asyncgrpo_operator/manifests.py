"""The objects the operator creates for a job, as plain dicts: the job-spec ConfigMap, the Ray token
Secret, the NetworkPolicy and one RayCluster per attempt.

Pure: a job (and an attempt index and owner) in, manifests out; no I/O and no clock. The same
functions back the reconciler and `asyncgrpo render`, and the golden files in
tests/operator/golden/ pin their output, so what a user reviews is what the operator applies.

Shape of the RayCluster, and why:
- The head pod has two containers. Container 0 runs the Ray head exactly as KubeRay generates it.
  Container 1 (`driver`) waits for the local GCS and then execs the training driver. With the
  pod's restartPolicy Never, a finished driver is never restarted by the kubelet, and because the
  Ray container keeps running the pod stays Running: KubeRay does not delete it, so the driver's
  exit code and logs stay readable until the cleanup policy removes the cluster.
- `ray.io/disable-provisioned-head-restart` stops KubeRay from silently recreating a lost head
  (which would rerun the driver inside the same attempt); the operator retries with a fresh
  RayCluster instead and counts it in status.restarts.
- Every Ray port is pinned (rayStartParams), so NetworkPolicies can be written.
- Ray's token authentication is on (`authOptions`, asyncgrpo_api.ray_auth): KubeRay gives every Ray
  container the token of the job's Secret, the driver container gets it here, and Ray refuses a
  request without it on the dashboard, GCS and client ports. The operator writes the Secret (a
  token derived from its key, raytoken.py) and a NetworkPolicy that admits to the job's pods only
  its own pods and, on the driver's /progress port, the operator's (the second layer, where the
  cluster's network plugin enforces NetworkPolicies).
- Pods get a minimal environment (enableServiceLinks false: service-link variables grow with the
  namespace and break Ray's runtime_env), no API token unless a ServiceAccount is named.
- A job Kueue manages gets a RayCluster created suspended and labelled with its LocalQueue: Kueue's
  RayCluster integration admits it by unsuspending it (docs/guides/scheduling.md). KAI Scheduler and
  Volcano get what KubeRay's batch-scheduler integration reads (queue and priority labels on the
  RayCluster) and the schedulerName on every pod.
- A pool's podTemplate override is merged in (overrides.py); admission already refused what it
  may not change. Last, the job's AsyncGRPORuntime, if it names one, sets the ServiceAccount and
  securityContexts it fixes (pinned.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from asyncgrpo_api import exitcodes, ray_auth
from asyncgrpo_api.object_store_env import (
    ACCESS_KEY_ENV,
    CA_BUNDLE_DIR,
    CA_BUNDLE_ENV,
    CA_VOLUME,
    SECRET_KEY_ENV,
)
from asyncgrpo_api.v1alpha1 import API_VERSION, KIND, AsyncGRPOJob
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_api.v1alpha1.placement import (
    GENERATION_POOL,
    GENERATION_POOL_LABEL,
    GPU_RESOURCE,
    WORKER_POD_LABEL,
    Placement,
    Resources,
    WorkerGroup,
)
from asyncgrpo_api.v1alpha1.podtemplate import POD_NAME_ENV, RAY_LABELS_ENV
from asyncgrpo_api.v1alpha1.runtime import VolumeSpec
from asyncgrpo_operator import naming, overrides, pinned

Manifest = dict[str, Any]

KAI_QUEUE_LABEL = "kai.scheduler/queue"
KAI_SCHEDULER_NAME = "kai-scheduler"
VOLCANO_QUEUE_LABEL = "volcano.sh/queue-name"
VOLCANO_SCHEDULER_NAME = "volcano"
RAY_PRIORITY_LABEL = "ray.io/priority-class-name"
"""KubeRay's Volcano integration copies it into the PodGroup's priorityClassName."""

_JOB_SPEC_VOLUME = "job-spec"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_ENV = "ASYNCGRPO_TERMINATION_MESSAGE_PATH"
"""Tells the driver where the kubelet reads the container's termination message: the operator
puts it into a failed job's status message, so it must be the error, not Ray's shutdown noise."""
_RAY_TMP_VOLUME = "ray-tmp"
_SHM_VOLUME = "dshm"
RAY_TMP_DIR = "/tmp/ray"
"""Ray's session folder: the raylet's sockets live here, so the driver container can only join
the Ray head next to it if both containers mount the same folder."""
SHM_DIR = "/dev/shm"
"""Ray's object store lives in shared memory; a container runtime's default /dev/shm (64 MiB)
would push it to disk, so every Ray pod gets a memory-backed emptyDir here."""
_SHM: Manifest = {"name": _SHM_VOLUME, "emptyDir": {"medium": "Memory"}}
_SHM_MOUNT: Manifest = {"name": _SHM_VOLUME, "mountPath": SHM_DIR}
_RAY_TMP: Manifest = {"name": _RAY_TMP_VOLUME, "emptyDir": {}}
_RAY_TMP_MOUNT: Manifest = {"name": _RAY_TMP_VOLUME, "mountPath": RAY_TMP_DIR}
GCS_WAIT_SECONDS = 600
"""How long the driver container waits for the Ray head next to it before giving up."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label the API server puts on every namespace, with its name (a NetworkPolicy selects a
namespace by labels only)."""


@dataclass(frozen=True)
class Owner:
    """The AsyncGRPOJob that owns the children (garbage collection deletes them with it)."""

    name: str
    uid: str


def owner_reference(owner: Owner) -> Manifest:
    """A controller ownerReference to the job: GC deletes the child when the job goes."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass(frozen=True)
class OperatorPods:
    """Where the operator's pods run and the labels they carry: what a job's NetworkPolicy admits
    to the driver's /progress port."""

    namespace: str
    labels: dict[str, str]


def objects(
    job: AsyncGRPOJob,
    attempt: int = 0,
    owner: Owner | None = None,
    runtime: AsyncGRPORuntime | None = None,
    operator: OperatorPods | None = None,
) -> list[Manifest]:
    """Everything the operator creates for one attempt of a job, in creation order, but the token
    Secret (`ray_token_secret`), whose token only the operator can derive."""
    name, namespace = job.metadata.name, job.metadata.namespace
    return [
        spec_configmap(job, owner),
        network_policy(name, namespace, owner, operator),
        ray_cluster(job, attempt, owner, runtime),
    ]


# --- the job spec ConfigMap ----------------------------------------------------------------------


def job_document(job: AsyncGRPOJob) -> Manifest:
    """What the driver reads from /etc/asyncgrpo/job.json: the validated job with its defaults.

    Only name and namespace are kept from the metadata, so that labels or annotations changing on
    the live object never change the document the trainer sees.
    """
    manifest = job.to_manifest()
    metadata = {"name": job.metadata.name}
    if job.metadata.namespace:
        metadata["namespace"] = job.metadata.namespace
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "metadata": metadata,
        "spec": manifest["spec"],
    }


def job_document_json(job: AsyncGRPOJob) -> str:
    """The document as stable text (sorted keys), so an unchanged spec is an unchanged ConfigMap."""
    return json.dumps(job_document(job), sort_keys=True, indent=2) + "\n"


def spec_configmap(job: AsyncGRPOJob, owner: Owner | None = None) -> Manifest:
    """The ConfigMap mounted into the head pod's driver container, annotated with its data's
    digest (`naming.SPEC_DIGEST_ANNOTATION`)."""
    name = job.metadata.name
    data = {naming.JOB_SPEC_KEY: job_document_json(job)}
    metadata = _metadata(job, naming.spec_configmap_name(name), naming.COMPONENT_SPEC, owner)
    metadata["annotations"] = {naming.SPEC_DIGEST_ANNOTATION: data_digest(data)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def data_digest(data: dict[str, str]) -> str:
    """A ConfigMap's data as a fixed-size fingerprint."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# --- who may reach the job's Ray: its token Secret and NetworkPolicy -------------------------------


def ray_token_secret(job_name: str, namespace: str | None, owner: Owner | None, token: str) -> Manifest:
    """The Secret whose `auth_token` every Ray container and the driver authenticate with (KubeRay's
    `authOptions.secretName`). Immutable: nothing rewrites a job's token while its pods run."""
    name = naming.ray_token_secret_name(job_name)
    metadata = _child_metadata(name, namespace, job_name, naming.COMPONENT_RAY_TOKEN, owner)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "immutable": True,
        "stringData": {ray_auth.SECRET_KEY: token},
    }


def network_policy(
    job_name: str, namespace: str | None, owner: Owner | None, operator: OperatorPods | None
) -> Manifest:
    """The job's pods (every attempt's) admit only each other, on any port (Ray's nodes talk on
    many), and the operator's pods on the driver's /progress port; nothing else in the cluster
    reaches their Ray ports. None for `operator`: an operator that is not a pod (a local run) is
    admitted by nothing."""
    pods = {"matchLabels": {naming.JOB_NAME_LABEL: job_name}}
    ingress: list[Manifest] = [{"from": [{"podSelector": copy.deepcopy(pods)}]}]
    if operator is not None:
        peer = {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator.namespace}},
            "podSelector": {"matchLabels": dict(operator.labels)},
        }
        ingress.append({"from": [peer], "ports": [{"protocol": "TCP", "port": naming.PROGRESS_PORT}]})
    name = naming.network_policy_name(job_name)
    metadata = _child_metadata(name, namespace, job_name, naming.COMPONENT_NETWORK_POLICY, owner)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _child_metadata(
    name: str, namespace: str | None, job_name: str, component: str, owner: Owner | None
) -> Manifest:
    """Metadata of a child that only the operator reads: its labels are the operator's alone."""
    metadata: Manifest = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = naming.job_labels(job_name, component)
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return metadata


# --- the RayCluster ------------------------------------------------------------------------------


def ray_cluster(
    job: AsyncGRPOJob, attempt: int, owner: Owner | None = None, runtime: AsyncGRPORuntime | None = None
) -> Manifest:
    """The RayCluster of one attempt: a head (Ray head + driver) and the policy/generation pools,
    with what the job's runtime (None: it names none) fixes."""
    spec = job.spec
    name = naming.raycluster_name(job.metadata.name, attempt)
    metadata = _metadata(job, name, naming.COMPONENT_CLUSTER, owner)
    metadata["labels"][naming.ATTEMPT_LABEL] = str(attempt)
    metadata["labels"].update(_scheduler_labels(job))
    metadata["annotations"] = {naming.RAY_DISABLE_HEAD_RESTART_ANNOTATION: "true"}
    workers = [
        _worker_group(
            job,
            attempt,
            naming.POLICY_GROUP,
            naming.COMPONENT_POLICY,
            spec.cluster.policy_workers,
            runtime=runtime,
        ),
        _worker_group(
            job,
            attempt,
            naming.GENERATION_GROUP,
            naming.COMPONENT_GENERATION,
            spec.cluster.generation_workers,
            runtime=runtime,
        ),
    ]
    return {
        "apiVersion": naming.RAY_API_VERSION,
        "kind": naming.RAYCLUSTER_KIND,
        "metadata": metadata,
        "spec": {
            "rayVersion": spec.cluster.ray_version,
            "enableInTreeAutoscaling": False,
            "authOptions": {
                "mode": ray_auth.TOKEN_MODE,
                "secretName": naming.ray_token_secret_name(job.metadata.name),
            },
            "headGroupSpec": {
                "rayStartParams": _head_start_params(),
                "template": _head_template(job, attempt, runtime),
            },
            "workerGroupSpecs": [group for group in workers if group is not None],
        },
    }


def _head_start_params() -> dict[str, str]:
    params = {
        "port": str(naming.GCS_PORT),
        "dashboard-host": "0.0.0.0",
        "dashboard-port": str(naming.DASHBOARD_PORT),
        "ray-client-server-port": str(naming.CLIENT_PORT),
    }
    return params | _node_start_params()


def _node_start_params() -> dict[str, str]:
    """Ports every Ray node opens; Ray picks random ones unless they are pinned."""
    return {
        "metrics-export-port": str(naming.METRICS_PORT),
        "node-manager-port": str(naming.NODE_MANAGER_PORT),
        "object-manager-port": str(naming.OBJECT_MANAGER_PORT),
        "dashboard-agent-grpc-port": str(naming.DASHBOARD_AGENT_GRPC_PORT),
        "dashboard-agent-listen-port": str(naming.DASHBOARD_AGENT_LISTEN_PORT),
        "runtime-env-agent-port": str(naming.RUNTIME_ENV_AGENT_PORT),
        "min-worker-port": str(naming.MIN_WORKER_PORT),
        "max-worker-port": str(naming.MAX_WORKER_PORT),
        "disable-usage-stats": "true",
    }


def driver_script() -> str:
    """The driver container's command: wait for the local Ray head, then become the driver.

    It waits for the GCS port and for the raylet's dashboard agent (which starts after the
    raylet), so `ray.init` finds a complete node. `exec` makes the driver the container's main
    process, so the container's exit code (or the signal that killed it) is the driver's, which
    is what decides the attempt.
    """
    ports = f"{naming.GCS_PORT} {naming.DASHBOARD_AGENT_LISTEN_PORT}"
    up = f"up() {{ for p in {ports}; do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || return 1; done; }}"
    wait = GCS_WAIT_SECONDS
    lines = [
        "set -u",
        up,
        f"for _ in $(seq 1 {wait}); do up && break; sleep 1; done",
        "if ! up; then",
        f'  echo "the Ray head (ports {ports}) did not come up within {wait} s" >&2',
        f"  exit {exitcodes.RAY_HEAD_UNAVAILABLE}",
        "fi",
        f"exec python -m {naming.DRIVER_MODULE} --job-spec {naming.JOB_SPEC_PATH}",
    ]
    return "\n".join(lines) + "\n"


def _wait_for_driver(host: str, seconds: int) -> Manifest:
    """A Ray container's preStop hook: when the pods are deleted together (a Kueue preemption,
    spec.suspend) the driver gets SIGTERM and checkpoints the step in progress, which needs the
    Ray head and the policy workers; so the Ray processes stop only once the driver's /progress
    port (on the head pod, through the head Service for workers) is closed, or the grace period
    ends. Plain bash (/dev/tcp): the image needs nothing else."""
    probe = f"(exec 3<>/dev/tcp/{host}/{naming.PROGRESS_PORT}) 2>/dev/null"
    script = f"for _ in $(seq 1 {seconds}); do {probe} || exit 0; sleep 1; done"
    return {"preStop": {"exec": {"command": ["/bin/bash", "-c", script]}}}


def _head_template(job: AsyncGRPOJob, attempt: int, runtime: AsyncGRPORuntime | None) -> Manifest:
    spec = job.spec
    head = spec.cluster.head
    ray_head = {
        "name": naming.RAY_HEAD_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        # No command: KubeRay generates `ray start --head ... --block` from rayStartParams.
        "ports": [
            _port("gcs-server", naming.GCS_PORT),
            _port("dashboard", naming.DASHBOARD_PORT),
            _port("client", naming.CLIENT_PORT),
            _port("metrics", naming.METRICS_PORT),
            # The driver container listens here; containers share the pod's network, and KubeRay
            # exposes container 0's ports on the head Service.
            _port("progress", naming.PROGRESS_PORT),
        ],
        "resources": _resources(head.resources, gpus=0),
        **_env_block(job, []),
        **_mounts_block(job, [_RAY_TMP_MOUNT, _SHM_MOUNT]),
        "lifecycle": _wait_for_driver("127.0.0.1", job.spec.termination_grace_period_seconds),
    }
    driver = {
        "name": naming.DRIVER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/bin/bash", "-c", driver_script()],
        "resources": _resources(head.driver_resources, gpus=0),
        # The driver writes its one-line error here; the log tail is the fallback (e.g. SIGKILL).
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **_env_block(
            job,
            [
                {"name": "RAY_ADDRESS", "value": f"127.0.0.1:{naming.GCS_PORT}"},
                {"name": "ASYNCGRPO_JOB_NAME", "value": job.metadata.name},
                {"name": "ASYNCGRPO_ATTEMPT", "value": str(attempt)},
                {"name": "PYTHONUNBUFFERED", "value": "1"},
                {"name": TERMINATION_MESSAGE_ENV, "value": TERMINATION_MESSAGE_PATH},
                # KubeRay sets these on the Ray containers only (authOptions): the driver joins the
                # head's GCS with the token, and its /progress server asks for it.
                {"name": ray_auth.MODE_ENV, "value": ray_auth.TOKEN_MODE},
                {
                    "name": ray_auth.TOKEN_ENV,
                    "valueFrom": {
                        "secretKeyRef": {
                            "name": naming.ray_token_secret_name(job.metadata.name),
                            "key": ray_auth.SECRET_KEY,
                        }
                    },
                },
            ],
        ),
        **_mounts_block(
            job,
            [
                _RAY_TMP_MOUNT,
                _SHM_MOUNT,
                {"name": _JOB_SPEC_VOLUME, "mountPath": naming.JOB_SPEC_DIR, "readOnly": True},
            ],
        ),
    }
    job_spec_volume = {
        "name": _JOB_SPEC_VOLUME,
        "configMap": {
            "name": naming.spec_configmap_name(job.metadata.name),
            "items": [{"key": naming.JOB_SPEC_KEY, "path": naming.JOB_SPEC_KEY}],
        },
    }
    pod_spec = _pod_spec(job, head, [ray_head, driver], [_RAY_TMP, _SHM, job_spec_volume])
    # Never: the kubelet must not restart a finished driver; a lost head is a new attempt.
    pod_spec["restartPolicy"] = "Never"
    # The driver's ray.init finds the head's raylet by its process (Ray scans the processes for
    # `--node_id`); in a container of its own it sees none and fails "No node info found", so the
    # head's containers share one process namespace.
    pod_spec["shareProcessNamespace"] = True
    template = {"metadata": _pod_metadata(job, attempt, naming.COMPONENT_HEAD, head), "spec": pod_spec}
    return pinned.pin(overrides.merge(template, head.pod_template), runtime)


def _worker_group(
    job: AsyncGRPOJob,
    attempt: int,
    group: str,
    component: str,
    pool: WorkerGroup,
    *,
    runtime: AsyncGRPORuntime | None,
) -> Manifest | None:
    if pool.replicas == 0:
        return None
    container = {
        "name": naming.RAY_WORKER_CONTAINER,
        "image": job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        # No command: KubeRay generates `ray start --address=<head>:6379 ... --block`.
        "ports": [_port("metrics", naming.METRICS_PORT)],
        "resources": _resources(pool.resources, gpus=pool.gpus_per_replica),
        **_env_block(job, _generation_labels() if group == naming.GENERATION_GROUP else []),
        **_mounts_block(job, [_SHM_MOUNT]),
        "lifecycle": _wait_for_driver(
            naming.head_service_name(naming.raycluster_name(job.metadata.name, attempt)),
            job.spec.termination_grace_period_seconds,
        ),
    }
    return {
        "groupName": group,
        "replicas": pool.replicas,
        # KubeRay keeps replicas within these: an elastic pool's bounds, which the operator scales in.
        "minReplicas": pool.fewest,
        "maxReplicas": pool.most,
        "rayStartParams": _node_start_params(),
        "template": pinned.pin(
            overrides.merge(
                {
                    "metadata": _pod_metadata(job, attempt, component, pool),
                    "spec": _pod_spec(job, pool, [container], [_SHM]),
                },
                pool.pod_template,
            ),
            runtime,
        ),
    }


# --- shared pod pieces ---------------------------------------------------------------------------


def _metadata(job: AsyncGRPOJob, name: str, component: str, owner: Owner | None) -> Manifest:
    metadata: Manifest = {"name": name}
    if job.metadata.namespace:
        metadata["namespace"] = job.metadata.namespace
    metadata["labels"] = dict(job.spec.labels) | naming.job_labels(job.metadata.name, component)
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return metadata


def _pod_metadata(job: AsyncGRPOJob, attempt: int, component: str, placement: Placement) -> Manifest:
    labels = dict(job.spec.labels) | naming.job_labels(job.metadata.name, component)
    labels[naming.ATTEMPT_LABEL] = str(attempt)
    if job.spec.scheduler.name == "kai" and job.spec.scheduler.queue_name:
        labels[KAI_QUEUE_LABEL] = job.spec.scheduler.queue_name
    metadata: Manifest = {"labels": labels}
    if placement.annotations:
        metadata["annotations"] = dict(placement.annotations)
    return metadata


def _scheduler_labels(job: AsyncGRPOJob) -> dict[str, str]:
    """Labels on the RayCluster that Kueue, or KubeRay's batch-scheduler integration, read."""
    scheduler = job.spec.scheduler
    if job.kueue_queue_name is not None:
        # Kueue queues the job itself (workload.py): the RayCluster carries no queue label, or
        # Kueue's RayCluster integration would queue it a second time.
        return {}
    labels: dict[str, str] = {}
    if scheduler.name == "kai" and scheduler.queue_name:
        labels[KAI_QUEUE_LABEL] = scheduler.queue_name
    if scheduler.name == "volcano":
        if scheduler.queue_name:
            labels[VOLCANO_QUEUE_LABEL] = scheduler.queue_name
        if scheduler.priority_class_name:
            labels[RAY_PRIORITY_LABEL] = scheduler.priority_class_name
    return labels


RESTRICTED_POD_SECURITY: Manifest = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
"""Pod Security Standards `restricted`, pod level: a namespace that enforces it admits the pods as
rendered (the trainer image runs as uid 1000). A pool's podTemplate securityContext is merged over
it, key by key, for an image that must run as root."""
RESTRICTED_CONTAINER_SECURITY: Manifest = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
"""`restricted`, container level; KubeRay copies the Ray container's into the init container it
injects into worker pods."""


def _pod_spec(
    job: AsyncGRPOJob, placement: Placement, containers: list[Manifest], extra_volumes: list[Manifest]
) -> Manifest:
    spec = job.spec
    for container in containers:
        container["securityContext"] = copy.deepcopy(RESTRICTED_CONTAINER_SECURITY)
    pod: Manifest = {
        "enableServiceLinks": False,
        "securityContext": copy.deepcopy(RESTRICTED_POD_SECURITY),
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
        "containers": containers,
    }
    if spec.service_account_name is not None:
        pod["serviceAccountName"] = spec.service_account_name
    else:
        # The trainer never talks to the Kubernetes API; do not hand it a token it does not need.
        pod["automountServiceAccountToken"] = False
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if placement.node_selector:
        pod["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in placement.tolerations
        ]
    if placement.affinity is not None:
        pod["affinity"] = placement.affinity.model_dump(mode="json", by_alias=True, exclude_none=True)
    if spec.scheduler.priority_class_name is not None:
        pod["priorityClassName"] = spec.scheduler.priority_class_name
    if spec.scheduler.name == "kai":
        pod["schedulerName"] = KAI_SCHEDULER_NAME
    elif spec.scheduler.name == "volcano":
        pod["schedulerName"] = VOLCANO_SCHEDULER_NAME
    if spec.network.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    volumes = extra_volumes + _volumes(job)
    if volumes:
        pod["volumes"] = volumes
    return pod


def _resources(resources: Resources, gpus: int) -> Manifest:
    requests = dict(resources.requests)
    limits = dict(resources.limits)
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
        limits[GPU_RESOURCE] = str(gpus)
    rendered: Manifest = {}
    if requests:
        rendered["requests"] = requests
    if limits:
        rendered["limits"] = limits
    return rendered


def _port(name: str, port: int) -> Manifest:
    return {"name": name, "containerPort": port, "protocol": "TCP"}


def _generation_labels() -> list[Manifest]:
    """A generation worker's Ray node labels: the pool and the pod's name (the kubelet expands
    $(ASYNCGRPO_POD_NAME)), by which an elastic fleet's driver starts an engine on a node the fleet
    gains and finds the pod a drain request names (asyncgrpo_trainer.fleet)."""
    labels = {GENERATION_POOL_LABEL: GENERATION_POOL, WORKER_POD_LABEL: f"$({POD_NAME_ENV})"}
    return [
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": RAY_LABELS_ENV, "value": json.dumps(labels, separators=(",", ":"))},
    ]


def _env_block(job: AsyncGRPOJob, extra: list[Manifest]) -> Manifest:
    """env and envFrom of a trainer container: the job's variables, secrets and NCCL settings."""
    spec = job.spec
    env: list[Manifest] = list(extra)
    env += [{"name": var.name, "value": var.value} for var in spec.env]
    env += _network_env(job)
    env += _ray_usage_stats_env(job)
    env += _object_store_env(job)
    env_from: list[Manifest] = []
    for secret in spec.secrets:
        if not secret.keys:
            env_from.append({"secretRef": {"name": secret.name}})
        env += [
            {"name": ref.env, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": ref.key}}}
            for ref in secret.keys
        ]
    block: Manifest = {}
    if env:
        block["env"] = env
    if env_from:
        block["envFrom"] = env_from
    return block


RAY_USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"


def _ray_usage_stats_env(job: AsyncGRPOJob) -> list[Manifest]:
    """Ray's usage-stats reporting off (`ray start` on the head would otherwise phone home; the
    clusters this runs in are often offline), unless spec.env or a secret key sets the variable."""
    named = {var.name for var in job.spec.env} | {ref.env for s in job.spec.secrets for ref in s.keys}
    return [] if RAY_USAGE_STATS_ENV in named else [{"name": RAY_USAGE_STATS_ENV, "value": "0"}]


def _object_store_env(job: AsyncGRPOJob) -> list[Manifest]:
    """The object store's key pair as `secretKeyRef` variables (the keys never enter the spec, its
    ConfigMap or the status), and AWS_CA_BUNDLE when a CA bundle is mounted."""
    store = job.spec.storage.object_store
    if store is None:
        return []
    secret = store.credentials.secret_name
    refs = [
        (ACCESS_KEY_ENV, store.credentials.access_key_id_key),
        (SECRET_KEY_ENV, store.credentials.secret_access_key_key),
    ]
    env: list[Manifest] = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for name, key in refs
    ]
    if store.tls.ca_config_map is not None:
        env.append({"name": CA_BUNDLE_ENV, "value": f"{CA_BUNDLE_DIR}/{store.tls.ca_key}"})
    return env


def _network_env(job: AsyncGRPOJob) -> list[Manifest]:
    net = job.spec.network
    values: list[tuple[str, str | None]] = [
        ("NCCL_SOCKET_IFNAME", net.nccl_socket_ifname),
        ("GLOO_SOCKET_IFNAME", net.gloo_socket_ifname),
        ("NCCL_IB_DISABLE", None if net.ib_enabled else "1"),
        ("NCCL_IB_HCA", net.ib_hca if net.ib_enabled else None),
        ("NCCL_DEBUG", net.nccl_debug),
    ]
    return [{"name": name, "value": value} for name, value in values if value is not None]


def _storage(job: AsyncGRPOJob) -> list[tuple[str, VolumeSpec]]:
    storage = job.spec.storage
    named = [("checkpoints", storage.checkpoints), ("models", storage.models), ("data", storage.data)]
    return [(name, volume) for name, volume in named if volume is not None]


def _volumes(job: AsyncGRPOJob) -> list[Manifest]:
    volumes: list[Manifest] = []
    for name, volume in _storage(job):
        if volume.pvc is not None:
            source: Manifest = {"persistentVolumeClaim": {"claimName": volume.pvc.claim_name}}
            if volume.pvc.read_only:
                source["persistentVolumeClaim"]["readOnly"] = True
        elif volume.host_path is not None:
            source = {"hostPath": {"path": volume.host_path.path, "type": volume.host_path.type}}
        else:
            assert volume.empty_dir is not None  # the model validator guarantees one source
            empty_dir: Manifest = {}
            if volume.empty_dir.medium:
                empty_dir["medium"] = volume.empty_dir.medium
            if volume.empty_dir.size_limit:
                empty_dir["sizeLimit"] = volume.empty_dir.size_limit
            source = {"emptyDir": empty_dir}
        volumes.append({"name": name, **source})
    store = job.spec.storage.object_store
    if store is not None and store.tls.ca_config_map is not None:
        volumes.append({"name": CA_VOLUME, "configMap": {"name": store.tls.ca_config_map}})
    return volumes


def _mounts_block(job: AsyncGRPOJob, extra: list[Manifest]) -> Manifest:
    mounts = list(extra)
    for name, volume in _storage(job):
        mount: Manifest = {"name": name, "mountPath": volume.mount_path}
        if volume.pvc is not None and volume.pvc.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    store = job.spec.storage.object_store
    if store is not None and store.tls.ca_config_map is not None:
        mounts.append({"name": CA_VOLUME, "mountPath": CA_BUNDLE_DIR, "readOnly": True})
    return {"volumeMounts": mounts} if mounts else {}
