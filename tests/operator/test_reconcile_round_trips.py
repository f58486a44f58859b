"""A reconcile pass spends as few round trips as its ordering rules allow (issues 10 and 19).

The pass against a fake API whose every call takes the same time: the world is read from the
watch caches (no request), the status write still precedes every action (a stale decision fails
before it changes anything), the ConfigMap is created before the RayCluster whose pods mount it (a
ConfigMap of that name that is not the job's must stop the RayCluster: issue 27), and the events
are posted together, after the actions, even when an action fails.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf
import pytest

from asyncgrpo_operator import decision, k8s, manifests, progress, raytoken, settings
from asyncgrpo_operator import reconciler as reconciler_module
from asyncgrpo_operator.cache import Cache
from asyncgrpo_operator.manifests import OperatorPods, Owner
from asyncgrpo_operator.reconciler import NotLeadingError, Reconciler
from tests.operator.builders import BASE_JOB, at, cluster, raw_cluster

CALL_SECONDS = 0.05


class TimedApi:
    """Records (name, start, end) of every call; each call takes CALL_SECONDS."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.calls: list[tuple[str, float, float]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def _call(self, name: str, result: Any = None) -> Any:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(CALL_SECONDS)
        self.in_flight -= 1
        self.calls.append((name, start, loop.time()))
        return result

    async def patch_job_status(self, *_: Any) -> dict[str, Any]:
        written = {"metadata": {"resourceVersion": "written-1"}}
        return await self._call("patch_job_status", written)  # type: ignore[no-any-return]

    async def create_configmap(self, manifest: dict[str, Any]) -> dict[str, Any]:
        created = {**manifest, "metadata": {**manifest["metadata"], "uid": "cm-uid", "resourceVersion": "8"}}
        return await self._call("create_configmap", created)  # type: ignore[no-any-return]

    async def create_raycluster(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create_raycluster", manifest)  # type: ignore[no-any-return]

    async def create_secret(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create_secret", manifest)  # type: ignore[no-any-return]

    async def create_network_policy(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create_network_policy", manifest)  # type: ignore[no-any-return]

    async def post_event(self, *_: Any) -> None:
        await self._call("post_event")

    def span(self, *names: str) -> tuple[float, float]:
        picked = [(s, e) for n, s, e in self.calls if n in names]
        assert picked, names
        return min(s for s, _ in picked), max(e for _, e in picked)


def new_job() -> dict[str, Any]:
    body = copy.deepcopy(BASE_JOB)
    body["metadata"].update(resourceVersion="7", generation=1)
    body["spec"]["trainer"]["policy"] = {"trainMicroBatchSize": 4}  # a job the rules accept
    return body


def cached(job: dict[str, Any]) -> Cache:
    """A synced cache that holds the job and nothing else (a new job: no children yet)."""
    cache = Cache()
    cache.jobs.replace([copy.deepcopy(job)], "7")
    return cache


async def one_pass() -> TimedApi:
    api = TimedApi(new_job())
    async with aiohttp.ClientSession() as session:
        reconciler = Reconciler(api, progress.Poller(session), cached(api.job))  # type: ignore[arg-type]
        await reconciler.reconcile(("team", "demo"))
    return api


def test_a_new_job_takes_five_round_trips_to_its_raycluster_and_events() -> None:
    api = asyncio.run(one_pass())
    names = [n for n, _, _ in api.calls]
    assert names.count("create_raycluster") == 1 and names.count("create_configmap") == 1
    assert names.count("create_secret") == 1 and names.count("create_network_policy") == 1
    assert "post_event" in names

    status = api.span("patch_job_status")
    configmap = api.span("create_configmap")
    protection = api.span("create_secret", "create_network_policy")
    cluster = api.span("create_raycluster")
    events = api.span("post_event")
    # nothing read from the API; the status, the ConfigMap, the token Secret and NetworkPolicy
    # together (the RayCluster's pods need the one to start, and never run without the other),
    # the RayCluster, then the events
    assert names[0] == "patch_job_status"
    assert configmap[0] >= status[1]
    assert protection[0] >= configmap[1] and protection[1] - protection[0] < 2 * CALL_SECONDS
    assert cluster[0] >= protection[1]
    assert events[0] >= cluster[1]
    assert events[1] - events[0] < 2 * CALL_SECONDS
    assert api.most_in_flight >= 2
    total = max(e for _, _, e in api.calls) - min(s for _, s, _ in api.calls)
    assert total < 6.5 * CALL_SECONDS, f"{total:.3f} s for {len(names)} calls"


def test_the_echo_of_its_own_status_write_is_recognised_and_nothing_else() -> None:
    """The job watch skips the event that shows the job as the pass's own status write left it
    (that pass already acted on it); any other version of the job is a change to reconcile."""

    async def scenario() -> tuple[bool, bool, bool]:
        api = TimedApi(new_job())
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cached(api.job))  # type: ignore[arg-type]
            before = reconciler.is_own_write(("team", "demo"), "written-1")
            await reconciler.reconcile(("team", "demo"))
            echo = reconciler.is_own_write(("team", "demo"), "written-1")
            later = reconciler.is_own_write(("team", "demo"), "written-2")
        return before, echo, later

    assert asyncio.run(scenario()) == (False, True, False)


def test_kopf_builds_no_body_copy_per_event() -> None:
    # The only handlers are on.event (test_settings_and_logs checks there are no change
    # handlers), so the diff-base essence kopf builds per event is empty rather than a deep copy.
    config = kopf.OperatorSettings()
    settings.apply(config)
    body = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"big": list(range(1000))}})
    assert config.persistence.diffbase_storage.build(body=body) == {}
    assert config.persistence.diffbase_storage.fetch(body=body) is None


