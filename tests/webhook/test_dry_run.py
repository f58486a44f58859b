"""The webhook's server-side dry-run of the RayCluster: what is dry-run, what an answer means, and
that the webhook fails open when the API server cannot judge (the cluster tests in
tests/e2e/test_admission_dry_run.py show the real API server's refusals)."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_operator import dryrun, k8s, webhook
from asyncgrpo_operator.metrics import Metrics
from tests.webhook.jobs import job

POLICY = (
    "rayclusters.ray.io \"j-0\" is forbidden: ValidatingAdmissionPolicy 'no-host-network' with binding "
    "'no-host-network' denied request: RayClusters may not use hostNetwork"
)


def stored(manifest: dict[str, Any], phase: str = "Suspended") -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out["metadata"] |= {"namespace": "team", "uid": "uid-1", "resourceVersion": "7"}
    out["status"] = {"phase": phase}
    return out


def parsed(manifest: dict[str, Any]) -> AsyncGRPOJob:
    return AsyncGRPOJob.model_validate({k: v for k, v in manifest.items() if k != "status"})


def test_every_create_is_dry_run_as_the_attempt_zero_cluster_owned_by_the_job() -> None:
    cluster = dryrun.target(parsed(stored(job("j"))), None, "uid-1")
    assert cluster is not None
    assert cluster["metadata"]["name"] == "j-0" and cluster["metadata"]["namespace"] == "team"
    assert cluster["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_a_job_being_created_is_not_its_dry_run_clusters_controller() -> None:
    """Kueue's RayCluster webhook looks the controller up: a job not created yet would be a 404."""
    cluster = dryrun.target(parsed(job("j")), None, "uid-1")  # a create: nothing stored yet
    assert cluster is not None
    (ref,) = cluster["metadata"]["ownerReferences"]
    assert ref["uid"] == "uid-1" and ref["controller"] is False
    old = stored(job("j"))
    moved = copy.deepcopy(old)
    moved["spec"]["cluster"] = {"head": {"nodeSelector": {"pool": "b"}}}
    update = dryrun.target(parsed(moved), parsed(old), "uid-1")  # the job exists: its controller
    assert update is not None and update["metadata"]["ownerReferences"][0]["controller"] is True


def test_an_update_is_dry_run_only_when_it_changes_the_cluster() -> None:
    old = stored(job("j"))
    deadline = copy.deepcopy(old)
    deadline["spec"]["activeDeadlineSeconds"] = 600
    assert dryrun.target(parsed(deadline), parsed(old), "uid-1") is None
    moved = copy.deepcopy(old)
    moved["spec"]["cluster"] = {"head": {"nodeSelector": {"pool": "b"}}}
    target = dryrun.target(parsed(moved), parsed(old), "uid-1")
    assert target is not None
    assert target["spec"]["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {"pool": "b"}


@pytest.mark.parametrize(
    ("status", "message", "result"),
    [
        (422, 'RayCluster.ray.io "j-0" is invalid: spec.headGroupSpec...: Invalid value', "refused"),
        (400, "bad request", "refused"),
        (403, POLICY, "refused"),
        (403, 'admission webhook "kueue.x-k8s.io" denied the request: queue missing', "refused"),
        (
            403,
            'rayclusters.ray.io "j-0" is forbidden: exceeded quota: rc, requested: count/rayclusters',
            "skipped",
        ),
        (403, 'rayclusters.ray.io is forbidden: User "system:serviceaccount:x:op" cannot create', "skipped"),
        (404, "the server could not find the requested resource", "skipped"),
        (409, 'rayclusters.ray.io "j-0" already exists', "unchanged"),
        (500, "Internal error occurred: failed calling webhook", "skipped"),
        (0, "no answer within 2 s", "skipped"),
    ],
)
def test_only_a_verdict_about_the_object_refuses_the_job(status: int, message: str, result: str) -> None:
    got, finding, warning = dryrun.judge(k8s.ApiError(status, message), "j-0")
    assert got == result
    if result == "refused":
        assert finding is not None and message in finding.message and warning is None
    else:
        assert finding is None
        assert (warning is not None) == (result == "skipped")


class FakeApi:
    """Answers the dry-run as told: an ApiError to raise, or a delay to hang for."""

    def __init__(self, error: k8s.ApiError | None = None, delay: float = 0.0) -> None:
        self.error, self.delay, self.calls = error, delay, 0

    async def dry_run_raycluster(self, manifest: dict[str, Any]) -> None:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error


def fake_runtime(api: FakeApi) -> SimpleNamespace:
    return SimpleNamespace(api=api, metrics=Metrics(), dry_runs_in_flight=0)


def judged(api: FakeApi, manifest: dict[str, Any]) -> webhook.Decision:
    rt = fake_runtime(api)
    allowed = webhook.review("CREATE", new=manifest, old=None)
    assert allowed.allowed
    return asyncio.run(webhook._with_dry_run(rt, "CREATE", manifest, None, allowed))  # type: ignore[arg-type]


def test_a_refusal_denies_the_job_with_the_api_servers_message() -> None:
    decision = judged(FakeApi(k8s.ApiError(403, POLICY)), stored(job("j")))
    assert not decision.allowed
    assert decision.message.startswith('AsyncGRPOJob "j" is invalid (1 error):')
    assert "- spec: the API server refused the RayCluster j-0 this job would create" in decision.message
    assert "RayClusters may not use hostNetwork" in decision.message


def test_an_api_server_that_does_not_answer_in_time_admits_the_job_with_a_warning() -> None:
    api = FakeApi(delay=dryrun.DRY_RUN_TIMEOUT_SECONDS + 1)
    decision = judged(api, stored(job("j")))
    assert decision.allowed and api.calls == 1
    assert any("could not be checked" in w and "ClusterCreateFailed" in w for w in decision.warnings)


def test_an_accepted_dry_run_keeps_the_rules_warnings() -> None:
    manifest = stored(job("j"))
    decision = judged(FakeApi(), manifest)
    assert decision.allowed
    assert decision.warnings == webhook.review("CREATE", new=manifest, old=None).warnings


def test_a_burst_of_creates_is_shed_beyond_the_dry_runs_in_flight_limit() -> None:
    """A sweep applied at once must not double the API server's work at its busiest: beyond
    MAX_IN_FLIGHT concurrent dry-runs, jobs are admitted at once without one, with a warning."""
    api = FakeApi(delay=0.3)
    rt = fake_runtime(api)
    burst = dryrun.MAX_IN_FLIGHT + 2

    async def admit_all() -> list[webhook.Decision]:
        manifests = [stored(job(f"j{i}")) for i in range(burst)]
        return await asyncio.gather(
            *(
                webhook._with_dry_run(rt, "CREATE", m, None, webhook.review("CREATE", new=m, old=None))  # type: ignore[arg-type]
                for m in manifests
            )
        )

    decisions = asyncio.run(admit_all())
    assert all(d.allowed for d in decisions)
    assert api.calls == dryrun.MAX_IN_FLIGHT
    shed = [d for d in decisions if dryrun.SHED_WARNING in d.warnings]
    assert len(shed) == burst - dryrun.MAX_IN_FLIGHT
    assert rt.dry_runs_in_flight == 0
    assert asyncio.run(webhook._with_dry_run(rt, "CREATE", stored(job("later")), None, webhook.ALLOW)).allowed  # type: ignore[arg-type]
    assert api.calls == dryrun.MAX_IN_FLIGHT + 1  # the limit is on concurrency, not a budget
