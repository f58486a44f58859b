"""The real node: containerd, kubelet and kube-proxy on this machine, beside kwok's fake nodes.

Why: kwok nodes run no containers, so images, probes, users, volumes and the pod network are
otherwise untested. The node runs what a kubeadm node runs, as processes of the local cluster
(logs in its log folder, stopped by `down`), all of its files under <state>/node:
- containerd 2.x with its CRI plugin, Debian's runc, cgroupfs (this machine has cgroup v1) and
  the overlayfs snapshotter. There is no registry: every image is imported (`import_image`), the
  sandbox's `pause` included, and the kubelet never pulls (pods say imagePullPolicy Never).
- the kubelet, registered as REAL_NODE_NAME with a client certificate of the cluster CA
  (system:node:<name> in system:nodes, bound to the system:node role, as the Node authorizer
  would allow), `failCgroupV1: false` (v1.36 refuses cgroup v1 otherwise), the CNI bridge
  conflist and CLUSTER_DNS_IP as its pods' nameserver. It carries a NoSchedule taint, so the
  pods of tests written for the kwok nodes never land here: a pod that wants a real container
  tolerates it and selects the node (`pod_placement`).
- kube-proxy in iptables mode, so ClusterIP Services work from pods and from this machine.
CoreDNS is tests/cluster/dns.py; the bridge and the egress guard are tests/cluster/hostnet.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.cluster import oci
from tests.cluster import pki as pki_mod
from tests.cluster.build import PAUSE_TAG, NodeLayout
from tests.cluster.components import Spec, apiserver_url
from tests.cluster.config import (
    BRIDGE,
    CLUSTER_DNS_IP,
    CLUSTER_DOMAIN,
    HOST,
    NODE_GRACE_SECONDS,
    PORTS,
    REAL_NODE_IP,
    REAL_NODE_NAME,
    REAL_POD_CIDR,
)

SANDBOX_IMAGE = f"{oci.LOCAL_REGISTRY}/pause:{PAUSE_TAG}"
BUSYBOX_IMAGE = f"{oci.LOCAL_REGISTRY}/busybox:local"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: the node's test image
RUNC = "/usr/sbin/runc"  # Debian's runc


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run the real node: root (kubelet and containerd manage cgroups,
    mounts and network namespaces), runc and busybox-static (Debian's packages); empty when none."""
    missing = [] if os.geteuid() == 0 else ["root"]
    return missing + [str(path) for path in (Path(RUNC), BUSYBOX) if not path.is_file()]


TAINT = {"key": "asyncgrpo.dev/real-node", "value": "true", "effect": "NoSchedule"}
NODE_LABEL = ("asyncgrpo.dev/pool", "real")
CRI_NAMESPACE = "k8s.io"
NODE_ROLE_BINDING = "asyncgrpo-local:nodes"


@dataclass(frozen=True)
class NodePaths:
    """Files and folders of the real node, all under <state>/node."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni"

    @property
    def ipam(self) -> Path:
        return self.root / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"

    @property
    def proxy_kubeconfig(self) -> Path:
        return self.root / "kube-proxy.kubeconfig"

    @property
    def resolv_conf(self) -> Path:
        """The kubelet's resolvConf: empty, so pods get no search domain or server of the host."""
        return self.root / "resolv.conf"

    @property
    def corefile(self) -> Path:
        """CoreDNS's configuration (tests/cluster/dns.py)."""
        return self.root / "Corefile"

    @property
    def saved_tunables(self) -> Path:
        """The kernel tunables as they were before the kubelet started (hostnet.py)."""
        return self.root / "kernel-tunables.json"

    @property
    def images(self) -> Path:
        return self.root / "images"


def _kubeconfig(p: pki_mod.Pki, crt: Path, key: Path) -> str:
    cluster = {"server": apiserver_url(), "certificate-authority": str(p.ca_crt)}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": "user", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
            "current-context": "local",
        }
    )


def containerd_config(b: NodeLayout, n: NodePaths) -> str:
    """containerd's config (version 3): its own root, state and socket; CRI with runc on cgroupfs,
    the pinned local sandbox image, our CNI folders; the streaming server on loopback. Containers'
    OOM score adjustments are clamped at containerd's own (0): this machine withholds
    CAP_SYS_RESOURCE, without which runc fails to start a sandbox at the kubelet's -998."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = "{n.containerd_root}"
state = "{n.containerd_state}"

[grpc]
  address = "{n.socket}"

[ttrpc]
  address = "{n.socket}.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[{cri_runtime}]
  restrict_oom_score_adj = true
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{b.binary("containerd-shim-runc-v2")}"
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ["{b.bin}"]
    conf_dir = "{n.cni_conf}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "{HOST}"
  stream_server_port = "0"
"""


