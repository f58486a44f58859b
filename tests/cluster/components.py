"""Command lines of the control-plane processes, and how to tell each one is ready.

Kept apart from the launcher so the flags (the part people tune) read as one table. Flags follow
controller-runtime's envtest defaults plus what a realistic cluster needs: TLS on 127.0.0.1,
service-account keys, RBAC, the default admission plugins (so Mutating/ValidatingAdmissionWebhook
stay on), and KCM with the garbage collector and a short node grace period.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.build import Layout
from tests.cluster.config import HOST, NODE_GRACE_SECONDS, NODE_IP, POD_CIDR, PORTS, SERVICE_CIDR
from tests.cluster.pki import FRONT_PROXY_CLIENT, Pki


@dataclass(frozen=True)
class StatePaths:
    """Files and folders of one running cluster, all under the state folder."""

    root: Path

    @property
    def marker(self) -> Path:
        return self.root / ".asyncgrpo-ctrlplane"

    @property
    def lock(self) -> Path:
        """flock'ed around up/down/join/leave so concurrent pytest sessions never race."""
        return self.root / ".lock"

    @property
    def sessions(self) -> Path:
        """One file per attached test session (named by pid, holding its start time)."""
        return self.root / "sessions"

    @property
    def session_owned(self) -> Path:
        """Present when a test session (not the CLI) started the cluster: the last session stops it."""
        return self.root / "started-by-pytest"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def pids(self) -> Path:
        return self.root / "pids.json"

    @property
    def home(self) -> Path:
        """HOME and TMPDIR of the children, so nothing they write escapes the state folder."""
        return self.root / "home"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines), written only with ASYNCGRPO_CLUSTER_AUDIT=1."""
        return self.root / "logs" / "audit.jsonl"

    @property
    def node(self) -> Path:
        """The real node's files (tests/cluster/node.py), when it runs."""
        return self.root / "node"

    @property
    def info(self) -> Path:
        """JSON with the binaries folder, timings and ports of the running cluster."""
        return self.root / "cluster.json"


@dataclass(frozen=True)
class Spec:
    """One process: its argv and the URL that answers 200 once it is ready (None: no probe)."""

    name: str
    argv: list[str]
    ready_url: str | None


def _https(port_name: str, path: str) -> str:
    return f"https://{HOST}:{PORTS[port_name]}{path}"


def apiserver_url() -> str:
    return _https("kube-apiserver", "")


def etcd(b: Layout, s: StatePaths) -> Spec:
    client = f"http://{HOST}:{PORTS['etcd-client']}"
    peer = f"http://{HOST}:{PORTS['etcd-peer']}"
    argv = [
        str(b.binary("etcd")),
        "--name=local",
        f"--data-dir={s.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        "--unsafe-no-fsync=true",  # throw-away data: skip fsync, as envtest does
        "--quota-backend-bytes=2147483648",
        "--max-request-bytes=8388608",  # headroom for the ~1 MB KubeRay CRDs
        "--auto-compaction-retention=1",
        "--log-level=warn",
    ]
    return Spec("etcd", argv, f"{client}/health")


AUDIT_ENV = "ASYNCGRPO_CLUSTER_AUDIT"
"""1: the API server writes an audit log (one Metadata-level line per request) to logs/audit.jsonl.

Off by default: it costs CPU on every request. The operator benchmark (bench/operator) turns it on
in its own cluster to count the API requests each controller makes, by user and user agent."""

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*", "/version", "/openapi*"]
  - level: Metadata
