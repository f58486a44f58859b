"""The machine-wide state the real node changes: its bridge, forwarding, an egress guard, and
the kernel settings the kubelet overwrites; and the path from pods to the API server.

Why a module of its own: this is the only machine-wide state the local cluster changes (the rest
lives in its state folder), so it is set up and undone in one place. The kubelet sets six kernel
tunables at start (vm.overcommit_memory=1, kernel.panic_on_oops=1, ...; there is no setting to
only warn, and `protectKernelDefaults` makes it refuse to start instead), so their values are
saved before it starts and written back by `down`: other work shares this machine.

The bridge is made before the CNI bridge plugin runs (the plugin adopts it) because its address
is the node's IP, where the kubelet and CoreDNS listen before any pod exists. Pods may reach each
other, Services and this machine, and nothing else: the guard drops forwarded packets from the pod
range that would leave by any interface but the bridge, so no pod traffic is ever sent off the
machine.

The API server listens on 127.0.0.1 only, and an EndpointSlice may not name a loopback address, so
kube-proxy cannot send the `kubernetes` Service's traffic there. A DNAT rule does: pods' packets to
its ClusterIP, port 443, go to the API server's port on 127.0.0.1 (route_localnet on the bridge
lets them; its certificate names 10.96.0.1 and kubernetes.default.svc). So in-cluster clients
(a service account's token, KUBERNETES_SERVICE_HOST) work in the node's pods.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.cluster.config import BRIDGE, HOST, PORTS, REAL_NODE_IP, REAL_POD_CIDR, SERVICE_CIDR

GUARD_CHAIN = "ASYNCGRPO-POD-EGRESS"
API_CHAIN = "ASYNCGRPO-POD-API"
API_SERVICE_IP = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))  # the `kubernetes` Service
KUBELET_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
"""What the kubelet's container manager sets (pkg/kubelet/cm setupKernelTunables, v1.36)."""
KUBELET_CHAINS = (
    ("filter", "KUBE-FIREWALL"),  # jumped to from INPUT and OUTPUT
    ("filter", "KUBE-KUBELET-CANARY"),
    ("mangle", "KUBE-KUBELET-CANARY"),
    ("nat", "KUBE-KUBELET-CANARY"),
    ("mangle", "KUBE-IPTABLES-HINT"),
)
"""The chains the kubelet makes in both families (`kube-proxy --cleanup` removes only its own)."""
SYSCTLS = {
    "net/ipv4/ip_forward": "1",  # pod -> Service -> pod on the same bridge is routed
    "net/bridge/bridge-nf-call-iptables": "1",  # kube-proxy's DNAT seen on bridged replies
}


def _run(*argv: str, check: bool = True) -> bool:
    return subprocess.run(argv, capture_output=True, check=check).returncode == 0


def _iptables(*args: str, check: bool = True) -> bool:
    return _run("iptables", "-w", "5", *args, check=check)


OWNER_FILE = Path("/run/asyncgrpo-real-node")
"""Names the state folder of the cluster whose real node holds this machine's network."""


def claim(state: Path, holds: Callable[[Path], bool]) -> None:
    """Take the machine's one real node for the cluster in `state`, or raise if another live
    cluster has it (`holds(other_state)`: its kubelet still runs). Two kube-proxies would fight
    over the same iptables chains, and two nodes over the bridge and the DNS address."""
    if OWNER_FILE.is_file():
        other = Path(OWNER_FILE.read_text().strip())
        if other != state and holds(other):
            raise RuntimeError(
                f"the cluster in {other} runs this machine's real node; one per machine: "
                f"`ASYNCGRPO_CLUSTER_STATE={other} python -m tests.cluster down` first"
            )
    OWNER_FILE.write_text(f"{state}\n")


def owned_by(state: Path) -> bool:
    """Whether the machine's real node is unclaimed or the cluster in `state` holds it."""
    return not OWNER_FILE.is_file() or Path(OWNER_FILE.read_text().strip()) == state


def release(state: Path) -> None:
    if OWNER_FILE.is_file() and owned_by(state):
        OWNER_FILE.unlink()


def setup(saved_tunables: Path) -> None:
    """Save the kernel tunables the kubelet will change, make the bridge with the node's IP,
    turn forwarding on, install the egress guard and the pods' path to the API server."""
    values = {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_TUNABLES}
    saved_tunables.write_text(json.dumps(values))
    for key, value in SYSCTLS.items():
        Path("/proc/sys", key).write_text(value)
    if not Path("/sys/class/net", BRIDGE).exists():
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    prefix = ipaddress.ip_network(REAL_POD_CIDR).prefixlen
    _run("ip", "addr", "replace", f"{REAL_NODE_IP}/{prefix}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    if not _iptables("-n", "-L", GUARD_CHAIN, check=False):
        _iptables("-N", GUARD_CHAIN)
    _iptables("-F", GUARD_CHAIN)
    _iptables("-A", GUARD_CHAIN, "-s", REAL_POD_CIDR, "!", "-o", BRIDGE, "-j", "DROP")
    if not _iptables("-C", "FORWARD", "-j", GUARD_CHAIN, check=False):
        _iptables("-I", "FORWARD", "1", "-j", GUARD_CHAIN)
    Path("/proc/sys/net/ipv4/conf", BRIDGE, "route_localnet").write_text("1")
    if not _iptables("-t", "nat", "-n", "-L", API_CHAIN, check=False):
        _iptables("-t", "nat", "-N", API_CHAIN)
    _iptables("-t", "nat", "-F", API_CHAIN)
    match = ["-i", BRIDGE, "-d", API_SERVICE_IP, "-p", "tcp", "--dport", "443"]
    to = f"{HOST}:{PORTS['kube-apiserver']}"
    _iptables("-t", "nat", "-A", API_CHAIN, *match, "-j", "DNAT", "--to-destination", to)
    if not _iptables("-t", "nat", "-C", "PREROUTING", "-j", API_CHAIN, check=False):
        _iptables("-t", "nat", "-I", "PREROUTING", "1", "-j", API_CHAIN)


def teardown(saved_tunables: Path) -> None:
    """Undo `setup`, restore the kernel tunables (forwarding stays on: other software may rely on
    it once it is on) and remove the kubelet's iptables chains."""
    if saved_tunables.is_file():
        for key, value in json.loads(saved_tunables.read_text()).items():
            Path("/proc/sys", key).write_text(value)
        saved_tunables.unlink()
    while _iptables("-D", "FORWARD", "-j", GUARD_CHAIN, check=False):
        pass
    if _iptables("-n", "-L", GUARD_CHAIN, check=False):
        _iptables("-F", GUARD_CHAIN)
        _iptables("-X", GUARD_CHAIN)
    while _iptables("-t", "nat", "-D", "PREROUTING", "-j", API_CHAIN, check=False):
        pass
    if _iptables("-t", "nat", "-n", "-L", API_CHAIN, check=False):
        _iptables("-t", "nat", "-F", API_CHAIN)
        _iptables("-t", "nat", "-X", API_CHAIN)
    if Path("/sys/class/net", BRIDGE).exists():
        _run("ip", "link", "del", BRIDGE)
    for tool in ("iptables", "ip6tables"):
        for hook in ("INPUT", "OUTPUT"):
            while _run(tool, "-w", "5", "-D", hook, "-j", "KUBE-FIREWALL", check=False):
                pass
        for table, chain in KUBELET_CHAINS:
            if _run(tool, "-w", "5", "-t", table, "-F", chain, check=False):
                _run(tool, "-w", "5", "-t", table, "-X", chain, check=False)
