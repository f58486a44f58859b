"""The whole path with real containers on the real node: no host process stands in for a pod.

`helm install` runs the operator image (images/operator.Dockerfile, imported into the node's
containerd) as a pod on real-node-0, and the API server calls its webhook through the webhook
Service's ClusterIP (kube-proxy's rules apply to host processes too). A CPU job then runs as a
KubeRay RayCluster whose head and two workers (policy, generation) are containers of the CPU
trainer image: `ray start` in each, the driver in the head's `driver` container, the workers
joining over the pod network and cluster DNS, the operator reading /progress from the head pod's
IP, checkpoints on a hostPath volume. tests/e2e/test_whole_path.py (kwok, driver on the host)
stays for what a real pod cannot show quickly; docs/operations/local-cluster.md lists both.

Needs root, the real node (tests/e2e/test_real_node.py) and the images (`make images`; cached).
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import NO_HELM, find_helm
from tests.cluster import node
from tests.cluster.cluster import LocalCluster
from tests.cluster.config import REAL_NODE_NAME
from tests.cluster.images import Built
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pod_ready, wait_until
from tests.e2e.real_pods import (
    DEMO_JOB,
    InClusterChart,
    checkpoint_dir,
    import_images,
    job_pods,
    real_job,
    running_on_the_node,
)
from tests.e2e.whole_path import AgjWatch, job_status, tiny_job, wait_with_watch
from tests.http_status import http_status

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.trainer, pytest.mark.images]

WEBHOOK_NAME = "validate.asyncgrpojobs.asyncgrpo.dev"
JOB_TIMEOUT = 1200.0  # three Ray nodes starting and training on 2 loaded cores
TIMINGS = Path(os.environ.get("ASYNCGRPO_REAL_TIMINGS", tempfile.gettempdir())) / "asyncgrpo-real-pods.jsonl"


def record(what: str, seconds: float, **extra: Any) -> None:
    """One timing line (for docs/benchmarks.md), also printed for the test's output."""
    line = {"what": what, "seconds": round(seconds, 1), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ"), **extra}
    print(json.dumps(line), file=sys.stderr)
    with TIMINGS.open("a") as fh:
        fh.write(json.dumps(line) + "\n")


@pytest.fixture(scope="module")
def real_node(local_cluster: LocalCluster) -> LocalCluster:
    """The real node on the session's control plane (tests/e2e/test_real_node.py's fixture)."""
    from tests.cluster.build import build_node  # noqa: PLC0415 - needs Go to hash

    if os.geteuid() != 0 or not node.BUSYBOX.is_file():
        pytest.fail("the real node needs root and `apt-get install busybox-static runc`")
    local_cluster.start_real_node(build_node())
    return local_cluster


@pytest.fixture(scope="module")
def images(real_node: LocalCluster, built_images: dict[str, Built]) -> dict[str, Built]:
    return import_images(real_node, built_images, record)


@pytest.fixture(scope="module")
def chart(real_node: LocalCluster, images: dict[str, Built]) -> Iterator[InClusterChart]:
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.fail(NO_HELM)
    installation = InClusterChart(real_node, helm_bin, images["operator"].ref)
    record("helm install until the operator pod is Ready", installation.install())
    try:
        yield installation
    finally:
        sys.stderr.write(f"\n--- operator pods ---\n{installation.describe()}\n")
        installation.uninstall()


@pytest.mark.budget(400, "its module fixture imports both images into the node and runs the chart as a pod")
def test_the_operator_runs_as_a_pod_on_the_real_node_and_the_api_server_calls_its_webhook_service(
    chart: InClusterChart,
) -> None:
    ready = [p for p in chart.operator_pods() if pod_ready(p)]  # the chart runs two replicas
    assert ready
    for pod in ready:
        assert pod["spec"]["nodeName"] == REAL_NODE_NAME
        (container,) = pod["status"]["containerStatuses"]
        assert container["image"].endswith(chart.operator_image.split("/", 1)[1])
    webhooks = chart.api.get("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations")
    mine = [
        hook
        for config in webhooks["items"]
        if config["metadata"]["name"].startswith(chart.release)
        for hook in config["webhooks"]
    ]
    assert mine and all("service" in hook["clientConfig"] for hook in mine), mine
    assert all("url" not in hook["clientConfig"] for hook in mine)
    # A batch (8 prompts x 8 samples) that micro-batches of 5 cannot split: only the webhook knows.
    bad = tiny_job("bad-batch", policy={"trainMicroBatchSize": 5})
    outcome = chart.kubectl.apply(chart.jobs_ns, bad)
    assert outcome.returncode != 0
    assert f'admission webhook "{WEBHOOK_NAME}" denied the request' in outcome.stderr, outcome.stderr
    assert "spec.trainer.policy.trainMicroBatchSize" in outcome.stderr
    good = real_job("admitted", max_steps=2, image="ghcr.io/asyncgrpo/trainer:0.1.0-cpu")
    outcome = chart.kubectl(
        "create", "--dry-run=server", "-n", chart.jobs_ns, "-f", "-", stdin=json.dumps(good)
    )
    assert outcome.returncode == 0, outcome.stderr


DEMO_STEPS = 150  # the demo's: held-out accuracy 0 -> 1.0 by step 80 (docs/benchmarks.md)
FAULT_STEPS = 400  # the demo's job runs about 3 steps/s here: minutes left after the first checkpoint


def run_real_job(chart: InClusterChart, job: JSON, *, what: str) -> tuple[AgjWatch, JSON]:
    """kubectl apply the job; wait (watching `kubectl get agj`) until it is terminal."""
    ns, name = chart.jobs_ns, job["metadata"]["name"]
    t0 = time.monotonic()
    outcome = chart.kubectl.apply(ns, job)
    assert outcome.returncode == 0, outcome.stderr
    watch = AgjWatch(chart.kubectl, ns, name, out=sys.stderr, every=3.0)

    def all_running() -> dict[str, JSON] | None:
        watch.tick()
        return running_on_the_node(chart.api, ns, name)

    running = wait_until(all_running, "head and workers Running", timeout=JOB_TIMEOUT, interval=2)
    record(f"{what}: kubectl apply until head and 2 workers Running", time.monotonic() - t0)
    assert {p["spec"]["nodeName"] for p in running.values()} == {REAL_NODE_NAME}
    wait_with_watch(
        watch,
        lambda: job_status(chart.api, ns, name).get("phase") in ("Succeeded", "Failed"),
        f"{name} Succeeded or Failed",
        timeout=JOB_TIMEOUT,
        interval=2,
    )
    record(f"{what}: kubectl apply until {job_status(chart.api, ns, name)['phase']}", time.monotonic() - t0)
    return watch, running


def head_log(chart: InClusterChart, pod: JSON) -> str:
    done = chart.kubectl("logs", "-n", chart.jobs_ns, pod["metadata"]["name"], "-c", "driver")
    return done.stdout


@pytest.mark.budget(300, "the demo job trained in a Ray head and two worker pods of the trainer image")
def test_a_cpu_job_trains_across_real_pods_to_succeeded_with_held_out_accuracy(
    chart: InClusterChart, images: dict[str, Built], tmp_path: Path
) -> None:
    """The demo job in real pods, with Ray's token authentication on: the driver and workers join
    the head with the job's token, the operator reads /progress with it, and the head's dashboard
    refuses anyone without it."""
    ns, name = chart.jobs_ns, "real-demo"
    checkpoints = checkpoint_dir(tmp_path)
    job = real_job(
        name, max_steps=DEMO_STEPS, checkpoints=checkpoints, image=images["trainer-cpu"].ref, demo=True
    )
    watch, running = run_real_job(chart, job, what="the demo job (150 steps)")
    status = job_status(chart.api, ns, name)
    assert (status["phase"], status["reason"], status["restarts"]) == ("Succeeded", "DriverSucceeded", 0), (
        status
    )
    progress = status["progress"]
    assert progress["step"] == DEMO_STEPS and progress["lastCheckpointStep"] == DEMO_STEPS
    assert progress["validationAccuracy"] >= 0.5, progress  # the demo's job learns the task
    # kubectl get showed the steps advance: the operator read /progress at the head pod's IP.
    steps = watch.steps()
    assert len(set(steps)) >= 2 and steps == sorted(steps), [r.line for r in watch.rows]
    assert any(r.phase == "Running" and r.step for r in watch.rows)
    head = chart.api.get(f"/api/v1/namespaces/{ns}/pods/{running['head']['metadata']['name']}")
    log = head_log(chart, head)
    assert '"step": 1' in log or '"step":1' in log, log[-2000:]
    assert any(checkpoints.iterdir()), "no checkpoint on the hostPath volume"
    # The job trained with Ray's token authentication on (issue 47, item 1), and the head (kept:
    # KeepCluster) refuses Ray's job API to a caller outside the job without the token (here, this
    # host: the bridge plugin enforces no NetworkPolicy, so only the token stands in the way); the
    # token a user with access reads from the job's Secret opens it.
    jobs_api = f"http://{head['status']['podIP']}:8265/api/jobs/"
    secret = chart.api.get(f"/api/v1/namespaces/{ns}/secrets/{name}-ray-token")
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    assert http_status(jobs_api) == 401
    assert http_status(jobs_api, f"Bearer {token[::-1]}") == 403
    assert http_status(jobs_api, f"Bearer {token}") == 200
    print(
        f"validation accuracy {progress['validationAccuracy']}; rows:\n"
        + "\n".join(r.line for r in watch.rows)
    )


@pytest.mark.budget(600, "two attempts in real pods: the one proof a lost pod resumes from its checkpoint")
def test_a_deleted_worker_pod_is_survived_and_the_retry_resumes_from_the_checkpoint(
    chart: InClusterChart, images: dict[str, Built], tmp_path: Path
) -> None:
    ns, name = chart.jobs_ns, "real-fault"
    checkpoints = checkpoint_dir(tmp_path)
    job = real_job(
        name, max_steps=FAULT_STEPS, checkpoints=checkpoints, image=images["trainer-cpu"].ref, demo=True
    )
    outcome = chart.kubectl.apply(ns, job)
    assert outcome.returncode == 0, outcome.stderr
    watch = AgjWatch(chart.kubectl, ns, name, out=sys.stderr, every=3.0)

    def checkpointed() -> bool:
        progress = job_status(chart.api, ns, name).get("progress") or {}
        return (progress.get("lastCheckpointStep") or 0) >= 25  # the demo's job: every 25 steps

    wait_with_watch(watch, checkpointed, "a checkpoint of step 25", timeout=JOB_TIMEOUT, interval=1)
    assert job_status(chart.api, ns, name)["phase"] == "Running"
    steps_before = (job_status(chart.api, ns, name).get("progress") or {}).get("step")
    victim = job_pods(chart.api, ns, name)["policy-worker"]["metadata"]["name"]
    # A worker lost (a node failure, an OOM kill): a 1 s grace period. A graceful deletion keeps
    # the Ray worker up for its terminationGracePeriodSeconds while the driver runs (the preStop
    # hook that lets a preempted driver checkpoint), and this short job would finish first.
    deleted = chart.kubectl("delete", "pod", "-n", ns, victim, "--wait=false", "--grace-period=1")
    assert deleted.returncode == 0, deleted.stderr
    t0 = time.monotonic()
    wait_with_watch(
        watch,
        lambda: job_status(chart.api, ns, name).get("phase") in ("Succeeded", "Failed"),
        f"{name} Succeeded or Failed",
        timeout=JOB_TIMEOUT,
        interval=2,
    )
    record("fault: worker pod deleted until Succeeded", time.monotonic() - t0)
    status = job_status(chart.api, ns, name)
    assert status["phase"] == "Succeeded" and status["restarts"] >= 1, status
    assert status["progress"]["step"] == FAULT_STEPS
    head = job_pods(chart.api, ns, name)["head"]
    assert head["metadata"]["labels"]["asyncgrpo.dev/attempt"] == str(status["attempt"])
    log = head_log(chart, head)
    resumed = re.search(r"resuming from the checkpoint of step (\d+)", log)
    assert resumed and 25 <= int(resumed[1]) < FAULT_STEPS, log[-3000:]
    record("fault: the retry resumed", 0.0, step=int(resumed[1]), deleted_after=steps_before)
    rows = "\n".join(r.line for r in watch.rows)
    print(f"kubectl get agj:\n{rows}")


DRIVER_MEMORY_LIMIT = "128Mi"  # the driver's imports alone reach ~560 MB resident


def test_a_driver_over_its_memory_limit_is_oom_killed_and_the_job_says_so(
    chart: InClusterChart, images: dict[str, Built]
) -> None:
    """The kernel, not a fake, kills the driver container at its cgroup's memory limit; the kubelet
    reports OOMKilled, and the operator's status names it and the field that bounds it."""
    ns, name = chart.jobs_ns, "real-oom"
    job = real_job(name, max_steps=DEMO_STEPS, image=images["trainer-cpu"].ref, demo=True)
    job["spec"]["backoffLimit"] = 0
    job["spec"]["cluster"]["head"]["driverResources"] = {"limits": {"memory": DRIVER_MEMORY_LIMIT}}
    outcome = chart.kubectl.apply(ns, job)
    assert outcome.returncode == 0, outcome.stderr
    watch = AgjWatch(chart.kubectl, ns, name, out=sys.stderr, every=3.0)
    t0 = time.monotonic()
    wait_with_watch(
        watch,
        lambda: job_status(chart.api, ns, name).get("phase") == "Failed",
        f"{name} Failed",
        timeout=JOB_TIMEOUT,
        interval=2,
    )
    record("fault: the driver over its memory limit until Failed", time.monotonic() - t0)
    status = job_status(chart.api, ns, name)
    assert status["reason"] == "BackoffLimitExceeded", status
    assert "DriverKilled: the driver container was OOMKilled" in status["message"], status
    fix = f"over its memory limit {DRIVER_MEMORY_LIMIT}; raise spec.cluster.head.driverResources"
    assert fix in status["message"], status
    head = job_pods(chart.api, ns, name)["head"]
    driver = next(c for c in head["status"]["containerStatuses"] if c["name"] == "driver")
    assert driver["state"]["terminated"]["reason"] == "OOMKilled", driver
    assert driver["state"]["terminated"]["exitCode"] == 137, driver


def on_a_pvc(job: JSON) -> JSON:
    """The job with its checkpoints on a PVC: Pod Security `baseline` and `restricted` refuse
    hostPath volumes, whoever renders them."""
    job["spec"]["storage"]["checkpoints"] = {"pvc": {"claimName": "checkpoints"}, "mountPath": "/checkpoints"}
    return job


@pytest.mark.parametrize("checkpoints", ["pvc", "hostPath"])
def test_pod_security_restricted_admits_the_pods_as_rendered_and_refuses_only_a_hostpath(
    kube_api: Api, namespace: str, checkpoints: str
) -> None:
    from asyncgrpo_api.rules import validate_manifest  # noqa: PLC0415
    from asyncgrpo_operator import manifests  # noqa: PLC0415

    kube_api.merge_patch(
        f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    job = yaml.safe_load(DEMO_JOB.read_text())  # checkpoints on a hostPath
    if checkpoints == "pvc":
        job = on_a_pvc(job)
    report = validate_manifest(job)
    assert report.job is not None, report.errors
    cluster = manifests.ray_cluster(report.job, 0)["spec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for i, template in enumerate(templates):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}"}, "spec": template["spec"]}
        try:
            kube_api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, query={"dryRun": "All"})
            refused = ""
        except ApiError as err:
            refused = str(err)
        if checkpoints == "pvc":
            assert not refused, refused
        else:
            assert 'volume "checkpoints" uses restricted volume type "hostPath"' in refused, refused
            for field_ in ("allowPrivilegeEscalation", "capabilities", "runAsNonRoot", "seccompProfile"):
                assert field_ not in refused, refused
