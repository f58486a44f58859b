"""Watch what jobs own: RayClusters and head pods. Their events queue the owning job.

Both watches are narrowed server-side to objects labelled `asyncgrpo.dev/job-name` (settings.py),
so the operator does not receive every pod of the cluster.

The head pod handler also remembers a terminated driver: KubeRay deletes a head pod whose Ray
container ended, and the last state of a deleted pod is only in the watch event, so the exit is
kept for the next pass.
"""

from __future__ import annotations

from typing import Any

import kopf

from asyncgrpo_operator import naming, runtime
from asyncgrpo_operator.observed import DriverExit, PodView


@kopf.on.event(
    naming.RAY_GROUP,
    naming.RAY_VERSION,
    naming.RAYCLUSTER_PLURAL,
    labels={naming.JOB_NAME_LABEL: kopf.PRESENT},
    id=naming.HANDLER_RAYCLUSTER_EVENT,
)
async def enqueue_job_of_raycluster(
    *, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A job's RayCluster changed (conditions, deletion): reconcile the job."""
    runtime.of(memo).enqueue(namespace, labels.get(naming.JOB_NAME_LABEL))


@kopf.on.event(
    "v1",
    "pods",
    labels={naming.JOB_NAME_LABEL: kopf.PRESENT},
    id=naming.HANDLER_POD_EVENT,
)
async def record_pod(
    *, body: kopf.Body, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A job's pod changed: remember a driver exit, then reconcile the job."""
    job_name = labels.get(naming.JOB_NAME_LABEL)
    rt = runtime.of(memo)
    if namespace and job_name and labels.get(naming.RAY_NODE_TYPE_LABEL) == "head":
        exit_ = DriverExit.from_pod(PodView.from_dict(body))
        if exit_ is not None:
            rt.reconciler.remember_exit((namespace, job_name), exit_)
    rt.enqueue(namespace, job_name)