def cni_conflist(n: NodePaths) -> dict[str, Any]:
    """The pod network: the bridge (the node's IP is its gateway) with host-local addresses from
    REAL_POD_CIDR, no masquerade (pods never reach out), and portmap for hostPorts."""
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": REAL_POD_CIDR, "gateway": REAL_NODE_IP}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": str(n.ipam),
    }
    bridge = {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "ipam": ipam}
    bridge["hairpinMode"] = True  # a pod reaches itself through its own Service
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return {"cniVersion": "1.0.0", "name": "asyncgrpo", "plugins": [bridge, portmap]}


def kubelet_config(n: NodePaths, p: pki_mod.Pki) -> dict[str, Any]:
    """KubeletConfiguration: cgroup v1 allowed, cgroupfs, our DNS, webhook-authorised API on the
    node IP, and image GC and disk eviction off in effect: an imported image cannot be pulled back."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{n.socket}",
        "address": REAL_NODE_IP,
        "port": PORTS["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": HOST,
        "healthzPort": PORTS["kubelet-healthz"],
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(p.ca_crt)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(n.resolv_conf),
        "podLogsDir": str(n.pod_logs),
        "registerWithTaints": [TAINT],
        "failSwapOn": False,
        "oomScoreAdj": 0,  # not -999: no CAP_SYS_RESOURCE here (see containerd_config)
        "nodeLeaseDurationSeconds": NODE_GRACE_SECONDS,
        "nodeStatusUpdateFrequency": "5s",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
    }


def kube_proxy_config(n: NodePaths) -> dict[str, Any]:
    """KubeProxyConfiguration: iptables mode; conntrack sysctls left alone; NodePorts on the node
    IP only; the pod range is the cluster's, so only traffic from elsewhere is masqueraded."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "oomScoreAdj": 0,
        "clientConnection": {"kubeconfig": str(n.proxy_kubeconfig)},
        "hostnameOverride": REAL_NODE_NAME,
        "clusterCIDR": REAL_POD_CIDR,
        "healthzBindAddress": f"{HOST}:{PORTS['kube-proxy-healthz']}",
        "metricsBindAddress": f"{HOST}:{PORTS['kube-proxy-metrics']}",
        "nodePortAddresses": [f"{REAL_NODE_IP}/32"],
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"minSyncPeriod": "1s", "syncPeriod": "30s"},
    }


def busybox_links() -> dict[str, str]:
    """bin/<applet> -> busybox for every applet the installed busybox has."""
    out = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
    return {f"bin/{a}": "busybox" for a in out.split() if a != "busybox"}


def prepare(n: NodePaths, p: pki_mod.Pki, b: NodeLayout) -> None:
    """Write every config file, issue the node's and kube-proxy's certificates, make the busybox
    image archive (when Debian's busybox-static is installed)."""
    for d in (n.root, n.cni_conf, n.ipam, n.kubelet_root, n.pod_logs, n.images):
        d.mkdir(parents=True, exist_ok=True)
    client = ExtendedKeyUsageOID.CLIENT_AUTH
    node_cn = f"system:node:{REAL_NODE_NAME}"
    crt, key = pki_mod.issue(p, "kubelet", cn=node_cn, org="system:nodes", usage=client)
    n.kubelet_kubeconfig.write_text(_kubeconfig(p, crt, key))
    crt, key = pki_mod.issue(p, "kube-proxy", cn="system:kube-proxy", usage=client)  # system:node-proxier
    n.proxy_kubeconfig.write_text(_kubeconfig(p, crt, key))
    n.containerd_config.write_text(containerd_config(b, n))
    (n.cni_conf / "10-asyncgrpo.conflist").write_text(json.dumps(cni_conflist(n), indent=1))
    n.kubelet_config.write_text(yaml.safe_dump(kubelet_config(n, p)))
    n.proxy_config.write_text(yaml.safe_dump(kube_proxy_config(n)))
    n.resolv_conf.write_text("")
    if BUSYBOX.is_file():
        oci.write_image(
            n.images / "busybox.tar",
            BUSYBOX_IMAGE,
            {"bin/busybox": BUSYBOX},
            entrypoint=["/bin/sh"],
            links=busybox_links(),
        )


