"""The mutating admission webhook that puts a job that names no Kueue queue where Kueue would.

Kueue's own job kinds get two things from Kueue's webhook (jobframework's BaseWebhook.Default,
Kueue v0.17.0) that an AsyncGRPOJob, an external framework Kueue's webhook never sees, did not:

- LocalQueue defaulting (`ApplyDefaultLocalQueue`, GA in v0.17): a job without the label
  `kueue.x-k8s.io/queue-name`, in a namespace that has a LocalQueue named `default`, gets the label
  with that queue.
- `manageJobsWithoutQueueName` (`WorkloadShouldBeSuspended`): in the namespaces Kueue's
  `managedJobsNamespaceSelector` picks, Kueue manages a job without the label too. Such an
  AsyncGRPOJob was silently run outside Kueue's quota, and worse: Kueue's RayCluster controller takes
  the job for one it manages (`FindAncestorJobManagedByKueue`), finds no Workload for it, and
  suspends the job's RayCluster (`shouldSuspendChildJob`), under the operator's feet.

This webhook does both at admission, as Kueue does for its kinds. The operator cannot read Kueue's
Configuration (it lives in Kueue's namespace), so the chart's `kueue.*` values mirror it: they set
the environment below and scope the webhook to `kueue.managedJobsNamespaceSelector`, so a request
that reaches it comes from a namespace Kueue's settings cover. For a job that names no queue (no
label, `spec.scheduler.name` not `kueue`):

- the namespace has a LocalQueue `default`: the job is labelled with it (and then queued like any
  other; the validating webhook judges the labelled job);
- it has none, and Kueue manages jobs without a queue name: the job is refused, the message naming
  the label and the fix; without `manageJobsWithoutQueueName` it is admitted as it is;
- a job for another gang scheduler (`kai`, `volcano`) is left to it, except where Kueue manages
  every job: it could never run there (its RayCluster would be suspended), so it is refused.

Where Kueue manages every job, an update that removes the queue label (allowed by the validating
webhook while the job waits) is refused too: it would run the job outside Kueue. Jobs created
before the setting are not judged again. A LocalQueue that cannot be read refuses the job (try
again), as the webhook's failurePolicy would.

`review` is pure; `default_queue` adapts it to kopf and reads the LocalQueue.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from asyncgrpo_api.rules import Finding
from asyncgrpo_api.v1alpha1 import GROUP, PLURAL, VERSION
from asyncgrpo_api.v1alpha1.job import KUEUE_QUEUE_LABEL
from asyncgrpo_operator import k8s, naming, runtime, webhook

DEFAULT_LOCAL_QUEUE = "default"
"""Kueue's constants.DefaultLocalQueueName."""
MANAGE_ENV = "ASYNCGRPO_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME"
"""true: Kueue's manageJobsWithoutQueueName is on (the chart's kueue.manageJobsWithoutQueueName)."""
DEFAULTING_ENV = "ASYNCGRPO_KUEUE_LOCAL_QUEUE_DEFAULTING"
"""true: a job that names no queue goes to the LocalQueue `default` (kueue.localQueueDefaulting)."""
READ_TIMEOUT_SECONDS = 2.0
"""Budget of the LocalQueue read inside the API server's admission timeout (chart default 5 s)."""
FIELD = f"metadata.labels.{KUEUE_QUEUE_LABEL}"


@dataclass(frozen=True)
class Policy:
    """Kueue's settings as the chart mirrors them."""

    manage_jobs_without_queue_name: bool = False
    local_queue_defaulting: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Policy:
        env = os.environ if env is None else env
        return cls(_true(env.get(MANAGE_ENV)), _true(env.get(DEFAULTING_ENV)))


@dataclass(frozen=True)
class Verdict:
    """The webhook's answer: the queue label to add, or the refusal, and a warning for kubectl."""

    queue: str | None = None
    refusal: Finding | None = None
    warning: str | None = None


ADMIT = Verdict()


def needs_default_queue(operation: str, new: Mapping[str, Any], policy: Policy) -> bool:
    """Whether the answer depends on the namespace's LocalQueue `default` (a new job that names no
    queue and could be queued in it), so that it is read only then."""
    active = policy.manage_jobs_without_queue_name or policy.local_queue_defaulting
    return active and operation == "CREATE" and not _names_queue(new) and _scheduler(new) == "default"


