"""Operator vs KubeRay RayJob vs the floor, on the local control plane (issue 10).

    python -m bench.operator.bench [--reps 3] [--sizes 1,50] [--scale 500,1000] [--private]

What it measures, in one run, interleaving the three ways of getting a RayCluster so that the
machine's noise (other engineers' tests on 2 cores) falls on all of them alike:

- `agj`: an AsyncGRPOJob, created through the chart's validating webhook (helm install, URL mode
  on 127.0.0.1, as tests/e2e/test_webhook.py does), reconciled by our operator
  (`kopf run -m asyncgrpo_operator.main`, as the chart's ServiceAccount);
- `rayjob`: a KubeRay RayJob whose rayClusterSpec is exactly the RayCluster our operator renders
  for that job (manifests.py), handled by the real KubeRay 1.6.2 operator;
- `floor`: the same RayCluster created directly with one POST (no controller in between).

For every object two latencies, from just before its create request (the `kubectl apply`
moment) to the moment a watch event shows:
- `cluster`: the RayCluster exists (ADDED on a RayCluster watch; for the floor: the POST's answer);
- `running`: AGJ status.phase Running (driver container running, all pods Ready through kwok);
  RayJob status.jobDeploymentStatus Running; floor: RayCluster status.state ready.

Then the scale run: `--scale` objects of each kind at once: time until all RayClusters exist and
until all are Running, peak RSS and CPU seconds of our operator and of KubeRay, and, when the API
server writes an audit log (ASYNCGRPO_CLUSTER_AUDIT=1; `--private` starts such a cluster), the API
requests each controller made per job.

Not part of the test run (it takes ~10-20 minutes). Writes JSON with every sample to --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import copy
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRIVATE_STATE = "/tmp/agc-opbench"
PRIVATE_OFFSET = "400"

JSON = dict[str, Any]
AGJ = "/apis/asyncgrpo.dev/v1alpha1/namespaces/{ns}/asyncgrpojobs"
RAYJOB = "/apis/ray.io/v1/namespaces/{ns}/rayjobs"
RAYCLUSTER = "/apis/ray.io/v1/namespaces/{ns}/rayclusters"
KINDS = ("agj", "rayjob", "floor")


def _private_env() -> None:
    """Point tests.cluster at the benchmark's own audited cluster (before it is imported); the
    state folder and port offset can be moved with their variables, e.g. next to another run."""
    os.environ.setdefault("ASYNCGRPO_CLUSTER_STATE", PRIVATE_STATE)
    os.environ.setdefault("ASYNCGRPO_CLUSTER_PORT_OFFSET", PRIVATE_OFFSET)
    os.environ["ASYNCGRPO_CLUSTER_AUDIT"] = "1"


if "--private" in sys.argv:
    _private_env()

from tests.chart.helm import find_helm  # noqa: E402
from tests.cluster import nodes  # noqa: E402
from tests.cluster.cluster import LocalCluster  # noqa: E402
from tests.cluster.rest import Api, ApiError  # noqa: E402
from tests.e2e.test_operator import job_manifest  # noqa: E402
from tests.webhook.cluster_harness import Installation, running_chart  # noqa: E402

from asyncgrpo_api.rules import validate_manifest  # noqa: E402
from asyncgrpo_operator import manifests, runtime  # noqa: E402

# --- the watches -----------------------------------------------------------------------------------


@dataclass
class Marks:
    """First time each (kind, name) reached `cluster` and `running`, monotonic seconds."""

    started: dict[tuple[str, str], float] = field(default_factory=dict)
    cluster: dict[tuple[str, str], float] = field(default_factory=dict)
    running: dict[tuple[str, str], float] = field(default_factory=dict)
    last_state: dict[tuple[str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, which: dict[tuple[str, str], float], key: tuple[str, str], at: float) -> None:
        with self.lock:
            which.setdefault(key, at)

    def reset(self) -> None:
        with self.lock:
            for d in (self.started, self.cluster, self.running, self.last_state):
                d.clear()


class Watch(threading.Thread):
    """One streaming watch (list, then watch from its resourceVersion; re-watch on expiry)."""

    def __init__(self, api: Api, path: str, handle: Any) -> None:
        super().__init__(daemon=True, name=f"watch {path}")
        self.api, self.path, self.handle = api, path, handle
        self.stopped = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        host, port = self.api.base_url.removeprefix("https://").split(":")
        while not self.stopped.is_set():
            try:
                # What changed while the previous watch ended and this one starts is only in the
                # list: a batch outliving the watch's 540 s would otherwise miss it and time out.
                listed = self.api.get(self.path)
                at = time.monotonic()
                for obj in listed.get("items") or []:
                    self.handle(obj, at)
                rv = listed.get("metadata", {}).get("resourceVersion", "")
                conn = http.client.HTTPSConnection(host, int(port), context=self.api.ctx, timeout=600)
                conn.request("GET", f"{self.path}?watch=1&resourceVersion={rv}&timeoutSeconds=540")
                resp = conn.getresponse()
                self.ready.set()
                while not self.stopped.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    at = time.monotonic()
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.handle(event["object"], at)
                conn.close()
            except Exception as exc:
                print(f"watch {self.path}: {exc!r}; reconnecting", file=sys.stderr)
                time.sleep(0.5)


def _owner(obj: JSON) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return str(refs[0]["name"]) if refs else None


def watch_all(api: Api, marks: Marks, agj_ns: str, other_ns: str) -> list[Watch]:
    def on_cluster(obj: JSON, at: float) -> None:
        owner = _owner(obj)
        kind = {"AsyncGRPOJob": "agj", "RayJob": "rayjob"}.get(
            (obj["metadata"].get("ownerReferences") or [{}])[0].get("kind", ""), "floor"
        )
        name = owner if kind != "floor" else obj["metadata"]["name"]
        assert name is not None
        marks.mark(marks.cluster, (kind, name), at)
        if kind == "floor" and (obj.get("status") or {}).get("state") == "ready":
            marks.mark(marks.running, (kind, name), at)

    def on_agj(obj: JSON, at: float) -> None:
        key = ("agj", obj["metadata"]["name"])
        phase = (obj.get("status") or {}).get("phase", "")
        marks.last_state[key] = phase
        if phase == "Running":
            marks.mark(marks.running, key, at)

    def on_rayjob(obj: JSON, at: float) -> None:
        key = ("rayjob", obj["metadata"]["name"])
        state = (obj.get("status") or {}).get("jobDeploymentStatus", "")
        marks.last_state[key] = state
        if state == "Running":
            marks.mark(marks.running, key, at)

    watches = [
        Watch(api, RAYCLUSTER.format(ns=agj_ns), on_cluster),
        Watch(api, RAYCLUSTER.format(ns=other_ns), on_cluster),
        Watch(api, AGJ.format(ns=agj_ns), on_agj),
        Watch(api, RAYJOB.format(ns=other_ns), on_rayjob),
    ]
    for w in watches:
        w.start()
    for w in watches:
        w.ready.wait(30)
    return watches


# --- the objects -----------------------------------------------------------------------------------


class ProgressServer:
    """The drivers' /progress (kwok runs no driver): answers at once, like a running driver. The
    operator reads every job's from `url` (its ASYNCGRPO_PROGRESS_URL_TEMPLATE, no placeholders)."""

    def __init__(self) -> None:
        body = json.dumps({"step": 1, "maxSteps": 100, "policyVersion": 1, "state": "running"}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/progress"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def agj(name: str) -> JSON:
    """The e2e test's small job: CPU head, one 1-GPU worker per pool; /progress polled every 60 s."""
    return job_manifest(name, progress={"pollSeconds": 60, "stallAfterSeconds": 3600})


def rendered_raycluster(name: str, namespace: str) -> JSON:
    """The RayCluster our operator creates for `agj(name)` (minus ownerReferences)."""
    manifest = {**agj(name), "metadata": {"name": name, "namespace": namespace}}
    report = validate_manifest(manifest)
    assert report.job is not None, report.errors
    (cluster,) = [o for o in manifests.objects(report.job, attempt=0) if o["kind"] == "RayCluster"]
    cluster = copy.deepcopy(cluster)
    cluster["metadata"] = {"name": name, "namespace": namespace}
    return cluster


def rayjob(name: str, namespace: str) -> JSON:
    """A RayJob of the same cluster shape (K8sJobMode: KubeRay submits through a Job's pod)."""
    spec = rendered_raycluster(name, namespace)["spec"]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "entrypoint": "python -c 'print(1)'",
            "rayClusterSpec": spec,
            "shutdownAfterJobFinishes": False,
        },
    }