class RefusingApi(TimedApi):
    """The API server refuses the RayCluster (a policy, 422); records statuses and events."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    async def create_raycluster(self, manifest: dict[str, Any]) -> bool:
        await self._call("create_raycluster")
        raise k8s.ApiError(422, 'rayclusters.ray.io "demo-0" is forbidden: denied request: no hostNetwork')

    async def patch_job_status(self, namespace: str, name: str, version: str, status: Any) -> dict[str, Any]:
        self.statuses.append(status)
        return await self._call(
            "patch_job_status", {"metadata": {"resourceVersion": f"written-{len(self.statuses)}"}}
        )  # type: ignore[no-any-return]

    async def post_event(self, job: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason))


def test_a_refused_create_is_in_the_status_written_by_the_same_pass_with_one_warning() -> None:
    async def scenario() -> RefusingApi:
        api = RefusingApi(new_job())
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cached(api.job))  # type: ignore[arg-type]
            delay = await reconciler.reconcile(("team", "demo"))
        assert delay == 5.0  # the retry's backoff
        return api

    api = asyncio.run(scenario())
    assert [s["reason"] for s in api.statuses] == ["ClusterCreating", "ClusterCreateFailed"]
    assert "no hostNetwork" in api.statuses[-1]["message"] and "HTTP 422" in api.statuses[-1]["message"]
    assert [e for e in api.events if e[0] == "Warning"] == [("Warning", "ClusterCreateFailed")]
    names = [n for n, _, _ in api.calls]
    assert names.count("create_configmap") == 1 and names.count("create_raycluster") == 1


class UnansweredConfigMapApi(RefusingApi):
    """The status write succeeds; the ConfigMap's create gets no answer (a timeout under load)."""

    async def create_configmap(self, manifest: dict[str, Any]) -> None:
        await self._call("create_configmap")
        raise k8s.ApiError(0, "timed out")


