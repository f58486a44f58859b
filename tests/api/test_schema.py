"""The models as a contract: round trips, descriptions, bounds and the generated CRD."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from asyncgrpo_api.apidoc import render_api_doc
from asyncgrpo_api.crdgen import (
    CRD_FILE,
    PRINTER_COLUMNS,
    RUNTIME_CRD_FILE,
    build_crd,
    build_runtime_crd,
    render_crd,
)
from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, AsyncGRPOJobSpec, AsyncGRPOJobStatus
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntimeSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_yaml_to_model_to_yaml_round_trips(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    job = AsyncGRPOJob.model_validate(manifest)
    again = AsyncGRPOJob.model_validate(yaml.safe_load(yaml.safe_dump(job.to_manifest())))
    assert again == job
    assert _contains(job.to_manifest(), manifest), "every field the user wrote survives the round trip"


def _contains(full: Any, written: Any) -> bool:
    if isinstance(written, dict):
        return isinstance(full, dict) and all(k in full and _contains(full[k], v) for k, v in written.items())
    if isinstance(written, list):
        return isinstance(full, list) and len(full) == len(written) and all(map(_contains, full, written))
    return bool(full == written)


def _all_models(root: type[BaseModel]) -> set[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    stack = [root]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        for field in model.model_fields.values():
            stack.extend(_models_in(field.annotation))
    return seen


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


@pytest.mark.parametrize("root", [AsyncGRPOJobSpec, AsyncGRPOJobStatus, AsyncGRPORuntimeSpec])
def test_every_field_has_a_description(root: type[BaseModel]) -> None:
    missing = [
        f"{model.__name__}.{name}"
        for model in _all_models(root)
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert missing == []


@pytest.mark.parametrize("crd", [build_crd(), build_runtime_crd()], ids=["job", "runtime"])
def test_every_spec_number_string_list_map_and_free_form_object_is_bounded(crd: dict[str, Any]) -> None:
    """What a user can grow is bounded in the schema, so the API server refuses an oversized job
    before any webhook reads it; a free-form object (podTemplate, affinity) at least in its keys."""
    unbounded = []

    def walk(node: dict[str, Any], path: str) -> None:
        kind = node.get("type")
        if kind in {"integer", "number"} and not ({"minimum", "maximum"} <= node.keys() or "enum" in node):
            unbounded.append(path)
        if kind == "string" and not ("maxLength" in node or "enum" in node):
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
        if node.get("x-kubernetes-preserve-unknown-fields") and "maxProperties" not in node:
            unbounded.append(path)
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")
    assert unbounded == []


@pytest.mark.parametrize("crd", [build_crd(), build_runtime_crd()], ids=["job", "runtime"])
def test_every_cel_rule_names_only_fields_its_schema_has(crd: dict[str, Any]) -> None:
    """The API server refuses the whole CRD when one rule names a field its schema lacks (a rule
    for volumes once landed on objectStore too, and every e2e test failed at the CRD's apply)."""
    wrong = []

    def walk(node: dict[str, Any], path: str) -> None:
        fields = node.get("properties", {}).keys()
        for rule in node.get("x-kubernetes-validations", []):
            named = set(re.findall(r"\bself\.(\w+)", rule["rule"]))
            if path == "root":
                named -= {"metadata", "spec", "status"}
            wrong.extend(f"{path}: {rule['rule']} names {name}" for name in sorted(named - fields))
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "root")
    assert wrong == []


def test_the_committed_crds_are_what_the_models_generate() -> None:
    committed = (REPO / "crds" / CRD_FILE).read_text()
    assert committed == render_crd(), "crds/ is stale: run `python -m asyncgrpo_api.crdgen`"
    committed = (REPO / "crds" / RUNTIME_CRD_FILE).read_text()
    assert committed == render_crd(build_runtime_crd()), (
        "crds/ is stale: run `python -m asyncgrpo_api.crdgen`"
    )


def test_runtimes_are_cluster_scoped_and_jobs_namespaced() -> None:
    assert build_runtime_crd()["spec"]["scope"] == "Cluster"
    assert build_runtime_crd()["spec"]["names"]["categories"] == ["asyncgrpo"], "not in `kubectl get all`"
    assert build_crd()["spec"]["scope"] == "Namespaced"


def test_crd_generation_is_deterministic_across_processes() -> None:
    code = "from asyncgrpo_api.crdgen import render_crd; import sys; sys.stdout.write(render_crd())"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1


def test_the_crd_stays_well_under_the_client_side_apply_annotation_limit() -> None:
    assert len(render_crd().encode()) < 262_144 // 2


def test_the_crd_prints_phase_step_reward_accuracy_staleness_restarts_age() -> None:
    default_columns = [c["name"] for c in PRINTER_COLUMNS if "priority" not in c]
    assert default_columns == ["Phase", "Step", "Reward", "Accuracy", "Staleness", "Restarts", "Age"]
    wide = [c["name"] for c in PRINTER_COLUMNS if c.get("priority") == 1]
    assert wide[0] == "Val-Acc"
    version = build_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}


def test_the_crd_schema_has_no_refs_or_pydantic_only_keywords() -> None:
    text = render_crd()
    for keyword in ("$ref", "anyOf", "title:", "propertyNames", "additionalProperties: false", "const:"):
        assert keyword not in text


@pytest.mark.parametrize(
    "minimal",
    [
        {"image": "x"},
        {"image": "x", "storage": {"checkpoints": {"pvc": {"claimName": "c"}, "mountPath": "/c"}}},
        {"image": "x", "trainer": {"asyncRL": {"overSampling": True}}},
    ],
    ids=["bare", "with-volume", "over-sampled"],
)
def test_api_server_defaults_make_a_minimal_job_equal_to_the_model_defaults(minimal: dict[str, Any]) -> None:
    """The CRD's defaults, applied to a minimal job, give exactly what the models default to."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaulted = _apply_defaults(schema, minimal)
    model_view = AsyncGRPOJobSpec.model_validate(minimal).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    assert AsyncGRPOJobSpec.model_validate(defaulted) == AsyncGRPOJobSpec.model_validate(model_view)
    assert validate_manifest(
        {
            "apiVersion": "asyncgrpo.dev/v1alpha1",
            "kind": "AsyncGRPOJob",
            "metadata": {"name": "a"},
            "spec": defaulted,
        }
    ).ok


def _apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural-schema defaulting as the API server does it (top-down, objects only)."""
    if schema.get("type") != "object" or not isinstance(value, dict):
        return value
    out = dict(value)
    for name, child in schema.get("properties", {}).items():
        if name not in out and "default" in child:
            out[name] = child["default"]
        if name in out:
            out[name] = _apply_defaults(child, out[name])
    return out


def test_the_committed_api_reference_is_what_the_models_generate() -> None:
    assert (REPO / "docs" / "api.md").read_text() == render_api_doc(), "run `python -m asyncgrpo_api.apidoc`"


def test_every_status_progress_count_is_bounded_by_what_the_api_server_stores() -> None:
    """The driver reports these (the job author's code); an integer above int64 would fail every
    status write of the job."""
    progress = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "properties"
    ]["progress"]["properties"]
    counts = {name: node for name, node in progress.items() if node.get("type") == "integer"}
    assert set(counts) >= {"step", "maxSteps", "policyVersion", "rewardFailures", "lastCheckpointStep"}
    assert {name: node.get("maximum") for name, node in counts.items()} == dict.fromkeys(counts, 2**53 - 1)
