"""Which spec a pass runs a job by when the rules refuse its stored spec (admitted.py): a job
admitted under older rules keeps running; a change written past the webhook is refused."""

from __future__ import annotations

from datetime import UTC, datetime

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJobStatus
from asyncgrpo_operator import admitted, plan
from tests.operator.builders import OWNER, job, observe
from tests.webhook.jobs import job as manifest

STARTED = AsyncGRPOJobStatus(start_time=datetime(2026, 1, 1, tzinfo=UTC), admitted_generation=3)


OVER_LIMIT = manifest(cluster={"head": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}})
"""Parses, but breaks a cross-field rule (a request above its limit)."""
UNPARSEABLE = manifest(noSuchField=1)
"""Fails the schema: nothing left to run by."""


def test_a_valid_spec_is_run_by_as_it_is() -> None:
    verdict = admitted.judge(validate_manifest(manifest()), STARTED, generation=4)
    assert verdict.job is not None and verdict.spec_errors == ()


def test_a_started_job_at_its_admitted_generation_keeps_running_with_the_rules_it_breaks() -> None:
    verdict = admitted.judge(validate_manifest(OVER_LIMIT), STARTED, generation=3)
    assert verdict.job is not None
    assert any("spec.cluster.head.resources.requests.cpu" in e for e in verdict.spec_errors)


def test_a_change_written_past_the_webhook_is_refused_naming_both_generations() -> None:
    verdict = admitted.judge(validate_manifest(OVER_LIMIT), STARTED, generation=4)
    assert verdict.job is None and verdict.reason == "SpecChangeNotAdmitted"
    assert "generation 4 was never admitted" in verdict.refusal
    assert "last admitted generation is 3" in verdict.refusal
    assert "spec.cluster.head.resources.requests.cpu" in verdict.refusal


def test_a_job_from_an_operator_that_kept_no_record_is_given_the_benefit_of_the_doubt() -> None:
    legacy = STARTED.model_copy(update={"admitted_generation": None})
    verdict = admitted.judge(validate_manifest(OVER_LIMIT), legacy, generation=7)
    assert verdict.job is not None and verdict.spec_errors


def test_a_job_that_never_started_is_refused() -> None:
    verdict = admitted.judge(validate_manifest(OVER_LIMIT), None, generation=1)
    assert verdict.job is None and "requests.cpu" in verdict.refusal


def test_a_started_spec_that_no_longer_parses_is_not_run_by_but_keeps_the_older_rules_reason() -> None:
    verdict = admitted.judge(validate_manifest(UNPARSEABLE), STARTED, generation=3)
    assert verdict.job is None and verdict.reason == "AdmittedUnderOlderRules"
    assert "no longer parses" in verdict.refusal and "noSuchField" in verdict.refusal


def test_each_pass_over_a_valid_spec_records_its_generation_as_admitted() -> None:
    first = plan.plan(job(), None, observe(0, configmap=False), generation=5, owner=OWNER)
    assert first.status.admitted_generation == 5
    kept = plan.plan(
        job(), first.status, observe(1), generation=6, owner=OWNER, spec_errors=("spec.x: tightened",)
    )
    assert kept.status.admitted_generation == 5, "a spec the rules refuse is not recorded as admitted"
