"""Admission of pod-template overrides and of Kueue queue names: what is refused names the field.

The shape of a pool's podTemplate is checked by its model (asyncgrpo_api.v1alpha1.podtemplate) and
what depends on the rest of the job by rules.py; both reach the user through validate_manifest,
as `kubectl apply` (the webhook) and `asyncgrpo validate` show them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api.rules import validate_manifest

JOBS = Path(__file__).resolve().parents[1] / "operator" / "jobs"
BASE: dict[str, Any] = yaml.safe_load((JOBS / "pod-template.yaml").read_text())
HEAD = "spec.cluster.head.podTemplate"


def errors(doc: dict[str, Any]) -> dict[str, str]:
    return {f.path: f.message for f in validate_manifest(doc).errors}


def with_head(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["cluster"]["head"]["podTemplate"] = {"spec": spec}
    return doc


def test_the_documented_override_is_accepted() -> None:
    assert validate_manifest(BASE).ok, validate_manifest(BASE).errors


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        (
            {"containers": [{"name": "driver", "command": ["sleep", "1d"]}]},
            "spec.containers[driver].command",
            "driver command",
        ),
        (
            {"containers": [{"name": "ray-head", "ports": [{"containerPort": 9999}]}]},
            "spec.containers[ray-head].ports",
            "cannot be changed",
        ),
        (
            {"containers": [{"name": "ray-head", "image": "other:1"}]},
            "spec.containers[ray-head].image",
            "cannot be changed",
        ),
        (
            {"containers": [{"name": "sidecar", "image": "x", "ports": [{"containerPort": 6379}]}]},
            "spec.containers[sidecar].ports[0].containerPort",
            "6379",
        ),
        (
            {"containers": [{"name": "sidecar", "image": "x", "ports": [{"containerPort": 11500}]}]},
            "spec.containers[sidecar].ports[0].containerPort",
            "11000-11999",
        ),
        (
            {"containers": [{"name": "ray-worker", "image": "x"}]},
            "spec.containers[ray-worker].name",
            "operator container",
        ),
        ({"containers": [{"name": "sidecar"}]}, "spec.containers[sidecar].image", "required"),
        (
            {"containers": [{"name": "driver", "env": [{"name": "RAY_ADDRESS", "value": "x"}]}]},
            "spec.containers[driver].env[0].name",
            "set by the operator",
        ),
        (
            {
                "containers": [
                    {"name": "driver", "volumeMounts": [{"name": "v", "mountPath": "/etc/asyncgrpo"}]}
                ]
            },
            "spec.containers[driver].volumeMounts[0].mountPath",
            "operator mounts",
        ),
        ({"volumes": [{"name": "job-spec", "emptyDir": {}}]}, "spec.volumes[0].name", "operator's volume"),
        ({"nodeSelector": {"a": "b"}}, "spec.nodeSelector", "spec.cluster.<pool>.nodeSelector"),
        ({"restartPolicy": "Always"}, "spec.restartPolicy", "finished driver"),
        ({"schedulerName": "x"}, "spec.schedulerName", "spec.scheduler.name"),
        ({"dnsPolicy": "None"}, "spec.dnsPolicy", "cannot be set in a podTemplate"),
        ({"securityContext": "root"}, "spec.securityContext", "must be an object"),
    ],
)
def test_what_the_operator_relies_on_is_refused_with_the_field_named(
    spec: dict[str, Any], path: str, words: str
) -> None:
    found = errors(with_head(**spec))
    assert f"{HEAD}.{path}" in found, found
    assert words in found[f"{HEAD}.{path}"]


def test_operator_labels_and_unknown_template_fields_are_refused() -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["cluster"]["policyWorkers"]["podTemplate"] = {
        "metadata": {"labels": {"ray.io/node-type": "head"}, "name": "x"},
        "kind": "Pod",
    }
    found = errors(doc)
    pool = "spec.cluster.policyWorkers.podTemplate"
    assert "label prefixes" in found[f"{pool}.metadata.labels.ray.io/node-type"]
    assert f"{pool}.metadata.name" in found
    assert f"{pool}.kind" in found


def test_a_worker_override_may_not_name_the_head_containers() -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["cluster"]["generationWorkers"]["podTemplate"] = {
        "spec": {"containers": [{"name": "driver", "image": "x"}]}
    }
    assert (
        "operator container"
        in errors(doc)["spec.cluster.generationWorkers.podTemplate.spec.containers[driver].name"]
    )


def test_the_jobs_own_environment_storage_and_priority_are_not_overridden_by_a_pool() -> None:
    doc = with_head(
        priorityClassName="other",
        containers=[
            {"name": "driver", "env": [{"name": "HF_HOME", "value": "/x"}]},
            {"name": "shipper", "image": "x", "volumeMounts": [{"name": "c", "mountPath": "/checkpoints"}]},
        ],
    )
    doc["spec"]["env"] = [{"name": "HF_HOME", "value": "/models"}]
    found = errors(doc)
    assert "spec.env" in found[f"{HEAD}.spec.containers[driver].env[0].name"]
    assert "spec.storage" in found[f"{HEAD}.spec.containers[shipper].volumeMounts[0].mountPath"]
    assert "spec.scheduler.priorityClassName" in found[f"{HEAD}.spec.priorityClassName"]


def test_a_job_can_neither_turn_off_ray_token_authentication_nor_choose_its_token() -> None:
    """Every job's Ray asks for the token of the job's Secret (docs/security.md); a variable that
    turns that off, or hands Ray a token the author chose, is refused wherever the job sets it."""
    in_pods = with_head(
        containers=[
            {"name": "ray-head", "env": [{"name": "RAY_AUTH_TOKEN", "value": "known-to-the-author"}]},
            {"name": "driver", "env": [{"name": "RAY_ENABLE_K8S_TOKEN_AUTH", "value": "true"}]},
        ]
    )
    in_spec = copy.deepcopy(BASE)
    in_spec["spec"]["env"] = [{"name": "RAY_AUTH_MODE", "value": "disabled"}]
    in_spec["spec"]["secrets"] = [{"name": "mine", "keys": [{"key": "path", "env": "RAY_AUTH_TOKEN_PATH"}]}]
    found = errors(in_pods) | errors(in_spec)
    assert "set by the operator" in found[f"{HEAD}.spec.containers[ray-head].env[0].name"]
    for path in (
        f"{HEAD}.spec.containers[driver].env[0].name",
        "spec.env[0].name",
        "spec.secrets[0].keys[0].env",
    ):
        assert "Ray's token authentication" in found.get(path, ""), (path, found)


def test_a_ray_too_old_for_token_authentication_is_refused_at_admission() -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["cluster"]["rayVersion"] = "2.46"
    assert "Ray 2.52 or later" in errors(doc)["spec.cluster.rayVersion"]
    doc["spec"]["cluster"]["rayVersion"] = "2.52.0"
    assert "spec.cluster.rayVersion" not in errors(doc)


# --- queues ----------------------------------------------------------------------------------------

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def queued(labels: dict[str, str] | None, scheduler: dict[str, Any] | None) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["cluster"]["head"].pop("podTemplate")
    doc["spec"]["cluster"]["policyWorkers"].pop("podTemplate")
    doc["spec"].pop("scheduler")
    if labels is not None:
        doc["metadata"]["labels"] = labels
    if scheduler is not None:
        doc["spec"]["scheduler"] = scheduler
    return doc


def test_the_queue_label_alone_queues_the_job_in_kueue() -> None:
    report = validate_manifest(queued({QUEUE_LABEL: "team-a"}, None))
    assert report.job is not None and report.job.kueue_queue_name == "team-a"


def test_spec_scheduler_queue_name_is_an_alias_of_the_label() -> None:
    report = validate_manifest(queued(None, {"name": "kueue", "queueName": "team-a"}))
    assert report.job is not None and report.job.kueue_queue_name == "team-a"
    both = validate_manifest(queued({QUEUE_LABEL: "team-a"}, {"name": "kueue", "queueName": "team-a"}))
    assert both.job is not None and both.job.kueue_queue_name == "team-a"


def test_a_label_and_a_queue_name_that_disagree_are_refused_naming_both() -> None:
    found = errors(queued({QUEUE_LABEL: "team-a"}, {"name": "kueue", "queueName": "team-b"}))
    assert "'team-b'" in found["spec.scheduler.queueName"] and "'team-a'" in found["spec.scheduler.queueName"]


def test_kueue_and_another_gang_scheduler_are_not_mixed() -> None:
    found = errors(queued({QUEUE_LABEL: "team-a"}, {"name": "volcano", "queueName": "q"}))
    assert "scheduler.name is volcano" in found[f"metadata.labels.{QUEUE_LABEL}"]


def test_a_kai_job_needs_a_queue_and_a_volcano_job_may_use_the_default_one() -> None:
    assert "spec.scheduler.queueName" in errors(queued(None, {"name": "kai"}))
    assert validate_manifest(queued(None, {"name": "volcano"})).ok