def review(
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    policy: Policy,
    *,
    default_queue_exists: bool = False,
) -> Verdict:
    """Judge one request that reached the webhook (its namespace is one Kueue's settings cover).
    `default_queue_exists` matters only where `needs_default_queue` says so."""
    namespace = str(webhook.as_mapping(new.get("metadata")).get("namespace") or "")
    required = policy.manage_jobs_without_queue_name
    if operation == "UPDATE" and old is not None:
        if required and _names_queue(old) and not _names_queue(new):
            return Verdict(
                refusal=Finding(
                    FIELD,
                    f"cannot be removed in namespace {namespace}: this cluster's Kueue manages every job "
                    "there (manageJobsWithoutQueueName), and a job without a queue would run outside "
                    "its quota; move the job to another of the namespace's LocalQueues instead",
                )
            )
        return ADMIT
    if operation != "CREATE" or _names_queue(new):
        return ADMIT
    scheduler = _scheduler(new)
    if scheduler != "default":
        if not required:
            return ADMIT
        return Verdict(
            refusal=Finding(
                "spec.scheduler.name",
                f"is {scheduler}, but this cluster's Kueue manages every job in namespace {namespace} "
                f"(manageJobsWithoutQueueName) and would hold this one's RayCluster; queue it in Kueue "
                f"instead (spec.scheduler.name default and the label {KUEUE_QUEUE_LABEL})",
            )
        )
    if default_queue_exists and (required or policy.local_queue_defaulting):
        return Verdict(
            queue=DEFAULT_LOCAL_QUEUE,
            warning=(
                f"queued in Kueue's LocalQueue {DEFAULT_LOCAL_QUEUE} of namespace {namespace}: the job "
                f"has no {KUEUE_QUEUE_LABEL} label (Kueue's LocalQueue defaulting)"
            ),
        )
    if not required:
        return ADMIT
    return Verdict(
        refusal=Finding(
            FIELD,
            f"is required in namespace {namespace}: this cluster's Kueue manages every job there "
            f"(manageJobsWithoutQueueName) and the namespace has no LocalQueue named "
            f"{DEFAULT_LOCAL_QUEUE} to queue it in; add the label with one of the namespace's "
            f"LocalQueues (kubectl get localqueues -n {namespace}), or ask an administrator for a "
            f"LocalQueue named {DEFAULT_LOCAL_QUEUE}",
        )
    )


def unreadable_queue(namespace: str, error: str) -> Verdict:
    """The refusal when the LocalQueue `default` cannot be read: the job would otherwise be run
    outside the queue the cluster may require."""
    return Verdict(
        refusal=Finding(
            FIELD,
            f"not set, and whether namespace {namespace} has a LocalQueue named {DEFAULT_LOCAL_QUEUE} "
            f"could not be read ({error}); try again, or set the label",
        )
    )


def _names_queue(obj: Mapping[str, Any]) -> bool:
    """Whether the job names its Kueue queue: the label, or its alias spec.scheduler.queueName
    with scheduler.name kueue (AsyncGRPOJob.kueue_queue_name)."""
    labels = webhook.as_mapping(webhook.as_mapping(obj.get("metadata")).get("labels"))
    return bool(labels.get(KUEUE_QUEUE_LABEL)) or _scheduler(obj) == "kueue"


def _scheduler(obj: Mapping[str, Any]) -> str:
    return str(
        webhook.as_mapping(webhook.as_mapping(obj.get("spec")).get("scheduler")).get("name") or "default"
    )


def _true(value: str | None) -> bool:
    return (value or "").lower() in {"1", "true", "yes"}


# --- kopf adapter --------------------------------------------------------------------------------


@kopf.on.mutate(GROUP, VERSION, PLURAL, id=naming.HANDLER_DEFAULT_QUEUE, operations=["CREATE", "UPDATE"])
async def default_queue(
    *, body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: Any = None, **kwargs: Any
) -> None:
    """Label a job that names no queue with the namespace's LocalQueue `default`, or refuse it."""
    operation = str(kwargs.get("operation") or "")
    new = dict(kwargs.get("new") or body)
    old = dict(kwargs["old"]) if kwargs.get("old") is not None else None
    policy = Policy.from_env()
    verdict = await _judge(runtime.find(memo), operation, new, old, policy)
    if verdict.refusal is not None:
        raise kopf.AdmissionError(webhook.denial_message(new, [verdict.refusal]), code=webhook.DENIAL_CODE)
    if verdict.queue is not None:
        patch.setdefault("metadata", {}).setdefault("labels", {})[KUEUE_QUEUE_LABEL] = verdict.queue
    if verdict.warning is not None:
        warnings.append(verdict.warning)


async def _judge(
    rt: runtime.Admission | None,
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    policy: Policy,
) -> Verdict:
    if not needs_default_queue(operation, new, policy):
        return review(operation, new, old, policy)
    namespace = str(webhook.as_mapping(new.get("metadata")).get("namespace") or "")
    if rt is None:
        return unreadable_queue(namespace, "the operator is still starting")
    try:
        found = await asyncio.wait_for(
            rt.api.get_local_queue(namespace, DEFAULT_LOCAL_QUEUE), timeout=READ_TIMEOUT_SECONDS
        )
    except k8s.ApiError as err:
        return unreadable_queue(namespace, f"HTTP {err.status}: {err.message}")
    except TimeoutError:
        return unreadable_queue(namespace, f"no answer within {READ_TIMEOUT_SECONDS:g} s")
    return review(operation, new, old, policy, default_queue_exists=found is not None)
