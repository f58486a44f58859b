"""Operator faults: SIGKILL at random points of every transition, and two replicas with one leader.

The operator is the e2e harness's subprocess (tests/e2e/test_operator.py, admin kubeconfig, one
namespace). Each round drives one job through its whole life and kills the operator at a random
moment (0 to 1.5 s, drawn from a seeded RNG printed on failure) right after each triggering
change: create, suspend, resume, a head-pod failure (retry) and delete. After each kill the
operator is restarted and the job must reach the right state. A sampler thread checks, every
100 ms for the whole test, that no job ever has two live RayClusters.

Counts: ASYNCGRPO_RELIABILITY_KILL_ROUNDS (default 1 round = 5 kills; each round ~80 s on 2
cores) and ASYNCGRPO_RELIABILITY_LEADER_JOBS (default 4).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import faults
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, wait_until
from tests.e2e.test_operator import (
    JOBS,
    OperatorProcess,
    ProgressServer,
    asyncgrpo_crd,  # noqa: F401 - the fixture, reused
    create_job,
    events,
    get_job,
    head_pod,
    job_manifest,
    live_rayclusters,
    suspended_in_place,
)
from tests.reliability.conftest import count

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


class ClusterCountSampler:
    """Polls the namespace's RayClusters and remembers the most live ones any job ever had."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.worst: dict[str, list[str]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        path = f"/apis/ray.io/v1/namespaces/{self.namespace}/rayclusters"
        while not self._stop.is_set():
            try:
                items = self.api.get(path).get("items", [])
            except (ApiError, OSError):
                items = []
            per_job: dict[str, list[str]] = {}
            for rc in items:
                if rc["metadata"].get("deletionTimestamp"):
                    continue
                job = rc["metadata"].get("labels", {}).get("asyncgrpo.dev/job-name", "?")
                per_job.setdefault(job, []).append(rc["metadata"]["name"])
            for job, names in per_job.items():
                if len(names) > len(self.worst.get(job, [])):
                    self.worst[job] = names
            self.samples += 1
            self._stop.wait(0.1)

    def __enter__(self) -> ClusterCountSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _status(api: Api, ns: str, name: str) -> JSON:
    return get_job(api, ns, name).get("status") or {}


def _until(api: Api, ns: str, name: str, what: str, ok: Callable[[JSON], bool]) -> JSON:
    return wait_until(lambda: s if ok(s := _status(api, ns, name)) else None, f"{name}: {what}", 120)


def _only(api: Api, ns: str, job: str, clusters: list[str]) -> bool | None:
    return live_rayclusters(api, ns, job) == clusters or None


def _children_gone(api: Api, ns: str, job: str) -> bool | None:
    return (not live_rayclusters(api, ns, job) and not pods(api, ns, f"asyncgrpo.dev/job-name={job}")) or None


