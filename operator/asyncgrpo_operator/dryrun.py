"""The admission webhook's server-side dry-run of the RayCluster a job would get.

After the rules, a job that passes them is checked once more by the API server itself: the
RayCluster the operator would create for it is POSTed with dryRun=All (schema, CEL, every
admission webhook and ValidatingAdmissionPolicy on RayClusters run; nothing is stored), so what
the API server would refuse at create time is refused at `kubectl apply`, with its message.

Only a verdict about the object refuses the job (400/422, or a 403 from an admission webhook or
policy). Everything else fails open, with a warning: quota and the operator's own RBAC (403)
describe the moment, not the job, and a Kueue-queued job must still be creatable; KubeRay not
installed (404) is reported on the job (KubeRayMissing); no answer within
DRY_RUN_TIMEOUT_SECONDS, 429 and 5xx must not make admission depend on the API server's load. What
slips through that way is shown on the job as ClusterCreateFailed within one reconcile pass.
Updates are dry-run only when they change the RayCluster the job would get (e.g. a suspended
job's placement). At most MAX_IN_FLIGHT dry-runs run at once: a burst of creates (a sweep of 100
jobs) beyond that is admitted without one, with a warning, instead of doubling the API server's
work at its busiest (load shedding; measured in docs/benchmarks.md, where a burst of 100 creates on
a loaded 2-core control plane took 2-3 times as long to admit with a dry-run for each).
ASYNCGRPO_WEBHOOK_DRY_RUN=false (the chart's `webhook.dryRun`) turns it off.

`target` and `judge` are pure; `ask` is the one API call (through k8s.py).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from asyncgrpo_api.rules import Finding
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_operator import k8s, manifests

DRY_RUN_TIMEOUT_SECONDS = 2.0
"""Budget of the dry-run inside the API server's admission timeout (chart default 5 s)."""
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
"""The ownerReference UID of a dry-run RayCluster when the request carries no job UID yet."""

MAX_IN_FLIGHT = 4
"""Dry-runs at once per operator process; requests beyond it are admitted without one ("shed")."""
SHED_WARNING = (
    "the RayCluster of this job was not dry-run: the webhook was busy with others (a burst of creates); "
    "a refusal of its create would show on the job as ClusterCreateFailed"
)

Result = Literal["accepted", "refused", "skipped", "unchanged", "shed"]


def target(
    job: AsyncGRPOJob, before: AsyncGRPOJob | None, uid: str, runtime: AsyncGRPORuntime | None = None
) -> dict[str, Any] | None:
    """The RayCluster to dry-run for an allowed request: attempt 0's, owned by the job, with what
    its AsyncGRPORuntime fixes; None when an update (`before` is the stored job) leaves it as it
    was, so there is nothing new to ask."""
    owner = manifests.Owner(name=job.metadata.name, uid=uid or PLACEHOLDER_UID)
    cluster = manifests.ray_cluster(job, 0, owner, runtime)
    if before is not None and manifests.ray_cluster(before, 0, owner, runtime) == cluster:
        return None
    if before is None:
        # A job being created is not stored yet (a validating webhook sees its UID already): its
        # ownerReference is not the controller's in the dry run. Kueue's RayCluster webhook (with
        # AsyncGRPOJobs an external framework) looks a RayCluster's controller up and answers 404
        # when it does not exist, which would hide every later verdict (a policy's refusal); the
        # reference itself is still checked.
        for ref in cluster["metadata"].get("ownerReferences") or []:
            ref["controller"] = False
    return cluster


def judge(error: k8s.ApiError | None, cluster: str) -> tuple[Result, Finding | None, str | None]:
    """What the API server's answer means for the job: (result, the finding that refuses it, the
    warning that admits it)."""
    if error is None:
        return "accepted", None, None
    said = f"the API server refused the RayCluster {cluster} this job would create "
    said += f"(dry run, HTTP {error.status}): "
    by_policy = error.status == 403 and (
        "admission webhook" in error.message or "ValidatingAdmissionPolicy" in error.message
    )
    if error.status in (400, 422) or by_policy:
        return "refused", Finding("spec", said + error.message), None
    if error.status == 409:
        return "unchanged", None, None  # the attempt's cluster exists already: nothing new to learn
    if error.status == 404:
        why = "KubeRay's RayCluster API is not installed; the job waits (KubeRayMissing) until it is"
    elif error.status == 403:
        why = (
            "refused for now (quota or the operator's permissions); the job shows ClusterCreateFailed "
            "if it persists"
        )
    else:
        why = "could not be checked; the operator reports a refused create on the job (ClusterCreateFailed)"
    return "skipped", None, f"RayCluster {cluster}: {why} (HTTP {error.status}: {error.message})"[:500]


async def ask(api: k8s.Api, cluster: dict[str, Any]) -> k8s.ApiError | None:
    """POST the RayCluster with dryRun=All: the API server's refusal, or None when it accepts."""
    try:
        await asyncio.wait_for(api.dry_run_raycluster(cluster), timeout=DRY_RUN_TIMEOUT_SECONDS)
    except k8s.ApiError as err:
        return err
    except TimeoutError:
        return k8s.ApiError(0, f"no answer within {DRY_RUN_TIMEOUT_SECONDS:g} s")
    return None
