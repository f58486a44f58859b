"""pytest plugin: the local control plane as session fixtures (registered in tests/conftest.py).

`local_cluster` brings the control plane up once per test run, or attaches to a live one (the state
folder in ASYNCGRPO_CLUSTER_STATE, else the default one). Sessions register in the state folder, so
two pytest runs on one machine share a cluster safely: a cluster started by a session is stopped by
the last session to finish (one started with `python -m tests.cluster up` is never stopped);
ASYNCGRPO_KEEP_CLUSTER=1 leaves it running for a faster next run. Every test gets its own
namespace, deleted afterwards. When a test that uses the cluster fails, the report names the log
folder so CI can print the component logs.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.cluster.build import build
from tests.cluster.cluster import LocalCluster
from tests.cluster.rest import Api, ApiError

TEST_NS_LABEL = "asyncgrpo.dev/test-namespace"
_FAILED_WITH_CLUSTER: list[str] = []


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """The running control plane: attached to if live, else started here (building if needed)."""
    cluster = LocalCluster.from_env()
    cluster.join(build)
    yield cluster
    cluster.leave(keep=os.environ.get("ASYNCGRPO_KEEP_CLUSTER", "") not in ("", "0"))


@pytest.fixture(scope="session")
def kubeconfig(local_cluster: LocalCluster) -> Path:
    """Path of an admin kubeconfig for the control plane (client certs, system:masters)."""
    return local_cluster.kubeconfig


@pytest.fixture(scope="session")
def kube_api(local_cluster: LocalCluster) -> Api:
    """A small typed REST client acting as cluster admin (see tests/cluster/rest.py)."""
    return local_cluster.api


def wait_for_default_service_account(api: Api, namespace: str, timeout: float = 30.0) -> None:
    """The ServiceAccount admission plugin rejects pods until KCM created `default`: wait for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            return
        except ApiError as err:
            if err.status != 404:
                raise
        time.sleep(0.1)
    raise TimeoutError(f"no default ServiceAccount in {namespace} after {timeout} s (is KCM running?)")


@pytest.fixture
def namespace(kube_api: Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (not awaited) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{secrets.token_hex(3)}"
    kube_api.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": {TEST_NS_LABEL: "true"}}})
    wait_for_default_service_account(kube_api, name)
    yield name
    try:
        kube_api.delete(f"/api/v1/namespaces/{name}")
    except ApiError as err:
        if err.status != 404:
            raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the log folder to the report of every failed test that used the cluster."""
    report = yield
    if report.failed and "local_cluster" in getattr(item, "fixturenames", ()):
        logs = LocalCluster.from_env().logs
        report.sections.append(("control plane", f"component logs: {logs}"))
        _FAILED_WITH_CLUSTER.append(item.nodeid)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One greppable line for CI: where the control-plane logs are."""
    if _FAILED_WITH_CLUSTER:
        logs = LocalCluster.from_env().logs
        terminalreporter.write_line(
            f"CONTROL PLANE LOGS: {logs} ({len(_FAILED_WITH_CLUSTER)} failed test(s) used the cluster)"
        )
