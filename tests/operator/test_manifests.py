"""manifests.py: golden files for every example job, and the properties each RayCluster must have.

Regenerate the golden files after an intended change with
`UPDATE_GOLDEN=1 .venv/bin/pytest tests/operator/test_manifests.py` and review the diff.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api.rules import validate_manifest
from asyncgrpo_api.v1alpha1 import AsyncGRPOJob, podtemplate
from asyncgrpo_operator import manifests, naming, render
from asyncgrpo_operator.manifests import Owner

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.yaml"))
OWNER = Owner(name="ignored", uid="00000000-0000-0000-0000-000000000001")

JOBS = Path(__file__).resolve().parent / "jobs"
EVERY_FIELD: dict[str, Any] = yaml.safe_load((JOBS / "every-field.yaml").read_text())


def load(manifest: dict[str, Any]) -> AsyncGRPOJob:
    report = validate_manifest(manifest)
    assert report.job is not None, report.errors
    return report.job


GOLDEN_CASES = {path.stem: yaml.safe_load(path.read_text()) for path in sorted(JOBS.glob("*.yaml"))}
"""Golden inputs live next to the tests (frozen copies), so editing docs/examples never breaks them."""
CASES = GOLDEN_CASES | {f"example-{p.stem}": yaml.safe_load(p.read_text()) for p in EXAMPLES}
"""Every golden input and every documented example: the properties must hold for all of them."""


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_rendered_objects_match_the_golden_file(name: str) -> None:
    job = load(GOLDEN_CASES[name])
    text = render.to_yaml(render.objects(job, attempt=1, owner=OWNER))
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"run with UPDATE_GOLDEN=1 to create {golden}"
    assert text == golden.read_text()


def every_pod_template(cluster: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield cluster["spec"]["headGroupSpec"]["template"]
    for group in cluster["spec"]["workerGroupSpecs"]:
        yield group["template"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_object_and_pod_is_labelled_with_the_job(name: str) -> None:
    job = load(CASES[name])
    configmap, policy, cluster = manifests.objects(job, attempt=0, owner=OWNER)
    for obj in (configmap, policy, cluster):
        assert obj["metadata"]["labels"][naming.JOB_NAME_LABEL] == job.metadata.name
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == naming.MANAGER
        assert obj["metadata"]["ownerReferences"] == [manifests.owner_reference(OWNER)]
    for template in every_pod_template(cluster):
        assert template["metadata"]["labels"][naming.JOB_NAME_LABEL] == job.metadata.name
        assert template["metadata"]["labels"][naming.ATTEMPT_LABEL] == "0"


@pytest.mark.parametrize("name", sorted(CASES))
def test_pods_have_a_minimal_environment_and_no_token_unless_a_service_account_is_named(name: str) -> None:
    job = load(CASES[name])
    cluster = manifests.ray_cluster(job, 0)
    for template in every_pod_template(cluster):
        spec = template["spec"]
        assert spec["enableServiceLinks"] is False
        if job.spec.service_account_name is None:
            assert spec["automountServiceAccountToken"] is False
        else:
            assert spec["serviceAccountName"] == job.spec.service_account_name
            assert "automountServiceAccountToken" not in spec


@pytest.mark.parametrize("name", sorted(CASES))
def test_ray_in_every_container_reports_no_usage_stats(name: str) -> None:
    cluster = manifests.ray_cluster(load(CASES[name]), 0)
    ray_containers = {*podtemplate.HEAD_CONTAINERS, *podtemplate.WORKER_CONTAINERS}
    for template in every_pod_template(cluster):
        for container in template["spec"]["containers"]:
            if container["name"] in ray_containers:  # not a sidecar a podTemplate adds
                env = {e["name"]: e.get("value") for e in container["env"]}
                assert env["RAY_USAGE_STATS_ENABLED"] == "0", container["name"]


def test_a_job_that_sets_ray_usage_stats_keeps_its_own_value() -> None:
    manifest = json.loads(json.dumps(EVERY_FIELD))
    manifest["spec"]["env"].append({"name": "RAY_USAGE_STATS_ENABLED", "value": "1"})
    cluster = manifests.ray_cluster(load(manifest), 0)
    for template in every_pod_template(cluster):
        for container in template["spec"]["containers"]:
            values = [e.get("value") for e in container["env"] if e["name"] == "RAY_USAGE_STATS_ENABLED"]
            assert values == ["1"], container["name"]


# --- who may reach the job's Ray (issue 47, item 1) ------------------------------------------------

OPERATOR_PODS = manifests.OperatorPods(
    "asyncgrpo-system", {"app.kubernetes.io/name": "asyncgrpo-operator", "app.kubernetes.io/instance": "a"}
)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_ray_cluster_asks_for_the_token_of_the_jobs_secret(name: str) -> None:
    """KubeRay gives every Ray container (and its wait-gcs-ready init container) the Secret's token
    from `authOptions`; the driver container, which KubeRay does not know, gets it from the
    operator, to join the head's GCS and to guard its /progress with it."""
    job = load(CASES[name])
    secret = f"{job.metadata.name}-ray-token"
    cluster = manifests.ray_cluster(job, 0, OWNER)
    assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": secret}
    driver = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][1]
    env = {e["name"]: e for e in driver["env"]}
    assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": secret, "key": "auth_token"}}


