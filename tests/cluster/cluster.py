"""`up`, `down` and `status` of the local control plane.

Order matters (see docs/operations/local-cluster.md): etcd, then the API server; the KubeRay CRDs,
KCM, the scheduler and kwok next (in parallel); the fake nodes once kwok runs; the KubeRay operator
only after its CRDs are Established, or its informers fail. `up` is idempotent: on a live cluster it
returns at once, on a dead one it stops what is left and starts afresh in the same state folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import components as comp
from tests.cluster import dns, hostnet, kueue
from tests.cluster import node as node_mod
from tests.cluster import pki as pki_mod
from tests.cluster.build import Layout, NodeLayout, OptionalLayout
from tests.cluster.config import HERE, HOST, PORTS, REAL_NODE_NAME, state_dir
from tests.cluster.nodes import default_nodes
from tests.cluster.processes import (
    PidFile,
    ProcRecord,
    is_alive,
    log_tail,
    port_in_use,
    rss_bytes,
    spawn,
    start_ticks,
    stop,
)
from tests.cluster.rest import JSON, Api, ApiError, client_context, condition

STAGES_FILE = HERE / "kwok-stages.yaml"
# Standalone kwok does not default these (kwokctl does); zero makes it exit at start.
KWOK_CONFIG_HEADER = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 2
---
"""
UP_TIMEOUT = 180.0
REAL_NODE_PROCESSES = ("kubelet", "kube-proxy", "coredns", "containerd")
"""The real node's processes, in the order `down` stops them (the kubelet first: see node.py)."""


class ClusterError(RuntimeError):
    """`up` could not bring the control plane up; the message names the component and its log."""


def _log(msg: str) -> None:
    print(f"[ctrlplane] {msg}", file=sys.stderr, flush=True)


def _serves(api: Api, group_version: str, resource: str) -> bool:
    """Whether the API server's discovery lists `resource` under `group_version` (a CRD's kinds are
    served a moment after it is Established)."""
    try:
        listed = api.get(group_version).get("resources") or []
    except ApiError:
        return False
    return any(r.get("name") == resource for r in listed)


