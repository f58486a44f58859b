"""A status that cannot be read is rebuilt from the job's own RayCluster (issue 47 item 8).

Rebuilt from nothing, as before, the job started over at attempt 0: its running attempt's
RayCluster looked stale and was deleted, and its restarts were forgotten.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import aiohttp

from asyncgrpo_api.v1alpha1.runtime import CleanupPolicy
from asyncgrpo_operator import naming, plan, progress
from asyncgrpo_operator.cache import Cache
from asyncgrpo_operator.reconciler import Reconciler
from tests.operator.builders import OWNER, at, cluster, healthy_pods, job, observe, raw_cluster, raw_pod
from tests.operator.test_job_phase_transitions import actions_of, step
from tests.operator.test_reconcile_round_trips import RefusingApi, new_job


def warnings_of(decision: plan.Decision) -> list[str]:
    return [e.reason for e in decision.events if e.type == "Warning"]


def test_a_running_attempt_whose_status_is_unreadable_keeps_its_cluster_and_its_restarts() -> None:
    rc = cluster(2, provisioned=True, created=100)
    decision = step(job(), None, observe(300, rc, pods=healthy_pods(rc)))

    assert actions_of(decision, plan.DeleteRayCluster) == []
    assert actions_of(decision, plan.CreateRayCluster) == []
    status = decision.status
    assert (status.attempt, status.restarts, status.ray_cluster_name) == (2, 2, "demo-2")
    assert (status.phase, status.reason) == ("Running", "DriverRunning")
    assert status.dashboard_url == "http://demo-2-head-svc.team.svc:8265"
    assert status.start_time == status.attempt_start_time == at(100)  # the cluster's creation
    assert warnings_of(decision) == ["StatusRebuilt"]
    rebuilt = next(e for e in decision.events if e.reason == "StatusRebuilt")
    assert "demo-2" in rebuilt.message and naming.ATTEMPT_LABEL in rebuilt.message

    again = step(job(), decision.status, observe(305, rc, pods=healthy_pods(rc)))
    assert "StatusRebuilt" not in [e.reason for e in again.events] and again.actions == ()


def test_only_a_raycluster_the_job_controls_gives_back_the_attempt() -> None:
    """Anyone may label a RayCluster with the job's name and a higher attempt; only the job's UID in
    its controller ownerReference makes it the job's."""
    own = cluster(1, provisioned=True)
    foreign = cluster(4, uid="foreign", owner_uid="someone-else")
    decision = step(job(), None, observe(60, own, foreign, pods=healthy_pods(own)))

    assert (decision.status.attempt, decision.status.ray_cluster_name) == (1, "demo-1")
    assert actions_of(decision, plan.DeleteRayCluster) == []  # neither the job's nor the foreign one


def test_an_unreadable_status_during_a_retry_goes_on_with_the_next_attempt() -> None:
    """The latest cluster is being deleted (its attempt failed): that attempt is the one lost, and
    the next is started, one restart more, as the status would have said."""
    lost = cluster(1, deleting=True)
    decision = plan.plan(job(), None, replace(observe(60, lost), from_cache=False), generation=1, owner=OWNER)

    assert (decision.status.attempt, decision.status.restarts) == (2, 2)
    created = actions_of(decision, plan.CreateRayCluster)
    assert [a.manifest["metadata"]["name"] for a in created] == ["demo-2"]  # type: ignore[attr-defined]


def test_a_new_job_without_a_raycluster_starts_at_attempt_0_without_a_warning() -> None:
    decision = step(job(), None, observe(0, configmap=False))
    assert decision.status.attempt == 0 and warnings_of(decision) == []
    assert len(actions_of(decision, plan.CreateRayCluster)) == 1


def test_a_refused_spec_with_an_unreadable_status_keeps_its_running_attempt() -> None:
    """After a rollback the spec may fail the older rules too: the running attempt is kept."""
    rc = cluster(2, provisioned=True)
    decision = plan.plan_invalid(
        None,
        observe(60, rc, pods=healthy_pods(rc)),
        generation=1,
        message="spec.x: bad",
        cleanup=CleanupPolicy(),
        owner=OWNER,
    )
    assert actions_of(decision, plan.DeleteRayCluster) == []
    assert (decision.status.attempt, decision.status.ray_cluster_name) == (2, "demo-2")
    assert decision.condition("SpecValid").status == "False"  # type: ignore[union-attr]
    assert decision.status.phase != "Failed"


class RecordingApi(RefusingApi):
    """Records the RayClusters a pass deletes or creates, besides statuses and events."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.deleted: list[str] = []
        self.created: list[str] = []

    async def delete_raycluster(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)

    async def create_raycluster(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.created.append(manifest["metadata"]["name"])
        return manifest


def test_a_pass_over_a_status_of_another_type_keeps_the_running_attempt_and_says_so() -> None:
    """A status the tolerant parse cannot read either (a field a newer version made an object):
    the pass through the real reconciler keeps attempt 2's RayCluster, creates none, writes the
    attempt back and posts one Warning."""
    body = new_job()
    body["status"] = {"phase": "Running", "attempt": 2, "rayClusterName": "demo-2", "restarts": {"total": 2}}
    rc = cluster(2, provisioned=True)
    raw = raw_cluster(rc)
    raw["metadata"]["labels"][naming.ATTEMPT_LABEL] = "2"
    cache = Cache()
    cache.jobs.replace([copy.deepcopy(body)], "7")
    cache.clusters.apply("ADDED", raw)
    for pod in (raw_pod(rc, head=True), raw_pod(rc, group="policy"), raw_pod(rc, group="generation")):
        cache.pods.apply("ADDED", pod)

    async def scenario() -> RecordingApi:
        api = RecordingApi(body)
        async with aiohttp.ClientSession() as session:
            await Reconciler(api, progress.Poller(session), cache).reconcile(("team", "demo"))  # type: ignore[arg-type]
        return api

    api = asyncio.run(scenario())
    assert (api.deleted, api.created) == ([], [])
    written = api.statuses[-1]
    assert (written["attempt"], written["restarts"], written["rayClusterName"]) == (2, 2, "demo-2")
    assert [reason for kind, reason in api.events if kind == "Warning"] == ["StatusRebuilt"]
