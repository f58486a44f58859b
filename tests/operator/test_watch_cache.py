"""The watch caches a pass reads from (issue 19): kept correct across relists, out-of-order
answers and deletions, filled by informers that list again when their watch expires; and a status
written only when something shown changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import pickle
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest

from asyncgrpo_api.v1alpha1 import AsyncGRPOJobStatus, Progress
from asyncgrpo_operator import decision, k8s, naming, observed, plan, progress, runtime
from asyncgrpo_operator import informer as informer_module
from asyncgrpo_operator.cache import ADDED, DELETED, MODIFIED, Cache, Index
from asyncgrpo_operator.informer import Informer
from asyncgrpo_operator.metrics import Metrics
from asyncgrpo_operator.observed import PodView
from asyncgrpo_operator.reconciler import Reconciler
from tests.operator.builders import (
    BASE_JOB,
    OWNER,
    at,
    cluster,
    healthy_pods,
    job,
    observe,
    raw_cluster,
    raw_pod,
)
from tests.operator.test_queueing import PENDING, kueue_job, seen, step, wl

JOB = ("team", "demo")


def pod(name: str, version: int, *, job: str = "demo", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "namespace": "team",
            "resourceVersion": str(version),
            "labels": {naming.JOB_NAME_LABEL: job},
        },
        "status": {"phase": phase},
    }


def names(index: Index[PodView]) -> list[str]:
    return sorted(p.name for p in index.of(JOB))


def test_a_relist_drops_what_was_deleted_while_the_watch_was_down_and_names_the_job() -> None:
    index = Index(PodView.from_dict)
    index.apply(ADDED, pod("head", 10))
    index.apply(ADDED, pod("worker", 11))
    index.apply(ADDED, pod("head", 10))  # a list at version 20 shows the head alone:
    changed = index.prune({"head-uid"}, "20")  # the worker was deleted during the gap, no event
    assert names(index) == ["head"]
    assert changed == {JOB}


def test_a_relist_keeps_what_the_operator_created_after_the_list_was_taken() -> None:
    index = Index(PodView.from_dict)
    index.apply(ADDED, pod("created-by-us", 30))  # the answer to our create, newer than the list
    index.prune(set(), "20")
    assert names(index) == ["created-by-us"]


def test_a_pods_view_keeps_a_bounded_part_of_what_others_write_into_it() -> None:
    megabyte = "x" * (1 << 20)
    statuses = [
        {"name": f"sidecar-{i}", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": megabyte}}}
        for i in range(100)
    ] + [{"name": naming.DRIVER_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": megabyte}}}]
    body = pod("head", 10)
    body["spec"] = {"containers": [{"name": "c", "env": [{"name": "BIG", "value": megabyte}]}]}
    body["status"] = {"phase": "Running", "message": megabyte, "containerStatuses": statuses}
    view = PodView.from_dict(body)
    assert len(pickle.dumps(view)) < 64 << 10  # of some 103 MiB written
    assert len(view.containers) == observed.MAX_CONTAINERS
    driver = view.container(naming.DRIVER_CONTAINER)
    assert driver is not None and driver.exit_code == 0  # the one the plan reads is kept


def test_an_older_event_never_replaces_a_newer_object() -> None:
    index = Index(PodView.from_dict)
    index.apply(MODIFIED, pod("head", 12, phase="Failed"))
    assert index.apply(MODIFIED, pod("head", 11, phase="Running")) is None
    assert [p.phase for p in index.of(JOB)] == ["Failed"]


def test_an_answer_read_after_the_deletion_does_not_bring_the_object_back() -> None:
    index = Index(PodView.from_dict)
    index.apply(DELETED, pod("rc", 15))
    index.apply(ADDED, pod("rc", 14))  # the create's answer, read after the watch said deleted
    assert index.of(JOB) == ()


def test_unlabelled_objects_are_not_anyones() -> None:
    index = Index(PodView.from_dict)
    loose = pod("loose", 1)
    del loose["metadata"]["labels"]
    assert index.apply(ADDED, loose) is None and len(index) == 0


def job_body(version: int, uid: str = "job-uid-1") -> dict[str, Any]:
    body = copy.deepcopy(BASE_JOB)
    body["metadata"].update(resourceVersion=str(version), uid=uid, managedFields=[{"big": "x" * 100}])
    return body


def test_the_resync_list_drops_a_job_deleted_while_its_watch_was_down() -> None:
    cache = Cache()
    cache.jobs.apply(ADDED, job_body(5))
    assert "managedFields" not in cache.jobs.get(JOB)["metadata"]  # type: ignore[index]
    cache.jobs.replace([], "9")
    assert cache.jobs.get(JOB) is None


def test_a_job_recreated_under_its_name_replaces_the_old_one_for_good() -> None:
    cache = Cache()
    cache.jobs.apply(ADDED, job_body(5, uid="old"))
    cache.jobs.apply(ADDED, job_body(8, uid="new"))
    cache.jobs.apply(MODIFIED, job_body(6, uid="old"))  # a late answer about the old job
    assert cache.jobs.get(JOB)["metadata"]["uid"] == "new"  # type: ignore[index]


def test_no_pass_runs_before_every_watch_has_listed_once() -> None:
    cache = Cache(scopes=("team",))
    assert not cache.synced()
    cache.jobs.replace([], "1", "team")
    for resource in ("rayclusters", "pods", "configmaps", "workloads"):
        assert not cache.synced()
        cache.children_listed.add((resource, "team"))
    assert cache.synced()


# --- the informer --------------------------------------------------------------------------------


class WatchApi:
    """Lists and watches from scripts: each list returns the next of `lists` (or raises it), each
    watch yields the next of `watches`, each streaming list the next of `streams` (refused as an
    API server without them refuses it while `streams` is None); afterwards the informer is
    stopped. Records the page sizes asked for."""

    def __init__(
        self,
        lists: list[Any],
        watches: list[list[dict[str, Any]]],
        streams: list[list[dict[str, Any]]] | None = None,
    ) -> None:
        self.lists, self.watches, self.streams = lists, watches, streams
        self.calls: list[str] = []
        self.page_sizes: list[int] = []

    async def list_pages(
        self,
        path: str,
        label_selector: str | None = None,
        *,
        metadata_only: bool = False,
        page_size: int = k8s.LIST_PAGE_SIZE,
    ) -> AsyncIterator[tuple[list[Any], str]]:
        self.calls.append("list")
        self.page_sizes.append(page_size)
        if not self.lists:
            raise asyncio.CancelledError
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield answer

    async def watch(
        self,
        path: str,
        selector: str | None,
        version: str,
        timeout: int,
        *,
        metadata_only: bool = False,
        initial_events: bool = False,
    ) -> AsyncIterator[Any]:
        if initial_events and self.streams is None:
            raise k8s.ApiError(
                422, "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
            )
        script = self.streams if initial_events else self.watches
        assert script is not None
        self.calls.append("stream" if initial_events else f"watch@{version}")
        if not script:
            raise asyncio.CancelledError
        for event in script.pop(0):
            yield event


def run_informer(api: WatchApi, index: Index[PodView]) -> list[tuple[str, str]]:
    changed: list[tuple[str, str]] = []

    informer = Informer(api, "pods", "team", index, changed=changed.extend, listed=lambda: None)  # type: ignore[arg-type]
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(informer.run())
    return changed


def test_the_informer_lists_watches_from_the_lists_version_and_lists_again_on_410() -> None:
    index = Index(PodView.from_dict)
    api = WatchApi(
        lists=[([pod("head", 10), pod("worker", 11)], "11"), ([pod("head", 30)], "31")],
        watches=[
            [
                {"type": "MODIFIED", "object": pod("head", 12, phase="Failed")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
            ],
            [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
        ],
    )
    changed = run_informer(api, index)
    assert api.calls[:4] == ["list", "watch@11", "watch@20", "list"]
    assert names(index) == ["head"]  # the worker went away while the watch was expired
    assert JOB in changed


def test_a_streaming_list_fills_the_cache_then_watches_on_and_drops_what_it_lacked() -> None:
    index = Index(PodView.from_dict)
    index.apply(ADDED, pod("gone", 5))  # deleted while no watch ran
    end = {"metadata": {"resourceVersion": "20", "annotations": {k8s.INITIAL_EVENTS_END: "true"}}}
    api = WatchApi(
        lists=[],
        watches=[],
        streams=[
            [
                {"type": "ADDED", "object": pod("head", 10)},
                {"type": "ADDED", "object": pod("worker", 11)},
                {"type": "BOOKMARK", "object": end},
                {"type": "MODIFIED", "object": pod("head", 21, phase="Failed")},
            ]
        ],
    )
    changed = run_informer(api, index)
    assert api.calls[:2] == ["stream", "watch@21"]  # the stream ended: watched on from where it was
    assert names(index) == ["head", "worker"]
    assert [p.phase for p in index.of(JOB) if p.name == "head"] == ["Failed"]
    assert JOB in changed


def test_without_streaming_lists_whole_objects_are_listed_in_small_pages_metadata_in_large() -> None:
    for metadata_only, size in ((False, informer_module.FULL_PAGE_SIZE), (True, informer_module.PAGE_SIZE)):
        api = WatchApi(lists=[([pod("head", 10)], "11")], watches=[[]])
        informer = Informer(
            api,  # type: ignore[arg-type]
            "pods",
            "team",
            Index(PodView.from_dict),
            changed=lambda _: None,
            listed=lambda: None,
            metadata_only=metadata_only,
        )
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(informer.run())
        assert api.page_sizes == [size]
    assert informer_module.FULL_PAGE_SIZE * 1536 << 10 < 64 << 20  # a page of the largest: < 64 MiB


def test_a_resource_not_served_is_recorded_and_cleared_once_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer_module, "MISSING_SECONDS", 0.0)
    index = Index(PodView.from_dict)
    api = WatchApi(lists=[k8s.ApiError(404, "404 page not found"), ([], "3")], watches=[])
    seen: list[dict[str | None, str]] = []
    original = index.prune

    def prune(listed: set[str], version: str, scope: str | None = None) -> set[tuple[str, str]]:
        seen.append(dict(index.missing))
        return original(listed, version, scope)

    index.prune = prune  # type: ignore[method-assign]
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(_informer(api, index))
    assert seen == [{"team": "404 page not found"}]
    assert index.missing == {}


async def _informer(api: WatchApi, index: Index[PodView]) -> None:
    informer = Informer(api, "pods", "team", index, changed=lambda _: None, listed=lambda: None)  # type: ignore[arg-type]
    await informer.run()


# --- Kueue's Workloads are watched, not polled ----------------------------------------------------


def test_workloads_are_listed_and_watched_in_kueues_api_group() -> None:
    assert informer_module.collection_path("workloads", "team") == (
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/team/workloads"
    )
    assert informer_module.collection_path("workloads", None) == "/apis/kueue.x-k8s.io/v1beta2/workloads"


def test_kueues_decision_on_a_workload_queues_its_jobs_pass() -> None:
    """Kueue admits a Workload: the watch event names the job (the Workload carries its job-name
    label), so its pass runs now, not at the next poll."""
    queued = workload_body(5, admitted=False)
    admitted = workload_body(9, admitted=True)
    cache = Cache()
    api = WatchApi(lists=[([queued], "5")], watches=[[{"type": "MODIFIED", "object": admitted}]])
    changed: list[tuple[str, str]] = []
    informer = Informer(api, "workloads", None, cache.workloads, changed=changed.extend, listed=lambda: None)  # type: ignore[arg-type]
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(informer.run())
    assert changed == [JOB, JOB]  # the list, then Kueue's admission
    [view] = cache.workloads.of(JOB)
    assert view.admitted and view.name == "wl"


def test_a_job_waiting_for_kueue_is_not_polled() -> None:
    """While Kueue decides, a pass asks for no early look (it used to, every 3 s): the Workload's
    watch event brings the next pass."""
    first = step(None, seen(0, workload=wl(PENDING)))
    queued = step(first.status, seen(5, workload=wl(PENDING)), kueue_job(suspend=True))
    assert queued.status.phase == "Queued" and queued.requeue_after is None


def workload_body(version: int, *, admitted: bool) -> dict[str, Any]:
    conditions = [{"type": "QuotaReserved", "status": "True" if admitted else "False", "reason": "Pending"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True", "reason": "Admitted"})
    return {
        "metadata": {
            "name": "wl",
            "uid": "wl-uid",
            "namespace": "team",
            "resourceVersion": str(version),
            "labels": {naming.JOB_NAME_LABEL: "demo"},
            "ownerReferences": [{"uid": OWNER.uid, "controller": True}],
        },
        "spec": {"podSets": []},
        "status": {"conditions": conditions},
    }


# --- writes only on change -----------------------------------------------------------------------


class RecordingApi:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch_job_status(self, namespace: str, name: str, version: str, status: Any) -> dict[str, Any]:
        self.patches.append(status)
        return {"metadata": {"resourceVersion": "8", "namespace": namespace, "name": name}}

    async def post_event(self, *_: Any) -> None:
        pass


def apply_progress(stored_step: int, new_step: int) -> RecordingApi:
    """Apply a decision whose progress differs from the stored one only in when it was read
    (or also in the step), as a pass of a running job that polled /progress does."""
    stored = AsyncGRPOJobStatus(phase="Running", progress=Progress(step=stored_step, updated_at=at(0)))
    body = {**job_body(7), "status": stored.model_dump(mode="json", by_alias=True)}
    outcome = decision.Decision(
        status=AsyncGRPOJobStatus(phase="Running", progress=Progress(step=new_step, updated_at=at(60)))
    )
    api = RecordingApi()

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), Cache())  # type: ignore[arg-type]
            await reconciler._apply(JOB, body, outcome, at(60), 1)

    asyncio.run(scenario())
    return api


def test_a_poll_that_reads_the_same_figures_writes_no_status() -> None:
    assert apply_progress(stored_step=3, new_step=3).patches == []


def test_a_poll_that_reads_a_new_step_writes_it() -> None:
    assert [p["progress"]["step"] for p in apply_progress(stored_step=3, new_step=4).patches] == [4]


def test_after_an_operator_restart_the_stall_clock_runs_from_the_last_recorded_change() -> None:
    """The heartbeat is in memory; a restarted operator has none, and takes the time the status
    last recorded a change of the figures (no later than the step's last change)."""
    rc = cluster(0, provisioned=True)
    first = plan.plan(job(), None, observe(0, configmap=False), generation=1, owner=OWNER)
    running = plan.plan(
        job(), first.status, observe(30, rc, pods=healthy_pods(rc)), generation=1, owner=OWNER
    )
    recorded = running.status.model_copy(update={"progress": Progress(step=7, updated_at=at(40))})
    doc = {"step": 7, "state": "running"}
    after_restart = plan.plan(
        job(), recorded, observe(170, rc, pods=healthy_pods(rc), progress=doc), generation=1, owner=OWNER
    )
    cond = after_restart.condition(plan.STALLED)
    assert cond is not None and cond.status == "True"
    assert "2026-11-29T12:00:40Z" in cond.message
    assert after_restart.progress_mark is not None and after_restart.progress_mark.since == at(40)
    assert at(170) - after_restart.progress_mark.since > timedelta(seconds=120)


# --- a missing child is confirmed before it costs a restart ---------------------------------------


def test_a_head_pod_missing_from_the_cache_is_confirmed_before_the_job_restarts() -> None:
    """The RayCluster's list can be newer than the pods' (an operator that just started): a
    provisioned cluster without its head pod in the cache asks for a fresh read, not a restart."""
    rc = cluster(0, provisioned=True)
    first = plan.plan(job(), None, observe(0, configmap=False), generation=1, owner=OWNER)
    running = plan.plan(
        job(), first.status, observe(30, rc, pods=healthy_pods(rc)), generation=1, owner=OWNER
    )
    lagging = observe(40, rc, pods=healthy_pods(rc)[1:], from_cache=True)
    unsure = plan.plan(job(), running.status, lagging, generation=1, owner=OWNER)
    assert unsure.confirm is not None and "head pod" in unsure.confirm
    read = observe(40, rc, pods=healthy_pods(rc)[1:])  # read from the API server: it is gone
    lost = plan.plan(job(), running.status, read, generation=1, owner=OWNER)
    assert lost.confirm is None and lost.status.restarts == 1


def test_a_raycluster_missing_from_the_cache_is_confirmed_before_the_job_restarts() -> None:
    rc = cluster(0, provisioned=True)
    first = plan.plan(job(), None, observe(0, configmap=False), generation=1, owner=OWNER)
    running = plan.plan(
        job(), first.status, observe(30, rc, pods=healthy_pods(rc)), generation=1, owner=OWNER
    )
    unsure = plan.plan(job(), running.status, observe(40, from_cache=True), generation=1, owner=OWNER)
    assert unsure.confirm is not None and not unsure.actions


class ConfirmingApi(RecordingApi):
    """The API server still has the head pod that the cache does not show yet."""

    def __init__(self, clusters: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        super().__init__()
        self.clusters, self.pods = clusters, pods
        self.reads = 0

    async def list_rayclusters(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        self.reads += 1
        return self.clusters

    async def list_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        self.reads += 1
        return self.pods

    async def create_configmap(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return manifest


def test_a_pass_reads_the_children_afresh_before_it_counts_a_head_pod_lost() -> None:
    rc = cluster(0, provisioned=True)
    first = plan.plan(job(), None, observe(0, configmap=False), generation=1, owner=OWNER)
    running = plan.plan(
        job(), first.status, observe(30, rc, pods=healthy_pods(rc)), generation=1, owner=OWNER
    )
    provisioned = raw_cluster(rc)
    head, *workers = (raw_pod(rc, head=True), raw_pod(rc, group="policy"), raw_pod(rc, group="generation"))
    cache = Cache()
    body = {**job_body(7), "status": running.status.model_dump(mode="json", by_alias=True)}
    body["spec"]["trainer"]["policy"] = {"trainMicroBatchSize": 4}
    cache.jobs.apply(ADDED, body)
    cache.clusters.apply(ADDED, provisioned)
    for raw in workers:  # the head pod's event has not arrived yet
        cache.pods.apply(ADDED, raw)
    api = ConfirmingApi([provisioned], [head, *workers])

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            await Reconciler(api, progress.Poller(session), cache).reconcile(JOB)  # type: ignore[arg-type]

    asyncio.run(scenario())
    assert api.reads == 2
    assert all(p.get("restarts", 0) == 0 for p in api.patches)
    assert "demo-0-head" in [p.name for p in cache.pods.of(JOB)]


def test_a_job_deleted_while_its_delete_event_was_missed_leaves_the_jobs_by_phase_metric() -> None:
    """The resync's list no longer has the job: the job is counted by phase no more (it used to be
    counted as Running until the operator restarted)."""

    class ListingApi(RecordingApi):
        def __init__(self) -> None:
            super().__init__()
            self.jobs: list[dict[str, Any]] = []

        async def list_jobs(self, namespace: str | None = None) -> tuple[list[dict[str, Any]], str]:
            return self.jobs, "50"

    def running_jobs(metrics: Metrics) -> float:
        value = metrics.registry.get_sample_value("asyncgrpo_jobs", {"phase": "Running"})
        assert value is not None
        return value

    async def scenario() -> tuple[float, float]:
        api = ListingApi()
        api.jobs = [job_body(7)]
        cache = Cache(scopes=("team",))
        metrics = Metrics()
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cache)  # type: ignore[arg-type]
            metrics.watch(
                phases=reconciler.memory.phases.values,
                queue_depth=lambda: 0,
                in_flight=lambda: 0,
                is_leader=lambda: True,
            )
            await runtime.resync_keys(api, cache, ["team"])  # type: ignore[arg-type]
            reconciler.memory.phases[JOB] = "Running"  # as its last pass left it
            before = running_jobs(metrics)
            api.jobs = []  # deleted; the DELETE event never came
            for key in await runtime.resync_keys(api, cache, ["team"]):  # type: ignore[arg-type]
                await reconciler.reconcile(key)
        return before, running_jobs(metrics)

    assert asyncio.run(scenario()) == (1, 0)
