"""manifests.py for queues, gang schedulers and pod-template overrides (golden files pin the whole
output in golden/kueue-label.yaml, gang-volcano.yaml, every-field.yaml (KAI) and pod-template.yaml)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, podtemplate
from asyncgrpo_operator import manifests, naming, workload

JOBS = Path(__file__).resolve().parent / "jobs"


def load(name: str, edit: Any = None) -> AsyncGRPOJob:
    doc = yaml.safe_load((JOBS / f"{name}.yaml").read_text())
    if edit is not None:
        edit(doc)
    report = validate_manifest(doc)
    assert report.job is not None, report.errors
    return report.job


def templates(cluster: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield cluster["spec"]["headGroupSpec"]["template"]
    for group in cluster["spec"]["workerGroupSpecs"]:
        yield group["template"]


def test_a_kueue_job_is_queued_as_its_workload_not_through_its_raycluster() -> None:
    job = load("kueue-label")
    cluster = manifests.ray_cluster(job, 0)
    assert "suspend" not in cluster["spec"]  # created only once Kueue admitted the job's Workload
    labels = cluster["metadata"]["labels"]
    assert "kueue.x-k8s.io/queue-name" not in labels and "kueue.x-k8s.io/priority-class" not in labels
    for template in templates(cluster):
        assert "schedulerName" not in template["spec"]  # Kueue admits; kube-scheduler places
    wl = workload.manifest(job, None, cluster, None)
    assert wl["spec"]["queueName"] == "team-a"
    assert [s["name"] for s in wl["spec"]["podSets"]] == ["head", "policy", "generation"]


def test_spec_scheduler_kueue_renders_the_same_as_the_label() -> None:
    def alias(doc: dict[str, Any]) -> None:
        doc["metadata"].pop("labels")
        doc["spec"]["scheduler"] = {"name": "kueue", "queueName": "team-a"}

    job = load("kueue-label", alias)
    wl = workload.manifest(job, None, manifests.ray_cluster(job, 0), None)
    assert wl["spec"]["queueName"] == "team-a"


def test_a_job_without_a_queue_is_never_suspended() -> None:
    assert "suspend" not in manifests.ray_cluster(load("cpu-sync"), 0)["spec"]


def test_volcano_gets_what_kuberays_volcano_integration_reads() -> None:
    cluster = manifests.ray_cluster(load("gang-volcano"), 0)
    labels = cluster["metadata"]["labels"]
    assert labels["volcano.sh/queue-name"] == "research"
    assert labels["ray.io/priority-class-name"] == "high"
    assert "suspend" not in cluster["spec"]
    for template in templates(cluster):
        assert template["spec"]["schedulerName"] == "volcano"
        assert template["spec"]["priorityClassName"] == "high"


def test_kai_gets_its_queue_label_on_the_cluster_and_every_pod() -> None:
    cluster = manifests.ray_cluster(load("every-field"), 0)
    assert cluster["metadata"]["labels"]["kai.scheduler/queue"] == "research"
    for template in templates(cluster):
        assert template["spec"]["schedulerName"] == "kai-scheduler"
        assert template["metadata"]["labels"]["kai.scheduler/queue"] == "research"


def _without_overrides(doc: dict[str, Any]) -> None:
    for pool in doc["spec"]["cluster"].values():
        pool.pop("podTemplate", None)


def test_an_override_adds_to_the_rendered_pods_and_keeps_everything_the_operator_rendered() -> None:
    plain = manifests.ray_cluster(load("pod-template", _without_overrides), 0)
    merged = manifests.ray_cluster(load("pod-template"), 0)
    head, plain_head = merged["spec"]["headGroupSpec"]["template"], plain["spec"]["headGroupSpec"]["template"]
    # The operator's containers come first, in order, and keep every field and value they had.
    containers = {c["name"]: c for c in head["spec"]["containers"]}
    assert [c["name"] for c in head["spec"]["containers"]] == ["ray-head", "driver", "log-shipper"]
    for ours in plain_head["spec"]["containers"]:
        theirs = containers[ours["name"]]
        for key, value in ours.items():
            if key == "securityContext":
                continue  # merged key by key: below
            if isinstance(value, list):
                assert theirs[key][: len(value)] == value, key
            else:
                assert theirs[key] == value, key
    driver = containers["driver"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in driver["env"]
    assert {"name": "creds", "mountPath": "/creds", "readOnly": True} in driver["volumeMounts"]
    # The override's keys over the operator's Pod Security `restricted` defaults.
    assert driver["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert driver["command"] == plain_head["spec"]["containers"][1]["command"]
    assert head["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "fsGroup": 1000,
    }
    assert [c["name"] for c in head["spec"]["initContainers"]] == ["fetch-credentials"]
    assert [v["name"] for v in head["spec"]["volumes"]][-1] == "creds"
    assert head["spec"]["volumes"][: len(plain_head["spec"]["volumes"])] == plain_head["spec"]["volumes"]
    assert head["metadata"]["labels"]["team"] == "rl"
    assert head["metadata"]["labels"][naming.JOB_NAME_LABEL] == "pod-template"
    assert head["metadata"]["annotations"] == {"example.com/owner": "rl-team"}
    assert head["spec"]["restartPolicy"] == "Never"
    policy = merged["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert policy["runtimeClassName"] == "nvidia"
    assert policy["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert {"name": "RAY_memory_monitor_refresh_ms", "value": "0"} in policy["containers"][0]["env"]
    generation = merged["spec"]["workerGroupSpecs"][1]["template"]
    assert generation == plain["spec"]["workerGroupSpecs"][1]["template"]  # no override: unchanged


def test_the_reserved_names_of_the_admission_rules_are_what_the_operator_renders() -> None:
    """The override rules (asyncgrpo_api) keep their own list of what the operator renders; this
    ties the two together, so a new operator volume, variable or port cannot slip past admission."""
    every_field = load("every-field")
    cluster = manifests.ray_cluster(every_field, 0)
    job_env = {v.name for v in every_field.spec.env} | {
        r.env for s in every_field.spec.secrets for r in s.keys
    }
    for template in templates(cluster):
        for volume in template["spec"]["volumes"]:
            assert volume["name"] in podtemplate.OPERATOR_VOLUMES
        for container in template["spec"]["containers"]:
            assert container["name"] in podtemplate.HEAD_CONTAINERS + podtemplate.WORKER_CONTAINERS
            for var in container.get("env", []):
                assert var["name"] in podtemplate.OPERATOR_ENV | job_env, var["name"]
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in ("checkpoints", "models", "data"):
                    assert mount["mountPath"] in podtemplate.OPERATOR_MOUNT_PATHS
    pinned = {
        naming.GCS_PORT, naming.DASHBOARD_PORT, naming.CLIENT_PORT, naming.METRICS_PORT,
        naming.NODE_MANAGER_PORT, naming.OBJECT_MANAGER_PORT, naming.DASHBOARD_AGENT_GRPC_PORT,
        naming.RUNTIME_ENV_AGENT_PORT, naming.DASHBOARD_AGENT_LISTEN_PORT, naming.PROGRESS_PORT,
    }  # fmt: skip
    assert pinned == podtemplate.RAY_PORTS
    assert range(naming.MIN_WORKER_PORT, naming.MAX_WORKER_PORT + 1) == podtemplate.RAY_WORKER_PORTS


def test_the_override_is_not_shared_between_renders() -> None:
    job = load("pod-template")
    first = manifests.ray_cluster(job, 0)
    first["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"][0]["image"] = "changed"
    again = manifests.ray_cluster(job, 0)
    assert again["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"][0]["image"] == "busybox:1.36"
    assert copy.deepcopy(job.spec.cluster.head.pod_template) == job.spec.cluster.head.pod_template


def _head_runs_as_root(doc: dict[str, Any]) -> None:
    _without_overrides(doc)
    doc["spec"]["cluster"]["head"]["podTemplate"] = {"spec": {"securityContext": {"runAsNonRoot": False}}}


def test_every_rendered_pod_meets_pod_security_restricted_unless_an_override_says_otherwise() -> None:
    job = load("pod-template", _without_overrides)
    cluster = manifests.ray_cluster(job, 0)["spec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for template in templates:
        assert template["spec"]["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for container in template["spec"]["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
    # An image that must run as root: the override replaces that key and keeps the others.
    root = manifests.ray_cluster(load("pod-template", _head_runs_as_root), 0)
    pod = root["spec"]["headGroupSpec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"}}
