"""While no webhook replica answers, the chart's ValidatingAdmissionPolicy still holds the invariants.

The chart installed by helm on the local control plane with no operator running: its webhook's URL
has no listener (what the API server meets when every replica is down), and
`webhook.failurePolicy: Ignore`, so that whatever the real kube-apiserver refuses here, the policy
refused. The rules' own verdicts (`validate_manifest`, what the webhook runs) are the reference.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from asyncgrpo_api.invariants import violations
from asyncgrpo_api.rules import validate_manifest
from tests.chart.helm import NO_HELM, find_helm
from tests.cluster.cluster import LocalCluster
from tests.cluster.samples import wait_until
from tests.webhook.cluster_harness import Installation
from tests.webhook.jobs import INVALID_COMBINATIONS, VALID_MODES, Case, job

pytestmark = pytest.mark.cluster

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"


@pytest.fixture(scope="module")
def chart(local_cluster: LocalCluster) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    installation = Installation(local_cluster, helm_bin, values={"webhook.failurePolicy": "Ignore"})
    installation.install()
    try:
        installation.write_mounted_secret()  # the CA to try the webhook's port with: nothing answers
        assert not installation.webhook_answers()
        probe = INVALID_COMBINATIONS[0].manifest

        def enforced() -> bool | None:  # the API server loads a new policy within a second or so
            outcome = installation.kubectl.apply(installation.jobs_ns, probe, "--dry-run=server")
            return True if denied_by_policy(installation) in outcome.stderr else None

        wait_until(enforced, "the policy enforced", timeout=30)
        yield installation
    finally:
        installation.uninstall()


def denied_by_policy(chart: Installation) -> str:
    return f"ValidatingAdmissionPolicy '{chart.fullname}' with binding '{chart.fullname}' denied request"


def test_the_api_server_type_checks_the_policy_against_the_crd_without_a_warning(chart: Installation) -> None:
    def checked() -> dict[str, Any] | None:
        policy = chart.api.get(f"{POLICIES}/{chart.fullname}")
        status = policy.get("status") or {}
        return status if status.get("observedGeneration") == policy["metadata"]["generation"] else None

    status = wait_until(checked, "the policy's typeChecking status", timeout=60)
    assert "typeChecking" in status, status  # checked against the CRD's schema ...
    assert not status["typeChecking"].get("expressionWarnings"), json.dumps(status, indent=1)  # ... cleanly


BROKEN = [
    *INVALID_COMBINATIONS,
    Case(
        "watchdog-at-an-integer-default-below-a-fractional-timeout",  # a number field given as an integer
        job("bad-watchdog", async_rl={"rolloutTimeoutSeconds": 700.5}),
        "spec.trainer.asyncRL.stallTimeoutSeconds",
    ),
    Case(
        "reward-function-not-importable",
        job("bad-function", trainer={"env": {"function": "rewards.score"}}),
        "spec.trainer.env.function",
    ),
]


@pytest.mark.parametrize("case", BROKEN, ids=lambda c: c.id)
def test_a_job_that_breaks_an_invariant_is_refused_in_the_webhooks_words(
    chart: Installation, case: Case
) -> None:
    outcome = chart.kubectl.apply(chart.jobs_ns, case.manifest)
    assert outcome.returncode != 0 and denied_by_policy(chart) in outcome.stderr, outcome.stderr
    report = validate_manifest(case.manifest)
    assert report.parsed is not None
    spec = report.parsed.spec.model_dump(mode="json", by_alias=True)
    findings = [f"{invariant.path}: {message}" for invariant, message in violations(spec)]
    assert set(findings) <= {str(f) for f in report.errors}, "the webhook's findings"
    assert any(f.startswith(f"{case.path}: ") for f in findings)
    name = case.manifest["metadata"]["name"]
    count = f"{len(findings)} error" + ("s" if len(findings) != 1 else "")
    assert f'AsyncGRPOJob "{name}" is invalid ({count}): {" | ".join(findings)}' in outcome.stderr


GOOD = [
    *VALID_MODES,
    Case("ppo-mini-batches", job("ppo-mini-batches", policy={"trainGlobalBatchSize": 16})),
    Case("integer-rollout-timeout", job("integer-timeout", async_rl={"rolloutTimeoutSeconds": 30})),
    Case("own-reward-function", job("own-reward", trainer={"env": {"function": "rewards.scoring:score"}})),
]


@pytest.mark.parametrize("case", GOOD, ids=lambda c: c.id)
def test_a_job_the_webhook_admits_is_admitted(chart: Installation, case: Case) -> None:
    assert validate_manifest(case.manifest).ok
    outcome = chart.kubectl.apply(chart.jobs_ns, case.manifest)
    assert outcome.returncode == 0, outcome.stderr


def test_an_update_is_refused_for_what_it_breaks_and_a_suspend_is_not(chart: Installation) -> None:
    name = "updated"
    assert chart.kubectl.apply(chart.jobs_ns, job(name)).returncode == 0
    sync_over_sampled = {"spec": {"trainer": {"asyncRL": {"maxStalenessVersions": 0, "overSampling": True}}}}
    patch = ("patch", "-n", chart.jobs_ns, "agj", name, "--type=merge", "-p")
    breaking = chart.kubectl(*patch, json.dumps(sync_over_sampled))
    assert breaking.returncode != 0 and denied_by_policy(chart) in breaking.stderr, breaking.stderr
    assert "spec.trainer.asyncRL.overSampling: must be false" in breaking.stderr
    suspend = chart.kubectl(*patch, '{"spec": {"suspend": true}}')
    assert suspend.returncode == 0, suspend.stderr
