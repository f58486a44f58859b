"""`make demo`: one AsyncGRPOJob from `kubectl apply` to Succeeded on a local Kubernetes control plane.

    python -m tests.e2e.demo [--job FILE] [--keep] [--kueue]

What it does, printing each step:
1. The local control plane (tests/cluster): attaches to a live one, else builds the binaries from Go
   modules (first time only, cached in ~/.cache/asyncgrpo; progress is printed every 30 s) and
   starts it.
2. `helm install` of charts/asyncgrpo-operator, with the webhook called at a URL on 127.0.0.1, and
   the operator started as a local process with the chart ServiceAccount's token.
3. `kubectl apply` of the demo job; the operator creates its RayCluster, KubeRay the head pod.
4. kwok runs no containers, so the head pod's driver container is run here, exactly as the pod
   describes it (tests/e2e/whole_path.py lists the few translations), while `kubectl get agj` is
   printed whenever it changes, until the job is Succeeded.
5. Cleanup: the job, the chart, the operator; the control plane too, unless it was already up
   (or --keep).

With --kueue the job is queued by Kueue (built from Go modules the first time it is asked for, a
few minutes, never by the plain demo): a LocalQueue `demo` on the control plane's gpu-pool
ClusterQueue, and the job labelled kueue.x-k8s.io/queue-name: demo; it is Queued until Kueue admits
it (at once, with nothing else in the queue).

Without Kubernetes, the same trainer runs with `asyncgrpo run docs/examples/async-exact.yaml`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.chart.helm import CHART, NO_HELM, REPO, find_helm
from tests.cluster import kueue as kueue_component
from tests.cluster.build import BuildError, build, build_optional, layout, optional_layout
from tests.cluster.cluster import ClusterError, LocalCluster
from tests.e2e.test_operator import ProgressServer
from tests.e2e.whole_path import AgjWatch, DriverKubelet, LocalDriver, drive, wait_terminal
from tests.webhook.cluster_harness import SELECTOR_LABEL, Installation

DEMO_JOB = Path(__file__).with_name("demo-job.yaml")
JOB_TIMEOUT = 900.0


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


@contextmanager
def heartbeat(what: str, every: float = 30.0) -> Iterator[None]:
    """Print how long `what` has taken, every `every` seconds, while the block runs."""
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            print(f"    ... {what}: {time.monotonic() - start:.0f} s so far", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@dataclass
class DemoInstallation(Installation):
    """The chart installed as release `asyncgrpo-<suffix>`, jobs in namespace `asyncgrpo-demo-<suffix>`."""

    @property
    def release(self) -> str:
        return f"asyncgrpo-{self.suffix}"

    @property
    def namespace(self) -> str:
        return f"asyncgrpo-system-{self.suffix}"

    @property
    def jobs_ns(self) -> str:
        return f"asyncgrpo-demo-{self.suffix}"

    def jobs_namespace(self, name: str, *, validated: bool = True) -> str:
        """`install` creates the jobs namespace through this: give it the demo's name."""
        self.api.create(
            "/api/v1/namespaces",
            {"metadata": {"name": self.jobs_ns, "labels": {SELECTOR_LABEL: self.release}}},
        )
        return self.jobs_ns


def control_plane() -> tuple[LocalCluster, bool]:
    """The live control plane, or a new one (built first if needed). True if this call started it."""
    cluster = LocalCluster.from_env()
    if cluster.is_live():
        say(f"Control plane: attaching to the one already running (state {cluster.paths.root}); left up")
        cluster.join(build)
        return cluster, False
    if not layout().complete():
        if shutil.which("go") is None:
            raise SystemExit(
                "error: the local control plane is not built yet and `go` (1.26+) is not on PATH.\n"
                "Install Go, or train without Kubernetes: asyncgrpo run docs/examples/async-exact.yaml"
            )
        say(
            "Control plane: building etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,\n"
            "    the KubeRay operator and helm from Go modules. This happens once, with a progress line\n"
            f"    every 30 s (cached in {layout().root.parent}; later runs start in ~20 s)."
        )
        build()  # prints its own progress every 30 s
    say("Control plane: starting it (processes on 127.0.0.1; kwok fakes a CPU node and a GPU pool)")
    start = time.monotonic()
    started = cluster.join(build)
    print(f"    up in {time.monotonic() - start:.0f} s; kubeconfig {cluster.kubeconfig}")
    return cluster, started


def queue_in_kueue(cluster: LocalCluster, installation: DemoInstallation, job_file: Path) -> Path:
    """Start Kueue (building it once), give the demo namespace a LocalQueue and return a copy of the
    job file labelled with it."""
    if not optional_layout("kueue").complete():
        say("Kueue: building its controller from Go modules (once; cached like the control plane)")
    binaries = build_optional("kueue")  # prints its own progress every 30 s
    with heartbeat("starting Kueue"):
        cluster.start_kueue(binaries)
    queue = "demo"
    kueue_component.create_local_queue(cluster.api, installation.jobs_ns, queue)
    say(
        f"Kueue: LocalQueue {queue} in {installation.jobs_ns} -> ClusterQueue {kueue_component.CLUSTER_QUEUE}"
    )
    manifest = yaml.safe_load(job_file.read_text())
    manifest["metadata"].setdefault("labels", {})[kueue_component.QUEUE_LABEL] = queue
    queued = installation.workdir / job_file.name
    queued.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return queued


