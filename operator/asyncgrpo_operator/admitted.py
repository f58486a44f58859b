"""Which spec the operator runs a job by when the rules and the stored spec disagree.

The operator validates every job on every pass with the rules it has now, and two kinds of job
fail them while having been accepted once:
- a job admitted under older rules (an operator upgrade tightened them): its spec has not changed
  since it passed. A started one keeps running by that spec; it was the cluster administrator, not
  the job's author, who changed the rules.
- a job whose spec changed without passing admission: written while the webhook was not called
  (not installed, or bypassed by `failurePolicy: Ignore`), so that the rules never saw it. Such a
  change is refused, whatever the job's state.

They are told apart by `status.admittedGeneration`: the newest generation whose spec passed every
rule when the operator read it. The generation, not a digest of the spec, because the API server
applies defaults (a field added by a CRD upgrade) when it reads an object, which changes the
spec's bytes without any write; the generation moves only when a client writes the spec.

A job with no record was admitted by an operator that kept none (before this field existed): it
is given the benefit of the doubt, as the older rules would have.

A job that names an AsyncGRPORuntime is judged by it too, as the runtime is now: an administrator
can change or delete a runtime after its jobs were admitted, and what it no longer allows is not
started again. Unlike a tightened rule, this is no benefit of the doubt to give: the runtime is
the administrator's word on what may run, so its refusal is treated like a spec that was never
admitted (plan.plan_invalid): a running attempt is kept, no new one is started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncgrpo_api.rules import Finding, Report
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_operator.decision import ADMITTED_UNDER_OLDER_RULES, RUNTIME_FORBIDS, SPEC_CHANGE_NOT_ADMITTED

__all__ = ["Verdict", "judge", "under_runtime"]


@dataclass(frozen=True)
class Verdict:
    """How a pass treats a job's stored spec."""

    job: AsyncGRPOJob | None
    """The spec the job runs by; None when the operator will not run it (plan.plan_invalid)."""
    spec_errors: tuple[str, ...] = ()
    """The rules `job` fails now but passed when it was admitted (it keeps running)."""
    refusal: str = ""
    """Why the job is not run (`job` None): the rules' findings, and why they are not excused."""
    reason: str = ADMITTED_UNDER_OLDER_RULES
    """The SpecValid reason while a started attempt is kept although the spec is refused."""


def judge(report: Report, status: AsyncGRPOJobStatus | None, generation: int) -> Verdict:
    """The spec a pass runs by, from the rules' report on the stored job, its status (what the
    operator recorded as admitted, and whether the job has started) and its generation."""
    if report.job is not None:
        return Verdict(job=report.job)
    findings = "; ".join(str(e) for e in report.errors)
    started = status is not None and status.start_time is not None
    if not started or status is None:
        return Verdict(job=None, refusal=findings)
    admitted = status.admitted_generation
    if admitted is not None and generation > admitted:
        return Verdict(
            job=None,
            refusal=(
                f"spec generation {generation} was never admitted: it was written while the admission "
                f"webhook was not called (the last admitted generation is {admitted}), and it breaks "
                f"these rules: {findings}"
            ),
            reason=SPEC_CHANGE_NOT_ADMITTED,
        )
    if report.parsed is not None:
        return Verdict(job=report.parsed, spec_errors=tuple(str(e) for e in report.errors))
    return Verdict(
        job=None,
        refusal=(
            f"the spec no longer parses under this operator's rules (added since it was admitted): {findings}"
        ),
    )


def under_runtime(verdict: Verdict, refusals: Sequence[Finding]) -> Verdict:
    """The verdict once the job's AsyncGRPORuntime, as it is now, has had its say
    (asyncgrpo_api.runtime_rules.check): unchanged when the runtime allows the job."""
    if verdict.job is None or not refusals:
        return verdict
    runtime = verdict.job.spec.runtime_ref.name if verdict.job.spec.runtime_ref else ""
    findings = "; ".join(str(r) for r in refusals)
    return Verdict(
        job=None,
        refusal=f"AsyncGRPORuntime {runtime} refuses the job as it is now (changed or deleted since the job "
        f"was admitted): {findings}",
        reason=RUNTIME_FORBIDS,
    )
