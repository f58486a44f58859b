"""Finding and running helm for the chart tests (and the webhook e2e tests).

helm is built from Go modules by the control-plane builder (tests/cluster/build.py) into its cache;
ASYNCGRPO_HELM overrides that. The tests never build it themselves: a chart test that has to wait
minutes for `go build` would hide the chart's own failures behind a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "asyncgrpo-operator"


def find_helm() -> Path | None:
    """ASYNCGRPO_HELM, else the builder's cache folder for this checkout, else any cached build, else PATH."""
    env = os.environ.get("ASYNCGRPO_HELM")
    if env:
        return Path(env)
    try:
        from tests.cluster.build import layout  # noqa: PLC0415 - needs `go` on PATH to hash the build

        built = layout().binary("helm")
        if built.is_file():
            return built
    except Exception:  # no Go toolchain, or the build layout moved: look in the other places
        pass
    from tests.cluster.config import cache_root  # noqa: PLC0415

    cached = sorted(cache_root().glob("*/bin/helm"), key=lambda p: p.stat().st_mtime, reverse=True)
    if cached:
        return cached[0]
    found = shutil.which("helm")
    return Path(found) if found else None


NO_HELM = (
    "no helm binary: build the control plane (`python -m tests.cluster build`) or set ASYNCGRPO_HELM "
    "to a helm v3 binary"
)


class HelmError(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def helm(*args: str, helm_bin: Path, env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    """Run helm and return stdout; raise HelmError with stderr on failure."""
    proc = subprocess.run(
        [str(helm_bin), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc.stdout


def kube_version() -> str:
    """The Kubernetes version charts are rendered for: the local control plane's pin.

    helm built from source without its version ldflags assumes Kubernetes v1.20, which the chart's
    kubeVersion (>= 1.30, for matchConditions) rightly refuses; `helm install` asks the cluster.
    """
    from tests.cluster.config import kubernetes_version  # noqa: PLC0415

    return kubernetes_version()


def set_args(values: Mapping[str, Any]) -> list[str]:
    """--set-json flags for dotted keys: {'webhook.url': 'https://x'} -> ['--set-json', 'webhook.url="https://x"']."""
    import json  # noqa: PLC0415

    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def template(
    helm_bin: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "agrpo",
    namespace: str = "asyncgrpo-system",
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` the chart and return the rendered objects (CRDs included)."""
    out = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--include-crds",
        "--kube-version",
        kube_version(),
        *set_args(values or {}),
        *extra,
        helm_bin=helm_bin,
    )
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