"""


def audit_enabled() -> bool:
    return os.environ.get(AUDIT_ENV, "") in {"1", "true", "yes"}


def _audit_flags(s: StatePaths) -> list[str]:
    """Flags for the audit log; writes the policy file (the API server reads it at start)."""
    if not audit_enabled():
        return []
    s.audit_policy.write_text(AUDIT_POLICY)
    return [
        f"--audit-policy-file={s.audit_policy}",
        f"--audit-log-path={s.audit_log}",
        "--audit-log-format=json",
        "--audit-log-mode=batch",  # buffered: requests never wait for the log write
        "--audit-log-maxsize=0",  # never rotate: a benchmark reads the whole file
    ]


WATCH_CACHE_ENV = "ASYNCGRPO_CLUSTER_WATCH_CACHE"
"""0: the API server serves watches from etcd itself (`--watch-cache=false`), so that compacting
etcd expires a watch's resourceVersion (410 Gone) deterministically. On by default, as in any
real cluster; tests/reliability/test_watch_compaction.py turns it off in its private cluster."""


def _watch_cache_flags() -> list[str]:
    return ["--watch-cache=false"] if os.environ.get(WATCH_CACHE_ENV, "") in {"0", "false", "no"} else []


def kube_apiserver(b: Layout, s: StatePaths) -> Spec:
    p = s.pki
    argv = [
        str(b.binary("kube-apiserver")),
        f"--etcd-servers=http://{HOST}:{PORTS['etcd-client']}",
        f"--bind-address={HOST}",
        f"--advertise-address={HOST}",
        f"--secure-port={PORTS['kube-apiserver']}",
        f"--cert-dir={p.dir}",
        f"--tls-cert-file={p.server_crt}",
        f"--tls-private-key-file={p.server_key}",
        f"--client-ca-file={p.ca_crt}",
        f"--requestheader-client-ca-file={p.front_proxy_ca_crt}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={p.front_proxy_client_crt}",
        f"--proxy-client-key-file={p.front_proxy_client_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={p.sa_pub}",
        f"--service-account-signing-key-file={p.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",  # a loopback endpoint for `kubernetes` would be rejected
        "--enable-priority-and-fairness=false",
        # The real node's kubelet (logs, exec): dialled at its IP, as admin (its webhook asks us).
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={p.admin_crt}",
        f"--kubelet-client-key={p.admin_key}",
        "--profiling=false",
        *_audit_flags(s),
        *_watch_cache_flags(),
    ]
    return Spec("kube-apiserver", argv, _https("kube-apiserver", "/readyz"))


def _delegated_auth(s: StatePaths) -> list[str]:
    kc = str(s.kubeconfig)
    return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}"]


def kube_controller_manager(b: Layout, s: StatePaths) -> Spec:
    p = s.pki
    argv = [
        str(b.binary("kube-controller-manager")),
        *_delegated_auth(s),
        "--leader-elect=false",
        f"--bind-address={HOST}",
        f"--secure-port={PORTS['kube-controller-manager']}",
        f"--tls-cert-file={p.server_crt}",
        f"--tls-private-key-file={p.server_key}",
        f"--root-ca-file={p.ca_crt}",
        f"--service-account-private-key-file={p.sa_key}",
        f"--cluster-signing-cert-file={p.ca_crt}",
        f"--cluster-signing-key-file={p.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--node-monitor-grace-period={NODE_GRACE_SECONDS}s",  # NotReady in seconds, not 50 s
        "--kube-api-qps=100",
        "--kube-api-burst=200",
    ]
    return Spec("kube-controller-manager", argv, _https("kube-controller-manager", "/healthz"))


def kube_scheduler(b: Layout, s: StatePaths) -> Spec:
    p = s.pki
    argv = [
        str(b.binary("kube-scheduler")),
        *_delegated_auth(s),
        "--leader-elect=false",
        f"--bind-address={HOST}",
        f"--secure-port={PORTS['kube-scheduler']}",
        f"--tls-cert-file={p.server_crt}",
        f"--tls-private-key-file={p.server_key}",
    ]
    return Spec("kube-scheduler", argv, _https("kube-scheduler", "/healthz"))


def kwok(b: Layout, s: StatePaths) -> Spec:
    argv = [
        str(b.binary("kwok")),
        f"--kubeconfig={s.kubeconfig}",
        f"--config={s.kwok_config}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-label-selector=type=kwok",
        f"--node-lease-duration-seconds={NODE_GRACE_SECONDS}",  # renewed every 5 s at 20; KCM's grace
        f"--cidr={POD_CIDR}",
        f"--node-ip={NODE_IP}",
        f"--server-address={HOST}:{PORTS['kwok']}",
    ]
    return Spec("kwok", argv, f"http://{HOST}:{PORTS['kwok']}/healthz")


def ray_operator(b: Layout, s: StatePaths) -> Spec:
    argv = [
        str(b.binary("ray-operator")),  # reads KUBECONFIG from the environment
        "--enable-leader-election=false",
        "--metrics-addr=0",
        f"--health-probe-bind-address={HOST}:{PORTS['ray-operator-probe']}",
        "--log-stdout-encoder=console",
        "--reconcile-concurrency=2",
    ]
    return Spec("ray-operator", argv, f"http://{HOST}:{PORTS['ray-operator-probe']}/readyz")


def kueue(binary: Path, config: Path) -> Spec:
    """Kueue's controller manager: its settings are in the config file (tests/cluster/kueue.py);
    the visibility API server is off (it would need an APIService and its own port)."""
    argv = [
        str(binary),  # reads KUBECONFIG from the environment
        f"--config={config}",
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=info",
    ]
    return Spec("kueue", argv, f"http://{HOST}:{PORTS['kueue-probe']}/readyz")