def test_the_token_secret_is_the_jobs_immutable_and_under_the_key_kuberay_reads() -> None:
    secret = manifests.ray_token_secret("demo", "team", OWNER, "t0ken")
    assert (secret["kind"], secret["metadata"]["name"], secret["metadata"]["namespace"]) == (
        "Secret",
        "demo-ray-token",
        "team",
    )
    assert secret["stringData"] == {"auth_token": "t0ken"} and secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"] == [manifests.owner_reference(OWNER)]
    assert secret["metadata"]["labels"][naming.JOB_NAME_LABEL] == "demo"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_network_policy_admits_only_the_jobs_pods_and_the_operator_to_its_progress_port(
    name: str,
) -> None:
    job = load(CASES[name])
    _, policy, cluster = manifests.objects(job, 0, OWNER, operator=OPERATOR_PODS)
    spec = policy["spec"]
    assert policy["metadata"]["ownerReferences"] == [manifests.owner_reference(OWNER)]
    assert spec["policyTypes"] == ["Ingress"]
    selector = spec["podSelector"]["matchLabels"]
    for template in every_pod_template(cluster):  # every pod of the job, of every attempt
        assert selector.items() <= template["metadata"]["labels"].items()
    own, operator = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": selector}}]}  # any port: Ray's nodes
    assert operator == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "asyncgrpo-system"}},
                "podSelector": {"matchLabels": OPERATOR_PODS.labels},
            }
        ],
        "ports": [{"protocol": "TCP", "port": naming.PROGRESS_PORT}],
    }
    # An operator that is no pod (a local run) is admitted by nothing: only the job's pods are.
    alone = manifests.network_policy(job.metadata.name, job.metadata.namespace, OWNER, None)
    assert alone["spec"]["ingress"] == [own]


def test_the_head_runs_ray_in_container_zero_and_the_driver_beside_it_never_restarted() -> None:
    cluster = manifests.ray_cluster(load(EVERY_FIELD), 0)
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["restartPolicy"] == "Never"
    assert head["shareProcessNamespace"] is True  # the driver's ray.init looks for the raylet's process
    ray, driver = head["containers"]
    assert ray["name"] == naming.RAY_HEAD_CONTAINER and "command" not in ray
    assert driver["name"] == naming.DRIVER_CONTAINER
    script = driver["command"][-1]
    assert "exec python -m asyncgrpo_trainer --job-spec /etc/asyncgrpo/job.json" in script
    assert {"name": "job-spec", "mountPath": "/etc/asyncgrpo", "readOnly": True} in driver["volumeMounts"]
    assert cluster["metadata"]["annotations"][naming.RAY_DISABLE_HEAD_RESTART_ANNOTATION] == "true"
    assert {"name": "progress", "containerPort": 8090, "protocol": "TCP"} in ray["ports"]


def test_ray_ports_are_pinned_on_every_node() -> None:
    cluster = manifests.ray_cluster(load(EVERY_FIELD), 0)
    head_params = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert head_params["port"] == "6379"
    assert head_params["dashboard-port"] == "8265"
    assert head_params["ray-client-server-port"] == "10001"
    for params in [head_params] + [g["rayStartParams"] for g in cluster["spec"]["workerGroupSpecs"]]:
        for key in ("metrics-export-port", "node-manager-port", "object-manager-port", "min-worker-port"):
            assert params[key].isdigit()


