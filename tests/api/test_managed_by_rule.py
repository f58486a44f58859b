"""The CRD's rule that spec.managedBy cannot change once the job exists, evaluated by cel-python on
old and new objects as the API server passes them to a transition rule (self and oldSelf)."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from asyncgrpo_api.crdgen import build_crd

MULTIKUEUE = "kueue.x-k8s.io/multikueue"


def managed_by_rule() -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    [rule] = [r for r in root["x-kubernetes-validations"] if "managedBy" in r["rule"]]
    return rule


def allowed(old: str | None, new: str | None) -> bool:
    def obj(value: str | None) -> Any:
        spec = {"image": "trainer:1"} | ({"managedBy": value} if value is not None else {})
        return celpy.json_to_cel({"metadata": {"name": "job"}, "spec": spec})

    env = celpy.Environment()
    program = env.program(env.compile(managed_by_rule()["rule"]))
    return bool(program.evaluate({"self": obj(new), "oldSelf": obj(old)}))


@pytest.mark.parametrize(("old", "new"), [(None, None), (MULTIKUEUE, MULTIKUEUE)])
def test_an_update_that_keeps_managed_by_passes(old: str | None, new: str | None) -> None:
    assert allowed(old, new)


@pytest.mark.parametrize(("old", "new"), [(None, MULTIKUEUE), (MULTIKUEUE, None), (MULTIKUEUE, "other")])
def test_adding_removing_or_changing_managed_by_is_refused_naming_the_field(
    old: str | None, new: str | None
) -> None:
    assert not allowed(old, new)
    assert managed_by_rule()["message"].startswith("spec.managedBy cannot change once the job exists")
