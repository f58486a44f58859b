"""Generate the chart's ValidatingAdmissionPolicy from asyncgrpo_api.invariants.

Why a policy next to the webhook: the webhook's failurePolicy is Fail, so while no replica answers
(a rollout gone wrong, every node of the operator drained) no job can be written at all, and with
`webhook.failurePolicy: Ignore` anything could be. The API server evaluates a policy itself, so
the invariants CEL can express hold whether or not the operator runs. It is never stricter than
the webhook, which runs the same invariants (rules.py evaluates this table): it matches the same
namespaces, objects and requests (the chart copies the webhook's selectors, and the match
conditions below are the webhook's), and on an update it refuses only what the update breaks, as
the webhook does (a job stored under older rules can still be suspended).

The API server runs policies before webhooks, so a job that breaks one of these invariants is
refused by the policy, with every invariant it breaks in one message, in the webhook's words:

    ValidatingAdmissionPolicy 'asyncgrpo-operator' with binding 'asyncgrpo-operator' denied
    request: AsyncGRPOJob "bad" is invalid (1 error): spec.trainer.asyncRL.overSampling: must be ...

failurePolicy is Fail because every expression is proven not to fail (asyncgrpo_api.expressions):
an error could otherwise refuse a good job. The proof assumes the CRD schema of this version;
against an older CRD a field it lacks makes the invariant not apply.

Run `python -m asyncgrpo_api.admissionpolicy` to rewrite the chart's file (its template,
templates/admissionpolicy.yaml, adds the name, the selectors and the binding); `--check` fails
when it is stale (`make generated`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from asyncgrpo_api.crdgen import build_crd
from asyncgrpo_api.expressions import Expr, Printer, set_when
from asyncgrpo_api.invariants import INVARIANTS, Invariant
from asyncgrpo_api.v1alpha1 import KIND

POLICY_FILE = Path("charts/asyncgrpo-operator/files/admission-policy.yaml")
NOW, BEFORE = "object.spec", "oldObject.spec"
FINDINGS = "findings"
"""The variable listing what the request breaks, one `path: message` line per invariant."""
SEPARATOR = " | "
"""Between findings: a policy's message is one line (the API server drops one with line breaks)."""

MATCH_CONDITIONS: list[dict[str, str]] = [
    {"name": "not-being-deleted", "expression": "!has(object.metadata.deletionTimestamp)"},
    {"name": "spec-changed", "expression": "request.operation != 'UPDATE' || object.spec != oldObject.spec"},
]
"""What the webhook never judges (webhook.py `_not_judged`, the chart's matchConditions): an object
being deleted, and an update that leaves the spec alone (the webhook also judges a change of the
Kueue labels, which no invariant here reads)."""


def spec_schema() -> Mapping[str, Any]:
    """The spec's schema in the CRD this version ships: what the API server type-checks against."""
    version = build_crd()["spec"]["versions"][0]
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def broken(invariant: Invariant, root: str, schema: Mapping[str, Any]) -> str:
    """CEL: whether the object at `root` breaks the invariant (false where a field is missing)."""
    return Printer(schema, root).guarded(invariant.broken, *_message_fields(invariant))


def message(invariant: Invariant, root: str, schema: Mapping[str, Any]) -> str:
    """CEL: the finding's `path: message`, for an object that breaks the invariant."""
    known = set_when(invariant.broken, True)
    return Printer(schema, root).message((f"{invariant.path}: ", *invariant.message), known)


def broken_by_request(invariant: Invariant, schema: Mapping[str, Any]) -> str:
    """CEL: the request breaks it: a create of an object that breaks it, or an update that makes
    the object break it when it did not before (as the webhook holds no old problem against it)."""
    before = broken(invariant, BEFORE, schema)
    return f"({broken(invariant, NOW, schema)}) && !(request.operation == 'UPDATE' && {before})"


def _message_fields(invariant: Invariant) -> list[Expr]:
    return [part for part in invariant.message if not isinstance(part, str)]


def build_policy_spec() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec, less matchConstraints (the chart's selectors)."""
    schema = spec_schema()
    variables = [
        {"name": invariant.name, "expression": broken_by_request(invariant, schema)}
        for invariant in INVARIANTS
    ]
    items = ", ".join(
        f"variables.{invariant.name} ? {message(invariant, NOW, schema)} : ''" for invariant in INVARIANTS
    )
    variables.append({"name": FINDINGS, "expression": f"[{items}].filter(f, f != '')"})
    count = f"size(variables.{FINDINGS})"
    return {
        "failurePolicy": "Fail",
        "matchConditions": MATCH_CONDITIONS,
        "variables": variables,
        "validations": [
            {
                "expression": f"{count} == 0",
                "messageExpression": (
                    f"'{KIND} \"' + object.metadata.name + '\" is invalid (' + string({count}) + "
                    f"({count} == 1 ? ' error' : ' errors') + '): ' + "
                    f"variables.{FINDINGS}.join('{SEPARATOR}')"
                ),
                "message": f"the {KIND} breaks a rule of asyncgrpo_api.invariants: run `asyncgrpo "
                "validate` on it for the field and the fix",
                "reason": "Invalid",
            }
        ],
    }


def render_policy_spec() -> str:
    """The file the chart includes under the policy's spec, as committed."""
    header = (
        "# GENERATED by `python -m asyncgrpo_api.admissionpolicy` from asyncgrpo_api.invariants. Do not\n"
        "# edit. templates/admissionpolicy.yaml puts it under the ValidatingAdmissionPolicy's spec.\n"
    )
    return header + yaml.dump(
        build_policy_spec(), Dumper=yaml.SafeDumper, sort_keys=False, width=120, allow_unicode=True
    )


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the chart's admission policy file."""
    parser = argparse.ArgumentParser(prog="python -m asyncgrpo_api.admissionpolicy", description=__doc__)
    parser.add_argument("--out", type=Path, default=POLICY_FILE, help=f"default: {POLICY_FILE}")
    parser.add_argument("--check", action="store_true", help="fail if the committed file is stale")
    args = parser.parse_args(argv)
    text = render_policy_spec()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run `python -m asyncgrpo_api.admissionpolicy`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
