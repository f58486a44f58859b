"""A job's status rebuilt from its own RayClusters, when the stored one cannot be read (issue 47 item 8).

The status is where the operator keeps which attempt runs. When it cannot be read at all (a field
whose type a newer version changed, left behind by a rollback; or a status that whoever may write
it wiped), a plan from an empty status would start at attempt 0: it would take the running
attempt's RayCluster for a stale one, delete it, start the job over and forget its restarts.
The job's RayClusters still say which attempt runs: each carries it in its asyncgrpo.dev/attempt
label and is named after it, and only those whose controller ownerReference carries the job's UID
are the job's (anyone may create a RayCluster with the job's labels, not one the job owns).
Attempts advance only with restarts (plan.py, `_infra_failure`), so the restarts are the attempt,
and backoffLimit still counts them. When the status was last written is lost with it: both clocks
(activeDeadlineSeconds and the startup deadline) run from the cluster's creation, the latest
moment the attempt could have started. Pure: plan.py rebuilds, the reconciler only reads the
rebuilt attempt's cluster to find its head pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from asyncgrpo_api.v1alpha1 import AsyncGRPOJobStatus
from asyncgrpo_operator import naming
from asyncgrpo_operator.decision import Event
from asyncgrpo_operator.manifests import Owner
from asyncgrpo_operator.observed import ClusterView

STATUS_REBUILT = "StatusRebuilt"


@dataclass(frozen=True)
class Rebuilt:
    """A status rebuilt from a RayCluster, and the Warning that says so."""

    status: AsyncGRPOJobStatus
    event: Event


def latest_cluster(owner: Owner, clusters: Iterable[ClusterView]) -> ClusterView | None:
    """The job's RayCluster of its latest attempt: controlled by the job's UID and named after the
    attempt its label gives (a cluster being deleted too: its attempt was the latest one, and the
    plan retries it as a lost cluster)."""
    own = [
        c
        for c in clusters
        if c.owner_uid == owner.uid
        and c.attempt is not None
        and c.name == naming.raycluster_name(owner.name, c.attempt)
    ]
    return max(own, key=lambda c: c.attempt or 0, default=None)


def rebuild(owner: Owner | None, clusters: Iterable[ClusterView]) -> Rebuilt | None:
    """The status of a job whose stored status cannot be read, from its latest RayCluster; None
    when it has none (a new job, whose status is empty until its first pass)."""
    cluster = latest_cluster(owner, clusters) if owner is not None else None
    if cluster is None or cluster.attempt is None:
        return None
    attempt = cluster.attempt
    status = AsyncGRPOJobStatus(
        attempt=attempt,
        restarts=attempt,
        ray_cluster_name=cluster.name,
        start_time=cluster.created_at,
        attempt_start_time=cluster.created_at,
    )
    created = cluster.created_at.isoformat().replace("+00:00", "Z") if cluster.created_at else "unknown"
    message = (
        f"the job's status could not be read (absent, or written with fields of another type by another "
        f"version of the operator) and was rebuilt from its RayCluster {cluster.name}: attempt {attempt} "
        f"(its {naming.ATTEMPT_LABEL} label) and its cluster are kept, {attempt} restart(s) counted, and "
        f"the deadlines run from the cluster's creation ({created}); the progress figures come back with "
        "the driver's next report"
    )
    return Rebuilt(status, Event("Warning", STATUS_REBUILT, message))
