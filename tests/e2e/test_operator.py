"""The operator end to end, on the local control plane with the real KubeRay operator and kwok.

The operator runs as a subprocess (`python -m asyncgrpo_operator --namespace <test ns>`), exactly
as it runs in its image, against the fixture's kubeconfig. kwok runs no containers, so the tests
play the kubelet's part for the driver: they end the driver container by writing the head pod's
container status (the Ray head container keeps running, as it does in a real pod), or fail the
whole head pod with kwok's fault stage. The driver's /progress is a real HTTP server in the test
process; the operator is pointed at it with its own setting (ASYNCGRPO_PROGRESS_URL_TEMPLATE),
as a job's author cannot do.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncgrpo_api import exitcodes
from asyncgrpo_api.rules import validate_manifest
from tests.cluster import faults
from tests.cluster.cluster import ClusterError, LocalCluster
from tests.cluster.rest import JSON, Api, ApiError, condition
from tests.cluster.samples import pods, raycluster_path, wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "asyncgrpo.dev_asyncgrpojobs.yaml"
JOBS = "/apis/asyncgrpo.dev/v1alpha1/namespaces/{ns}/asyncgrpojobs"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def asyncgrpo_crd(local_cluster: LocalCluster, kube_api: Api) -> JSON:
    """The project's generated CRD, server-side applied and Established."""
    doc: JSON = yaml.safe_load(CRD_FILE.read_text())
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}"
    kube_api.apply(path, json.dumps(doc))

    def established() -> JSON | None:
        crd = kube_api.get(path)
        c = condition(crd, "Established")
        return crd if c is not None and c["status"] == "True" else None

    return wait_until(established, "AsyncGRPOJob CRD Established")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OperatorProcess:
    """`python -m asyncgrpo_operator` watching one namespace; logs go to a file. `progress` is
    where it reads the drivers' /progress (the test process plays every driver)."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log: Path,
        env: dict[str, str] | None = None,
        *,
        progress: ProgressServer | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log = log
        self.env = dict(env or {})
        if progress is not None:
            self.env.setdefault("ASYNCGRPO_PROGRESS_URL_TEMPLATE", progress.template)
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"

    def start(self) -> None:
        # Self-signed mode writes a throwaway certificate folder into the temp directory: the one
        # next to the log (the test's tmp_path), not /tmp, where nothing would remove it.
        tmp = self.log.parent / f"{self.log.stem}-tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            TMPDIR=str(tmp),
            KUBECONFIG=str(self.kubeconfig),
            ASYNCGRPO_WEBHOOK_SELF_SIGNED="1",
            ASYNCGRPO_WEBHOOK_ADDR="127.0.0.1",
            ASYNCGRPO_WEBHOOK_PORT=str(free_port()),
            ASYNCGRPO_RESYNC_SECONDS="5",
        )
        env.update(self.env)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "asyncgrpo_operator",
                    "--namespace",
                    self.namespace,
                    "--liveness",
                    self.liveness,
                    "--verbose",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def wait_live(self, timeout: float = 120) -> None:
        """Until the operator's liveness endpoint answers: started and serving."""

        def answers() -> bool | None:
            try:
                with urllib.request.urlopen(self.liveness, timeout=2):
                    return True
            except OSError:
                return None

        wait_until(answers, "operator liveness", timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no chance to finish a write (the crash case)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 60) -> str:
        return (
            "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""
        )


