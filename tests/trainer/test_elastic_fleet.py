"""An elastic generation pool, the trainer's side, on the real local Ray: a generation node the
cluster gains mid-run gets an engine that loads the current weights and then serves groups; a
drained pod's engine takes no new group, finishes those it holds, leaves, and /progress lists the
pod in drainedWorkers; every step trains on exactly its samples, none lost or trained twice."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray._private.node import Node
from ray._private.parameter import RayParams

from asyncgrpo_api.v1alpha1.placement import GENERATION_POOL, GENERATION_POOL_LABEL, WORKER_POD_LABEL
from asyncgrpo_trainer import driver, progress
from tests.trainer import jobs
from tests.trainer.reward_functions import HOLD

POD = "elastic-generation-1"
STEPS = 24
DEADLINE_SECONDS = 120.0


@pytest.fixture(scope="module")
def generation_pod(ray_address: str) -> Iterator[str]:
    """A second Ray node, labelled as the operator labels a generation worker pod's node (what a
    scale-up adds): one CPU, so it hosts one engine."""
    params = RayParams(
        gcs_address=ray_address,
        num_cpus=1,
        num_gpus=0,
        object_store_memory=80 << 20,
        min_worker_port=0,
        max_worker_port=0,
        labels={GENERATION_POOL_LABEL: GENERATION_POOL, WORKER_POD_LABEL: POD},
    )
    node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    yield POD
    node.kill_all_processes(check_alive=False, allow_graceful=True)


def elastic_job(tmp_path: Path, name: str, steps: int) -> dict[str, Any]:
    """One generation pod that may grow to two; scoring waits while the test holds it
    (`reward_functions.HOLD`), so a step cannot end before the test has seen what it waits for."""
    job = jobs.manifest("async-in-order", steps=steps, checkpoint_dir=str(tmp_path), name=name)
    job["spec"]["cluster"]["generationWorkers"].update(replicas=1, minReplicas=1, maxReplicas=2)
    job["spec"]["trainer"]["env"] = {
        "function": "tests.trainer.reward_functions:exact_unless_held",
        "timeoutSeconds": 300,
    }
    return job


def start_held(job: dict[str, Any], server: progress.ProgressServer, records: Records) -> dict[str, Any]:
    """Start the run with its first step held until the gained node's engine is up."""
    HOLD.touch()
    try:
        out = run_in_thread(job, server, records)
        wait_for("the gained node's engine is up", lambda: server.snapshot().joining_workers == [POD])
    finally:
        HOLD.unlink(missing_ok=True)
    return out


class Records:
    """The step records as the driver relays them (a `progress.Reporter`)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def update(self, progress: dict[str, Any], records: list[dict[str, Any]]) -> None:
        self.steps += [r for r in records if "reward_mean" in r]

    def end(self) -> None:
        return

    def summary(self, summary: dict[str, Any]) -> None:
        return


def run_in_thread(job: dict[str, Any], server: progress.ProgressServer, records: Records) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["summary"] = driver.execute(job, server, reporters=[records])
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def finished(out: dict[str, Any]) -> dict[str, Any]:
    out["thread"].join(DEADLINE_SECONDS)
    if "error" in out:
        raise out["error"]
    summary: dict[str, Any] = out["summary"]
    return summary


def wait_for(what: str, condition: Any) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_SECONDS:g}s: {what}"
        time.sleep(0.2)


def assert_nothing_lost_or_trained_twice(summary: dict[str, Any], steps: int) -> None:
    c = summary["counters"]
    groups = steps * jobs.P
    assert summary["steps"] == steps
    assert c["samples_trained"] == groups * jobs.N
    assert c["groups_dispatched"] == c["groups_committed"] == groups
    assert c.get("groups_aborted", 0) == 0


@pytest.mark.trainer
def test_an_engine_joins_on_a_gained_node_serves_groups_and_leaves_when_its_pod_is_drained(
    ray_address: str, generation_pod: str, tmp_path: Path
) -> None:
    """One run (a run's start costs most of the time): the pool grows from 1 engine to 2 mid-run,
    then the gained pod is drained mid-run."""
    records = Records()
    server = progress.ProgressServer(0, host="127.0.0.1", token="the-jobs-token")
    url = f"http://127.0.0.1:{server.port}/drain"
    try:
        out = start_held(elastic_job(tmp_path, "elastic", STEPS), server, records)
        wait_for(
            "the gained engine serves", lambda: any(r["generation_requests"].get("1") for r in records.steps)
        )
        HOLD.touch()  # no step ends until the drain is asked for: the run cannot end before it
        try:
            answer = post(url, {"worker": generation_pod}, "the-jobs-token")
        finally:
            HOLD.unlink(missing_ok=True)
        assert answer["drainedWorkers"] == []
        wait_for("the pod is drained", lambda: server.snapshot().drained_workers == [generation_pod])
        at_drain = len(records.steps)
        summary = finished(out)
    finally:
        server.close()
    steps = records.steps
    # Growing: the engine joins at a refit, the first after it is up; none before the first step's.
    assert list(steps[0]["generation_requests"]) == ["0"]
    joined = next(i for i, r in enumerate(steps) if len(r["generation_idle_shares"]) == 2)
    assert steps[joined]["generation_requests"].get("1", 0) < steps[at_drain - 1]["generation_requests"]["1"]
    # The joined engine was refit like the first: every group's stamp is within the bound.
    assert all(r["max_oldest_staleness"] <= 1 for r in steps)
    # Draining: once the pod is reported drained its engine is gone and gets no group.
    after = steps[at_drain:]
    assert after, "the run ended as the pod was drained: nothing shows the engine gone"
    assert all(len(r["generation_idle_shares"]) == 1 for r in after)
    served = {r["generation_requests"]["1"] for r in after}
    assert len(served) == 1, f"the drained engine got groups after it left: {served}"
    assert sum(steps[-1]["generation_requests"].values()) == STEPS * jobs.P
    assert_nothing_lost_or_trained_twice(summary, STEPS)


def post(url: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def test_only_the_jobs_token_may_ask_the_driver_to_drain_a_worker() -> None:
    server = progress.ProgressServer(0, host="127.0.0.1", token="the-jobs-token")
    try:
        url = f"http://127.0.0.1:{server.port}/drain"
        for authorization, status in ((None, 401), ("Bearer another-token", 403)):
            request = urllib.request.Request(url, data=b'{"worker": "p"}', method="POST")
            if authorization:
                request.add_header("Authorization", authorization)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == status
        assert server.drain_requests(0) == []
        bad = urllib.request.Request(
            url, data=b'{"pod": 1}', method="POST", headers={"Authorization": "Bearer the-jobs-token"}
        )
        with pytest.raises(urllib.error.HTTPError) as rejected:
            urllib.request.urlopen(bad, timeout=30)
        assert rejected.value.code == 400 and b"worker" in rejected.value.read()
    finally:
        server.close()