def test_the_events_of_a_written_status_are_posted_when_an_action_then_fails() -> None:
    """The retried pass starts from the new phase and has no transition to announce: events not
    posted now would never show in `kubectl describe` (a job once ended without DriverSucceeded)."""

    async def scenario() -> UnansweredConfigMapApi:
        api = UnansweredConfigMapApi(new_job())
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cached(api.job))  # type: ignore[arg-type]
            with pytest.raises(k8s.ApiError, match="timed out"):
                await reconciler.reconcile(("team", "demo"))
        return api

    api = asyncio.run(scenario())
    assert [s["phase"] for s in api.statuses] == ["Pending"]
    assert "CreatedRayCluster" in [reason for _, reason in api.events]
    assert "create_raycluster" not in [n for n, _, _ in api.calls]


class TakenConfigMapApi(RefusingApi):
    """A ConfigMap named like the job's spec ConfigMap exists, controlled by `owner_uid`, and the
    cache does not show it (it holds only what the operator labelled)."""

    def __init__(self, job: dict[str, Any], owner_uid: str) -> None:
        super().__init__(job)
        self.owner_uid = owner_uid
        self.replaced: list[str] = []

    async def create_configmap(self, manifest: dict[str, Any]) -> None:
        await self._call("create_configmap")  # 409: it exists

    async def find_configmap(self, namespace: str, name: str) -> dict[str, Any]:
        owner = [{"uid": self.owner_uid, "controller": True}]
        meta = {"name": name, "namespace": namespace, "uid": "cm", "resourceVersion": "3"}
        return await self._call(
            "find_configmap", {"metadata": {**meta, "ownerReferences": owner}, "data": {"x": "y"}}
        )  # type: ignore[no-any-return]

    async def replace_configmap_data(self, manifest: dict[str, Any], resource_version: str) -> dict[str, Any]:
        self.replaced.append(resource_version)
        return await self._call("replace_configmap_data", manifest)  # type: ignore[no-any-return]

    async def create_raycluster(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create_raycluster", manifest)  # type: ignore[no-any-return]


def taken_pass(owner_uid: str) -> TakenConfigMapApi:
    async def scenario() -> TakenConfigMapApi:
        api = TakenConfigMapApi(new_job(), owner_uid)
        async with aiohttp.ClientSession() as session:
            await Reconciler(api, progress.Poller(session), cached(api.job)).reconcile(("team", "demo"))  # type: ignore[arg-type]
        return api

    return asyncio.run(scenario())


def test_a_spec_configmap_someone_else_owns_is_left_untouched_and_the_job_says_so() -> None:
    api = taken_pass("someone-elses-uid")
    names = [n for n, _, _ in api.calls]
    assert api.replaced == [] and "create_raycluster" not in names
    assert api.statuses[-1]["reason"] == "ConfigMapNameTaken"
    assert "someone-elses-uid" in api.statuses[-1]["message"]
    assert ("Warning", "ConfigMapNameTaken") in api.events


def test_the_jobs_own_spec_configmap_unseen_by_the_cache_is_rewritten_at_the_version_read() -> None:
    api = taken_pass(BASE_JOB["metadata"]["uid"])
    names = [n for n, _, _ in api.calls]
    assert api.replaced == ["3"] and names.count("create_raycluster") == 1
    assert "ConfigMapNameTaken" not in [s.get("reason") for s in api.statuses]


def test_a_replica_deposed_during_a_pass_makes_no_write_after_losing_the_lease() -> None:
    """The lease expires while the status write is in flight: the ConfigMap, the RayCluster and
    the events, which the replica that leads now may already be writing, are not."""
    leading = True

    class DeposingApi(TimedApi):
        async def patch_job_status(self, *args: Any) -> dict[str, Any]:
            nonlocal leading
            leading = False
            return await super().patch_job_status(*args)

    api = DeposingApi(new_job())
    asyncio.run(reconcile_without_the_lease(api, lambda: leading))
    assert [n for n, _, _ in api.calls] == ["patch_job_status"]


def test_a_replica_that_does_not_lead_writes_nothing() -> None:
    api = TimedApi(new_job())
    asyncio.run(reconcile_without_the_lease(api, lambda: False))
    assert api.calls == []


async def reconcile_without_the_lease(api: TimedApi, may_act: Callable[[], bool]) -> None:
    """One pass of team/demo that must end in NotLeadingError (the lease is, or goes, missing)."""
    async with aiohttp.ClientSession() as session:
        reconciler = Reconciler(
            api,  # type: ignore[arg-type]
            progress.Poller(session),
            cached(api.job),
            may_act=may_act,
        )
        with pytest.raises(NotLeadingError):
            await reconciler.reconcile(("team", "demo"))


# --- the job's Ray token Secret and NetworkPolicy come before its pods (issue 47, item 1) ----------

KEY = b"the operator's key, 32 bytes lon"
OPERATOR_PODS = OperatorPods("asyncgrpo-system", {"app.kubernetes.io/name": "asyncgrpo-operator"})


class ProtectingApi(RefusingApi):
    """Creates what it is asked to, but finds a NetworkPolicy of the job's name (controlled by
    `policy_owner`, loosened to admit everything) and, with `drops_auth`, stores RayClusters as a
    KubeRay CRD older than authOptions does."""

    def __init__(
        self, job: dict[str, Any], policy_owner: str | None = None, drops_auth: bool = False
    ) -> None:
        super().__init__(job)
        self.policy_owner = policy_owner
        self.drops_auth = drops_auth
        self.written: dict[str, Any] = {}

    async def create_secret(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.written["secret"] = manifest
        return await self._call("create_secret", manifest)  # type: ignore[no-any-return]

    async def create_network_policy(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        self.written["policy"] = manifest
        return await self._call("create_network_policy", None if self.policy_owner else manifest)  # type: ignore[no-any-return]

    async def get_network_policy(self, namespace: str, name: str) -> dict[str, Any]:
        owner = [{"uid": self.policy_owner, "controller": True}]
        meta = {"name": name, "namespace": namespace, "resourceVersion": "5", "ownerReferences": owner}
        loosened = {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}
        return await self._call("get_network_policy", {"metadata": meta, "spec": loosened})  # type: ignore[no-any-return]

    async def replace_network_policy(self, manifest: dict[str, Any], resource_version: str) -> dict[str, Any]:
        self.written["replaced"] = (manifest, resource_version)
        return await self._call("replace_network_policy", manifest)  # type: ignore[no-any-return]

    async def create_raycluster(self, manifest: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(manifest)
        stored["metadata"]["uid"] = "rc-uid"
        if self.drops_auth:
            del stored["spec"]["authOptions"]
        return await self._call("create_raycluster", stored)  # type: ignore[no-any-return]

    async def delete_raycluster(self, namespace: str, name: str, uid: str) -> None:
        self.written["deleted"] = (name, uid)
        await self._call("delete_raycluster")


def protecting_pass(api: ProtectingApi) -> Reconciler:
    async def scenario() -> Reconciler:
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(
                api,  # type: ignore[arg-type]
                progress.Poller(session),
                cached(api.job),
                ray_key=KEY,
                operator_pods=OPERATOR_PODS,
            )
            await reconciler.reconcile(("team", "demo"))
            return reconciler

    return asyncio.run(scenario())


def test_a_new_jobs_secret_holds_the_token_the_operator_derives_and_its_policy_admits_the_operator() -> None:
    api = ProtectingApi(new_job())
    reconciler = protecting_pass(api)
    uid = BASE_JOB["metadata"]["uid"]
    token = api.written["secret"]["stringData"]["auth_token"]
    assert token == raytoken.derive(KEY, "team", "demo", uid) == reconciler.ray_token("team", "demo", uid)
    assert api.written["secret"]["metadata"]["ownerReferences"][0]["uid"] == uid
    assert api.written["policy"] == manifests.network_policy(
        "demo", "team", Owner("demo", uid), OPERATOR_PODS
    )
    names = [n for n, _, _ in api.calls]
    assert names.index("create_secret") < names.index("create_raycluster")


def test_the_jobs_network_policy_loosened_by_hand_is_put_back_before_its_raycluster() -> None:
    api = ProtectingApi(new_job(), policy_owner=BASE_JOB["metadata"]["uid"])
    protecting_pass(api)
    replaced, version = api.written["replaced"]
    assert version == "5" and replaced == api.written["policy"]
    names = [n for n, _, _ in api.calls]
    assert names.index("replace_network_policy") < names.index("create_raycluster")


def test_a_network_policy_of_someone_else_by_the_jobs_name_is_left_alone() -> None:
    api = ProtectingApi(new_job(), policy_owner="someone-elses-uid")
    protecting_pass(api)
    assert "replaced" not in api.written
    assert [n for n, _, _ in api.calls].count("create_raycluster") == 1  # the token still guards Ray


def test_a_raycluster_stored_without_its_auth_options_is_deleted_and_the_job_says_kuberay_is_too_old() -> (
    None
):
    """A KubeRay CRD older than authOptions drops the field without a word: the cluster would run
    Ray open to anyone who reaches it. It goes at once, and the job says why and retries later."""
    api = ProtectingApi(new_job(), drops_auth=True)
    protecting_pass(api)
    assert api.written["deleted"] == ("demo-0", "rc-uid")
    assert api.statuses[-1]["reason"] == "ClusterCreateFailed"
    assert "KubeRay older than 1.6" in api.statuses[-1]["message"]
    assert ("Warning", "ClusterCreateFailed") in api.events


def test_a_resumed_raycluster_gets_its_secret_and_policy_first_and_a_suspended_one_nothing() -> None:
    """A resume writes the cluster's spec as rendered now, authOptions included: a cluster an
    older operator created, suspended, resumes with its token Secret and NetworkPolicy in place."""

    async def act(suspend: bool) -> list[str]:
        api = ProtectingApi(new_job())
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cached(api.job), ray_key=KEY)  # type: ignore[arg-type]
            action = decision.SetRayClusterSpec("demo-0", "rc-uid", suspend, None if suspend else {}, "test")

            async def set_spec(*_: Any) -> dict[str, Any]:
                return await api._call("set_raycluster_spec", raw_cluster(cluster(0)))  # type: ignore[no-any-return]

            api.set_raycluster_spec = set_spec  # type: ignore[attr-defined]
            await reconciler._act(("team", "demo"), api.job["metadata"], action, at(0), 1)
        return [n for n, _, _ in api.calls]

    resumed = asyncio.run(act(suspend=False))
    assert resumed[-1] == "set_raycluster_spec"
    assert {"create_secret", "create_network_policy"} <= set(resumed[:-1])
    assert asyncio.run(act(suspend=True)) == ["set_raycluster_spec"]


def test_a_status_a_newer_version_wrote_keeps_its_attempt_and_cluster_after_a_rollback() -> None:
    """Issue 47 item 8: fields this version does not know, nested ones included, are dropped, not
    the status. Read as unreadable, it was rebuilt from attempt 0, and the running attempt's
    RayCluster looked like a stale one to delete."""
    stored = {
        "phase": "Running",
        "attempt": 2,
        "rayClusterName": "demo-2",
        "fieldOfANewerVersion": {"any": "thing"},
        "progress": {"step": 40, "figureOfANewerVersion": 0.5},
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "Training",
                "message": "",
                "newerKey": 1,
                "lastTransitionTime": "2026-12-07T10:00:00Z",
            },
        ],
    }
    status = reconciler_module._parse_status(stored)
    assert status is not None
    assert (status.attempt, status.ray_cluster_name, status.phase) == (2, "demo-2", "Running")
    assert status.progress is not None and status.progress.step == 40
    assert [c.type for c in status.conditions] == ["Running"]
