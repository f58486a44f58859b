"""A job on the real node with real containers: the chart's operator as a pod, the job's head and
workers as containers of the CPU trainer image. Shared by tests/e2e/test_real_pods.py and
`make demo REAL_NODE=1` (tests/e2e/demo.py), so the demo shows what the tests check.

The images come from images/*.Dockerfile (tests/cluster/images.py builds them, cached by hash) and
are imported into the node's containerd: no registry, no pulls (`imagePullPolicy: Never`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.chart.helm import CHART, helm
from tests.cluster import node
from tests.cluster.cluster import LocalCluster
from tests.cluster.fixtures import TEST_NS_LABEL
from tests.cluster.images import Built
from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pod_ready, pods, wait_until
from tests.e2e.whole_path import tiny_job
from tests.webhook.cluster_harness import Kubectl

TRAINER_UID = 1000  # images/trainer.Dockerfile: USER 1000
SELECTOR_LABEL = "asyncgrpo.dev/real-pods-e2e"
"""The jobs namespace's label that the installation's webhook selects (its value: the release)."""
OPERATOR_READY_TIMEOUT = 300.0  # a 350 MB image's first container on 2 loaded cores
WEBHOOK_ROUTED_TIMEOUT = 120.0
DEMO_JOB = Path(__file__).resolve().parent / "demo-job.yaml"
COMPONENTS = ("head", "policy-worker", "generation-worker")


def placement(**extra: Any) -> dict[str, Any]:
    """A job group's placement on the real node: its label, a toleration of its taint, and one Ray
    CPU (KubeRay turns the CPU limit into `ray start --num-cpus=1`) on a small request, so three
    pods fit a 2-core node's allocatable CPU."""
    key, value = node.NODE_LABEL
    return {
        "nodeSelector": {key: value},
        "tolerations": [{**node.TAINT, "operator": "Equal"}],
        "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}},
        **extra,
    }


def import_images(
    cluster: LocalCluster, built: dict[str, Built], timed: Callable[..., None]
) -> dict[str, Built]:
    """The built images (`build_all`'s, by name) imported into the running node's containerd once
    per archive; returns `built`. `timed(what, seconds, **extra)` hears each import's time."""
    marks = cluster.paths.node / "imported"
    marks.mkdir(exist_ok=True)
    for image in built.values():
        mark = marks / image.archive.name
        if mark.exists():
            continue
        t0 = time.monotonic()
        cluster.import_image(image.archive)
        timed("image import", time.monotonic() - t0, image=image.ref, bytes=image.size)
        mark.touch()
    return built


@dataclass
class InClusterChart:
    """`helm install` of the chart with the operator and its webhook as a pod on the real node,
    watching one jobs namespace of its own."""

    cluster: LocalCluster
    helm_bin: Path
    operator_image: str
    name: str = "real"
    """Prefix of the release and namespace names (`real` for the tests, `demo` for `make demo`)."""
    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="asyncgrpo-real-pods-")))

    @property
    def release(self) -> str:
        return f"{self.name}-{self.suffix}"

    @property
    def namespace(self) -> str:
        return f"asyncgrpo-{self.name}-{self.suffix}"

    @property
    def jobs_ns(self) -> str:
        return f"t-{self.name}-{self.suffix}-jobs"

    @property
    def api(self) -> Api:
        return self.cluster.api

    @property
    def kubectl(self) -> Kubectl:
        binaries = Path(self.cluster.info()["binaries"]) / "bin"
        return Kubectl(binaries / "kubectl", self.cluster.kubeconfig, self.workdir / "kube-cache")

    def values(self) -> dict[str, Any]:
        """What a user of an air-gapped cluster sets: the imported image, never pulled, on the
        tainted node; the webhook and the operator limited to this installation's namespace."""
        repository, tag = self.operator_image.rsplit(":", 1)
        key, value = node.NODE_LABEL
        return {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "nodeSelector": {key: value},
            "tolerations": [{**node.TAINT, "operator": "Equal"}],
            "operator": {"watchNamespaces": [self.jobs_ns], "logFormat": "text"},
            # One webhook pod beside the reconciler's two: four operator processes starting at once
            # on the 2-core node slowed every pod's start, and one proves the Deployment serves.
            "webhook": {
                "namespaceSelector": {"matchLabels": {SELECTOR_LABEL: self.release}},
                "replicaCount": 1,
            },
        }

    def install(self) -> float:
        """Install and wait until the operator pod is Ready; returns the seconds that took."""
        crds = self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        if crds.returncode != 0:
            raise RuntimeError(f"kubectl apply of the CRDs failed: {crds.stderr}")
        labels = {SELECTOR_LABEL: self.release, TEST_NS_LABEL: "true"}
        self.api.create("/api/v1/namespaces", {"metadata": {"name": self.jobs_ns, "labels": labels}})
        values = self.workdir / "values.yaml"
        values.write_text(json.dumps(self.values()))
        t0 = time.monotonic()
        helm(
            "install",
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            "--create-namespace",
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--values",
            str(values),
            helm_bin=self.helm_bin,
        )
        self.wait_operator_ready()
        self.wait_webhook_answers()
        return time.monotonic() - t0

    def operator_pods(self) -> list[JSON]:
        return pods(self.api, self.namespace, f"app.kubernetes.io/instance={self.release}")

    def wait_operator_ready(self) -> JSON:
        def ready() -> JSON | None:
            found = [p for p in self.operator_pods() if pod_ready(p)]
            return found[0] if found else None

        try:
            return wait_until(ready, "the operator pod Ready", timeout=OPERATOR_READY_TIMEOUT, interval=2)
        except TimeoutError:
            raise RuntimeError(f"operator pod not Ready:\n{self.describe()}") from None

    def wait_webhook_answers(self) -> None:
        """Until the API server reaches the webhook through its Service: a Ready pod is not yet a
        routed one (the EndpointSlice controller and kube-proxy follow it, 10 s and more on 2
        loaded cores), and with failurePolicy Fail every job write is refused until then. A server
        dry-run of a valid job is admitted only once the webhook answers."""
        probe = tiny_job("webhook-reachable")

        def admitted() -> bool:
            return self.kubectl.apply(self.jobs_ns, probe, "--dry-run=server").returncode == 0

        try:
            wait_until(
                admitted,
                "the webhook reached through its Service",
                timeout=WEBHOOK_ROUTED_TIMEOUT,
                interval=2,
            )
        except TimeoutError:
            last = self.kubectl.apply(self.jobs_ns, probe, "--dry-run=server").stderr
            slices = self.kubectl("get", "endpointslices", "-n", self.namespace, "-o", "wide").stdout
            raise RuntimeError(f"the webhook never answered: {last}\n{slices}\n{self.describe()}") from None

    def describe(self) -> str:
        """The operator pods' status and log tails, for a failure message."""
        out = []
        for pod in self.operator_pods():
            name = pod["metadata"]["name"]
            status = pod.get("status", {})
            out.append(f"{name}: {status.get('phase')} {json.dumps(status.get('containerStatuses'))[-1500:]}")
            out.append(self.kubectl("logs", "-n", self.namespace, name, "--tail=40").stdout)
        return "\n".join(out)

    def uninstall(self) -> None:
        ns = self.jobs_ns
        jobs = self.kubectl("delete", "asyncgrpojobs", "--all", "-n", ns, "--wait=true", timeout=180)
        sys.stderr.write(jobs.stderr)
        helm(
            "uninstall",
            self.release,
            "--namespace",
            self.namespace,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            helm_bin=self.helm_bin,
        )
        for ns in (self.jobs_ns, self.namespace):
            try:
                self.api.delete(f"/api/v1/namespaces/{ns}")
            except ApiError as err:
                if err.status != 404:
                    raise
        shutil.rmtree(self.workdir, ignore_errors=True)


