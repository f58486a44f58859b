"""Jobs that name no Kueue queue (issue 47, item 11): Kueue's manageJobsWithoutQueueName and
LocalQueue defaulting, which Kueue applies to its own kinds only, applied to AsyncGRPOJobs at
admission (the pure decision; tests/e2e/test_kueue.py goes through the API server and real Kueue).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncgrpo_operator import kueue_admission
from asyncgrpo_operator.kueue_admission import Policy, needs_default_queue, review
from tests.webhook.jobs import job

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED = Policy(manage_jobs_without_queue_name=True)
DEFAULTING = Policy(local_queue_defaulting=True)


def unqueued(**scheduler: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(job())
    manifest["metadata"]["namespace"] = "team-a"
    if scheduler:
        manifest["spec"]["scheduler"] = scheduler
    return manifest


def queued(queue: str = "team-a-gpus") -> dict[str, Any]:
    manifest = unqueued()
    manifest["metadata"]["labels"] = {QUEUE_LABEL: queue}
    return manifest


def test_where_kueue_manages_every_job_one_without_a_queue_is_refused_naming_the_label_and_the_fix() -> None:
    assert needs_default_queue("CREATE", unqueued(), MANAGED)
    verdict = review("CREATE", unqueued(), None, MANAGED, default_queue_exists=False)
    assert verdict.refusal is not None and verdict.queue is None
    assert verdict.refusal.path == f"metadata.labels.{QUEUE_LABEL}"
    message = verdict.refusal.message
    assert "manageJobsWithoutQueueName" in message and "namespace team-a" in message
    assert "kubectl get localqueues -n team-a" in message and "LocalQueue named default" in message


@pytest.mark.parametrize("policy", [MANAGED, DEFAULTING], ids=["managed", "defaulting"])
def test_a_job_without_a_queue_goes_to_the_namespaces_local_queue_default(policy: Policy) -> None:
    verdict = review("CREATE", unqueued(), None, policy, default_queue_exists=True)
    assert (verdict.queue, verdict.refusal) == ("default", None)
    assert verdict.warning is not None and "LocalQueue default" in verdict.warning


def test_without_manage_jobs_without_queue_name_a_job_without_a_queue_runs_as_it_is() -> None:
    assert review("CREATE", unqueued(), None, DEFAULTING, default_queue_exists=False) == kueue_admission.ADMIT
    assert not needs_default_queue("CREATE", unqueued(), Policy())


def test_a_job_that_names_its_queue_is_left_alone_and_costs_no_read() -> None:
    aliased = unqueued(name="kueue", queueName="team-a-gpus")  # spec.scheduler.queueName's alias
    for named in (queued(), aliased):
        assert not needs_default_queue("CREATE", named, MANAGED)
        assert review("CREATE", named, None, MANAGED) == kueue_admission.ADMIT


def test_a_job_for_another_gang_scheduler_is_refused_only_where_kueue_manages_every_job() -> None:
    kai = unqueued(name="kai", queueName="research")
    assert not needs_default_queue("CREATE", kai, MANAGED)
    refused = review("CREATE", kai, None, MANAGED).refusal
    assert refused is not None and refused.path == "spec.scheduler.name"
    assert "would hold this one's RayCluster" in refused.message
    assert review("CREATE", kai, None, DEFAULTING) == kueue_admission.ADMIT


def test_where_kueue_manages_every_job_the_queue_label_cannot_be_removed() -> None:
    refused = review("UPDATE", unqueued(), queued(), MANAGED).refusal
    assert refused is not None and "cannot be removed" in refused.message
    assert review("UPDATE", unqueued(), queued(), DEFAULTING) == kueue_admission.ADMIT
    # a job stored without a queue before the setting is not judged again on update
    assert review("UPDATE", unqueued(), unqueued(), MANAGED) == kueue_admission.ADMIT


def test_a_local_queue_that_cannot_be_read_refuses_the_job() -> None:
    refused = kueue_admission.unreadable_queue("team-a", "HTTP 403: forbidden").refusal
    assert refused is not None and "try again, or set the label" in refused.message


def test_the_policy_is_read_from_the_charts_environment() -> None:
    assert Policy.from_env({kueue_admission.MANAGE_ENV: "true"}) == MANAGED
    assert Policy.from_env({kueue_admission.DEFAULTING_ENV: "true"}) == DEFAULTING
    assert Policy.from_env({}) == Policy()
