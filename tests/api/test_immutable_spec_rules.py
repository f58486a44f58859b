"""The CRD's rules that spec.managedBy and spec.runtimeRef cannot change once the job exists,
evaluated by cel-python on old and new objects as the API server passes them to a transition rule
(self and oldSelf). The API server applies them whether or not a webhook replica answers: without
the runtimeRef rule, a job's author could drop the runtime an administrator made it run under
while the webhook was down (issue 47)."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from asyncgrpo_api.crdgen import build_crd

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
RESTRICTED = {"name": "restricted"}
VALUES: dict[str, tuple[Any, Any]] = {
    "managedBy": (MULTIKUEUE, "other"),
    "runtimeRef": (RESTRICTED, {"name": "lenient"}),
}
"""Per field: a value, and another one."""


def rule_for(field: str) -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    [rule] = [r for r in root["x-kubernetes-validations"] if f"spec.{field}" in r["rule"]]
    return rule


def allowed(field: str, old: Any, new: Any) -> bool:
    def obj(value: Any) -> Any:
        spec = {"image": "trainer:1"} | ({field: value} if value is not None else {})
        return celpy.json_to_cel({"metadata": {"name": "job"}, "spec": spec})

    env = celpy.Environment()
    program = env.program(env.compile(rule_for(field)["rule"]))
    return bool(program.evaluate({"self": obj(new), "oldSelf": obj(old)}))


@pytest.mark.parametrize("field", list(VALUES))
def test_an_update_that_keeps_the_field_passes(field: str) -> None:
    value, _ = VALUES[field]
    assert allowed(field, None, None) and allowed(field, value, value)


@pytest.mark.parametrize("field", list(VALUES))
@pytest.mark.parametrize("change", ["added", "removed", "changed"])
def test_adding_removing_or_changing_the_field_is_refused_naming_it(field: str, change: str) -> None:
    value, other = VALUES[field]
    old, new = {"added": (None, value), "removed": (value, None), "changed": (value, other)}[change]
    assert not allowed(field, old, new)
    assert rule_for(field)["message"].startswith(f"spec.{field} cannot change once the job exists")