def test_worker_groups_request_and_limit_gpus_on_the_gpu_pool() -> None:
    cluster = manifests.ray_cluster(load(EVERY_FIELD), 0)
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"policy", "generation"}
    policy = groups["policy"]
    assert (policy["replicas"], policy["minReplicas"], policy["maxReplicas"]) == (2, 2, 2)
    pod = policy["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == "4" and resources["limits"]["nvidia.com/gpu"] == "4"
    assert pod["nodeSelector"] == {"asyncgrpo.dev/pool": "gpu"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "podAntiAffinity" in pod["affinity"]


def test_an_elastic_generation_fleet_starts_at_replicas_within_kuberays_bounds() -> None:
    manifest = json.loads(json.dumps(EVERY_FIELD))
    bounds = {"replicas": 2, "minReplicas": 1, "maxReplicas": 3}
    manifest["spec"]["cluster"]["generationWorkers"].update(bounds)
    groups = {g["groupName"]: g for g in manifests.ray_cluster(load(manifest), 0)["spec"]["workerGroupSpecs"]}
    generation = groups["generation"]
    assert (generation["replicas"], generation["minReplicas"], generation["maxReplicas"]) == (2, 1, 3)


def test_a_pool_with_zero_replicas_has_no_worker_group() -> None:
    manifest = json.loads(json.dumps(EVERY_FIELD))
    manifest["spec"]["cluster"]["generationWorkers"]["replicas"] = 0
    manifest["spec"]["trainer"]["generation"] = {"colocated": True}
    cluster = manifests.ray_cluster(load(manifest), 0)
    assert [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]] == ["policy"]


def test_every_spec_field_reaches_the_pods() -> None:
    cluster = manifests.ray_cluster(load(EVERY_FIELD), 0)
    head = cluster["spec"]["headGroupSpec"]["template"]
    driver = head["spec"]["containers"][1]
    env = {e["name"]: e for e in driver["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert driver["envFrom"] == [{"secretRef": {"name": "all-of-wandb"}}]
    assert env["LOG_FORMAT"]["value"] == "json"
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "eth0" and env["NCCL_IB_HCA"]["value"] == "mlx5"
    # The driver's own requests and limits, apart from the Ray head's (a ResourceQuota on limits
    # refuses a pod with any container that has none).
    assert driver["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    assert head["spec"]["containers"][0]["resources"]["limits"] == {"memory": "16Gi"}
    assert "NCCL_IB_DISABLE" not in env
    spec = head["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["schedulerName"] == "kai-scheduler" and spec["priorityClassName"] == "high"
    assert head["metadata"]["labels"]["kai.scheduler/queue"] == "research"
    assert head["metadata"]["labels"]["team"] == "rl"
    assert head["metadata"]["annotations"] == {"example.com/owner": "rl-team"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["checkpoints"]["hostPath"] == {"path": "/mnt/ckpt", "type": "DirectoryOrCreate"}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert volumes["data"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    for template in every_pod_template(cluster):
        mounts = {m["mountPath"] for c in template["spec"]["containers"] for m in c.get("volumeMounts", [])}
        assert {"/checkpoints", "/models", "/data"} <= mounts


def test_a_kueue_job_is_its_own_workload_and_its_raycluster_is_not_queued_again() -> None:
    job = load(GOLDEN_CASES["gpu-vllm-megatron"])
    cluster = manifests.ray_cluster(job, 0, OWNER)
    assert "kueue.x-k8s.io/queue-name" not in cluster["metadata"]["labels"]
    (wl,) = [o for o in render.objects(job, attempt=0, owner=OWNER) if o["kind"] == "Workload"]
    assert wl["spec"]["queueName"] == "rl-team"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == OWNER.uid
    counts = {s["name"]: s["count"] for s in wl["spec"]["podSets"]}
    groups = {g["groupName"]: g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]}
    assert counts == {"head": 1, **groups}
    head = wl["spec"]["podSets"][0]["template"]
    assert head == cluster["spec"]["headGroupSpec"]["template"]  # Kueue counts exactly the pods' requests


def test_the_configmap_holds_the_validated_job_the_trainer_can_parse() -> None:
    job = load(EVERY_FIELD)
    configmap = manifests.spec_configmap(job)
    document = json.loads(configmap["data"][naming.JOB_SPEC_KEY])
    parsed = AsyncGRPOJob.model_validate(document)
    assert parsed.spec == job.spec
    assert document["metadata"] == {"name": "every-field", "namespace": "rl"}


def test_render_prints_the_objects_of_a_job_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(EVERY_FIELD))
    assert render.main([str(path), "--attempt", "2"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "NetworkPolicy", "RayCluster"]
    assert docs[2]["metadata"]["name"] == "every-field-2"


def test_render_rejects_an_invalid_job_with_the_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = json.loads(json.dumps(EVERY_FIELD))
    bad["spec"]["backoffLimit"] = -1
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert render.main([str(path)]) == 1
    assert "spec.backoffLimit" in capsys.readouterr().err


def test_the_object_stores_keys_reach_the_pods_only_as_secret_references() -> None:
    cluster = manifests.ray_cluster(load(EVERY_FIELD), attempt=1)
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e for c in head["containers"] for e in c.get("env", [])}

    def ref(key: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": "s3-keys", "key": key}}

    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == ref("access-key")
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == ref("secret-key")
    assert env["AWS_CA_BUNDLE"]["value"] == "/etc/asyncgrpo/object-store-ca/bundle.pem"
    assert {"name": "object-store-ca", "configMap": {"name": "s3-ca"}} in head["volumes"]
