"""`make demo`: one AsyncGRPOJob from `kubectl apply` to Succeeded on a local Kubernetes control plane.

    python -m tests.e2e.demo [--job FILE] [--keep] [--kueue | --real-node]

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

With --real-node (`make demo REAL_NODE=1`) nothing runs on the host in a pod's place: the real node
(kubelet, containerd, runc, CNI, kube-proxy, CoreDNS; built from Go modules once) starts beside the
control plane, the operator and CPU trainer images are built from images/*.Dockerfile (buildah,
cached by content) and imported into its containerd, `helm install` runs the operator and its
webhook as a pod, and the job's head and two workers are containers of the trainer image;
`kubectl get pods -o wide` is printed beside `kubectl get agj` whenever the pods change. Needs
root and Debian's runc and busybox-static (`.ci/run` installs them). Cold, the node's build and
the images add about half an hour; warm, the trainer image's import into containerd (~2 min).

Without Kubernetes, the same trainer runs with `asyncgrpo run docs/examples/async-exact.yaml`.
"""

from __future__ import annotations

import argparse
import os
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
from tests.cluster import node
from tests.cluster.build import BuildError, build, build_node, build_optional, layout, optional_layout
from tests.cluster.cluster import ClusterError, LocalCluster
from tests.cluster.images import build_all
from tests.cluster.rest import Api
from tests.cluster.samples import pods
from tests.e2e.real_pods import InClusterChart, checkpoint_dir, import_images, real_job
from tests.e2e.test_operator import ProgressServer
from tests.e2e.whole_path import AgjWatch, DriverKubelet, LocalDriver, drive, terminal, wait_terminal
from tests.webhook.cluster_harness import SELECTOR_LABEL, Installation, Kubectl

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


@dataclass
class PodsWatch:
    """`kubectl get pods -o wide` of the job's pods, printed whenever a pod appears, goes, changes
    phase or readiness, or gets its node and IP (not on every tick: AGE alone changes)."""

    api: Api
    kubectl: Kubectl
    namespace: str
    job: str
    _last: tuple[tuple[str, ...], ...] = ()

    def tick(self) -> None:
        found = pods(self.api, self.namespace, f"asyncgrpo.dev/job-name={self.job}")
        key = tuple(
            sorted(
                (
                    p["metadata"]["name"],
                    str(p.get("status", {}).get("phase")),
                    str([c.get("ready") for c in p.get("status", {}).get("containerStatuses") or []]),
                    str(p.get("spec", {}).get("nodeName")),
                    str(p.get("status", {}).get("podIP")),
                    str(bool(p["metadata"].get("deletionTimestamp"))),
                )
                for p in found
            )
        )
        if key == self._last:
            return
        self._last = key
        selector = f"asyncgrpo.dev/job-name={self.job}"
        table = self.kubectl("get", "pods", "-o", "wide", "-n", self.namespace, "-l", selector)
        print(f"$ kubectl get pods -o wide -n {self.namespace}")
        print(table.stdout.rstrip() or table.stderr.rstrip(), flush=True)


def real_node_ready(cluster: LocalCluster) -> None:
    """Build (once) and start the real node beside the control plane."""
    if os.geteuid() != 0 or not node.BUSYBOX.is_file():
        raise SystemExit(
            "error: the real node needs root and Debian's runc and busybox-static:\n"
            "    apt-get install -y runc busybox-static   (or run the demo without REAL_NODE=1)"
        )
    say(
        "Real node: kubelet, containerd, runc, the CNI plugins, kube-proxy and CoreDNS beside the kwok\n"
        "    nodes (built from Go modules the first time, with a progress line every 30 s; cached)"
    )
    binaries = build_node()
    with heartbeat("starting the real node"):
        cluster.start_real_node(binaries)


