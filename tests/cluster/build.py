"""Build the control-plane binaries from the pinned wrapper Go modules into a cache outside the repo.

Why a wrapper module per upstream: k8s.io/kubernetes and etcd's server carry replace directives, so
`go install pkg@version` refuses them; a wrapper module that requires them (with the staging replaces
for k8s) builds fine, and each upstream pins different versions of shared dependencies, so they cannot
share one go.mod.

The output folder is keyed by a hash of everything that changes the binaries (the pins in
versions.toml, every go.mod/go.sum, the Go version, the flags), so a version bump builds into a
fresh folder and an unchanged checkout reuses the old one without running the Go toolchain at all.
An optional component (Kueue) is hashed and cached on its own, beside that folder: it is built only
when something asks for it, and pinning or bumping it never rebuilds the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from tests.cluster import oci
from tests.cluster.config import GOMOD_DIR, VERSIONS_FILE, cache_root, components
from tests.cluster.filelock import locked

K8S_VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
BUILD_DATE = "2026-01-01T00:00:00Z"  # fixed, so identical inputs give identical binaries


@dataclass(frozen=True)
class Target:
    """One `go build` invocation: packages of one wrapper module and the binaries they produce."""

    component: str
    packages: tuple[str, ...]
    binaries: tuple[str, ...]
    ldflags: str
    tags: str = ""


def k8s_ldflags(version: str) -> str:
    """Stamp the version the way upstream hack/lib/version.sh does, or /version says v0.0.0-master."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in K8S_VERSION_PACKAGES:
        flags += [
            f"-X '{pkg}.gitVersion={version}'",
            f"-X '{pkg}.gitMajor={major}'",
            f"-X '{pkg}.gitMinor={minor}'",
            f"-X '{pkg}.gitTreeState=clean'",
            f"-X '{pkg}.buildDate={BUILD_DATE}'",
        ]
    return " ".join(flags)