# --- one batch ------------------------------------------------------------------------------------


@dataclass
class Bench:
    api: Api
    install: Installation
    agj_ns: str
    other_ns: str
    progress: ProgressServer
    marks: Marks
    pool: cf.ThreadPoolExecutor

    def create(self, kind: str, name: str) -> None:
        key = (kind, name)
        if kind == "agj":
            path, body = AGJ.format(ns=self.agj_ns), agj(name)
        elif kind == "rayjob":
            path, body = RAYJOB.format(ns=self.other_ns), rayjob(name, self.other_ns)
        else:
            path = RAYCLUSTER.format(ns=self.other_ns)
            body = rendered_raycluster(name, self.other_ns)
        self.marks.mark(self.marks.started, key, time.monotonic())
        self.api.create(path, body)
        if kind == "floor":
            self.marks.mark(self.marks.cluster, key, time.monotonic())

    def batch(self, kind: str, size: int, tag: str, timeout: float) -> JSON:
        names = [f"{kind[0]}{tag}-{i}" for i in range(size)]
        keys = [(kind, n) for n in names]
        # Bodies are built before the clock starts; creates go out in parallel ("applied at once").
        t0 = time.monotonic()
        list(self.pool.map(lambda n: self.create(kind, n), names))
        created = time.monotonic() - t0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(k in self.marks.running for k in keys):
                break
            time.sleep(0.1)
        cluster = [self.marks.cluster[k] - self.marks.started[k] for k in keys if k in self.marks.cluster]
        running = [self.marks.running[k] - self.marks.started[k] for k in keys if k in self.marks.running]
        last = Counter(self.marks.last_state.get(k, "") for k in keys if k not in self.marks.running)
        all_cluster = max((self.marks.cluster[k] for k in keys if k in self.marks.cluster), default=t0) - t0
        all_running = max((self.marks.running[k] for k in keys if k in self.marks.running), default=t0) - t0
        return {
            "kind": kind,
            "size": size,
            "tag": tag,
            "create_seconds": created,
            "cluster": cluster,
            "running": running,
            "all_cluster_seconds": all_cluster if len(cluster) == size else None,
            "all_running_seconds": all_running if len(running) == size else None,
            "not_running": dict(last),
        }

    def cleanup(self, timeout: float = 600) -> None:
        """Delete everything of the batch and wait until no pod is left (next batch starts clean)."""
        slow = Api(self.api.base_url, self.api.pki, timeout=600)  # deleting 500 objects takes a while
        owners = (AGJ.format(ns=self.agj_ns), RAYJOB.format(ns=self.other_ns))
        # The owners first: a RayCluster deleted under a live job would be replaced (a restart).
        # A delete-collection of 500 objects can outlive the API server's 60 s request timeout
        # (the connection is closed, the deletion stops part way): send it again until done.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(self.api.get(p).get("items") for p in owners):
            for path in owners:
                with contextlib.suppress(ApiError, OSError):
                    slow.request("DELETE", path, {"propagationPolicy": "Background"})
            time.sleep(1)
        children = (
            RAYCLUSTER.format(ns=self.agj_ns),
            RAYCLUSTER.format(ns=self.other_ns),
            f"/apis/batch/v1/namespaces/{self.other_ns}/jobs",
        )
        # The same for the children (the floor's 1,000 RayClusters outlived one delete-collection).
        while time.monotonic() < deadline and any(self.api.get(p).get("items") for p in children):
            for path in children:
                with contextlib.suppress(ApiError, OSError):
                    slow.request("DELETE", path, {"propagationPolicy": "Background"})
            time.sleep(1)
        while time.monotonic() < deadline:
            left = sum(
                len(self.api.get(p).get("items", []))
                for p in (
                    f"/api/v1/namespaces/{self.agj_ns}/pods",
                    f"/api/v1/namespaces/{self.other_ns}/pods",
                    RAYCLUSTER.format(ns=self.agj_ns),
                    RAYCLUSTER.format(ns=self.other_ns),
                    AGJ.format(ns=self.agj_ns),
                    RAYJOB.format(ns=self.other_ns),
                )
            )
            if left == 0:
                break
            time.sleep(1)
        self.marks.reset()