def run_on_real_node(job_file: Path, *, keep: bool) -> int:
    """The demo with real containers: the operator and the job's Ray pods on the real node."""
    t0 = time.monotonic()
    cluster, started = control_plane()
    helm_bin = find_helm()
    if helm_bin is None:
        raise SystemExit(f"error: {NO_HELM}")
    chart: InClusterChart | None = None
    try:
        real_node_ready(cluster)
        say(
            "Images: the operator and the CPU trainer from images/*.Dockerfile (buildah; the first build\n"
            "    takes minutes, later ones reuse it while the files are unchanged), imported into the\n"
            "    node's containerd: no registry, imagePullPolicy Never"
        )
        t0 = time.monotonic()
        built = {b.name: b for b in build_all()}
        print(f"    images (built, or cached while unchanged): {time.monotonic() - t0:.0f} s")
        import_images(cluster, built, lambda what, seconds, **_: print(f"    {what}: {seconds:.0f} s"))
        chart = InClusterChart(cluster, helm_bin, built["operator"].ref, name="demo")
        say(
            f"helm install {chart.release} {CHART.relative_to(REPO)} -n {chart.namespace}"
            " --create-namespace\n"
            "    (the operator and its webhook as a pod of the operator image; the API server calls the\n"
            "    webhook through its Service)"
        )
        with heartbeat("waiting for the operator pod", every=15):
            seconds = chart.install()
        print(f"    operator pod Ready after {seconds:.0f} s")
        ns = chart.jobs_ns
        job = real_job(
            yaml.safe_load(job_file.read_text())["metadata"]["name"],
            image=built["trainer-cpu"].ref,
            checkpoints=checkpoint_dir(chart.workdir),
            demo=True,
            job_file=job_file,
        )
        name = job["metadata"]["name"]
        say(
            f"kubectl apply -n {ns} (the job of {job_file.name}, on the real node: the trainer image, one\n"
            "    Ray CPU per pod, checkpoints on a hostPath folder)"
        )
        outcome = chart.kubectl.apply(ns, job)
        print("    " + (outcome.stdout.strip() or outcome.stderr.strip()))
        if outcome.returncode != 0:
            return 1
        say(
            "KubeRay starts the head (Ray head + driver) and the workers; the operator reads /progress\n"
            "    at the head pod's IP"
        )
        agj = AgjWatch(chart.kubectl, ns, name, out=sys.stdout, every=2.0)
        pod_watch = PodsWatch(chart.api, chart.kubectl, ns, name)
        deadline = time.monotonic() + JOB_TIMEOUT
        while not terminal(chart.api, ns, name):
            if time.monotonic() > deadline:
                print(f"error: {name} not finished after {JOB_TIMEOUT:.0f} s", file=sys.stderr)
                return 1
            pod_watch.tick()
            agj.tick()
            time.sleep(1)
        pod_watch.tick()
        agj.poll()
        status = wait_terminal(chart.api, ns, name)
        progress = status.get("progress") or {}
        held_out = progress.get("validationAccuracy")
        print(
            f"\n{name}: {status.get('phase')} ({status.get('reason')}) after {progress.get('step')} steps"
            " on real pods"
            + (f"; held-out accuracy {held_out:.2f} (greedy)" if held_out is not None else "")
            + f"; restarts {status.get('restarts', 0)}; {time.monotonic() - t0:.0f} s in all"
        )
        job_pods = pods(chart.api, ns, f"asyncgrpo.dev/job-name={name}")
        head = [p for p in job_pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "head"]
        if head:
            print(f"the driver's log: kubectl logs -n {ns} {head[0]['metadata']['name']} -c driver")
        return 0 if status.get("phase") == "Succeeded" else 1
    finally:
        say("Cleaning up: the job, the chart and the operator")
        if chart is not None:
            try:
                chart.uninstall()
            except Exception as exc:  # cleanup must not hide the outcome
                print(f"    cleanup: {exc}")
        if cluster.leave(keep=keep):
            print("    the control plane and the real node this demo started are stopped")
        elif started:
            print("    the control plane is still used by another session or --keep: left up")
        else:
            print("    the control plane was already up: left up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--job", type=Path, default=DEMO_JOB, help="the AsyncGRPOJob to apply")
    parser.add_argument("--keep", action="store_true", help="leave a control plane this demo started up")
    parser.add_argument("--kueue", action="store_true", help="queue the job in Kueue (built on first use)")
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="run the operator and the job's pods as containers on the real node (root; built on first use)",
    )
    ns = parser.parse_args(argv)
    if ns.kueue and ns.real_node:
        parser.error("--kueue and --real-node are separate demos; pick one")
    try:
        if ns.real_node:
            return run_on_real_node(ns.job.resolve(), keep=ns.keep)
        return run(ns.job.resolve(), keep=ns.keep, with_kueue=ns.kueue)
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
