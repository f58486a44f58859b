"""The webhook's check of a job against the AsyncGRPORuntime it names (the pure part).

The webhook reads the runtime from the API server and hands it here; tests/e2e/test_webhook.py
checks the same through kubectl against a real API server.
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest

from asyncgrpo_operator import k8s, webhook
from asyncgrpo_operator.webhook import review, runtime_review, unreadable_runtime
from tests.api.test_runtime_rules import IMAGE, RUNTIME, runtime
from tests.webhook.jobs import job
from tests.webhook.test_review import running


def under_restricted(**spec: Any) -> dict[str, Any]:
    return job("confined", image=IMAGE, runtimeRef={"name": "restricted"}, **spec)


def test_a_job_within_its_runtime_is_admitted_and_rendered_with_it() -> None:
    denial, admin = runtime_review("CREATE", under_restricted(), None, RUNTIME)
    assert denial is None
    assert admin is not None and admin.metadata.name == "restricted"


def test_a_job_that_names_no_runtime_is_left_to_the_rules() -> None:
    assert runtime_review("CREATE", job("free"), None, None) == (None, None)


def test_a_job_the_runtime_does_not_allow_is_denied_with_the_field_runtime_and_fix() -> None:
    denial, _ = runtime_review("CREATE", under_restricted(network={"hostNetwork": True}), None, RUNTIME)
    assert denial is not None and not denial.allowed
    assert denial.message.startswith('AsyncGRPOJob "confined" is invalid (1 error):')
    assert "- spec.network.hostNetwork: AsyncGRPORuntime restricted does not allow" in denial.message
    assert "kubectl get asyncgrporuntimes" in denial.message


def test_a_job_naming_a_runtime_that_does_not_exist_is_denied_by_name() -> None:
    denial, admin = runtime_review("CREATE", under_restricted(), None, None)
    assert admin is None and denial is not None
    assert "- spec.runtimeRef.name: AsyncGRPORuntime restricted does not exist" in denial.message


def test_an_update_is_denied_only_for_what_it_adds_to_what_the_runtime_refuses() -> None:
    """A job admitted before its runtime was tightened can still be suspended (Kueue preempts that
    way); an update that adds a refused field cannot be made."""
    tightened = runtime(images=["registry.example.com/approved:1"])
    stored = running(under_restricted())
    suspended = copy.deepcopy(stored)
    suspended["spec"]["suspend"] = True
    assert runtime_review("UPDATE", suspended, stored, tightened)[0] is None
    widened = copy.deepcopy(stored)
    widened["spec"]["network"] = {"hostNetwork": True}
    denial, _ = runtime_review("UPDATE", widened, stored, tightened)
    assert denial is not None and [f.path for f in denial.errors] == ["spec.network.hostNetwork"]


def test_a_runtime_that_cannot_be_read_denies_the_job_rather_than_admit_it_unchecked() -> None:
    denial = unreadable_runtime(under_restricted(), "restricted", "HTTP 403: forbidden")
    assert not denial.allowed
    assert "- spec.runtimeRef.name: AsyncGRPORuntime restricted could not be read (HTTP 403" in denial.message


def test_a_job_cannot_move_to_another_runtime_once_it_exists() -> None:
    stored = running(under_restricted())
    moved = copy.deepcopy(stored)
    moved["spec"]["runtimeRef"] = {"name": "open"}
    decision = review("UPDATE", new=moved, old=stored)
    assert not decision.allowed
    assert "- spec.runtimeRef: cannot change once the job exists" in decision.message


class RuntimeApi:
    """Answers the runtime read with the runtime, an ApiError, or not before `delay` seconds."""

    def __init__(
        self, found: dict[str, Any] | None, error: k8s.ApiError | None = None, delay: float = 0
    ) -> None:
        self.found, self.error, self.delay = found, error, delay

    async def get_runtime(self, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.found


def within(api: RuntimeApi | None) -> tuple[webhook.Decision, Any]:
    rt = SimpleNamespace(api=api) if api is not None else None
    manifest = under_restricted()
    return asyncio.run(webhook._within_runtime(rt, "CREATE", manifest, None, webhook.ALLOW))  # type: ignore[arg-type]


def test_the_webhook_reads_the_named_runtime_and_hands_it_on_for_the_dry_run() -> None:
    decision, admin = within(RuntimeApi(RUNTIME))
    assert decision.allowed and admin is not None and admin.spec.service_account_name == "asyncgrpo-trainer"


def test_a_runtime_read_that_fails_or_hangs_denies_the_job_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decision, _ = within(RuntimeApi(None, k8s.ApiError(403, "asyncgrporuntimes is forbidden")))
    assert (
        not decision.allowed
        and "could not be read (HTTP 403: asyncgrporuntimes is forbidden)" in decision.message
    )
    monkeypatch.setattr(webhook, "RUNTIME_READ_TIMEOUT_SECONDS", 0.05)
    decision, _ = within(RuntimeApi(RUNTIME, delay=1.0))
    assert not decision.allowed and "no answer within 0.05 s" in decision.message
    decision, _ = within(None)
    assert not decision.allowed and "the operator is still starting" in decision.message
