"""The mission's whole path on the local control plane: the driver container, run on this machine.

kwok binds and "runs" the head pod but runs no container in it, so `DriverKubelet` plays the
kubelet for exactly one container, the head pod's `driver`. Everything it runs is READ BACK from
the objects the operator and KubeRay created (the head pod's container command, env and volume
mounts, the job-spec ConfigMap), never re-typed. What cannot be taken literally on a machine
without containers is translated, and only this:

1. Volumes become local folders under `root`: a configMap volume is written out from the
   ConfigMap (its `items` honoured); a hostPath volume is `root/node/<path>` (one "node" for all
   pods, so it outlives an attempt like a node's disk: the e2e jobs keep checkpoints there); a
   persistentVolumeClaim is `root/pvc/<claimName>` (same reason); an emptyDir is fresh per pod.
2. Container paths: a bind mount needs root, so a path under a mountPath is rewritten to its local
   folder where the container would read it: in the command, and in the mounted JSON files (the
   job spec names its checkpoint path and data paths).
3. The Ray head: the command is `bash -c <script>`; the script waits for the `ray-head`
   container's ports, then `exec`s the driver. No Ray head container runs here, so only the
   script's `exec` line runs, and RAY_ADDRESS (that container's GCS) is dropped: the driver starts
   an embedded Ray, like `asyncgrpo run`. That Ray is given the logical CPUs the RayCluster's pods
   would contribute (RAY_OVERRIDE_RESOURCES: one per worker rank, one on the head for the
   controller actor), else a 2-core machine could not place the job's actors.
4. Network: a pod has its own network namespace, where the pinned progress port 8090 is free,
   and the operator reaches it at the pod's IP. Here the driver gets `--progress-port <a free
   port>`, and the operator, started with ASYNCGRPO_PROGRESS_URL_TEMPLATE pointing at `progress`
   (a router in this process standing in for the pod network), has /progress/<namespace>/<job>
   forwarded to that port. Job authors cannot redirect the operator: the URL is its setting.
5. The image: `python` is this virtualenv's interpreter (first on PATH) and the image's
   environment is this process's (without KUBECONFIG and RAY_ADDRESS).
6. The exit, reported like a kubelet into the pod's status: the container's exit code is the
   process's, 128 + N when signal N killed it (what a container runtime reports: 137 for SIGKILL);
   with terminationMessagePolicy FallbackToLogsOnError a failed container's message is its log tail
   (the last 80 lines, at most 2048 bytes). The driver runs in its own session, so "killing the
   container" signals every process in it (the driver and its Ray), as a runtime kills the cgroup.
7. The termination-message file (/dev/termination-log in the pod, where the driver writes its
   error) is a file in the pod's local folder; the reported message is its content when non-empty.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tests.cluster.rest import JSON, Api, ApiError
from tests.cluster.samples import pods, raycluster_path, wait_until
from tests.e2e.test_operator import ProgressServer, end_driver, get_job
from tests.webhook.cluster_harness import Kubectl
from tests.webhook.server import free_port

DRIVER_CONTAINER = "driver"
TERMINATION_LOG_LINES = 80
TERMINATION_MESSAGE_ENV = "ASYNCGRPO_TERMINATION_MESSAGE_PATH"
TERMINATION_LOG_BYTES = 2048
TERMINAL_PHASES = ("Succeeded", "Failed")


class TranslationError(RuntimeError):
    """The pod asks for something this harness cannot run locally (named in the message)."""


# --- one driver container -----------------------------------------------------------------------


@dataclass
class LocalDriver:
    """The head pod's driver container, running as a local process group."""

    job: str
    namespace: str
    pod: str
    cluster: str
    argv: list[str]
    env_changes: dict[str, str | None]
    """What differs from this process's environment (None: removed); for the report."""
    log: Path
    port: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    termination_file: Path | None = None
    """The container's termination-message file, mapped to a local file (translation 7)."""

    @property
    def progress_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/progress"

    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal every process of the container (the driver is its session leader)."""
        if self.running():
            os.killpg(self.process.pid, sig)

    def wait(self, timeout: float) -> int:
        """The container's exit code: the process's, or 128 + N when signal N ended it."""
        code = self.process.wait(timeout=timeout)
        self._reap_group()
        return 128 - code if code < 0 else code

    def _reap_group(self) -> None:
        """A container ends with its main process: SIGKILL whatever of its group is left (Ray)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def termination_message(self) -> str:
        """The termination-message file when the driver wrote one, else (FallbackToLogsOnError) the
        log's last 80 lines, at most its last 2048 bytes."""
        if self.termination_file is not None and self.termination_file.exists():
            written = self.termination_file.read_text(errors="replace").strip()
            if written:
                return written
        data = self.log.read_bytes() if self.log.exists() else b""
        tail = b"\n".join(data.rstrip(b"\n").split(b"\n")[-TERMINATION_LOG_LINES:])
        return tail[-TERMINATION_LOG_BYTES:].decode(errors="replace")

    def steps(self) -> list[int]:
        """The steps the driver logged (its stdout has one JSON record per step)."""
        return logged_steps(self.log.read_text(errors="replace") if self.log.exists() else "")


