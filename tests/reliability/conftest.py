"""Fixtures shared by the reliability tests: one `helm install` of the chart per test session.

The installation is the webhook e2e harness (tests/webhook/cluster_harness.py): the chart installed
into the local control plane, the operator run locally as the chart's ServiceAccount, serving the
webhook on 127.0.0.1 in URL mode. Two changes: the operator's kubeconfig points at a recording
proxy in front of the API server (tests/reliability/apiproxy.py), so the permissions test sees
every call it made since it started; and one installation is shared by the whole session, which
keeps the suite inside the CI budget (an install plus operator start costs ~15 s on 2 cores).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import NO_HELM, find_helm
from tests.cluster import pki
from tests.cluster.cluster import LocalCluster
from tests.e2e.test_operator import ProgressServer
from tests.reliability.apiproxy import RecordingProxy
from tests.webhook.cluster_harness import Installation
from tests.webhook.server import free_port


def count(name: str, default: int) -> int:
    """How many cases/rounds a test runs: `ASYNCGRPO_RELIABILITY_<NAME>`, else the CI-sized default."""
    return int(os.environ.get(f"ASYNCGRPO_RELIABILITY_{name.upper()}", default))


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


@pytest.fixture(scope="session")
def progress_server() -> Iterator[ProgressServer]:
    """The drivers' /progress for every operator of the session (reset per test by `progress`)."""
    server = ProgressServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def chart(local_cluster: LocalCluster, progress_server: ProgressServer) -> Iterator[ProxiedInstallation]:
    """The chart installed for one watched namespace, `chart.jobs_ns` (the operator's rights there
    are a Role), the operator serving its webhook and reconciling that namespace."""
    helm_bin = find_helm()
    if helm_bin is None:
        pytest.skip(NO_HELM)
    cluster_pki = local_cluster.paths.pki
    cert, key = pki.issue(
        cluster_pki, f"reliability-proxy-{secrets.token_hex(3)}", cn="reliability-proxy", sans=("127.0.0.1",)
    )
    proxy = RecordingProxy(local_cluster.api.base_url, cluster_pki.ca_crt, cert, key)
    proxy.start()
    installation = ProxiedInstallation(
        local_cluster,
        helm_bin,
        proxy=proxy,
        progress_url_template=progress_server.template,
        watch_jobs_ns_only=True,
        metrics_port=free_port(),
    )
    installation.install()
    try:
        installation.start_operator()
        yield installation
    finally:
        print(f"operator log {installation.log}:\n{installation.log_tail(20)}")
        installation.uninstall()
        proxy.stop()
        cert.unlink(missing_ok=True)
        key.unlink(missing_ok=True)


@pytest.fixture
def progress(progress_server: ProgressServer) -> ProgressServer:
    """Every driver's /progress in mid-run (step 3 of 20), as the operator under test polls it."""
    progress_server.doc = {"step": 3, "maxSteps": 20, "policyVersion": 3, "state": "running"}
    progress_server.docs.clear()
    progress_server.routes.clear()
    return progress_server
