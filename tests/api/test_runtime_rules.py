"""asyncgrpo_api.runtime_rules: what an AsyncGRPORuntime refuses in a job, each refusal by name.

The runtime is docs/examples/runtimes/restricted.yaml, the one the docs show, so the example is
what these tests hold to.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.runtime_rules import check, image_allowed
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.admin_runtime import RESTRICTED_VOLUME_TYPES, AsyncGRPORuntime
from tests.webhook.jobs import job

REPO = Path(__file__).resolve().parents[2]
RUNTIME_FILE = REPO / "docs" / "examples" / "runtimes" / "restricted.yaml"
RUNTIME: dict[str, Any] = yaml.safe_load(RUNTIME_FILE.read_text())
IMAGE = "ghcr.io/asyncgrpo/trainer:0.1.0"


def under_runtime(**spec: Any) -> AsyncGRPOJob:
    """A valid job that names the example runtime, with the spec fields given."""
    fields = {"image": IMAGE, "runtimeRef": {"name": "restricted"}} | spec
    report = validate_manifest(job("runs-under", **fields))
    assert report.job is not None, report.errors
    return report.job


def runtime(**spec: Any) -> dict[str, Any]:
    """The example runtime with the spec fields given."""
    changed = copy.deepcopy(RUNTIME)
    changed["spec"].update(spec)
    return changed


def pod_template(**spec: Any) -> dict[str, Any]:
    return {"podTemplate": {"spec": spec}}


def test_the_example_runtime_parses_and_fills_in_the_defaults() -> None:
    parsed = AsyncGRPORuntime.model_validate(RUNTIME)
    assert parsed.metadata.name == "restricted"
    assert AsyncGRPORuntime.model_validate(runtime(allow={})).spec.allow.volumes == list(
        RESTRICTED_VOLUME_TYPES
    )


def test_a_job_that_keeps_within_its_runtime_is_admitted() -> None:
    found, refusals = check(under_runtime(), RUNTIME)
    assert found is not None and found.spec.service_account_name == "asyncgrpo-trainer"
    assert refusals == []


def test_a_job_that_names_no_runtime_is_not_checked_against_one() -> None:
    report = validate_manifest(job("free", image="anything:latest"))
    assert report.job is not None
    assert check(report.job, RUNTIME) == (None, [])


def test_a_job_naming_a_runtime_that_does_not_exist_is_refused_by_name() -> None:
    found, (refusal,) = check(under_runtime(), None)
    assert found is None
    assert refusal.path == "spec.runtimeRef.name"
    assert "AsyncGRPORuntime restricted does not exist" in refusal.message
    assert "kubectl get asyncgrporuntimes" in refusal.message


def test_a_runtime_that_does_not_parse_refuses_its_jobs_and_says_why() -> None:
    broken = runtime(images=[])
    found, (refusal,) = check(under_runtime(), broken)
    assert found is None
    assert refusal.path == "spec.runtimeRef.name"
    assert "AsyncGRPORuntime restricted cannot be read" in refusal.message and "images" in refusal.message


HOST_PATH = {"hostPath": {"path": "/data"}, "mountPath": "/data"}
REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("another image", {"image": "docker.io/me/trainer:1"}, "spec.image", "is not an image"),
    (
        "another ServiceAccount",
        {"serviceAccountName": "admin"},
        "spec.serviceAccountName",
        "runs the pods as ServiceAccount asyncgrpo-trainer",
    ),
    ("host network", {"network": {"hostNetwork": True}}, "spec.network.hostNetwork", "allow.hostNetwork"),
    (
        "a hostPath checkpoint volume",
        {"storage": {"checkpoints": HOST_PATH}},
        "spec.storage.checkpoints.hostPath",
        "does not allow hostPath volumes",
    ),
    (
        "a hostPath podTemplate volume",
        {"cluster": {"head": pod_template(volumes=[{"name": "node", "hostPath": {"path": "/"}}])}},
        "spec.cluster.head.podTemplate.spec.volumes[0].hostPath",
        "does not allow hostPath volumes",
    ),
    (
        "an init container",
        {"cluster": {"head": pod_template(initContainers=[{"name": "fetch", "image": IMAGE}])}},
        "spec.cluster.head.podTemplate.spec.initContainers",
        "allow.initContainers",
    ),
    (
        "a sidecar",
        {"cluster": {"policyWorkers": pod_template(containers=[{"name": "logs", "image": IMAGE}])}},
        "spec.cluster.policyWorkers.podTemplate.spec.containers[logs]",
        "allow.sidecars",
    ),
    (
        "a pod securityContext key with another value",
        {"cluster": {"head": pod_template(securityContext={"runAsNonRoot": False})}},
        "spec.cluster.head.podTemplate.spec.securityContext.runAsNonRoot",
        "fixes it to true",
    ),
    (
        "a container securityContext key with another value",
        {
            "cluster": {
                "generationWorkers": pod_template(
                    containers=[{"name": "ray-worker", "securityContext": {"privileged": True}}]
                )
            }
        },
        "spec.cluster.generationWorkers.podTemplate.spec.containers[ray-worker].securityContext.privileged",
        "fixes it to false",
    ),
]


@pytest.mark.parametrize(("what", "spec", "path", "says"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_thing_the_runtime_does_not_allow_is_refused_naming_the_field_runtime_and_fix(
    what: str, spec: dict[str, Any], path: str, says: str
) -> None:
    _, refusals = check(under_runtime(**spec), RUNTIME)
    assert [r.path for r in refusals] == [path], what
    message = refusals[0].message
    assert says in message
    assert "AsyncGRPORuntime restricted" in message
    assert "kubectl get asyncgrporuntimes" in message, "the fix: a runtime that allows it"


def test_an_added_containers_image_must_be_one_the_runtime_lists() -> None:
    allows_sidecars = runtime(allow={"sidecars": True, "initContainers": True})
    spec = pod_template(
        containers=[{"name": "logs", "image": "docker.io/fluent/fluent-bit:3"}],
        initContainers=[{"name": "fetch", "image": "ghcr.io/asyncgrpo/trainer:0.2.0"}],
    )
    _, refusals = check(under_runtime(cluster={"head": spec}), allows_sidecars)
    assert [r.path for r in refusals] == ["spec.cluster.head.podTemplate.spec.containers[logs].image"]


def test_a_podtemplate_may_repeat_what_the_runtime_fixes_and_set_what_it_leaves_open() -> None:
    spec = pod_template(
        securityContext={"runAsNonRoot": True, "fsGroup": 2000},
        containers=[{"name": "driver", "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
        volumes=[{"name": "cache", "emptyDir": {}}],
    )
    _, refusals = check(
        under_runtime(cluster={"head": spec}, serviceAccountName="asyncgrpo-trainer"), RUNTIME
    )
    assert refusals == []


def test_a_runtime_without_a_service_account_refuses_any_the_job_names() -> None:
    tokenless = runtime()
    del tokenless["spec"]["serviceAccountName"]
    _, (refusal,) = check(under_runtime(serviceAccountName="asyncgrpo-trainer"), tokenless)
    assert refusal.path == "spec.serviceAccountName"
    assert "without a ServiceAccount token" in refusal.message


def test_a_runtime_that_allows_host_access_admits_it() -> None:
    open_runtime = runtime(allow={"hostNetwork": True, "volumes": ["hostPath", "emptyDir"]})
    job_ = under_runtime(network={"hostNetwork": True}, storage={"checkpoints": HOST_PATH})
    assert check(job_, open_runtime)[1] == []


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("ghcr.io/asyncgrpo/trainer:0.1.0", True),
        ("ghcr.io/asyncgrpo/trainer:0.1.0-rc1", True),
        ("ghcr.io/asyncgrpo/trainer-evil:1", False),
        ("ghcr.io/asyncgrpo/trainer", False),
    ],
)
def test_an_image_pattern_is_an_exact_reference_or_a_prefix_before_a_trailing_star(
    image: str, allowed: bool
) -> None:
    assert image_allowed(image, ["ghcr.io/asyncgrpo/trainer:*", "registry.local/exact:1"]) is allowed
    assert image_allowed("registry.local/exact:1", ["registry.local/exact:1"])
    assert not image_allowed("registry.local/exact:10", ["registry.local/exact:1"])
