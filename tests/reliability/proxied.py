"""The chart installed with its operator running as the chart's ServiceAccount behind a recording
proxy (apiproxy.py): what the operator calls, as RBAC sees it, and what the chart grants.

The installation is the webhook e2e harness (tests/webhook/cluster_harness.py): the chart installed
into the local control plane, the operator run locally as the chart's ServiceAccount (a TokenRequest
token: every call goes through the chart's RBAC), serving the webhook on 127.0.0.1 in URL mode and
watching one namespace, `jobs_ns`, where its rights are a Role. The one change: its kubeconfig
points at a RecordingProxy, so a test sees every call it made. Used by the reliability suite's
session-wide installation (conftest.py) and by tests/e2e/test_kueue.py, whose Kueue path the
reliability cluster cannot run (it has no Kueue).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import NO_HELM, find_helm, template
from tests.cluster import pki
from tests.cluster.cluster import LocalCluster
from tests.reliability.apiproxy import Call, Permission, RecordingProxy, implied_permissions, permission
from tests.webhook.cluster_harness import Installation


@dataclass
class ProxiedInstallation(Installation):
    """The harness's installation, with the operator talking to the API server through `proxy`."""

    proxy: RecordingProxy | None = None

    def service_account_kubeconfig(self) -> Path:
        path = super().service_account_kubeconfig()
        if self.proxy is not None:
            config = yaml.safe_load(path.read_text())
            config["clusters"][0]["cluster"]["server"] = self.proxy.url
            path.write_text(yaml.safe_dump(config))
        return path


@contextmanager
def proxied_chart(
    cluster: LocalCluster,
    progress_url_template: str,
    *,
    metrics_port: int | None = None,
    values: dict[str, Any] | None = None,
    operator_env: dict[str, str] | None = None,
) -> Iterator[ProxiedInstallation]:
    """Install the chart for one watched namespace (`jobs_ns`) with `values`, start the operator
    as its ServiceAccount behind a fresh RecordingProxy (with `operator_env`, what the chart's
    Deployment sets for those values), yield; uninstall afterwards. Skips without helm."""
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    cluster_pki = cluster.paths.pki
    cert, key = pki.issue(
        cluster_pki, f"reliability-proxy-{secrets.token_hex(3)}", cn="reliability-proxy", sans=("127.0.0.1",)
    )
    proxy = RecordingProxy(cluster.api.base_url, cluster_pki.ca_crt, cert, key)
    proxy.start()
    installation = ProxiedInstallation(
        cluster,
        helm_bin,
        proxy=proxy,
        progress_url_template=progress_url_template,
        watch_jobs_ns_only=True,
        metrics_port=metrics_port,
        values=dict(values or {}),
        operator_env=dict(operator_env or {}),
    )
    try:
        installation.install()
        try:
            installation.start_operator()
            yield installation
        finally:
            print(f"operator log {installation.log}:\n{installation.log_tail(20)}")
            installation.uninstall()
    finally:
        proxy.stop()
        cert.unlink(missing_ok=True)
        key.unlink(missing_ok=True)


def chart_rules(values: dict[str, Any] | None = None) -> set[Permission]:
    """(group, resource, verb) of every rule the chart grants the operator (its ClusterRole and
    Roles; not the users' ClusterRoles aggregated into edit/view), via helm template."""
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    objects = template(helm_bin, {"leaderElection.enabled": True, **(values or {})})
    out: set[Permission] = set()
    for obj in objects:
        if obj.get("kind") not in ("ClusterRole", "Role"):
            continue
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if any(key.startswith("rbac.authorization.k8s.io/aggregate-to-") for key in labels):
            continue
        for rule in obj.get("rules") or []:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule["verbs"]:
                        out.add(Permission(group, resource, verb))
    return out


def forbidden(calls: Sequence[Call]) -> list[str]:
    """The calls the API server refused with 403 (a rule the chart lacks)."""
    return [f"{c.method} {c.path}" for c in calls if c.status == 403]


def used_permissions(calls: Sequence[Call]) -> set[Permission]:
    """(group, resource, verb) of every call, and what its ownerReferences need besides."""
    used: set[Permission] = set()
    for call in calls:
        perm = permission(call)
        if perm is not None:
            used.add(Permission(perm.group, perm.resource, perm.verb))
        used.update(implied_permissions(call))
    return used