def test_sigkill_at_random_points_of_every_transition_loses_nothing(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
    progress: ProgressServer,
) -> None:
    api, ns = kube_api, namespace
    seed = int(time.time())
    rng = random.Random(seed)
    rounds = count("kill_rounds", 1)
    op = OperatorProcess(kubeconfig, ns, tmp_path / "operator.log", progress=progress)
    kills = events_total = events_missing = 0

    def kill_soon() -> None:
        nonlocal kills
        time.sleep(rng.uniform(0.0, 1.5))
        op.kill()
        kills += 1
        op.start()

    op.start()
    try:
        with ClusterCountSampler(api, ns) as sampler:
            for round_ in range(rounds):
                name = f"kill-{round_}"
                path = f"{JOBS.format(ns=ns)}/{name}"
                create_job(api, ns, job_manifest(name))
                kill_soon()
                _until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")

                api.merge_patch(path, {"spec": {"suspend": True}})
                kill_soon()
                _until(api, ns, name, "Suspended", lambda s: s.get("phase") == "Suspended")
                wait_until(
                    lambda job=name: suspended_in_place(api, ns, job) == [f"{job}-0"] or None,
                    "cluster suspended in place",
                )

                api.merge_patch(path, {"spec": {"suspend": False}})
                kill_soon()
                resumed = _until(api, ns, name, "Running after resume", lambda s: s.get("phase") == "Running")
                assert (resumed["restarts"], resumed["rayClusterName"]) == (0, f"{name}-0"), resumed

                head = head_pod(api, ns, f"{name}-0")["metadata"]["name"]
                faults.fail_pod(api, ns, head, exit_code=137)
                kill_soon()
                retried = _until(
                    api,
                    ns,
                    name,
                    "Running after one retry",
                    lambda s: s.get("restarts") == 1 and s.get("phase") == "Running",
                )
                assert retried["rayClusterName"] == f"{name}-1", retried
                wait_until(lambda job=name: _only(api, ns, job, [f"{job}-1"]), "only the new cluster")
                # The transitions are in the conditions (the truth); Events are best effort.
                conditions = {c["type"]: c for c in retried["conditions"]}
                assert (conditions["Suspended"]["status"], conditions["Suspended"]["reason"]) == (
                    "False",
                    "Resumed",
                ), conditions
                assert (conditions["Restarting"]["status"], conditions["Restarting"]["reason"]) == (
                    "False",
                    "Restarted",
                ), conditions
                reasons = {e["reason"] for e in events(api, ns, name)}
                for expected in ("CreatedRayCluster", "Suspended", "HeadPodLost"):
                    events_total += 1
                    events_missing += expected not in reasons

                api.delete(path)
                kill_soon()

                def children_gone(job: str = name) -> bool | None:
                    return (
                        not live_rayclusters(api, ns, job)
                        and not pods(api, ns, f"asyncgrpo.dev/job-name={job}")
                    ) or None

                wait_until(children_gone, f"{name}: children deleted", timeout=60)
        print(
            f"SIGKILL rounds {rounds}, kills {kills}, seed {seed}, cluster samples {sampler.samples}, "
            f"transition events missing {events_missing}/{events_total}"
        )
        doubled = {job: names for job, names in sampler.worst.items() if len(names) > 1}
        assert not doubled, f"two live RayClusters for one job (seed {seed}): {doubled}"
        assert kills == 5 * rounds
    finally:
        op.stop()
        print(op.tail(40))


def test_two_replicas_with_leader_election_exactly_one_acts(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,  # noqa: F811
    tmp_path: Path,
    progress: ProgressServer,
) -> None:
    """Every Event the operator posts names its reportingInstance: over several jobs, one instance
    posted them all, each job got exactly one CreatedRayCluster, and the standby created nothing."""
    api, ns = kube_api, namespace
    env = {"ASYNCGRPO_LEADER_ELECTION": "true", "ASYNCGRPO_LEADER_ELECTION_NAMESPACE": ns}
    replicas = [
        OperatorProcess(kubeconfig, ns, tmp_path / f"operator-{i}.log", env, progress=progress)
        for i in range(2)
    ]
    for replica in replicas:
        replica.start()
    try:
        names = [f"shared-{i}" for i in range(count("leader_jobs", 4))]
        for name in names:
            create_job(api, ns, job_manifest(name))
        for name in names:
            _until(api, ns, name, "Running", lambda s: s.get("phase") == "Running")
        instances: set[str] = set()
        for name in names:
            posted = [e for e in events(api, ns, name) if e.get("reportingComponent") == "asyncgrpo-operator"]
            instances |= {e.get("reportingInstance", "") for e in posted}
            created = [e for e in posted if e["reason"] == "CreatedRayCluster"]
            assert len(created) == 1, (name, created)
            assert live_rayclusters(api, ns, name) == [f"{name}-0"]
        assert len(instances) == 1, instances
        logs = [r.log.read_text(errors="replace").count("created RayCluster") for r in replicas]
        assert sorted(logs) == [0, len(names)], logs
    finally:
        for replica in replicas:
            replica.stop()