def helm_ldflags(version: str) -> str:
    """Stamp helm like its Makefile: its version, and the default Kubernetes version that `helm
    template`/`lint` assume (client-go's minor, major 0 -> 1); unstamped it assumes v1.20."""
    gomod = (GOMOD_DIR / components()["helm"].gomod / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", gomod, re.MULTILINE)
    if match is None:
        raise BuildError("gomod/helm/go.mod does not require k8s.io/client-go v0.x.y")
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={match.group(1)}"]
    return " ".join(flags)


def kueue_ldflags(version: str) -> str:
    """Stamp Kueue's version like its Makefile, so its log's `Initializing gitVersion=` is true."""
    return f"-s -w -X 'sigs.k8s.io/kueue/pkg/version.GitVersion={version}'"


def optional_targets() -> dict[str, Target]:
    """Builds that run only on request, keyed by component (see `build_optional`, `build_node`)."""
    c = components()
    cni = "github.com/containernetworking/plugins/plugins"
    ctrd = "github.com/containerd/containerd/v2"
    ctrd_bins = ("containerd", "containerd-shim-runc-v2", "ctr")
    cni_bins = {"bridge": "main", "host-local": "ipam", "loopback": "main", "portmap": "meta"}
    return {
        "kueue": Target(
            "kueue", ("sigs.k8s.io/kueue/cmd/kueue",), ("kueue",), kueue_ldflags(c["kueue"].version)
        ),
        "kubelet": Target(
            "kubelet",
            ("k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-proxy"),
            ("kubelet", "kube-proxy"),
            k8s_ldflags(c["kubelet"].version),
            tags="selinux,notest",  # the control plane's tags: its Go build cache is reused
        ),
        "containerd": Target(
            "containerd",
            tuple(f"{ctrd}/cmd/{b}" for b in ctrd_bins),
            ctrd_bins,
            f"-s -w -X '{ctrd}/version.Version={c['containerd'].version}'",
        ),
        "cni-plugins": Target(
            "cni-plugins",
            tuple(f"{cni}/{kind}/{b}" for b, kind in cni_bins.items()),
            tuple(cni_bins),
            "-s -w",
        ),
        "cri-tools": Target(
            "cri-tools",
            ("sigs.k8s.io/cri-tools/cmd/crictl",),
            ("crictl",),
            f"-s -w -X 'sigs.k8s.io/cri-tools/pkg/version.Version={c['cri-tools'].version}'",
        ),
        "seaweedfs": Target(
            "seaweedfs",
            ("github.com/seaweedfs/seaweedfs/weed",),
            ("weed",),
            "-s -w",  # its version is a constant in weed/util/version
        ),
        "coredns": Target(
            "coredns",
            ("asyncgrpo.dev/localcluster/coredns",),
            ("coredns",),
            "-s -w",  # its version is a constant in coremain
        ),
    }


NODE_COMPONENTS = ("containerd", "cni-plugins", "cri-tools", "kubelet", "coredns")
"""The real node's builds, in the order a node comes up (DNS is needed last)."""


def targets() -> list[Target]:
    """The five builds, in the order a cold machine should run them (the slow one first)."""
    c = components()
    k8s = "k8s.io/kubernetes/cmd"
    k8s_bins = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    return [
        Target(
            "kubernetes",
            tuple(f"{k8s}/{b}" for b in k8s_bins),
            k8s_bins,
            k8s_ldflags(c["kubernetes"].version),
            tags="selinux,notest",
        ),
        Target("etcd", (c["etcd"].module,), ("etcd",), "-s -w"),
        Target("kwok", ("sigs.k8s.io/kwok/cmd/kwok",), ("kwok",), "-s -w"),
        Target("kuberay", (c["kuberay"].module,), ("ray-operator",), "-s -w"),
        Target("helm", ("helm.sh/helm/v3/cmd/helm",), ("helm",), helm_ldflags(c["helm"].version)),
    ]


@dataclass(frozen=True)
class Layout:
    """Where one build's outputs live: <cache>/<hash>/bin and <cache>/<hash>/share."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def share(self) -> Path:
        return self.root / "share"

    @property
    def kuberay_crds(self) -> Path:
        return self.share / "kuberay-crds"

    def binary(self, name: str) -> Path:
        return self.bin / name

    def complete(self) -> bool:
        """True when every binary and the KubeRay CRDs are present, i.e. `build` has nothing to do."""
        bins = all(self.binary(b).is_file() for t in targets() for b in t.binaries)
        return bins and any(self.kuberay_crds.glob("*.json"))


@cache
def go_version() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("`go` is not on PATH; the control plane is built from Go modules (Go >= 1.26)")
    return subprocess.run([go, "version"], check=True, capture_output=True, text=True).stdout.strip()


OPTIONAL_MARKER = "\n# --- optional components"
"""versions.toml below this line pins optional components, which the default hash leaves out."""


def _gomod_files(names: list[str]) -> list[Path]:
    dirs = {components()[n].gomod_dir for n in names}
    return [f for f in sorted(GOMOD_DIR.glob("*/go.*")) if f.parent in dirs]


def build_hash() -> str:
    """Hash of everything that changes the default binaries; names the cache folder: the pins above
    versions.toml's optional marker, Go, the build flags and the default components' go.mod/go.sum."""
    h = hashlib.sha256()
    h.update(VERSIONS_FILE.read_text().split(OPTIONAL_MARKER)[0].encode())
    h.update(go_version().encode())
    for t in targets():
        h.update(repr(t).encode())
    for f in _gomod_files([n for n, c in components().items() if not c.optional]):
        h.update(f.relative_to(GOMOD_DIR).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def optional_hash(name: str) -> str:
    """Hash of one optional component's pin, go.mod/go.sum, build flags and Go."""
    h = hashlib.sha256()
    h.update(repr(components()[name]).encode())
    h.update(go_version().encode())
    h.update(repr(optional_targets()[name]).encode())
    for f in _gomod_files([name]):
        h.update(f.relative_to(GOMOD_DIR).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def layout() -> Layout:
    """The cache folder the current checkout builds into (it may not exist yet)."""
    return Layout(cache_root() / build_hash())


@dataclass(frozen=True)
class OptionalLayout:
    """Where one optional component's build lives: <cache>/<name>-<hash>/{bin,share}."""

    name: str
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def share(self) -> Path:
        return self.root / "share"

    @property
    def crds(self) -> Path:
        return self.share / "crds"

    @property
    def webhooks(self) -> Path:
        """The component's webhook configurations, as its module ships them (JSON)."""
        return self.share / "webhooks.json"

    def binary(self, name: str) -> Path:
        return self.bin / name

    def complete(self) -> bool:
        built = all(self.binary(b).is_file() for b in optional_targets()[self.name].binaries)
        if self.name != "kueue":
            return built  # only Kueue ships CRDs and webhooks beside its binary
        return built and any(self.crds.glob("*.json")) and self.webhooks.is_file()


def optional_layout(name: str) -> OptionalLayout:
    """The cache folder of an optional component for the current pins (it may not exist yet)."""
    return OptionalLayout(name, cache_root() / f"{name}-{optional_hash(name)}")


class BuildError(RuntimeError):
    """The toolchain is missing, a pin is inconsistent, or `go build` failed."""


def check_pins(names: list[str] | None = None) -> None:
    """Refuse to build when versions.toml and a wrapper go.mod disagree: there must be one truth."""
    for comp in components().values():
        if names is not None and comp.name not in names:
            continue
        gomod = (comp.gomod_dir / "go.mod").read_text()
        needle = f"{comp.module} {comp.version}"
        if needle not in gomod:
            raise BuildError(
                f"{comp.gomod_dir / 'go.mod'} does not require {needle} (versions.toml says so); "
                f"run `go get -tool {comp.module}@{comp.version} && go mod tidy` there"
            )


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"  # static binaries; also what the warm GOCACHE was built with
    env["GOTOOLCHAIN"] = "local"  # never download a toolchain
    flags = env.get("GOFLAGS", "")
    if "-buildvcs" not in flags:
        env["GOFLAGS"] = f"{flags} -buildvcs=false".strip()
    return env


def _log(msg: str) -> None:
    print(f"[ctrlplane build] {msg}", file=sys.stderr, flush=True)


PROGRESS_EVERY_SECONDS = float(os.environ.get("ASYNCGRPO_BUILD_PROGRESS_SECONDS", "30"))
"""How often a running `go build` reports; tests/cluster/test_build_progress.py sets it shorter."""
GO_LOG = "go-build.log"
"""Go's own output (hundreds of `go: downloading` lines), kept beside the binaries, not printed."""


def estimates() -> dict[str, float]:
    """Seconds of each component's latest build on this machine (any cache folder), from the
    build-times.jsonl every build appends. A component never built here has no estimate: a figure
    from another machine (or a cold cache when this one is warm) misleads more than none."""
    out: dict[str, float] = {}
    records = cache_root().glob("*/build-times.jsonl") if cache_root().exists() else []
    for path in sorted(records, key=lambda p: p.stat().st_mtime):
        for line in path.read_text().splitlines():
            try:
                seconds = json.loads(line).get("seconds", {})
            except ValueError:
                continue
            out.update({k: float(v) for k, v in seconds.items() if isinstance(v, int | float)})
    return out


@dataclass
class Progress:
    """What is left of a build, for the progress lines: the targets still to build, in order."""

    pending: list[str]
    expected: dict[str, float]
    done: int = 0

    def left_after(self, component: str, elapsed: float) -> tuple[float | None, float | None]:
        """(seconds left for this component, for the whole build); None where a component in it
        has no measured time."""
        mine = self.expected.get(component)
        mine_left = None if mine is None else max(mine - elapsed, 0.0)
        later = [self.expected.get(c) for c in self.pending[self.pending.index(component) + 1 :]]
        known = [s for s in later if s is not None]
        total = None if mine_left is None or len(known) < len(later) else mine_left + sum(known)
        return mine_left, total

    def started(self, component: str) -> str:
        """The bracket of the `building ...` line: which step, and what is left if known."""
        mine, total = self.left_after(component, 0.0)
        step = f"{self.done + 1} of {self.done + len(self.pending)}"
        if mine is None:
            return f"[{step}]"
        rest = f", {_minutes(total)} left in all" if total is not None else ""
        return f"[{step}; {_minutes(mine)} last time{rest}]"

    def running(self, component: str, elapsed: float) -> str:
        """A progress line while `component` builds: time so far, and what is left if known."""
        line = f"{component}: {_minutes(elapsed)} so far"
        mine, total = self.left_after(component, elapsed)
        if mine is None:
            return line
        left = f"about {_minutes(mine)} left for it" if mine > 0 else "longer than last time"
        if total is not None:
            left += f", {_minutes(total)} for the whole build"
        return f"{line}; {left} (from this machine's last build)"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def build_target(t: Target, bin_dir: Path, progress: Progress, go_log: Path) -> float:
    """Run one `go build` into `bin_dir`, its output appended to `go_log`, printing a progress
    line every PROGRESS_EVERY_SECONDS; return its wall time."""
    comp = components()[t.component]
    cmd = ["go", "build", "-trimpath"]
    if t.tags:
        cmd.append(f"-tags={t.tags}")
    cmd += [f"-ldflags={t.ldflags}"]
    if len(t.binaries) == 1:
        cmd += ["-o", str(bin_dir / t.binaries[0])]
    else:
        cmd += ["-o", str(bin_dir) + "/"]
    cmd += list(t.packages)
    _log(f"building {', '.join(t.binaries)} ({comp.module} {comp.version}) {progress.started(t.component)}")
    start = time.monotonic()
    with go_log.open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=comp.gomod_dir, env=go_env(), stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                code = proc.wait(timeout=PROGRESS_EVERY_SECONDS)
                break
            except subprocess.TimeoutExpired:
                _log(progress.running(t.component, time.monotonic() - start))
    elapsed = time.monotonic() - start
    if code != 0:
        tail = "\n".join(go_log.read_text().splitlines()[-20:])
        raise BuildError(f"go build of {t.component} failed (exit {code}); last lines of {go_log}:\n{tail}")
    _log(f"built {', '.join(t.binaries)} in {_minutes(elapsed)}")
    progress.pending.remove(t.component)
    progress.done += 1
    return elapsed


def module_dir(component: str) -> Path:
    """The read-only module-cache folder of a pinned module (downloads it if the cache lacks it)."""
    comp = components()[component]
    out = subprocess.run(
        ["go", "mod", "download", "-json", comp.module],
        cwd=comp.gomod_dir,
        env=go_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(out)["Dir"])


def _store_crds(src: Path, dest: Path) -> None:
    """CRDs from a module cache folder, stored as compact JSON, so `up` needs neither the Go
    toolchain nor a YAML parse of megabytes (about 1.5 s of CPU for KubeRay's) on every start."""
    dest.mkdir(parents=True, exist_ok=True)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for f in sorted(src.glob("*.yaml")):
        doc = yaml.load(f.read_text(), Loader=loader)
        (dest / f"{f.stem}.json").write_text(json.dumps(doc, separators=(",", ":")))


def copy_kuberay_crds(out: Layout) -> None:
    """The ray.io CRDs of the pinned KubeRay module."""
    _store_crds(module_dir("kuberay") / "config" / "crd" / "bases", out.kuberay_crds)


def copy_kueue_files(out: OptionalLayout) -> None:
    """Kueue's CRDs and its webhook configurations (service-addressed; `up` points them at
    127.0.0.1), from the pinned module's config/components."""
    src = module_dir("kueue") / "config" / "components"
    _store_crds(src / "crd" / "bases", out.crds)
    docs = [d for d in yaml.safe_load_all((src / "webhook" / "manifests.yaml").read_text()) if d]
    out.webhooks.write_text(json.dumps(docs, separators=(",", ":")))


def build(force: bool = False) -> Layout:
    """Build whatever is missing from the cache folder and return it; a no-op when complete."""
    out = layout()
    if out.complete() and not force:
        return out
    check_pins()
    with locked(out.root / ".lock"):
        out.bin.mkdir(parents=True, exist_ok=True)
        times: dict[str, float] = {}
        todo = [t for t in targets() if force or not all(out.binary(b).is_file() for b in t.binaries)]
        progress = Progress([t.component for t in todo], estimates())
        if todo:
            _log(f"go's own output (module downloads, errors): {out.root / GO_LOG}")
        for t in todo:
            times[t.component] = round(build_target(t, out.bin, progress, out.root / GO_LOG), 1)
        if force or not any(out.kuberay_crds.glob("*.json")):
            copy_kuberay_crds(out)
        if times:
            record = {"go": go_version(), "seconds": times, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
            with (out.root / "build-times.jsonl").open("a") as fh:
                fh.write(json.dumps(record) + "\n")
    return out


def build_optional(name: str, force: bool = False) -> OptionalLayout:
    """Build an optional component (kueue, seaweedfs) into its own cache folder; a no-op when complete.

    Why separate from `build`: the demo and the default tests never need it, so a fresh machine's
    first `make demo` never waits for it; the tests that need Kueue call this first.
    """
    out = optional_layout(name)
    if out.complete() and not force:
        return out
    check_pins([name])
    with locked(out.root / ".lock"):
        out.bin.mkdir(parents=True, exist_ok=True)
        times: dict[str, float] = {}
        target = optional_targets()[name]
        if force or not all(out.binary(b).is_file() for b in target.binaries):
            _log(f"go's own output (module downloads, errors): {out.root / GO_LOG}")
            progress = Progress([name], estimates())
            times[name] = round(build_target(target, out.bin, progress, out.root / GO_LOG), 1)
        if name == "kueue" and (force or not out.complete()):
            copy_kueue_files(out)
        if times:
            record = {"go": go_version(), "seconds": times, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
            with (out.root / "build-times.jsonl").open("a") as fh:
                fh.write(json.dumps(record) + "\n")
    return out


PAUSE_TAG = "3.10.2"  # upstream's build/pause/Makefile TAG for the pinned Kubernetes
PAUSE_CC = ("gcc", "-Os", "-static", "-Wall", "-Werror", f"-DVERSION=v{PAUSE_TAG}-asyncgrpo")
"""The pod sandbox's `pause`, compiled as upstream does from the k8s.io/kubernetes module's
build/pause/linux/pause.c: no registry serves registry.k8s.io/pause here (gcc and libc6-dev)."""


@dataclass(frozen=True)
class NodeLayout:
    """Where the real node's build lives: <cache>/node-<hash>/bin (binaries and CNI plugins) and
    share/pause.tar (the sandbox image, an OCI archive for `ctr images import`)."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def pause_image(self) -> Path:
        return self.root / "share" / "pause.tar"

    def binary(self, name: str) -> Path:
        return self.bin / name

    def complete(self) -> bool:
        bins = [b for n in NODE_COMPONENTS for b in optional_targets()[n].binaries]
        return all(self.binary(b).is_file() for b in bins) and self.pause_image.is_file()


def node_layout() -> NodeLayout:
    """The real node's cache folder for the current pins (it may not exist yet)."""
    h = hashlib.sha256(repr(PAUSE_CC).encode())
    for name in NODE_COMPONENTS:
        h.update(optional_hash(name).encode())
    return NodeLayout(cache_root() / f"node-{h.hexdigest()[:16]}")


def build_pause(out: NodeLayout) -> None:
    """Compile pause statically and wrap it in a FROM-scratch image archive."""
    src = module_dir("kubelet") / "build" / "pause" / "linux" / "pause.c"
    subprocess.run([*PAUSE_CC, "-o", str(out.binary("pause")), str(src)], check=True)
    out.pause_image.parent.mkdir(parents=True, exist_ok=True)
    oci.write_image(
        out.pause_image,
        f"{oci.LOCAL_REGISTRY}/pause:{PAUSE_TAG}",
        {"pause": out.binary("pause")},
        entrypoint=["/pause"],
    )


def build_node(force: bool = False) -> NodeLayout:
    """Build the real node's binaries and sandbox image (a no-op when complete).

    Why apart from `build`: only `up --real-node` and its tests need them, and kubelet alone is
    minutes of compiling; the control plane and the kwok nodes never wait for it.
    """
    out = node_layout()
    if out.complete() and not force:
        return out
    check_pins(list(NODE_COMPONENTS))
    with locked(out.root / ".lock"):
        out.bin.mkdir(parents=True, exist_ok=True)
        times: dict[str, float] = {}
        todo = [
            optional_targets()[n]
            for n in NODE_COMPONENTS
            if force or not all(out.binary(b).is_file() for b in optional_targets()[n].binaries)
        ]
        progress = Progress([t.component for t in todo], estimates())
        for t in todo:
            times[t.component] = round(build_target(t, out.bin, progress, out.root / GO_LOG), 1)
        if force or not out.pause_image.is_file():
            build_pause(out)
        if times:
            record = {"go": go_version(), "seconds": times, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
            with (out.root / "build-times.jsonl").open("a") as fh:
                fh.write(json.dumps(record) + "\n")
    _log(f"real node in {out.bin}")
    return out


def stale_layouts(keep: set[Path]) -> list[Path]:
    """Cache folders of earlier pins (hash-named), except the current ones and those in `keep`."""
    current = {layout().root, node_layout().root} | {optional_layout(n).root for n in ("kueue", "seaweedfs")}
    pattern = re.compile(r"^([a-z]+-)?[0-9a-f]{16}$")
    return [
        d
        for d in sorted(cache_root().iterdir() if cache_root().exists() else [])
        if d.is_dir() and pattern.match(d.name) and d not in current and d not in keep
    ]
