"""The webhook's decision on each kind of admission request (the pure part, no server)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from asyncgrpo_api.rules import Finding
from asyncgrpo_operator.webhook import MAX_FINDINGS_SHOWN, denial_message, is_suspended, review
from tests.webhook.jobs import (
    INVALID_COMBINATIONS,
    SYNC_WITH_FORCE_IN_ORDER,
    VALID_MODES,
    WEBHOOK_ONLY,
    Case,
    job,
)


def running(manifest: dict[str, Any]) -> dict[str, Any]:
    """The object as stored for a job the operator has started."""
    stored = copy.deepcopy(manifest)
    stored["metadata"] |= {"uid": "1234", "resourceVersion": "7", "generation": 1}
    stored["status"] = {"phase": "Running", "rayClusterName": f"{manifest['metadata']['name']}-0"}
    return stored


@pytest.mark.parametrize("case", VALID_MODES, ids=lambda c: c.id)
def test_each_mode_of_the_knob_table_is_admitted(case: Case) -> None:
    assert review("CREATE", new=case.manifest, old=None).allowed


@pytest.mark.parametrize("case", INVALID_COMBINATIONS, ids=lambda c: c.id)
def test_each_invalid_combination_is_denied_naming_the_field(case: Case) -> None:
    decision = review("CREATE", new=case.manifest, old=None)
    assert not decision.allowed
    assert f"- {case.path}: " in decision.message


def test_denial_lists_every_error_not_just_the_first() -> None:
    manifest = job(
        "two-errors",
        async_rl={"maxStalenessVersions": 0, "overSampling": True, "minGroupsForStreamingTrain": 99},
    )
    decision = review("CREATE", new=manifest, old=None)
    assert not decision.allowed
    assert decision.message.startswith('AsyncGRPOJob "two-errors" is invalid (2 errors):')
    assert "- spec.trainer.asyncRL.overSampling: " in decision.message
    assert "- spec.trainer.asyncRL.minGroupsForStreamingTrain: " in decision.message


def test_schema_errors_are_denied_with_their_path() -> None:
    manifest = job("typo")
    manifest["spec"]["trainer"]["asyncRL"]["maxStalenesVersions"] = 1
    decision = review("CREATE", new=manifest, old=None)
    assert not decision.allowed
    assert (
        "spec.trainer.asyncRL.maxStalenesVersions: unknown field; did you mean 'maxStalenessVersions'?"
        in decision.message
    )


def test_sync_mode_with_force_in_order_is_admitted_with_a_warning() -> None:
    decision = review("CREATE", new=SYNC_WITH_FORCE_IN_ORDER, old=None)
    assert decision.allowed
    assert any(
        w.startswith("spec.trainer.asyncRL.forceInOrder: is ignored in sync mode") for w in decision.warnings
    )


def test_a_field_the_configuration_ignores_is_returned_as_an_admission_warning() -> None:
    manifest = copy.deepcopy(SYNC_WITH_FORCE_IN_ORDER)
    manifest["spec"]["trainer"].setdefault("loss", {})["klType"] = "k1"
    decision = review("CREATE", new=manifest, old=None)
    assert decision.allowed
    assert (
        "spec.trainer.loss.klType: is ignored while loss.referencePolicyKlPenalty is 0 (no KL term); set the "
        "penalty or remove it"
    ) in decision.warnings


def test_warnings_are_single_lines_because_http_headers_carry_them() -> None:
    decision = review("CREATE", new=SYNC_WITH_FORCE_IN_ORDER, old=None)
    assert decision.warnings
    assert all("\n" not in w for w in decision.warnings)


def test_changing_a_locked_field_of_a_running_job_is_denied() -> None:
    old = running(job("run"))
    new = copy.deepcopy(old)
    new["spec"]["trainer"]["grpo"]["numGenerationsPerPrompt"] = 8
    decision = review("UPDATE", new=new, old=old)
    assert not decision.allowed
    assert "- spec.trainer: cannot change once the job exists" in decision.message


def test_suspend_and_deadlines_may_change_while_running() -> None:
    old = running(job("run"))
    new = copy.deepcopy(old)
    new["spec"] |= {"suspend": True, "activeDeadlineSeconds": 3600, "backoffLimit": 5}
    assert review("UPDATE", new=new, old=old).allowed


def test_placement_is_locked_while_running_but_free_while_suspended() -> None:
    old = running(job("run"))
    new = copy.deepcopy(old)
    new["spec"]["cluster"] = {"policyWorkers": {"nodeSelector": {"pool": "b"}}}
    locked = review("UPDATE", new=new, old=old)
    assert not locked.allowed
    assert "spec.cluster: cannot change while the job runs; suspend the job first" in locked.message

    old["spec"]["suspend"] = True
    new["spec"]["suspend"] = False  # Kueue admits by un-suspending and placing in one update
    assert review("UPDATE", new=new, old=old).allowed


def test_a_job_not_yet_started_by_the_operator_counts_as_suspended() -> None:
    assert is_suspended(job("fresh"))
    assert is_suspended(job("fresh") | {"status": {"phase": "Pending", "reason": "Created"}})
    assert not is_suspended(running(job("run")))
    assert is_suspended(running(job("run")) | {"status": {"phase": "Suspended"}})


def test_a_pending_job_with_a_raycluster_counts_as_started() -> None:
    unschedulable = {"phase": "Pending", "reason": "Unschedulable", "rayClusterName": "run-0"}
    assert not is_suspended(job("run") | {"status": unschedulable})


def test_writing_out_a_default_is_not_a_change() -> None:
    old = running(job("run"))
    new = copy.deepcopy(old)
    new["spec"]["trainer"]["loss"] = {"ratioClipMin": 0.2}  # the default, now explicit
    assert review("UPDATE", new=new, old=old).allowed


def test_a_locked_change_and_an_invalid_value_are_reported_together() -> None:
    old = running(job("run"))
    new = copy.deepcopy(old)
    new["spec"]["trainer"]["asyncRL"] = {"maxStalenessVersions": 0, "overSampling": True}
    decision = review("UPDATE", new=new, old=old)
    assert "(2 errors)" in decision.message
    assert "spec.trainer: cannot change" in decision.message
    assert "spec.trainer.asyncRL.overSampling: must be false" in decision.message


def test_objects_being_deleted_are_never_blocked() -> None:
    old = running(job("run"))
    old["metadata"] |= {"deletionTimestamp": "2026-11-29T19:00:00Z", "finalizers": ["asyncgrpo.dev/cleanup"]}
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    new["spec"]["image"] = "changed:1"  # even a locked change: deletion must go through
    assert review("UPDATE", new=new, old=old).allowed


def test_metadata_only_updates_pass_even_when_the_stored_spec_no_longer_validates() -> None:
    # A job stored before a rule was tightened must still get finalizers and annotations patched.
    old = running(job("legacy", async_rl={"maxStalenessVersions": 0, "overSampling": True}))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"kopf.zalando.org/last-handled-configuration": "{}"}
    assert review("UPDATE", new=new, old=old).allowed


def test_a_job_stored_under_looser_rules_can_still_be_suspended() -> None:
    old = running(job("legacy", async_rl={"maxStalenessVersions": 0, "overSampling": True}))
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = True
    assert review("UPDATE", new=new, old=old).allowed


def test_an_update_that_adds_an_error_to_a_legacy_job_is_denied_for_the_new_error_only() -> None:
    old = running(job("legacy", async_rl={"maxStalenessVersions": 0, "overSampling": True}))
    new = copy.deepcopy(old)
    new["spec"]["backoffLimit"] = 1000
    decision = review("UPDATE", new=new, old=old)
    assert not decision.allowed
    assert "(1 error)" in decision.message and "spec.backoffLimit" in decision.message


def test_status_written_by_the_operator_is_not_judged() -> None:
    manifest = job("with-status") | {"status": {"phase": "Running", "kopf": {"progress": {}}}}
    assert review("CREATE", new=manifest, old=None).allowed


def test_delete_requests_are_always_allowed() -> None:
    assert review("DELETE", new=None, old=running(job("run"))).allowed


def test_a_huge_number_of_findings_is_capped_in_the_message() -> None:
    errors = [Finding(f"spec.env[{i}].name", "duplicate") for i in range(MAX_FINDINGS_SHOWN + 5)]
    message = denial_message({"metadata": {"name": "x"}}, errors)
    assert message.count("\n- spec.env") == MAX_FINDINGS_SHOWN
    assert "... and 5 more" in message


@pytest.mark.parametrize("case", WEBHOOK_ONLY, ids=lambda c: c.id)
def test_rules_beyond_cel_are_denied_naming_the_field(case: Case) -> None:
    decision = review("CREATE", new=case.manifest, old=None)
    assert not decision.allowed
    assert f"- {case.path}: " in decision.message


def test_the_admission_guide_lists_every_field_that_may_change() -> None:
    from pathlib import Path  # noqa: PLC0415

    from asyncgrpo_api.rules import ALWAYS_MUTABLE, MUTABLE_WHILE_SUSPENDED  # noqa: PLC0415

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "admission.md").read_text()
    missing = [f for f in sorted(ALWAYS_MUTABLE | MUTABLE_WHILE_SUSPENDED) if f"`spec.{f}`" not in guide]
    assert not missing, f"docs/guides/admission.md does not list {missing}"


def queued(manifest: dict[str, Any], *, admitted: bool) -> dict[str, Any]:
    """A job Kueue manages as stored: suspended and Queued while it waits, running once admitted."""
    stored = running(manifest)
    stored["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    stored["spec"]["suspend"] = not admitted
    queued_cond = {
        "type": "Queued",
        "status": "False" if admitted else "True",
        "reason": "Admitted" if admitted else "Pending",
    }
    stored["status"] = {"phase": "Running" if admitted else "Queued", "conditions": [queued_cond]}
    return stored


def test_the_queue_label_is_locked_while_kueue_has_admitted_the_job() -> None:
    old = queued(job("run"), admitted=True)
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-b"  # a metadata-only update
    decision = review("UPDATE", new=new, old=old)
    assert not decision.allowed
    assert "metadata.labels.kueue.x-k8s.io/queue-name: cannot change while Kueue has admitted the job" in (
        decision.message
    )


def test_the_queue_label_may_change_while_the_job_waits_in_its_queue() -> None:
    old = queued(job("run"), admitted=False)
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-b"
    assert review("UPDATE", new=new, old=old).allowed


def test_a_running_job_cannot_be_handed_to_kueue_by_adding_the_label() -> None:
    old = running(job("run"))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    decision = review("UPDATE", new=new, old=old)
    assert not decision.allowed and "cannot change while the job runs" in decision.message


def test_a_label_only_change_is_validated_like_the_spec() -> None:
    old = queued(job("run"), admitted=False)
    old["spec"]["scheduler"] = {"name": "kueue", "queueName": "team-a"}
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-b"  # disagrees with the spec now
    decision = review("UPDATE", new=new, old=old)
    assert not decision.allowed
    assert "team-b" in decision.message and "scheduler.queueName" in decision.message


# --- MultiKueue: spec.managedBy ------------------------------------------------------------------

MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def dispatched(name: str = "run") -> dict[str, Any]:
    """A job for MultiKueue to dispatch: queued in Kueue, managedBy MultiKueue."""
    manifest = job(name, managedBy=MULTIKUEUE)
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    return manifest


def test_a_queued_job_may_be_handed_to_multikueue() -> None:
    assert review("CREATE", new=dispatched(), old=None).allowed


def test_managed_by_accepts_only_multikueue() -> None:
    manifest = dispatched()
    manifest["spec"]["managedBy"] = "someone-else"
    decision = review("CREATE", new=manifest, old=None)
    assert not decision.allowed
    assert "- spec.managedBy: " in decision.message and MULTIKUEUE in decision.message


def test_managed_by_multikueue_without_a_kueue_queue_is_denied_with_the_fix() -> None:
    manifest = job("run", managedBy=MULTIKUEUE)
    decision = review("CREATE", new=manifest, old=None)
    assert not decision.allowed
    assert "spec.managedBy: is kueue.x-k8s.io/multikueue, but the job is not queued in Kueue" in (
        decision.message
    )
    assert "kueue.x-k8s.io/queue-name" in decision.message


def test_managed_by_cannot_be_added_removed_or_changed_once_the_job_exists() -> None:
    plain = queued(job("run"), admitted=False)
    handed = copy.deepcopy(plain)
    handed["spec"]["managedBy"] = MULTIKUEUE
    for old, new in ((plain, handed), (handed, plain)):
        decision = review("UPDATE", new=new, old=old)
        assert not decision.allowed
        assert "spec.managedBy: cannot change once the job exists" in decision.message


def test_the_worker_copy_of_a_dispatched_job_is_admitted() -> None:
    copy_ = job("run")
    copy_["metadata"]["labels"] = {
        "kueue.x-k8s.io/queue-name": "team-a",
        "kueue.x-k8s.io/prebuilt-workload-name": "asyncgrpojob-run-1a2b3",
        "kueue.x-k8s.io/multikueue-origin": "manager",
    }
    assert review("CREATE", new=copy_, old=None).allowed


def test_a_prebuilt_workload_label_beside_managed_by_is_denied() -> None:
    manifest = dispatched()
    manifest["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] = "asyncgrpojob-run-1a2b3"
    decision = review("CREATE", new=manifest, old=None)
    assert not decision.allowed
    assert "metadata.labels.kueue.x-k8s.io/prebuilt-workload-name: " in decision.message
