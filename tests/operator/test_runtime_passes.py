"""A pass over a job that names an AsyncGRPORuntime reads the runtime as it is now.

The runtime's values go into the RayCluster the pass creates; a runtime deleted or changed after
the job was admitted stops the job from starting (Failed, InvalidSpec, naming the runtime), and a
started job it now refuses keeps its running attempt but gets no new one (RuntimeForbids).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp

from asyncgrpo_api.rules import Finding, validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJobStatus
from asyncgrpo_operator import admitted, progress
from asyncgrpo_operator.decision import RUNTIME_FORBIDS
from asyncgrpo_operator.reconciler import Reconciler
from tests.api.test_runtime_rules import IMAGE, RUNTIME
from tests.operator.test_reconcile_round_trips import RefusingApi, cached, new_job


class RuntimeApi(RefusingApi):
    """Serves one AsyncGRPORuntime (or none) and accepts the RayCluster, keeping its manifest."""

    def __init__(self, job: dict[str, Any], runtime: dict[str, Any] | None) -> None:
        super().__init__(job)
        self.runtime = runtime
        self.created: list[dict[str, Any]] = []

    async def get_runtime(self, name: str) -> dict[str, Any] | None:
        found = self.runtime if self.runtime and self.runtime["metadata"]["name"] == name else None
        return await self._call("get_runtime", copy.deepcopy(found))  # type: ignore[no-any-return]

    async def create_raycluster(self, manifest: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        self.created.append(manifest)
        return await self._call("create_raycluster", manifest)  # type: ignore[no-any-return]


def under_restricted() -> dict[str, Any]:
    body = new_job()
    body["spec"] |= {"image": IMAGE, "runtimeRef": {"name": "restricted"}}
    return body


def one_pass(runtime: dict[str, Any] | None) -> RuntimeApi:
    async def scenario() -> RuntimeApi:
        api = RuntimeApi(under_restricted(), runtime)
        async with aiohttp.ClientSession() as session:
            reconciler = Reconciler(api, progress.Poller(session), cached(api.job))  # type: ignore[arg-type]
            await reconciler.reconcile(("team", "demo"))
        return api

    return asyncio.run(scenario())


def test_the_raycluster_a_pass_creates_carries_what_the_runtime_fixes() -> None:
    api = one_pass(RUNTIME)
    (cluster,) = api.created
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "asyncgrpo-trainer"
    assert head["securityContext"]["runAsUser"] == 1000
    assert api.calls[0][0] == "get_runtime", "the runtime is read before anything is written"


def test_a_job_whose_runtime_was_deleted_after_admission_is_never_started() -> None:
    api = one_pass(None)
    assert api.created == []
    status = api.statuses[-1]
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert "AsyncGRPORuntime restricted does not exist" in status["message"]


def test_a_job_its_runtime_now_refuses_is_not_started() -> None:
    stricter = copy.deepcopy(RUNTIME)
    stricter["spec"]["images"] = ["registry.example.com/approved/trainer:1"]
    api = one_pass(stricter)
    assert api.created == []
    assert "spec.image: " in api.statuses[-1]["message"]
    assert "refuses the job as it is now" in api.statuses[-1]["message"]


def test_a_started_job_its_runtime_now_refuses_is_judged_like_a_spec_that_was_never_admitted() -> None:
    """plan.plan_invalid then keeps the running attempt (SpecValid False) and starts no new one."""
    report = validate_manifest(under_restricted())
    started = AsyncGRPOJobStatus.model_validate({"phase": "Running", "startTime": "2026-12-01T00:00:00Z"})
    verdict = admitted.judge(report, started, generation=1)
    assert verdict.job is not None
    refused = admitted.under_runtime(verdict, [Finding("spec.image", "not allowed")])
    assert refused.job is None and refused.reason == RUNTIME_FORBIDS
    assert "AsyncGRPORuntime restricted" in refused.refusal and "spec.image: not allowed" in refused.refusal
    assert admitted.under_runtime(verdict, []) is verdict