def _probe(url: str, ctx: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _runs_a_kubelet(state: Path) -> bool:
    """Whether the cluster in `state` has a live kubelet (it holds the machine's real node)."""
    return any(r.name == "kubelet" and is_alive(r) for r in PidFile(state / "pids.json").load())


@dataclass
class LocalCluster:
    """A control plane whose state (PKI, etcd data, logs, PIDs, kubeconfig) lives in one folder."""

    paths: comp.StatePaths

    @classmethod
    def from_env(cls) -> LocalCluster:
        """The cluster in ASYNCGRPO_CLUSTER_STATE, or in the default state folder."""
        return cls(comp.StatePaths(state_dir()))

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def logs(self) -> Path:
        return self.paths.logs

    @property
    def api(self) -> Api:
        return Api(comp.apiserver_url(), self.paths.pki)

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.paths.pids)

    def records(self) -> list[ProcRecord]:
        return self.pidfile.load()

    def info(self) -> dict[str, Any]:
        """What `up` wrote about itself: binaries folder, start timings."""
        if not self.paths.info.exists():
            return {}
        data: dict[str, Any] = json.loads(self.paths.info.read_text())
        return data

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        """Run the built kubectl against this cluster (discovery cache kept in the state folder)."""
        binaries = self.info().get("binaries")
        if not binaries:
            raise ClusterError(f"no running cluster recorded in {self.paths.root}")
        argv = [
            str(Path(binaries) / "bin" / "kubectl"),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.paths.home / 'kube-cache'}",
            *args,
        ]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def is_live(self) -> bool:
        """Every recorded process runs and the API server answers /readyz."""
        recs = self.records()
        names = {r.name for r in recs}
        if not recs or not all(is_alive(r) for r in recs) or "ray-operator" not in names:
            return False
        return _probe(comp.apiserver_url() + "/readyz", self._ctx())

    def _ctx(self) -> ssl.SSLContext | None:
        return client_context(self.paths.pki) if self.paths.pki.admin_crt.exists() else None

    # ----------------------------------------------------------------- up

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state folder's lock (creating the folder if it is free to claim)."""
        self._claim_root()
        with self.paths.lock.open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _claim_root(self) -> None:
        """Use the folder only if it is ours or empty (never wipe a folder someone mistyped)."""
        root = self.paths.root
        if root.exists() and any(root.iterdir()) and not self.paths.marker.exists():
            raise ClusterError(f"{root} is not empty and not a control-plane state folder; refusing it")
        root.mkdir(parents=True, exist_ok=True)
        self.paths.marker.write_text("state folder of tests/cluster; `down --purge` deletes it\n")

    def join(self, binaries: Callable[[], Layout]) -> bool:
        """For a test session: attach to the live cluster or start one, and register this process.

        Returns True if this call started the cluster. Whoever started it, the last registered
        session to `leave` stops a cluster that a session started (never one started by the CLI).
        """
        with self.locked():
            started = False
            if not self.is_live():
                self._up_locked(binaries())
                self.paths.session_owned.touch()
                started = True
            self.paths.sessions.mkdir(exist_ok=True)
            pid = os.getpid()
            (self.paths.sessions / str(pid)).write_text(str(start_ticks(pid)))
            return started

    def leave(self, *, keep: bool = False) -> bool:
        """Unregister this session; stop the cluster if it was the last one. True if stopped."""
        with self.locked():
            (self.paths.sessions / str(os.getpid())).unlink(missing_ok=True)
            if self._live_sessions() or keep or not self.paths.session_owned.exists():
                return False
            self.down()
            return True

    def _live_sessions(self) -> list[int]:
        live = []
        for f in self.paths.sessions.glob("*") if self.paths.sessions.exists() else []:
            pid = int(f.name)
            if str(start_ticks(pid)) == f.read_text():
                live.append(pid)
            else:
                f.unlink(missing_ok=True)  # a session that died without leaving
        return live

    def up(self, binaries: Layout) -> dict[str, float]:
        """Start everything; return seconds since start at which each milestone was reached."""
        with self.locked():
            return self._up_locked(binaries)

    def _up_locked(self, binaries: Layout) -> dict[str, float]:
        if self.is_live():
            _log(f"already up (state {self.paths.root})")
            return {}
        self.down(quiet=True)
        self._fresh_state()
        self._check_ports()
        try:
            return self._start_all(binaries)
        except BaseException:
            self.down(quiet=True)  # never leave half a control plane running; logs stay
            raise

    def _start_all(self, binaries: Layout) -> dict[str, float]:
        t0 = time.monotonic()
        timings: dict[str, float] = {}

        def mark(what: str) -> None:
            timings[what] = round(time.monotonic() - t0, 2)
            _log(f"{what} after {timings[what]:.1f} s")

        p = pki_mod.create(self.paths.pki.dir)
        self._write_kubeconfig(p)
        self.paths.kwok_config.write_text(KWOK_CONFIG_HEADER + STAGES_FILE.read_text())
        mark("pki")

        etcd = self._start(comp.etcd(binaries, self.paths))
        self._wait_ready([etcd])
        mark("etcd ready")
        api = self._start(comp.kube_apiserver(binaries, self.paths))
        self._wait_ready([etcd, api])
        mark("kube-apiserver ready")

        rest = [
            self._start(comp.kube_controller_manager(binaries, self.paths)),
            self._start(comp.kube_scheduler(binaries, self.paths)),
            self._start(comp.kwok(binaries, self.paths)),
        ]
        self._apply_crds(binaries.kuberay_crds)
        mark("KubeRay CRDs established")
        ray = self._start(comp.ray_operator(binaries, self.paths))
        self._create_nodes()
        self._wait_ready([etcd, api, *rest, ray])
        mark("components healthy")
        self._wait(self._nodes_schedulable, "fake nodes Ready and untainted", [etcd, api, *rest])
        mark("nodes ready")
        info = {
            "binaries": str(binaries.root),
            "timings": timings,
            "ports": PORTS,
            "state": str(self.paths.root),
        }
        self.paths.info.write_text(json.dumps(info, indent=1))
        _log(f"up in {timings['nodes ready']:.1f} s; KUBECONFIG={self.kubeconfig}; logs in {self.logs}")
        return timings

    def _fresh_state(self) -> None:
        """Empty the (claimed) state folder, keeping only its lock, marker and session list."""
        keep = {self.paths.lock.name, self.paths.marker.name, self.paths.sessions.name}
        for child in self.paths.root.iterdir():
            if child.name in keep:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        for d in (self.logs, self.paths.home):
            d.mkdir(parents=True, exist_ok=True)

    def _check_ports(self) -> None:
        taken = [f"{name} ({HOST}:{port})" for name, port in PORTS.items() if port_in_use(HOST, port)]
        if taken:
            raise ClusterError(
                "ports already in use: " + ", ".join(taken) + ". Another control plane may be running: "
                "`python -m tests.cluster status`, or `down` with its ASYNCGRPO_CLUSTER_STATE."
            )

    def _write_kubeconfig(self, p: pki_mod.Pki) -> None:
        name = "asyncgrpo-local"
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": comp.apiserver_url(), "certificate-authority": str(p.ca_crt)},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(p.admin_crt), "client-key": str(p.admin_key)},
                }
            ],
            "contexts": [
                {"name": name, "context": {"cluster": name, "user": "admin", "namespace": "default"}}
            ],
            "current-context": name,
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "GO"))}
        home = str(self.paths.home)
        env.update(HOME=home, TMPDIR=home, KUBECONFIG=str(self.kubeconfig))
        return env

    def _start(self, spec: comp.Spec) -> ProcRecord:
        rec = spawn(
            spec.name, spec.argv, logs=self.logs, env=self._env(), cwd=self.paths.home, pids=self.pidfile
        )
        self._specs[rec.name] = spec
        return rec

    def __post_init__(self) -> None:
        self._specs: dict[str, comp.Spec] = {}

    def _wait(
        self, ok: Callable[[], bool], what: str, watch: Iterable[ProcRecord], timeout: float = UP_TIMEOUT
    ) -> None:
        """Poll `ok` until true; fail early, with the log tail, if a watched process exits."""
        deadline = time.monotonic() + timeout
        watch = list(watch)
        while time.monotonic() < deadline:
            for rec in watch:
                if not is_alive(rec):
                    raise ClusterError(
                        f"{rec.name} exited while waiting for {what}; log {rec.log}:\n{log_tail(rec.log)}"
                    )
            if ok():
                return
            time.sleep(0.2)
        raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}; logs in {self.logs}")

    def _wait_ready(self, recs: list[ProcRecord]) -> None:
        ctx = self._ctx()
        for rec in recs:
            url = self._specs[rec.name].ready_url
            if url is not None:
                self._wait(partial(_probe, url, ctx), f"{rec.name} at {url}", recs)

    def _apply_crds(self, folder: Path) -> None:
        """Server-side apply the KubeRay CRDs (too big for client-side apply) and wait Established."""
        files = sorted(folder.glob("*.json"))
        if not files:
            raise ClusterError(f"no KubeRay CRDs in {folder}; run `python -m tests.cluster build`")
        self.install_crds(files, log=True)

    def install_crds(
        self, files: Iterable[Path], *, timeout: float = UP_TIMEOUT, log: bool = False
    ) -> list[JSON]:
        """Server-side apply CRD files (YAML or JSON, one CRD each) and wait until all are Established.

        Server-side apply because large CRDs overflow client-side apply's last-applied annotation,
        and because it is idempotent: re-applying an unchanged CRD is a no-op. Returns the CRDs.
        """
        api = self.api
        paths: list[str] = []
        for f in files:
            text = f.read_text()
            doc = json.loads(text) if f.suffix == ".json" else yaml.safe_load(text)
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}"
            t = time.monotonic()
            api.apply(path, text if f.suffix == ".json" else json.dumps(doc))
            if log:
                _log(f"applied {doc['metadata']['name']} in {time.monotonic() - t:.1f} s")
            paths.append(path)
        crds: dict[str, JSON] = {}

        def established() -> bool:
            for path in paths:
                crd = api.get(path)
                c = condition(crd, "Established")
                if c is None or c["status"] != "True":
                    return False
                crds[path] = crd
            return True

        self._wait(established, "CRDs Established", self.records(), timeout=timeout)
        return [crds[p] for p in paths]

    def _create_nodes(self) -> None:
        for node in default_nodes():
            try:
                self.api.create("/api/v1/nodes", node)
            except ApiError as err:
                if err.status != 409:
                    raise

    def _nodes_schedulable(self) -> bool:
        items = self.api.get("/api/v1/nodes", labelSelector="type=kwok").get("items", [])
        if len(items) < len(default_nodes()):
            return False
        for n in items:
            c = condition(n, "Ready")
            ready = c is not None and c["status"] == "True"
            taints = n.get("spec", {}).get("taints") or []
            if not ready or any(t["key"].startswith("node.kubernetes.io/") for t in taints):
                return False
        return True

    # ----------------------------------------------------------------- optional components

    def kueue_running(self) -> bool:
        return any(r.name == "kueue" and is_alive(r) for r in self.records())

    def start_kueue(self, binaries: OptionalLayout) -> dict[str, float]:
        """Start Kueue on this live control plane (a no-op when it runs with this checkout's
        configuration; one started with another, e.g. by an older checkout, is restarted); see
        tests/cluster/kueue.py.

        In order: its CRDs Established, its namespace, certificates and config, the process until
        /readyz answers (its webhook server is listening), then its webhook configurations, and the
        ResourceFlavor and ClusterQueue, until the queue is Active. Returns milestone seconds.
        """
        with self.locked():
            if self.kueue_running() and kueue.configured(self.paths.root / "kueue"):
                return {}
            if self.kueue_running():  # started by an older checkout with another configuration
                _log("kueue: its configuration changed; restarting it")
                for rec in self.records():
                    if rec.name == "kueue":
                        stop(rec)
            t0 = time.monotonic()
            timings: dict[str, float] = {}

            def mark(what: str) -> None:
                timings[what] = round(time.monotonic() - t0, 2)
                _log(f"kueue: {what} after {timings[what]:.1f} s")

            self._forget("kueue")  # a dead one's record would make the cluster look dead
            self.install_crds(sorted(binaries.crds.glob("*.json")))
            api = self.api
            # Established is not yet served: Kueue's first act is to index Workloads by their kind,
            # and on a control plane that had just restarted it once exited with "no matches for
            # kind Workload in version kueue.x-k8s.io/v1beta2" although the CRDs were Established.
            self._wait(lambda: _serves(api, kueue.BASE, "workloads"), "Kueue's API served", self.records())
            mark("CRDs established")
            try:
                api.create("/api/v1/namespaces", {"metadata": {"name": kueue.NAMESPACE}})
            except ApiError as err:
                if err.status != 409:
                    raise
            config = kueue.prepare(self.paths.root / "kueue", self.paths.pki)
            rec = self._start(kueue.spec(binaries, config))
            self._wait_ready([rec])
            mark("controller ready")
            docs = json.loads(binaries.webhooks.read_text())
            for doc in kueue.webhook_configurations(docs, self.paths.pki.ca_crt.read_bytes()):
                plural = (
                    "mutatingwebhookconfigurations"
                    if "Mutating" in doc["kind"]
                    else "validatingwebhookconfigurations"
                )
                api.apply(
                    f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}",
                    json.dumps(doc),
                )
            api.apply(f"{kueue.BASE}/resourceflavors/{kueue.FLAVOR}", json.dumps(kueue.resource_flavor()))
            kueue.apply_cluster_queue(api, kueue.cluster_queue())
            self._wait(
                lambda: kueue.cluster_queue_active(api, kueue.CLUSTER_QUEUE), "ClusterQueue Active", [rec]
            )
            mark("queue active")
            info = self.info()
            info.setdefault("timings", {})["kueue"] = timings
            info["kueue"] = str(binaries.root)
            self.paths.info.write_text(json.dumps(info, indent=1))
            return timings

    def real_node_running(self) -> bool:
        return any(r.name == "kubelet" and is_alive(r) for r in self.records())

    def start_real_node(self, binaries: NodeLayout) -> dict[str, float]:
        """Start the real node on this live control plane (a no-op when it runs); see node.py.

        In order: the bridge and egress guard, the node's files and certificates, the RBAC
        binding and the kube-dns Service; containerd, then its images (pause, busybox); CoreDNS,
        kube-proxy and the kubelet; until the node is Ready. Returns milestone seconds.
        """
        with self.locked():
            if self.real_node_running():
                return {}
            t0 = time.monotonic()
            timings: dict[str, float] = {}

            def mark(what: str) -> None:
                timings[what] = round(time.monotonic() - t0, 2)
                _log(f"real node: {what} after {timings[what]:.1f} s")

            for name in REAL_NODE_PROCESSES:
                self._forget(name)
            try:
                hostnet.claim(self.paths.root, _runs_a_kubelet)
            except RuntimeError as err:
                raise ClusterError(str(err)) from None
            try:
                n = node_mod.NodePaths(self.paths.node)
                if n.root.exists():  # what a crashed node may have left
                    node_mod.cleanup(n, binaries.bin, machine_wide=True)
                    hostnet.teardown(n.saved_tunables)
                    shutil.rmtree(n.root)
                n.root.mkdir(parents=True)
                hostnet.setup(n.saved_tunables)
                node_mod.prepare(n, self.paths.pki, binaries)
                n.corefile.write_text(dns.corefile(self.kubeconfig))
                self._apply_real_node_objects()
                ctrd = self._start(node_mod.containerd(binaries, n))
                self._wait(lambda: node_mod.containerd_ready(binaries.bin, n), "containerd's socket", [ctrd])
                mark("containerd ready")
                for archive in [binaries.pause_image, *sorted(n.images.glob("*.tar"))]:
                    node_mod.import_image(binaries.bin, n, archive)
                mark("images imported")
                rest = [
                    self._start(dns.coredns(binaries.binary("coredns"), n.corefile)),
                    self._start(node_mod.kube_proxy(binaries, n)),
                    self._start(node_mod.kubelet(binaries, n)),
                ]
                self._wait_ready([ctrd, *rest])
                self._wait(self._real_node_ready, f"node {REAL_NODE_NAME} Ready", [ctrd, *rest])
            except BaseException:
                self._stop_real_node()  # never leave half a node running; logs stay
                raise
            mark("node ready")
            info = self.info()
            info.setdefault("timings", {})["real-node"] = timings
            info["real_node"] = str(binaries.root)
            self.paths.info.write_text(json.dumps(info, indent=1))
            return timings

    def _apply_real_node_objects(self) -> None:
        """The node's RBAC binding, and the kube-dns Service with its EndpointSlice (dns.py)."""
        rbac = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
        self.api.apply(f"{rbac}/{node_mod.NODE_ROLE_BINDING}", json.dumps(node_mod.node_role_binding()))
        ns = f"namespaces/{dns.NAMESPACE}"
        self.api.apply(f"/api/v1/{ns}/services/{dns.SERVICE}", json.dumps(dns.service()))
        slice_ = dns.endpoint_slice()
        name = slice_["metadata"]["name"]
        self.api.apply(f"/apis/discovery.k8s.io/v1/{ns}/endpointslices/{name}", json.dumps(slice_))

    def import_image(self, archive: Path) -> None:
        """Import an image archive into the running real node's containerd (no registry here)."""
        binaries = self.info().get("real_node")
        if not binaries:
            raise ClusterError(f"no real node recorded in {self.paths.root}")
        node_mod.import_image(Path(binaries) / "bin", node_mod.NodePaths(self.paths.node), archive)

    def _real_node_ready(self) -> bool:
        try:
            c = condition(self.api.get(f"/api/v1/nodes/{REAL_NODE_NAME}"), "Ready")
        except ApiError:
            return False
        return c is not None and c["status"] == "True"

    def _stop_real_node(self) -> list[str]:
        """Stop the kubelet, remove its pods while containerd runs, stop the rest of the node and
        undo its mounts, iptables rules and bridge. Returns the names stopped."""
        records = self.records()
        by_name = {r.name: r for r in records}
        n = node_mod.NodePaths(self.paths.node)
        if not n.root.exists() and not set(by_name) & set(REAL_NODE_PROCESSES):
            return []
        stopped = []
        ctrd = by_name.get("containerd")
        bin_dir = Path(ctrd.argv[0]).parent if ctrd is not None else None
        if "kubelet" in by_name and stop(by_name["kubelet"]):
            stopped.append("kubelet")
        if ctrd is not None and bin_dir is not None and is_alive(ctrd):
            node_mod.remove_pods(bin_dir, n)
        for name in REAL_NODE_PROCESSES:
            if name in by_name and name != "kubelet" and stop(by_name[name]):
                stopped.append(name)
        if n.root.exists():
            ours = hostnet.owned_by(self.paths.root)  # else another cluster's node: leave it be
            node_mod.cleanup(n, bin_dir, machine_wide=ours)
            if ours:
                hostnet.teardown(n.saved_tunables)
                hostnet.release(self.paths.root)
        self.pidfile.clear()
        for rec in records:
            if rec.name not in REAL_NODE_PROCESSES:
                self.pidfile.add(rec)
        return stopped

    def _forget(self, name: str) -> None:
        """Drop the records of a component that is no longer running."""
        records = self.records()
        self.pidfile.clear()
        for rec in records:
            if rec.name != name or is_alive(rec):
                self.pidfile.add(rec)

    # ----------------------------------------------------------------- down / status

    def down(self, *, purge: bool = False, quiet: bool = False) -> list[str]:
        """Stop the recorded processes, newest first; keep logs unless `purge` (then delete state)."""
        stopped = self._stop_real_node()
        for rec in reversed(self.records()):
            if stop(rec):
                stopped.append(rec.name)
        self.pidfile.clear()
        purge = purge and self.paths.marker.exists()
        if stopped and not quiet:
            where = f"deleted {self.paths.root}" if purge else f"logs kept in {self.logs}"
            _log(f"stopped {', '.join(stopped)}; {where}")
        if purge:
            shutil.rmtree(self.paths.root)
        return stopped

    def restart(self, name: str, *, down_for: float = 0.0, timeout: float = UP_TIMEOUT) -> ProcRecord:
        """Restart one component in place, as a node reboot or a rolling upgrade would.

        SIGTERM (then SIGKILL after the grace period) to the recorded process, `down_for` seconds
        with nothing listening, then the same command line again, recorded in place of the old
        one. Returns once the component is live again (for kube-apiserver: /readyz answers).
        Meant for fault tests on a private control plane; clients of a shared one see the outage.
        """
        with self.locked():
            records = self.records()
            old = next((r for r in records if r.name == name), None)
            if old is None:
                raise ClusterError(f"no component {name!r}; known: {[r.name for r in records]}")
            stop(old)
            time.sleep(down_for)
            self.pidfile.clear()
            for rec in records:
                if rec is not old:
                    self.pidfile.add(rec)
            new = spawn(
                name, old.argv, logs=self.logs, env=self._env(), cwd=self.paths.home, pids=self.pidfile
            )
            self._wait(self.is_live, f"{name} live again after a restart", [new], timeout=timeout)
        _log(f"restarted {name} (pid {old.pid} -> {new.pid})")
        return new

    def status(self) -> list[dict[str, Any]]:
        """One row per recorded process: pid, alive, RSS in MiB, log file."""
        return [
            {
                "name": r.name,
                "pid": r.pid,
                "alive": is_alive(r),
                "rss_mib": round(rss_bytes(r.pid) / 2**20),
                "log": r.log,
            }
            for r in self.records()
        ]
