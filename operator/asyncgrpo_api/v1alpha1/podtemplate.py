"""A pool's `podTemplate`: the escape hatch into the pod template the operator renders.

Users of KubeRay's RayJob and Kubeflow's TrainJob expect to add what their cluster needs to the
pods (a security context, an init container that fetches credentials, a log-shipping sidecar, a
volume, a RuntimeClass, spread constraints). The override is a partial core/v1 PodTemplateSpec,
merged into what the operator renders (operator/asyncgrpo_operator/overrides.py):

- metadata.labels and metadata.annotations are added;
- spec.securityContext is merged key by key over the operator's Pod Security `restricted` defaults;
- spec.runtimeClassName, topologySpreadConstraints and priorityClassName are set;
- spec.initContainers and spec.volumes are appended;
- spec.containers: an entry named like the operator's container of that pool (head: `ray-head`
  and `driver`; workers: `ray-worker`) adds env, envFrom and volumeMounts to it and merges its
  securityContext over the operator's; any other entry is an extra container (a sidecar).

What the operator relies on cannot be overridden, and admission says which field and why: the
containers' command, args, image and ports (the driver command and the Ray ports), the operator's
labels, volumes, mount paths and environment variables, the pinned Ray ports (a sidecar may not
listen on them), and the pod fields that have their own place in the spec (nodeSelector,
tolerations, affinity, schedulerName, serviceAccountName, imagePullSecrets, hostNetwork,
restartPolicy). The CRD keeps the override untyped (x-kubernetes-preserve-unknown-fields, like
KubeRay's 1.4 MB of inlined PodTemplateSpec would not be); its shape is checked here, and what
the API server would still refuse (a bad quantity deep in a sidecar) is refused at admission by the
webhook's server-side dry-run of the rendered RayCluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from pydantic_core import PydanticCustomError

from asyncgrpo_api import object_store_env, ray_auth

RAY_HEAD_CONTAINER: Final = "ray-head"
DRIVER_CONTAINER: Final = "driver"
RAY_WORKER_CONTAINER: Final = "ray-worker"
HEAD_CONTAINERS: Final = (RAY_HEAD_CONTAINER, DRIVER_CONTAINER)
WORKER_CONTAINERS: Final = (RAY_WORKER_CONTAINER,)

OPERATOR_VOLUMES: Final = frozenset(
    {"ray-tmp", "dshm", "job-spec", "checkpoints", "models", "data", object_store_env.CA_VOLUME}
)
"""Volume names the operator renders (its own and spec.storage's)."""
OPERATOR_MOUNT_PATHS: Final = frozenset(
    {"/tmp/ray", "/dev/shm", "/etc/asyncgrpo", object_store_env.CA_BUNDLE_DIR}
)
"""Mount paths of the operator's own volumes (spec.storage's mount paths are checked per job)."""
RAY_LABELS_ENV: Final = "RAY_OVERRIDE_LABELS"
"""The environment variable whose JSON object Ray 2.60 adds to its node's labels (`ray start`):
a generation worker's pool and pod name (asyncgrpo_api.v1alpha1.placement)."""
POD_NAME_ENV: Final = "ASYNCGRPO_POD_NAME"
"""A generation worker's own pod name (the downward API), which its Ray node labels expand."""
OPERATOR_ENV: Final = frozenset(
    {
        RAY_LABELS_ENV,
        POD_NAME_ENV,
        "RAY_ADDRESS",
        "ASYNCGRPO_JOB_NAME",
        "ASYNCGRPO_ATTEMPT",
        "ASYNCGRPO_TERMINATION_MESSAGE_PATH",
        "PYTHONUNBUFFERED",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_DEBUG",
        "RAY_USAGE_STATS_ENABLED",  # the job's own value goes in spec.env
        *object_store_env.CREDENTIAL_ENV,  # spec.storage.objectStore's Secret, by secretKeyRef
        object_store_env.CA_BUNDLE_ENV,
        ray_auth.MODE_ENV,  # on the driver; KubeRay sets both on the Ray containers (authOptions)
        ray_auth.TOKEN_ENV,
    }
)
"""Environment variables the operator sets from the job (spec.env and secrets are checked per job)."""
RAY_PORTS: Final = frozenset({6379, 6380, 6381, 6382, 6383, 8080, 8090, 8265, 10001, 52365})
"""The pinned Ray ports and the driver's progress port (asyncgrpo_operator.naming)."""
RAY_WORKER_PORTS: Final = range(11000, 12000)
"""Ray's worker port range (min-worker-port .. max-worker-port)."""
OPERATOR_LABEL_PREFIXES: Final = ("asyncgrpo.dev/", "ray.io/", "app.kubernetes.io/")

SET_FIELDS: Final = ("securityContext", "runtimeClassName", "topologySpreadConstraints", "priorityClassName")
LIST_FIELDS: Final = ("initContainers", "volumes")
MERGED_CONTAINER_FIELDS: Final = frozenset({"name", "env", "envFrom", "volumeMounts", "securityContext"})
ELSEWHERE: Final[Mapping[str, str]] = {
    "nodeSelector": "set spec.cluster.<pool>.nodeSelector",
    "tolerations": "set spec.cluster.<pool>.tolerations",
    "affinity": "set spec.cluster.<pool>.affinity",
    "schedulerName": "set spec.scheduler.name",
    "serviceAccountName": "set spec.serviceAccountName",
    "imagePullSecrets": "set spec.imagePullSecrets",
    "hostNetwork": "set spec.network.hostNetwork",
    "restartPolicy": "the operator sets it (Never on the head: a finished driver must not restart)",
    "enableServiceLinks": "the operator turns service links off (they break Ray's runtime_env)",
    "automountServiceAccountToken": "set spec.serviceAccountName to mount a token",
    "terminationGracePeriodSeconds": "set spec.terminationGracePeriodSeconds",
}
RAY_AUTH_REFUSAL: Final = (
    "would turn off or replace Ray's token authentication, which every job runs with (the operator "
    "sets it); remove it"
)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def problems(override: Mapping[str, Any], containers: tuple[str, ...]) -> Iterator[str]:
    """What is wrong with one pool's override, each as `<field>: <why and the fix>` (paths are
    relative to the podTemplate). `containers` are the operator's container names in that pool."""
    for key in override:
        if key not in ("metadata", "spec"):
            yield f"{key}: unknown field; a podTemplate has metadata (labels, annotations) and spec"
    meta = override.get("metadata", {})
    if not isinstance(meta, Mapping):
        yield "metadata: must be an object"
    else:
        yield from _metadata(meta)
    spec = override.get("spec", {})
    if not isinstance(spec, Mapping):
        yield "spec: must be an object"
        return
    for key, value in spec.items():
        if key in ELSEWHERE:
            yield f"spec.{key}: cannot be overridden: {ELSEWHERE[key]}"
        elif key in LIST_FIELDS or key == "containers":
            if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                yield f"spec.{key}: must be a list of objects"
        elif key in ("runtimeClassName", "priorityClassName"):
            if not isinstance(value, str) or not value:
                yield f"spec.{key}: must be a non-empty string"
        elif key == "securityContext":
            if not isinstance(value, Mapping):
                yield f"spec.{key}: must be an object (a core/v1 PodSecurityContext)"
        elif key == "topologySpreadConstraints":
            if not isinstance(value, list):
                yield f"spec.{key}: must be a list of core/v1 TopologySpreadConstraints"
        else:
            allowed = ", ".join((*SET_FIELDS, *LIST_FIELDS, "containers"))
            yield f"spec.{key}: cannot be set in a podTemplate (allowed: {allowed})"
    yield from _volumes(spec.get("volumes"))
    init = spec.get("initContainers")
    yield from _containers(init if isinstance(init, list) else [], "initContainers", (), containers)
    main = spec.get("containers")
    yield from _containers(main if isinstance(main, list) else [], "containers", containers, containers)


def _metadata(meta: Mapping[str, Any]) -> Iterator[str]:
    for key, value in meta.items():
        if key not in ("labels", "annotations"):
            yield f"metadata.{key}: cannot be set in a podTemplate (allowed: labels, annotations)"
            continue
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            yield f"metadata.{key}: must map names to strings"
            continue
        for name in value:
            if key == "labels" and str(name).startswith(OPERATOR_LABEL_PREFIXES):
                yield (
                    f"metadata.labels.{name}: the operator's and KubeRay's label prefixes "
                    f"({', '.join(OPERATOR_LABEL_PREFIXES)}) cannot be overridden; use another key"
                )


def _volumes(volumes: Any) -> Iterator[str]:
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        name = volume.get("name") if isinstance(volume, Mapping) else None
        if name in OPERATOR_VOLUMES:
            yield f"spec.volumes[{i}].name: {name} is the operator's volume; choose another name"
        elif not isinstance(name, str) or not _NAME.fullmatch(name):
            yield f"spec.volumes[{i}].name: must be a DNS label (lowercase letters, digits, '-')"


def _containers(
    items: list[Any], field: str, merged: tuple[str, ...], operators: tuple[str, ...]
) -> Iterator[str]:
    """Checks of the entries of initContainers or containers; `merged` names those that are merged
    into the operator's containers instead of being added."""
    for i, container in enumerate(items):
        if not isinstance(container, Mapping):
            continue
        name = container.get("name")
        where = f"spec.{field}[{i}]"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            yield f"{where}.name: must be a DNS label (lowercase letters, digits, '-')"
            continue
        where = f"spec.{field}[{name}]"
        if name in merged:
            for key in container:
                if key not in MERGED_CONTAINER_FIELDS:
                    what = (
                        "the driver command" if name == DRIVER_CONTAINER else "what KubeRay and Ray rely on"
                    )
                    allowed = ", ".join(sorted(MERGED_CONTAINER_FIELDS - {"name"}))
                    yield (
                        f"{where}.{key}: the operator's container {name} cannot be changed here ({what}); "
                        f"only {allowed} are merged into it"
                    )
        elif name in operators or name in (RAY_HEAD_CONTAINER, DRIVER_CONTAINER, RAY_WORKER_CONTAINER):
            yield f"{where}.name: {name} is the name of an operator container; choose another name"
        elif "image" not in container:
            yield f"{where}.image: is required for an added container"
        yield from _ports(container.get("ports"), where)
        yield from _env(container.get("env"), where)
        yield from _mounts(container.get("volumeMounts"), where)


def _ports(ports: Any, where: str) -> Iterator[str]:
    for k, port in enumerate(ports if isinstance(ports, list) else []):
        number = port.get("containerPort") if isinstance(port, Mapping) else None
        if isinstance(number, int) and (number in RAY_PORTS or number in RAY_WORKER_PORTS):
            workers = f"{RAY_WORKER_PORTS.start}-{RAY_WORKER_PORTS.stop - 1}"
            yield (
                f"{where}.ports[{k}].containerPort: {number} is a port Ray or the driver listens on in the "
                f"pod (pinned: {sorted(RAY_PORTS)}, workers {workers}); use another port"
            )


def _env(env: Any, where: str) -> Iterator[str]:
    for k, var in enumerate(env if isinstance(env, list) else []):
        name = var.get("name") if isinstance(var, Mapping) else None
        if name in OPERATOR_ENV:
            yield f"{where}.env[{k}].name: {name} is set by the operator; it cannot be overridden"
        elif name in ray_auth.RESERVED_ENV:
            yield f"{where}.env[{k}].name: {name} {RAY_AUTH_REFUSAL}"


def _mounts(mounts: Any, where: str) -> Iterator[str]:
    for k, mount in enumerate(mounts if isinstance(mounts, list) else []):
        if not isinstance(mount, Mapping):
            continue
        if mount.get("name") in OPERATOR_VOLUMES - {"checkpoints", "models", "data"}:
            yield f"{where}.volumeMounts[{k}].name: {mount.get('name')} is the operator's volume"
        path = str(mount.get("mountPath", "")).rstrip("/")
        if path in OPERATOR_MOUNT_PATHS:
            yield f"{where}.volumeMounts[{k}].mountPath: {path} is where the operator mounts its own volume"


ERROR_TYPE: Final = "pod_template"
"""The pydantic error type whose ctx["problems"] lists `<field>: <why>` (rules.py reports each one at
its full path, e.g. spec.cluster.head.podTemplate.spec.containers[driver].command)."""


def check(override: Mapping[str, Any] | None, containers: tuple[str, ...]) -> Mapping[str, Any] | None:
    """The pydantic validator: the override unchanged, or an error listing every problem."""
    if override is None:
        return None
    found = list(problems(override, containers))
    if found:
        raise PydanticCustomError(ERROR_TYPE, "{summary}", {"summary": "; ".join(found), "problems": found})
    return override
