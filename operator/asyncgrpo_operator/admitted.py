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
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncgrpo_api.rules import Report
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobStatus
from asyncgrpo_operator.decision import ADMITTED_UNDER_OLDER_RULES, SPEC_CHANGE_NOT_ADMITTED

__all__ = ["Verdict", "judge"]


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