# --- processes: RSS, CPU, the audit log ------------------------------------------------------------


def proc_sample(pid: int) -> tuple[int, float]:
    """(RSS bytes, CPU seconds user+sys) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


class Sampler(threading.Thread):
    """Peak RSS and CPU seconds of some processes while a phase runs (sampled every 0.2 s)."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak: dict[str, int] = dict.fromkeys(pids, 0)
        self.cpu0 = {n: proc_sample(p)[1] for n, p in pids.items()}
        self.cpu: dict[str, float] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    self.peak[name] = max(self.peak[name], proc_sample(pid)[0])

    def stop(self) -> JSON:
        self.stopped.set()
        self.join()
        self.cpu = {n: proc_sample(p)[1] - self.cpu0[n] for n, p in self.pids.items()}
        return {n: {"peak_rss_mib": self.peak[n] / 2**20, "cpu_seconds": self.cpu[n]} for n in self.pids}


def audit_offset(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def audit_counts(path: Path, start: int, who: dict[str, Any]) -> JSON:
    """Requests per client since byte `start` of the audit log: {client: {total, by verb/resource}}.

    Each finished request is one ResponseComplete line (a watch: one ResponseStarted line when it
    opens); `who` maps a client name to a predicate on (username, userAgent)."""
    out: dict[str, Counter[str]] = {name: Counter() for name in who}
    if not path.exists():
        return {}
    with path.open("rb") as fh:
        fh.seek(start)
        for raw in fh:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            stage, verb = ev.get("stage"), ev.get("verb")
            if not (stage == "ResponseComplete" and verb != "watch") and not (
                stage == "ResponseStarted" and verb == "watch"
            ):
                continue
            user = ev.get("user", {}).get("username", "")
            agent = ev.get("userAgent", "")
            ref = ev.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            what = f"{verb} {ref.get('resource', '?')}{sub}"
            for name, match in who.items():
                if match(user, agent):
                    out[name][what] += 1
                    out[name]["total"] += 1
    return {name: dict(c.most_common()) for name, c in out.items()}


# --- the run --------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1) + 0.4999)))]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@contextlib.contextmanager
def installed(cluster: LocalCluster, workers: str, progress: ProgressServer) -> Iterator[Installation]:
    helm_bin = find_helm()
    if helm_bin is None:
        raise SystemExit("no helm binary (python -m tests.cluster build)")
    os.environ["ASYNCGRPO_WORKERS"] = workers
    with running_chart(cluster, helm_bin, progress_url_template=progress.url) as inst:
        yield inst


def kuberay_pid(cluster: LocalCluster) -> int:
    return next(r.pid for r in cluster.records() if r.name == "ray-operator")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator.bench")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", default="1,50")
    parser.add_argument("--scale", default="500", help="sizes of the scale runs, e.g. 500,1000 (0: none)")
    parser.add_argument("--scale-kinds", default="agj,rayjob,floor")
    parser.add_argument(
        "--workers", default=os.environ.get("ASYNCGRPO_WORKERS", str(runtime.DEFAULT_WORKERS))
    )
    parser.add_argument("--private", action="store_true", help="own audited cluster (started, then stopped)")
    parser.add_argument("--keep", action="store_true", help="with --private: leave the cluster running")
    parser.add_argument("--out", default="/tmp/opbench.json")
    parser.add_argument("--summarize", metavar="JSON", help="only print the tables of an earlier run")
    args = parser.parse_args(argv)
    if args.summarize:
        done = json.loads(Path(args.summarize).read_text())
        print(summary(done))
        print(scale_summary(done))
        print(side_by_side(done))
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s]
    scales = [int(s) for s in args.scale.split(",") if s and int(s) > 0]

    if args.private:
        subprocess.run([sys.executable, "-m", "tests.cluster", "up"], check=True, cwd=REPO)
    cluster = LocalCluster.from_env()
    api = cluster.api
    needed = max([*sizes, *scales])
    for node in nodes.bench_nodes(max(1, needed // 200 + 1), max(1, needed * 2 // 60 + 1)):
        with contextlib.suppress(ApiError):
            api.create("/api/v1/nodes", node)
    result: JSON = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": argv, "batches": []}
    progress = ProgressServer()
    marks = Marks()
    try:
        with installed(cluster, args.workers, progress) as inst, cf.ThreadPoolExecutor(16) as pool:
            other_ns = inst.jobs_namespace("kuberay", validated=False)
            try:
                watches = watch_all(api, marks, inst.jobs_ns, other_ns)
                bench = Bench(api, inst, inst.jobs_ns, other_ns, progress, marks, pool)
                assert inst.process is not None
                op_pid, kr_pid = inst.process.pid, kuberay_pid(cluster)
                time.sleep(3)  # the operator's watches and the leader lease settle
                audit = cluster.paths.audit_log
                sa = f"system:serviceaccount:{inst.namespace}:{inst.fullname}"
                who = {
                    "asyncgrpo": lambda u, a: u == sa,
                    "kuberay": lambda u, a: a.startswith(("kuberay", "ray-operator", "manager")),
                }

                def measured(kind: str, size: int, tag: str, timeout: float) -> JSON:
                    """One batch with the load before it, the processes' peak RSS and CPU during
                    it, and the API requests each controller made meanwhile (from the audit log)."""
                    offset = audit_offset(audit)
                    load = loadavg()
                    sampler = Sampler({"asyncgrpo": op_pid, "kuberay": kr_pid})
                    sampler.start()
                    row = bench.batch(kind, size, tag, timeout=timeout)
                    row.update(load=load, load_after=loadavg(), procs=sampler.stop())
                    time.sleep(2)  # the audit log is written in batches
                    row["requests"] = audit_counts(audit, offset, who)
                    result["batches"].append(row)
                    print(_line(row), flush=True)
                    return row

                for size in sizes:
                    for rep in range(args.reps):
                        order = KINDS[rep % 3 :] + KINDS[: rep % 3]
                        for kind in order:
                            measured(kind, size, f"{size}r{rep}", 120 + size * 2).update(rep=rep)
                            bench.cleanup()
                for scale in scales:
                    for kind in args.scale_kinds.split(","):
                        measured(kind, scale, f"s{scale}", 900 + scale)
                        bench.cleanup(timeout=900 + scale)
                for w in watches:
                    w.stopped.set()
            finally:
                bench_cleanup_ns(api, other_ns)
            result["operator_log_tail"] = inst.log_tail(20)
    finally:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
        if args.private and not args.keep:
            subprocess.run([sys.executable, "-m", "tests.cluster", "down"], check=False, cwd=REPO)
    print(summary(result))
    print(scale_summary(result))
    print(side_by_side(result))
    return 0


def bench_cleanup_ns(api: Api, ns: str) -> None:
    with contextlib.suppress(ApiError):
        api.delete(f"/api/v1/namespaces/{ns}")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _line(row: JSON) -> str:
    return (
        f"{row['kind']:>6} n={row['size']:<3} {row['tag']:<8} load={row['load']:.1f} "
        f"cluster p50={_fmt(pct(row['cluster'], 50))} p99={_fmt(pct(row['cluster'], 99))} "
        f"running p50={_fmt(pct(row['running'], 50))} p99={_fmt(pct(row['running'], 99))} "
        f"all_cluster={_fmt(row['all_cluster_seconds'])} all_running={_fmt(row['all_running_seconds'])} "
        f"missing={row['not_running']} "
        + " ".join(f"{n}_cpu={v['cpu_seconds']:.1f}s" for n, v in row.get("procs", {}).items())
        + " requests="
        + str({k: v.get("total") for k, v in row.get("requests", {}).items()})
    )


def summary(result: JSON) -> str:
    """p50/p99 over all repetitions of a (kind, size), and ours / KubeRay and ours / floor."""
    rows: dict[tuple[int, str], JSON] = {}
    for b in result["batches"]:
        if b["tag"].startswith("s"):
            continue
        r = rows.setdefault((b["size"], b["kind"]), {"cluster": [], "running": [], "load": []})
        r["cluster"] += b["cluster"]
        r["running"] += b["running"]
        r["load"].append(b["load"])
    lines = [
        "| jobs | what | kind | n | p50 s | p99 s | ours/KubeRay p50, p99 | ours/floor p50, p99 | load |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for size in sorted({s for s, _ in rows}):
        for what in ("cluster", "running"):
            for kind in KINDS:
                if (size, kind) not in rows:
                    continue
                r = rows[(size, kind)]
                ratio_kr = ratio_fl = ""
                if kind == "agj":
                    kr, fl = rows.get((size, "rayjob")), rows.get((size, "floor"))
                    ratio_kr = _ratios(r[what], kr[what] if kr else [])
                    ratio_fl = _ratios(r[what], fl[what] if fl else [])
                loads = f"{min(r['load']):.1f}-{max(r['load']):.1f}"
                lines.append(
                    f"| {size} | {what} | {kind} | {len(r[what])} | {_fmt(pct(r[what], 50))} | "
                    f"{_fmt(pct(r[what], 99))} | {ratio_kr} | {ratio_fl} | {loads} |"
                )
    return "\n".join(lines)


def scale_summary(result: JSON) -> str:
    """The scale rows: time until all clusters exist / all Running, peaks, requests per job."""
    lines = [
        "| kind | jobs | all RayClusters exist s | all Running s | cluster p50 / p99 s | "
        "asyncgrpo peak RSS MiB, CPU s | KubeRay peak RSS MiB, CPU s | "
        "requests/job: asyncgrpo | requests/job: KubeRay | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in result["batches"]:
        if not b["tag"].startswith("s"):
            continue
        procs, reqs, n = b.get("procs", {}), b.get("requests", {}), b["size"]
        ours, theirs = procs.get("asyncgrpo", {}), procs.get("kuberay", {})
        per_job = [
            f"{reqs[c].get('total', 0) / n:.1f}" if c in reqs else "-" for c in ("asyncgrpo", "kuberay")
        ]
        lines.append(
            f"| {b['kind']} | {n} | {_fmt(b['all_cluster_seconds'])} | {_fmt(b['all_running_seconds'])} | "
            f"{_fmt(pct(b['cluster'], 50))} / {_fmt(pct(b['cluster'], 99))} | "
            f"{ours.get('peak_rss_mib', 0):.0f}, {ours.get('cpu_seconds', 0):.1f} | "
            f"{theirs.get('peak_rss_mib', 0):.0f}, {theirs.get('cpu_seconds', 0):.1f} | "
            f"{per_job[0]} | {per_job[1]} | {b['load']:.1f} |"
        )
    return "\n".join(lines)


def side_by_side(result: JSON) -> str:
    """Per size and kind, over all its batches: API requests per job of each controller, latency
    to RayCluster and to Running (p50 / p99), peak RSS and CPU seconds per job of each controller,
    and the 1-minute load average before the batches (range)."""
    rows: dict[tuple[int, str], JSON] = {}
    for b in result["batches"]:
        r = rows.setdefault(
            (b["size"], b["kind"]),
            {
                "jobs": 0,
                "cluster": [],
                "running": [],
                "load": [],
                "req": Counter(),
                "cpu": Counter(),
                "rss": {},
            },
        )
        r["jobs"] += b["size"]
        r["cluster"] += b["cluster"]
        r["running"] += b["running"]
        r["load"].append(b["load"])
        for who, counts in b.get("requests", {}).items():
            r["req"][who] += counts.get("total", 0)
        for who, proc in b.get("procs", {}).items():
            r["cpu"][who] += proc["cpu_seconds"]
            r["rss"][who] = max(r["rss"].get(who, 0.0), proc["peak_rss_mib"])
    lines = [
        "| jobs | kind | n | requests/job: asyncgrpo | requests/job: KubeRay | to RayCluster p50 / p99 s "
        "| to Running p50 / p99 s | asyncgrpo peak RSS MiB, CPU s/job | KubeRay peak RSS MiB, CPU s/job "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (size, kind), r in sorted(rows.items(), key=lambda kv: (kv[0][0], KINDS.index(kv[0][1]))):
        n = r["jobs"]
        lines.append(
            f"| {size} | {kind} | {n} | {r['req']['asyncgrpo'] / n:.1f} | {r['req']['kuberay'] / n:.1f} | "
            f"{_fmt(pct(r['cluster'], 50))} / {_fmt(pct(r['cluster'], 99))} | "
            f"{_fmt(pct(r['running'], 50))} / {_fmt(pct(r['running'], 99))} | "
            f"{r['rss'].get('asyncgrpo', 0):.0f}, {r['cpu']['asyncgrpo'] / n:.3f} | "
            f"{r['rss'].get('kuberay', 0):.0f}, {r['cpu']['kuberay'] / n:.3f} | "
            f"{min(r['load']):.1f}-{max(r['load']):.1f} |"
        )
    return "\n".join(lines)


def _ratios(ours: list[float], theirs: list[float]) -> str:
    parts = []
    for q in (50, 99):
        a, b = pct(ours, q), pct(theirs, q)
        parts.append("-" if a is None or not b else f"{a / b:.2f}")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