def run(job_file: Path, *, keep: bool, with_kueue: bool = False) -> int:
    t0 = time.monotonic()
    cluster, started = control_plane()
    helm_bin = find_helm()
    if helm_bin is None:
        raise SystemExit(f"error: {NO_HELM}")
    workdir = Path(tempfile.mkdtemp(prefix="asyncgrpo-demo-"))  # kept: the logs printed are in it
    pod_network = ProgressServer()  # the operator reads /progress here; forwarded to the driver
    installation = DemoInstallation(
        cluster,
        helm_bin,
        workdir=workdir,
        keep_workdir=True,
        progress_url_template=pod_network.template,
    )
    driver: list[LocalDriver] = []
    try:
        say(
            f"helm install {installation.release} {CHART.relative_to(REPO)} -n {installation.namespace}"
            f" --create-namespace --set webhook.url=https://127.0.0.1:{installation.port}\n"
            "    (CRD, RBAC, the webhook configuration and certificate; the chart's operator pod\n"
            "    cannot run on kwok, so the operator runs here, as the chart's ServiceAccount)"
        )
        installation.install()
        with heartbeat("starting the operator", every=15):
            installation.start_operator()
        print(f"    operator: kopf run -m asyncgrpo_operator.main, log {installation.log}")

        if with_kueue:
            job_file = queue_in_kueue(cluster, installation, job_file)
        manifest = yaml.safe_load(job_file.read_text())
        job = manifest["metadata"]["name"]
        ns = installation.jobs_ns
        shown = job_file.relative_to(REPO) if job_file.is_relative_to(REPO) else job_file
        print(
            "    to look around meanwhile, in another shell:\n"
            '    eval "$(.venv/bin/python -m tests.cluster env)"; kubectl get agj,rayclusters,pods -A'
        )
        say(f"kubectl apply -n {ns} -f {shown}")
        outcome = installation.kubectl("apply", "-n", ns, "-f", str(job_file))
        print("    " + (outcome.stdout.strip() or outcome.stderr.strip()))
        if outcome.returncode != 0:
            return 1

        say(
            "The operator creates the RayCluster; KubeRay its head pod (Ray head + driver). kwok runs\n"
            "    no containers, so the driver container runs here as the pod describes it; the operator\n"
            "    polls its /progress, and its exit is written into the pod's status like a kubelet would."
        )
        kubelet = DriverKubelet(installation.api, installation.workdir / "kubelet", pod_network)
        watch = AgjWatch(installation.kubectl, ns, job, out=sys.stdout, every=2.0)
        watch.poll()
        for _ in drive(kubelet, watch, timeout=JOB_TIMEOUT, out=sys.stdout, on_start=driver.append):
            pass
        status = wait_terminal(installation.api, ns, job)
        watch.poll()

        say(f"kubectl get agj {job} -n {ns} -o wide")
        print(installation.kubectl("get", "agj", job, "-n", ns, "-o", "wide").stdout.rstrip())
        rewards, accuracies = watch.rewards(), watch.accuracies()
        progress = status.get("progress") or {}
        held_out = progress.get("validationAccuracy")
        print(
            f"\n{job}: {status.get('phase')} ({status.get('reason')}) after {progress.get('step')} steps;"
            + (f" reward {rewards[0]:.2f} -> {rewards[-1]:.2f}" if rewards else "")
            + (f", accuracy {accuracies[0]:.2f} -> {accuracies[-1]:.2f}" if accuracies else "")
            + (f"; held-out accuracy {held_out:.2f} (greedy)" if held_out is not None else "")
            + f"; restarts {status.get('restarts', 0)}; {time.monotonic() - t0:.0f} s in all"
        )
        if driver:
            print(f"driver log: {driver[-1].log}")
        return 0 if status.get("phase") == "Succeeded" else 1
    finally:
        for local in driver:
            local.kill()
        pod_network.close()
        say("Cleaning up: the job, the chart and the operator")
        try:
            installation.uninstall()
        except Exception as exc:  # cleanup must not hide the outcome
            print(f"    cleanup: {exc}")
        stopped = cluster.leave(keep=keep)
        if stopped:
            print(
                "    the control plane this demo started is stopped (`python -m tests.cluster up` keeps one)"
            )
        elif started:
            print("    the control plane is still used by another session or --keep: left up")
        else:
            print("    the control plane was already up: left up")
        print(f"    the demo's files, the operator's and the driver's logs among them, are kept in {workdir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--job", type=Path, default=DEMO_JOB, help="the AsyncGRPOJob to apply")
    parser.add_argument("--keep", action="store_true", help="leave a control plane this demo started up")
    parser.add_argument("--kueue", action="store_true", help="queue the job in Kueue (built on first use)")
    ns = parser.parse_args(argv)
    try:
        return run(ns.job.resolve(), keep=ns.keep, with_kueue=ns.kueue)
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