@pytest.fixture
def operator(
    kubeconfig: Path, namespace: str, asyncgrpo_crd: JSON, tmp_path: Path, driver_progress: ProgressServer
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log", progress=driver_progress)
    op.start()
    yield op
    op.stop()
    # Captured teardown output is shown only when the test fails.
    sys.stderr.write(f"\n--- operator log ({op.log}) ---\n{op.tail()}\n")


class ProgressServer:
    """The drivers' /progress endpoints, served from the test process at
    /progress/<namespace>/<job>: what the operator reads with `template` as its URL template.

    Every job gets `doc` unless `docs` has one for it; a job in `routes` is forwarded to that URL
    (a driver run as a local process, tests/e2e/whole_path.py), with the request's Authorization
    header, as a pod network carries it; a job in `hostile` is answered as a hostile head would:
    "hang" (the connection accepted, no answer for a minute) or "flood" (an endless body). `hits`
    records every path asked, `authorization` the last Authorization header each job's read
    carried. A POST to /drain/<namespace>/<job> (the operator's drain URL, drain.py) is recorded in
    `drains`, with its Authorization header, and answered as the trainer's driver answers it.
    """

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"step": 0, "maxSteps": 20, "policyVersion": 0, "state": "starting"}
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.routes: dict[tuple[str, str], str] = {}
        self.hostile: dict[tuple[str, str], str] = {}
        self.hits: list[str] = []
        self.authorization: dict[tuple[str, str], str | None] = {}
        self.drains: dict[tuple[str, str], list[tuple[str, str | None]]] = {}
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if len(parts) != 3 or parts[0] != "drain":
                    self.send_error(404)
                    return
                sent = (str(body.get("worker")), self.headers.get("Authorization"))
                server_self.drains.setdefault((parts[1], parts[2]), []).append(sent)
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                server_self.hits.append(self.path)
                parts = self.path.strip("/").split("/")
                if len(parts) == 3:
                    server_self.authorization[(parts[1], parts[2])] = self.headers.get("Authorization")
                behaviour = server_self.hostile.get((parts[1], parts[2])) if len(parts) == 3 else None
                if behaviour == "hang":
                    time.sleep(60)
                    return
                if behaviour == "flood":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    with contextlib.suppress(OSError):  # until the reader hangs up
                        for _ in range(16384):
                            self.wfile.write(b" " * 65536)
                    return
                status, body = server_self.answer(self.path, self.headers.get("Authorization"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.template = self.base + "/progress/{namespace}/{job}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, authorization: str | None) -> tuple[int, bytes]:
        parts = path.strip("/").split("/")
        key = (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "progress" else None
        upstream = self.routes.get(key) if key is not None else None
        if upstream is not None:
            request = urllib.request.Request(upstream)
            if authorization is not None:
                request.add_header("Authorization", authorization)
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    return int(response.status), bytes(response.read())
            except urllib.error.HTTPError as err:  # the driver's refusal, passed on as it came
                return err.code, bytes(err.read())
            except OSError as exc:
                return 502, json.dumps({"error": str(exc)}).encode()
        doc = self.docs.get(key, self.doc) if key is not None else self.doc
        return 200, json.dumps(doc).encode()

    def url_of(self, namespace: str, job: str) -> str:
        """The URL the operator reads for one job."""
        return f"{self.base}/progress/{namespace}/{job}"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def driver_progress() -> Iterator[ProgressServer]:
    server = ProgressServer()
    yield server
    server.close()


# --- the job and helpers --------------------------------------------------------------------


def job_manifest(name: str, **spec: Any) -> JSON:
    """A small job: head on the CPU node, one 1-GPU worker per pool on the tainted GPU pool."""
    gpu_pool = {
        "replicas": 1,
        "gpusPerReplica": 1,
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "nodeSelector": {"asyncgrpo.dev/pool": "gpu"},
        "tolerations": [GPU_TOLERATION],
    }
    manifest: JSON = {
        "apiVersion": "asyncgrpo.dev/v1alpha1",
        "kind": "AsyncGRPOJob",
        "metadata": {"name": name},
        "spec": {
            "image": "rayproject/ray:2.60.0",
            "backoffLimit": 2,
            "progress": {"stallAfterSeconds": 30, "pollSeconds": 2},
            "storage": {"checkpoints": {"emptyDir": {}, "mountPath": "/checkpoints"}},
            "cluster": {
                "rayVersion": "2.60",
                "head": {
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                    "nodeSelector": {"asyncgrpo.dev/pool": "cpu"},
                },
                "policyWorkers": copy.deepcopy(gpu_pool),
                "generationWorkers": copy.deepcopy(gpu_pool),
            },
            "trainer": {
                "grpo": {"numPromptsPerStep": 8, "numGenerationsPerPrompt": 4, "maxNumSteps": 20},
                "policy": {"trainMicroBatchSize": 4},
            },
        },
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(manifest["spec"].get(key), dict):
            manifest["spec"][key] = _merge(manifest["spec"][key], value)
        else:
            manifest["spec"][key] = value
    report = validate_manifest(manifest)
    assert report.ok, [str(e) for e in report.errors]
    return manifest


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def create_job(api: Api, ns: str, manifest: JSON) -> JSON:
    return api.create(JOBS.format(ns=ns), manifest)


def get_job(api: Api, ns: str, name: str) -> JSON:
    return api.get(f"{JOBS.format(ns=ns)}/{name}")


def wait_phase(
    api: Api, ns: str, name: str, phase: str, reason: str | None = None, *, timeout: float = 60
) -> JSON:
    def reached() -> JSON | None:
        status = get_job(api, ns, name).get("status") or {}
        if status.get("phase") == phase and (reason is None or status.get("reason") == reason):
            return status
        return None

    try:
        return wait_until(reached, f"{name} {phase}{'/' + reason if reason else ''}", timeout=timeout)
    except TimeoutError as exc:
        status = get_job(api, ns, name).get("status") or {}
        raise AssertionError(f"{exc}; status is {json.dumps(status, indent=1)}") from exc


def rayclusters(api: Api, ns: str, job: str) -> list[JSON]:
    items: list[JSON] = api.get(raycluster_path(ns), labelSelector=f"asyncgrpo.dev/job-name={job}").get(
        "items", []
    )
    return items


def live_rayclusters(api: Api, ns: str, job: str) -> list[str]:
    return sorted(
        rc["metadata"]["name"]
        for rc in rayclusters(api, ns, job)
        if not rc["metadata"].get("deletionTimestamp")
    )


def suspended_in_place(api: Api, ns: str, job: str) -> list[str]:
    """The job's live RayClusters with spec.suspend true: a suspended job keeps its RayCluster
    (KubeRay deletes the pods) and resumes it."""
    return sorted(
        rc["metadata"]["name"]
        for rc in rayclusters(api, ns, job)
        if not rc["metadata"].get("deletionTimestamp") and rc["spec"].get("suspend") is True
    )


def head_pod(api: Api, ns: str, cluster: str) -> JSON:
    found = wait_until(
        lambda: [
            p
            for p in pods(api, ns, f"ray.io/cluster={cluster},ray.io/node-type=head")
            if not p["metadata"].get("deletionTimestamp")
        ],
        f"head pod of {cluster}",
    )
    return found[0]


def end_driver(api: Api, ns: str, pod: JSON, exit_code: int, message: str = "") -> None:
    """Play the kubelet: the driver container terminated, the Ray head container still runs."""
    statuses = []
    for current in pod["status"]["containerStatuses"]:
        status = dict(current)
        if status["name"] == "driver":
            status["ready"] = False
            status["started"] = False
            status["state"] = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                    "message": message,
                    "startedAt": status["state"].get("running", {}).get("startedAt"),
                    "finishedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            }
        statuses.append(status)
    path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status"
    api.merge_patch(path, {"status": {"containerStatuses": statuses}})


def events(api: Api, ns: str, name: str) -> list[JSON]:
    items: list[JSON] = api.get(
        f"/api/v1/namespaces/{ns}/events", fieldSelector=f"involvedObject.name={name}"
    ).get("items", [])
    return items


def event_reasons(api: Api, ns: str, name: str) -> set[str]:
    return {e["reason"] for e in events(api, ns, name)}


def run_until_running(api: Api, ns: str, name: str, progress: ProgressServer) -> JSON:
    progress.doc = {
        "step": 3,
        "maxSteps": 20,
        "policyVersion": 3,
        "rewardMean": 0.25,
        "meanStaleness": 0.5,
        "state": "running",
    }
    return wait_phase(api, ns, name, "Running", timeout=90)


def gone(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    wait_until(lambda: check() or None, what, timeout=timeout)


# --- the scenarios -----------------------------------------------------------------------------


def test_job_runs_on_the_gpu_pool_and_succeeds_when_the_driver_exits_zero(
    kube_api: Api,
    local_cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    create_job(kube_api, namespace, job_manifest("happy"))

    rc = wait_until(lambda: rayclusters(kube_api, namespace, "happy"), "RayCluster happy-0")[0]
    assert rc["metadata"]["name"] == "happy-0"
    owner = rc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("AsyncGRPOJob", "happy", True)
    assert [g["groupName"] for g in rc["spec"]["workerGroupSpecs"]] == ["policy", "generation"]

    status = run_until_running(kube_api, namespace, "happy", driver_progress)
    assert status["rayClusterName"] == "happy-0"
    workers = pods(kube_api, namespace, "ray.io/cluster=happy-0,ray.io/node-type=worker")
    assert {p["metadata"]["labels"]["ray.io/group"] for p in workers} == {"policy", "generation"}
    assert all(p["spec"]["nodeName"].startswith("kwok-gpu-") for p in workers)
    assert head_pod(kube_api, namespace, "happy-0")["spec"]["nodeName"].startswith("kwok-cpu-")

    def progress_copied() -> JSON | None:
        progress = (get_job(kube_api, namespace, "happy").get("status") or {}).get("progress") or {}
        return progress if progress.get("step") == 3 else None

    progress = wait_until(progress_copied, "status.progress.step 3", timeout=30)
    assert (progress["rewardMean"], progress["meanStaleness"], progress["maxSteps"]) == (0.25, 0.5, 20)
    table = local_cluster.kubectl("get", "agj", "happy", "-n", namespace, "-o", "wide")
    assert "Running" in table and "DriverRunning" in table
    assert table.splitlines()[1].split()[2] == "3"  # STEP column

    head = head_pod(kube_api, namespace, "happy-0")["metadata"]["name"]
    assert status["headPod"] == head
    assert status["driverLogs"] == f"kubectl logs -n {namespace} {head} -c driver"
    driver_progress.doc = {**driver_progress.doc, "step": 20, "state": "succeeded"}
    end_driver(kube_api, namespace, head_pod(kube_api, namespace, "happy-0"), 0)
    # As for a batch/v1 Job or a Kubeflow TrainJob, with the real kubectl:
    local_cluster.kubectl("wait", "--for=condition=Complete", "agj/happy", "-n", namespace, "--timeout=60s")
    done = wait_phase(kube_api, namespace, "happy", "Succeeded", "DriverSucceeded")
    assert done["completionTime"]
    gone(lambda: not live_rayclusters(kube_api, namespace, "happy"), "RayCluster deleted (onSuccess)")
    conditions = {c["type"]: c for c in done["conditions"]}
    assert conditions["Complete"]["status"] == "True" and "Failed" not in conditions
    assert conditions["Running"]["status"] == "False"
    assert "PodsReady" not in conditions
    # The events follow the status write that announced them (they are posted after the pass's
    # actions), so the last of them may still be on its way.
    told = {"CreatedRayCluster", "AllPodsScheduled", "AllPodsReady", "DriverRunning", "DriverSucceeded"}
    wait_until(
        lambda: told <= event_reasons(kube_api, namespace, "happy") or None, f"events {told}", timeout=15
    )


def test_unschedulable_gpus_are_pending_with_the_schedulers_reason_then_deadline_exceeded(
    kube_api: Api,
    local_cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    manifest = job_manifest(
        "greedy",
        startupDeadlineSeconds=20,
        cluster={"policyWorkers": {"gpusPerReplica": 16}},  # GPU nodes have 8
        trainer={"policy": {"trainMicroBatchSize": 2}},
    )
    create_job(kube_api, namespace, manifest)

    pending = wait_phase(kube_api, namespace, "greedy", "Pending", "Unschedulable", timeout=60)
    assert "nvidia.com/gpu" in pending["message"]
    table = local_cluster.kubectl("get", "agj", "greedy", "-n", namespace, "-o", "wide")
    assert "Pending" in table and "Unschedulable" in table

    failed = wait_phase(kube_api, namespace, "greedy", "Failed", "DeadlineExceeded", timeout=60)
    assert "startupDeadlineSeconds" in failed["message"] and "nvidia.com/gpu" in failed["message"]
    assert failed["restarts"] == 0

    def warned() -> set[str] | None:  # Events follow the status write they report
        reasons = {e["reason"] for e in events(kube_api, namespace, "greedy") if e["type"] == "Warning"}
        return reasons if {"Unschedulable", "DeadlineExceeded"} <= reasons else None

    wait_until(warned, "Warning events Unschedulable and DeadlineExceeded", timeout=10)


def test_head_pod_failure_restarts_with_a_new_raycluster(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(kube_api, namespace, job_manifest("flaky"))
    run_until_running(kube_api, namespace, "flaky", driver_progress)
    faults.fail_pod(
        kube_api, namespace, head_pod(kube_api, namespace, "flaky-0")["metadata"]["name"], exit_code=137
    )

    # Restarting lasts only until the new attempt runs (about a second on kwok): assert on what stays.
    def restarted() -> JSON | None:
        status = get_job(kube_api, namespace, "flaky").get("status") or {}
        return status if status.get("restarts") == 1 and status.get("phase") == "Running" else None

    running = wait_until(restarted, "flaky running again after one restart", timeout=90)
    assert (running["attempt"], running["rayClusterName"]) == (1, "flaky-1")
    gone(lambda: live_rayclusters(kube_api, namespace, "flaky") == ["flaky-1"], "only flaky-1 left")
    restarting = {c["type"]: c for c in running["conditions"]}["Restarting"]
    assert (restarting["status"], restarting["reason"]) == ("False", "Restarted")
    story = [(e["type"], e["reason"], e["message"]) for e in events(kube_api, namespace, "flaky")]
    lost = [m for kind, reason, m in story if reason == "HeadPodLost" and kind == "Warning"]
    assert lost and "Running -> Restarting" in lost[0], story


def test_a_driver_exit_on_a_head_pod_kuberay_deletes_at_once_still_decides_the_attempt(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    """The whole head pod ends with the driver's code 0; KubeRay deletes such a pod immediately, so
    the operator may only ever see it in the watch event: the exit is remembered from there."""
    create_job(kube_api, namespace, job_manifest("brisk"))
    run_until_running(kube_api, namespace, "brisk", driver_progress)
    head = head_pod(kube_api, namespace, "brisk-0")["metadata"]["name"]
    faults.fail_pod(kube_api, namespace, head, exit_code=0, reason="Completed", message="done")

    done = wait_phase(kube_api, namespace, "brisk", "Succeeded", "DriverSucceeded")
    assert done["restarts"] == 0


def test_exhausted_backoff_limit_fails_with_the_reason(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(kube_api, namespace, job_manifest("fragile", backoffLimit=0))
    run_until_running(kube_api, namespace, "fragile", driver_progress)
    end_driver(kube_api, namespace, head_pod(kube_api, namespace, "fragile-0"), 137)

    failed = wait_phase(kube_api, namespace, "fragile", "Failed", "BackoffLimitExceeded")
    assert "DriverKilled" in failed["message"] and "SIGKILL" in failed["message"]
    assert failed["restarts"] == 0
    time.sleep(3)
    assert live_rayclusters(kube_api, namespace, "fragile") == ["fragile-0"]  # onFailure: KeepCluster


def test_training_error_fails_at_once_and_is_not_retried(
    kube_api: Api,
    local_cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    driver_progress: ProgressServer,
) -> None:
    create_job(kube_api, namespace, job_manifest("buggy"))
    run_until_running(kube_api, namespace, "buggy", driver_progress)
    end_driver(kube_api, namespace, head_pod(kube_api, namespace, "buggy-0"), 1, "ValueError: loss is nan")

    local_cluster.kubectl("wait", "--for=condition=Failed", "agj/buggy", "-n", namespace, "--timeout=60s")
    failed = wait_phase(kube_api, namespace, "buggy", "Failed", "TrainingError")
    assert "loss is nan" in failed["message"] and failed["restarts"] == 0
    # The pod is kept (onFailure: KeepCluster), and the status says where the driver's log is.
    assert failed["driverLogs"] == f"kubectl logs -n {namespace} {failed['headPod']} -c driver"
    with pytest.raises(ClusterError, match="timed out"):
        local_cluster.kubectl(
            "wait", "--for=condition=Complete", "agj/buggy", "-n", namespace, "--timeout=2s"
        )


def test_unusable_data_fails_at_once_with_invalid_data_and_is_not_retried(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(kube_api, namespace, job_manifest("no-data"))
    run_until_running(kube_api, namespace, "no-data", driver_progress)
    error = "InvalidDataError: data.trainPath /data/train.jsonl: no usable row of 3"
    end_driver(kube_api, namespace, head_pod(kube_api, namespace, "no-data-0"), exitcodes.INVALID_DATA, error)

    failed = wait_phase(kube_api, namespace, "no-data", "Failed", "InvalidData")
    assert "data.trainPath /data/train.jsonl: no usable row of 3" in failed["message"]
    assert failed["restarts"] == 0
    time.sleep(3)
    assert live_rayclusters(kube_api, namespace, "no-data") == ["no-data-0"]  # no new attempt


def test_suspend_stops_the_pods_in_place_and_resume_restarts_the_same_cluster(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(kube_api, namespace, job_manifest("pausable"))
    run_until_running(kube_api, namespace, "pausable", driver_progress)
    path = f"{JOBS.format(ns=namespace)}/pausable"
    cluster_uid = kube_api.get(f"{raycluster_path(namespace)}/pausable-0")["metadata"]["uid"]
    first_head = head_pod(kube_api, namespace, "pausable-0")["metadata"]["name"]

    kube_api.merge_patch(path, {"spec": {"suspend": True}})
    suspended = wait_phase(kube_api, namespace, "pausable", "Suspended")
    assert (suspended["rayClusterName"], suspended["attempt"], suspended["restarts"]) == ("pausable-0", 0, 0)
    gone(lambda: not pods(kube_api, namespace, "asyncgrpo.dev/job-name=pausable"), "pods deleted on suspend")
    kept = kube_api.get(f"{raycluster_path(namespace)}/pausable-0")
    assert kept["metadata"]["uid"] == cluster_uid and kept["spec"]["suspend"] is True  # suspended in place

    kube_api.merge_patch(path, {"spec": {"suspend": False}})
    running = wait_phase(kube_api, namespace, "pausable", "Running", timeout=90)
    assert (running["rayClusterName"], running["restarts"], running["attempt"]) == ("pausable-0", 0, 0)
    assert {c["type"]: c for c in running["conditions"]}["Suspended"]["reason"] == "Resumed"
    assert kube_api.get(f"{raycluster_path(namespace)}/pausable-0")["metadata"]["uid"] == cluster_uid
    assert head_pod(kube_api, namespace, "pausable-0")["metadata"]["name"] != first_head  # a new driver


def test_deleting_the_job_removes_its_children(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(kube_api, namespace, job_manifest("doomed"))
    run_until_running(kube_api, namespace, "doomed", driver_progress)
    kube_api.delete(f"{JOBS.format(ns=namespace)}/doomed")

    def job_gone() -> bool:
        try:
            get_job(kube_api, namespace, "doomed")
        except ApiError as err:
            return err.status == 404
        return False

    gone(job_gone, "job deleted (no finalizer holds it)", timeout=10)
    gone(lambda: not rayclusters(kube_api, namespace, "doomed"), "RayCluster garbage-collected")
    gone(lambda: not pods(kube_api, namespace, "asyncgrpo.dev/job-name=doomed"), "pods garbage-collected")

    def configmap_gone() -> bool:
        try:
            kube_api.get(f"/api/v1/namespaces/{namespace}/configmaps/doomed-spec")
        except ApiError as err:
            return err.status == 404
        return False

    gone(configmap_gone, "spec ConfigMap garbage-collected")


def test_ttl_after_finished_deletes_the_job_at_expiry(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(
        kube_api,
        namespace,
        job_manifest("brief", cleanupPolicy={"ttlSecondsAfterFinished": 4}),
    )
    run_until_running(kube_api, namespace, "brief", driver_progress)
    end_driver(kube_api, namespace, head_pod(kube_api, namespace, "brief-0"), 0)
    done = wait_phase(kube_api, namespace, "brief", "Succeeded")
    # The TTL counts from the recorded completionTime, not from when this test saw Succeeded (a
    # poll that sees it late made a deletion right on time look early).
    finished = datetime.fromisoformat(done["completionTime"].replace("Z", "+00:00")).timestamp()

    def job_gone() -> bool:
        try:
            get_job(kube_api, namespace, "brief")
        except ApiError as err:
            return err.status == 404
        return False

    gone(job_gone, "job deleted by its TTL", timeout=30)
    assert 4.0 <= time.time() - finished < 15  # same clock as the operator's; 404 seen after deletion


def test_a_driver_whose_step_stops_advancing_is_reported_stalled(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    create_job(kube_api, namespace, job_manifest("wedged"))
    run_until_running(kube_api, namespace, "wedged", driver_progress)

    def stalled() -> JSON | None:
        status = get_job(kube_api, namespace, "wedged").get("status") or {}
        cond = {c["type"]: c for c in status.get("conditions", [])}.get("Stalled")
        return cond if cond is not None and cond["status"] == "True" else None

    cond = wait_until(stalled, "Stalled=True", timeout=60, interval=1)
    assert cond["reason"] == "NoProgress" and "step 3" in cond["message"]
    assert get_job(kube_api, namespace, "wedged")["status"]["phase"] == "Running"

    driver_progress.doc = {**driver_progress.doc, "step": 4}
    wait_until(lambda: not stalled(), "Stalled=False once the step advances", timeout=30, interval=1)


def run_elastic_job(
    kube_api: Api, namespace: str, driver_progress: ProgressServer, name: str, *, replicas: int
) -> None:
    """A job whose generation fleet may be 1 or 2 workers, starting at `replicas`, judged on 2 step
    windows, brought to Running."""
    manifest = job_manifest(name)
    manifest["spec"]["cluster"]["generationWorkers"].update(
        {"replicas": replicas, "minReplicas": 1, "maxReplicas": 2, "autoscaling": {"windowSteps": 2}}
    )
    assert validate_manifest(manifest).ok
    create_job(kube_api, namespace, manifest)
    run_until_running(kube_api, namespace, name, driver_progress)


def test_a_policy_starved_of_rollouts_grows_its_elastic_generation_fleet_with_an_event(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    """issue 48: the driver reports that the policy waited for rollouts most of each step window; the
    operator patches the RayCluster's generation group up by one (KubeRay makes the pod) and says
    why in an event, with the numbers."""
    run_elastic_job(kube_api, namespace, driver_progress, "starved", replicas=1)
    window = {"seconds": 4.0, "generationIdleShare": 0.0, "generationGatedShare": 0.0, "generationEngines": 1}
    driver_progress.doc = {
        **driver_progress.doc,
        "step": 5,
        "policyIdleShare": 0.7,
        "windows": [{**window, "step": s, "policyIdleShare": 0.7} for s in (4, 5)],
    }

    def generation_replicas() -> int | None:
        (rc,) = [
            r for r in rayclusters(kube_api, namespace, "starved") if r["metadata"]["name"] == "starved-0"
        ]
        group = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}["generation"]
        return int(group["replicas"]) if group["replicas"] == 2 else None

    wait_until(generation_replicas, "the generation group at 2 replicas", timeout=60, interval=1)
    wait_until(
        lambda: (
            len(pods(kube_api, namespace, "ray.io/cluster=starved-0,ray.io/group=generation")) == 2 or None
        ),
        "KubeRay's second generation pod",
        timeout=60,
    )
    scaled = wait_until(
        lambda: [e for e in events(kube_api, namespace, "starved") if e["reason"] == "GenerationScaledUp"],
        "the GenerationScaledUp event",
        timeout=30,
    )
    assert "waited for rollouts 70%, 70% of steps 4-5" in scaled[0]["message"], scaled[0]["message"]
    assert "1 -> 2 (maxReplicas 2)" in scaled[0]["message"]
    fleet = get_job(kube_api, namespace, "starved")["status"]["generationFleet"]
    assert (fleet["rayClusterName"], fleet["replicas"], fleet["lastChangeStep"]) == ("starved-0", 2, 5)
    table = {e["reason"] for e in events(kube_api, namespace, "starved")}
    assert "GenerationDrainRequested" not in table and "GenerationScaledDown" not in table


def test_engines_idle_behind_the_gate_get_a_worker_drained_by_the_driver_then_removed(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    """issue 48: the driver reports its generation engines sitting behind the staleness gate while
    the policy is fed; the operator asks the driver (POST /drain, with the job's Ray token) to drain
    one named worker, and removes that pod from the generation group only once /progress lists
    it drained, with an event."""
    run_elastic_job(kube_api, namespace, driver_progress, "gated", replicas=2)
    window = {"seconds": 4.0, "policyIdleShare": 0.05, "generationIdleShare": 0.8, "generationEngines": 2}
    driver_progress.doc = {
        **driver_progress.doc,
        "step": 5,
        "windows": [{**window, "step": s, "generationGatedShare": 0.8} for s in (4, 5)],
    }
    sent = wait_until(
        lambda: driver_progress.drains.get((namespace, "gated")), "the driver's POST /drain", timeout=60
    )
    fleet = get_job(kube_api, namespace, "gated")["status"]["generationFleet"]
    worker = fleet["drainRequest"]["pod"]
    assert sent[0] == (worker, driver_progress.authorization[(namespace, "gated")])
    assert worker in {p["metadata"]["name"] for p in pods(kube_api, namespace, "ray.io/cluster=gated-0")}
    assert "GenerationScaledDown" not in {e["reason"] for e in events(kube_api, namespace, "gated")}

    driver_progress.doc = {**driver_progress.doc, "drainedWorkers": [worker]}

    def generation_group() -> JSON | None:
        (rc,) = [r for r in rayclusters(kube_api, namespace, "gated") if r["metadata"]["name"] == "gated-0"]
        group: JSON = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}["generation"]
        return group if group["replicas"] == 1 else None

    wait_until(generation_group, "the generation group down to 1 replica", timeout=60, interval=1)
    scaled = wait_until(
        lambda: [e for e in events(kube_api, namespace, "gated") if e["reason"] == "GenerationScaledDown"],
        "the GenerationScaledDown event",
        timeout=30,
    )
    assert worker in scaled[0]["message"], scaled[0]["message"]
    wait_until(
        lambda: (
            worker not in {p["metadata"]["name"] for p in pods(kube_api, namespace, "ray.io/cluster=gated-0")}
            or None
        ),
        "KubeRay to delete the drained pod",
        timeout=60,
    )
    assert get_job(kube_api, namespace, "gated")["status"]["generationFleet"].get("drainRequest") is None


def test_an_operator_killed_mid_reconcile_never_makes_a_second_raycluster(
    kube_api: Api, namespace: str, operator: OperatorProcess, driver_progress: ProgressServer
) -> None:
    operator.kill()
    create_job(kube_api, namespace, job_manifest("sturdy"))
    driver_progress.doc = {"step": 1, "maxSteps": 20, "state": "running"}

    # 1. Killed right after it created the RayCluster, before it could record it in the status.
    operator.start()
    wait_until(
        lambda: rayclusters(kube_api, namespace, "sturdy"), "first RayCluster", timeout=60, interval=0.02
    )
    operator.kill()
    # 2. Killed at arbitrary points of the following passes.
    for delay in (0.5, 1.0, 1.5, 2.0):
        operator.start()
        time.sleep(delay)
        operator.kill()
        assert len(rayclusters(kube_api, namespace, "sturdy")) == 1
    operator.start()
    running = wait_phase(kube_api, namespace, "sturdy", "Running", timeout=90)
    assert running["rayClusterName"] == "sturdy-0" and running["restarts"] == 0
    assert [rc["metadata"]["name"] for rc in rayclusters(kube_api, namespace, "sturdy")] == ["sturdy-0"]
    # The transition is recorded in the status conditions, the source of truth. Its Event is best
    # effort: a kill between the status write and the Event post loses that Event.
    by_type = {c["type"]: c for c in running["conditions"]}
    assert (by_type["Running"]["status"], by_type["Running"]["reason"]) == ("True", "DriverRunning")


def lease_holder(api: Api, namespace: str) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/asyncgrpo-operator"
    try:
        return str(api.get(path)["spec"].get("holderIdentity") or "")
    except ApiError as err:
        if err.status == 404:
            return ""
        raise


def holding(replicas: list[OperatorProcess], holder: str) -> OperatorProcess:
    return next(r for r in replicas if r.proc is not None and holder.endswith(f"-{r.proc.pid}"))


def test_two_replicas_with_leader_election_act_once_and_fail_over(
    *,
    kube_api: Api,
    kubeconfig: Path,
    namespace: str,
    asyncgrpo_crd: JSON,
    tmp_path: Path,
    driver_progress: ProgressServer,
) -> None:
    """client-go's semantics (leaseDuration 15 s, renewDeadline 10 s, retryPeriod 2 s): a leader
    that is stopped releases the Lease and a standby takes over at its next retry; one that is
    killed is replaced once its Lease has gone unrenewed for a lease duration."""
    env = {"ASYNCGRPO_LEADER_ELECTION": "true", "ASYNCGRPO_LEADER_ELECTION_NAMESPACE": namespace}
    replicas = [
        OperatorProcess(kubeconfig, namespace, tmp_path / f"operator-{i}.log", env, progress=driver_progress)
        for i in range(3)
    ]
    for replica in replicas[:2]:
        replica.start()
    try:
        create_job(kube_api, namespace, job_manifest("shared"))
        run_until_running(kube_api, namespace, "shared", driver_progress)
        created = [e for e in events(kube_api, namespace, "shared") if e["reason"] == "CreatedRayCluster"]
        assert len(created) == 1

        # 1. The leader is stopped (SIGTERM, as on a rollout): it releases the Lease.
        first = lease_holder(kube_api, namespace)
        stopped = time.monotonic()
        holding(replicas, first).stop()
        second = wait_until(
            lambda: ((h := lease_holder(kube_api, namespace)) not in ("", first) and h) or None,
            "the standby holds the Lease",
            timeout=30,
            interval=0.1,
        )
        handed_over = time.monotonic() - stopped
        kube_api.merge_patch(f"{JOBS.format(ns=namespace)}/shared", {"spec": {"suspend": True}})
        wait_phase(kube_api, namespace, "shared", "Suspended", timeout=60)  # the new leader acts

        # 2. The new leader is killed (SIGKILL): nothing is released; its Lease must expire.
        replicas[2].start()
        time.sleep(4)  # the new standby has seen the Lease being renewed
        killed = time.monotonic()
        holding(replicas, second).kill()
        third = wait_until(
            lambda: ((h := lease_holder(kube_api, namespace)) not in ("", second) and h) or None,
            "the last replica holds the Lease",
            timeout=60,
            interval=0.1,
        )
        taken_over = time.monotonic() - killed
        assert third.endswith(f"-{replicas[2].proc.pid}")  # type: ignore[union-attr]
        kube_api.merge_patch(f"{JOBS.format(ns=namespace)}/shared", {"spec": {"suspend": False}})
        run_until_running(kube_api, namespace, "shared", driver_progress)
        print(f"failover: leader stopped -> the standby leads in {handed_over:.1f} s;", end=" ")
        print(f"leader killed -> {taken_over:.1f} s")
        assert handed_over < 8, "a released Lease is taken at the standby's next retry (2 s)"
        assert 11 <= taken_over < 30, "a killed leader's Lease expires after 15 s without renewal"
    finally:
        for replica in replicas:
            replica.stop()
            sys.stderr.write(f"\n--- {replica.log.name} ---\n{replica.tail(30)}\n")


def test_the_liveness_endpoint_reports_the_queue(operator: OperatorProcess) -> None:
    import urllib.request  # noqa: PLC0415

    def answer() -> JSON | None:
        try:
            with urllib.request.urlopen(operator.liveness, timeout=2) as response:
                data: JSON = json.loads(response.read())
                return data
        except OSError:
            return None

    health = wait_until(answer, "liveness endpoint", timeout=30)
    assert "controller-alive" in health