def real_job(
    name: str,
    *,
    max_steps: int | None = None,
    image: str,
    checkpoints: Path | None = None,
    demo: bool = False,
    job_file: Path = DEMO_JOB,
) -> JSON:
    """tiny_job (or, with `demo`, the job in `job_file`, by default the one `make demo` applies, with
    `max_steps` when given) on the real node: the CPU trainer image, never pulled, each group one
    Ray CPU; the RayCluster is kept after success so that the head's log can be read."""
    if demo:
        job: JSON = yaml.safe_load(job_file.read_text())
        job["metadata"]["name"] = name
        if max_steps is not None:
            job["spec"]["trainer"]["grpo"]["maxNumSteps"] = max_steps
    else:
        job = tiny_job(name) if max_steps is None else tiny_job(name, max_steps=max_steps)
    spec = job["spec"]
    spec["image"] = image
    spec["imagePullPolicy"] = "Never"
    # 2, not the demo's 1: the CRD is cluster-wide, and other checkouts sharing the cluster apply
    # theirs, where the minimum is 2.
    spec["progress"] = {**spec.get("progress", {}), "pollSeconds": 2}
    spec["cleanupPolicy"] = {"onSuccess": "KeepCluster"}
    spec["cluster"]["head"] = placement()
    spec["cluster"]["policyWorkers"] = placement(replicas=1, gpusPerReplica=0)
    spec["cluster"]["generationWorkers"] = placement(replicas=1, gpusPerReplica=0)
    if checkpoints is not None:
        spec["storage"]["checkpoints"]["hostPath"] = {"path": str(checkpoints), "type": "Directory"}
    return job


def checkpoint_dir(base: Path) -> Path:
    """The node's folder for a job's checkpoints, writable by the trainer image's uid (a hostPath
    folder the kubelet creates is root's, and the containers run as 1000)."""
    path = base / "checkpoints"
    path.mkdir()
    os.chown(path, TRAINER_UID, TRAINER_UID)
    return path


def job_pods(api: Api, namespace: str, job: str) -> dict[str, JSON]:
    """The job's live pods by component (head, policy-worker, generation-worker)."""
    found = pods(api, namespace, f"asyncgrpo.dev/job-name={job}")
    return {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p
        for p in found
        if not p["metadata"].get("deletionTimestamp")
    }


def running_on_the_node(api: Api, namespace: str, job: str) -> dict[str, JSON] | None:
    """The job's head and two workers once all three are Running, else None."""
    found = job_pods(api, namespace, job)
    running = [c for c in COMPONENTS if c in found and found[c]["status"].get("phase") == "Running"]
    return found if len(running) == len(COMPONENTS) else None