def logged_steps(log: str) -> list[int]:
    """The steps of the step records (one JSON line each) in a driver's log."""
    out: list[int] = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "step" in record and record.get("event") != "summary":
                out.append(int(record["step"]))
    return out


@dataclass
class DriverKubelet:
    """Plays the kubelet for the driver container of a job's head pods (see the module docstring)."""

    api: Api
    root: Path
    progress: ProgressServer
    """The pod network's stand-in: the operator reads /progress here (translation 4)."""
    python: Path = field(default_factory=lambda: Path(sys.executable))

    # --- reading the objects back ---------------------------------------------------------------

    def head_pod(self, namespace: str, cluster: str, timeout: float = 90) -> JSON:
        """The live head pod of a RayCluster, once its driver container is reported running."""

        def found() -> JSON | None:
            for pod in pods(self.api, namespace, f"ray.io/cluster={cluster},ray.io/node-type=head"):
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                statuses = pod.get("status", {}).get("containerStatuses") or []
                if any(s["name"] == DRIVER_CONTAINER and "running" in s.get("state", {}) for s in statuses):
                    return pod
            return None

        return wait_until(found, f"head pod of {cluster} with a running driver container", timeout=timeout)

    def _read(self, path: str) -> JSON:
        return self.api.get(path)

    def _volume_dir(self, namespace: str, pod: JSON, volume: JSON) -> Path:
        """The local folder standing for one pod volume (translation 1)."""
        pod_dir = self.root / "pods" / str(pod["metadata"]["name"]) / "volumes" / str(volume["name"])
        if "configMap" in volume:
            source = volume["configMap"]
            cm = self._read(f"/api/v1/namespaces/{namespace}/configmaps/{source['name']}")
            items = source.get("items") or [{"key": k, "path": k} for k in cm.get("data", {})]
            pod_dir.mkdir(parents=True, exist_ok=True)
            for item in items:
                (pod_dir / item["path"]).write_text(cm["data"][item["key"]])
            return pod_dir
        if "secret" in volume:
            source = volume["secret"]
            secret = self._read(f"/api/v1/namespaces/{namespace}/secrets/{source['secretName']}")
            items = source.get("items") or [{"key": k, "path": k} for k in secret.get("data", {})]
            pod_dir.mkdir(parents=True, exist_ok=True)
            for item in items:
                (pod_dir / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
            return pod_dir
        if "hostPath" in volume:
            local = self.root / "node" / str(volume["hostPath"]["path"]).lstrip("/")
        elif "persistentVolumeClaim" in volume:
            local = self.root / "pvc" / str(volume["persistentVolumeClaim"]["claimName"])
        elif "emptyDir" in volume:
            local = pod_dir
        else:
            raise TranslationError(f"volume {volume['name']}: unsupported source {sorted(volume)}")
        local.mkdir(parents=True, exist_ok=True)
        return local

    def _env(self, namespace: str, container: JSON) -> dict[str, str]:
        """The container's env and envFrom, resolved against the API like a kubelet does."""
        env: dict[str, str] = {}
        for ref in container.get("envFrom") or []:
            if "secretRef" in ref:
                data = self._read(f"/api/v1/namespaces/{namespace}/secrets/{ref['secretRef']['name']}")
                env.update({k: base64.b64decode(v).decode() for k, v in data.get("data", {}).items()})
            elif "configMapRef" in ref:
                data = self._read(f"/api/v1/namespaces/{namespace}/configmaps/{ref['configMapRef']['name']}")
                env.update(data.get("data", {}))
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
            elif "secretKeyRef" in var.get("valueFrom", {}):
                ref = var["valueFrom"]["secretKeyRef"]
                data = self._read(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
                env[var["name"]] = base64.b64decode(data["data"][ref["key"]]).decode()
            else:
                raise TranslationError(f"env {var['name']}: unsupported valueFrom {var.get('valueFrom')}")
        return env

    # --- running it ----------------------------------------------------------------------------

    def start(self, pod: JSON, *, job: str, out: TextIO | None = None) -> LocalDriver:
        """Run the pod's driver container here and route the job's /progress to it."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        cluster = pod["metadata"]["labels"]["ray.io/cluster"]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == DRIVER_CONTAINER)
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: list[tuple[str, Path]] = []
        for mount in container.get("volumeMounts") or []:
            local = self._volume_dir(namespace, pod, volumes[mount["name"]])
            mounts.append((mount["mountPath"].rstrip("/") or "/", local))
        mounts.sort(key=lambda m: len(m[0]), reverse=True)  # the deepest mount wins, as in a container
        for _, local in mounts:  # translation 2, in the mounted JSON files
            for path in local.glob("*.json") if local.is_relative_to(self.root / "pods") else []:
                path.write_text(json.dumps(_translate_json(json.loads(path.read_text()), mounts), indent=2))

        command = [*container.get("command", []), *container.get("args", [])]
        if len(command) != 3 or Path(command[0]).name not in ("bash", "sh") or command[1] != "-c":
            raise TranslationError(f"driver command is not `bash -c <script>`: {command}")
        exec_lines = [ln.strip() for ln in command[2].splitlines() if ln.strip().startswith("exec ")]
        if len(exec_lines) != 1:
            raise TranslationError(f"driver script has {len(exec_lines)} exec lines:\n{command[2]}")
        port = free_port()
        script = f"{_translate_text(exec_lines[0], mounts)} --progress-port {port}"
        argv = [command[0], "-c", script]

        env = dict(os.environ)
        changes: dict[str, str | None] = {}
        for var in ("KUBECONFIG", "RAY_ADDRESS"):
            if env.pop(var, None) is not None:
                changes[var] = None
        declared = self._env(namespace, container)
        declared.pop("RAY_ADDRESS", None)
        changes["RAY_ADDRESS"] = None
        cpus = max(os.cpu_count() or 1, self._ray_cpus(namespace, cluster))
        declared["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": cpus})
        declared["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
        workdir = self.root / "pods" / name
        workdir.mkdir(parents=True, exist_ok=True)
        termination_file = None
        if TERMINATION_MESSAGE_ENV in declared:  # translation 7: the kubelet's file, here a local one
            termination_file = workdir / "termination-log"
            termination_file.unlink(missing_ok=True)
            declared[TERMINATION_MESSAGE_ENV] = str(termination_file)
        env.update(declared)
        changes.update(declared)

        log = workdir / "driver.log"
        if out is not None:
            out.write(f"$ {shlex.join(argv)}\n")
        with log.open("ab") as sink:
            process = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        driver = LocalDriver(
            job,
            namespace,
            name,
            cluster,
            argv,
            changes,
            log,
            port,
            process,
            termination_file=termination_file,
        )
        self.progress.routes[(namespace, job)] = driver.progress_url
        if out is not None:
            out.write(f"# {self.progress.url_of(namespace, job)} -> {driver.progress_url}\n")
        return driver

    def _ray_cpus(self, namespace: str, cluster: str) -> int:
        """Logical CPUs the RayCluster would give Ray for this job: one per worker rank (a rank per
        GPU, or one per pod on CPU), plus one on the head for the controller actor."""
        rc = self._read(f"{raycluster_path(namespace)}/{cluster}")
        cpus = 1
        for group in rc["spec"].get("workerGroupSpecs") or []:
            limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
            cpus += int(group.get("replicas", 1)) * max(int(limits.get("nvidia.com/gpu", 0)), 1)
        return cpus

    def report_exit(self, driver: LocalDriver, code: int) -> bool:
        """Write the driver container's terminated state into the head pod's status (the kubelet's
        part). False when the pod is already gone (deleted with its RayCluster)."""
        path = f"/api/v1/namespaces/{driver.namespace}/pods/{driver.pod}"
        try:
            pod = self._read(path)
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        message = "" if code == 0 else driver.termination_message()
        end_driver(self.api, driver.namespace, pod, code, message)
        return True


def _mount_pattern(mount_path: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w./-]){re.escape(mount_path)}(?=/|$|[\s'\"])")


def _translate_text(text: str, mounts: list[tuple[str, Path]]) -> str:
    """Container paths in a shell line -> local folders (deepest mount first)."""
    for mount_path, local in mounts:
        text = _mount_pattern(mount_path).sub(shlex.quote(str(local)).replace("\\", "\\\\"), text)
    return text


def _translate_json(value: Any, mounts: list[tuple[str, Path]]) -> Any:
    """Every string of a JSON document that is a container path under a mount -> the local path."""
    if isinstance(value, dict):
        return {k: _translate_json(v, mounts) for k, v in value.items()}
    if isinstance(value, list):
        return [_translate_json(v, mounts) for v in value]
    if isinstance(value, str):
        for mount_path, local in mounts:
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(local) + value[len(mount_path) :]
    return value


# --- watching the job the way a user does --------------------------------------------------------


@dataclass
class Row:
    """One row of `kubectl get agj` (the default printer columns), with when it was seen."""

    name: str
    phase: str
    step: int | None
    reward: float | None
    accuracy: float | None
    staleness: float | None
    restarts: int
    age: str
    line: str
    at: float = field(default_factory=time.monotonic)


def parse_table(text: str) -> tuple[str, list[Row]]:
    """The header and rows of `kubectl get agj`. Columns are cut at the header's positions (empty
    cells are blank, so splitting on spaces would shift them)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "", []
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = {
            name: line[start : (starts[i + 1] if i + 1 < len(starts) else None)].strip()
            for i, (name, start) in enumerate(zip(names, starts, strict=True))
        }
        rows.append(
            Row(
                name=cells["NAME"],
                phase=cells["PHASE"],
                step=int(cells["STEP"]) if cells["STEP"] else None,
                reward=float(cells["REWARD"]) if cells["REWARD"] else None,
                accuracy=float(cells["ACCURACY"]) if cells["ACCURACY"] else None,
                staleness=float(cells["STALENESS"]) if cells["STALENESS"] else None,
                restarts=int(cells["RESTARTS"] or 0),
                age=cells["AGE"],
                line=line,
            )
        )
    return header, rows


@dataclass
class AgjWatch:
    """`kubectl get agj <job>` every `every` seconds; keeps each row that changed and prints it."""

    kubectl: Kubectl
    namespace: str
    job: str
    out: TextIO | None = None
    every: float = 2.0
    rows: list[Row] = field(default_factory=list)
    _header_shown: bool = False
    _last_poll: float = 0.0

    def poll(self) -> Row | None:
        result = self.kubectl("get", "agj", self.job, "-n", self.namespace)
        self._last_poll = time.monotonic()
        if result.returncode != 0:
            return None
        header, rows = parse_table(result.stdout)
        if not rows:
            return None
        row = rows[0]
        previous = self.rows[-1] if self.rows else None
        if previous is None or (row.phase, row.step, row.reward, row.accuracy, row.restarts) != (
            previous.phase,
            previous.step,
            previous.reward,
            previous.accuracy,
            previous.restarts,
        ):
            self.rows.append(row)
            if self.out is not None:
                if not self._header_shown:
                    self.out.write(
                        f"$ kubectl get agj {self.job} -n {self.namespace}"
                        f"   (every {self.every:g} s, printed when it changes)\n"
                    )
                    self.out.write(header + "\n")
                    self._header_shown = True
                self.out.write(row.line + "\n")
                self.out.flush()
        return row

    def tick(self) -> None:
        """Poll if `every` seconds have passed since the last poll."""
        if time.monotonic() - self._last_poll >= self.every:
            self.poll()

    def steps(self) -> list[int]:
        return [r.step for r in self.rows if r.step is not None]

    def rewards(self) -> list[float]:
        return [r.reward for r in self.rows if r.reward is not None]

    def accuracies(self) -> list[float]:
        return [r.accuracy for r in self.rows if r.accuracy is not None]


def wait_with_watch(
    watch: AgjWatch, until: Callable[[], bool], what: str, *, timeout: float, interval: float = 0.5
) -> None:
    """Wait for `until`, polling `kubectl get agj` meanwhile; TimeoutError names `what`."""
    deadline = time.monotonic() + timeout
    while not until():
        watch.tick()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    watch.poll()


def job_status(api: Api, namespace: str, job: str) -> JSON:
    status: JSON = get_job(api, namespace, job).get("status") or {}
    return status


def terminal(api: Api, namespace: str, job: str) -> bool:
    return job_status(api, namespace, job).get("phase") in TERMINAL_PHASES


def wait_terminal(api: Api, namespace: str, job: str, timeout: float = 60) -> JSON:
    """The job's status once it is Succeeded or Failed."""
    wait_until(lambda: terminal(api, namespace, job), f"{job} Succeeded or Failed", timeout=timeout)
    return job_status(api, namespace, job)


def _attempt(api: Api, namespace: str, job: str) -> int:
    return int(job_status(api, namespace, job).get("attempt") or 0)


def _started(api: Api, namespace: str, job: str, attempt: int) -> Callable[[], bool]:
    """Probe: the job is terminal, or its status names the attempt's RayCluster."""
    name = f"{job}-{attempt}"
    return lambda: (
        (s := job_status(api, namespace, job)).get("phase") in TERMINAL_PHASES
        or (s.get("rayClusterName") == name)
    )


def _decided(api: Api, namespace: str, job: str, attempt: int) -> Callable[[], bool]:
    """Probe: after an attempt's driver exited, the job is terminal or has a new attempt."""
    return lambda: terminal(api, namespace, job) or _attempt(api, namespace, job) > attempt


def _exited(driver: LocalDriver) -> Callable[[], bool]:
    return lambda: not driver.running()


def drive(
    kubelet: DriverKubelet,
    watch: AgjWatch,
    *,
    timeout: float,
    out: TextIO | None = None,
    on_start: Callable[[LocalDriver], None] | None = None,
) -> Iterator[tuple[LocalDriver, int]]:
    """Run the driver of every attempt of the job until it is terminal; yields (driver, exit code).

    For each attempt: wait until the job's status names the attempt's RayCluster, run its head
    pod's driver, poll `kubectl get agj` while it runs, report its exit into the pod's status, then
    wait until the operator has decided (terminal, or a new attempt).
    """
    api, ns, job = kubelet.api, watch.namespace, watch.job
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    attempt = 0
    while True:
        cluster = f"{job}-{attempt}"
        wait_with_watch(watch, _started(api, ns, job, attempt), f"RayCluster {cluster}", timeout=left())
        if terminal(api, ns, job):
            return
        pod = kubelet.head_pod(ns, cluster, timeout=left())
        if out is not None:
            out.write(
                f"--- attempt {attempt}: RayCluster {cluster}, head pod {pod['metadata']['name']}; "
                "running its driver container on this machine:\n"
            )
        driver = kubelet.start(pod, job=job, out=out)
        if out is not None:
            out.write(
                f"    log: {driver.log}\n    progress: {driver.progress_url}\n"
                "    (it starts an embedded Ray and its worker actors first: 20-60 s on 2 busy cores)\n"
            )
        if on_start is not None:
            on_start(driver)
        wait_with_watch(watch, _exited(driver), f"driver of {cluster}", timeout=left())
        code = driver.wait(timeout=10)
        if out is not None:
            out.write(f"--- the driver of {cluster} exited with {code}; reported in the head pod's status\n")
        kubelet.report_exit(driver, code)
        yield driver, code
        wait_with_watch(
            watch, _decided(api, ns, job, attempt), f"{job} terminal or a new attempt", timeout=left()
        )
        attempt = _attempt(api, ns, job)


# --- the tiny job the e2e scenarios run ---------------------------------------------------------


def tiny_job(name: str, *, max_steps: int = 24, **trainer: Any) -> JSON:
    """A job that trains the shipped digit-reversal task in well under a minute on 2 busy cores.

    Checkpoints go to a hostPath volume (a node's disk, which outlives the attempt's pods) every 4
    steps; the operator polls /progress every second.
    """
    spec_trainer: JSON = {
        "model": {
            "source": "tiny",
            "tiny": {"hiddenSize": 64, "numLayers": 2, "numHeads": 4, "numKvHeads": 2},
            "maxSequenceLength": 32,
        },
        "grpo": {"numPromptsPerStep": 8, "numGenerationsPerPrompt": 8, "maxNumSteps": max_steps, "seed": 1},
        "asyncRL": {
            "maxStalenessVersions": 1,
            "overSampling": False,
            "forceInOrder": True,
            "maxBufferedRollouts": 16,
        },
        "policy": {"trainMicroBatchSize": 64, "learningRate": 2.0e-3},
        "generation": {"maxNewTokens": 5, "temperature": 1.0},
        "data": {"maxPromptLength": 8, "numValidationPrompts": 8},
        "env": {"name": "reverse"},
    }
    for key, value in trainer.items():
        spec_trainer[key] = {**spec_trainer.get(key, {}), **value}
    return {
        "apiVersion": "asyncgrpo.dev/v1alpha1",
        "kind": "AsyncGRPOJob",
        "metadata": {"name": name},
        "spec": {
            "image": "ghcr.io/asyncgrpo/trainer:0.1.0",
            "backoffLimit": 2,
            "progress": {"pollSeconds": 2, "stallAfterSeconds": 300},
            "storage": {
                "checkpoints": {
                    "hostPath": {"path": f"/var/lib/asyncgrpo/{name}"},
                    "mountPath": "/checkpoints",
                }
            },
            "checkpoint": {"path": "/checkpoints", "everySteps": 4, "keepLast": 2},
            "cluster": {
                "head": {"nodeSelector": {"asyncgrpo.dev/pool": "cpu"}},
                "policyWorkers": {"replicas": 1, "gpusPerReplica": 0},
                "generationWorkers": {"replicas": 1, "gpusPerReplica": 0},
            },
            "trainer": spec_trainer,
        },
    }
