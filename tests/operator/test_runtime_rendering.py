"""The RayCluster of a job that names an AsyncGRPORuntime carries what the runtime fixes.

A runtime is not advice: whatever the job wrote, every pod gets the runtime's ServiceAccount (or no
API token when it names none) and its pod and container securityContexts, and the pods still pass
Pod Security `restricted`. Without a runtime, nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_api.v1alpha1.admin_runtime import AsyncGRPORuntime
from asyncgrpo_operator import manifests, render
from tests.api.test_runtime_rules import IMAGE, RUNTIME, RUNTIME_FILE, runtime
from tests.operator.test_manifests import every_pod_template
from tests.webhook.jobs import job

RESTRICTED = AsyncGRPORuntime.model_validate(RUNTIME)


def the_job(**spec: Any) -> AsyncGRPOJob:
    fields = {"image": IMAGE, "runtimeRef": {"name": "restricted"}} | spec
    report = validate_manifest(job("pinned", **fields))
    assert report.job is not None, report.errors
    return report.job


def containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod["spec"]["containers"]
    yield from pod["spec"].get("initContainers", [])


def test_every_pod_runs_as_the_runtimes_service_account_with_its_security_contexts() -> None:
    cluster = manifests.ray_cluster(the_job(), 0, runtime=RESTRICTED)
    pods = list(every_pod_template(cluster))
    assert len(pods) == 3
    for pod in pods:
        spec = pod["spec"]
        assert spec["serviceAccountName"] == "asyncgrpo-trainer"
        assert "automountServiceAccountToken" not in spec
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for container in containers(pod):
            assert container["image"] == IMAGE
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "capabilities": {"drop": ["ALL"]},
            }


def test_the_runtimes_values_win_over_a_pod_template_that_contradicts_them() -> None:
    """Admission refuses such a job; this is the job admitted before its runtime changed."""
    root = {"podTemplate": {"spec": {"securityContext": {"runAsNonRoot": False, "fsGroup": 2000}}}}
    cluster = manifests.ray_cluster(the_job(cluster={"head": root}), 0, runtime=RESTRICTED)
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["securityContext"]["runAsNonRoot"] is True
    assert head["securityContext"]["fsGroup"] == 2000, "what the runtime leaves open is the job's"


def test_a_runtime_without_a_service_account_gives_the_pods_no_api_token() -> None:
    tokenless = runtime()
    del tokenless["spec"]["serviceAccountName"]
    cluster = manifests.ray_cluster(the_job(), 0, runtime=AsyncGRPORuntime.model_validate(tokenless))
    for pod in every_pod_template(cluster):
        assert "serviceAccountName" not in pod["spec"]
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_the_pods_stay_pod_security_restricted_under_a_runtime_that_fixes_little() -> None:
    minimal = AsyncGRPORuntime.model_validate(
        {"metadata": {"name": "images-only"}, "spec": {"images": ["*"]}}
    )
    plain = manifests.ray_cluster(the_job(), 0)
    pinned = manifests.ray_cluster(the_job(), 0, runtime=minimal)
    for before, after in zip(every_pod_template(plain), every_pod_template(pinned), strict=True):
        assert after["spec"]["securityContext"] == manifests.RESTRICTED_POD_SECURITY
        assert after == before, "a runtime that fixes nothing renders what no runtime renders"
    for pod in every_pod_template(pinned):
        for container in containers(pod):
            assert container["securityContext"] == manifests.RESTRICTED_CONTAINER_SECURITY


def test_asyncgrpo_render_renders_and_checks_a_job_with_the_runtime_file_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("pinned", image=IMAGE, runtimeRef={"name": "restricted"})))
    assert render.main([str(path), "--runtime", str(RUNTIME_FILE)]) == 0
    (cluster,) = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d and d["kind"] == "RayCluster"]
    assert cluster["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == "asyncgrpo-trainer"

    assert render.main([str(path)]) == 1, "without the runtime, as the webhook without one"
    assert "AsyncGRPORuntime restricted does not exist" in capsys.readouterr().err
    path.write_text(
        yaml.safe_dump(
            job("open", image=IMAGE, runtimeRef={"name": "restricted"}, network={"hostNetwork": True})
        )
    )
    assert render.main([str(path), "--runtime", str(RUNTIME_FILE)]) == 1
    assert "spec.network.hostNetwork: AsyncGRPORuntime restricted" in capsys.readouterr().err