def containerd(b: NodeLayout, n: NodePaths) -> Spec:
    return Spec("containerd", [str(b.binary("containerd")), f"--config={n.containerd_config}"], None)


def kubelet(b: NodeLayout, n: NodePaths) -> Spec:
    argv = [
        str(b.binary("kubelet")),
        f"--config={n.kubelet_config}",
        f"--kubeconfig={n.kubelet_kubeconfig}",
        f"--root-dir={n.kubelet_root}",
        f"--hostname-override={REAL_NODE_NAME}",
        f"--node-ip={REAL_NODE_IP}",
        f"--node-labels={NODE_LABEL[0]}={NODE_LABEL[1]}",
    ]
    return Spec("kubelet", argv, f"http://{HOST}:{PORTS['kubelet-healthz']}/healthz")


def kube_proxy(b: NodeLayout, n: NodePaths) -> Spec:
    argv = [str(b.binary("kube-proxy")), f"--config={n.proxy_config}"]
    return Spec("kube-proxy", argv, f"http://{HOST}:{PORTS['kube-proxy-healthz']}/healthz")


def node_role_binding() -> dict[str, Any]:
    """system:nodes may do what the system:node role allows (RBAC-only API server)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NODE_ROLE_BINDING},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    }


def pod_placement() -> dict[str, Any]:
    """Pod spec fields that put a pod on the real node (its taint tolerated, its label selected)."""
    return {
        "nodeSelector": {NODE_LABEL[0]: NODE_LABEL[1]},
        "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}],
    }


def _ctr(bin_dir: Path, n: NodePaths, *args: str, timeout: float = 600) -> str:
    argv = [str(bin_dir / "ctr"), f"--address={n.socket}", f"--namespace={CRI_NAMESPACE}", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=timeout).stdout


def containerd_ready(bin_dir: Path, n: NodePaths) -> bool:
    if not n.socket.exists():
        return False
    try:
        _ctr(bin_dir, n, "version", timeout=10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return False
    return True


def import_image(bin_dir: Path, n: NodePaths, archive: Path) -> None:
    """Import an image archive (OCI or docker-archive, e.g. `buildah push ... oci-archive:`) into
    the CRI namespace, unpacked for the CRI's snapshotter, so pods start it without a pull."""
    _ctr(bin_dir, n, "images", "import", "--snapshotter=overlayfs", str(archive))


def remove_pods(bin_dir: Path, n: NodePaths) -> None:
    """Stop and remove every pod sandbox while containerd still runs (the kubelet is stopped
    first), so no container outlives `down`."""
    crictl = [str(bin_dir / "crictl"), f"--runtime-endpoint=unix://{n.socket}", "--timeout=30s"]
    subprocess.run([*crictl, "rmp", "--all", "--force"], capture_output=True, check=False, timeout=120)


def _pids_of_our_shims(n: NodePaths) -> list[int]:
    """containerd shims serving our containerd (their command line names our socket)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"containerd-shim-runc-v2") and str(n.socket).encode() in argv:
                pids.append(int(proc.name))
    return pids


def _unmount_under(root: Path) -> None:
    """Lazily unmount what the kubelet and containerd left mounted under `root`, deepest first,
    so the state folder can be deleted (a crash leaves tmpfs and overlay mounts behind)."""
    prefix = str(root.resolve()) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for m in sorted({m for m in mounts if m.startswith(prefix)}, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def _remove_pod_cgroups() -> None:
    """Kill what is left in the kubelet's cgroups and remove them, in every v1 hierarchy."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        groups = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
        for group in [*groups, top]:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            for _ in range(20):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def cleanup(n: NodePaths, bin_dir: Path | None, *, machine_wide: bool) -> None:
    """After the node's processes stopped: kill our leftover shims and unmount under our folder;
    and when this cluster held the machine's node (`machine_wide`), kill what is left in the
    kubelet's cgroups and remove kube-proxy's iptables rules (`kube-proxy --cleanup`)."""
    for pid in _pids_of_our_shims(n):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if machine_wide:
        _remove_pod_cgroups()
    _unmount_under(n.root)
    if not machine_wide:
        return
    if bin_dir is not None and (bin_dir / "kube-proxy").is_file():
        argv = [str(bin_dir / "kube-proxy"), "--cleanup"]
        subprocess.run(argv, capture_output=True, check=False, timeout=60)
    if shutil.which("conntrack"):
        subprocess.run(["conntrack", "-D", "-s", REAL_POD_CIDR], capture_output=True, check=False)
