"""Whether a job keeps within the AsyncGRPORuntime it names: the admin-owned half of admission.

Pure: the job and the runtime object as read from the API server (or None when it does not exist)
in, the runtime and one Finding per refusal out. The admission webhook refuses a job with these
findings; the operator checks them again before it starts an attempt, because a runtime can change
or disappear after the job was admitted (docs/security.md#runtimes says what then happens).

Every finding names the job's field, the runtime, and the fix: the job's author can change the
field or pick another runtime, and only an administrator can change the runtime.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from asyncgrpo_api.rules import Finding
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, podtemplate
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime, fixed_values
from asyncgrpo_api.v1alpha1.placement import Placement

RUNTIME_FIELD = "spec.runtimeRef.name"
LIST_RUNTIMES = "kubectl get asyncgrporuntimes"
_ASK = f"or name a runtime that allows it ({LIST_RUNTIMES})"
_STORAGE_KINDS = {"pvc": "persistentVolumeClaim", "host_path": "hostPath", "empty_dir": "emptyDir"}
"""spec.storage's volume sources (the model's attribute) and the core/v1 volume type of each."""


def check(
    job: AsyncGRPOJob, found: Mapping[str, Any] | None
) -> tuple[AsyncGRPORuntime | None, list[Finding]]:
    """The job's runtime and what it refuses: (None, []) for a job that names none; (None, the
    reason) when the named runtime does not exist or cannot be read."""
    ref = job.spec.runtime_ref
    if ref is None:
        return None, []
    if found is None:
        return None, [missing(ref.name)]
    try:
        runtime = AsyncGRPORuntime.model_validate(found)
    except ValidationError as err:
        why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        return None, [
            Finding(
                RUNTIME_FIELD,
                f"AsyncGRPORuntime {ref.name} cannot be read ({why}); ask the cluster "
                "administrator to fix it",
            )
        ]
    return runtime, list(refusals(job, runtime))


def missing(name: str) -> Finding:
    """The finding for a job naming a runtime that does not exist."""
    return Finding(
        RUNTIME_FIELD,
        f"AsyncGRPORuntime {name} does not exist; name an existing one ({LIST_RUNTIMES}) or ask the "
        "cluster administrator to create it",
    )


def image_allowed(image: str, patterns: Sequence[str]) -> bool:
    """Whether an image is one a runtime lists: equal to an entry, or starting with an entry's
    text before its trailing `*`."""
    return any(image.startswith(p[:-1]) if p.endswith("*") else image == p for p in patterns)


def refusals(job: AsyncGRPOJob, runtime: AsyncGRPORuntime) -> Iterator[Finding]:
    """Every field of the job that the runtime does not allow."""
    spec, fixed, name = job.spec, runtime.spec, runtime.metadata.name
    if not image_allowed(spec.image, fixed.images):
        yield _image_refused("spec.image", spec.image, runtime)
    if spec.service_account_name not in (None, fixed.service_account_name):
        runs_as = (
            f"runs the pods as ServiceAccount {fixed.service_account_name}; leave the field unset or set "
            f"it to {fixed.service_account_name}"
            if fixed.service_account_name
            else "runs the pods without a ServiceAccount token; leave the field unset"
        )
        yield Finding("spec.serviceAccountName", f"AsyncGRPORuntime {name} {runs_as}, {_ASK}")
    if spec.network.host_network and not fixed.allow.host_network:
        yield _not_allowed("spec.network.hostNetwork", name, "the node's network", "hostNetwork", "it")
    for volume_name in ("checkpoints", "models", "data"):
        volume = getattr(spec.storage, volume_name)
        for attr, kind in _STORAGE_KINDS.items():
            if volume is not None and getattr(volume, attr) is not None and kind not in fixed.allow.volumes:
                yield _volume_refused(f"spec.storage.{volume_name}.{to_camel(attr)}", kind, runtime)
    pools: tuple[tuple[str, Placement, tuple[str, ...]], ...] = (
        ("head", spec.cluster.head, podtemplate.HEAD_CONTAINERS),
        ("policyWorkers", spec.cluster.policy_workers, podtemplate.WORKER_CONTAINERS),
        ("generationWorkers", spec.cluster.generation_workers, podtemplate.WORKER_CONTAINERS),
    )
    for pool, placement, ours in pools:
        if placement.pod_template:
            where = f"spec.cluster.{pool}.podTemplate.spec"
            yield from _pod_template(placement.pod_template.get("spec") or {}, where, ours, runtime)


def _pod_template(
    pod: Mapping[str, Any], where: str, ours: tuple[str, ...], runtime: AsyncGRPORuntime
) -> Iterator[Finding]:
    allow, name = runtime.spec.allow, runtime.metadata.name
    for i, volume in enumerate(pod.get("volumes") or []):
        for kind in (k for k in volume if k != "name"):  # the source (the shape was checked already)
            if kind not in allow.volumes:
                yield _volume_refused(f"{where}.volumes[{i}].{kind}", kind, runtime)
    yield from _fixed_keys(
        pod.get("securityContext"),
        fixed_values(runtime.spec.security_context.pod),
        f"{where}.securityContext",
        name,
    )
    fixed = fixed_values(runtime.spec.security_context.container)
    init = pod.get("initContainers") or []
    if init and not allow.init_containers:
        yield _not_allowed(f"{where}.initContainers", name, "init containers", "initContainers", "them")
    for field, containers in (("initContainers", init), ("containers", pod.get("containers") or [])):
        for container in containers:
            at = f"{where}.{field}[{container.get('name')}]"
            added = field == "initContainers" or container.get("name") not in ours
            if field == "containers" and added and not allow.sidecars:
                yield _not_allowed(at, name, "sidecars", "sidecars", "the container")
            image = container.get("image")
            if added and isinstance(image, str) and not image_allowed(image, runtime.spec.images):
                yield _image_refused(f"{at}.image", image, runtime)
            yield from _fixed_keys(container.get("securityContext"), fixed, f"{at}.securityContext", name)


def _fixed_keys(written: Any, fixed: Mapping[str, Any], where: str, runtime: str) -> Iterator[Finding]:
    """A securityContext key the runtime fixes, written with another value."""
    if not isinstance(written, Mapping):
        return
    for key, value in written.items():
        if key in fixed and value != fixed[key]:
            yield Finding(
                f"{where}.{key}",
                f"AsyncGRPORuntime {runtime} fixes it to {json.dumps(fixed[key])}; remove the key (the "
                f"pods get that value), {_ASK}",
            )


def _not_allowed(at: str, runtime: str, what: str, allowance: str, remove: str) -> Finding:
    return Finding(
        at, f"AsyncGRPORuntime {runtime} does not allow {what} (allow.{allowance}); remove {remove}, {_ASK}"
    )


def _image_refused(at: str, image: str, runtime: AsyncGRPORuntime) -> Finding:
    allowed = ", ".join(runtime.spec.images)
    return Finding(
        at,
        f"{image} is not an image AsyncGRPORuntime {runtime.metadata.name} allows ({allowed}); use one of "
        f"those, {_ASK}",
    )


def _volume_refused(at: str, kind: str, runtime: AsyncGRPORuntime) -> Finding:
    allowed = ", ".join(runtime.spec.allow.volumes) or "none"
    return Finding(
        at,
        f"AsyncGRPORuntime {runtime.metadata.name} does not allow {kind} volumes (allow.volumes: {allowed}); "
        f"use an allowed type, {_ASK}",
    )
